"""The vLLM backend: vLLM's offline ``LLM`` engine on a GPU, with TOPLOC proofs.

vLLM (``pip install swarmrl[gpu]``, 0.33.x) samples the completions. It is
imported only when a backend is built, so nothing else needs it installed.

Hidden states. vLLM runs the model in a worker (often another process) and
batches requests as it likes, so the rows of a decode step cannot be mapped back
to requests from outside the engine. The simplest mapping that stays correct is
used instead: a forward hook on the model's final norm (``model.model.norm``),
installed in the worker through ``LLM.apply_model``, records the norm's output
only while a capture is armed. Each completion is then re-run as one request on
its own, ``prompt + output`` as a prompt with ``max_tokens=1``, so every recorded
row belongs to it, in sequence order (a chunked prefill records its chunks in
order too). Rows ``len(prompt) - 1 .. len(prompt) - 2 + len(output)`` are the
states the output tokens were sampled from; they are proven with
``swarmrl.toploc.build_proofs``. This costs one prefill per completion, far less
than the decode, and it is exactly the computation a validator repeats, so the
prover's and the validator's numerics agree as closely as the engine allows.
For this to hold the engine runs eagerly (``enforce_eager=True``: neither CUDA
graphs nor ``torch.compile``, both of which bypass module hooks), and capture
requests skip reading the prefix cache, which would otherwise leave the cached
positions uncomputed. Tensor parallelism works (every rank sees the full norm
output); pipeline parallelism does not (only the last stage has the norm).

Log-probabilities. vLLM reports the sampled token's log-probability with
``logprobs=0``. By default those are "raw" (before temperature); the engine is
started with ``logprobs_mode="processed_logprobs"`` so that they come from the
temperature-scaled logits the token was drawn from, as ``Completion`` asks. vLLM
computes processed log-probabilities after top-p filtering, renormalised over the
nucleus, which is not what ``Completion`` means; with ``top_p < 1`` they are
therefore taken from the prefill pass instead (temperature-scaled, before
top-p). At temperature 0 (greedy) they are the untempered distribution's, as in
vLLM and the torch backend.

Weights are replaced in place by streaming the new checkpoint's safetensors into
the model's own ``load_weights`` inside the worker (unquantised checkpoints), and
the prefix cache, which holds states of the old weights, is then reset.
"""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import torch

from swarmrl import toploc
from swarmrl.models.backend import (
    PROOF_CHUNK,
    PROOF_TOPK,
    Completion,
    FinishReason,
    Prefill,
    SamplingParams,
    TokenScores,
    score_tokens,
)
from swarmrl.models.directory import check_model, eos_token_ids, load_tokenizer, weight_files

# What the hidden-state capture and the log-probability semantics above rely on.
_ENGINE_SETTINGS = {"enforce_eager": True, "logprobs_mode": "processed_logprobs"}


