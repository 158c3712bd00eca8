"""One optimizer step of GRPO on a batch of samples.

The batch is cut into micro-batches whose gradients add up: the loss divides by a
constant normalizer, not by anything the micro-batch holds, so the sum of the
micro-batch losses is the loss of the whole batch, exactly. A step whose loss or
gradient norm is not finite changes nothing: the gradients are dropped and the
caller is told, so a broken step is never written as a checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from orchestrator.trainer.batch import completion_logprobs
from orchestrator.trainer.loss import LossConfig, grpo_loss
from orchestrator.trainer.samples import Sample

# The loss metrics averaged over tokens (an empty batch reports them as 0.0).
TOKEN_WEIGHTED = ("clip_fraction", "delta_fraction", "ratio_mean")


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
) -> tuple[float, dict[str, float]]:
    """Backpropagate the batch's loss through ``model``, micro-batch by micro-batch;
    return the loss and the token-weighted metrics. Gradients are added to ``.grad``."""
    device = next(model.parameters()).device
    total_loss, tokens = 0.0, 0
    sums = dict.fromkeys(TOKEN_WEIGHTED, 0.0)
    ratio_max = 0.0
    for chunk in micro_batches(samples, micro_batch):
        logprobs, mask = completion_logprobs(
            model, [s.prompt_ids for s in chunk], [s.output_ids for s in chunk], temperature
        )
        sampler = padded([s.sampler_logprobs for s in chunk], logprobs.shape[1], device)
        advantages = torch.tensor([s.advantage for s in chunk], device=device)
        loss, metrics = grpo_loss(logprobs, sampler, advantages, mask, loss_config)
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
) -> StepResult:
    """Compute the batch's gradient, clip its norm to ``max_grad_norm`` and take one
    AdamW step at ``lr``; or, if the loss or the gradient is not finite, take none."""
    if not samples:
        raise ValueError("a step needs at least one sample")
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss, metrics = accumulate_gradients(
        model, samples, loss_config, temperature=temperature, micro_batch=micro_batch
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
