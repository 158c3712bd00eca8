"""One optimizer step of GRPO on a batch of samples.

The batch is cut into micro-batches whose gradients add up: the loss divides by a
constant normalizer, not by anything the micro-batch holds, so the sum of the
micro-batch losses is the loss of the whole batch, exactly. A step whose loss or
gradient norm is not finite changes nothing: the gradients are dropped and the
caller is told, so a broken step is never written as a checkpoint.

The ratio's denominator is the sampler's log-probability by default. With
``ratio_against="trainer"`` it is the trainer's own, recomputed before the
update, as INTELLECT-2 did: with one optimizer step per batch that is the
current policy's value detached, so the ratio is exactly 1, the clip never acts
and the update is the plain policy gradient at the trainer's weights, blind to
how far the sampler's policy was from them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from orchestrator.trainer.batch import completion_logprobs, completion_logprobs_and_entropy
from orchestrator.trainer.loss import LossConfig, grpo_loss
from orchestrator.trainer.recipe import RatioAgainst
from orchestrator.trainer.samples import Sample

# The loss metrics averaged over tokens (an empty batch reports them as 0.0).
TOKEN_WEIGHTED = ("clip_fraction", "delta_fraction", "ratio_mean")


def check_ratio_against(value: str) -> None:
    if value not in ("sampler", "trainer"):
        raise ValueError(f"ratio_against must be sampler or trainer, not {value!r}")


@dataclass(frozen=True)
class StepResult:
    """What one step did. ``applied`` is False when it was skipped as non-finite."""

    applied: bool
    loss: float
    grad_norm: float
    metrics: dict[str, float]


def padded(rows: Sequence[Sequence[float]], width: int, device: torch.device) -> torch.Tensor:
    """Rows of different lengths as one zero-padded [len(rows), width] tensor."""
    out = torch.zeros(len(rows), width, device=device)
    for b, row in enumerate(rows):
        out[b, : len(row)] = torch.tensor(row, device=device)
    return out


def micro_batches(samples: Sequence[Sample], size: int) -> Iterable[Sequence[Sample]]:
    for start in range(0, len(samples), size):
        yield samples[start : start + size]


def accumulate_gradients(
    model: torch.nn.Module,
    samples: Sequence[Sample],
    loss_config: LossConfig,
    *,
    temperature: float,
    micro_batch: int,
    ratio_against: RatioAgainst = "sampler",
    reference: torch.nn.Module | None = None,
) -> tuple[float, dict[str, float]]:
    """Backpropagate the batch's loss through ``model``, micro-batch by micro-batch;
    return the loss and the token-weighted metrics. Gradients are added to ``.grad``.
    ``reference`` is the frozen policy the KL term measures against (needed when
    ``loss_config.kl_coef`` > 0)."""
    check_ratio_against(ratio_against)
    if loss_config.kl_coef > 0 and reference is None:
        raise ValueError("a KL term needs a reference model")
    device = next(model.parameters()).device
    total_loss, tokens = 0.0, 0
    sums = dict.fromkeys(TOKEN_WEIGHTED, 0.0)
    ratio_max = 0.0
    for chunk in micro_batches(samples, micro_batch):
        prompts, outputs = [s.prompt_ids for s in chunk], [s.output_ids for s in chunk]
        entropy = ref_logprobs = None
        if loss_config.entropy_coef > 0:
            logprobs, mask, entropy = completion_logprobs_and_entropy(
                model, prompts, outputs, temperature
            )
        else:
            logprobs, mask = completion_logprobs(model, prompts, outputs, temperature)
        if ratio_against == "trainer":
            denominator = logprobs.detach()
        else:
            denominator = padded([s.sampler_logprobs for s in chunk], logprobs.shape[1], device)
        if loss_config.kl_coef > 0:
            assert reference is not None  # checked above
            with torch.no_grad():
                ref_logprobs, _ = completion_logprobs(reference, prompts, outputs, temperature)
        advantages = torch.tensor([s.advantage for s in chunk], device=device)
        loss, metrics = grpo_loss(
            logprobs,
            denominator,
            advantages,
            mask,
            loss_config,
            ref_logprobs=ref_logprobs,
            entropy=entropy,
        )
        loss.backward()
        n = int(mask.sum())
        total_loss += float(loss.detach())
        tokens += n
        for key in TOKEN_WEIGHTED:
            sums[key] += metrics[key] * n
        ratio_max = max(ratio_max, metrics["ratio_max"])
    averaged = {key: value / max(tokens, 1) for key, value in sums.items()}
    return total_loss, {**averaged, "ratio_max": ratio_max, "tokens": float(tokens)}


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    samples: Sequence[Sample],
    loss_config: LossConfig,
    *,
    lr: float,
    max_grad_norm: float,
    temperature: float,
    micro_batch: int = 32,
    ratio_against: RatioAgainst = "sampler",
    reference: torch.nn.Module | None = None,
) -> StepResult:
    """Compute the batch's gradient, clip its norm to ``max_grad_norm`` and take one
    AdamW step at ``lr``; or, if the loss or the gradient is not finite, take none."""
    if not samples:
        raise ValueError("a step needs at least one sample")
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss, metrics = accumulate_gradients(
        model,
        samples,
        loss_config,
        temperature=temperature,
        micro_batch=micro_batch,
        ratio_against=ratio_against,
        reference=reference,
    )
    params = [p for p in model.parameters() if p.requires_grad]
    # The norm before clipping: what the gradient was, not what was applied.
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
    applied = math.isfinite(loss) and math.isfinite(grad_norm)
    if applied:
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    return StepResult(applied=applied, loss=loss, grad_norm=grad_norm, metrics=metrics)
