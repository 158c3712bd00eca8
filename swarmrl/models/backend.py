"""What every inference backend offers: sampling with proofs, and prefill.

A backend holds one policy (an HF model directory with safetensors weights and a
tokenizer). ``generate`` samples completions and proves them: the final-norm
hidden state that produced each generated token is captured and handed to
``swarmrl.toploc.build_proofs``. ``prefill`` recomputes those hidden states for a
given prompt + completion in one forward pass; that is how a validator checks a
proof. ``load_weights`` swaps in a newer checkpoint of the same architecture
without restarting.

A run declares the ``Precision`` its nodes sample in and its validator prefills
in: the same precision on both sides, so what the checks tolerate is only what
engines and hardware add.

The hidden state for output token ``i`` is the one at sequence position
``len(prompt) - 1 + i``: the state whose logits the token was sampled from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:  # torch is imported where used: a node's commands start without it
    import torch

FinishReason = Literal["eos", "stop", "length"]
BackendName = Literal["torch", "vllm"]
Precision = Literal["fp32", "bf16"]
# The dtype of each precision as torch and vLLM both name it.
_DTYPES: dict[Precision, str] = {"fp32": "float32", "bf16": "bfloat16"}

# TOPLOC's settings: one proof per 32 decoded tokens, committing to the top 128 values.
PROOF_CHUNK = 32
PROOF_TOPK = 128


@dataclass(frozen=True)
class Engine:
    """How a GPU engine is sized (a node's settings): vLLM takes all three, torch the
    memory fraction and a tensor-parallel size of 1 only."""

    tensor_parallel_size: int = 1  # GPUs one engine shards the model over
    gpu_memory_fraction: float | None = None  # of each GPU's memory; None: the engine's own
    max_model_len: int | None = None  # the longest prompt + completion; None: the model's


def dtype_name(precision: Precision) -> str:
    """The dtype ``precision`` stands for, as torch and vLLM name it (``bfloat16``)."""
    return _DTYPES[precision]


def torch_dtype(precision: Precision) -> torch.dtype:
    """The torch dtype ``precision`` stands for."""
    import torch

    dtype: torch.dtype = getattr(torch, dtype_name(precision))
    return dtype


def token_logprobs(
    logits: torch.Tensor, tokens: Sequence[int] | torch.Tensor, temperature: float
) -> torch.Tensor:
    """Each row's log-probability of its token at ``temperature`` (greedy, 0, counts
    as 1), from a ``len(tokens) x vocab`` tensor of logits: what ``Completion`` and
    ``Prefill`` report, so generators and validators compute it one way."""
    import torch

    logits = logits.float()
    if temperature > 0:
        logits = logits / temperature
    target = torch.as_tensor(tokens, device=logits.device)[:, None]
    return torch.log_softmax(logits, dim=-1).gather(1, target)[:, 0]


@dataclass(frozen=True)
class TokenScores:
    """How a sequence of tokens fares under one way of sampling.

    ``logprobs`` are as ``token_logprobs`` gives them; ``sequence_logprob`` is the
    log-probability that the sampler draws exactly these tokens (top-p renormalised;
    0 for an all-argmax sequence at temperature 0). ``outside`` says, per token, how
    far it lies outside what the sampler could draw: at temperature 0 the nats it
    lies below the argmax; under top-p how deep in the tail the nucleus cuts off
    it lies, the mass of the tokens more probable than it beyond top_p as a share
    of the tail's 1 - top_p (0 when it is inside, near 1 for the least probable
    token; a token drawn from the whole distribution lands uniformly in [0, 1) when
    outside; always 0 with top_p 1). How
    far is too far is the validator's call (:mod:`swarmrl.rollouts.tolerances`): the
    same computation in another precision or batch moves near-ties. ``expected`` and
    ``variance`` are, per token, the mean and variance of ``logprobs`` over the tokens
    the sampler draws at that position (top-p renormalised; at temperature 0 the
    argmax's own, with no variance): what a token drawn as claimed scores on average,
    the yardstick of the validator's check for sampling colder than claimed.
    """

    logprobs: list[float]
    sequence_logprob: float
    outside: list[float]
    expected: list[float]
    variance: list[float]


def score_tokens(logits: Any, tokens: Any, temperature: float, top_p: float) -> TokenScores:
    """``tokens`` judged against the sampler (temperature, top-p) that claims to have drawn
    them from ``logits`` (``len(tokens) x vocab``)."""
    import torch

    logits = logits.float()
    logprob = torch.log_softmax(logits / temperature if temperature > 0 else logits, dim=-1)
    target = torch.as_tensor(tokens, device=logits.device)[:, None]
    chosen = logprob.gather(1, target)[:, 0]
    if temperature == 0:
        outside = logprob.max(dim=-1).values - chosen
        sequence = 0.0
        # Greedy decoding draws the argmax for certain.
        expected, variance = logprob.max(dim=-1).values, torch.zeros_like(chosen)
    elif top_p < 1:
        probs = logprob.exp()
        # The sampler keeps the most probable tokens until their mass reaches top_p; a
        # token is inside when the tokens more probable than it weigh less than that.
        above = (probs * (probs > chosen.exp()[:, None])).sum(dim=-1)
        outside = ((above - top_p) / (1 - top_p)).clamp(min=0)
        ranked_logprob = logprob.sort(dim=-1, descending=True).values
        ranked = ranked_logprob.exp()
        kept = ranked * (ranked.cumsum(dim=-1) - ranked < top_p)
        nucleus = kept.sum(dim=-1)
        sequence = float((chosen - nucleus.log()).sum())
        expected, variance = _moments(kept / nucleus[:, None], ranked_logprob)
    else:
        outside = torch.zeros_like(chosen)
        sequence = float(chosen.sum())
        expected, variance = _moments(logprob.exp(), logprob)
    return TokenScores(
        logprobs=chosen.tolist(),
        sequence_logprob=sequence,
        outside=outside.tolist(),
        expected=expected.tolist(),
        variance=variance.tolist(),
    )


def _moments(draw: Any, logprob: Any) -> tuple[Any, Any]:
    """Per row, the mean and variance of ``logprob`` over a token drawn with the
    probabilities ``draw``."""
    import torch

    # A token never drawn adds nothing, also where its log-probability is -inf.
    logprob = torch.where(draw > 0, logprob, 0.0)
    mean = (draw * logprob).sum(dim=-1)
    variance = (draw * (logprob - mean[:, None]) ** 2).sum(dim=-1)
    return mean, variance


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``temperature == 0`` is greedy; ``seed`` makes a batch repeatable."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must not be negative, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must not be empty")


@dataclass
class Completion:
    """One sampled completion of one prompt.

    ``logprobs[i]`` is the log-probability of ``output_ids[i]`` under the
    temperature-scaled distribution it was sampled from (before top-p), the
    quantity GRPO's importance ratio needs. ``text`` decodes ``output_ids``,
    stop string included.
    """

    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason
    proofs: list[bytes] = field(default_factory=list)


@dataclass
class Prefill:
    """What a single forward pass over prompt + output recomputes.

    ``hidden`` is a ``len(output_ids) x hidden_size`` tensor of final-norm states;
    ``scores`` judge the output tokens against the sampling settings asked about.
    """

    hidden: Any
    scores: TokenScores

    @property
    def logprobs(self) -> list[float]:
        """The output tokens' log-probabilities at the temperature asked about."""
        return self.scores.logprobs


class Backend(Protocol):
    """An inference engine holding one policy."""

    name: str
    model_dir: Path
    tokenizer: Any  # a transformers PreTrainedTokenizerBase
    eos_ids: frozenset[int]  # the tokens that end a completion

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, *, prove: bool = True
    ) -> list[Completion]:
        """One completion per prompt (repeat a prompt for a group), with proofs if ``prove``."""
        ...

    def prefill(
        self,
        prompt_ids: list[int],
        output_ids: list[int],
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
    ) -> Prefill:
        """Hidden states of ``output_ids`` and their scores under the given sampling, in one
        forward pass."""
        ...

    def prefill_group(
        self,
        prompt_ids: list[int],
        outputs: list[list[int]],
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
    ) -> list[Prefill]:
        """``prefill`` of each of ``outputs`` after the one prompt a group shares: what a
        validator runs per group, so a backend may compute the prompt once."""
        ...

    def load_weights(self, model_dir: Path) -> None:
        """Replace the weights in place with those of ``model_dir`` (same architecture)."""
        ...
