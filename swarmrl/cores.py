"""A process's share of the machine's cores (docs/architecture.md, "Concurrency and
processes"): left at their defaults, torch and the native kernels' rayon pool each take
every core, and processes on one machine slow each other down several times."""

from __future__ import annotations

import os
import sys


def take_threads(threads: int) -> None:
    """Give this process ``threads`` threads for torch and for rayon. Call it before the
    native kernels first run: rayon reads ``RAYON_NUM_THREADS`` once, when its pool
    starts. torch is not loaded for this: a process that has not loaded it gets the count
    when it does (torch reads ``OMP_NUM_THREADS`` then), and one that never runs a model
    (a node's daemon) never pays its seconds of import and 400 MiB."""
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)
