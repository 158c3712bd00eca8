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

from swarmrl import keystore
from swarmrl.keystore import KeystoreError

KEY = bytes.fromhex("4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318")
ADDRESS = Account.from_key(KEY).address
PASSWORD = "pw"
T = TypeVar("T")
# Cheap bases: eth-account's layout with the smallest costs, so that mutations that
# keep a keystore valid unlock in microseconds.
BASES = [
    Account.encrypt(KEY, PASSWORD, kdf="scrypt", iterations=2),
    Account.encrypt(KEY, PASSWORD, kdf="pbkdf2", iterations=1),
]
FUZZ = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=80)
    | st.text("0123456789abcdefx", max_size=80)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=12,
)


def field_paths(document: dict, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The path of every field, nested ones included."""
    paths = []
    for key, value in document.items():
        paths.append((*prefix, key))
        if isinstance(value, dict):
            paths.extend(field_paths(value, (*prefix, key)))
    return paths


def mutate(document: dict, path: tuple[str, ...], action: str, value: object) -> None:
    section = document
    for key in path[:-1]:
        section = section.get(key)
        if not isinstance(section, dict):
            return  # an earlier mutation replaced this section
    last = path[-1]
    if last not in section:
        return
    if action == "delete":
        del section[last]
    elif action == "rename":
        section[last.upper()] = section.pop(last)
    elif action == "copy-upper":
        section[last.upper()] = value
    else:
        section[last] = value


mutations = st.tuples(
    st.sampled_from(sorted({p for base in BASES for p in field_paths(base)})),
    st.sampled_from(["set", "delete", "rename", "copy-upper"]),
    json_values
    | st.integers(min_value=0, max_value=2**64)
    | st.sampled_from([0, 1, 2, 2**10, 2**18, 2**21, 2**22, 2**64, -1, True, "", "0x"]),
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
    unlocked = outcome(lambda: keystore.unlock(folder, "fuzzed", PASSWORD))
    for sentence in (r for r in (recorded, unlocked) if isinstance(r, str)):
        assert sentence.strip()
        assert "\n" not in sentence
    if not isinstance(unlocked, str):
        assert unlocked.address == ADDRESS
        assert not isinstance(recorded, str)
        assert recorded.address == ADDRESS


@FUZZ
@given(document=json_values)
def test_any_json_is_a_keystore_or_one_sentence(folder, document):
    read_both(folder, json.dumps(document).encode())


@FUZZ
@given(
    base=st.sampled_from(BASES),
    changes=st.lists(mutations, min_size=1, max_size=3),
)
def test_a_mutated_keystore_unlocks_to_its_key_or_is_one_sentence(folder, base, changes):
    document = json.loads(json.dumps(base))
    for path, action, value in changes:
        mutate(document, path, action, value)
    read_both(folder, json.dumps(document).encode())


@FUZZ
@given(raw=st.binary(max_size=600), cut=st.integers(min_value=0, max_value=600))
def test_truncated_or_garbled_bytes_are_one_sentence(folder, raw, cut):
    valid = json.dumps(BASES[0]).encode()
    read_both(folder, valid[:cut] + raw)
