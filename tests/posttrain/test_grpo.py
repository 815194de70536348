"""GRPO's advantages and loss against a hand-computed example: group normalisation, masking, both
aggregations, the truncated importance weight and the k3 KL term; and RLConfig's validation. CPU, no
engine."""

import math

import pytest
import torch
from pydantic import ValidationError

from factory.posttrain.rl import RLConfig
from factory.posttrain.rl.config import GRPOConfig
from factory.posttrain.rl.grpo import ADVANTAGE_EPS, completion_logprobs, group_advantages, grpo_loss

A = 0.5 / (math.sqrt(0.5) + ADVANTAGE_EPS)  # group (1, 0): mean 0.5, sample std sqrt(0.5)


def test_advantages_are_normalised_within_each_group():
    adv = group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64), 2)
    assert adv.tolist() == pytest.approx([A, -A, 0.0, 0.0], abs=1e-12)  # computed in fp64, returned in the input's dtype
    assert group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), 2, scale=False).tolist() == [0.5, -0.5, 0.0, 0.0]
    # a group of three: mean 1/3, std sqrt(1/3)
    three = group_advantages(torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64), 3)
    assert three.tolist() == pytest.approx([(2 / 3) / (math.sqrt(1 / 3) + ADVANTAGE_EPS),
                                            (-1 / 3) / (math.sqrt(1 / 3) + ADVANTAGE_EPS)] + [(-1 / 3) / (math.sqrt(1 / 3) + ADVANTAGE_EPS)])
    with pytest.raises(ValueError, match="groups of 2"):
        group_advantages(torch.tensor([1.0, 0.0, 1.0]), 2)


def _batch():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -1.1], [-0.2, -0.4, -0.6], [-1.5, -0.1, -0.9]],
                        requires_grad=True)
    mask = torch.tensor([[0, 1, 1], [0, 1, 0], [1, 0, 0], [1, 1, 0]], dtype=torch.float32)  # 2, 1, 1, 2 tokens
    adv = group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), 2)
    return logp, mask, adv


def test_token_and_sequence_aggregation_with_masking():
    logp, mask, adv = _batch()
    loss, stats = grpo_loss(logp, logp.detach(), adv, mask, GRPOConfig(aggregation="token"))
    # ratio 1 and weight 1 everywhere: each completion token contributes -A_i; 6 tokens
    assert loss.item() == pytest.approx(-(2 * A - 1 * A) / 6)
    loss.backward()
    want = -(adv[:, None] * mask) / 6
    assert torch.allclose(logp.grad, want) and logp.grad[mask == 0].abs().max() == 0  # the prompt gets nothing
    assert (stats.is_weight, stats.kl, stats.clipped) == (pytest.approx(1.0), 0.0, 0.0)

    logp, mask, adv = _batch()
    loss, _ = grpo_loss(logp, logp.detach(), adv, mask, GRPOConfig(aggregation="sequence"))
    assert loss.item() == pytest.approx(0.0, abs=1e-7)  # (-A) + (+A) + 0 + 0 over 4 completions
    loss.backward()
    lengths = mask.sum(1, keepdim=True)
    assert torch.allclose(logp.grad, -(adv[:, None] * mask) / lengths / 4)


def test_importance_weight_is_truncated_and_kl_is_k3():
    logp, mask, adv = _batch()
    behaviour = logp.detach() - math.log(1.5)  # the sampler gave every token 1/1.5 of the current probability
    config = GRPOConfig(max_is_ratio=1.2, kl_coef=0.1)
    ref = logp.detach() + math.log(2.0)
    loss, stats = grpo_loss(logp, behaviour, adv, mask, config, ref_logp=ref)
    k3 = 2.0 - math.log(2.0) - 1.0
    assert stats.is_weight == pytest.approx(1.5) and stats.is_truncated == 1.0
    assert stats.kl == pytest.approx(k3, rel=1e-6)
    assert loss.item() == pytest.approx(-1.2 * (2 * A - A) / 6 + 0.1 * k3, rel=1e-6)
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(logp, behaviour, adv, mask, config)


def test_completion_logprobs_masks_prompt_and_padding():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 11))
    logp, mask = completion_logprobs(model, [[1, 2, 3, 4], [5, 6, 7]], [2, 1])
    assert mask.tolist() == [[0, 1, 1], [1, 1, 0]]
    full = torch.log_softmax(model(torch.tensor([[1, 2, 3]])), -1)[0]
    assert logp[0, 1].item() == pytest.approx(full[1, 3].item()) and logp[0, 2].item() == pytest.approx(full[2, 4].item())


@pytest.mark.parametrize("field, value, message", [
    ("rollout", {"group_size": 1}, "group_size=1"),
    ("max_staleness", -1, "max_staleness=-1"),
    ("reward", "nonesuch", "reward 'nonesuch' is not registered"),
    ("rollout", {"actor": "nonesuch"}, "rollout actor 'nonesuch' is not registered"),
    ("start", "smoke@10", "ckpt/<run>@<step>"),
    ("reward", "repo_tasks", "task_table"),
    ("eval_suite", "nonesuch", "unknown eval suite 'nonesuch'"),
])
def test_bad_configs_fail_naming_the_field(field, value, message):
    good = {"name": "t", "start": "ckpt/smoke@10", "reward": "toy", "steps": 2}
    with pytest.raises(ValidationError, match=message) as info:
        RLConfig.model_validate({**good, field: value})
    assert field in str(info.value)


def test_the_registered_algorithm_is_this_loss():
    from factory.posttrain.rl.registry import ALGORITHMS

    config = RLConfig(name="t", start="ckpt/smoke@10", reward="toy", steps=1,
                      rollout={"group_size": 2}, grpo={"kl_coef": 0.1})
    algorithm = ALGORITHMS.get(config.algorithm).build(config)
    logp, mask, adv = _batch()
    assert torch.equal(algorithm.advantages(torch.tensor([1.0, 0.0, 1.0, 1.0])), adv) and algorithm.needs_reference
    ref = logp.detach() + math.log(2.0)
    assert algorithm.loss(logp, logp.detach(), adv, mask, ref)[0].item() == \
        grpo_loss(logp, logp.detach(), adv, mask, config.grpo, ref)[0].item()
