"""GRPO's loss, advantages and online filter, INTELLECT-2's way, as pure functions.

The ratio's denominator ``old_logprobs`` is by default the log-probabilities each
completion was sampled with, not log-probabilities the trainer recomputes with
the policy of the step the sample came from. Asynchronous training makes the
sampler's the right reference: they are what the tokens were drawn from, whatever
step the trainer is at, and validators already check that a node reported its
model's. INTELLECT-2 recomputed "old" log-probabilities with the trainer instead;
to train that way, pass the recomputed values as ``old_logprobs`` and the
sampler's as ``sampler_logprobs``: the loss is the same function of whichever
reference it gets.

Two known corrections for the gap between the sampler's and the trainer's
probabilities of the same tokens are options, off by default; both weigh the
token's ratio trainer / sampler, detached:

- truncated importance sampling (TIS): the policy-gradient term of each token is
  multiplied by min(ratio, ``tis_cap``). It corrects a ratio taken against the
  trainer, which no longer sees the sampler; against the sampler the PPO ratio
  is that importance weight already, and TIS would weigh tokens by its square.
- IcePop: tokens whose ratio lies outside [``icepop_low``, ``icepop_high``] are
  dropped from the loss, as padding is.

The loss is summed over completion tokens and divided by a constant
``normalizer`` (Dr. GRPO: sequences per step times the longest completion
allowed), never by a per-sequence or per-group token count, which would weigh
tokens of short completions more.
"""

from __future__ import annotations

import math
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
    tis_cap: float = 0.0  # truncated importance sampling's cap on the sampler ratio (0: off)
    # IcePop: tokens whose sampler ratio lies outside [icepop_low, icepop_high] are
    # masked; the defaults hold every ratio, which is positive.
    icepop_low: float = 0.0
    icepop_high: float = math.inf

    def __post_init__(self) -> None:
        if not self.normalizer > 0:
            raise ValueError(f"normalizer must be positive, not {self.normalizer}")
        if not (0 <= self.eps_low < 1 and self.eps_high >= 0):
            raise ValueError("eps_low must lie in [0, 1) and eps_high must not be negative")
        if not self.delta >= 1 + self.eps_high:
            raise ValueError(f"delta must be at least 1 + eps_high, not {self.delta}")
        if self.kl_coef < 0 or self.entropy_coef < 0:
            raise ValueError("kl_coef and entropy_coef must not be negative")
        if not (self.tis_cap == 0 or self.tis_cap >= 1):
            # A cap below 1 would shrink every token's weight, not bound the outliers.
            raise ValueError(f"tis_cap must be 0 (off) or at least 1, not {self.tis_cap}")
        if not (0 <= self.icepop_low < 1 < self.icepop_high):
            raise ValueError("IcePop's bounds must hold 1: 0 <= icepop_low < 1 < icepop_high")

    @property
    def icepop(self) -> bool:
        """Whether IcePop masks anything (a ratio is positive, so [0, inf] keeps all)."""
        return self.icepop_low > 0 or self.icepop_high < math.inf


def grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    config: LossConfig,
    *,
    sampler_logprobs: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The loss of one batch and its metrics.

    ``logprobs`` [B, T] are the current policy's (with grad), ``old_logprobs`` [B, T]
    the ratio's denominator, ``advantages`` [B] one per sequence, ``mask`` [B, T] True
    on completion tokens. ``sampler_logprobs`` [B, T] are the sampler's where
    ``old_logprobs`` are not (None: they are); TIS needs them. ``ref_logprobs`` [B, T]
    is needed when ``kl_coef`` > 0, ``entropy`` [B, T] (the policy's entropy per
    token) when ``entropy_coef`` > 0.
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError("logprobs, old_logprobs and mask must have one shape [B, T]")
    if sampler_logprobs is not None and sampler_logprobs.shape != logprobs.shape:
        raise ValueError("sampler_logprobs must have the shape of logprobs")
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError("advantages must hold one value per sequence")
    if config.tis_cap > 0 and sampler_logprobs is None:
        raise ValueError(
            "TIS corrects a ratio taken against the trainer: pass the sampler's "
            "log-probabilities as sampler_logprobs"
        )
    m = mask.to(logprobs.dtype)
    a = advantages.to(logprobs.dtype).unsqueeze(1)
    raw_ratio = torch.exp(logprobs - old_logprobs.detach())
    ratio = torch.clamp(raw_ratio, max=config.delta)
    clipped = torch.clamp(ratio, 1 - config.eps_low, 1 + config.eps_high)
    unclipped_term, clipped_term = -ratio * a, -clipped * a
    per_token = torch.maximum(unclipped_term, clipped_term)

    sampler = old_logprobs if sampler_logprobs is None else sampler_logprobs
    sampler_ratio = torch.exp(logprobs.detach() - sampler.detach())
    if config.tis_cap > 0:
        per_token = per_token * torch.clamp(sampler_ratio, max=config.tis_cap)
    # Tokens IcePop drops weigh 0 in every term, as padding does. A product rather than
    # a selection, so that a NaN ratio still makes the loss NaN and the step is skipped.
    outside = (sampler_ratio < config.icepop_low) | (sampler_ratio > config.icepop_high)
    keep = m * (~outside).to(m.dtype) if config.icepop else m
    loss = (per_token * keep).sum() / config.normalizer

    if config.kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        log_ratio = ref_logprobs.detach() - logprobs
        k3 = torch.exp(log_ratio) - log_ratio - 1
        loss = loss + config.kl_coef * (k3 * keep).sum() / config.normalizer
    if config.entropy_coef > 0:
        if entropy is None:
            raise ValueError("entropy_coef > 0 needs entropy")
        loss = loss - config.entropy_coef * (entropy * keep).sum() / config.normalizer

    with torch.no_grad():
        tokens = m.sum().clamp(min=1)
        chosen_clip = (clipped_term > unclipped_term) & mask
        capped = (sampler_ratio > config.tis_cap) & mask if config.tis_cap > 0 else None
        metrics = {
            "clip_fraction": float(chosen_clip.sum() / tokens),
            "delta_fraction": float(((raw_ratio > config.delta) & mask).sum() / tokens),
            "ratio_mean": float((raw_ratio * m).sum() / tokens),
            "ratio_max": float(raw_ratio.masked_fill(~mask, float("-inf")).max())
            if mask.any()
            else 0.0,
            "tis_fraction": 0.0 if capped is None else float(capped.sum() / tokens),
            "icepop_fraction": float((outside & mask).sum() / tokens) if config.icepop else 0.0,
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
