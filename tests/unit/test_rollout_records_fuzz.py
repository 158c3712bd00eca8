"""The rollout file readers on hostile input: whatever a node writes, reading it ends
in the records it sealed or in one ValueError sentence, never another exception or
a hang."""

from __future__ import annotations

import math
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.fuzz_targets import SEALED, arrow_values
from swarmrl.rollouts.records import (
    SIGNATURE_KEY,
    VERSION_KEY,
    read_rollout_file,
    read_rollouts,
    write_rollouts,
)

READERS = [read_rollouts, read_rollout_file]
# Generous: a sound read of these files takes milliseconds.
HANG_SECONDS = 30
FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


ORIGINAL = SEALED


@pytest.fixture(scope="module")
def valid_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("valid") / "rollouts.parquet"
    write_rollouts(ORIGINAL, path)
    return path


@contextmanager
def hang_guard() -> Iterator[None]:
    """Fail the example, instead of the whole run, if a read does not end."""

    def hung(signum, frame):
        raise AssertionError(f"reading the file took over {HANG_SECONDS} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, HANG_SECONDS)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def assert_refused_or_sound(path: Path) -> None:
    """Every reader either returns exactly the sealed records or raises one sentence."""
    for reader in READERS:
        with hang_guard():
            try:
                result = reader(path)
            except ValueError as e:
                message = str(e)
                assert message, f"{reader.__name__} raised an empty ValueError"
                assert "\n" not in message, f"{reader.__name__}: not one line: {message!r}"
                continue
        records = result if isinstance(result, list) else result.rollouts
        assert records == ORIGINAL, f"{reader.__name__} read records nobody sealed"


def assert_refused(path: Path) -> None:
    for reader in READERS:
        # Any sentence will do, as long as it is one: the match is on its shape.
        with hang_guard(), pytest.raises(ValueError, match=r"\A[^\n]+\Z"):
            reader(path)


def fresh(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "rollouts.parquet"


@FUZZ
@given(body=st.binary(max_size=4096), framed=st.booleans())
def test_random_bytes_are_refused(tmp_path_factory, body, framed):
    """Also framed as parquet ("PAR1" at both ends), so the reader gets past the magic
    number and into the footer."""
    path = fresh(tmp_path_factory)
    path.write_bytes(b"PAR1" + body + b"PAR1" if framed else body)
    assert_refused(path)


@FUZZ
@given(data=st.data())
def test_truncated_files_are_refused(tmp_path_factory, valid_file, data):
    raw = valid_file.read_bytes()
    keep = data.draw(st.integers(0, len(raw) - 1))
    path = fresh(tmp_path_factory)
    path.write_bytes(raw[:keep])
    assert_refused(path)


@FUZZ
@given(data=st.data())
def test_bit_flipped_files_are_refused_or_read_sound(tmp_path_factory, valid_file, data):
    raw = bytearray(valid_file.read_bytes())
    for _ in range(data.draw(st.integers(1, 16))):
        bit = data.draw(st.integers(0, len(raw) * 8 - 1))
        raw[bit // 8] ^= 1 << (bit % 8)
    path = fresh(tmp_path_factory)
    path.write_bytes(bytes(raw))
    assert_refused_or_sound(path)


def _write_rows(path: Path, schema: pa.Schema, rows: list[dict]) -> None:
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


@pytest.fixture(scope="module")
def schema(valid_file) -> pa.Schema:
    """The writer's own schema and metadata, so rows reach the record checks."""
    return pq.read_schema(valid_file)


@FUZZ
@given(data=st.data())
def test_rows_of_random_values_are_refused(tmp_path_factory, schema, data):
    rows = data.draw(
        st.lists(
            st.fixed_dictionaries({f.name: arrow_values(f) for f in schema}), min_size=1, max_size=3
        )
    )
    path = fresh(tmp_path_factory)
    _write_rows(path, schema, rows)
    assert_refused(path)


@FUZZ
@given(data=st.data())
def test_one_field_changed_is_refused(tmp_path_factory, schema, data):
    """A sealed record with one field replaced by any other value of its type."""
    rows = [r.model_dump() for r in ORIGINAL]
    field = data.draw(st.sampled_from(list(schema)))
    row = data.draw(st.integers(0, len(rows) - 1))
    value = data.draw(arrow_values(field).filter(lambda v: not _same(v, rows[row][field.name])))
    rows[row][field.name] = value
    path = fresh(tmp_path_factory)
    _write_rows(path, schema, rows)
    assert_refused(path)


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b and type(a) is type(b)


@FUZZ
@given(block=st.binary(max_size=600) | st.text(max_size=300).map(str.encode))
def test_random_signature_blocks_are_refused(tmp_path_factory, valid_file, block):
    table = pq.read_table(valid_file)
    metadata = {**table.schema.metadata, SIGNATURE_KEY: block}
    path = fresh(tmp_path_factory)
    pq.write_table(table.replace_schema_metadata(metadata), path)
    assert_refused(path)


@pytest.mark.parametrize("version", [b"", b"0", b"1.0", b"01", b"\xff", b"9" * 5000])
def test_foreign_versions_are_refused(tmp_path, valid_file, version):
    table = pq.read_table(valid_file)
    path = tmp_path / "rollouts.parquet"
    pq.write_table(table.replace_schema_metadata({VERSION_KEY: version}), path)
    assert_refused(path)
