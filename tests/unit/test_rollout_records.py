"""Rollout records: the versioned parquet schema and its digests."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmrl.rollouts.records import (
    SCHEMA_VERSION,
    VERSION_KEY,
    Rollout,
    file_digest,
    read_rollouts,
    write_rollouts,
)


def record(**changes):
    fields = {
        "run": "demo",
        "policy_step": 3,
        "node": "0x" + "ab" * 20,
        "problem_id": "arith-0-1",
        "task_type": "math",
        "prompt": "What is 2 + 2?",
        "verification_info": '{"ground_truth":"4"}',
        "seed": 2**63 + 5,
        "sample": 1,
        "temperature": 1.0,
        "top_p": 1.0,
        "max_tokens": 64,
        "target_len": 32,
        "prompt_ids": [1, 2, 3],
        "output_ids": [4, 5],
        "logprobs": [-0.25, -1.5],
        "finish_reason": "eos",
        "task_reward": 1.0,
        "length_penalty": 0.009,
        "reward": 0.991,
        "proofs": [b"\x00\x01" * 129],
    }
    return Rollout(**{**fields, **changes}).sealed()


def test_round_trip_keeps_every_field_and_digest(tmp_path):
    records = [record(), record(sample=2, output_ids=[7], logprobs=[-0.1], proofs=[])]
    path = tmp_path / "r.parquet"
    write_rollouts(records, path)
    again = read_rollouts(path)
    assert again == records
    assert file_digest(again) == file_digest(records)
    assert pq.read_schema(path).metadata[VERSION_KEY] == str(SCHEMA_VERSION).encode()


def test_digest_covers_every_field():
    base = record()
    for change in (
        {"reward": 0.5},
        {"output_ids": [4, 6]},
        {"proofs": [b"\x00\x02" * 129]},
        {"node": "0x" + "ac" * 20},
        {"policy_step": 4},
        {"verification_info": '{"ground_truth":"5"}'},
    ):
        assert record(**change).digest != base.digest
    assert file_digest([base, record(sample=2)]) != file_digest([record(sample=2), base])


def rewrite(path, column, values):
    table = pq.read_table(path)
    index = table.schema.get_field_index(column)
    table = table.set_column(index, table.schema.field(index), pa.array(values, table[column].type))
    pq.write_table(table, path)


def test_a_record_altered_in_the_file_is_refused(tmp_path):
    path = tmp_path / "r.parquet"
    write_rollouts([record(), record(sample=2)], path)
    rewrite(path, "task_reward", [1.0, 0.0 + 1.0])
    read_rollouts(path)  # same values: still sound
    rewrite(path, "reward", [0.991, 5.0])
    with pytest.raises(ValueError, match="record 1 does not match its digest"):
        read_rollouts(path)


def test_unknown_versions_and_foreign_files_are_one_clear_error(tmp_path):
    path = tmp_path / "r.parquet"
    write_rollouts([record()], path)
    table = pq.read_table(path)
    pq.write_table(table.replace_schema_metadata({VERSION_KEY: b"2"}), path)
    with pytest.raises(ValueError, match="schema version 2; this swarmrl reads version 1"):
        read_rollouts(path)
    pq.write_table(pa.table({"x": [1]}), path)
    with pytest.raises(ValueError, match="version none"):
        read_rollouts(path)
    path.write_bytes(b"PAR1 not really")
    with pytest.raises(ValueError, match="not a readable rollout file"):
        read_rollouts(path)
    with pytest.raises(ValueError, match="does not exist"):
        read_rollouts(tmp_path / "missing.parquet")


def test_a_named_file_s_errors_carry_its_name_and_never_its_path(tmp_path):
    """What intake and the validator tell a node of its file names no path of theirs."""
    path = tmp_path / "incoming" / "upload-x.part"
    path.parent.mkdir()
    faults = {
        "schema version 2": lambda: pq.write_table(
            pq.read_table(path).replace_schema_metadata({VERSION_KEY: b"2"}), path
        ),
        "record 0: finish_reason": lambda: rewrite(path, "finish_reason", ["exploded"]),
        "record 0 does not match its digest": lambda: rewrite(path, "reward", [5.0]),
        "is not a readable rollout file": lambda: path.write_bytes(b"PAR1 not really"),
        "is missing or cannot be opened": path.unlink,
    }
    for words, fault in faults.items():
        write_rollouts([record()], path)
        fault()
        with pytest.raises(ValueError, match=f"^its file.*{words}") as refused:
            read_rollouts(path, name="its file")
        assert str(tmp_path) not in str(refused.value)


def test_malformed_rows_name_the_field(tmp_path):
    path = tmp_path / "r.parquet"
    write_rollouts([record()], path)
    rewrite(path, "finish_reason", ["exploded"])
    with pytest.raises(ValueError, match="record 0: finish_reason"):
        read_rollouts(path)


def test_unsealed_records_are_not_written(tmp_path):
    unsealed = record().model_copy(update={"reward": 0.0})
    with pytest.raises(ValueError, match="not sealed"):
        write_rollouts([unsealed], tmp_path / "r.parquet")


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_never_crash_the_reader(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "r.parquet"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=r"not a readable rollout file|schema version"):
        read_rollouts(path)


@pytest.fixture(scope="module")
def valid_file_bytes(tmp_path_factory):
    path = tmp_path_factory.mktemp("valid") / "r.parquet"
    write_rollouts([record(), record(sample=2)], path)
    return path.read_bytes()


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_corrupted_files_are_refused_or_read_sound(tmp_path_factory, valid_file_bytes, data):
    raw = bytearray(valid_file_bytes)
    for _ in range(data.draw(st.integers(1, 8))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    path = tmp_path_factory.mktemp("mutant") / "r.parquet"
    path.write_bytes(bytes(raw))
    try:
        records = read_rollouts(path)
    except ValueError:
        return
    assert all(r.digest == r.content_digest() for r in records)
