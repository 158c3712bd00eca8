"""The node's journal: submissions not yet acknowledged, and how each was settled.

Layout of the journal directory::

    pending/<digest>/header.json     order id, digest, file name, the signed header
    pending/<digest>/<file name>     a copy of the submission file
    receipts/<digest>.json           the orchestrator's signed receipt
    refused/<digest>.json            a submission the orchestrator refused for good
                                     (its order expired while the node was away, say):
                                     order id, signed header and the reason

An entry is built in a hidden folder and renamed into place, so it is either
whole or absent; it is written and synced before the submission is sent. A
receipt or a refusal is stored (synced) before its pending entry is removed, so
a SIGKILL at any point leaves the entry, its settlement, or both, never neither;
`pending()` removes an entry that is already settled. Removal renames the entry
to a hidden name first, so a half-deleted entry is never mistaken for one to
resend. A refused submission is never sent again: no resend could change the
answer, and a node that kept resending it would take no new work.

One process owns a journal at a time (the node's daemon, which locks its data
dir: `loop.sole_runner`); a `Journal` serialises its own threads.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic_core
from pydantic import BaseModel

from swarmrl.files import check_output_dir, write_atomically

log = logging.getLogger(__name__)

DIGEST = re.compile(r"[0-9a-f]{64}")
HEADER = "header.json"
# A header is a few signed fields; anything far larger was not written by us.
MAX_HEADER_BYTES = 1024 * 1024
MAX_RECEIPT_BYTES = 1024 * 1024
MAX_REFUSAL_BYTES = 2 * 1024 * 1024  # a header and a reason
HIDDEN = "."
SUFFIX = re.compile(r"\.[A-Za-z0-9]{1,16}")


@dataclass(frozen=True)
class Entry:
    """A submission waiting for its receipt; `file` is the journal's own copy."""

    order_id: str
    digest: str
    header: dict[str, Any]
    file: Path
    added_at: float  # unix seconds; resends go oldest first


@dataclass(frozen=True)
class Refused:
    """A submission the orchestrator refused for good, kept as the node's record of it."""

    order_id: str
    digest: str
    header: dict[str, Any]
    reason: str
    settled_at: float  # unix seconds


def normalise_digest(text: str, what: str = "digest") -> str:
    """64 lowercase hex digits, with or without 0x; anything else is refused (it names
    files in the journal)."""
    digest = text.lower().removeprefix("0x") if isinstance(text, str) else ""
    if not DIGEST.fullmatch(digest):
        raise ValueError(f"the submission's {what} {str(text)[:80]!r} is not 32 bytes of hex")
    return digest


def _json_bytes(value: dict[str, Any], what: str) -> bytes:
    try:
        return (json.dumps(value, sort_keys=True, allow_nan=False) + "\n").encode()
    except (TypeError, ValueError):
        raise ValueError(f"the {what} holds values JSON cannot store") from None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_json(path: Path, limit: int) -> Any:
    with path.open("rb") as f:
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise ValueError("it is too large")
    # Not json.loads: see swarmrl.shards.Manifest.from_json on nesting depth.
    return pydantic_core.from_json(raw)


class RefusedRow(BaseModel):
    digest: str
    order_id: str
    reason: str


class JournalSummary(BaseModel):
    """What `swarmrl node status` tells of the journal."""

    pending: int  # submissions waiting to be sent
    receipts: int
    receipt_digests: list[str]
    units_at_intake: int
    rejected_at_intake: int  # receipts of zero units: intake took the submission, not its work
    refused: list[RefusedRow]


