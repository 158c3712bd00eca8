"""From rollout tokens to the tensors the loss reads: the policy's log-probabilities of
each completion token, with gradients, in one padded forward pass.

The log-probabilities are temperature-scaled exactly as the tokens were sampled
(``swarmrl.models.backend.token_logprobs``, the function generation and
validation use), so the ratio against the sampler's log-probabilities is 1 for a
policy that has not moved.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from swarmrl.models.backend import token_logprobs


def completion_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    temperature: float,
) -> tuple[Tensor, Tensor]:
    """``(logprobs, mask)``, both [B, T] with T the longest completion: the policy's
    log-probability of each completion token, and True where a token is (not padding).

    Sequences are right-padded, so every real token keeps its position ids.
    """
    logits, targets, mask = _completion_logits(model, prompts, outputs)
    return _logprobs(logits, targets, mask, temperature), mask


def completion_logprobs_and_entropy(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    temperature: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """``completion_logprobs`` and, [B, T] too, the entropy of the temperature-scaled
    distribution each completion token was drawn from (0 on padding)."""
    logits, targets, mask = _completion_logits(model, prompts, outputs)
    scaled = torch.log_softmax(logits.float() / (temperature or 1.0), dim=-1)
    entropy = -(scaled.exp() * scaled).sum(-1).masked_fill(~mask, 0.0)
    return _logprobs(logits, targets, mask, temperature), mask, entropy


def _completion_logits(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
) -> tuple[Tensor, Tensor, Tensor]:
    """The logits [B, T, V] that predict each completion token, the tokens [B, T] and
    the mask [B, T], from one right-padded forward pass."""
    if len(prompts) != len(outputs) or not prompts:
        raise ValueError("give one non-empty prompt and one non-empty completion per row")
    if any(not p for p in prompts) or any(not o for o in outputs):
        raise ValueError("prompts and completions must not be empty")
    device = next(model.parameters()).device
    lengths = [len(p) + len(o) for p, o in zip(prompts, outputs, strict=True)]
    width, steps = max(lengths), max(len(o) for o in outputs)
    ids = torch.zeros(len(prompts), width, dtype=torch.long, device=device)
    attention = torch.zeros_like(ids)
    for b, (p, o) in enumerate(zip(prompts, outputs, strict=True)):
        ids[b, : lengths[b]] = torch.tensor([*p, *o], device=device)
        attention[b, : lengths[b]] = 1
    logits = model(input_ids=ids, attention_mask=attention, use_cache=False).logits

    # The logits at position i predict token i + 1: a completion starting at
    # position len(prompt) is read from len(prompt) - 1 on.
    index = torch.zeros(len(prompts), steps, dtype=torch.long, device=device)
    targets = torch.zeros_like(index)
    mask = torch.zeros(len(prompts), steps, dtype=torch.bool, device=device)
    for b, (p, o) in enumerate(zip(prompts, outputs, strict=True)):
        n = len(o)
        index[b, :n] = torch.arange(len(p) - 1, len(p) - 1 + n, device=device)
        targets[b, :n] = torch.tensor(o, device=device)
        mask[b, :n] = True
    picked = logits.gather(1, index[:, :, None].expand(-1, -1, logits.shape[-1]))
    return picked, targets, mask


def _logprobs(logits: Tensor, targets: Tensor, mask: Tensor, temperature: float) -> Tensor:
    rows, steps, vocab = logits.shape
    flat = token_logprobs(logits.reshape(-1, vocab), targets.reshape(-1), temperature)
    return flat.reshape(rows, steps).masked_fill(~mask, 0.0)
