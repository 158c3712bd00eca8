"""One optimizer step of GRPO on a batch of samples.

The batch is cut into micro-batches whose gradients add up: the loss divides by a
constant normalizer, not by anything the micro-batch holds, so the sum of the
micro-batch losses is the loss of the whole batch, exactly. A step whose loss or
gradient norm is not finite changes nothing: the gradients are dropped and the
caller is told, so a broken step is never written as a checkpoint.

The ratio's denominator is the sampler's log-probability by default. With
``ratio_against="trainer"`` it is the trainer's own, recomputed before the
update, as INTELLECT-2 did: with one optimizer step per batch that is the
current policy's value detached, so the ratio is exactly 1, the clip never acts
and the update is the plain policy gradient at the trainer's weights, blind to
how far the sampler's policy was from them (unless TIS reweighs it).

Whatever the denominator, every step measures that distance: the mismatch between
the sampler's and the trainer's log-probabilities of the same tokens, before the
update (``mismatch_*`` metrics), overall and by the samples' staleness. Its mean
KL rising is the early warning of an off-policy collapse.

Metrics are counted as a ``Tally`` of sums and extremes over tokens, which add up
exactly across micro-batches and, all-reduced, across ranks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from orchestrator.trainer.batch import (
    completion_logprobs,
    completion_logprobs_and_entropy,
    compute_device,
)
from orchestrator.trainer.loss import LossConfig, grpo_loss
from orchestrator.trainer.recipe import RatioAgainst
from orchestrator.trainer.samples import Sample

# grpo_loss's metrics averaged over tokens (an empty batch reports them as 0.0).
TOKEN_WEIGHTED = (
    "clip_fraction",
    "delta_fraction",
    "ratio_mean",
    "tis_fraction",
    "icepop_fraction",
)


def check_ratio_against(value: str) -> None:
    if value not in ("sampler", "trainer"):
        raise ValueError(f"ratio_against must be sampler or trainer, not {value!r}")


@dataclass(frozen=True)
class StepResult:
    """What one step did. ``applied`` is False when it was skipped as non-finite."""

    applied: bool
    loss: float
    grad_norm: float
    metrics: dict[str, float]


@dataclass
class Tally:
    """A step's loss and metrics as sums (``sums``), minima (``lows``) and maxima
    (``highs``) over its tokens: tallies of parts of a batch merge into the batch's by
    adding sums and taking extremes, exactly, and ``metrics()`` reads the step's
    metrics off them. ``Tally.empty(buckets)`` has every key, in one order, so the
    tallies of every rank line up as tensors."""

    sums: dict[str, float]
    lows: dict[str, float]
    highs: dict[str, float]

    @classmethod
    def empty(cls, buckets: int) -> Tally:
        """The tally of no tokens, with staleness buckets 0 to ``buckets`` - 1."""
        keys = ["loss", "tokens", *TOKEN_WEIGHTED, "mismatch_kl"]
        # Sums of (ratio - 1) and its square: the ratio's spread from sums that add up
        # across ranks, shifted by the ratio's expected value so that the variance
        # E[x^2] - E[x]^2 does not cancel catastrophically when the ratio hugs 1.
        keys += ["mismatch_ratio_dev", "mismatch_ratio_dev_sq"]
        for k in range(buckets):
            keys += [f"tokens_stale{k}", f"mismatch_kl_stale{k}"]
        return cls(
            sums=dict.fromkeys(keys, 0.0),
            lows={"mismatch_ratio_min": math.inf},
            highs={"ratio_max": -math.inf, "mismatch_ratio_max": -math.inf},
        )

    @property
    def buckets(self) -> int:
        return sum(key.startswith("tokens_stale") for key in self.sums)

    @property
    def loss(self) -> float:
        return self.sums["loss"]

    def add(self, other: Tally) -> None:
        """Count ``other``'s tokens in this tally (their keys must be this one's)."""
        if other.sums.keys() != self.sums.keys():
            raise ValueError("tallies of different staleness buckets do not add up")
        for key, value in other.sums.items():
            self.sums[key] += value
        for key, value in other.lows.items():
            self.lows[key] = min(self.lows[key], value)
        for key, value in other.highs.items():
            self.highs[key] = max(self.highs[key], value)

    def tensors(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The sums, lows and highs as float64 tensors, to all-reduce with SUM, MIN, MAX."""

        def as_tensor(values: dict[str, float]) -> torch.Tensor:
            return torch.tensor(list(values.values()), dtype=torch.float64, device=device)

        return as_tensor(self.sums), as_tensor(self.lows), as_tensor(self.highs)

    def with_tensors(self, sums: torch.Tensor, lows: torch.Tensor, highs: torch.Tensor) -> Tally:
        """This tally's keys with the values of ``tensors()``'s shape (e.g. all-reduced)."""
        return Tally(
            sums=dict(zip(self.sums, sums.tolist(), strict=True)),
            lows=dict(zip(self.lows, lows.tolist(), strict=True)),
            highs=dict(zip(self.highs, highs.tolist(), strict=True)),
        )

    def metrics(self) -> dict[str, float]:
        """The step's metrics. Means over no tokens, extremes of none, and the KL of a
        staleness bucket without tokens are 0.0 rather than NaN, so that every step
        writes finite numbers; ``tokens_stale<k>`` tells an empty bucket from a KL of 0."""
        s = self.sums
        tokens = s["tokens"]
        per_token = 1 / max(tokens, 1.0)
        out = {key: s[key] * per_token for key in TOKEN_WEIGHTED}
        out["ratio_max"] = self.highs["ratio_max"] if tokens else 0.0
        out["tokens"] = tokens
        dev, dev_sq = s["mismatch_ratio_dev"] * per_token, s["mismatch_ratio_dev_sq"] * per_token
        out |= {
            "mismatch_kl": s["mismatch_kl"] * per_token,
            "mismatch_ratio_mean": (1 + dev) if tokens else 0.0,
            # The population std over the step's tokens; rounding may leave the
            # variance a hair below 0 where every ratio is equal.
            "mismatch_ratio_std": math.sqrt(max(dev_sq - dev * dev, 0.0)),
            "mismatch_ratio_min": self.lows["mismatch_ratio_min"] if tokens else 0.0,
            "mismatch_ratio_max": self.highs["mismatch_ratio_max"] if tokens else 0.0,
        }
        for k in range(self.buckets):
            n = s[f"tokens_stale{k}"]
            out[f"mismatch_kl_stale{k}"] = s[f"mismatch_kl_stale{k}"] / max(n, 1.0)
            out[f"tokens_stale{k}"] = n
        return out


