"""`make test`'s default model, built beside the checks that come before pytest, and
beside pytest's first minutes, so that it takes no pytest worker's:

    python -m tests.prebuilt_model OUT

It trains on one thread, as a pytest worker (pinned to one core) does, so its weights
are the ones that worker would build; unpinned, it takes whichever core is free. It
holds ``building_lock(OUT)`` while it builds: `default_model` in tests/conftest.py waits
for that lock, then copies the model into the run when it is finished and of the
current recipe, and builds its own otherwise."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from filelock import FileLock


def building_lock(out: Path) -> FileLock:
    """Held by the build of ``out`` from its first moment to its last."""
    return FileLock(f"{out}.lock")


def main(out: Path) -> None:
    with building_lock(out):
        # The lock before torch's import (seconds): a test that looks meanwhile waits for
        # this build rather than finding none and building its own.
        import torch

        from orchestrator.pretrain import build_default_model
        from swarmrl.cli_options import quiet_transformers

        torch.set_num_threads(1)
        torch.set_num_interop_threads(1)
        quiet_transformers()
        # Built again whole: the recipe file names the recipe, not the sources that run it.
        shutil.rmtree(out, ignore_errors=True)
        print(build_default_model(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
