"""The ledger in the daemon's data dir, and what `orchestrator run` checks before it
trusts the file it finds there.

The ledger holds every submission the orchestrator acknowledged, and the nodes hold
signed receipts for them. SQLite makes a new, empty database of a missing or empty
file, so a daemon that opened whatever it found would start over without a word after
the file was deleted or truncated. So when the daemon first opens the ledger of a data
dir, it writes the ledger's genesis (when the file was created; epochs count from it)
beside it, in ``ledger.genesis``. A data dir with that mark has held a run, and the
daemon starts there only with the very ledger the mark names: not without one, not
with an empty one, not with another one made in its place.

Why a mark of its own: it is written by the one who creates the ledger and touched by
nothing else, so it outlives what happens to the ledger. The other signs of a past run
are weaker: the role mark (``.swarmrl-role``) is written before anything has run, and
checkpoints and the weight store are pruned, deleted and restored on their own.
A data dir that ran before this mark existed gets it at its next start.

The daemon also has SQLite check every page (quick_check) here, once: a damaged file
is refused before anything is written to it, instead of failing at whichever query
first reads the damaged page.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.service.ledger import Ledger
from swarmrl.files import os_error_reason, write_atomically

LEDGER_FILE = "ledger.sqlite3"
GENESIS_FILE = "ledger.genesis"


def ledger_path(data_dir: Path) -> Path:
    """Where the daemon of ``data_dir`` keeps its ledger."""
    return Path(data_dir) / LEDGER_FILE


def open_for_daemon(data_dir: Path, run: str) -> Ledger:
    """The ledger of ``data_dir``, checked whole, for the daemon of run ``run``; made new
    only where no run was held. ValueError in one sentence for a damaged ledger, and,
    where a run was held, for a missing or empty one or one that is not the run's."""
    data_dir = Path(data_dir)
    path = ledger_path(data_dir)
    mark = data_dir / GENESIS_FILE
    held = _marked_genesis(mark, path)
    if held is not None:
        gone = "missing" if not path.exists() else "empty" if _empty(path) else None
        if gone is not None:
            raise ValueError(
                f"{data_dir} has held a run, but its ledger {path} is {gone}; restore it "
                "from a backup (a new ledger would lose every submission the nodes hold "
                f"receipts for), or delete {mark} to begin a new run here"
            )
    ledger = Ledger(path, run=run, check=True)
    genesis = ledger.epochs.genesis()
    if held is None:
        write_atomically(mark, f"{genesis!r}\n".encode())
    elif genesis != held:
        ledger.close()
        raise ValueError(
            f"{path} is not the ledger of the run {data_dir} has held (its genesis is not "
            f"the one {mark} records); restore that ledger from a backup, or delete {mark} "
            "to begin a new run here"
        )
    return ledger


def _marked_genesis(mark: Path, path: Path) -> float | None:
    """The genesis ``mark`` records, None if there is no mark."""
    try:
        text = mark.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ValueError(f"cannot read {mark}: {os_error_reason(e)}") from None
    try:
        return float(text)
    except ValueError:
        raise ValueError(
            f"{mark} is damaged (it should hold the genesis of {path}); delete it, and "
            "the next start marks the ledger it finds"
        ) from None


def _empty(path: Path) -> bool:
    try:
        return path.stat().st_size == 0
    except OSError:
        return False  # a folder or unreadable: opening it says what is wrong