def mismatch_tally(
    logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    mask: torch.Tensor,
    staleness: torch.Tensor,
    buckets: int,
) -> Tally:
    """The tally of the mismatch between the trainer's ``logprobs`` [B, T] and the
    sampler's ``sampler_logprobs`` [B, T] on the tokens of ``mask`` [B, T], whose
    sequences have ``staleness`` [B] (integers in [0, ``buckets``)); its loss keys are 0.

    The KL per token is k3 = exp(d) - d - 1 with d = trainer - sampler: on tokens drawn
    from the sampler its expectation is exactly KL(sampler || trainer) (as E[exp(d)] =
    1), and unlike -d (k1) each token's value is >= 0, so its mean has a far smaller
    variance and never reads negative."""
    if staleness.shape != mask.shape[:1]:
        raise ValueError("staleness must hold one value per sequence")
    if staleness.numel() and (int(staleness.min()) < 0 or int(staleness.max()) >= buckets):
        raise ValueError(f"staleness must lie in [0, {buckets})")
    tally = Tally.empty(buckets)
    with torch.no_grad():
        # Float64: sums over a whole step, all-reduced, then differenced for the std.
        d = (logprobs.detach().double() - sampler_logprobs.detach().double())[mask]
        ratio = torch.exp(d)
        k3 = ratio - d - 1
        ages = staleness.to(mask.device).unsqueeze(1).expand_as(mask)[mask]
        by_age = torch.bincount(ages, weights=k3, minlength=buckets).tolist()
        count_by_age = torch.bincount(ages, minlength=buckets).tolist()
        s = tally.sums
        s["tokens"] = float(d.numel())
        s["mismatch_kl"] = float(k3.sum())
        s["mismatch_ratio_dev"] = float((ratio - 1).sum())
        s["mismatch_ratio_dev_sq"] = float(((ratio - 1) ** 2).sum())
        for k in range(buckets):
            s[f"tokens_stale{k}"] = float(count_by_age[k])
            s[f"mismatch_kl_stale{k}"] = float(by_age[k])
        if d.numel():
            tally.lows["mismatch_ratio_min"] = float(ratio.min())
            tally.highs["mismatch_ratio_max"] = float(ratio.max())
    return tally


def padded(rows: Sequence[Sequence[float]], width: int, device: torch.device) -> torch.Tensor:
    """Rows of different lengths as one zero-padded [len(rows), width] tensor."""
    out = torch.zeros(len(rows), width, device=device)
    for b, row in enumerate(rows):
        out[b, : len(row)] = torch.tensor(row, device=device)
    return out


