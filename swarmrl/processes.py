"""Child processes that end with their parent.

Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``) reaches a child when the
*thread* that started it ends, not only the process: whoever asks for it starts the
child from a thread that lives as long as the child should (a main thread). Elsewhere
there is no such signal; those children see their pipes close instead.
"""

from __future__ import annotations

import ctypes
import signal
import sys

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(sig: signal.Signals = signal.SIGKILL) -> None:
    """Asks for ``sig`` when the parent dies: in the child, first thing (or before exec,
    as a ``preexec_fn``). Whether the parent died before the call is the caller's to
    check (``os.getppid()``)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
