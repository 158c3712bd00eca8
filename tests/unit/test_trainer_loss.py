"""GRPO's loss, advantages and filter against values computed by hand on tiny tensors."""

from __future__ import annotations

import math

import pytest
import torch

from orchestrator.trainer.loss import LossConfig, group_advantages, grpo_loss, keeps_group


def one_token(ratio: float, advantage: float, **config):
    """The loss and its gradient for one completion token whose ratio is ``ratio``."""
    logprobs = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
    sampler = torch.zeros(1, 1, dtype=torch.float64)
    loss, metrics = grpo_loss(
        logprobs,
        sampler,
        torch.tensor([advantage], dtype=torch.float64),
        torch.tensor([[True]]),
        LossConfig(normalizer=1.0, **config),
    )
    loss.backward()
    return loss.item(), logprobs.grad.item(), metrics


@pytest.mark.parametrize(
    ("ratio", "advantage", "loss", "grad", "clipped"),
    [
        (1.1, 2.0, -2.2, -2.2, 0.0),  # inside the clip: -r*A, d/dlogp = -r*A
        (1.5, 2.0, -2.4, 0.0, 1.0),  # A > 0 above 1 + eps: clipped, no gradient
        (0.5, 2.0, -1.0, -1.0, 0.0),  # A > 0 below 1 - eps: the unclipped term is the larger
        (1.5, -1.0, 1.5, 1.5, 0.0),  # A < 0 above 1 + eps: pessimistic, unclipped
        (0.5, -1.0, 0.8, 0.0, 1.0),  # A < 0 below 1 - eps: clipped at 0.8, no gradient
        (10.0, -1.0, 4.0, 0.0, 0.0),  # A < 0 far above: the dual clip bounds r at delta
        (10.0, 2.0, -2.4, 0.0, 1.0),  # A > 0 far above: delta changes nothing
    ],
)
def test_each_side_of_the_clip(ratio, advantage, loss, grad, clipped):
    got_loss, got_grad, metrics = one_token(ratio, advantage)
    assert got_loss == pytest.approx(loss)
    assert got_grad == pytest.approx(grad, abs=1e-12)
    assert metrics["clip_fraction"] == clipped
    assert metrics["ratio_mean"] == pytest.approx(ratio)


def test_delta_acts_only_for_negative_advantages():
    for ratio in (3.0, 5.0, 50.0):
        assert one_token(ratio, 2.0, delta=4.0)[0] == one_token(ratio, 2.0, delta=1e9)[0]
    assert one_token(50.0, -1.0, delta=4.0)[0] == pytest.approx(4.0)
    assert one_token(50.0, -1.0, delta=1e9)[0] == pytest.approx(50.0)
    assert one_token(50.0, -1.0)[2]["delta_fraction"] == 1.0


def test_asymmetric_clip_bounds():
    assert one_token(1.3, 1.0, eps_high=0.28)[0] == pytest.approx(-1.28)
    assert one_token(0.7, -1.0, eps_low=0.2)[0] == pytest.approx(0.8)


def test_masked_tokens_count_for_nothing():
    logprobs = torch.tensor([[0.0, 5.0, 0.0]], requires_grad=True)
    sampler = torch.zeros(1, 3)
    mask = torch.tensor([[True, False, True]])
    loss, metrics = grpo_loss(
        logprobs, sampler, torch.tensor([1.0]), mask, LossConfig(normalizer=1)
    )
    assert loss.item() == pytest.approx(-2.0)  # two tokens of ratio 1, A = 1
    loss.backward()
    assert logprobs.grad.tolist() == [[-1.0, 0.0, -1.0]]
    assert metrics["ratio_max"] == pytest.approx(1.0)  # the masked e^5 is not counted


