"""The rollout record: one completion of one task, with everything to check it.

A record carries a copy of its task (prompt and verification info) for the
node's and the trainer's convenience; a validator takes the task from its own
task set and rejects a record whose copy differs. Its ``digest`` is the keccak
of the canonical JSON of every other field; the node signs the digest of a whole
file (``file_digest``), which commits to every record in order, and the
signature travels in the file's metadata (``swarmrl.rollouts.signing``).

Files are parquet with the schema version in the file metadata. Readers accept
only the versions they know, and check every record's digest, so a file that
was altered after it was written is refused as a whole.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from eth_utils import keccak
from pydantic import Field, ValidationError

from swarmrl.files import check_input_file, replacing
from swarmrl.rollouts.signing import FileSignature
from swarmrl.schema import MAX_UINT64, HexAddress, Strict
from swarmrl.tasks import MAX_PROMPT_CHARS, Task, TaskType, first_error

SCHEMA_VERSION: Final = 1
VERSION_KEY = b"swarmrl.rollouts.version"
SIGNATURE_KEY = b"swarmrl.rollouts.signature"
# A signature block is a few hundred bytes; anything far larger is not one.
_MAX_SIGNATURE_BYTES = 4096

# Bounds on what one untrusted record may make a validator hold or compute.
MAX_TOKENS = 1 << 17
MAX_PROOFS = MAX_TOKENS // 32 + 1


class Rollout(Strict):
    """One proven, scored completion."""

    version: Literal[1] = SCHEMA_VERSION
    run: str = Field(min_length=1, max_length=128)
    policy_step: int = Field(ge=0, le=MAX_UINT64)
    node: HexAddress
    problem_id: str = Field(min_length=1, max_length=256)
    task_type: TaskType
    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    verification_info: str  # canonical JSON, as in task files
    seed: int = Field(ge=0, le=MAX_UINT64)
    sample: int = Field(ge=0, le=1 << 20)
    temperature: float = Field(ge=0.0, le=100.0)
    top_p: float = Field(gt=0.0, le=1.0)
    max_tokens: int = Field(ge=1, le=MAX_TOKENS)
    target_len: int = Field(ge=1, le=MAX_TOKENS)
    prompt_ids: list[int] = Field(min_length=1, max_length=MAX_TOKENS)
    output_ids: list[int] = Field(min_length=1, max_length=MAX_TOKENS)
    logprobs: list[float] = Field(max_length=MAX_TOKENS)
    finish_reason: Literal["eos", "stop", "length"]
    task_reward: float
    length_penalty: float
    reward: float
    proofs: list[bytes] = Field(max_length=MAX_PROOFS)
    digest: bytes = Field(default=b"", max_length=32)

    def content_digest(self) -> bytes:
        """keccak256 of the canonical JSON of every field but the digest."""
        fields = self.model_dump(exclude={"digest"})
        fields["proofs"] = [p.hex() for p in self.proofs]
        return keccak(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode())

    def task(self) -> Task:
        """The task this record carries, as its verifier needs it."""
        return Task.from_row(
            {
                "problem_id": self.problem_id,
                "task_type": self.task_type,
                "prompt": self.prompt,
                "verification_info": self.verification_info,
            }
        )

    def sealed(self) -> Rollout:
        """This record with its digest filled in."""
        return self.model_copy(update={"digest": self.content_digest()})


def file_digest(rollouts: Sequence[Rollout]) -> bytes:
    """What a node signs for a file: keccak256 of its records' digests, in order."""
    return keccak(b"".join(r.digest for r in rollouts))


@dataclass(frozen=True)
class RolloutFile:
    """A rollout file's records, and the node's signature when it signed the file."""

    rollouts: list[Rollout]
    signature: FileSignature | None


