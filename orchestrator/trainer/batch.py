"""From rollout tokens to the tensors the loss reads: the policy's log-probabilities of
each completion token (and the entropy it was drawn from), with gradients, in one
padded forward pass.

The log-probabilities are temperature-scaled exactly as the tokens were sampled
(``swarmrl.models.backend.token_logprobs``, the function generation and
validation use), so the ratio against the sampler's log-probabilities is 1 for a
policy that has not moved.

No [batch, tokens, vocabulary] tensor of logits is ever whole: ``TokenScorer`` runs
the decoder body, keeps the hidden states of the completion tokens only, and
applies the output head to ``chunk_tokens`` of them at a time. Each chunk's logits
die with the chunk; with gradients on, each chunk runs under activation
checkpointing, so backward recomputes its logits rather than keeping them. At a
150k vocabulary the logits are most of a micro-batch's memory: an 8 x 1024-token
micro-batch's are 5 GB per fp32 copy, and the whole-logits path held several
copies (scaled, log-softmax, their gradients) at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor
from torch.distributed.fsdp import FSDPModule
from torch.utils.checkpoint import checkpoint

from swarmrl.models.backend import token_logprobs

if TYPE_CHECKING:  # transformers is imported where used: it takes seconds to load
    from transformers import PreTrainedModel

# Tokens whose logits exist at once. At Qwen2's 151,936-token vocabulary a chunk's
# fp32 logits are 512 * 151,936 * 4 B = 311 MB, and a few such buffers live at once
# (the head's output, the scaled copy, the log-softmax, their gradients in backward):
# an 8 x 1024-token micro-batch measured 0.95 GiB at peak (1.8 GiB with the entropy),
# where each whole fp32 copy of its logits is 4.8 GiB. 512 rows still make the head's
# matmul large enough (512 x hidden x 152k) to keep a GPU busy.
CHUNK_TOKENS = 512

# Config fields with which transformers' causal LMs rescale or soft-cap the logits
# after the output head (Gemma 2/3, Granite, Cohere, Falcon-H1, MuseSpark), and the
# value that leaves the logits alone. The chunked head applies the bare head, so it
# refuses models that set any of them rather than compute another distribution.
_LOGIT_TRANSFORMS = {
    "final_logit_softcapping": None,
    "logits_scaling": 1,
    "logit_scale": 1,
    "output_multiplier": 1,
    "lm_head_multiplier": 1,
}


class TokenScorer(torch.nn.Module):
    """A Hugging Face causal LM that scores given tokens without whole logits.

    It holds the LM as ``lm`` and has no parameters of its own, so its parameter
    and state-dict names are the LM's prefixed with ``lm.`` (``lm.model.layers.0...``,
    ``lm.lm_head.weight``); save the LM itself (``scorer.lm.save_pretrained``) or
    strip the prefix. It is the module to shard at the root with FSDP2: the root's
    forward hook is what all-gathers the embeddings, final norm and output head, so
    the chunked head must run inside the root's forward, as it does here.
    """

    def __init__(self, lm: PreTrainedModel) -> None:
        super().__init__()
        configs = [lm.config, lm.config.get_text_config()]
        for field, neutral in _LOGIT_TRANSFORMS.items():
            for config in configs:
                value = getattr(config, field, None)
                if value is not None and value != neutral:
                    raise ValueError(
                        f"the model's config sets {field}={value!r}: the trainer's chunked "
                        "output head does not rescale or soft-cap logits"
                    )
        if lm.get_output_embeddings() is None:
            raise ValueError("the model has no output head to score tokens with")
        self.lm: PreTrainedModel = lm

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        positions: Tensor,
        targets: Tensor,
        temperature: float,
        entropy: bool = False,
        chunk_tokens: int = CHUNK_TOKENS,
    ) -> tuple[Tensor, Tensor | None]:
        """Log-probabilities [N] of ``targets`` [N], each predicted by the hidden state
        at flat index ``positions`` [N] of the [B, W] ``input_ids``, and, with
        ``entropy``, the entropy [N] of each temperature-scaled distribution."""
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be at least 1, not {chunk_tokens}")
        decoder = self.lm.get_decoder()
        hidden = decoder(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state
        # Only the rows that predict a completion token, padding left out.
        picked = hidden.reshape(-1, hidden.shape[-1])[positions]
        head = self.lm.get_output_embeddings()
        # With gradients, a chunk keeps only its inputs (views of ``picked``) and
        # outputs; backward recomputes its logits, one chunk at a time.
        recompute = torch.is_grad_enabled()
        scores = [
            checkpoint(_score, head, h, t, temperature, entropy, use_reentrant=False)
            if recompute
            else _score(head, h, t, temperature, entropy)
            for h, t in zip(picked.split(chunk_tokens), targets.split(chunk_tokens), strict=True)
        ]
        logprobs = torch.cat([lp for lp, _ in scores])
        if not entropy:
            return logprobs, None
        return logprobs, torch.cat([e for _, e in scores if e is not None])


def _score(
    head: torch.nn.Module, hidden: Tensor, targets: Tensor, temperature: float, entropy: bool
) -> tuple[Tensor, Tensor | None]:
    """One chunk: the log-probabilities of ``targets`` and, if asked, the entropy."""
    logits = head(hidden)
    logprobs = token_logprobs(logits, targets, temperature)
    if not entropy:
        return logprobs, None
    # Greedy (temperature 0) counts as 1, as in token_logprobs.
    scaled = torch.log_softmax(logits.float() / (temperature if temperature > 0 else 1.0), -1)
    return logprobs, -(scaled.exp() * scaled).sum(-1)


def completion_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    temperature: float,
    *,
    chunk_tokens: int = CHUNK_TOKENS,
) -> tuple[Tensor, Tensor]:
    """``(logprobs, mask)``, both [B, T] with T the longest completion: the policy's
    log-probability of each completion token (0 on padding), and True where a token
    is (not padding). ``model`` is a ``TokenScorer`` or the HF causal LM it wraps.

    Sequences are right-padded, so every real token keeps its position ids.
    """
    logprobs, _, mask = _completion_scores(
        model, prompts, outputs, temperature, entropy=False, chunk_tokens=chunk_tokens
    )
    return logprobs, mask


def completion_logprobs_and_entropy(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    temperature: float,
    *,
    chunk_tokens: int = CHUNK_TOKENS,
) -> tuple[Tensor, Tensor, Tensor]:
    """``completion_logprobs`` and, [B, T] too, the entropy of the temperature-scaled
    distribution each completion token was drawn from (0 on padding)."""
    logprobs, entropy, mask = _completion_scores(
        model, prompts, outputs, temperature, entropy=True, chunk_tokens=chunk_tokens
    )
    assert entropy is not None  # asked for
    return logprobs, mask, entropy


def compute_device(model: torch.nn.Module) -> torch.device:
    """Where ``model`` computes: its parameters' device, except in an NCCL job, where
    FSDP2 may keep the shards in host memory (optimizer offload) and gathers them onto
    the rank's GPU to compute."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return next(model.parameters()).device


