"""Where the local chain's state and the deployment file live (no heavy imports)."""

from __future__ import annotations

import os
from pathlib import Path

from swarmrl.files import data_dir

DEPLOYMENT_FILE = "deployment.json"


def default_state_dir() -> Path:
    """$SWARMRL_CHAIN_DIR, else the chain folder under the XDG data home."""
    return data_dir("chain", "SWARMRL_CHAIN_DIR")


def deployment_path(explicit: Path | None = None) -> Path:
    """The deployment file a command reads: `explicit`, else $SWARMRL_DEPLOYMENT, else
    the one `swarmrl chain up` wrote. For a daemon, this is the default of its
    deployment key only: a file's key wins (settings_toml.LOCATION_KEYS)."""
    if explicit is not None:
        return explicit
    return Path(os.environ.get("SWARMRL_DEPLOYMENT") or default_state_dir() / DEPLOYMENT_FILE)