class VLLMBackend:
    """A policy served by vLLM's offline engine; see the module docstring for the design."""

    name = "vllm"

    def __init__(
        self,
        model_dir: Path,
        *,
        engine_kwargs: dict[str, Any] | None = None,
        llm: Any | None = None,
        vllm: Any | None = None,
    ) -> None:
        """Start vLLM on ``model_dir``; ``engine_kwargs`` go to ``vllm.LLM``.

        ``llm`` (an engine already built with the settings described above) and
        ``vllm`` (the module) replace the real ones, which is how the tests run
        without a GPU.
        """
        if vllm is None:
            try:
                import vllm as vllm_module
            except ImportError:
                raise ValueError(
                    "the vllm backend needs a GPU and `pip install swarmrl[gpu]`"
                ) from None
            vllm = vllm_module
        self._vllm = vllm
        self.model_dir = Path(model_dir)
        check_model(self.model_dir)
        self.tokenizer = load_tokenizer(self.model_dir)
        self.eos_ids = eos_token_ids(self.model_dir, self.tokenizer)
        if llm is None:
            engine_kwargs = dict(engine_kwargs or {})
            if clash := sorted(engine_kwargs.keys() & {"model", *_ENGINE_SETTINGS}):
                raise ValueError(f"the vllm backend sets {', '.join(clash)} itself")
            # The worker functions below reach the engine's worker processes pickled,
            # which vLLM allows only when asked; they are this module's own code.
            os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
            llm = vllm.LLM(model=str(self.model_dir), **_ENGINE_SETTINGS, **engine_kwargs)
        self._llm = llm
        self._llm.apply_model(_install_capture)

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, *, prove: bool = True
    ) -> list[Completion]:
        """One completion per prompt, sampled by vLLM in one batch."""
        for i, prompt in enumerate(prompts):
            if not prompt:
                raise ValueError(f"prompt {i} is empty")
        if not prompts:
            return []
        outputs = self._llm.generate(
            [self._vllm.TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
            self._sampling_params(params, len(prompts)),
            use_tqdm=False,
        )
        # See the module docstring: vLLM's processed log-probabilities are renormalised
        # over the top-p nucleus, so then the prefill pass supplies them.
        nucleus = params.top_p < 1 and params.temperature > 0
        completions = []
        for prompt, output in zip(prompts, outputs, strict=True):
            sample = output.outputs[0]
            output_ids = list(sample.token_ids)
            logprobs = [
                step[token].logprob for step, token in zip(sample.logprobs, output_ids, strict=True)
            ]
            proofs: list[bytes] = []
            if prove or nucleus:
                recomputed = self.prefill(prompt, output_ids, temperature=params.temperature)
                if prove:
                    proofs = toploc.build_proofs(recomputed.hidden, PROOF_CHUNK, PROOF_TOPK)
                if nucleus:
                    logprobs = recomputed.logprobs
            completions.append(
                Completion(
                    prompt_ids=list(prompt),
                    output_ids=output_ids,
                    logprobs=logprobs,
                    text=sample.text,
                    finish_reason=_finish_reason(sample),
                    proofs=proofs,
                )
            )
        return completions

    def _sampling_params(self, params: SamplingParams, count: int) -> list[Any]:
        # One seed per request: a group repeats its prompt, and one shared seed would
        # make every member of the group the same completion.
        seeds: list[int | None] = [None] * count
        if params.seed is not None:
            rng = random.Random(params.seed)
            seeds = [rng.getrandbits(31) for _ in range(count)]
        return [
            self._vllm.SamplingParams(
                temperature=params.temperature,
                top_p=params.top_p,
                max_tokens=params.max_tokens,
                stop=list(params.stop),
                seed=seed,
                logprobs=0,
                include_stop_str_in_output=True,
            )
            for seed in seeds
        ]

    def prefill(
        self,
        prompt_ids: list[int],
        output_ids: list[int],
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
    ) -> Prefill:
        """Final-norm states of ``output_ids`` and their scores under the given sampling,
        from one request alone."""
        if not prompt_ids or not output_ids:
            raise ValueError("prefill needs a non-empty prompt and output")
        self._llm.apply_model(_arm_capture)
        self._llm.generate(
            [self._vllm.TokensPrompt(prompt_token_ids=[*prompt_ids, *output_ids])],
            self._vllm.SamplingParams(
                temperature=0.0, max_tokens=1, skip_reading_prefix_cache=True, detokenize=False
            ),
            use_tqdm=False,
        )
        # Under tensor parallelism only the first rank gathers the whole vocabulary.
        hidden, scores = self._llm.apply_model(
            functools.partial(
                _take_capture,
                start=len(prompt_ids) - 1,
                output_ids=list(output_ids),
                temperature=temperature,
                top_p=top_p,
            )
        )[0]
        return Prefill(hidden=hidden, scores=scores)

    def prefill_group(
        self,
        prompt_ids: list[int],
        outputs: list[list[int]],
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
    ) -> list[Prefill]:
        """``prefill`` of each output in turn: a capture reads one request's states."""
        return [
            self.prefill(prompt_ids, output, temperature=temperature, top_p=top_p)
            for output in outputs
        ]

    def load_weights(self, model_dir: Path) -> None:
        """Stream ``model_dir``'s safetensors into the running model, then drop stale caches."""
        model_dir = Path(model_dir)
        files = [str(path) for path in weight_files(model_dir)]
        self._llm.apply_model(functools.partial(_load_weights, files=files))
        self._llm.reset_prefix_cache()
        self.model_dir = model_dir


def _finish_reason(sample: Any) -> FinishReason:
    """vLLM says "stop" for both end of sequence and stop strings; its stop_reason tells them
    apart (the string that matched, else None or an end-of-sequence token id)."""
    if sample.finish_reason == "length":
        return "length"
    if sample.finish_reason == "stop":
        return "stop" if isinstance(sample.stop_reason, str) else "eos"
    raise RuntimeError(f"vLLM ended a request unexpectedly ({sample.finish_reason!r})")


# -- run inside vLLM's workers through LLM.apply_model ------------------------------------


class _EngineModel(Protocol):
    """What these functions use of the model inside a vLLM worker (vLLM's own classes,
    which ship no types here)."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None: ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> object: ...


# The final norm's capture, an attribute of the norm module: the rows of every forward
# pass since it was armed, None while it is not.
_ROWS = "_swarmrl_rows"


def _captured(norm: torch.nn.Module) -> list[torch.Tensor] | None:
    rows: list[torch.Tensor] | None = getattr(norm, _ROWS)
    return rows


def _final_norm(model: object) -> torch.nn.Module:
    norm = getattr(getattr(model, "model", None), "norm", None)
    if not isinstance(norm, torch.nn.Module):
        raise ValueError(
            f"the vllm backend captures hidden states at model.model.norm, "
            f"which {type(model).__name__} lacks"
        )
    return norm


def _install_capture(model: torch.nn.Module) -> None:
    norm = _final_norm(model)
    if not hasattr(norm, _ROWS):
        setattr(norm, _ROWS, None)
        norm.register_forward_hook(_record_rows)


def _record_rows(norm: torch.nn.Module, args: Any, output: Any) -> None:
    captured = _captured(norm)
    if captured is None:
        return
    # vLLM's fused residual norm returns (normed, residual).
    rows = output[0] if isinstance(output, tuple) else output
    # The engine may reuse the buffer for the next step.
    captured.append(rows.detach().reshape(-1, rows.shape[-1]).clone())


def _arm_capture(model: torch.nn.Module) -> None:
    setattr(_final_norm(model), _ROWS, [])


@torch.no_grad()
def _take_capture(
    model: _EngineModel, *, start: int, output_ids: list[int], temperature: float, top_p: float
) -> tuple[torch.Tensor, TokenScores] | None:
    norm = _final_norm(model)
    rows = _captured(norm)
    setattr(norm, _ROWS, None)
    captured = torch.cat(rows) if rows else torch.empty(0)
    end = start + len(output_ids)
    # Rows past the sequence (a trailing decode step some schedulers run) are not used.
    if captured.shape[0] <= end:
        raise RuntimeError(
            f"captured {captured.shape[0]} final-norm rows for a {end + 1}-token prefill; the "
            f"engine must run eagerly (enforce_eager=True) without reading the prefix cache"
        )
    hidden = captured[start:end]
    logits = model.compute_logits(hidden)
    if logits is None:
        return None
    return hidden.cpu(), score_tokens(logits, output_ids, temperature, top_p)


def _load_weights(model: _EngineModel, *, files: list[str]) -> None:
    from safetensors.torch import load_file

    # One file in memory at a time; the model copies each tensor where it belongs.
    model.load_weights(item for path in files for item in load_file(path).items())
