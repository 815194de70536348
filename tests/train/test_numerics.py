"""The training engine's pure numerics, as unit tests on CPU (well under a second, no lake, no
processes):

- `Guards`: a non-finite loss or gradient norm is skipped (or an error when configured) and kept
  out of the rolling window; more consecutive skips than allowed raise `TooManySkips`; after a full
  window of steady values a spike gets the configured action (warn applies the update, skip and
  rollback do not), values under the threshold pass; `state_dict` restores the same decisions.
- `replicas.tensor_hash`: equal bits hash equal, one ulp (`torch.nextafter`) or a swap of two
  elements changes the hash, for fp32, bf16 and int64; `replicas.divergent` names the odd rank
  (rank 0 is the reference on a tie, the two-rank case).
- `schedule.lr_at`: linear warmup, cosine down to `min_lr_ratio * peak` at the last step, WSD holding
  the peak then decaying linearly over `decay_fraction`, constant.
- `render_card`: the mix version, length, parameter count and the launch commands.
"""

from __future__ import annotations

import json

import pytest
import torch

from configs.experiments import smoke, smoke_ddp
from factory.experiments import ExperimentConfig
from factory.experiments.card import render_card
from factory.experiments.spec import Plan
from factory.train.config import GuardConfig, ScheduleConfig
from factory.train.guards import Guards, TooManySkips
from factory.train.model import count_parameters
from factory.train.replicas import ReplicaMismatch, divergent, tensor_hash
from factory.train.schedule import lr_at

NAN, INF = float("nan"), float("inf")
# a full window (5) of steady values: loss mean 2.0, std 0.063 -> 3 sigma threshold 2.19;
# grad norm mean 1.0, std 0.063 -> 1.19
STEADY = [(2.0, 1.0), (2.1, 1.1), (1.9, 0.9), (2.0, 1.0), (2.0, 1.0)]


def guards(**overrides) -> Guards:
    return Guards(GuardConfig(**{"spike_window": 5, "spike_sigma": 3.0, **overrides}))


def steady(**overrides) -> Guards:
    g = guards(**overrides)
    assert [g.judge(*v).action for v in STEADY] == ["ok"] * 5
    return g


# -- guards: non-finite ------------------------------------------------------------------------
@pytest.mark.parametrize("loss, grad_norm", [(NAN, 1.0), (2.0, INF), (-INF, NAN)])
def test_nonfinite_step_is_skipped_and_kept_out_of_the_window(loss, grad_norm):
    g = guards()
    g.judge(2.0, 1.0)
    verdict = g.judge(loss, grad_norm)
    assert (verdict.action, verdict.kind, verdict.apply_update) == ("skip", "nonfinite", False)
    assert verdict.detail == f"loss={loss} grad_norm={grad_norm}"
    assert (list(g.loss), list(g.grad_norm), g.consecutive_skips) == ([2.0], [1.0], 1)


def test_nonfinite_is_an_error_when_configured():
    g = guards(nonfinite="error")
    verdict = g.judge(NAN, 1.0)
    assert (verdict.action, verdict.kind, verdict.apply_update) == ("error", "nonfinite", False)
    assert (list(g.loss), g.consecutive_skips) == ([], 0)  # the trainer stops; nothing to count


def test_consecutive_skips_beyond_the_limit_raise():
    g = guards(max_consecutive_skips=2)
    assert [g.judge(NAN, 1.0).action for _ in range(2)] == ["skip", "skip"]
    assert g.judge(2.0, 1.0).action == "ok" and g.consecutive_skips == 0  # a good step resets the count
    assert [g.judge(NAN, 1.0).action for _ in range(2)] == ["skip", "skip"]
    with pytest.raises(TooManySkips, match=r"^3 consecutive steps skipped \(last: nonfinite, loss=nan grad_norm=1.0\); "
                                           r"max_consecutive_skips=2$"):
        g.judge(NAN, 1.0)


# -- guards: spikes ----------------------------------------------------------------------------
def test_no_spike_verdict_before_the_window_is_full():
    g = guards(spike_action="skip")
    assert [g.judge(*v).action for v in STEADY[:4]] == ["ok"] * 4
    assert g.judge(100.0, 100.0).action == "ok"  # only 4 values seen: no statistics yet


def test_values_below_the_threshold_pass():
    g = steady(spike_action="skip")
    assert g.judge(2.18, 1.18).action == "ok"  # just under mean + 3 sigma of both
    assert g.judge(0.5, 0.1).action == "ok"  # a drop is never a spike


def test_spike_warn_applies_the_update_and_enters_the_window():
    g = steady(spike_action="warn")
    verdict = g.judge(3.0, 1.0)
    assert (verdict.action, verdict.kind, verdict.apply_update) == ("warn", "spike", True)
    assert verdict.detail.startswith("loss=3 > 2.19 (mean 2 + 3.0 sigma)")
    assert (g.loss[-1], g.consecutive_skips) == (3.0, 0)


