"""The torch backend: transformers models sampled by our own decode loop.

The loop runs the model's decoder stack and its output head separately, so the
final-norm hidden state of every step is in hand without a second pass or any
hook: it is the tensor the logits are computed from. Those states are the
TOPLOC activations. Batches are left-padded with explicit position ids, and a
KV cache carries each step to the next.

Why not ``model.generate()``: it cannot hand back the hidden states that
produced each token without ``output_hidden_states`` for every layer at every
step, and it spends per-step time on machinery (logits processors, stopping
criteria objects) that a rollout worker does not need; see
``benchmarks/inference.py`` for the side-by-side figures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from swarmrl import toploc
from swarmrl.models.backend import (
    PROOF_CHUNK,
    PROOF_TOPK,
    Completion,
    FinishReason,
    Prefill,
    SamplingParams,
    score_tokens,
    token_logprobs,
)
from swarmrl.models.directory import (
    check_finite,
    check_model,
    eos_token_ids,
    load_tokenizer,
    read_state_dict,
)

# Stop strings are looked for in the decoded tail of this many tokens beyond the
# longest stop string's length, enough for tokens that are shorter than a character.
_STOP_TAIL_SLACK = 4
# A group's outputs are prefilled together up to this many (padded) tokens per pass:
# a 16-sample group of 1k-token reasoning fits, and the activations stay bounded.
PREFILL_BATCH_TOKENS = 16_384


def default_device() -> torch.device:
    """The GPU when there is one, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def parse_device(device: str | torch.device | None) -> torch.device:
    """The torch device named, checked to exist here; ValueError in one sentence if not."""
    if device is None:
        return default_device()
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"{device!r} is not a torch device (try cpu or cuda)") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device} asked for, but this machine has no CUDA GPU")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {device} asked for, but this machine has "
                f"{torch.cuda.device_count()} CUDA GPUs"
            )
    elif parsed.type not in ("cpu", "mps") or (
        parsed.type == "mps" and not torch.backends.mps.is_available()
    ):
        raise ValueError(f"device {device} is not available here (try cpu or cuda)")
    return parsed


