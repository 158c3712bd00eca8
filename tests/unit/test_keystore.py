"""Encrypted keystores and the `swarmrl wallet` key commands."""

import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from eth_account import Account

from swarmrl import keystore
from swarmrl.chain.deploy import (
    ContractAddresses,
    Deployment,
    ProtocolParams,
    run_id_from_name,
    write_deployment,
)
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


def cheap(private_key: bytes = KEY, **changes) -> dict:
    """A valid keystore whose scrypt costs microseconds, with top-level `changes`."""
    return {**Account.encrypt(private_key, "pw", kdf="scrypt", iterations=2), **changes}


def write(folder: Path, name: str, document: object) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(document))
    return path


def damaged(document: dict, *where_then_value) -> dict:
    """`document` with the field at path `where` set to `value` (deleted if DELETE)."""
    *where, value = where_then_value
    section = document
    for key in where[:-1]:
        section = section[key]
    if value is DELETE:
        del section[where[-1]]
    else:
        section[where[-1]] = value
    return document


DELETE = object()


@pytest.mark.parametrize(
    ("where_then_value", "problem"),
    [
        (("crypto", DELETE), "it has no 'crypto' field"),
        (
            ("crypto", "kdf", "argon2id"),
            "its key derivation 'argon2id' is neither scrypt nor pbkdf2",
        ),
        (("crypto", "kdf", DELETE), "it has no 'kdf' field"),
        (("crypto", "kdf", 7), "its 'kdf' field is not a string"),
        (
            ("crypto", "cipher", "aes-256-gcm"),
            "its cipher is not aes-128-ctr, the one JSON V3 cipher",
        ),
        (("crypto", "cipherparams", "iv", "00" * 8), "its 'iv' field is 8 bytes, not 16"),
        (("crypto", "cipherparams", []), "its 'cipherparams' field is not a JSON object"),
        (("crypto", "mac", "zz" * 32), "its 'mac' field is not hex"),
        (("crypto", "ciphertext", "0"), "its 'ciphertext' field is not hex"),
        (("crypto", "kdfparams", None), "its 'kdfparams' field is not a JSON object"),
        (("crypto", "kdfparams", "n", 3), "its scrypt cost n = 3 is not a power of two"),
        (("crypto", "kdfparams", "n", "262144"), "its 'n' field is not a whole number"),
        (("crypto", "kdfparams", "p", True), "its 'p' field is not a whole number"),
        (("crypto", "kdfparams", "r", 0), "its 'r' field must be at least 1"),
        (("crypto", "kdfparams", "n", 2.0), "its 'n' field is not a whole number"),
        (("crypto", "kdfparams", "dklen", 64), "its kdf output length 'dklen' is not 32"),
        (("crypto", "kdfparams", "salt", "00" * 2000), "its 'salt' field is longer than 1024"),
        (("Crypto", {}), "its 'crypto' field is written more than once"),
        (("address", DELETE), "it does not record a valid address"),
        (("address", "0x1234"), "it does not record a valid address"),
    ],
)
def test_a_damaged_keystore_is_one_sentence_naming_it(tmp_path, where_then_value, problem):
    path = write(tmp_path, "bad", damaged(cheap(), *where_then_value))
    for read in (keystore.info, lambda d, n: keystore.unlock(d, n, "pw")):
        with pytest.raises(KeystoreError) as caught:
            read(tmp_path, "bad")
        assert str(caught.value).startswith(f"keystore {path} is damaged: {problem}")


@pytest.mark.parametrize(
    ("kdfparams", "problem"),
    [
        ({"n": 2**20, "r": 8, "p": 1}, "scrypt memory n*r = 8388608 is above the 2097152"),
        ({"n": 2**62, "r": 8, "p": 1}, "scrypt memory n*r = 36893488147419103232 is above"),
        ({"n": 2**18, "r": 8, "p": 3}, "scrypt cost n*r*p = 6291456 is above the 4194304"),
        ({"n": 2, "r": 1, "p": 2**40}, "scrypt cost n*r*p = 2199023255552 is above the 4194304"),
        ({"n": 2, "r": 2**20, "p": 2}, "scrypt r = 1048576, p = 2 are above the 32 and 16"),
        ({"n": 256, "r": 1024, "p": 16}, "scrypt r = 1024, p = 16 are above the 32 and 16"),
        ({"n": 2**14, "r": 8, "p": 17}, "scrypt r = 8, p = 17 are above the 32 and 16"),
    ],
)
def test_a_scrypt_cost_above_the_cap_is_refused_before_the_kdf(tmp_path, kdfparams, problem):
    document = cheap()
    document["crypto"]["kdfparams"].update(kdfparams)
    write(tmp_path, "costly", document)
    # Running the kdf would take hours or all memory: the refusal comes first.
    with pytest.raises(KeystoreError, match=re.escape(problem)):
        keystore.unlock(tmp_path, "costly", "pw")