class Journal:
    """Crash-safe storage of unacknowledged submissions and their receipts."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._pending = self.directory / "pending"
        self._receipts = self.directory / "receipts"
        self._refused = self.directory / "refused"
        self._lock = threading.Lock()
        self._reported: set[str] = set()
        check_output_dir(self.directory)
        for folder in (self._pending, self._receipts, self._refused):
            if folder.exists() and not folder.is_dir():
                raise ValueError(f"the journal's {folder} is not a folder")
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._remove_leftovers()

    def _remove_leftovers(self) -> None:
        """Entries half built or half removed when the node last died: the first was
        never sent, the second is already settled."""
        for folder in (self._pending, self._receipts, self._refused):
            for leftover in folder.glob(f"{HIDDEN}*"):
                if leftover.is_dir():
                    shutil.rmtree(leftover, ignore_errors=True)
                else:
                    leftover.unlink(missing_ok=True)

    def _report(self, path: Path, why: str) -> None:
        """A damaged file is logged once per journal, then left for a person to inspect."""
        key = str(path)
        if key not in self._reported:
            self._reported.add(key)
            log.warning("journal: skipping %s: %s", path, why)

    def add(self, order_id: str, digest: str, header: dict[str, Any], file: Path) -> Entry:
        """Stores a copy of `file` with `header` (JSON) before the submission is sent.

        Adding a digest already pending returns that entry unchanged (the digest covers
        the order and the file's bytes); a digest already settled is refused, see
        `settled`.
        """
        order_id = normalise_digest(order_id, "order id")
        digest = normalise_digest(digest)
        if not isinstance(header, dict):
            raise ValueError("the submission header must be a JSON object")
        added_at = time.time()
        # The caller's name could be anything, header.json included; its type is kept.
        suffix = Path(file).suffix
        copy_name = f"submission{suffix if SUFFIX.fullmatch(suffix) else ''}"
        record = _json_bytes(
            {
                "order_id": order_id,
                "digest": digest,
                "file": copy_name,
                "added_at": added_at,
                "header": header,
            },
            "submission header",
        )
        if not Path(file).is_file():
            raise ValueError(f"the submission file {file} does not exist")
        with self._lock:
            if (self._receipts / f"{digest}.json").exists():
                raise ValueError(f"submission {digest} already has a receipt")
            if (self._refused / f"{digest}.json").exists():
                raise ValueError(f"submission {digest} was refused for good")
            if (existing := self._entry(self._pending / digest)) is not None:
                return existing
            staging = self._pending / f"{HIDDEN}new-{digest}-{secrets.token_hex(4)}"
            staging.mkdir(mode=0o700)
            try:
                with open(file, "rb") as source, open(staging / copy_name, "wb") as target:
                    shutil.copyfileobj(source, target, 1 << 20)
                    target.flush()
                    os.fsync(target.fileno())
                write_atomically(staging / HEADER, record)
                _fsync_dir(staging)
                if (self._pending / digest).exists():
                    # A damaged entry under this digest: keep it for a person to
                    # inspect, out of the way of the whole one stored in its place.
                    self._set_aside(self._pending / digest)
                os.rename(staging, self._pending / digest)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            _fsync_dir(self._pending)
        # As pending() will read it back: JSON turns tuples into lists.
        stored_header = json.loads(record)["header"]
        return Entry(order_id, digest, stored_header, self._pending / digest / copy_name, added_at)

    def _hidden(self, name: str) -> Path:
        return self._pending / f"{HIDDEN}{name}-{secrets.token_hex(4)}"

    def _set_aside(self, path: Path) -> None:
        damaged = self.directory / "damaged"
        damaged.mkdir(exist_ok=True, mode=0o700)
        kept = damaged / f"{path.name}-{secrets.token_hex(4)}"
        os.rename(path, kept)
        log.warning("journal: moved the damaged entry %s to %s", path, kept)

    def _entry(self, folder: Path) -> Entry | None:
        """The entry in `folder`, or None (reported once) if it is missing or damaged."""
        header_path = folder / HEADER
        if not folder.exists():
            return None
        if not folder.is_dir():
            self._report(folder, "it is not an entry folder")
            return None
        try:
            record = _read_json(header_path, MAX_HEADER_BYTES)
        except FileNotFoundError:
            self._report(folder, "it has no header.json")
            return None
        except (OSError, ValueError) as e:
            self._report(header_path, f"it is not a readable header ({e})")
            return None
        problem = _header_problem(record, folder.name)
        if problem is None and not (folder / record["file"]).is_file():
            problem = f"its submission file {record['file']} is missing"
        if problem is not None:
            self._report(header_path, problem)
            return None
        return Entry(
            record["order_id"],
            record["digest"],
            record["header"],
            folder / record["file"],
            float(record["added_at"]),
        )

    def pending(self) -> list[Entry]:
        """Every submission still to send, oldest first; entries already settled (the
        node died while settling them) are removed instead."""
        with self._lock:
            found: list[tuple[float, Entry]] = []
            for folder in self._pending.iterdir():
                if folder.name.startswith(HIDDEN):
                    continue
                if not DIGEST.fullmatch(folder.name):
                    self._report(folder, "its name is not a submission digest")
                    continue
                if self._is_settled(folder.name):
                    self._remove(folder)
                    continue
                if (entry := self._entry(folder)) is not None:
                    found.append((entry.added_at, entry))
            return [entry for _, entry in sorted(found, key=lambda item: (item[0], item[1].digest))]

    def _remove(self, folder: Path) -> None:
        gone = self._hidden(f"gone-{folder.name}")
        os.rename(folder, gone)
        _fsync_dir(self._pending)
        shutil.rmtree(gone, ignore_errors=True)

    def settle(self, digest: str, receipt: dict[str, Any]) -> None:
        """Keeps `receipt` (synced), then drops the pending entry of `digest`."""
        digest = normalise_digest(digest)
        if not isinstance(receipt, dict):
            raise ValueError("the receipt must be a JSON object")
        record = _json_bytes(
            {"digest": digest, "settled_at": time.time(), "receipt": receipt}, "receipt"
        )
        self._keep(self._receipts, digest, record)

    def refuse(self, entry: Entry, reason: str) -> Refused:
        """Keeps `entry`'s record with the orchestrator's `reason` for refusing it for
        good (synced), then drops the entry: it is settled, never to be sent again."""
        return self.keep_refusal(entry.order_id, entry.digest, entry.header, reason)

    def keep_refusal(
        self, order_id: str, digest: str, header: dict[str, Any], reason: str
    ) -> Refused:
        """Keeps the record of a submission refused for good (synced), and drops its
        pending entry if there is one (a moved node's history has none)."""
        digest = normalise_digest(digest)
        refused = Refused(
            normalise_digest(order_id, "order id"), digest, header, reason, time.time()
        )
        record = _json_bytes(
            {
                "order_id": refused.order_id,
                "digest": digest,
                "settled_at": refused.settled_at,
                "reason": refused.reason,
                "header": refused.header,
            },
            "refusal",
        )
        self._keep(self._refused, digest, record)
        return refused

    def _keep(self, folder: Path, digest: str, record: bytes) -> None:
        """Stores how `digest` was settled in `folder` (synced), then drops its entry."""
        with self._lock:
            write_atomically(folder / f"{digest}.json", record)
            _fsync_dir(folder)
            if (self._pending / digest).exists():
                self._remove(self._pending / digest)

    def _is_settled(self, digest: str) -> bool:
        return any(
            (folder / f"{digest}.json").exists() for folder in (self._receipts, self._refused)
        )

    def settled(self, digest: str) -> bool:
        """Whether `digest` has a receipt or was refused for good: nothing to send."""
        digest = normalise_digest(digest)
        with self._lock:
            return self._is_settled(digest)

    def receipt(self, digest: str) -> dict[str, Any] | None:
        """The receipt kept for `digest`, or None if there is none (or it is damaged)."""
        path = self._receipts / f"{normalise_digest(digest)}.json"
        with self._lock:
            stored = self._stored_receipt(path)
        return None if stored is None else stored[1]

    def _stored_receipt(self, path: Path) -> tuple[float, dict[str, Any]] | None:
        try:
            record = _read_json(path, MAX_RECEIPT_BYTES)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            self._report(path, f"it is not a readable receipt ({e})")
            return None
        if (
            not isinstance(record, dict)
            or record.get("digest") != path.stem
            or not isinstance(record.get("receipt"), dict)
            or not isinstance(record.get("settled_at"), int | float)
        ):
            self._report(path, "it is not a receipt the node stored")
            return None
        return float(record["settled_at"]), record["receipt"]

    def receipts(self) -> list[dict[str, Any]]:
        """Every receipt kept, in the order they were settled."""
        with self._lock:
            found: list[tuple[float, str, dict[str, Any]]] = []
            for path in self._receipts.glob("*.json"):
                if path.name.startswith(HIDDEN):
                    continue
                if not DIGEST.fullmatch(path.stem):
                    self._report(path, "its name is not a submission digest")
                    continue
                if (stored := self._stored_receipt(path)) is not None:
                    found.append((stored[0], path.stem, stored[1]))
            return [receipt for _, _, receipt in sorted(found, key=lambda item: item[:2])]

    def summary(self) -> JournalSummary:
        receipts = self.receipts()
        return JournalSummary(
            pending=len(self.pending()),
            receipts=len(receipts),
            receipt_digests=sorted(str(r["submission"]) for r in receipts),
            units_at_intake=sum(int(r.get("units", 0)) for r in receipts),
            rejected_at_intake=sum(1 for r in receipts if not r.get("units")),
            refused=[
                RefusedRow(digest=r.digest, order_id=r.order_id, reason=r.reason)
                for r in self.refusals()
            ],
        )

    def refusals(self) -> list[Refused]:
        """Every submission refused for good, in the order they were settled."""
        with self._lock:
            found: list[Refused] = []
            for path in self._refused.glob("*.json"):
                if path.name.startswith(HIDDEN):
                    continue
                if not DIGEST.fullmatch(path.stem):
                    self._report(path, "its name is not a submission digest")
                    continue
                if (refused := self._stored_refusal(path)) is not None:
                    found.append(refused)
            return sorted(found, key=lambda r: (r.settled_at, r.digest))

    def _stored_refusal(self, path: Path) -> Refused | None:
        try:
            record = _read_json(path, MAX_REFUSAL_BYTES)
        except (OSError, ValueError) as e:
            self._report(path, f"it is not a readable refusal ({e})")
            return None
        if (
            not isinstance(record, dict)
            or record.get("digest") != path.stem
            or not isinstance(record.get("order_id"), str)
            or not DIGEST.fullmatch(record["order_id"])
            or not isinstance(record.get("header"), dict)
            or not isinstance(record.get("reason"), str)
            or not isinstance(record.get("settled_at"), int | float)
        ):
            self._report(path, "it is not a refusal the node stored")
            return None
        return Refused(
            record["order_id"],
            path.stem,
            record["header"],
            record["reason"],
            float(record["settled_at"]),
        )


def _header_problem(record: Any, digest: str) -> str | None:
    """Why `record` is not a header this journal wrote for `digest`, or None."""
    if not isinstance(record, dict):
        return "its header is not a JSON object"
    if record.get("digest") != digest:
        return "its header names another digest"
    if not isinstance(record.get("order_id"), str) or not DIGEST.fullmatch(record["order_id"]):
        return "its header has no valid order id"
    name = record.get("file")
    if not isinstance(name, str) or name in ("", ".", "..", HEADER) or "/" in name or "\0" in name:
        return "its header names no valid submission file"
    if not isinstance(record.get("added_at"), int | float):
        return "its header has no time it was added"
    if not isinstance(record.get("header"), dict):
        return "its header has no signed fields"
    return None
