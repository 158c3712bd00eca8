"""A node's EIP-712 signature over a rollout file: what it binds, and how it travels."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from eth_account import Account

from swarmrl.eip712 import micros, recover, swarm_domain
from swarmrl.rollouts.records import (
    SIGNATURE_KEY,
    file_digest,
    read_rollout_file,
    write_rollouts,
)
from swarmrl.rollouts.signing import FileSignature
from tests.unit.test_rollout_records import record

NODE = Account.from_key("0x" + "11" * 32)
DOMAIN = swarm_domain(31337, "0x" + "cc" * 20)
RUN = "0x" + "ab" * 32
SETTINGS = {"run": RUN, "step": 3, "group_size": 4, "max_tokens": 64}


def sign(digest, domain=DOMAIN, **changes):
    fields = {**SETTINGS, "temperature": 0.7, "top_p": 0.95, **changes}
    return FileSignature.sign(NODE, domain, digest, **fields)


def test_the_signer_is_recovered_only_for_the_same_file_settings_and_domain():
    digest = b"\x01" * 32
    signature = sign(digest)
    assert signature.node == NODE.address
    assert signature.signer(DOMAIN, digest) == NODE.address
    assert signature.signer(DOMAIN, b"\x02" * 32) != NODE.address
    assert signature.signer(swarm_domain(1, "0x" + "cc" * 20), digest) != NODE.address
    assert signature.signer(swarm_domain(31337, "0x" + "cd" * 20), digest) != NODE.address
    for change in (
        {"step": 4},
        {"group_size": 5},
        {"max_tokens": 65},
        {"temperature": 0.8},
        {"top_p": 1.0},
        {"run": "0x" + "ac" * 32},
        {"node": "0x" + "22" * 20},
    ):
        assert signature.model_copy(update=change).signer(DOMAIN, digest) != NODE.address
    # The digest is EIP-712's: the same bytes any wallet would sign and recover.
    assert recover(signature.digest(DOMAIN, digest), bytes.fromhex(signature.signature)) == (
        NODE.address
    )


def test_settings_are_signed_on_a_grid_of_millionths():
    assert micros(0.7, "t") == 700_000
    assert micros(1.0, "t") == 1_000_000
    with pytest.raises(ValueError, match=r"multiple of 0\.000001"):
        micros(0.1234567, "--temperature")
    with pytest.raises(ValueError, match=r"multiple of 0\.000001"):
        sign(b"\x01" * 32, temperature=0.1234567)


def test_a_signature_travels_in_the_files_metadata(tmp_path):
    records = [record(), record(sample=2)]
    signature = sign(file_digest(records))
    path = tmp_path / "r.parquet"
    write_rollouts(records, path, signature)
    read = read_rollout_file(path)
    assert read.rollouts == records
    assert read.signature == signature
    assert read.signature.signer(DOMAIN, file_digest(read.rollouts)) == NODE.address
    write_rollouts(records, path)
    assert read_rollout_file(path).signature is None


@pytest.mark.parametrize(
    ("block", "error"),
    [
        (b"{", "malformed signature block"),
        (b'{"run": "x"}', "malformed signature block"),
        (b"x" * 10_000, "not a signature"),
    ],
)
def test_a_damaged_signature_block_is_one_sentence(tmp_path, block, error):
    path = tmp_path / "r.parquet"
    write_rollouts([record()], path)
    table = pq.read_table(path)
    metadata = {**table.schema.metadata, SIGNATURE_KEY: block}
    pq.write_table(table.replace_schema_metadata(metadata), path)
    with pytest.raises(ValueError, match=error) as caught:
        read_rollout_file(path)
    assert "\n" not in str(caught.value)


def test_the_type_string_is_the_protocols():
    assert FileSignature.STRUCT.type_string == (
        "RolloutFile(bytes32 runId,address node,uint64 step,bytes32 fileDigest,uint32 groupSize,"
        "uint32 maxTokens,uint32 temperatureMicros,uint32 topPMicros)"
    )