def _completion_scores(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    temperature: float,
    *,
    entropy: bool,
    chunk_tokens: int,
) -> tuple[Tensor, Tensor | None, Tensor]:
    """The log-probabilities [B, T], the entropy [B, T] if asked for, and the mask
    [B, T], from one right-padded forward pass."""
    if len(prompts) != len(outputs) or not prompts:
        raise ValueError("give one non-empty prompt and one non-empty completion per row")
    if any(not p for p in prompts) or any(not o for o in outputs):
        raise ValueError("prompts and completions must not be empty")
    if not isinstance(model, TokenScorer):
        if isinstance(model, FSDPModule):
            # Its root hook gathers the head's weights for the LM's own forward only.
            raise ValueError("shard a TokenScorer wrapping the model, not the model itself")
        model = TokenScorer(cast("PreTrainedModel", model))
    device = compute_device(model)
    lengths = [len(p) + len(o) for p, o in zip(prompts, outputs, strict=True)]
    width, steps = max(lengths), max(len(o) for o in outputs)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    attention = torch.zeros_like(ids)
    mask = torch.zeros(len(prompts), steps, dtype=torch.bool)
    positions: list[int] = []
    for b, (p, o) in enumerate(zip(prompts, outputs, strict=True)):
        ids[b, : lengths[b]] = torch.tensor([*p, *o])
        attention[b, : lengths[b]] = 1
        mask[b, : len(o)] = True
        # The hidden state at position i predicts token i + 1: a completion starting
        # at position len(prompt) is read from len(prompt) - 1 on.
        start = b * width + len(p) - 1
        positions.extend(range(start, start + len(o)))
    targets = torch.tensor([t for o in outputs for t in o])
    mask = mask.to(device)
    logprobs, entropies = model(
        ids.to(device),
        attention.to(device),
        torch.tensor(positions, device=device),
        targets.to(device),
        temperature,
        entropy=entropy,
        chunk_tokens=chunk_tokens,
    )
    # The flat scores are the mask's True cells in row-major order, as masked_scatter
    # fills them.
    padded = logprobs.new_zeros(mask.shape).masked_scatter(mask, logprobs)
    if entropies is None:
        return padded, None, mask
    return padded, entropies.new_zeros(mask.shape).masked_scatter(mask, entropies), mask
