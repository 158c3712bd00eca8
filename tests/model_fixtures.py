"""Small models for tests: the default architecture with random weights (fast to
build, no training) saved as real HF directories."""

from __future__ import annotations

from pathlib import Path

from swarmrl.models import tiny


def random_tiny_model(out: Path, seed: int) -> Path:
    """The default architecture, randomly initialised from ``seed``, saved in ``out``."""
    model, tokenizer = tiny.build_model(seed)
    tiny.save(model, tokenizer, out)
    return out
