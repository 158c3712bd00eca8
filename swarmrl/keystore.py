"""Encrypted keys on disk: standard Ethereum JSON V3 keystores, one file per key.

A key never touches disk unencrypted and a keystore is never overwritten: a new
file is written under a temporary name, synced, and linked into place with
``os.link``, which fails if the name is taken, so two writers cannot clobber
each other and a crash leaves either no key or a complete one.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

import pydantic_core

from swarmrl.files import data_dir

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# JSON V3 files are a few hundred bytes; anything far larger is not a keystore.
MAX_KEYSTORE_BYTES = 64 * 1024
MAX_PASSWORD_FILE_BYTES = 64 * 1024


class KeystoreError(ValueError):
    """A keystore operation failed; the message is one sentence for the user."""


@dataclass(frozen=True)
class KeyInfo:
    name: str
    address: str
    path: Path


def default_dir() -> Path:
    """$SWARMRL_KEYSTORE_DIR, else the keystore folder under the XDG data home."""
    return data_dir("keystore", "SWARMRL_KEYSTORE_DIR")


def _path(directory: Path, name: str) -> Path:
    if not NAME.fullmatch(name):
        raise KeystoreError(
            f"key name {name!r} must be 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return directory / f"{name}.json"


def check_folder(directory: Path) -> None:
    """One sentence if no key can be saved in `directory` because it, or a folder above
    it, is a file (creating it would otherwise fail with an errno string)."""
    nearest = directory
    while not nearest.exists() and nearest != nearest.parent:
        nearest = nearest.parent
    if nearest.is_dir():
        return
    if nearest == directory:
        raise KeystoreError(f"the keystore folder {directory} is a file, not a folder")
    raise KeystoreError(f"the keystore folder {directory} is under {nearest}, which is a file")


def _write_new(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Unique per writer, threads of one process included.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(document, f)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise KeystoreError(f"a key named {path.stem!r} already exists") from None
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        tmp.unlink(missing_ok=True)


# What eth-account and geth write: scrypt n = 2**18, about 0.6 s of a core per unlock.
SCRYPT_N = 2**18
PUBLIC_KEY_SCRYPT_N = 2**10  # save_public's


def save(
    directory: Path, name: str, private_key: bytes, password: str, *, scrypt_n: int = SCRYPT_N
) -> KeyInfo:
    """Encrypts `private_key` with `password` into a new keystore `name` (scrypt, cost
    `scrypt_n`)."""
    path = _path(directory, name)
    check_folder(directory)
    if path.exists():
        raise KeystoreError(f"a key named {name!r} already exists")
    if not password:
        raise KeystoreError("the password must not be empty")
    # Imported here: eth_account takes 0.7 s to import, and every swarmrl command loads
    # this module to name its keys; only saving and unlocking a key need it.
    from eth_account import Account

    try:
        account = Account.from_key(private_key)
    except (ValueError, TypeError):
        raise KeystoreError(
            "that is not a valid private key: a key is 32 bytes, not zero, "
            "and below the secp256k1 group order"
        ) from None
    _write_new(path, Account.encrypt(account.key, password, kdf="scrypt", iterations=scrypt_n))
    return KeyInfo(name, account.address, path)


def save_public(directory: Path, name: str, private_key: bytes, password: str) -> KeyInfo:
    """`save` for a key anyone can know: anvil's dev accounts, derived from its published
    mnemonic. A dear kdf guards nothing there and costs its 0.6 s at every unlock, hundreds
    of times in a test run and a dozen in a local swarm's start (simulation/local_swarm.py)."""
    return save(directory, name, private_key, password, scrypt_n=PUBLIC_KEY_SCRYPT_N)


def create(directory: Path, name: str, password: str) -> KeyInfo:
    """A fresh random key, saved encrypted as `name`."""
    from eth_account import Account

    return save(directory, name, Account.create().key, password)


# What eth-account and geth write by default: scrypt n = SCRYPT_N, r = 8, p = 1, and
# pbkdf2 with 10**6 iterations. Twice that is allowed; more is refused before the
# kdf runs, since a file can otherwise ask for hours of work or gigabytes of memory.
MAX_SCRYPT_WORK = 2 * SCRYPT_N * 8  # n * r * p
MAX_SCRYPT_BLOCKS = SCRYPT_N * 8  # n * r; scrypt takes 128 bytes each, 256 MiB here
MAX_PBKDF2_ROUNDS = 2 * 10**6
# eth-account's scrypt (pycryptodome) costs more than n * r * p says: about r squared
# for each of p lanes. Within the caps above, r = 16384 took 39 s here, r = 1024 with
# p = 16 30 s and r = 2**20 minutes (the trust fuzz's long run found them). Tools write
# r = 8, p = 1 (the Web3 Secret Storage vector r = 1, p = 8); these caps keep the
# dearest file allowed to seconds.
MAX_SCRYPT_R = 32
MAX_SCRYPT_P = 16
_HEX = re.compile(r"(0x)?(?:[0-9a-fA-F]{2})*")