def test_the_normaliser_is_a_constant_not_a_token_count():
    """Dr. GRPO: a short and a long completion with the same advantage weigh per token."""
    logprobs = torch.zeros(2, 4, requires_grad=True)
    mask = torch.tensor([[True, False, False, False], [True, True, True, True]])
    loss, _ = grpo_loss(
        logprobs, torch.zeros(2, 4), torch.tensor([1.0, 1.0]), mask, LossConfig(normalizer=8)
    )
    assert loss.item() == pytest.approx(-5 / 8)
    loss.backward()
    assert logprobs.grad[0, 0] == logprobs.grad[1, 3] == pytest.approx(-1 / 8)


def test_k3_kl_against_a_reference_when_on():
    logprobs = torch.log(torch.tensor([[0.25]])).requires_grad_()
    ref = torch.log(torch.tensor([[0.5]]))
    config = LossConfig(normalizer=2.0, kl_coef=0.5)
    loss, _ = grpo_loss(
        logprobs, logprobs.detach(), torch.tensor([0.0]), torch.tensor([[True]]), config,
        ref_logprobs=ref,
    )  # fmt: skip
    k3 = 2.0 - math.log(2.0) - 1.0  # exp(ref - logp) - (ref - logp) - 1 with ref - logp = ln 2
    assert loss.item() == pytest.approx(0.5 * k3 / 2.0)
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(logprobs, logprobs, torch.tensor([0.0]), torch.tensor([[True]]), config)


def test_entropy_bonus_when_on():
    logprobs = torch.zeros(1, 2, requires_grad=True)
    entropy = torch.tensor([[2.0, 9.0]])
    config = LossConfig(normalizer=4.0, entropy_coef=0.1)
    mask = torch.tensor([[True, False]])
    loss, _ = grpo_loss(logprobs, logprobs.detach(), torch.tensor([0.0]), mask, config,
                        entropy=entropy)  # fmt: skip
    assert loss.item() == pytest.approx(-0.1 * 2.0 / 4.0)


def test_both_extras_are_off_by_default():
    config = LossConfig(normalizer=1.0)
    assert (config.kl_coef, config.entropy_coef) == (0.0, 0.0)
    assert (config.eps_low, config.eps_high, config.delta) == (0.2, 0.2, 4.0)
    assert config.tis_cap == 0.0
    assert not config.icepop


# --- corrections of the sampler/trainer mismatch: TIS and IcePop --------------------------


def against_the_trainer(ratios: list[float], advantage: float, **config):
    """The loss, gradient and metrics of one sequence trained INTELLECT-2's way (the
    ratio's denominator is the trainer's own detached), whose tokens' sampler ratios
    trainer / sampler are ``ratios``: the trainer's log-probabilities are 0, the
    sampler's -log(ratio)."""
    logprobs = torch.zeros(1, len(ratios), dtype=torch.float64, requires_grad=True)
    sampler = -torch.log(torch.tensor([ratios], dtype=torch.float64))
    loss, metrics = grpo_loss(
        logprobs,
        logprobs.detach(),
        torch.tensor([advantage], dtype=torch.float64),
        torch.ones(1, len(ratios), dtype=torch.bool),
        LossConfig(normalizer=1.0, **config),
        sampler_logprobs=sampler,
    )
    loss.backward()
    return loss.item(), logprobs.grad[0].tolist(), metrics


def test_without_tis_the_trainer_ratio_ignores_the_sampler():
    loss, grad, metrics = against_the_trainer([3.0, 0.5, 1.5], 1.0)
    assert loss == pytest.approx(-3.0)  # three tokens of PPO ratio 1, A = 1
    assert grad == pytest.approx([-1.0, -1.0, -1.0])
    assert metrics["tis_fraction"] == 0.0


@pytest.mark.parametrize(
    ("advantage", "loss", "grad"),
    [
        # weights min(3, 2) = 2, min(0.5, 2) = 0.5, min(1.5, 2) = 1.5 times -A (PPO ratio 1);
        # the weight is detached: d/dlogp = -w * A, the ratio's own derivative being 1.
        (1.0, -(2.0 + 0.5 + 1.5), [-2.0, -0.5, -1.5]),
        (-2.0, 2.0 * (2.0 + 0.5 + 1.5), [4.0, 1.0, 3.0]),
    ],
)
def test_tis_weighs_each_token_by_its_capped_sampler_ratio(advantage, loss, grad):
    got_loss, got_grad, metrics = against_the_trainer([3.0, 0.5, 1.5], advantage, tis_cap=2.0)
    assert got_loss == pytest.approx(loss)
    assert got_grad == pytest.approx(grad)
    assert metrics["tis_fraction"] == pytest.approx(1 / 3)  # only 3 is above the cap


