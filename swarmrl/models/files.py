"""Where model directories live on this machine (no heavy imports)."""

from __future__ import annotations

from pathlib import Path

from swarmrl.files import data_dir


def default_models_dir() -> Path:
    """$SWARMRL_MODELS_DIR, else the models folder under the XDG data home."""
    return data_dir("models", "SWARMRL_MODELS_DIR")
