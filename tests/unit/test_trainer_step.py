"""One optimizer step: micro-batches add up to the batch, and a broken step changes nothing."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from orchestrator.trainer.loss import LossConfig
from orchestrator.trainer.optim import build_optimizer
from orchestrator.trainer.samples import Sample
from orchestrator.trainer.step import accumulate_gradients, train_step


def _samples() -> list[Sample]:
    rows = [([5, 6, 7], [8, 9, 10, 2], 0.9), ([11, 12], [13, 2], -0.4), ([20] * 5, [21, 22], -0.5)]
    # Sampler log-probabilities off the policy's, so ratios differ from 1.
    return [Sample(p, o, [-2.0 - 0.3 * i for i in range(len(o))], a) for p, o, a in rows]


@pytest.fixture
def policy(model_dirs):
    return AutoModelForCausalLM.from_pretrained(model_dirs[0], local_files_only=True)


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_micro_batches_add_up_to_the_whole_batch(policy):
    config = LossConfig(normalizer=24.0)
    loss_whole, metrics_whole = accumulate_gradients(
        policy, _samples(), config, temperature=1.0, micro_batch=3
    )
    whole = _grads(policy)
    policy.zero_grad(set_to_none=True)
    loss_parts, metrics_parts = accumulate_gradients(
        policy, _samples(), config, temperature=1.0, micro_batch=1
    )
    parts = _grads(policy)
    assert loss_parts == pytest.approx(loss_whole, rel=1e-5)
    assert metrics_parts == pytest.approx(metrics_whole, rel=1e-5)
    assert metrics_whole["tokens"] == 8
    for name, grad in whole.items():
        torch.testing.assert_close(parts[name], grad, rtol=1e-4, atol=1e-7)


def test_a_step_moves_the_weights_and_reports_the_norm_before_clipping(policy):
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    optimizer = build_optimizer(policy, lr=1e-3, weight_decay=0.0)
    result = train_step(
        policy,
        optimizer,
        _samples(),
        LossConfig(normalizer=24.0),
        lr=1e-3,
        max_grad_norm=1e-6,
        temperature=1.0,
    )
    assert result.applied
    assert result.grad_norm > 1e-6  # the norm it had, not the clipped one
    assert optimizer.param_groups[0]["lr"] == 1e-3
    moved = [n for n, p in policy.named_parameters() if not torch.equal(p, before[n])]
    assert moved
    assert not policy.training  # back in eval mode for whoever samples next


@pytest.mark.parametrize("bad", ["advantage", "logprob"])
def test_a_non_finite_step_changes_nothing(policy, bad):
    samples = _samples()
    if bad == "advantage":
        samples[1] = Sample(samples[1].prompt_ids, samples[1].output_ids, [-1.0, -1.0], math.nan)
    else:
        samples[0] = Sample(samples[0].prompt_ids, samples[0].output_ids, [math.nan] * 4, 1.0)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    optimizer = build_optimizer(policy, lr=1e-3, weight_decay=0.0)
    result = train_step(
        policy,
        optimizer,
        samples,
        LossConfig(normalizer=24.0),
        lr=1e-3,
        max_grad_norm=0.1,
        temperature=1.0,
    )
    assert not result.applied
    assert not (math.isfinite(result.loss) and math.isfinite(result.grad_norm))
    for name, p in policy.named_parameters():
        assert torch.equal(p, before[name]), name
        assert p.grad is None
    assert optimizer.state == {} or all(not s for s in optimizer.state.values())
