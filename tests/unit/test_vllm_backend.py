"""The vLLM backend against a stand-in engine that runs a real tiny transformers model.

vLLM needs a GPU, so its ``LLM`` is replaced by ``FakeLLM``: it records the prompts
and sampling parameters it is given, answers generation requests with scripted
outputs shaped like vLLM's, and runs every request's prefill through a real tiny
Llama wrapped to look like a vLLM model (``model.model.norm``, ``compute_logits``,
``load_weights``), so the hook capture and the proofs are computed for real.
"""

import dataclasses
import functools
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaForCausalLM

from swarmrl import toploc
from swarmrl.models import load_backend, tiny, vllm_engine
from swarmrl.models.backend import PROOF_CHUNK, PROOF_TOPK, Engine, SamplingParams
from swarmrl.models.vllm_backend import VLLMBackend
from tests.model_fixtures import random_tiny_model

PROMPT = [1, 40, 41, 42, 43]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return random_tiny_model(tmp_path_factory.mktemp("policy"), seed=0)


@pytest.fixture(scope="module")
def newer_model_dir(tmp_path_factory):
    return random_tiny_model(tmp_path_factory.mktemp("newer"), seed=1)


def load_llama(path: Path) -> LlamaForCausalLM:
    return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@functools.cache
def reference(path: Path) -> LlamaForCausalLM:
    """A model of its own, untouched by the backend, to compute expected values with."""
    return load_llama(path)


@torch.no_grad()
def reference_rows(path: Path, prompt: list[int], output: list[int]) -> torch.Tensor:
    """The final-norm states of the output tokens from a plain transformers forward."""
    states = reference(path).model(torch.tensor([prompt + output])).last_hidden_state[0]
    return states[len(prompt) - 1 : len(prompt) - 1 + len(output)]


@torch.no_grad()
def reference_logprobs(
    path: Path, prompt: list[int], output: list[int], temperature: float
) -> list[float]:
    logits = reference(path)(torch.tensor([prompt + output])).logits[0].float()
    logits = logits[len(prompt) - 1 : len(prompt) - 1 + len(output)] / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(output)[:, None])[:, 0].tolist()


class VllmShapedModel(torch.nn.Module):
    """A transformers Llama with the surface the backend's worker functions use."""

    def __init__(self, hf: LlamaForCausalLM) -> None:
        super().__init__()
        self.hf = hf
        self.model = hf.model

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.hf.lm_head(hidden)

    def load_weights(self, weights) -> set[str]:
        state = dict(weights)
        # A tied head is stored once, as the embedding; vLLM's loaders tie it the same way.
        missing, unexpected = self.hf.load_state_dict(state, strict=False)
        assert set(missing) <= {"lm_head.weight"}
        assert not unexpected
        return set(state)


class FakeSamplingParams:
    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs
        self.__dict__.update(kwargs)


def sample(tokens, *, finish="length", stop_reason=None, text="generated", logprob=-0.5):
    """One vLLM CompletionOutput; each step's dict also holds a token that was not sampled."""
    steps = [
        {t: SimpleNamespace(logprob=logprob), 99: SimpleNamespace(logprob=-9.0)} for t in tokens
    ]
    return SimpleNamespace(
        token_ids=tuple(tokens),
        logprobs=steps,
        text=text,
        finish_reason=finish,
        stop_reason=stop_reason,
    )


class FakeLLM:
    def __init__(self, model: str, **kwargs) -> None:
        self.kwargs = kwargs
        self.model = VllmShapedModel(load_llama(Path(model)))
        self.scripts: list[SimpleNamespace] = []
        self.calls: list[tuple[list[int], FakeSamplingParams]] = []
        self.resets = 0
        # Positions a prefix cache would hand back uncomputed; 0 while it is skipped.
        self.cached_prefix = 0

    def apply_model(self, func):
        return [func(self.model)]

    @torch.no_grad()
    def generate(self, prompts, sampling_params, use_tqdm=True):
        if not isinstance(sampling_params, list):
            sampling_params = [sampling_params] * len(prompts)
        results = []
        for prompt, params in zip(prompts, sampling_params, strict=True):
            ids = prompt["prompt_token_ids"]
            self.calls.append((ids, params))
            # Every request's prefill runs the model, so the norm hook fires for all of them.
            self.model.hf(torch.tensor([ids[self.cached_prefix :]]))
            if params.max_tokens == 1:
                results.append(SimpleNamespace(outputs=[sample([0])]))
            else:
                results.append(SimpleNamespace(outputs=[self.scripts.pop(0)]))
        return results

    def reset_prefix_cache(self) -> bool:
        self.resets += 1
        return True


FAKE_VLLM = SimpleNamespace(LLM=FakeLLM, SamplingParams=FakeSamplingParams, TokensPrompt=dict)


@pytest.fixture
def backend(model_dir):
    return VLLMBackend(model_dir, llm=FakeLLM(model=str(model_dir)), vllm=FAKE_VLLM)


