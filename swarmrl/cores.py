"""A process's share of the machine's cores (docs/architecture.md, "Concurrency and
processes"): left at their defaults, torch and the native kernels' rayon pool each take
every core, and processes on one machine slow each other down several times."""

from __future__ import annotations

import os


def take_threads(threads: int) -> None:
    """Give this process ``threads`` threads for torch and for rayon. Call it before the
    native kernels first run: rayon reads ``RAYON_NUM_THREADS`` once, when its pool
    starts."""
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)
