"""Sizes as a person reads them ("2.5 GiB", "2 MiB"), for the node's holds, `node doctor`
and the transfer quota's messages."""

from __future__ import annotations

import math

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


def size(count: int) -> str:
    """``count`` bytes in the largest unit that keeps it at 1 or more: GiB to a tenth,
    MiB and KiB whole. Rounded down, so a size just under a limit never reads as the
    limit itself ("0.9 GiB free, under the 1 GiB to keep free")."""
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if count >= unit:
            if unit == GiB:
                return f"{math.floor(count / GiB * 10) / 10:.1f} GiB"
            return f"{count // unit} {name}"
    return f"{max(0, count)} bytes"