def generation_calls(backend):
    return [(ids, p) for ids, p in backend._llm.calls if p.max_tokens != 1]


def capture_calls(backend):
    return [(ids, p) for ids, p in backend._llm.calls if p.max_tokens == 1]


def test_a_missing_vllm_is_one_clear_error(model_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ValueError, match=r"needs a GPU and `pip install swarmrl\[gpu\]`"):
        VLLMBackend(model_dir)


def test_the_engine_runs_eagerly_with_processed_logprobs(model_dir, monkeypatch):
    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)
    backend = VLLMBackend(model_dir, engine_kwargs={"gpu_memory_utilization": 0.5}, vllm=FAKE_VLLM)
    assert backend._llm.kwargs == {
        "enforce_eager": True,
        "logprobs_mode": "processed_logprobs",
        "gpu_memory_utilization": 0.5,
    }
    assert backend.model_dir == model_dir
    assert backend.tokenizer.decode([40, 41]) == tiny.ALPHABET[36:38]
    # The worker functions travel pickled to vLLM's worker processes.
    assert os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"


def test_a_nodes_engine_settings_reach_vllm(model_dir):
    engine = Engine(tensor_parallel_size=2, gpu_memory_fraction=0.8, max_model_len=8192)
    kwargs = vllm_engine("bf16", engine)
    assert kwargs == {
        "tensor_parallel_size": 2,
        "dtype": "bfloat16",
        "gpu_memory_utilization": 0.8,
        "max_model_len": 8192,
    }
    backend = VLLMBackend(model_dir, engine_kwargs=kwargs, vllm=FAKE_VLLM)
    assert backend._llm.kwargs == {
        "enforce_eager": True,
        "logprobs_mode": "processed_logprobs",
        **kwargs,
    }
    # Unset, they are vLLM's own: only the tensor-parallel size (1) is said.
    assert vllm_engine(None, Engine()) == {"tensor_parallel_size": 1}


def test_torch_runs_one_gpu_a_worker(model_dir):
    with pytest.raises(ValueError, match=r"^tensor_parallel_size 2 needs the vllm backend"):
        load_backend("torch", model_dir, device="cpu", engine=Engine(tensor_parallel_size=2))


def test_settings_the_capture_relies_on_cannot_be_overridden(model_dir):
    with pytest.raises(ValueError, match="sets enforce_eager itself"):
        VLLMBackend(model_dir, engine_kwargs={"enforce_eager": False}, vllm=FAKE_VLLM)


def test_greedy_sampling_translates_to_vllm(backend):
    backend._llm.scripts = [sample([5, 6]), sample([7])]
    backend.generate([PROMPT, PROMPT[:3]], SamplingParams(max_tokens=7, temperature=0), prove=False)
    calls = generation_calls(backend)
    assert [ids for ids, _ in calls] == [PROMPT, PROMPT[:3]]
    for _, params in calls:
        assert params.kwargs == {
            "temperature": 0,
            "top_p": 1.0,
            "max_tokens": 7,
            "stop": [],
            "seed": None,
            "logprobs": 0,
            "include_stop_str_in_output": True,
        }


def test_a_seed_gives_each_request_its_own_repeatable_seed(backend):
    params = SamplingParams(max_tokens=3, temperature=0.8, top_p=0.95, stop=("\n", "END"), seed=7)

    def seeds(params):
        backend._llm.calls.clear()
        backend._llm.scripts = [sample([5]) for _ in range(3)]
        backend.generate([PROMPT] * 3, params, prove=False)
        calls = generation_calls(backend)
        for _, p in calls:
            assert (p.temperature, p.top_p, p.stop, p.max_tokens) == (0.8, 0.95, ["\n", "END"], 3)
        return [p.seed for _, p in calls]

    first = seeds(params)
    assert len(set(first)) == 3
    assert all(isinstance(s, int) and 0 <= s < 2**31 for s in first)
    assert seeds(params) == first
    assert seeds(dataclasses.replace(params, seed=8)) != first


@pytest.mark.parametrize(
    ("finish", "stop_reason", "expected"),
    [
        ("length", None, "length"),
        ("stop", None, "eos"),
        ("stop", 2, "eos"),  # an extra end-of-sequence id from the generation config
        ("stop", "\n\n", "stop"),
    ],
)
def test_finish_reasons_map_from_vllm(backend, finish, stop_reason, expected):
    backend._llm.scripts = [sample([5, 6], finish=finish, stop_reason=stop_reason)]
    (completion,) = backend.generate([PROMPT], SamplingParams(), prove=False)
    assert completion.finish_reason == expected


def test_an_aborted_request_is_an_error(backend):
    backend._llm.scripts = [sample([5], finish="abort")]
    with pytest.raises(RuntimeError, match="'abort'"):
        backend.generate([PROMPT], SamplingParams(), prove=False)