def test_tis_needs_the_samplers_logprobs_beside_the_denominator():
    logprobs = torch.zeros(1, 1, requires_grad=True)
    with pytest.raises(ValueError, match="TIS"):
        grpo_loss(logprobs, logprobs.detach(), torch.tensor([1.0]), torch.tensor([[True]]),
                  LossConfig(normalizer=1.0, tis_cap=2.0))  # fmt: skip


def test_icepop_drops_the_tokens_whose_ratio_is_outside_its_bounds():
    # Ratio against the sampler: 0.4, 1.1, 3.0 on real tokens, and padding.
    logprobs = torch.log(torch.tensor([[0.4, 1.1, 3.0, 0.9]], dtype=torch.float64))
    logprobs.requires_grad_()
    mask = torch.tensor([[True, True, True, False]])
    a = torch.tensor([1.0], dtype=torch.float64)
    sampler = torch.zeros(1, 4, dtype=torch.float64)
    config = LossConfig(normalizer=1.0, icepop_low=0.5, icepop_high=2.0)
    loss, metrics = grpo_loss(logprobs, sampler, a, mask, config)
    loss.backward()
    # Only 1.1 lies in [0.5, 2]: -r * A inside the clip, d/dlogp = -r * A.
    assert loss.item() == pytest.approx(-1.1)
    assert logprobs.grad[0].tolist() == pytest.approx([0.0, -1.1, 0.0, 0.0])
    assert metrics["icepop_fraction"] == pytest.approx(2 / 3)  # of the real tokens
    # Off, the same tokens give max(-0.4, -0.8) - 1.1 - 1.2 (clipped at 1 + eps).
    plain, plain_metrics = grpo_loss(logprobs, sampler, a, mask, LossConfig(normalizer=1.0))
    assert plain.item() == pytest.approx(-0.4 - 1.1 - 1.2)
    assert plain_metrics["icepop_fraction"] == 0.0


def test_icepop_bounds_are_inclusive_and_either_may_be_alone():
    assert against_the_trainer([0.5, 2.0], 1.0, icepop_low=0.5, icepop_high=2.0)[0] == -2.0
    only_high = against_the_trainer([0.01, 2.5], 1.0, icepop_high=2.0)
    assert only_high[0] == pytest.approx(-1.0)
    assert only_high[2]["icepop_fraction"] == pytest.approx(0.5)
    assert against_the_trainer([0.01, 100.0], 1.0, icepop_low=0.1)[0] == pytest.approx(-1.0)


def test_icepop_reads_the_sampler_ratio_even_when_the_ppo_ratio_is_the_trainers():
    # PPO ratio 1 on both tokens; sampler ratios 0.4 (dropped) and 1.1 (kept).
    loss, grad, _ = against_the_trainer([0.4, 1.1], 1.0, icepop_low=0.5, icepop_high=2.0)
    assert loss == pytest.approx(-1.0)
    assert grad == pytest.approx([0.0, -1.0])


def test_icepop_drops_a_tokens_kl_and_entropy_terms_too():
    logprobs = torch.zeros(1, 2, requires_grad=True)
    sampler = torch.tensor([[0.0, -math.log(3.0)]])  # sampler ratios 1 and 3
    ref = torch.log(torch.tensor([[0.5, 0.5]]))  # k3 = 0.5 - ln 0.5 - 1 per token
    config = LossConfig(normalizer=4.0, kl_coef=1.0, entropy_coef=0.1, icepop_high=2.0)
    loss, _ = grpo_loss(logprobs, sampler, torch.tensor([0.0]), torch.ones(1, 2).bool(), config,
                        ref_logprobs=ref, entropy=torch.tensor([[2.0, 9.0]]))  # fmt: skip
    k3 = 0.5 + math.log(2.0) - 1.0
    assert loss.item() == pytest.approx((k3 - 0.1 * 2.0) / 4.0)


