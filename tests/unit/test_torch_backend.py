"""The torch backend on a real (randomly initialised) Llama: sampling, proofs,
prefill and in-place weight reloads."""

from __future__ import annotations

import json

import pytest
import torch

from swarmrl import toploc
from swarmrl.models import load_backend
from swarmrl.models.backend import SamplingParams
from swarmrl.models.directory import encode_prompt
from swarmrl.models.torch_backend import TorchBackend
from tests.model_fixtures import random_tiny_model


def prompts(backend, *texts):
    return [encode_prompt(backend.tokenizer, t) for t in texts]


GREEDY = SamplingParams(max_tokens=40, temperature=0)


def test_batched_greedy_matches_one_at_a_time_and_transformers_generate(backend):
    batch = prompts(backend, "What is 2 + 2?", "Hi", "A longer prompt, padded less.")
    together = backend.generate(batch, GREEDY)
    assert len({tuple(c.output_ids) for c in together}) == 3  # the prompts matter
    for prompt, completion in zip(batch, together, strict=True):
        alone = backend.generate([prompt], GREEDY)[0]
        assert completion.output_ids == alone.output_ids
        reference = backend.model.generate(
            torch.tensor([prompt]), max_new_tokens=len(alone.output_ids), do_sample=False
        )[0, len(prompt) :].tolist()
        assert reference == alone.output_ids


def test_proofs_verify_against_prefill_and_reject_another_model(backend, model_dirs):
    completions = backend.generate(prompts(backend, "Prove me", "And me too"), GREEDY)
    other = TorchBackend(model_dirs[1], device="cpu")
    for c in completions:
        assert len(c.proofs) == -(-len(c.output_ids) // 32)
        hidden = backend.prefill(c.prompt_ids, c.output_ids).hidden
        assert all(v.accepted for v in toploc.verify_proofs(hidden, c.proofs))
        forged = other.prefill(c.prompt_ids, c.output_ids).hidden
        assert not any(v.accepted for v in toploc.verify_proofs(forged, c.proofs))


def test_logprobs_are_the_sampling_distribution_prefill_recomputes(backend):
    params = SamplingParams(max_tokens=48, temperature=0.7, seed=5)
    for c in backend.generate(prompts(backend, "x", "yy", "zzz"), params):
        again = backend.prefill(c.prompt_ids, c.output_ids, temperature=0.7).logprobs
        assert len(again) == len(c.logprobs) == len(c.output_ids)
        assert max(abs(a - b) for a, b in zip(again, c.logprobs, strict=True)) < 1e-3
        assert all(lp <= 0 for lp in c.logprobs)


def test_seeded_sampling_repeats_and_seeds_differ(backend):
    batch = prompts(backend, "Sample", "Sample")
    one = backend.generate(batch, SamplingParams(max_tokens=32, seed=7))
    two = backend.generate(batch, SamplingParams(max_tokens=32, seed=7))
    three = backend.generate(batch, SamplingParams(max_tokens=32, seed=8))
    assert [c.output_ids for c in one] == [c.output_ids for c in two]
    assert [c.output_ids for c in one] != [c.output_ids for c in three]
    # The two rows of one batch draw different tokens.
    assert one[0].output_ids != one[1].output_ids


def test_tiny_top_p_is_greedy(backend):
    batch = prompts(backend, "nucleus")
    sampled = backend.generate(batch, SamplingParams(max_tokens=40, top_p=1e-6, seed=3))
    assert sampled[0].output_ids == backend.generate(batch, GREEDY)[0].output_ids


def test_max_tokens_and_stop_strings_end_a_completion(backend):
    batch = prompts(backend, "stop somewhere")
    full = backend.generate(batch, GREEDY)[0]
    assert full.finish_reason == "length"
    assert len(full.output_ids) == GREEDY.max_tokens
    stop = full.text[10:12]
    stopped = backend.generate(batch, SamplingParams(max_tokens=40, temperature=0, stop=(stop,)))
    assert stopped[0].finish_reason == "stop"
    assert stopped[0].text.endswith(stop)
    assert stop not in stopped[0].text[:-1]
    assert full.output_ids[: len(stopped[0].output_ids)] == stopped[0].output_ids


def test_end_of_sequence_ends_only_its_own_row(backend):
    batch = prompts(backend, "first", "second")
    greedy = backend.generate(batch, GREEDY)
    token = greedy[0].output_ids[5]
    usual = backend.eos_ids
    backend.eos_ids = usual | {token}  # make a token the model does emit an end-of-sequence token
    try:
        ended = backend.generate(batch, GREEDY)
    finally:
        backend.eos_ids = usual
    first = greedy[0].output_ids.index(token) + 1
    assert ended[0].finish_reason == "eos"
    assert ended[0].output_ids == greedy[0].output_ids[:first]
    if token not in greedy[1].output_ids:
        assert ended[1].output_ids == greedy[1].output_ids


@pytest.mark.parametrize(
    ("precision", "dtype"), [("fp32", torch.float32), ("bf16", torch.bfloat16)]
)
def test_the_backend_computes_in_the_precision_asked_for(model_dirs, precision, dtype):
    engine = load_backend("torch", model_dirs[0], device="cpu", precision=precision)
    assert {p.dtype for p in engine.model.parameters()} == {dtype}
    (completion,) = engine.generate(prompts(engine, "in precision"), GREEDY)
    assert completion.output_ids  # its decode loop runs in that dtype too


def test_load_weights_replaces_the_policy_in_place(model_dirs):
    a, b = model_dirs
    engine = TorchBackend(a, device="cpu")
    batch = prompts(engine, "reload")
    before = engine.generate(batch, GREEDY)[0].output_ids
    engine.load_weights(b)
    after = engine.generate(batch, GREEDY)[0].output_ids
    assert after == TorchBackend(b, device="cpu").generate(batch, GREEDY)[0].output_ids
    assert after != before
    engine.load_weights(a)
    assert engine.generate(batch, GREEDY)[0].output_ids == before


def test_load_weights_refuses_another_architecture_and_keeps_the_model(model_dirs, tmp_path):
    a, _ = model_dirs
    engine = TorchBackend(a, device="cpu")
    batch = prompts(engine, "keep")
    before = engine.generate(batch, GREEDY)[0].output_ids
    other = tmp_path / "wide"
    random_tiny_model(other, seed=3)
    config = json.loads((other / "config.json").read_text())
    config["hidden_size"] = 64
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="different architecture"):
        engine.load_weights(other)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text((a / "config.json").read_text())
    with pytest.raises(ValueError, match=r"no model\.safetensors"):
        engine.load_weights(empty)
    assert engine.generate(batch, GREEDY)[0].output_ids == before