def test_a_completion_carries_what_vllm_returned(backend):
    backend._llm.scripts = [sample([50, 51, 52], finish="stop", text="xyz\n", logprob=-0.25)]
    (completion,) = backend.generate([PROMPT], SamplingParams(stop=("\n",)), prove=False)
    assert completion.prompt_ids == PROMPT
    assert completion.output_ids == [50, 51, 52]
    assert completion.logprobs == [-0.25, -0.25, -0.25]
    assert completion.text == "xyz\n"
    assert completion.finish_reason == "eos"
    assert completion.proofs == []
    assert capture_calls(backend) == []


def test_empty_prompts_are_rejected(backend):
    assert backend.generate([], SamplingParams()) == []
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        backend.generate([PROMPT, []], SamplingParams())
    with pytest.raises(ValueError, match="non-empty prompt and output"):
        backend.prefill(PROMPT, [])


def test_proofs_verify_against_a_plain_transformers_forward(backend, model_dir):
    outputs = [
        torch.randint(4, 100, (40,), generator=torch.Generator().manual_seed(i)).tolist()
        for i in range(2)
    ]
    backend._llm.scripts = [sample(outputs[0]), sample(outputs[1])]
    completions = backend.generate([PROMPT, PROMPT[:2]], SamplingParams(max_tokens=40))

    # One capture request per completion, the whole sequence, computed afresh.
    captures = capture_calls(backend)
    assert [ids for ids, _ in captures] == [PROMPT + outputs[0], PROMPT[:2] + outputs[1]]
    for _, params in captures:
        assert params.skip_reading_prefix_cache is True
        assert params.detokenize is False
    for completion, prompt, output in zip(completions, [PROMPT, PROMPT[:2]], outputs, strict=True):
        assert len(completion.proofs) == 2  # 40 tokens in chunks of 32
        assert all(len(p) == toploc.proof_size(PROOF_TOPK) for p in completion.proofs)
        rows = reference_rows(model_dir, prompt, output)
        results = toploc.verify_proofs(rows, completion.proofs, PROOF_CHUNK, PROOF_TOPK)
        assert all(r.accepted for r in results)
        # Off by one token, the same states do not pass.
        shifted = reference_rows(model_dir, prompt + output[:1], output[1:] + output[:1])
        results = toploc.verify_proofs(shifted, completion.proofs, PROOF_CHUNK, PROOF_TOPK)
        assert not any(r.accepted for r in results)


def test_prefill_recomputes_states_and_tempered_logprobs(backend, model_dir):
    output = [60, 61, 62, 63, 64, 65]
    prefill = backend.prefill(PROMPT, output, temperature=0.7)
    torch.testing.assert_close(prefill.hidden, reference_rows(model_dir, PROMPT, output))
    expected = reference_logprobs(model_dir, PROMPT, output, 0.7)
    assert prefill.logprobs == pytest.approx(expected, abs=1e-5)
    greedy = backend.prefill(PROMPT, output, temperature=0)
    assert greedy.logprobs == pytest.approx(reference_logprobs(model_dir, PROMPT, output, 1.0))


def test_a_group_prefill_is_each_output_prefilled_alone(backend, model_dir):
    outputs = [[60, 61, 62], [63, 64, 65, 66, 67]]
    group = backend.prefill_group(PROMPT, outputs, temperature=0.7)
    for output, prefill in zip(outputs, group, strict=True):
        torch.testing.assert_close(prefill.hidden, reference_rows(model_dir, PROMPT, output))
        expected = reference_logprobs(model_dir, PROMPT, output, 0.7)
        assert prefill.logprobs == pytest.approx(expected, abs=1e-5)


def test_top_p_logprobs_come_from_the_prefill_not_the_nucleus(backend, model_dir):
    output = [70, 71, 72]
    backend._llm.scripts = [sample(output, logprob=-0.01)]
    params = SamplingParams(temperature=0.7, top_p=0.5)
    (completion,) = backend.generate([PROMPT], params, prove=False)
    expected = reference_logprobs(model_dir, PROMPT, output, 0.7)
    assert completion.logprobs == pytest.approx(expected, abs=1e-5)
    assert completion.proofs == []


def test_a_capture_missing_rows_is_an_error(backend):
    backend._llm.cached_prefix = 3
    with pytest.raises(RuntimeError, match="captured 8 final-norm rows for a 11-token prefill"):
        backend.prefill(PROMPT, [60, 61, 62, 63, 64, 65])


def test_load_weights_swaps_the_model_and_resets_the_prefix_cache(backend, newer_model_dir):
    output = [60, 61, 62, 63]
    backend.load_weights(newer_model_dir)
    assert backend.model_dir == newer_model_dir
    assert backend._llm.resets == 1
    prefill = backend.prefill(PROMPT, output)
    torch.testing.assert_close(prefill.hidden, reference_rows(newer_model_dir, PROMPT, output))


def test_load_weights_needs_safetensors(backend, tmp_path):
    with pytest.raises(ValueError, match=r"holds no model\.safetensors"):
        backend.load_weights(tmp_path)
    assert backend._llm.resets == 0