@dataclass(frozen=True)
class KeyListing:
    """The keys of a directory, and the damaged files that are not keys."""

    keys: list[KeyInfo]
    damaged: list[KeystoreError]


@dataclass(frozen=True)
class _Keystore:
    """A keystore file whose every field has been checked; `crypto` holds only
    those fields, so the decrypting library never sees anything unchecked."""

    path: Path
    address: str
    crypto: dict[str, Any]


def _read(path: Path) -> _Keystore:
    """The keystore at `path`, every field checked, without running the kdf."""
    try:
        if path.stat().st_size > MAX_KEYSTORE_BYTES:
            raise KeystoreError(f"{path} is too large to be a keystore")
        raw = path.read_bytes()
    except FileNotFoundError:
        raise KeystoreError(f"no key named {path.stem!r} in {path.parent}") from None
    except OSError as e:
        raise KeystoreError(f"cannot read keystore {path}: {e.strerror}") from None
    try:
        # Not json.loads: see swarmrl.shards.Manifest.from_json on nesting depth.
        document = pydantic_core.from_json(raw)
    except ValueError:
        raise KeystoreError(f"{path} is not a readable keystore (not JSON)") from None
    if not isinstance(document, dict) or _get(document, "version") != 3:
        raise KeystoreError(f"{path} is not a JSON V3 keystore")
    try:
        return _Keystore(path, _address_of(document), _crypto(_get(document, "crypto", dict)))
    except KeystoreError as e:
        raise KeystoreError(f"keystore {path} is damaged: {e}") from None


T = TypeVar("T")
_KIND_NAMES: dict[type[object], str] = {dict: "JSON object", str: "string", int: "whole number"}


@overload
def _get(section: dict[str, Any], name: str) -> Any: ...
@overload
def _get(section: dict[str, Any], name: str, kind: type[T]) -> T: ...
def _get(section: dict[str, Any], name: str, kind: type[Any] | None = None) -> Any:
    """Field `name` in any letter case, as eth-account reads it (geth writes "crypto",
    older wallets "Crypto"); a field written twice in different cases is refused."""
    found = [value for key, value in section.items() if key.lower() == name]
    if kind is None:
        return found[0] if len(found) == 1 else None
    if not found:
        raise KeystoreError(f"it has no {name!r} field")
    if len(found) > 1:
        raise KeystoreError(f"its {name!r} field is written more than once")
    value = found[0]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise KeystoreError(f"its {name!r} field is not a {_KIND_NAMES[kind]}")
    return value


def _hex(section: dict[str, Any], name: str, *, size: int | None = None, most: int = 1024) -> str:
    value = _get(section, name, str)
    if not _HEX.fullmatch(value):
        raise KeystoreError(f"its {name!r} field is not hex")
    length = len(value.removeprefix("0x")) // 2
    if size is not None and length != size:
        raise KeystoreError(f"its {name!r} field is {length} bytes, not {size}")
    if length > most:
        raise KeystoreError(f"its {name!r} field is longer than {most} bytes")
    return value


def _whole(section: dict[str, Any], name: str, least: int) -> int:
    value = _get(section, name, int)
    if value < least:
        raise KeystoreError(f"its {name!r} field must be at least {least}")
    return value


def _crypto(crypto: dict[str, Any]) -> dict[str, Any]:
    """The checked crypto section; kdf costs above the caps are refused here."""
    if _get(crypto, "cipher", str) != "aes-128-ctr":
        raise KeystoreError("its cipher is not aes-128-ctr, the one JSON V3 cipher")
    iv = _hex(_get(crypto, "cipherparams", dict), "iv", size=16)
    params = _get(crypto, "kdfparams", dict)
    kdf = _get(crypto, "kdf", str)
    checked = {"salt": _hex(params, "salt"), "dklen": _whole(params, "dklen", 0)}
    if checked["dklen"] != 32:
        raise KeystoreError("its kdf output length 'dklen' is not 32")
    if kdf == "scrypt":
        n, r, p = _whole(params, "n", 2), _whole(params, "r", 1), _whole(params, "p", 1)
        if n & (n - 1):
            raise KeystoreError(f"its scrypt cost n = {n} is not a power of two")
        if n * r > MAX_SCRYPT_BLOCKS:
            raise KeystoreError(
                f"its scrypt memory n*r = {n * r} is above the {MAX_SCRYPT_BLOCKS} "
                "swarmrl allows (geth and eth-account write 2097152)"
            )
        if n * r * p > MAX_SCRYPT_WORK:
            raise KeystoreError(
                f"its scrypt cost n*r*p = {n * r * p} is above the {MAX_SCRYPT_WORK} "
                "swarmrl allows (geth and eth-account write 2097152)"
            )
        if r > MAX_SCRYPT_R or p > MAX_SCRYPT_P:
            raise KeystoreError(
                f"its scrypt r = {r}, p = {p} are above the {MAX_SCRYPT_R} and {MAX_SCRYPT_P} "
                "swarmrl allows (geth and eth-account write 8 and 1)"
            )
        checked |= {"n": n, "r": r, "p": p}
    elif kdf == "pbkdf2":
        if _get(params, "prf", str) != "hmac-sha256":
            raise KeystoreError("its pbkdf2 'prf' field is not hmac-sha256")
        rounds = _whole(params, "c", 1)
        if rounds > MAX_PBKDF2_ROUNDS:
            raise KeystoreError(
                f"its pbkdf2 iteration count {rounds} is above the {MAX_PBKDF2_ROUNDS} "
                "swarmrl allows (eth-account writes 1000000)"
            )
        checked |= {"prf": "hmac-sha256", "c": rounds}
    else:
        raise KeystoreError(f"its key derivation {kdf[:40]!r} is neither scrypt nor pbkdf2")
    return {
        "cipher": "aes-128-ctr",
        "cipherparams": {"iv": iv},
        "ciphertext": _hex(crypto, "ciphertext", size=32),  # a private key
        "mac": _hex(crypto, "mac", size=32),
        "kdf": kdf,
        "kdfparams": checked,
    }