def test_a_pbkdf2_count_above_the_cap_is_refused_and_the_default_one_unlocks(tmp_path):
    document = Account.encrypt(KEY, "pw", kdf="pbkdf2")  # eth-account's 10**6 rounds
    write(tmp_path, "default", document)
    assert keystore.unlock(tmp_path, "default", "pw").address == ADDRESS
    document["crypto"]["kdfparams"]["c"] = 10**12
    write(tmp_path, "costly", document)
    with pytest.raises(KeystoreError, match="pbkdf2 iteration count 1000000000000 is above the"):
        keystore.unlock(tmp_path, "costly", "pw")


def test_geths_default_scrypt_cost_unlocks(tmp_path):
    """eth-account writes geth's standard scrypt parameters: n = 2**18, r = 8, p = 1."""
    saved = keystore.save(tmp_path, "geth", KEY, "pw")
    params = json.loads(saved.path.read_text())["crypto"]["kdfparams"]
    assert (params["n"], params["r"], params["p"]) == (2**18, 8, 1)
    assert keystore.unlock(tmp_path, "geth", "pw").address == ADDRESS


def test_a_public_key_is_saved_with_the_cheap_kdf_and_only_it(tmp_path):
    """save_public (anvil's dev keys) writes scrypt n = 2**10, which unlocks like any other
    and refuses a wrong password the same (save's own cost: the test above)."""
    saved = keystore.save_public(tmp_path, "dev", KEY, "pw")
    params = json.loads(saved.path.read_text())["crypto"]["kdfparams"]
    assert (params["n"], params["r"], params["p"]) == (2**10, 8, 1)
    assert keystore.unlock(tmp_path, "dev", "pw").address == ADDRESS
    with pytest.raises(KeystoreError, match="wrong password for key 'dev'"):
        keystore.unlock(tmp_path, "dev", "not it")


def test_an_address_that_is_not_the_keys_is_refused_on_unlock(tmp_path):
    other = Account.create().address
    path = write(tmp_path, "liar", cheap(address=other[2:].lower()))
    # Without the password the recorded address is all there is, and it is labelled so.
    assert keystore.info(tmp_path, "liar").address == other
    with pytest.raises(KeystoreError) as caught:
        keystore.unlock(tmp_path, "liar", "pw")
    assert str(caught.value) == (
        f"keystore {path} records address {other} but holds the key of {ADDRESS}, "
        "so it was edited or damaged and is not used"
    )
    write(tmp_path, "honest", cheap())
    assert keystore.unlock(tmp_path, "honest", "pw").address == ADDRESS
    with pytest.raises(KeystoreError, match="wrong password for key 'honest'"):
        keystore.unlock(tmp_path, "honest", "guess")


def test_listing_reports_each_damaged_file_and_lists_the_good_ones(tmp_path):
    keystore.save(tmp_path, "good", KEY, "pw")
    (tmp_path / "garbage.json").write_text("{not json")
    (tmp_path / "other.json").write_text(json.dumps({"version": 1}))
    write(tmp_path, "nocrypto", damaged(cheap(), "crypto", DELETE))
    write(tmp_path, "bad name", cheap())
    (tmp_path / "folder.json").mkdir()
    listing = keystore.list_keys(tmp_path)
    assert [k.name for k in listing.keys] == ["good"]
    assert sorted(str(e) for e in listing.damaged) == sorted(
        [
            f"{tmp_path / 'bad name.json'} is not named like a key",
            f"cannot read keystore {tmp_path / 'folder.json'}: Is a directory",
            f"{tmp_path / 'garbage.json'} is not a readable keystore (not JSON)",
            f"keystore {tmp_path / 'nocrypto.json'} is damaged: it has no 'crypto' field",
            f"{tmp_path / 'other.json'} is not a JSON V3 keystore",
        ]
    )