def test_spike_skip_does_not_apply_the_update():
    g = steady(spike_action="skip")
    verdict = g.judge(2.0, 2.5)  # a grad-norm spike with an ordinary loss
    assert (verdict.action, verdict.kind, verdict.apply_update) == ("skip", "spike", False)
    assert verdict.detail.startswith("grad_norm=2.5 > 1.19")
    assert (list(g.loss), g.consecutive_skips) == ([v[0] for v in STEADY], 1)


def test_spike_rollback_counts_as_a_skip():
    g = steady(spike_action="rollback", max_consecutive_skips=1)
    verdict = g.judge(5.0, 1.0)
    assert (verdict.action, verdict.apply_update, g.consecutive_skips) == ("rollback", False, 1)
    with pytest.raises(TooManySkips, match="last: spike"):
        g.judge(5.0, 1.0)


def test_state_dict_round_trip_reproduces_decisions():
    config = GuardConfig(spike_window=5, spike_sigma=3.0, spike_action="skip")
    values = STEADY + [(2.05, 1.02), (NAN, 1.0), (2.6, 1.0), (1.95, 0.98), (2.4, 1.3), (2.0, 1.0)]
    original = Guards(config)
    first = [original.judge(*v).action for v in values[:7]]  # ends on a skipped step
    state = json.loads(json.dumps(original.state_dict()))  # checkpoints carry it as plain data
    assert state["consecutive_skips"] == 1 and len(state["loss"]) == 5

    restored, fresh = Guards(config, state), Guards(config)
    rest = [original.judge(*v) for v in values[7:]]
    assert [restored.judge(*v) for v in values[7:]] == rest
    assert first + [v.action for v in rest] == ["ok"] * 6 + ["skip", "skip", "ok", "skip", "ok"]
    assert restored.state_dict() == original.state_dict()
    assert [fresh.judge(*v).action for v in values[7:]] == ["ok"] * 4  # without the state: no window


# -- replica hashes ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float_hash_sees_one_ulp_and_a_swap(dtype):
    torch.manual_seed(0)
    t = torch.randn(64, 33).to(dtype)
    assert tensor_hash(t).dtype == torch.int64 and tensor_hash(t).shape == ()
    assert tensor_hash(t) == tensor_hash(t.clone())
    assert tensor_hash(t.T) == tensor_hash(t.T.contiguous())  # values in logical order, any layout

    ulp = t.clone()
    ulp[5, 7] = torch.nextafter(t[5, 7], torch.tensor(INF, dtype=dtype))
    assert not torch.equal(ulp, t) and (ulp != t).sum() == 1
    assert tensor_hash(ulp) != tensor_hash(t)

    swapped = t.clone()
    swapped[0, 0], swapped[3, 2] = t[3, 2], t[0, 0]
    assert t[0, 0] != t[3, 2] and tensor_hash(swapped) != tensor_hash(t)

    assert tensor_hash(torch.zeros(3, dtype=dtype)) != tensor_hash(-torch.zeros(3, dtype=dtype))  # bits, not values


def test_int64_hash_sees_plus_one_and_a_swap():
    t = torch.arange(1000, dtype=torch.int64) * 7919
    assert tensor_hash(t) == tensor_hash(t.clone())
    bumped = t.clone()
    bumped[999] += 1
    assert tensor_hash(bumped) != tensor_hash(t)
    assert tensor_hash(t.flip(0)) != tensor_hash(t)
    swapped = t.clone()
    swapped[[10, 20]] = swapped[[20, 10]]
    assert tensor_hash(swapped) != tensor_hash(t)


def test_divergent_names_the_odd_rank_with_rank_0_as_the_tie_break():
    agree = torch.tensor([[1, 2, 3], [1, 2, 3]])
    assert divergent(agree) == ([], [])
    assert divergent(torch.tensor([[1, 2, 3], [1, 9, 3]])) == ([1], [1])
    # two ranks: no majority; the reference is rank 0, so rank 1 is named even when rank 0 is the bad one
    assert divergent(torch.tensor([[1, 9, 3], [1, 2, 3]])) == ([1], [1])
    # three ranks: a real majority
    assert divergent(torch.tensor([[1, 9, 3], [1, 2, 3], [1, 2, 3]])) == ([1], [0])
    assert divergent(torch.tensor([[1, 2, 3], [1, 2, 8], [7, 2, 3]])) == ([0, 2], [1, 2])