def _address_of(document: dict[str, Any]) -> str:
    raw = _get(document, "address")
    if not isinstance(raw, str) or not re.fullmatch(r"(0x)?[0-9a-fA-F]{40}", raw):
        raise KeystoreError("it does not record a valid address")
    from eth_utils import to_checksum_address

    return to_checksum_address(raw if raw.startswith("0x") else f"0x{raw}")


def info(directory: Path, name: str) -> KeyInfo:
    """Name, path and the address the keystore records, without decrypting it: only
    `unlock` can check that address against the key."""
    keystore = _read(_path(directory, name))
    return KeyInfo(name, keystore.address, keystore.path)


def list_keys(directory: Path) -> KeyListing:
    """Every keystore in `directory` by name (addresses as recorded, see `info`), and
    every damaged one with what is wrong with it."""
    listing = KeyListing([], [])
    if not directory.exists():
        return listing  # no key made yet
    if not directory.is_dir():
        raise KeystoreError(f"the keystore folder {directory} is not a folder")
    for path in sorted(directory.glob("*.json")):
        if not NAME.fullmatch(path.stem):
            listing.damaged.append(KeystoreError(f"{path} is not named like a key"))
            continue
        try:
            listing.keys.append(info(directory, path.stem))
        except KeystoreError as e:
            listing.damaged.append(e)
    return listing


def unlock(directory: Path, name: str, password: str) -> LocalAccount:
    """The decrypted account; a wrong password, or a key that is not the address the
    keystore records, is a `KeystoreError`."""
    from eth_account import Account

    keystore = _read(_path(directory, name))
    try:
        key = Account.decrypt({"version": 3, "crypto": keystore.crypto}, password)
    except ValueError:
        # Every field was checked, so the MAC mismatch is all that is left.
        raise KeystoreError(f"wrong password for key {name!r}") from None
    try:
        # Account's methods are combomethods, which erase their annotations.
        account: LocalAccount = Account.from_key(key)
    except ValueError:
        raise KeystoreError(f"keystore {keystore.path} holds no valid private key") from None
    if account.address != keystore.address:
        raise KeystoreError(
            f"keystore {keystore.path} records address {keystore.address} but holds the key "
            f"of {account.address}, so it was edited or damaged and is not used"
        )
    return account


PASSWORD_ENV = "SWARMRL_PASSWORD"


def password_given(password_file: Path | None) -> bool:
    """Whether `read_password` finds a password without asking: a file, or $SWARMRL_PASSWORD."""
    return password_file is not None or PASSWORD_ENV in os.environ


def read_password(password_file: Path | None, *, confirm: bool = False) -> str:
    """The password from `password_file` (first line), else $SWARMRL_PASSWORD (for
    daemons), else a prompt on the terminal; never from the command line."""
    if password_file is not None:
        try:
            with password_file.open("rb") as f:
                # Bounded: a device or a large file given by mistake is refused, not read.
                raw = f.read(MAX_PASSWORD_FILE_BYTES + 1)
        except OSError as e:
            raise KeystoreError(f"cannot read the password file: {e.strerror}") from None
        if len(raw) > MAX_PASSWORD_FILE_BYTES:
            raise KeystoreError("the password file is too large to hold a password")
        try:
            lines = raw.decode("utf-8").splitlines()
        except UnicodeDecodeError:
            raise KeystoreError("the password file is not UTF-8 text") from None
        return lines[0] if lines else ""
    if (env := os.environ.get(PASSWORD_ENV)) is not None:
        return env
    if not sys.stdin.isatty():
        raise KeystoreError(
            "no password: pass --password-file or set SWARMRL_PASSWORD when not on a terminal"
        )
    import typer

    password: str = typer.prompt("Password", hide_input=True, confirmation_prompt=confirm)
    return password
