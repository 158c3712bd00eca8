"""How far a record may stray from the validator's recomputation before it earns
nothing, and before it is evidence worth a stake.

An honest node's numbers are never the validator's exactly: it samples in another
precision (bf16 on a GPU), another batch, another kernel, with a KV cache where
the validator prefills in one pass. Each check that compares a record with the
model's recomputation therefore measures a distance and has two thresholds:

- ``reject``: beyond it the record is rejected (no reward for it; the node's trust
  is reset, so its next submissions are all checked);
- ``evidence``: beyond it the rejection is evidence, and the node is banned and its
  stake slashed. It sits far beyond anything honest variation produced, with the
  margin recorded in the trust benchmark (``swarmrl bench trust``,
  ``docs/benchmarks/trust.md``). A check whose honest distribution comes near what
  cheats produce has no evidence threshold: it only rejects.

The distances, per record (the worst token or chunk where the check is per token):

- ``toploc``: the worst chunk's discrepancy as a fraction of TOPLOC's acceptance
  bounds (38 of 128 exponent mismatches, mantissa error mean 10, median 8); over 1
  is a chunk TOPLOC rejects; a missing or malformed proof is infinitely far.
- ``toploc_tail``: the same for a completion's last chunk when it holds fewer than
  ``TAIL_TOKENS`` tokens (what is left over after the full chunks), which is judged
  apart from the others (see ``TOPLOC_TAIL``).
- ``logprobs``: the mean absolute gap, in nats, between the log-probabilities the
  record claims and the validator's.
- ``argmax`` (temperature 0): nats the worst token lies below the argmax.
- ``nucleus`` (top-p below 1): how deep the worst token lies in the tail top-p
  cuts off: the mass of the tokens more probable than it beyond top_p, as a share
  of 1 - top_p.

And one per node, over every token of its prefilled records sampled above
temperature 0, in this submission and (weighed down) its earlier ones (each record
of the submission carries it):

- ``temperature``: how many standard deviations the validator's log-probabilities of
  the sampled tokens lie above their mean over what the claimed sampling draws (each
  token's mean and variance from the full distribution at its position). An honest
  sampler's tokens give a sum of martingale differences, about standard normal; a
  node sampling colder than it claims draws likelier tokens, and every token adds to
  its excess while the spread grows only as the square root. No per-record check can
  tell a colder token from a lucky one, and its logprobs can be the validator's own:
  only this sum sees it, and only rejects. One submission of the default model
  (about 1,240 tokens) is too short for it (half the asked temperature: z 3.6 to
  6.4), so the sums run on across a node's prefilled submissions
  (:class:`TemperatureSums`, kept in the orchestrator's ledger); a node's first
  submission is judged on its own tokens alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from swarmrl import toploc
from swarmrl.models.backend import PROOF_CHUNK, PROOF_TOPK, TokenScores


class Outcome(StrEnum):
    PASS = "pass"
    REJECT = "reject"
    EVIDENCE = "evidence"


@dataclass(frozen=True)
class Tolerance:
    """One check's thresholds on its distance (see the module's docstring)."""

    check: str
    unit: str
    reject: float
    evidence: float | None  # None: the check rejects, never slashes

    def judge(self, distance: float) -> Outcome:
        """Where a distance falls; a NaN distance is as far as can be."""
        if math.isnan(distance):
            distance = math.inf
        if self.evidence is not None and distance > self.evidence:
            return Outcome.EVIDENCE
        return Outcome.REJECT if distance > self.reject else Outcome.PASS


# TOPLOC's own bounds already sit several times beyond honest bf16 discrepancies
# (measured: worst chunks at about a quarter of them), and a chunk past them means
# states of another model, another input or no proof at all. Half the bounds, twice
# the honest worst, rejects what coarse quantisation does (int4 weights: 0.5 to 1)
# without a stake riding on a margin that small.
TOPLOC = Tolerance("toploc", "of TOPLOC's bound", reject=0.5, evidence=1.0)
# A completion's last chunk holds what is left over after its full chunks, down to one
# token, and TOPLOC's statistics over a few tokens' top 128 values scatter far wider
# (benchmarks/trust_chunks.py, honest bf16 completions of the default model verified in
# fp32, whose 128-wide states make the top 128 every value, near-zeros included): chunks
# of one token reach 2.47 of the bounds (7 of 17,636 past 1), of two to four tokens
# 0.70, of eight or more 0.46. Such a chunk is judged apart, against the bounds
# themselves, and only rejects: it costs a cheater the slash for forging at most the
# last seven tokens' states (their log-probabilities are still checked, and the
# record is still rejected), where judging it with the others would slash about one
# honest record in 80,000. A tail nothing of which matches, or whose proof is missing
# or malformed, is no rounding: it stays with the other chunks (toploc_distances).
TAIL_TOKENS = 8
TOPLOC_TAIL = Tolerance(
    "toploc_tail",
    f"of TOPLOC's bound, a last chunk under {TAIL_TOKENS} tokens",
    reject=1.0,
    evidence=None,
)
# bf16 sampling against an fp32 or bf16 prefill: mean gaps up to about 0.07 nats
# and single tokens up to about 0.5. The evidence threshold lies past the largest
# single-token gap measured, so no completion length brings an honest record to it;
# another model's log-probabilities are nats away.
LOGPROBS = Tolerance("logprobs", "nats (mean)", reject=0.25, evidence=1.5)
# A near-tie can flip under bf16 by about twice the worst single-token gap. A token
# many nats below the argmax is no tie: greedy decoding did not pick it.
ARGMAX = Tolerance("argmax", "nats below the argmax", reject=1.0, evidence=6.0)
# Nucleus boundaries move with every rounding (bf16 sampling against an fp32
# prefill: up to about a third of the tail), and a cheater's token just outside the
# nucleus is as cheap as an honest one just inside: rejection only. A token drawn
# from the whole distribution lands uniformly in the tail, so a record with a few
# such tokens almost surely has one past this.
NUCLEUS = Tolerance("nucleus", "share of the tail past top_p", reject=0.6, evidence=None)

# An honest node's z is about standard normal (also accumulated: see TemperatureSums): 6
# lies where a Gaussian goes once in 1e9 submissions, with room for what bf16 sampling
# shifts (measured in the trust benchmark, per submission and accumulated). A node
# sampling at half the asked temperature gets there in two or three default orders;
# rejection only, as a sum over whole submissions has no single token to show for it.
TEMPERATURE = Tolerance(
    "temperature", "z over a node's prefilled tokens", reject=6.0, evidence=None
)
# How much of a node's colder-sampling sums each later prefilled submission keeps: an
# effective window of a few submissions (see TemperatureSums).
TEMPERATURE_DECAY = 0.75

# A stale step claimed as current: the validator prefills a submission also with the
# newest step its node could not have claimed (``async_level`` + 1 behind the claimed
# one) and fits the claimed log-probabilities' gaps from the claimed step's to that
# older step's gaps (:class:`StaleFit`): slope 0 for an honest node, 1 for one that
# generated with the older step, one half where the claims lie as near the one step's
# as the other's. Its z is how many standard errors the slope lies past one half, not
# past 0: the validator's own rounding is in both of its prefills, so an honest slope
# lies above 0 by as much as that rounding moves log-probabilities against what the
# steps between move them, tending to one half (never past it) as the policy stops
# moving. Measured on the default model after 9 training steps, default orders of 880
# to 1,390 tokens (docs/benchmarks/trust.md): honest, slope 0.000 in fp32 and -0.055
# to 0.053 sampled in bf16 (validated in bf16 or fp32), z -69 or below (counted from 0
# instead, up to 14.7); generated with the older step, slope 0.97 to 1.04, z 69 and up;
# 9 steps behind, slope 2.2 to 2.3, z 26 to 35. On the tiny test model sampled in fp32
# and validated in bf16 an honest slope reached 0.31 (z -6, from 0: 9.9). Rejection
# only: cross-hardware noise is not measured, and a sum over a submission has no single
# token to show for it.
STALENESS = Tolerance(
    "staleness", "z of the slope toward an older step, past 1/2", reject=6.0, evidence=None
)

TOLERANCES = (TOPLOC, TOPLOC_TAIL, LOGPROBS, ARGMAX, NUCLEUS, TEMPERATURE, STALENESS)


@dataclass(frozen=True)
class StaleFit:
    """How far a submission's claimed log-probabilities ``c`` lean from the claimed step's
    ``p`` toward an older step's ``o``: the least-squares ``slope`` of c - p on o - p
    through the origin, its standard error ``se`` from the residuals (infinite when the
    fit has nothing to go on), over ``tokens`` tokens."""

    slope: float
    se: float
    tokens: int

    @property
    def z(self) -> float:
        """The ``staleness`` distance: how many standard errors the slope lies past one
        half, toward the older step (0 when there is nothing to go on)."""
        lean = self.slope - 0.5
        if math.isinf(self.se) or lean == 0:
            return 0.0
        return lean / self.se if self.se > 0 else math.copysign(math.inf, lean)


def staleness_fit(
    claimed: Sequence[float], current: Sequence[float], older: Sequence[float]
) -> StaleFit:
    """The fit of ``claimed - current`` on ``older - current``, token by token (see
    :class:`StaleFit`); tokens where any of the three is not finite are left out, and
    sums too large for a float (claims no other check passes) leave nothing to go on."""
    pairs = [
        (o - p, c - p)
        for c, p, o in zip(claimed, current, older, strict=True)
        if math.isfinite(c) and math.isfinite(p) and math.isfinite(o)
    ]
    nothing = StaleFit(0.0, math.inf, len(pairs))
    sxx = sum(x * x for x, _ in pairs)
    if len(pairs) < 2 or sxx == 0:
        return nothing
    slope = sum(x * y for x, y in pairs) / sxx
    residual = sum((y - slope * x) * (y - slope * x) for x, y in pairs) / (len(pairs) - 1)
    if not (math.isfinite(slope) and math.isfinite(residual)):
        return nothing
    return StaleFit(slope, math.sqrt(residual / sxx), len(pairs))


def toploc_distances(results: Sequence[toploc.VerifyResult], tokens: int) -> dict[str, float]:
    """The ``toploc`` distance of a completion of ``tokens`` tokens from its chunks'
    ``results`` (the worst chunk's), and ``toploc_tail``'s when its last chunk is short
    and matched at all, which is then left out of ``toploc``'s."""
    distances = [chunk_distance(r) for r in results]
    if distances and 0 < tokens % PROOF_CHUNK < TAIL_TOKENS and math.isfinite(distances[-1]):
        return {TOPLOC.check: max(distances[:-1], default=0.0), TOPLOC_TAIL.check: distances[-1]}
    return {TOPLOC.check: max(distances, default=0.0)}


def chunk_distance(r: toploc.VerifyResult) -> float:
    """One chunk's discrepancy as a fraction of TOPLOC's acceptance bounds."""
    ratio = max(
        r.exp_mismatches / toploc.max_exp_mismatches(PROOF_TOPK),
        r.mant_err_mean / toploc.MAX_MANT_ERR_MEAN,
        r.mant_err_median / toploc.MAX_MANT_ERR_MEDIAN,
    )
    # The native verdict decides at the bounds themselves (a ratio of exactly 1).
    return ratio if r.accepted else max(ratio, math.nextafter(1.0, 2.0))


@dataclass(frozen=True)
class TemperatureSums:
    """The ``temperature`` check's sums over a node's prefilled submissions, each
    earlier one weighed down by ``TEMPERATURE_DECAY`` per later one: ``excess``, the
    sampled tokens' log-probabilities above their mean under the claimed sampling;
    ``variance``, that sum's variance; ``submissions``, how many were folded in (those
    with a token drawn at random). ``z`` is excess over the square root of variance.

    Weighted sums, E' = d E + e and V' = d^2 V + v, rather than plain ones: under honest
    sampling z stays about standard normal either way (a weighted sum of independent
    martingale sums over its own standard deviation), but bf16 sampling shifts an honest
    node's tokens a little, b standard deviations per submission; plain sums would grow
    that shift as the square root of a run's length until every long-lived node crossed
    the threshold, weighted ones keep it below b * sqrt((1 + d) / (1 - d)) (2.65 b at
    d = 0.75). A node that keeps sampling colder gets the same factor on its own z per
    submission: 1.4 times after two submissions, 2.65 in the long run, so half the
    asked temperature (z 3.6 to 6.4 per default order) is past 6 within two or three.
    A node's first submission has exactly its own z.

    After a rejection the sums run on: a node that keeps sampling colder is rejected at
    every prefilled submission (its trust is reset, so all are) rather than once every
    few, while an honest node's chance rejection fades at once (one ordinary submission
    later its z is 0.6 to 0.75 of what it was).
    """

    excess: float = 0.0
    variance: float = 0.0
    submissions: int = 0

    @classmethod
    def of(cls, scores: Sequence[TokenScores]) -> TemperatureSums:
        """One submission's sums, over the scores of its records drawn at random; none
        when no token was drawn at random. A non-finite sum (a log-probability the
        validator finds impossible, which the per-record checks reject) is left out, so
        it can never hide or stain a node's later submissions."""
        excess = sum(x - m for s in scores for x, m in zip(s.logprobs, s.expected, strict=True))
        variance = sum(v for s in scores for v in s.variance)
        if not (math.isfinite(excess) and math.isfinite(variance) and variance > 0):
            return cls()
        return cls(excess, variance, 1)

    def then(self, later: TemperatureSums) -> TemperatureSums:
        """These sums followed by ``later``'s: each submission here weighs
        ``TEMPERATURE_DECAY`` less per submission in ``later``."""
        keep = TEMPERATURE_DECAY**later.submissions
        return TemperatureSums(
            keep * self.excess + later.excess,
            keep**2 * self.variance + later.variance,
            self.submissions + later.submissions,
        )

    @property
    def z(self) -> float:
        """The one-sided z of the sums: how many standard deviations the sampled tokens
        lie above what a draw as claimed scores; 0 with nothing drawn at random."""
        return self.excess / math.sqrt(self.variance) if self.variance > 0 else 0.0


# The sums of a node none of whose submissions was prefilled with a token drawn at
# random yet, and of a file judged on its own.
NO_SUMS = TemperatureSums()
