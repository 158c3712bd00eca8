"""Child processes that end with their parent.

Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``) reaches a child when the
*thread* that started it ends, not only the process: whoever asks for it starts the
child from a thread that lives as long as the child should (a main thread). Elsewhere
there is no such signal; those children see their pipes close instead.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(sig: signal.Signals = signal.SIGKILL, *, parent: int | None = None) -> None:
    """Asks for ``sig`` when the parent dies: in the child, first thing (or before exec,
    as a ``preexec_fn``). With ``parent``, the pid that started this process, a parent
    that died before the call ends this process here (exit 1); without it, that is the
    caller's to check (``os.getppid()``)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    # Orphaned before the signal was asked for: adopted by init or a subreaper, whose
    # death will never come.
    if parent is not None and os.getppid() != parent:
        os._exit(1)
