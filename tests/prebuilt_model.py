"""`make test`'s default model, built before pytest starts so that it takes no pytest
worker's minutes (the Makefile runs it pinned to one core, as a pytest worker is):

    python -m tests.prebuilt_model OUT

`default_model` in tests/conftest.py copies it into the run when it is finished and of
the current recipe, and builds its own otherwise."""

from __future__ import annotations

import sys
from pathlib import Path

from orchestrator.pretrain import build_default_model
from swarmrl.cli_options import quiet_transformers

if __name__ == "__main__":
    quiet_transformers()
    print(build_default_model(Path(sys.argv[1])))
