"""GRPO's loss, advantages and online filter, INTELLECT-2's way, as pure functions.

The ratio is taken against the log-probabilities each completion was sampled
with (``sampler_logprobs``), not against log-probabilities the trainer
recomputes with the policy of the step the sample came from. Asynchronous
training makes the sampler's the right reference: they are what the tokens were
drawn from, whatever step the trainer is at, and validators already check that
a node reported its model's. INTELLECT-2 recomputed "old" log-probabilities
with the trainer instead; to train that way, pass the recomputed values as
``sampler_logprobs``: the loss is the same function of whichever reference it gets.

The loss is summed over completion tokens and divided by a constant
``normalizer`` (Dr. GRPO: sequences per step times the longest completion
allowed), never by a per-sequence or per-group token count, which would weigh
tokens of short completions more.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from orchestrator.trainer.recipe import AdvantageScale

# Keeps a group of identical rewards from dividing by zero when scaling by its std.
STD_EPSILON = 1e-6


@dataclass(frozen=True, kw_only=True)
class LossConfig:
    """The loss's knobs; ``normalizer`` has no default because it depends on the batch shape."""

    normalizer: float
    eps_low: float = 0.2
    eps_high: float = 0.2
    delta: float = 4.0  # the dual clip: the ratio's bound where the advantage is negative
    kl_coef: float = 0.0  # k3 estimator against a frozen reference policy
    entropy_coef: float = 0.0

    def __post_init__(self) -> None:
        if not self.normalizer > 0:
            raise ValueError(f"normalizer must be positive, not {self.normalizer}")
        if not (0 <= self.eps_low < 1 and self.eps_high >= 0):
            raise ValueError("eps_low must lie in [0, 1) and eps_high must not be negative")
        if not self.delta >= 1 + self.eps_high:
            raise ValueError(f"delta must be at least 1 + eps_high, not {self.delta}")
        if self.kl_coef < 0 or self.entropy_coef < 0:
            raise ValueError("kl_coef and entropy_coef must not be negative")


def grpo_loss(
    logprobs: Tensor,
    sampler_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    config: LossConfig,
    *,
    ref_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The loss of one batch and its metrics.

    ``logprobs`` [B, T] are the current policy's (with grad), ``sampler_logprobs``
    [B, T] the sampler's, ``advantages`` [B] one per sequence, ``mask`` [B, T] True
    on completion tokens. ``ref_logprobs`` [B, T] is needed when ``kl_coef`` > 0,
    ``entropy`` [B, T] (the policy's entropy per token) when ``entropy_coef`` > 0.
    """
    if logprobs.shape != sampler_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError("logprobs, sampler_logprobs and mask must have one shape [B, T]")
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError("advantages must hold one value per sequence")
    m = mask.to(logprobs.dtype)
    a = advantages.to(logprobs.dtype).unsqueeze(1)
    raw_ratio = torch.exp(logprobs - sampler_logprobs.detach())
    ratio = torch.clamp(raw_ratio, max=config.delta)
    clipped = torch.clamp(ratio, 1 - config.eps_low, 1 + config.eps_high)
    unclipped_term, clipped_term = -ratio * a, -clipped * a
    per_token = torch.maximum(unclipped_term, clipped_term)
    loss = (per_token * m).sum() / config.normalizer

    if config.kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        log_ratio = ref_logprobs.detach() - logprobs
        k3 = torch.exp(log_ratio) - log_ratio - 1
        loss = loss + config.kl_coef * (k3 * m).sum() / config.normalizer
    if config.entropy_coef > 0:
        if entropy is None:
            raise ValueError("entropy_coef > 0 needs entropy")
        loss = loss - config.entropy_coef * (entropy * m).sum() / config.normalizer

    with torch.no_grad():
        tokens = m.sum().clamp(min=1)
        chosen_clip = (clipped_term > unclipped_term) & mask
        metrics = {
            "clip_fraction": float(chosen_clip.sum() / tokens),
            "delta_fraction": float(((raw_ratio > config.delta) & mask).sum() / tokens),
            "ratio_mean": float((raw_ratio * m).sum() / tokens),
            "ratio_max": float(raw_ratio.masked_fill(~mask, float("-inf")).max())
            if mask.any()
            else 0.0,
        }
    return loss, metrics


def group_advantages(rewards: Tensor, scale: AdvantageScale = "none") -> Tensor:
    """One group's advantages: each reward minus the group's mean, and with ``scale="std"``
    divided by the group's sample standard deviation (plus a small epsilon), as
    INTELLECT-2 did. ``rewards`` are the full rewards (task reward minus length term)."""
    if rewards.dim() != 1 or rewards.numel() < 2:
        raise ValueError("a group holds at least two rewards, as a 1-D tensor")
    centred = rewards - rewards.mean()
    if scale == "none":
        return centred
    if scale == "std":
        return centred / (rewards.std(correction=1) + STD_EPSILON)
    raise ValueError(f"scale must be 'none' or 'std', not {scale!r}")


def keeps_group(task_rewards: Tensor) -> bool:
    """Whether a group teaches anything: its *task* rewards differ. Raw rewards almost
    never tie, because the length term differs from completion to completion, so a
    filter on them would drop nothing."""
    return bool(task_rewards.numel() >= 2 and (task_rewards != task_rewards[0]).any())
