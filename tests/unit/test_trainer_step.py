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


def _loss_and_grads(model, config, **options) -> tuple[float, dict, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss, metrics = accumulate_gradients(
        model, _samples(), config, temperature=0.7, micro_batch=2, **options
    )
    return loss, metrics, _grads(model)


def _by_hand(model, temperature: float = 0.7):
    """Each completion token's logits, computed without the trainer's batching code."""
    rows = []
    for s in _samples():
        ids = torch.tensor([[*s.prompt_ids, *s.output_ids]])
        logits = model(input_ids=ids).logits[0, len(s.prompt_ids) - 1 : -1] / temperature
        rows.append((torch.log_softmax(logits, -1), torch.tensor(s.output_ids), s.advantage))
    return rows


def test_a_ratio_against_the_trainer_is_one_and_gives_the_plain_policy_gradient(policy):
    config = LossConfig(normalizer=24.0)
    _, metrics, grads = _loss_and_grads(policy, config, ratio_against="trainer")
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-7)
    assert metrics["ratio_max"] == pytest.approx(1.0, abs=1e-7)
    assert metrics["clip_fraction"] == 0.0
    # The gradient of -sum(A * logprob) / normalizer: REINFORCE at the trainer's weights.
    policy.zero_grad(set_to_none=True)
    plain = sum(-(a * logp.gather(1, out[:, None])).sum() for logp, out, a in _by_hand(policy))
    (plain / config.normalizer).backward()
    for name, grad in _grads(policy).items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-7)
    # Against the sampler (whose log-probabilities are far from the policy's) it differs.
    _, against_sampler, _ = _loss_and_grads(policy, config)
    assert abs(against_sampler["ratio_mean"] - 1.0) > 0.5


def test_a_kl_term_adds_k3_to_the_reference_and_nothing_at_the_reference(policy, model_dirs):
    base = LossConfig(normalizer=24.0)
    with_kl = LossConfig(normalizer=24.0, kl_coef=0.5)
    loss, _, grads = _loss_and_grads(policy, base)
    with pytest.raises(ValueError, match="reference model"):
        _loss_and_grads(policy, with_kl)
    # At the reference itself k3 and its gradient are zero.
    same = AutoModelForCausalLM.from_pretrained(model_dirs[0], local_files_only=True)
    loss_same, _, grads_same = _loss_and_grads(policy, with_kl, reference=same)
    assert loss_same == pytest.approx(loss, abs=1e-7)
    for name, grad in grads.items():
        torch.testing.assert_close(grads_same[name], grad, rtol=1e-4, atol=1e-7)
    # Against another model it adds exactly k3 = exp(q - p) - (q - p) - 1 per token.
    other = AutoModelForCausalLM.from_pretrained(model_dirs[1], local_files_only=True)
    loss_other, _, grads_other = _loss_and_grads(policy, with_kl, reference=other)
    with torch.no_grad():
        k3 = 0.0
        for (logp, out, _), (logq, _, _) in zip(_by_hand(policy), _by_hand(other), strict=True):
            d = logq.gather(1, out[:, None]) - logp.gather(1, out[:, None])
            k3 += float((d.exp() - d - 1).sum())
    assert k3 > 0
    assert loss_other - loss == pytest.approx(0.5 * k3 / 24.0, rel=1e-4)
    assert any(not torch.allclose(grads_other[n], g) for n, g in grads.items())
    assert all(p.grad is None for p in other.parameters())  # the reference stays frozen


def test_an_entropy_bonus_subtracts_the_sampling_distributions_entropy(policy):
    loss, _, _ = _loss_and_grads(policy, LossConfig(normalizer=24.0))
    bonus, _, _ = _loss_and_grads(policy, LossConfig(normalizer=24.0, entropy_coef=0.1))
    with torch.no_grad():
        entropy = sum(float(-(logp.exp() * logp).sum()) for logp, _, _ in _by_hand(policy))
    assert entropy > 0
    assert loss - bonus == pytest.approx(0.1 * entropy / 24.0, rel=1e-4)


def test_an_unknown_ratio_reference_is_refused(policy):
    with pytest.raises(ValueError, match="ratio_against"):
        _loss_and_grads(policy, LossConfig(normalizer=24.0), ratio_against="old")