def _arrow_schema(signature: FileSignature | None) -> Any:
    import pyarrow as pa

    ints = pa.list_(pa.int64())
    return pa.schema(
        [
            ("version", pa.int64()),
            ("run", pa.string()),
            ("policy_step", pa.uint64()),
            ("node", pa.string()),
            ("problem_id", pa.string()),
            ("task_type", pa.string()),
            ("prompt", pa.string()),
            ("verification_info", pa.string()),
            ("seed", pa.uint64()),
            ("sample", pa.int64()),
            ("temperature", pa.float64()),
            ("top_p", pa.float64()),
            ("max_tokens", pa.int64()),
            ("target_len", pa.int64()),
            ("prompt_ids", ints),
            ("output_ids", ints),
            ("logprobs", pa.list_(pa.float64())),
            ("finish_reason", pa.string()),
            ("task_reward", pa.float64()),
            ("length_penalty", pa.float64()),
            ("reward", pa.float64()),
            ("proofs", pa.list_(pa.binary())),
            ("digest", pa.binary(32)),
        ],
        metadata={
            VERSION_KEY: str(SCHEMA_VERSION).encode(),
            **({SIGNATURE_KEY: signature.model_dump_json().encode()} if signature else {}),
        },
    )


def write_rollouts(
    rollouts: Sequence[Rollout], path: Path, signature: FileSignature | None = None
) -> None:
    """Write sealed records as parquet, with the node's signature if given, replacing
    ``path`` atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    for i, r in enumerate(rollouts):
        if r.digest != r.content_digest():
            raise ValueError(f"record {i} ({r.problem_id}) is not sealed with its digest")
    table = pa.Table.from_pylist(
        [r.model_dump() for r in rollouts], schema=_arrow_schema(signature)
    )
    with replacing(path) as tmp:
        pq.write_table(table, tmp)


def read_rollouts(path: Path, name: str | None = None) -> list[Rollout]:
    """Every record of a rollout file; ValueError in one sentence if any is not sound
    (see `read_rollout_file` for `name`)."""
    return read_rollout_file(path, name).rollouts


def _signature(shown: str, raw: bytes | None) -> FileSignature | None:
    if raw is None:
        return None
    if len(raw) > _MAX_SIGNATURE_BYTES:
        raise ValueError(f"{shown} has a signature block of {len(raw)} bytes, not a signature")
    try:
        return FileSignature.model_validate_json(raw)
    except ValidationError as e:
        raise ValueError(f"{shown} has a malformed signature block ({first_error(e)})") from None


def read_rollout_file(path: Path, name: str | None = None) -> RolloutFile:
    """A rollout file's records and signature; ValueError in one sentence if any part
    is not sound. The sentence calls the file `name` where given, else by its path: a
    reader whose sentences leave the machine (a rejection goes back to the node that
    sent the file) names it without the path it has here."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    shown = str(path) if name is None else name
    try:
        check_input_file(path)
    except ValueError:
        if name is None:
            raise
        raise ValueError(f"{name} is missing or cannot be opened") from None
    try:
        parquet = pq.ParquetFile(path)
        metadata = parquet.schema_arrow.metadata or {}
        version = metadata.get(VERSION_KEY)
        if version != str(SCHEMA_VERSION).encode():
            found = version.decode(errors="replace") if version else "none"
            raise ValueError(
                f"{shown} is rollout schema version {found}; this swarmrl reads "
                f"version {SCHEMA_VERSION}"
            )
        signature = _signature(shown, metadata.get(SIGNATURE_KEY))
        rows = parquet.read().to_pylist()
    except (pa.ArrowException, OSError):
        # pyarrow reports corrupt bytes as OSError too (the file itself exists), in its
        # own words over several lines: what matters is that the file is damaged.
        raise ValueError(
            f"{shown} is not a readable rollout file (damaged, or not parquet)"
        ) from None
    rollouts = []
    for i, row in enumerate(rows):
        try:
            rollout = Rollout(**row)
        except (ValidationError, TypeError) as e:
            raise ValueError(f"{shown}: record {i}: {first_error(e)}") from None
        if rollout.digest != rollout.content_digest():
            raise ValueError(f"{shown}: record {i} does not match its digest (altered?)")
        rollouts.append(rollout)
    return RolloutFile(rollouts, signature)
