"""The integer-only activation generator of the TOPLOC interop vectors.

Regenerates, from a seed, exactly the bf16 bit patterns that the reference
(toploc 0.1.6) proved; the spec is the `generator` field of
tests/data/toploc_vectors.json (a copy of ../shared/toploc/vectors.json).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

VECTORS = Path(__file__).resolve().parent.parent / "data" / "toploc_vectors.json"

_GAMMA = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class SplitMix64:
    """splitmix64; `block(n)` draws n values at once (the states are linear)."""

    def __init__(self, seed: int) -> None:
        self.state = seed & _MASK

    def block(self, n: int) -> np.ndarray:
        steps = np.arange(1, n + 1, dtype=np.uint64)
        with np.errstate(over="ignore"):
            z = np.uint64(self.state) + steps * np.uint64(_GAMMA)
            out = _mix(z)
        self.state = (self.state + n * _GAMMA) & _MASK
        return out

    def next(self) -> int:
        return int(self.block(1)[0])


def generate(
    seed: int, rows: int, width: int, chunk: int, topk: int, forced: list[int]
) -> np.ndarray:
    rng = SplitMix64(seed)
    n = rows * width
    with np.errstate(over="ignore"):
        z = rng.block(n)
        bits = (
            ((z >> np.uint64(63)) << np.uint64(15))
            | ((np.uint64(112) + ((z >> np.uint64(40)) & np.uint64(0xF))) << np.uint64(7))
            | ((z >> np.uint64(32)) & np.uint64(0x7F))
        ).astype(np.uint16)
    for lo in range(0, n, chunk * width):
        hi = min(lo + chunk * width, n)
        forced_here = [p for p in forced if lo <= p < hi]
        wanted = min(topk + 32, hi - lo) - len(forced_here)
        positions: list[int] = []
        taken = set(forced_here)
        while len(positions) < wanted:
            pos = lo + rng.next() % (hi - lo)
            if pos not in taken:
                taken.add(pos)
                positions.append(pos)
        for j, pos in enumerate(positions + forced_here):
            magnitude = (128 << 7) + 4 * j + rng.next() % 2
            sign = rng.next() & 1
            bits[pos] = (sign << 15) | magnitude
    return bits.reshape(rows, width)


def perturb(bits: np.ndarray, seed: int) -> np.ndarray:
    """Nudges every mantissa by -1, 0 or +1, as another GPU's rounding would."""
    z = SplitMix64(seed ^ 0x5A5A5A5A).block(bits.size).reshape(bits.shape)
    d = (z & np.uint64(3)).astype(np.int32) - 1
    d[d == 2] = 0
    mant = (bits & 0x7F).astype(np.int32)
    moved = mant + d
    keep = (moved < 0) | (moved > 127)
    new_mant = np.where(keep, mant, moved).astype(np.uint16)
    return (bits & np.uint16(0xFF80)) | new_mant


@dataclass(frozen=True)
class Case:
    raw: dict

    @property
    def name(self) -> str:
        return self.raw["name"]

    def activations(self, variant: str = "identical") -> np.ndarray:
        c = self.raw
        seed = c["seed"] ^ 0xDEADBEEF if variant == "unrelated" else c["seed"]
        # The reference drew its unrelated copy without the forced positions.
        forced = [] if variant == "unrelated" else c["force_positions"]
        bits = generate(seed, c["rows"], c["width"], c["chunk"], c["topk"], forced)
        return perturb(bits, c["seed"]) if variant == "perturbed" else bits

    @property
    def proofs(self) -> list[bytes]:
        return [bytes.fromhex(h) for h in self.raw["proofs_hex"]]


def load_cases() -> list[Case]:
    return [Case(c) for c in json.loads(VECTORS.read_text())["cases"]]
