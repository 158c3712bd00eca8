"""The node's journal on real files: what is added survives until its receipt is kept,
a SIGKILL at any moment loses nothing, and damaged files are skipped, not fatal."""

from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from client.node.work.journal import Journal

REPO = Path(__file__).resolve().parents[2]
ORDER = "ab" * 32


def submission(folder: Path, text: str, size: int = 1000) -> tuple[str, Path]:
    """A rollout file and its digest (here simply the sha256 of its bytes)."""
    data = (text * (size // len(text) + 1)).encode()[:size]
    path = folder / f"{hashlib.sha256(data).hexdigest()[:8]}.jsonl"
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest(), path


def test_an_added_submission_is_pending_with_its_own_copy(tmp_path):
    journal = Journal(tmp_path / "journal")
    digest, file = submission(tmp_path, "rollout one")
    header = {"step": 3, "node": "0x" + "11" * 20, "signature": "0x" + "22" * 65}
    entry = journal.add(ORDER, digest, header, file)
    original = file.read_bytes()
    file.unlink()  # the node may clean up its own file once the journal holds it

    [pending] = Journal(tmp_path / "journal").pending()  # as after a restart
    assert pending == entry
    assert (pending.order_id, pending.digest, pending.header) == (ORDER, digest, header)
    assert pending.file.read_bytes() == original
    assert pending.file.suffix == ".jsonl"
    assert journal.receipts() == []


def test_settling_keeps_the_receipt_and_drops_the_entry(tmp_path):
    journal = Journal(tmp_path / "journal")
    digests = []
    for text in ("first", "second", "third"):
        digest, file = submission(tmp_path, text)
        journal.add(ORDER, "0x" + digest.upper(), {"text": text}, file)  # normalised
        digests.append(digest)
    journal.settle(digests[1], {"submission": digests[1], "units": 8})
    journal.settle(digests[0], {"submission": digests[0], "units": 0, "reason": "stale"})

    reopened = Journal(tmp_path / "journal")
    assert [entry.digest for entry in reopened.pending()] == [digests[2]]
    assert reopened.receipts() == [
        {"submission": digests[1], "units": 8},
        {"submission": digests[0], "units": 0, "reason": "stale"},
    ]
    assert reopened.receipt(digests[0])["reason"] == "stale"
    assert reopened.receipt(digests[2]) is None


def test_adding_a_pending_digest_again_keeps_the_first_entry(tmp_path):
    journal = Journal(tmp_path / "journal")
    digest, file = submission(tmp_path, "once")
    first = journal.add(ORDER, digest, {"try": 1}, file)
    assert journal.add(ORDER, digest, {"try": 2}, file) == first
    assert journal.pending() == [first]


def test_adding_a_settled_digest_is_refused(tmp_path):
    journal = Journal(tmp_path / "journal")
    digest, file = submission(tmp_path, "done")
    journal.add(ORDER, digest, {}, file)
    journal.settle(digest, {"units": 1})
    with pytest.raises(ValueError, match="already has a receipt"):
        journal.add(ORDER, digest, {}, file)
    assert journal.pending() == []


def test_a_refused_entry_is_settled_with_its_reason_and_never_sent_again(tmp_path):
    journal = Journal(tmp_path / "journal")
    refused_digest, file = submission(tmp_path, "too late")
    entry = journal.add(ORDER, refused_digest, {"step": 3}, file)
    kept_digest, file = submission(tmp_path, "still to send")
    kept = journal.add(ORDER, kept_digest, {"step": 4}, file)

    refused = journal.refuse(entry, "work order abab is already expired")
    assert (refused.order_id, refused.digest, refused.header, refused.reason) == (
        ORDER,
        refused_digest,
        {"step": 3},
        "work order abab is already expired",
    )
    reopened = Journal(tmp_path / "journal")  # as after a restart
    assert reopened.pending() == [kept]
    assert reopened.refusals() == [refused]
    assert reopened.receipts() == []
    assert (reopened.settled(refused_digest), reopened.settled(kept_digest)) == (True, False)
    with pytest.raises(ValueError, match="was refused for good"):
        reopened.add(ORDER, refused_digest, {"step": 3}, file)
    # A SIGKILL between keeping the refusal and removing the entry: never resent.
    shutil.copytree(kept.file.parent, tmp_path / "copy")
    reopened.refuse(kept, "work order abab is already reassigned")
    shutil.copytree(tmp_path / "copy", kept.file.parent)
    assert Journal(tmp_path / "journal").pending() == []
    assert not kept.file.parent.exists()
    assert [r.digest for r in reopened.refusals()] == [refused_digest, kept_digest]


def test_node_status_shows_what_was_refused_with_its_reason(tmp_path):
    journal = Journal(tmp_path / "data" / "journal")
    digest, file = submission(tmp_path, "too late")
    journal.refuse(journal.add(ORDER, digest, {}, file), "work order abab is already expired")
    (tmp_path / "node.toml").write_text(f'data_dir = "{tmp_path / "data"}"\n')
    swarmrl = Path(sys.executable).with_name("swarmrl")
    command = [swarmrl, "node", "status", "--config", tmp_path / "node.toml"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.splitlines() == [
        f"not running (`swarmrl node run` starts it); data in {tmp_path / 'data'}",
        "receipts 0  units 0  rejected 0  refused 1  waiting to be sent 0",
        f"refused {digest[:12]} (order {ORDER[:12]}): work order abab is already expired",
    ]


def test_a_crash_between_receipt_and_removal_leaves_no_double(tmp_path):
    journal = Journal(tmp_path / "journal")
    digest, file = submission(tmp_path, "settling")
    entry = journal.add(ORDER, digest, {}, file)
    # What a SIGKILL right after the receipt was synced leaves: both on disk.
    shutil.copytree(entry.file.parent, tmp_path / "kept")
    journal.settle(digest, {"units": 4})
    shutil.copytree(tmp_path / "kept", entry.file.parent)

    reopened = Journal(tmp_path / "journal")
    assert reopened.pending() == []
    assert not entry.file.parent.exists()  # removed, so never resent
    assert reopened.receipts() == [{"units": 4}]


def test_half_built_and_half_removed_entries_are_cleared_on_open(tmp_path):
    journal = Journal(tmp_path / "journal")
    digest, file = submission(tmp_path, "whole")
    journal.add(ORDER, digest, {}, file)
    pending = tmp_path / "journal" / "pending"
    (pending / f".new-{'cd' * 32}-0000").mkdir()
    (pending / f".new-{'cd' * 32}-0000" / "submission.jsonl").write_text("torn")
    (pending / f".gone-{'ef' * 32}-0000").mkdir()
    (tmp_path / "journal" / "receipts" / f".{'ef' * 32}.json.x.tmp").write_text("{")

    reopened = Journal(tmp_path / "journal")
    assert [entry.digest for entry in reopened.pending()] == [digest]
    assert sorted(path.name for path in pending.iterdir()) == [digest]
    assert list((tmp_path / "journal" / "receipts").iterdir()) == []


def header_json(digest: str, file: str) -> str:
    record = {"order_id": ORDER, "digest": digest, "file": file, "added_at": 1, "header": {}}
    return json.dumps(record)


def damage(journal_dir: Path) -> None:
    """Every kind of file a person or another tool could leave in a journal."""
    pending, receipts = journal_dir / "pending", journal_dir / "receipts"
    garbled = pending / ("01" * 32)
    garbled.mkdir()
    (garbled / "header.json").write_bytes(b"\xff{not json")
    other = pending / ("02" * 32)
    other.mkdir()
    (other / "header.json").write_text(header_json("03" * 32, "submission"))
    missing_file = pending / ("04" * 32)
    missing_file.mkdir()
    (missing_file / "header.json").write_text(header_json("04" * 32, "submission"))
    escaping = pending / ("05" * 32)
    escaping.mkdir()
    (escaping / "header.json").write_text(header_json("05" * 32, "../../x"))
    (pending / ("06" * 32)).mkdir()  # no header at all
    (pending / ("07" * 32)).write_text("a file, not an entry")
    (pending / "notes.txt").write_text("someone's notes")
    (receipts / f"{'08' * 32}.json").write_text('{"digest": "truncated", ')
    (receipts / f"{'09' * 32}.json").write_text('["not", "a", "receipt"]')
    (receipts / "readme.json").write_text("{}")
    deep = "[" * 100_000 + "]" * 100_000
    (receipts / f"{'0a' * 32}.json").write_text(deep)


def test_damaged_files_are_reported_once_and_skipped(tmp_path, caplog):
    journal = Journal(tmp_path / "journal")
    good, file = submission(tmp_path, "good")
    journal.add(ORDER, good, {"ok": True}, file)
    settled, file = submission(tmp_path, "settled")
    journal.add(ORDER, settled, {}, file)
    journal.settle(settled, {"units": 2})
    damage(tmp_path / "journal")

    with caplog.at_level(logging.WARNING, logger="client.node.work.journal"):
        for _ in range(3):
            assert [entry.digest for entry in journal.pending()] == [good]
            assert journal.receipts() == [{"units": 2}]
    reported = [record.getMessage() for record in caplog.records]
    assert len(reported) == 11, reported  # each damaged file once, however often it is read
    assert all(message.startswith("journal: skipping ") for message in reported)
    assert journal.receipt("08" * 32) is None
    # Nothing a person may want to inspect was deleted.
    assert (tmp_path / "journal" / "pending" / "notes.txt").exists()
    assert (tmp_path / "journal" / "pending" / ("01" * 32) / "header.json").exists()


def test_a_new_entry_replaces_a_damaged_one_which_is_set_aside(tmp_path):
    journal = Journal(tmp_path / "journal")
    digest, file = submission(tmp_path, "retry")
    (tmp_path / "journal" / "pending" / digest).mkdir()  # torn by another tool
    entry = journal.add(ORDER, digest, {"n": 1}, file)
    assert journal.pending() == [entry]
    [kept] = (tmp_path / "journal" / "damaged").iterdir()
    assert kept.name.startswith(digest)


@pytest.mark.parametrize(
    ("order_id", "digest", "header", "message"),
    [
        ("xyz", "ab" * 32, {}, "order id"),
        (ORDER, "../../etc", {}, "digest"),
        (ORDER, "ab" * 31, {}, "digest"),
        (ORDER, "ab" * 32, {"when": object()}, "JSON cannot store"),
        (ORDER, "ab" * 32, {"x": float("nan")}, "JSON cannot store"),
        (ORDER, "ab" * 32, ["not", "a", "dict"], "JSON object"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_written(
    tmp_path, order_id, digest, header, message
):
    journal = Journal(tmp_path / "journal")
    _, file = submission(tmp_path, "anything")
    with pytest.raises(ValueError, match=message):
        journal.add(order_id, digest, header, file)
    assert list((tmp_path / "journal" / "pending").iterdir()) == []


def test_a_missing_submission_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        Journal(tmp_path / "journal").add(ORDER, "ab" * 32, {}, tmp_path / "gone.jsonl")


def test_a_journal_where_a_file_is_is_refused(tmp_path):
    (tmp_path / "journal").write_text("")
    with pytest.raises(ValueError, match="not a folder"):
        Journal(tmp_path / "journal")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "receipts").write_text("")
    with pytest.raises(ValueError, match="not a folder"):
        Journal(tmp_path / "other")


# The child adds and settles in a loop, printing each operation after it returned;
# every third submission stays pending, as if its reply never came.
CHILD = """
import hashlib, sys
from pathlib import Path
from client.node.work.journal import Journal

journal = Journal(Path(sys.argv[1]))
scratch = Path(sys.argv[2])
i = int(sys.argv[3])
order = "ab" * 32
while True:
    data = (f"rollout {i} " * (200 * (i % 50 + 1))).encode()
    digest = hashlib.sha256(data).hexdigest()
    file = scratch / f"rollout-{i}.jsonl"
    file.write_bytes(data)
    journal.add(order, digest, {"i": i}, file)
    print("added", digest, flush=True)
    file.unlink()
    if i % 3:
        journal.settle(digest, {"submission": digest, "i": i})
        print("settled", digest, flush=True)
    i += 1
"""


def test_sigkill_while_adding_and_settling_loses_nothing(tmp_path):
    rng = random.Random(13)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    added: set[str] = set()
    settled: set[str] = set()
    for round_ in range(20):
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                CHILD,
                str(tmp_path / "journal"),
                str(scratch),
                str(round_ * 10_000),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        for _ in range(rng.randrange(5, 40)):
            line = child.stdout.readline()
            assert line, "the child stopped before it was killed"
            kind, digest = line.split()
            (added if kind == "added" else settled).add(digest)
        child.send_signal(signal.SIGKILL)
        rest, _ = child.communicate(timeout=60)
        assert child.returncode == -signal.SIGKILL
        for line in rest.splitlines():
            kind, digest = line.split()
            (added if kind == "added" else settled).add(digest)

        journal = Journal(tmp_path / "journal")
        pending = {entry.digest: entry for entry in journal.pending()}
        receipts = {receipt["submission"] for receipt in journal.receipts()}
        assert added <= pending.keys() | receipts  # never lost
        assert settled <= receipts
        assert not pending.keys() & receipts  # never both
        for digest, entry in pending.items():
            assert hashlib.sha256(entry.file.read_bytes()).hexdigest() == digest
    # Both paths were exercised.
    assert len(settled) >= 8
    assert len(added - settled) >= 2


def test_status_asks_again_while_a_daemon_holds_the_data_dir_without_answering(
    tmp_path, monkeypatch
):
    """A daemon holds its data dir a moment before its socket answers and after it stops
    answering (starting, stopping: a test polling a stop saw the folder called busy)."""
    from client.node import cli
    from client.node.work.loop import holding_data_dir
    from swarmrl.locks import FolderBusyError

    data = tmp_path / "data"
    Journal(data / "journal")
    held = holding_data_dir(data, "swarmrl node run")
    held.__enter__()
    waits = []

    def sleep(seconds: float) -> None:  # the daemon ends while status waits
        waits.append(seconds)
        held.__exit__(None, None, None)

    # The command's own clock only: the time module's sleep is everyone's.
    monkeypatch.setattr(cli, "time", SimpleNamespace(monotonic=time.monotonic, sleep=sleep))
    running, journal = cli._status_or_journal(data)
    assert waits  # it asked again
    assert running is None
    assert journal is not None
    assert journal.receipts == 0

    with holding_data_dir(data, "swarmrl node run"):  # one that never lets go
        monkeypatch.setattr(cli, "STATUS_SETTLE_SECONDS", 0.0)
        with pytest.raises(FolderBusyError, match=r"in use by `swarmrl node run` \(pid \d+\)"):
            cli._status_or_journal(data)