def test_mismatch_message_names_ranks_and_parameters():
    names = [f"layers.{i}.mlp.up_proj.weight" for i in range(10)]
    e = ReplicaMismatch("parameters", 4, [1], names)
    assert str(e).startswith("parameters differ across replicas at step 4: rank(s) [1] diverge from the majority "
                             "(rank 0 on a tie) in layers.0.mlp.up_proj.weight, layers.1.mlp.up_proj.weight")
    assert str(e).endswith("layers.7.mlp.up_proj.weight and 2 more")
    assert (e.step, e.ranks, e.parameters) == (4, [1], names)


# -- learning-rate schedules -------------------------------------------------------------------
def test_warmup_is_linear_up_to_the_peak():
    config = ScheduleConfig(kind="cosine", warmup_steps=10)
    assert [lr_at(s, 100, 2.0, config) for s in range(10)] == pytest.approx([0.2 * (s + 1) for s in range(10)])
    assert lr_at(10, 100, 2.0, config) == 2.0  # the first step after warmup is at the peak


def test_cosine_ends_at_the_floor_on_the_last_step():
    config = ScheduleConfig(kind="cosine", warmup_steps=10, min_lr_ratio=0.1)
    lrs = [lr_at(s, 111, 1.0, config) for s in range(111)]
    assert lrs[10] == 1.0 and lrs[60] == pytest.approx(0.55) and lrs[110] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lr_at(500, 111, 1.0, config) == pytest.approx(0.1)  # past the end: stays at the floor


def test_wsd_holds_the_peak_then_decays_linearly():
    config = ScheduleConfig(kind="wsd", warmup_steps=0, min_lr_ratio=0.1, decay_fraction=0.2)
    lrs = [lr_at(s, 100, 1.0, config) for s in range(100)]
    assert lrs[:80] == [1.0] * 80
    assert lrs[80:] == pytest.approx([1.0 - 0.9 * (k + 1) / 20 for k in range(20)])
    assert lrs[99] == pytest.approx(0.1)


def test_constant_is_the_peak_after_warmup():
    config = ScheduleConfig(kind="constant", warmup_steps=4, min_lr_ratio=0.1)
    assert [lr_at(s, 50, 3e-3, config) for s in (0, 3, 4, 25, 49)] == pytest.approx([7.5e-4, 3e-3, 3e-3, 3e-3, 3e-3])


# -- the experiment card -----------------------------------------------------------------------
def plan_of(experiment: ExperimentConfig, mix_version: str = "mix/default@v3", seq_len: int = 256) -> Plan:
    """A Plan as plan_experiment derives it, for a 512-token tokenizer (no lake needed)."""
    model = experiment.model.model_copy(update={"vocab_size": 512})
    return Plan(experiment=experiment, model=model, mix_version=mix_version, tokenizer="tokenizer/default@0fed44177d57",
                seq_len=seq_len, steps=experiment.steps, tokens_per_step=experiment.global_batch * seq_len,
                grad_accum=experiment.global_batch // (experiment.micro_batch * experiment.parallel.world_size),
                parameters=count_parameters(model), config_hash=experiment.identity_hash())


def test_card_shows_mix_length_parameters_and_launch_commands():
    plan = plan_of(smoke())
    card = render_card(plan)
    assert card.startswith("# Experiment `smoke`\n\nA tiny model on the default mix")
    assert "| mix | `mix/default@v3` (followed live) |" in card
    assert "| tokenizer | `tokenizer/default@0fed44177d57` (512 tokens) |" in card
    assert "| length | 120 steps = 245,760 tokens |" in card
    assert f"| model | {plan.parameters / 1e6:.2f} M parameters: d_model 128, 4 layers, 4 heads / 2 kv heads" in card
    assert "(micro-batch 4 x 1 ranks x 2 accumulation)" in card
    assert f"| identity hash | `{smoke().identity_hash()}` |" in card
    assert f"`factory experiment submit smoke` (queued in Dagster as run `smoke-{smoke().identity_hash()[:8]}`)" in card
    assert "`python -m factory.train --experiment smoke`" in card


def test_card_of_a_ddp_experiment_shows_ranks_and_replica_checks():
    card = render_card(plan_of(smoke_ddp().derive(replicas={"hash_every": 2, "redundant_dry_run": True})))
    assert "(micro-batch 4 x 2 ranks x 1 accumulation)" in card
    assert "| parallelism | 2 process(es), backend auto |" in card
    assert "| replica checks | parameter hashes every 2 steps; redundant gradient dry runs |" in card


def test_card_launch_command_of_a_ddp_experiment_starts_its_ranks():
    card = render_card(plan_of(smoke_ddp()))
    assert "torchrun --standalone --nproc-per-node 2 -m factory.train --experiment smoke_ddp" in card


def test_card_labels_a_pinned_mix_as_pinned():
    card = render_card(plan_of(smoke().derive(mix="mix/default@v3")))
    assert "| mix | `mix/default@v3` (pinned) |" in card
