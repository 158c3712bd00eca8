"""Ledgers for fault tests: the one a daemon leaves after acknowledging submissions,
and the damage a disk fault does to it (a page overwritten with zeros), on real SQLite
files."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from orchestrator.service.ledger.home import ledger_path, open_for_daemon
from orchestrator.service.ledger.submissions import SubmissionRow

RUN = "0x" + "fa" * 32  # the run id of these ledgers' daemon


def submission(n: int) -> SubmissionRow:
    return SubmissionRow(
        digest=f"{n:064x}",
        node="0x" + "ab" * 20,
        order_id=f"{n + 1000:064x}",
        epoch=0,
        step=0,
        file=f"/data/submissions/{n}.parquet",
        file_sha256=f"{n + 2000:064x}",
        rollout_digest=f"{n + 3000:064x}",
        signature="0x" + "11" * 65,
        received_at=100.0 + n,
        receipt="r" * 1500,  # about two rows a page: the table spans pages
    )


def run_ledger(data_dir: Path, submissions: int = 1) -> Path:
    """A data dir whose daemon (of run RUN) has acknowledged ``submissions``; its ledger."""
    with open_for_daemon(data_dir, RUN) as ledger:
        for n in range(submissions):
            ledger.submissions.record(submission(n))
    return ledger_path(data_dir)


def zero_a_page_of_submissions(path: Path) -> None:
    """Overwrites with zeros a page in the middle of the submissions table (a leaf below
    its root, found from the file's own b-tree), as a disk fault would."""
    db = sqlite3.connect(path)
    page_size = db.execute("PRAGMA page_size").fetchone()[0]
    root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'submissions'").fetchone()[0]
    db.close()
    with path.open("r+b") as f:
        f.seek((root - 1) * page_size)
        page = f.read(page_size)
        assert page[0] == 0x05, "the table fits one page: nothing in the middle to damage"
        # An interior page: a 12-byte header, then a pointer to each cell, whose first
        # four bytes are the page number of a child.
        middle = 12 + 2 * (int.from_bytes(page[3:5], "big") // 2)
        cell = int.from_bytes(page[middle : middle + 2], "big")
        leaf = int.from_bytes(page[cell : cell + 4], "big")
        f.seek((leaf - 1) * page_size)
        f.write(bytes(page_size))