def test_tis_and_icepop_together():
    # Bounds [0.5, 2.5] drop 3.0; the cap 2 weighs 2.2 as 2 and 0.8 as 0.8.
    loss, grad, metrics = against_the_trainer(
        [3.0, 2.2, 0.8], 1.0, tis_cap=2.0, icepop_low=0.5, icepop_high=2.5
    )
    assert loss == pytest.approx(-2.8)
    assert grad == pytest.approx([0.0, -2.0, -0.8])
    assert metrics["tis_fraction"] == pytest.approx(2 / 3)
    assert metrics["icepop_fraction"] == pytest.approx(1 / 3)


def test_a_nan_ratio_makes_the_loss_nan_even_where_icepop_drops_it():
    loss, _ = grpo_loss(torch.tensor([[math.nan]]), torch.zeros(1, 1), torch.tensor([1.0]),
                        torch.tensor([[True]]),
                        LossConfig(normalizer=1.0, icepop_low=0.5, icepop_high=2.0))  # fmt: skip
    assert math.isnan(loss.item())


@pytest.mark.parametrize(
    "bad",
    [
        {"normalizer": 0.0},
        {"normalizer": 1.0, "eps_low": 1.0},
        {"normalizer": 1.0, "delta": 1.1},
        {"normalizer": 1.0, "kl_coef": -1.0},
        {"normalizer": 1.0, "tis_cap": 0.5},
        {"normalizer": 1.0, "icepop_low": 1.0},
        {"normalizer": 1.0, "icepop_low": -0.1},
        {"normalizer": 1.0, "icepop_high": 1.0},
    ],
)
def test_bad_configs_are_refused(bad):
    with pytest.raises(ValueError, match=r"\w"):
        LossConfig(**bad)


def test_the_normaliser_has_no_default():
    with pytest.raises(TypeError):
        LossConfig()  # type: ignore[call-arg]


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="one shape"):
        grpo_loss(torch.zeros(1, 2), torch.zeros(1, 3), torch.zeros(1), torch.ones(1, 2).bool(),
                  LossConfig(normalizer=1))  # fmt: skip
    with pytest.raises(ValueError, match="one value per sequence"):
        grpo_loss(torch.zeros(2, 2), torch.zeros(2, 2), torch.zeros(1), torch.ones(2, 2).bool(),
                  LossConfig(normalizer=1))  # fmt: skip


# --- advantages and the online filter -----------------------------------------------------


def test_group_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    assert group_advantages(rewards).tolist() == [0.5, -0.5, -0.5, 0.5]
    sample_std = math.sqrt(4 * 0.25 / 3)
    scaled = group_advantages(rewards, scale="std")
    assert scaled.tolist() == pytest.approx(
        [x / (sample_std + 1e-6) for x in (0.5, -0.5, -0.5, 0.5)]
    )
    tied = group_advantages(torch.tensor([0.3, 0.3]), scale="std")
    assert tied.tolist() == [0.0, 0.0]  # no division by zero
    with pytest.raises(ValueError, match="at least two"):
        group_advantages(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="scale"):
        group_advantages(rewards, scale="max")  # type: ignore[arg-type]


def test_groups_are_filtered_on_task_rewards_not_raw_rewards():
    task = torch.tensor([0.0, 0.0, 0.0])
    length_terms = torch.tensor([0.01, 0.02, 0.015])
    raw = task - length_terms
    assert (raw != raw[0]).any()  # raw rewards differ, so a filter on them would keep this
    assert not keeps_group(task)
    assert not keeps_group(torch.tensor([1.0, 1.0]))
    assert keeps_group(torch.tensor([1.0, 0.0, 1.0]))
