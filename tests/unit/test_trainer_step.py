"""One optimizer step: micro-batches add up to the batch, and a broken step changes nothing."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from orchestrator.trainer.loss import LossConfig
from orchestrator.trainer.optim import build_optimizer
from orchestrator.trainer.samples import Sample
from orchestrator.trainer.step import (
    Tally,
    accumulate_gradients,
    mismatch_tally,
    train_step,
)

ASYNC_LEVEL = 2


def _samples() -> list[Sample]:
    rows = [
        ([5, 6, 7], [8, 9, 10, 2], 0.9, 0),
        ([11, 12], [13, 2], -0.4, 2),
        ([20] * 5, [21, 22], -0.5, 0),
    ]
    # Sampler log-probabilities off the policy's, so ratios differ from 1.
    return [Sample(p, o, [-2.0 - 0.3 * i for i in range(len(o))], a, age) for p, o, a, age in rows]


@pytest.fixture
def policy(model_dirs):
    return AutoModelForCausalLM.from_pretrained(model_dirs[0], local_files_only=True)


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_micro_batches_add_up_to_the_whole_batch(policy):
    config = LossConfig(normalizer=24.0)
    whole_tally = accumulate_gradients(
        policy, _samples(), config, temperature=1.0, micro_batch=3, async_level=ASYNC_LEVEL
    )
    whole = _grads(policy)
    policy.zero_grad(set_to_none=True)
    parts_tally = accumulate_gradients(
        policy, _samples(), config, temperature=1.0, micro_batch=1, async_level=ASYNC_LEVEL
    )
    parts = _grads(policy)
    assert parts_tally.loss == pytest.approx(whole_tally.loss, rel=1e-5)
    metrics_whole = whole_tally.metrics()
    assert parts_tally.metrics() == pytest.approx(metrics_whole, rel=1e-5)
    assert metrics_whole["tokens"] == 8
    assert (metrics_whole["tokens_stale0"], metrics_whole["tokens_stale2"]) == (6, 2)
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
        async_level=ASYNC_LEVEL,
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
        samples[1] = dataclasses.replace(samples[1], advantage=math.nan)
    else:
        samples[0] = dataclasses.replace(samples[0], sampler_logprobs=[math.nan] * 4)
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
        async_level=ASYNC_LEVEL,
    )
    assert not result.applied
    assert not (math.isfinite(result.loss) and math.isfinite(result.grad_norm))
    for name, p in policy.named_parameters():
        assert torch.equal(p, before[name]), name
        assert p.grad is None
    assert optimizer.state == {} or all(not s for s in optimizer.state.values())


def _loss_and_grads(model, config, **options) -> tuple[float, dict, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    tally = accumulate_gradients(
        model, _samples(), config, temperature=0.7, micro_batch=2, async_level=ASYNC_LEVEL,
        **options,
    )  # fmt: skip
    return tally.loss, tally.metrics(), _grads(model)


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


def test_tis_is_refused_against_the_sampler_and_staleness_beyond_async_level(policy):
    with pytest.raises(ValueError, match="TIS"):
        _loss_and_grads(policy, LossConfig(normalizer=24.0, tis_cap=2.0))
    with pytest.raises(ValueError, match="staleness 2"):
        accumulate_gradients(policy, _samples(), LossConfig(normalizer=24.0), temperature=1.0,
                             micro_batch=2, async_level=1)  # fmt: skip
    assert all(p.grad is None for p in policy.parameters())  # refused before any backward


# --- the mismatch between the sampler's and the trainer's log-probabilities ---------------

LN2 = math.log(2.0)


def _hand_tally() -> Tally:
    """Two sequences, trainer - sampler = [ln 2, 0] at staleness 0 and [-ln 2] (then
    padding, whose 5.0 must count for nothing) at staleness 2: ratios 2, 1 and 0.5."""
    sampler = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]])
    logprobs = sampler + torch.tensor([[LN2, 0.0], [-LN2, 5.0]])
    mask = torch.tensor([[True, True], [True, False]])
    return mismatch_tally(logprobs, sampler, mask, torch.tensor([0, 2]), buckets=3)


def test_mismatch_by_hand():
    m = _hand_tally().metrics()
    # k3 = exp(d) - d - 1: 1 - ln 2, 0 and ln 2 - 1/2; their mean is 1/6.
    assert m["mismatch_kl"] == pytest.approx(1 / 6)
    assert m["mismatch_kl_stale0"] == pytest.approx((1 - LN2) / 2)
    assert m["mismatch_kl_stale1"] == 0.0  # no tokens: 0, which tokens_stale1 explains
    assert m["mismatch_kl_stale2"] == pytest.approx(LN2 - 0.5)
    assert (m["tokens_stale0"], m["tokens_stale1"], m["tokens_stale2"]) == (2, 0, 1)
    # Ratios 2, 1, 0.5: mean 7/6, E[r^2] = 5.25/3 = 7/4, variance 7/4 - 49/36 = 14/36.
    assert m["mismatch_ratio_mean"] == pytest.approx(7 / 6)
    assert m["mismatch_ratio_std"] == pytest.approx(math.sqrt(14) / 6)
    assert (m["mismatch_ratio_min"], m["mismatch_ratio_max"]) == pytest.approx((0.5, 2.0))
    assert m["tokens"] == 3


def test_tallies_of_parts_merge_into_the_wholes():
    sampler = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]])
    logprobs = sampler + torch.tensor([[LN2, 0.0], [-LN2, 5.0]])
    mask = torch.tensor([[True, True], [True, False]])
    merged = Tally.empty(3)
    for b in range(2):
        part = mismatch_tally(logprobs[b : b + 1], sampler[b : b + 1], mask[b : b + 1],
                              torch.tensor([2 * b]), buckets=3)  # fmt: skip
        merged.add(part)
    assert merged.metrics() == pytest.approx(_hand_tally().metrics())
    # What an all-reduce hands back reads the same.
    again = merged.with_tensors(*merged.tensors(torch.device("cpu")))
    assert again.metrics() == merged.metrics()
    with pytest.raises(ValueError, match="buckets"):
        merged.add(Tally.empty(2))


def test_no_tokens_report_finite_zeros():
    m = Tally.empty(2).metrics()
    assert set(m.values()) == {0.0}
    assert {"mismatch_kl_stale0", "mismatch_kl_stale1", "tokens_stale1"} <= m.keys()
    with pytest.raises(ValueError, match="staleness"):
        mismatch_tally(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1).bool(),
                       torch.tensor([3]), buckets=3)  # fmt: skip


@pytest.mark.parametrize("ratio_against", ["sampler", "trainer"])
def test_a_step_measures_the_mismatch_against_the_sampler_whatever_the_ratio(policy, ratio_against):
    _, metrics, _ = _loss_and_grads(
        policy, LossConfig(normalizer=24.0), ratio_against=ratio_against
    )
    with torch.no_grad():
        d = {0: [], 2: []}
        for (logp, out, _), s in zip(_by_hand(policy), _samples(), strict=True):
            trainer = logp.gather(1, out[:, None])[:, 0].double()
            d[s.staleness] += (trainer - torch.tensor(s.sampler_logprobs).double()).tolist()
    k3 = {age: [math.exp(x) - x - 1 for x in xs] for age, xs in d.items()}
    assert metrics["mismatch_kl"] == pytest.approx(sum(k3[0] + k3[2]) / 8, rel=1e-5)
    assert metrics["mismatch_kl_stale0"] == pytest.approx(sum(k3[0]) / 6, rel=1e-5)
    assert metrics["mismatch_kl_stale2"] == pytest.approx(sum(k3[2]) / 2, rel=1e-5)
    assert metrics["mismatch_kl_stale1"] == 0.0
    ratios = [math.exp(x) for x in d[0] + d[2]]
    assert metrics["mismatch_ratio_max"] == pytest.approx(max(ratios), rel=1e-5)
    assert metrics["mismatch_ratio_std"] == pytest.approx(
        float(torch.tensor(ratios).std(correction=0)), rel=1e-4
    )
    if ratio_against == "sampler":  # the PPO ratio is then the mismatch's
        assert metrics["ratio_max"] == pytest.approx(metrics["mismatch_ratio_max"], rel=1e-5)


def test_tis_against_the_trainer_weighs_the_plain_policy_gradient(policy):
    """The gradient of -sum(min(exp(logp - sampler), C) * A * logp) / normalizer with
    the weight held constant: REINFORCE at the trainer's weights, each token weighed."""
    # Sampler log-probabilities alternately far below and above the policy's, so that
    # some tokens' ratios exceed the cap and others are far below 1.
    samples = [
        dataclasses.replace(
            s, sampler_logprobs=[(-9.0, -3.0)[i % 2] for i in range(len(s.output_ids))]
        )
        for s in _samples()
    ]
    config = LossConfig(normalizer=24.0, tis_cap=1.5)
    policy.zero_grad(set_to_none=True)
    tally = accumulate_gradients(policy, samples, config, temperature=0.7, micro_batch=2,
                                 async_level=ASYNC_LEVEL, ratio_against="trainer")  # fmt: skip
    grads = _grads(policy)
    policy.zero_grad(set_to_none=True)
    total = torch.zeros(())
    weights: list[float] = []
    for (logp, out, a), s in zip(_by_hand(policy), samples, strict=True):
        chosen = logp.gather(1, out[:, None])[:, 0]
        ratio = torch.exp(chosen.detach() - torch.tensor(s.sampler_logprobs))
        w = torch.clamp(ratio, max=1.5)
        weights += w.tolist()
        total = total - (w * a * chosen).sum()
    (total / config.normalizer).backward()
    # Weights up to 1.5 make the gradient larger than the other tests': float32's
    # rounding of the two summation orders too.
    for name, grad in _grads(policy).items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6)
    capped = sum(w == 1.5 for w in weights)
    assert 0 < capped < 8
    assert min(weights) < 0.5
    assert tally.metrics()["tis_fraction"] == pytest.approx(capped / 8)