class TorchBackend:
    """A policy loaded with transformers, sampled and prefilled on CPU or GPU."""

    name = "torch"

    def __init__(
        self,
        model_dir: Path,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM

        self.model_dir = Path(model_dir)
        self.device = parse_device(device)
        # float32 on the CPU: bf16 matmuls there are slow and no more faithful.
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        # Checked first: transformers would fill missing tensors with random values.
        check_model(self.model_dir)
        self.tokenizer = load_tokenizer(self.model_dir)
        try:
            model = AutoModelForCausalLM.from_pretrained(
                self.model_dir, dtype=self.dtype, local_files_only=True
            )
        except (OSError, ValueError) as e:
            raise ValueError(f"{self.model_dir} is not a loadable model directory ({e})") from None
        # PreTrainedModel.to is functools.wraps(Module.to), which mypy does not bind as a
        # method (it takes the device for `self`).
        self.model = model.to(self.device).eval()  # type: ignore[arg-type]
        self._decoder = self.model.get_decoder()
        self._head = self.model.get_output_embeddings()
        self._max_positions = getattr(self.model.config, "max_position_embeddings", None)
        self.eos_ids = eos_token_ids(self.model_dir, self.tokenizer)
        self._pad = self.tokenizer.pad_token_id
        if self._pad is None:
            self._pad = min(self.eos_ids, default=0)

    # -- sampling ---------------------------------------------------------------

    @torch.inference_mode()
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, *, prove: bool = True
    ) -> list[Completion]:
        """One completion per prompt, sampled together in one batch."""
        if not prompts:
            return []
        self._check_lengths(prompts, params.max_tokens)
        batch = len(prompts)
        width = max(map(len, prompts))
        ids = torch.full((batch, width), self._pad, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[row, width - len(prompt) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(params.seed)

        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        hidden = self._decoder(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state[:, -1]
        position = positions[:, -1:]
        # rows[i] is the prompt that batch position i is decoding; finished rows leave the
        # batch (and the KV cache), so later steps pay only for the rows still going.
        rows = list(range(batch))
        outputs: list[list[int]] = [[] for _ in range(batch)]
        steps: list[tuple[list[int], torch.Tensor, torch.Tensor]] = []
        finish: list[FinishReason | None] = [None] * batch
        eos = torch.tensor(sorted(self.eos_ids), dtype=torch.long, device=self.device)
        stop_tail = max((len(s) for s in params.stop), default=0) + _STOP_TAIL_SLACK

        for step in range(params.max_tokens):
            logits = self._head(hidden).float()
            token, logprob = _sample(logits, params, generator)
            steps.append((rows, logprob, hidden))
            ended = torch.isin(token, eos).tolist() if len(eos) else [False] * len(rows)
            keep = []
            for pos, (row, new) in enumerate(zip(rows, token.tolist(), strict=True)):
                outputs[row].append(new)
                if ended[pos]:
                    finish[row] = "eos"
                elif params.stop and self._hit_stop(outputs[row], params.stop, stop_tail):
                    finish[row] = "stop"
                else:
                    keep.append(pos)
            if not keep or step + 1 == params.max_tokens:
                break
            if len(keep) < len(rows):
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                mask, position, token = mask[index], position[index], token[index]
                rows = [rows[pos] for pos in keep]
            mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
            position = position + 1
            hidden = self._decoder(
                input_ids=token[:, None],
                attention_mask=mask,
                position_ids=position,
                past_key_values=cache,
                use_cache=True,
            ).last_hidden_state[:, -1]
        return self._completions(prompts, outputs, finish, steps, prove)

    def _completions(
        self,
        prompts: list[list[int]],
        outputs: list[list[int]],
        finish: list[FinishReason | None],
        steps: list[tuple[list[int], torch.Tensor, torch.Tensor]],
        prove: bool,
    ) -> list[Completion]:
        """Each prompt's completion, its log-probabilities and states gathered from the steps."""
        owner = [row for rows, _, _ in steps for row in rows]
        where: list[list[int]] = [[] for _ in prompts]
        for i, row in enumerate(owner):
            where[row].append(i)
        logprobs = torch.cat([lp for _, lp, _ in steps]).tolist()
        states = torch.cat([h for _, _, h in steps]) if prove else None
        completions = []
        for row, prompt in enumerate(prompts):
            proofs = []
            if states is not None:
                index = torch.tensor(where[row], device=states.device)
                proofs = toploc.build_proofs(states[index], PROOF_CHUNK, PROOF_TOPK)
            completions.append(
                Completion(
                    prompt_ids=list(prompt),
                    output_ids=outputs[row],
                    logprobs=[logprobs[i] for i in where[row]],
                    text=self.tokenizer.decode(outputs[row], skip_special_tokens=True),
                    finish_reason=finish[row] or "length",
                    proofs=proofs,
                )
            )
        return completions

    def _hit_stop(self, output: list[int], stop: tuple[str, ...], tail: int) -> bool:
        text = self.tokenizer.decode(output[-tail:], skip_special_tokens=True)
        return any(s in text for s in stop)

    def _check_lengths(self, prompts: list[list[int]], max_tokens: int) -> None:
        for i, prompt in enumerate(prompts):
            if not prompt:
                raise ValueError(f"prompt {i} is empty")
        longest = max(map(len, prompts)) + max_tokens
        if self._max_positions is not None and longest > self._max_positions:
            raise ValueError(
                f"prompt plus max_tokens is {longest} tokens, more than the model's "
                f"{self._max_positions} positions"
            )

    # -- validation -------------------------------------------------------------

    @torch.inference_mode()
    def prefill(
        self,
        prompt_ids: list[int],
        output_ids: list[int],
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
    ) -> Prefill:
        """The states generation saw, recomputed in one pass, and the output scored under
        the given sampling."""
        if not prompt_ids or not output_ids:
            raise ValueError("prefill needs a non-empty prompt and output")
        self._check_lengths([prompt_ids], len(output_ids))
        vocab = self.model.config.vocab_size
        if not all(0 <= t < vocab for t in (*prompt_ids, *output_ids)):
            raise ValueError(f"token ids must lie in [0, {vocab})")
        ids = torch.tensor([prompt_ids + output_ids], dtype=torch.long, device=self.device)
        states = self._decoder(input_ids=ids, use_cache=False).last_hidden_state[0]
        start = len(prompt_ids) - 1
        hidden = states[start : start + len(output_ids)]
        scores = score_tokens(self._head(hidden), output_ids, temperature, top_p)
        return Prefill(hidden=hidden, scores=scores)

    @torch.inference_mode()
    def prefill_group(
        self,
        prompt_ids: list[int],
        outputs: list[list[int]],
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
    ) -> list[Prefill]:
        """``prefill`` of each output after one shared prompt. The prompt is computed
        once per batch and its KV cache shared by every output, as in generation; the
        outputs run together, right-padded (a causal model's real tokens never see the
        padding after them), at most PREFILL_BATCH_TOKENS padded tokens per pass. On a
        group of eight this costs about a third of eight single prefills."""
        from transformers import DynamicCache

        if not prompt_ids or not outputs or not all(outputs):
            raise ValueError("prefill needs a non-empty prompt and outputs")
        self._check_lengths([prompt_ids], max(map(len, outputs)))
        vocab = self.model.config.vocab_size
        if not all(0 <= t < vocab for t in (*prompt_ids, *(t for o in outputs for t in o))):
            raise ValueError(f"token ids must lie in [0, {vocab})")
        prefills = []
        for batch in _token_batches(outputs, PREFILL_BATCH_TOKENS):
            cache = DynamicCache(config=self.model.config)
            prompt = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
            last = self._decoder(
                input_ids=prompt, past_key_values=cache, use_cache=True
            ).last_hidden_state[0, -1:]
            cache.batch_repeat_interleave(len(batch))
            width = max(map(len, batch))
            ids = torch.full((len(batch), width), self._pad, dtype=torch.long)
            for row, output in enumerate(batch):
                ids[row, : len(output)] = torch.tensor(output, dtype=torch.long)
            start = len(prompt_ids)
            positions = torch.arange(start, start + width, device=self.device)
            states = self._decoder(
                input_ids=ids.to(self.device),
                position_ids=positions.expand(len(batch), width),
                past_key_values=cache,
                use_cache=True,
            ).last_hidden_state
            for row, output in enumerate(batch):
                # The state that predicts output token i is the one before it.
                hidden = torch.cat([last, states[row, : len(output) - 1]])
                scores = score_tokens(self._head(hidden), output, temperature, top_p)
                prefills.append(Prefill(hidden=hidden, scores=scores))
        return prefills

    # -- weights ----------------------------------------------------------------

    @torch.no_grad()
    def load_weights(self, model_dir: Path) -> None:
        """Copy a newer checkpoint's tensors into the loaded model, shape by shape."""
        model_dir = Path(model_dir)
        _check_same_architecture(self.model.config.to_dict(), model_dir)
        # Names and shapes are checked against the running model below, on the tensors
        # already read: check_model would read the whole checkpoint a second time.
        state = read_state_dict(model_dir)
        weights = dict(self.model.named_parameters())
        params = {**weights, **dict(self.model.named_buffers())}
        unknown = sorted(set(state) - set(params))
        if unknown:
            raise ValueError(f"{model_dir} holds tensors this model lacks: {unknown[:3]}")
        tied = {"lm_head.weight"} if self.model.config.tie_word_embeddings else set()
        missing = sorted(set(weights) - set(state) - tied)
        if missing:
            raise ValueError(f"{model_dir} lacks tensors of this model: {missing[:3]}")
        for name, tensor in state.items():
            if tensor.shape != params[name].shape:
                raise ValueError(
                    f"{model_dir}: {name} has shape {tuple(tensor.shape)}, "
                    f"expected {tuple(params[name].shape)}"
                )
            check_finite(model_dir, name, tensor)
        for name, tensor in state.items():
            params[name].copy_(tensor)
        self.model_dir = model_dir


def _token_batches(outputs: list[list[int]], budget: int) -> list[list[list[int]]]:
    """Consecutive runs of ``outputs`` whose padded size (rows x longest) stays within
    ``budget`` tokens; one output per batch at least."""
    batches: list[list[list[int]]] = []
    for output in outputs:
        if batches and (len(batches[-1]) + 1) * max(len(output), *map(len, batches[-1])) <= budget:
            batches[-1].append(output)
        else:
            batches.append([output])
    return batches


def _sample(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens drawn with temperature and top-p, and their log-probabilities."""
    if params.temperature == 0:
        token = logits.argmax(dim=-1)
        return token, token_logprobs(logits, token, 0)
    logprob = torch.log_softmax(logits / params.temperature, dim=-1)
    probs = logprob.exp()
    if params.top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token always).
        drop = sorted_probs.cumsum(dim=-1) - sorted_probs >= params.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        choice = torch.multinomial(sorted_probs, 1, generator=generator)
        token = order.gather(1, choice)[:, 0]
    else:
        token = torch.multinomial(probs, 1, generator=generator)[:, 0]
    return token, logprob.gather(1, token[:, None])[:, 0]


def _check_same_architecture(current: dict[str, Any], model_dir: Path) -> None:
    path = model_dir / "config.json"
    try:
        new = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is not a readable model config ({e})") from None
    for key in ("architectures", "hidden_size", "num_hidden_layers", "vocab_size"):
        if new.get(key) != current.get(key):
            raise ValueError(
                f"{model_dir} is a different architecture: {key} is {new.get(key)!r}, "
                f"expected {current.get(key)!r}"
            )
