"""`make test`'s default model, built before pytest starts so that it takes no pytest
worker's minutes:

    python -m tests.prebuilt_model OUT

It trains on one thread, as a pytest worker (pinned to one core) does, so its weights
are the ones that worker would build; unpinned, it takes whichever core is free while
the other checks run. `default_model` in tests/conftest.py copies it into the run when
it is finished and of the current recipe, and builds its own otherwise."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from orchestrator.pretrain import build_default_model
from swarmrl.cli_options import quiet_transformers

if __name__ == "__main__":
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    quiet_transformers()
    print(build_default_model(Path(sys.argv[1])))