def test_wallet_list_says_what_is_damaged_and_exits_1(tmp_path):
    keys = tmp_path / "ks"
    assert wallet(tmp_path, "list").returncode == 0  # no folder yet: no keys
    keys.write_text("")
    out = wallet(tmp_path, "list")
    assert out.returncode == 1
    assert out.stderr == f"error: the keystore folder {keys} is not a folder\n"
    keys.unlink()
    keystore.save(keys, "good", KEY, "pw")
    assert wallet(tmp_path, "list").returncode == 0
    write(keys, "nocrypto", damaged(cheap(), "crypto", DELETE))
    write(keys, "weird", damaged(cheap(), "crypto", "kdf", "argon2id"))
    out = wallet(tmp_path, "list")
    assert out.returncode == 1
    assert out.stdout == f"good {ADDRESS}\n"
    assert out.stderr.splitlines() == [
        f"error: keystore {keys / 'nocrypto.json'} is damaged: it has no 'crypto' field",
        f"error: keystore {keys / 'weird.json'} is damaged: its key derivation 'argon2id' "
        "is neither scrypt nor pbkdf2",
    ]


def test_an_unlocking_command_refuses_a_costly_keystore_at_once(tmp_path):
    document = cheap()
    document["crypto"]["kdfparams"].update({"n": 2**40, "r": 8})
    write(tmp_path / "ks", "costly", document)
    # A deployment file whose chain is never reached: the key is refused before that.
    deployment = Deployment(
        chain_id=31337,
        rpc_url="http://127.0.0.1:9",
        run_id=run_id_from_name("dev"),
        deploy_block=0,
        admin=ADDRESS,
        treasury=ADDRESS,
        recorders=[ADDRESS],
        validators=[ADDRESS],
        contracts=ContractAddresses(
            stake_token=ADDRESS,
            provider_registry=ADDRESS,
            stake_manager=ADDRESS,
            compute_pool=ADDRESS,
        ),
        params=ProtocolParams(),
    )
    write_deployment(tmp_path / "deployment.json", deployment)
    out = wallet(  # the timeout is a guard against a hang
        tmp_path, "withdraw", "costly", "--deployment", str(tmp_path / "deployment.json")
    )
    assert out.returncode == 1
    assert out.stderr.startswith(
        f"error: keystore {tmp_path / 'ks' / 'costly.json'} is damaged: its scrypt memory"
    )
    assert len(out.stderr.splitlines()) == 1


def test_a_password_file_that_is_not_text_is_one_sentence(tmp_path):
    password_file = tmp_path / "pw"
    password_file.write_bytes(b"\xff\xfe\x00secret")
    with pytest.raises(KeystoreError, match=r"^the password file is not UTF-8 text$"):
        keystore.read_password(password_file)


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
    # `wallet import` in a script (no terminal) too: docs/node.md says $SWARMRL_PASSWORD.
    key_file = tmp_path / "key.hex"
    key_file.write_text("0x" + KEY.hex() + "\n")
    out = wallet(tmp_path, "import", "staker", "--private-key-file", str(key_file), password=None)
    assert out.returncode == 1
    assert out.stderr.strip() == (
        "error: no password: pass --password-file or set SWARMRL_PASSWORD when not on a terminal"
    )
    assert not (tmp_path / "ks" / "staker.json").exists()


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


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            b"",
            "that is not a valid private key: a key is 32 bytes, not zero, "
            "and below the secp256k1 group order",
        ),
        (b"\xff\xfe" + b"00" * 32, "the private key file does not hold hex digits"),
        (b"0" * 5000, "the private key file is too large to hold one key"),
    ],
)
def test_wallet_import_refuses_a_key_file_that_holds_no_key(tmp_path, content, message):
    key_file = tmp_path / "key.hex"
    key_file.write_bytes(content)
    out = wallet(tmp_path, "import", "x", "--private-key-file", str(key_file))
    assert out.returncode == 1
    assert out.stderr.strip() == f"error: {message}"


def test_a_device_as_key_or_password_file_is_refused_not_read_forever(tmp_path):
    out = wallet(tmp_path, "import", "x", "--private-key-file", "/dev/zero")  # timeout: guard
    assert out.returncode == 1
    assert out.stderr.strip() == "error: the private key file is too large to hold one key"
    with pytest.raises(KeystoreError, match=r"^the password file is too large to hold a password$"):
        keystore.read_password(Path("/dev/zero"))


def test_the_password_is_the_first_line_of_its_file(tmp_path):
    password_file = tmp_path / "pw"
    password_file.write_text("sécret\nignored\n")
    assert keystore.read_password(password_file) == "sécret"
    password_file.write_text("")
    assert keystore.read_password(password_file) == ""
