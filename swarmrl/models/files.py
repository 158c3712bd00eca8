"""Where model directories live on this machine (no heavy imports)."""

from __future__ import annotations

import os
from pathlib import Path


def default_models_dir() -> Path:
    """$SWARMRL_MODELS_DIR, else the models folder under the XDG data home."""
    if env := os.environ.get("SWARMRL_MODELS_DIR"):
        return Path(env)
    data_home = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data_home) / "swarmrl" / "models"
