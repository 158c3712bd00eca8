"""Encrypted keystores and the `swarmrl wallet` key commands."""

import hashlib
import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from eth_account import Account

from swarmrl import keystore
from swarmrl.keystore import KeystoreError

SWARMRL = Path(sys.executable).with_name("swarmrl")
KEY = bytes.fromhex("4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318")
ADDRESS = Account.from_key(KEY).address


def wallet(tmp_path: Path, *args: str, password: str | None = "pw", stdin: str = ""):
    env = {**os.environ, "SWARMRL_KEYSTORE_DIR": str(tmp_path / "ks")}
    env.pop("SWARMRL_PASSWORD", None)
    if password is not None:
        env["SWARMRL_PASSWORD"] = password
    return subprocess.run(
        [SWARMRL, "wallet", *args], env=env, input=stdin, capture_output=True, text=True, timeout=60
    )


def test_saved_key_is_private_v3_and_decrypts(tmp_path):
    info = keystore.save(tmp_path, "node1", KEY, "secret")
    assert info.address == ADDRESS
    assert stat.S_IMODE(info.path.stat().st_mode) == 0o600
    document = json.loads(info.path.read_text())
    assert document["version"] == 3
    assert KEY.hex() not in info.path.read_text()
    assert keystore.unlock(tmp_path, "node1", "secret").key == KEY


def test_wrong_password_is_one_clear_error(tmp_path):
    keystore.save(tmp_path, "node1", KEY, "secret")
    with pytest.raises(KeystoreError, match="wrong password for key 'node1'"):
        keystore.unlock(tmp_path, "node1", "guess")


def test_an_existing_key_is_never_overwritten(tmp_path):
    first = keystore.save(tmp_path, "node1", KEY, "secret")
    before = hashlib.sha256(first.path.read_bytes()).hexdigest()
    with pytest.raises(KeystoreError, match="already exists"):
        keystore.create(tmp_path, "node1", "other")
    assert hashlib.sha256(first.path.read_bytes()).hexdigest() == before
    assert [p.name for p in tmp_path.iterdir()] == ["node1.json"]


def test_racing_writers_leave_exactly_one_key(tmp_path):
    results: list[str] = []

    def write() -> None:
        try:
            results.append(keystore.create(tmp_path, "race", "pw").address)
        except KeystoreError:
            results.append("refused")

    threads = [threading.Thread(target=write) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results).count("refused") == 1
    winner = next(r for r in results if r != "refused")
    assert keystore.info(tmp_path, "race").address == winner
    assert [p.name for p in tmp_path.iterdir()] == ["race.json"]


@pytest.mark.parametrize("name", ["", "../escape", "a/b", ".hidden", "x" * 65])
def test_bad_names_are_refused(tmp_path, name):
    with pytest.raises(KeystoreError, match="key name"):
        keystore.save(tmp_path, name, KEY, "pw")


def test_bad_private_keys_and_empty_passwords_are_refused(tmp_path):
    with pytest.raises(KeystoreError, match="not a valid private key"):
        keystore.save(tmp_path, "zero", bytes(32), "pw")
    with pytest.raises(KeystoreError, match="not a valid private key"):
        keystore.save(tmp_path, "short", b"\x01" * 5, "pw")
    with pytest.raises(KeystoreError, match="must not be empty"):
        keystore.save(tmp_path, "nopw", KEY, "")
    assert list(tmp_path.iterdir()) == []


def test_listing_skips_files_that_are_not_keystores(tmp_path):
    keystore.save(tmp_path, "good", KEY, "pw")
    (tmp_path / "garbage.json").write_text("{not json")
    (tmp_path / "other.json").write_text(json.dumps({"version": 1}))
    assert [k.name for k in keystore.list_keys(tmp_path)] == ["good"]
    with pytest.raises(KeystoreError, match="not a readable keystore"):
        keystore.info(tmp_path, "garbage")
    with pytest.raises(KeystoreError, match="not a JSON V3 keystore"):
        keystore.info(tmp_path, "other")


def test_wallet_commands_end_to_end(tmp_path):
    key_file = tmp_path / "key.hex"
    key_file.write_text("0x" + KEY.hex() + "\n")
    out = wallet(tmp_path, "import", "staker", "--private-key-file", str(key_file))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["staker", ADDRESS]

    again = wallet(tmp_path, "import", "staker", "--private-key-file", str(key_file))
    assert again.returncode == 1
    assert again.stderr.strip() == "error: a key named 'staker' already exists"

    created = wallet(tmp_path, "new", "node1")
    assert created.returncode == 0, created.stderr
    listed = wallet(tmp_path, "list").stdout.splitlines()
    assert [line.split()[0] for line in listed] == ["node1", "staker"]
    assert wallet(tmp_path, "address", "staker").stdout.strip() == ADDRESS


def test_wallet_without_a_password_source_fails_cleanly(tmp_path):
    out = wallet(tmp_path, "new", "node1", password=None)
    assert out.returncode == 1
    assert "no password" in out.stderr
    assert not (tmp_path / "ks" / "node1.json").exists()


def test_wallet_rejects_a_non_hex_private_key_file(tmp_path):
    key_file = tmp_path / "key.hex"
    key_file.write_text("not a key")
    out = wallet(tmp_path, "import", "x", "--private-key-file", str(key_file))
    assert out.returncode == 1
    assert out.stderr.strip() == "error: the private key file does not hold hex digits"


def test_a_deeply_nested_keystore_file_is_refused_not_a_crash(tmp_path):
    (tmp_path / "deep.json").write_text("[" * 60_000)
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(100_000)  # what importing web3 does
    try:
        with pytest.raises(KeystoreError, match="not a readable keystore"):
            keystore.info(tmp_path, "deep")
    finally:
        sys.setrecursionlimit(old)