def micro_batches(samples: Sequence[Sample], size: int) -> Iterable[Sequence[Sample]]:
    for start in range(0, len(samples), size):
        yield samples[start : start + size]


def check_staleness(samples: Sequence[Sample], async_level: int) -> None:
    for s in samples:
        if not 0 <= s.staleness <= async_level:
            raise ValueError(
                f"a sample of staleness {s.staleness} is outside [0, async_level={async_level}]"
            )


def check_corrections(loss_config: LossConfig, ratio_against: RatioAgainst) -> None:
    if loss_config.tis_cap > 0 and ratio_against != "trainer":
        # Against the sampler the PPO ratio is the importance weight already.
        raise ValueError("TIS (tis_cap > 0) corrects a ratio against the trainer only")


def accumulate_gradients(
    model: torch.nn.Module,
    samples: Sequence[Sample],
    loss_config: LossConfig,
    *,
    temperature: float,
    micro_batch: int,
    async_level: int,
    ratio_against: RatioAgainst = "sampler",
    reference: torch.nn.Module | None = None,
) -> Tally:
    """Backpropagate the batch's loss through ``model``, micro-batch by micro-batch;
    return the tally of its loss and metrics. Gradients are added to ``.grad``.
    ``async_level`` is the highest staleness a sample may have (the mismatch's buckets
    are 0 to it). ``reference`` is the frozen policy the KL term measures against
    (needed when ``loss_config.kl_coef`` > 0)."""
    check_ratio_against(ratio_against)
    check_corrections(loss_config, ratio_against)
    check_staleness(samples, async_level)
    if loss_config.kl_coef > 0 and reference is None:
        raise ValueError("a KL term needs a reference model")
    device = compute_device(model)
    against_trainer = ratio_against == "trainer"
    tally = Tally.empty(async_level + 1)
    for chunk in micro_batches(samples, micro_batch):
        prompts, outputs = [s.prompt_ids for s in chunk], [s.output_ids for s in chunk]
        entropy = ref_logprobs = None
        if loss_config.entropy_coef > 0:
            logprobs, mask, entropy = completion_logprobs_and_entropy(
                model, prompts, outputs, temperature
            )
        else:
            logprobs, mask = completion_logprobs(model, prompts, outputs, temperature)
        sampler = padded([s.sampler_logprobs for s in chunk], logprobs.shape[1], device)
        if loss_config.kl_coef > 0:
            assert reference is not None  # checked above
            with torch.no_grad():
                ref_logprobs, _ = completion_logprobs(reference, prompts, outputs, temperature)
        advantages = torch.tensor([s.advantage for s in chunk], device=device)
        loss, metrics = grpo_loss(
            logprobs,
            logprobs.detach() if against_trainer else sampler,
            advantages,
            mask,
            loss_config,
            sampler_logprobs=sampler if against_trainer else None,
            ref_logprobs=ref_logprobs,
            entropy=entropy,
        )
        loss.backward()
        ages = torch.tensor([s.staleness for s in chunk], device=device)
        # Always against the sampler's log-probabilities, whatever the ratio's denominator.
        part = mismatch_tally(logprobs, sampler, mask, ages, async_level + 1)
        part.sums["loss"] = float(loss.detach())
        for key in TOKEN_WEIGHTED:
            part.sums[key] = metrics[key] * part.sums["tokens"]
        if part.sums["tokens"]:
            part.highs["ratio_max"] = metrics["ratio_max"]
        tally.add(part)
    return tally


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    samples: Sequence[Sample],
    loss_config: LossConfig,
    *,
    lr: float,
    max_grad_norm: float,
    temperature: float,
    async_level: int,
    micro_batch: int = 32,
    ratio_against: RatioAgainst = "sampler",
    reference: torch.nn.Module | None = None,
) -> StepResult:
    """Compute the batch's gradient, clip its norm to ``max_grad_norm`` and take one
    AdamW step at ``lr``; or, if the loss or the gradient is not finite, take none.
    Each sample's staleness must lie in [0, ``async_level``]."""
    if not samples:
        raise ValueError("a step needs at least one sample")
    model.train()
    optimizer.zero_grad(set_to_none=True)
    tally = accumulate_gradients(
        model,
        samples,
        loss_config,
        temperature=temperature,
        micro_batch=micro_batch,
        async_level=async_level,
        ratio_against=ratio_against,
        reference=reference,
    )
    loss = tally.loss
    params = [p for p in model.parameters() if p.requires_grad]
    # The norm before clipping: what the gradient was, not what was applied.
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
    applied = math.isfinite(loss) and math.isfinite(grad_norm)
    if applied:
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    return StepResult(applied=applied, loss=loss, grad_norm=grad_norm, metrics=tally.metrics())
