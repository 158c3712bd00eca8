"""The trainer's log-probabilities of rollout tokens agree with generation and validation,
and are those of the whole logits without ever holding them."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from benchmarks.trainer import (
    head_pass,
    large_vocabulary_model,
    peak_allocated,
    whole_logits_reference,
)
from orchestrator.trainer.batch import (
    TokenScorer,
    completion_logprobs,
    completion_logprobs_and_entropy,
)
from swarmrl.models.backend import SamplingParams


@pytest.fixture(scope="module")
def policy(model_dirs):
    return AutoModelForCausalLM.from_pretrained(model_dirs[0], local_files_only=True).eval()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_padded_batch_matches_prefill_row_by_row(policy, backend, temperature):
    prompts = [[5, 17, 23, 9], [40, 41], [7, 7, 7, 7, 7, 7]]
    outputs = [[11, 12, 13], [30, 31, 32, 33, 34], [2]]
    logprobs, mask = completion_logprobs(policy, prompts, outputs, temperature)
    assert logprobs.shape == mask.shape == (3, 5)
    assert mask.sum(dim=1).tolist() == [3, 5, 1]
    for b, (p, o) in enumerate(zip(prompts, outputs, strict=True)):
        expected = backend.prefill(p, o, temperature=temperature).logprobs
        assert logprobs[b, : len(o)].tolist() == pytest.approx(expected, abs=1e-5)
    assert (logprobs[~mask] == 0).all()


def test_a_sampled_completion_has_ratio_one_against_its_sampler(policy, backend):
    (completion,) = backend.generate(
        [[5, 17, 23, 9]], SamplingParams(max_tokens=12, temperature=1.0, seed=3), prove=False
    )
    logprobs, mask = completion_logprobs(
        policy, [completion.prompt_ids], [completion.output_ids], 1.0
    )
    sampler = torch.tensor([completion.logprobs])
    assert torch.exp(logprobs - sampler)[mask].tolist() == pytest.approx(
        [1.0] * len(completion.output_ids), abs=1e-4
    )


def test_gradients_reach_the_weights(policy):
    policy.zero_grad()
    logprobs, mask = completion_logprobs(policy, [[5, 6]], [[7, 8]], 1.0)
    logprobs[mask].sum().backward()
    assert policy.lm_head.weight.grad is not None
    assert policy.lm_head.weight.grad.abs().sum() > 0
    policy.zero_grad()


@pytest.mark.parametrize(
    ("prompts", "outputs"), [([], []), ([[1]], [[1], [2]]), ([[]], [[1]]), ([[1]], [[]])]
)
def test_bad_batches_are_refused(policy, prompts, outputs):
    with pytest.raises(ValueError, match=r"non-empty|must not be empty"):
        completion_logprobs(policy, prompts, outputs, 1.0)


@pytest.fixture(scope="module")
def policy64(model_dirs):
    """Float64, where a row's logits do not depend on how many rows the head's matmul
    takes at once, so chunking changes no bit of them."""
    return AutoModelForCausalLM.from_pretrained(
        model_dirs[0], local_files_only=True, dtype=torch.float64
    ).eval()


PROMPTS = [[5, 17, 23, 9], [40, 41], [7, 7, 7, 7, 7, 7]]
OUTPUTS = [[11, 12, 13], [30, 31, 32, 33, 34], [2]]


def scores_and_gradients(
    model: torch.nn.Module, score: Callable[[], tuple[Tensor, Tensor, Tensor]]
) -> tuple[Tensor, Tensor, Tensor, dict[str, Tensor]]:
    model.zero_grad(set_to_none=True)
    logprobs, mask, entropy = score()
    # Weights that differ by token, so every token's gradient counts in the check.
    weights = torch.linspace(-1.0, 1.0, mask.numel(), dtype=logprobs.dtype).reshape(mask.shape)
    ((logprobs + 0.3 * entropy) * weights).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return logprobs.detach(), mask, entropy.detach(), grads


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_tokens", [1, 3, 1000])
def test_chunks_give_the_whole_logits_scores_and_gradients(policy64, temperature, chunk_tokens):
    """Log-probabilities and entropy are bitwise the whole-logits ones. Gradients are
    equal to a few float64 ulps: the head's weight gradient sums over tokens (and,
    whole, over padding rows too) in an order that chunking changes."""
    expected = scores_and_gradients(
        policy64, lambda: whole_logits_reference(policy64, PROMPTS, OUTPUTS, temperature)
    )
    got = scores_and_gradients(
        policy64,
        lambda: completion_logprobs_and_entropy(
            policy64, PROMPTS, OUTPUTS, temperature, chunk_tokens=chunk_tokens
        ),
    )
    for name, want, have in zip(("logprobs", "mask", "entropy"), expected, got, strict=False):
        assert torch.equal(have, want), name
    assert got[3].keys() == expected[3].keys()
    assert len(got[3]) == len(list(policy64.parameters()))
    for name, grad in expected[3].items():
        torch.testing.assert_close(got[3][name], grad, rtol=1e-12, atol=1e-14, msg=name)


def test_a_scorer_and_its_model_score_alike_under_the_models_names(policy64):
    scorer = TokenScorer(policy64)
    assert list(scorer.state_dict()) == [f"lm.{name}" for name in policy64.state_dict()]
    assert scorer.lm is policy64
    with torch.no_grad():
        wrapped = completion_logprobs(scorer, PROMPTS, OUTPUTS, 0.7, chunk_tokens=2)
        bare = completion_logprobs(policy64, PROMPTS, OUTPUTS, 0.7)
    assert torch.equal(wrapped[0], bare[0])
    assert torch.equal(wrapped[1], bare[1])


def test_models_that_rescale_their_logits_are_refused(model_dirs):
    config = LlamaConfig.from_pretrained(model_dirs[0])
    config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        TokenScorer(LlamaForCausalLM(config))


def test_a_large_vocabulary_never_holds_the_whole_logits():
    """A 150k vocabulary, 2 x 128 completion tokens: the chunked forward and backward
    peak below one whole fp32 copy of the [B, W, V] logits (151 MiB), which the
    whole-logits forward and backward exceed several times over."""
    vocab, rows, prompt, completion = 150_000, 2, 4, 128
    model = large_vocabulary_model(vocab)
    tokens = torch.randint(vocab, (rows, prompt + completion)).tolist()
    prompts, outputs = [t[:prompt] for t in tokens], [t[prompt:] for t in tokens]
    whole = rows * (prompt + completion) * vocab * 4

    def chunked() -> None:
        head_pass(model, prompts, outputs, whole=False, entropy=True, chunk_tokens=16)

    def unchunked() -> None:
        head_pass(model, prompts, outputs, whole=True, entropy=True)

    # The chunked peak is a few chunks' logits (16 x 150k x 4 B = 9.6 MB each) and the
    # tied head's weight gradients (150k x 32 x 4 B = 19 MB each): about 74 MiB.
    assert peak_allocated(chunked) < whole / 1.5
    assert peak_allocated(unchunked) > 2 * whole
