"""GRPO: group-relative advantages and the clipped, importance-weighted policy loss.

Advantages (Shao et al. 2024, "DeepSeekMath", §4.1.2, outcome supervision): each task's G completions
form a group, and completion i's advantage is its reward relative to the group,

    A_i = (r_i - mean(r_1..r_G)) / (std(r_1..r_G) + eps)        (std with Bessel's correction, as TRL)

or, with `scale_rewards=False`, just r_i - mean (Liu et al. 2025, "Dr. GRPO", §3.2: the std division
over-weights groups that are nearly all right or all wrong). A group whose rewards are all equal
has A = 0 and contributes no gradient. Every token of a completion gets its completion's A.

Policy loss per completion token t (Schulman et al. 2017, PPO eq. 7; DeepSeekMath eq. 3), with the
decoupled importance weight of asynchronous training (Fu et al. 2025, "AReaL", eq. 5):

    rho_t = pi_theta(o_t) / pi_old(o_t)                         pi_old: the policy at the start of this update
    w_t   = min(pi_old(o_t) / pi_behav(o_t), max_is_ratio)      pi_behav: the version that sampled o_t (vLLM's log-prob)
    L_t   = -w_t * min(rho_t A, clip(rho_t, 1 - eps, 1 + eps) A) + beta * KL_t
    KL_t  = pi_ref/pi_theta - log(pi_ref/pi_theta) - 1          (the k3 estimator: Schulman 2020, DeepSeekMath eq. 4)

Each step makes one update on its batch, so pi_old is pi_theta detached (rho = 1, its gradient is
A * grad log pi_theta) and the clip binds only if a config ever takes several updates per batch. In sync
mode pi_behav is the same version as pi_old, so w = 1 up to the sync's verified log-prob parity; in
async mode a sample lags by up to `max_staleness` versions and w corrects for it, truncated so one
unlikely token cannot dominate (truncated importance sampling: Yao et al. 2025, "Your Efficient RL
Framework Secretly Brings You Off-Policy RL Training").

Aggregation: `sequence` averages each completion's tokens, then the completions (DeepSeekMath eq. 3:
long completions count per completion); `token` averages over all completion tokens of the batch
(Yu et al. 2025, "DAPO", eq. 8: every token counts the same). Masked positions (the prompt, padding)
never count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from factory.posttrain.rl.config import GRPOConfig

ADVANTAGE_EPS = 1e-4  # TRL's: a group with one differing reward still gets a finite advantage


@dataclass(frozen=True)
class GRPO:
    """The algorithm as the loop uses it (the registered `grpo` component): advantages, then the loss."""

    config: GRPOConfig
    group_size: int

    def advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        return group_advantages(rewards, self.group_size, scale=self.config.scale_rewards)

    def loss(self, logp, behaviour_logp, advantages, mask, ref_logp=None) -> tuple[torch.Tensor, "LossStats"]:
        return grpo_loss(logp, behaviour_logp, advantages, mask, self.config, ref_logp)

    @property
    def needs_reference(self) -> bool:
        return self.config.kl_coef > 0


def group_advantages(rewards: torch.Tensor, group_size: int, *, scale: bool = True) -> torch.Tensor:
    """A_i for rewards laid out group after group ([n_groups * group_size]); same shape."""
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.double().view(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale:
        centred = centred / (grouped.std(dim=1, keepdim=True) + ADVANTAGE_EPS)
    return centred.view(-1).to(rewards.dtype)


@dataclass(frozen=True)
class LossStats:
    loss: float
    kl: float  # mean k3 estimate over completion tokens (0 without a reference)
    clipped: float  # share of completion tokens whose ratio was clipped
    is_weight: float  # mean importance weight pi_old / pi_behav (1 on-policy)
    is_truncated: float  # share of tokens whose weight hit max_is_ratio


def grpo_loss(logp: torch.Tensor, behaviour_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              config: GRPOConfig, ref_logp: torch.Tensor | None = None) -> tuple[torch.Tensor, LossStats]:
    """The loss above over a batch of completions.

    logp: [N, T] log pi_theta of each completion token (with grad); behaviour_logp: [N, T] the sampler's;
    advantages: [N]; mask: [N, T], 1 on completion tokens; ref_logp: [N, T] (needed when kl_coef > 0)."""
    mask = mask.to(logp.dtype)
    old = logp.detach()
    ratio = torch.exp(logp - old)
    adv = advantages.to(logp.dtype)[:, None]
    clipped_ratio = ratio.clamp(1 - config.clip_eps, 1 + config.clip_eps)
    surrogate = torch.minimum(ratio * adv, clipped_ratio * adv)
    raw_weight = torch.exp(old - behaviour_logp.to(logp.dtype))
    weight = raw_weight.clamp(max=config.max_is_ratio)
    per_token = -weight * surrogate
    kl = torch.zeros_like(logp)
    if config.kl_coef > 0:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs the reference policy's log-probs (ref_logp)")
        delta = ref_logp.to(logp.dtype) - logp
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + config.kl_coef * kl
    loss = aggregate(per_token, mask, config.aggregation)
    tokens = mask.sum().clamp(min=1)
    stats = LossStats(loss=loss.item(), kl=((kl * mask).sum() / tokens).item(),
                      clipped=(((ratio != clipped_ratio).to(logp.dtype) * mask).sum() / tokens).item(),
                      is_weight=((raw_weight * mask).sum() / tokens).item(),
                      is_truncated=(((raw_weight > config.max_is_ratio).to(logp.dtype) * mask).sum() / tokens).item())
    return loss, stats


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """Mean of `per_token` over the mask: per token of the batch, or per completion then over completions."""
    if how == "token":
        return (per_token * mask).sum() / mask.sum().clamp(min=1)
    lengths = mask.sum(dim=1)
    per_sequence = (per_token * mask).sum(dim=1) / lengths.clamp(min=1)
    return per_sequence[lengths > 0].mean() if (lengths > 0).any() else per_token.sum() * 0


def completion_logprobs(model: torch.nn.Module, sequences: list[list[int]], prompt_lens: list[int],
                        pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(token_t | tokens_<t) at every position of the right-padded batch, and the completion mask.

    Returns ([N, T-1], [N, T-1]) where column j is about token j+1: the mask is 1 where token j+1 belongs to
    the completion (after the prompt, before the padding)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width - 1))
    for i, (seq, start) in enumerate(zip(sequences, prompt_lens)):
        ids[i, :len(seq)] = torch.tensor(seq)
        mask[i, start - 1:len(seq) - 1] = 1
    logits = model(ids[:, :-1]).float()
    logp = torch.log_softmax(logits, dim=-1).gather(2, ids[:, 1:, None])[..., 0]
    return logp, mask
