"""The keystore reader on whatever a file may hold: random JSON and mutated keystores.

Every outcome is the key, or a `KeystoreError` (a ValueError) of one sentence;
never another exception and never a hang: the kdf cost is capped before the kdf
runs, so a mutated cost is refused or cheap.
"""

import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from eth_account import Account
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.fuzz_targets import (
    KEYSTORE_BASES,
    KEYSTORE_KEY,
    KEYSTORE_PASSWORD,
    keystore_json,
    keystore_mutations,
    mutate_keystore,
)
from swarmrl import keystore
from swarmrl.keystore import KeystoreError

ADDRESS = Account.from_key(KEYSTORE_KEY).address
T = TypeVar("T")
FUZZ = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def outcome(read: Callable[[], T]) -> T | str:
    """What `read` returns, or the sentence of its KeystoreError; anything else raises."""
    try:
        return read()
    except KeystoreError as e:
        return str(e)


def read_both(folder: Path, raw: bytes) -> None:
    """`info` and `unlock` on `raw`: each succeeds or raises a one-sentence KeystoreError,
    and an unlocked key is the address the file records."""
    (folder / "fuzzed.json").write_bytes(raw)
    recorded = outcome(lambda: keystore.info(folder, "fuzzed"))
    unlocked = outcome(lambda: keystore.unlock(folder, "fuzzed", KEYSTORE_PASSWORD))
    for sentence in (r for r in (recorded, unlocked) if isinstance(r, str)):
        assert sentence.strip()
        assert "\n" not in sentence
    if not isinstance(unlocked, str):
        assert unlocked.address == ADDRESS
        assert not isinstance(recorded, str)
        assert recorded.address == ADDRESS


@FUZZ
@given(document=keystore_json)
def test_any_json_is_a_keystore_or_one_sentence(folder, document):
    read_both(folder, json.dumps(document).encode())


@FUZZ
@given(
    base=st.sampled_from(KEYSTORE_BASES),
    changes=st.lists(keystore_mutations, min_size=1, max_size=3),
)
def test_a_mutated_keystore_unlocks_to_its_key_or_is_one_sentence(folder, base, changes):
    document = json.loads(json.dumps(base))
    for path, action, value in changes:
        mutate_keystore(document, path, action, value)
    read_both(folder, json.dumps(document).encode())


@FUZZ
@given(raw=st.binary(max_size=600), cut=st.integers(min_value=0, max_value=600))
def test_truncated_or_garbled_bytes_are_one_sentence(folder, raw, cut):
    valid = json.dumps(KEYSTORE_BASES[0]).encode()
    read_both(folder, valid[:cut] + raw)