def test_bad_requests_are_one_clear_error(backend):
    with pytest.raises(ValueError, match="empty"):
        backend.generate([[]], GREEDY)
    with pytest.raises(ValueError, match="positions"):
        backend.generate([[1] * 500], GREEDY)
    with pytest.raises(ValueError, match="token ids"):
        backend.prefill([1, 2], [10_000])
    with pytest.raises(ValueError, match="non-empty"):
        backend.prefill([1], [])
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)


def test_rows_that_finish_leave_the_batch_without_disturbing_the_rest(backend):
    texts = ("What is 2 + 2?", "Hi", "A longer prompt, padded less.", "x")
    batch = prompts(backend, *texts)
    full = backend.generate(batch, GREEDY)
    # A character row 0 emits that first appears at different places in the rows (or never).
    stop = next(ch for ch in full[0].text if len({c.text.find(ch) for c in full}) > 1)
    params = SamplingParams(max_tokens=40, temperature=0, stop=(stop,))
    together = backend.generate(batch, params)
    assert together[0].finish_reason == "stop"
    assert len({len(c.output_ids) for c in together}) > 1  # rows ended at different steps
    for prompt, completion in zip(batch, together, strict=True):
        alone = backend.generate([prompt], params)[0]
        assert completion.output_ids == alone.output_ids
        assert completion.finish_reason == alone.finish_reason
        assert len(completion.logprobs) == len(completion.output_ids)
        prefill = backend.prefill(completion.prompt_ids, completion.output_ids, temperature=0)
        assert all(v.accepted for v in toploc.verify_proofs(prefill.hidden, completion.proofs))
        assert (
            max(abs(a - b) for a, b in zip(prefill.logprobs, completion.logprobs, strict=True))
            < 1e-3
        )


def test_a_group_prefill_equals_prefilling_each_output_alone(backend, monkeypatch):
    prompt = prompts(backend, "One prompt, a group of samples")[0]
    params = SamplingParams(max_tokens=40, temperature=0.8, seed=3)
    outputs = [c.output_ids for c in backend.generate([prompt] * 5, params)]
    assert len({len(o) for o in outputs}) > 1  # right padding is exercised
    # A budget of two rows per pass: the prompt is recomputed for each pass.
    monkeypatch.setattr("swarmrl.models.torch_backend.PREFILL_BATCH_TOKENS", 2 * 40)
    together = backend.prefill_group(prompt, outputs, temperature=0.8, top_p=0.9)
    assert len(together) == len(outputs)
    for output, group in zip(outputs, together, strict=True):
        alone = backend.prefill(prompt, output, temperature=0.8, top_p=0.9)
        assert group.hidden.shape == alone.hidden.shape
        assert torch.allclose(group.hidden, alone.hidden, atol=1e-4)
        assert max(abs(a - b) for a, b in zip(group.logprobs, alone.logprobs, strict=True)) < 1e-4
        assert group.scores.outside == pytest.approx(alone.scores.outside, abs=1e-4)


def test_a_group_prefill_refuses_what_a_prefill_refuses(backend):
    with pytest.raises(ValueError, match="token ids"):
        backend.prefill_group([1, 2], [[3], [10_000]])
    with pytest.raises(ValueError, match="non-empty"):
        backend.prefill_group([1, 2], [[3], []])
    with pytest.raises(ValueError, match="non-empty"):
        backend.prefill_group([], [[3]])
    with pytest.raises(ValueError, match="positions"):
        backend.prefill_group([1] * 500, [[3] * 100])
