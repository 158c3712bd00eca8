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

import pydantic_core
from eth_account import Account
from eth_account.signers.local import LocalAccount

from swarmrl.files import data_dir

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# JSON V3 files are a few hundred bytes; anything far larger is not a keystore.
MAX_KEYSTORE_BYTES = 64 * 1024


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


def _write_new(path: Path, document: dict) -> None:
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


def save(directory: Path, name: str, private_key: bytes, password: str) -> KeyInfo:
    """Encrypts `private_key` with `password` into a new keystore `name`."""
    path = _path(directory, name)
    if path.exists():
        raise KeystoreError(f"a key named {name!r} already exists")
    if not password:
        raise KeystoreError("the password must not be empty")
    try:
        account = Account.from_key(private_key)
    except (ValueError, TypeError) as e:
        raise KeystoreError(f"that is not a valid private key ({e})") from None
    _write_new(path, Account.encrypt(account.key, password))
    return KeyInfo(name, account.address, path)


def create(directory: Path, name: str, password: str) -> KeyInfo:
    """A fresh random key, saved encrypted as `name`."""
    return save(directory, name, Account.create().key, password)


def _read(path: Path) -> dict:
    try:
        if path.stat().st_size > MAX_KEYSTORE_BYTES:
            raise KeystoreError(f"{path} is too large to be a keystore")
        # Not json.loads: see swarmrl.shards.Manifest.from_json on nesting depth.
        document = pydantic_core.from_json(path.read_bytes())
    except FileNotFoundError:
        raise KeystoreError(f"no key named {path.stem!r} in {path.parent}") from None
    except (OSError, ValueError) as e:
        raise KeystoreError(f"{path} is not a readable keystore ({e})") from None
    if not isinstance(document, dict) or document.get("version") != 3:
        raise KeystoreError(f"{path} is not a JSON V3 keystore")
    return document


def _address_of(document: dict) -> str:
    raw = document.get("address")
    if not isinstance(raw, str) or not re.fullmatch(r"(0x)?[0-9a-fA-F]{40}", raw):
        raise KeystoreError("the keystore does not record a valid address")
    from eth_utils import to_checksum_address

    return to_checksum_address(raw if raw.startswith("0x") else f"0x{raw}")


def info(directory: Path, name: str) -> KeyInfo:
    """Name, address and path of one key, without decrypting it."""
    path = _path(directory, name)
    return KeyInfo(name, _address_of(_read(path)), path)


def list_keys(directory: Path) -> list[KeyInfo]:
    """Every readable keystore in `directory`, by name."""
    if not directory.is_dir():
        return []
    keys = []
    for path in sorted(directory.glob("*.json")):
        try:
            keys.append(KeyInfo(path.stem, _address_of(_read(path)), path))
        except KeystoreError:
            continue
    return keys


def unlock(directory: Path, name: str, password: str) -> LocalAccount:
    """The decrypted account; a wrong password is a `KeystoreError`."""
    path = _path(directory, name)
    document = _read(path)
    try:
        key = Account.decrypt(document, password)
    except ValueError:
        raise KeystoreError(f"wrong password for key {name!r}") from None
    return Account.from_key(key)


def read_password(password_file: Path | None, *, confirm: bool = False) -> str:
    """The password from `password_file` (first line), else $SWARMRL_PASSWORD (for
    daemons), else a prompt on the terminal; never from the command line."""
    if password_file is not None:
        try:
            return password_file.read_text().splitlines()[0] if password_file.stat().st_size else ""
        except OSError as e:
            raise KeystoreError(f"cannot read the password file: {e.strerror}") from None
    if (env := os.environ.get("SWARMRL_PASSWORD")) is not None:
        return env
    if not sys.stdin.isatty():
        raise KeystoreError(
            "no password: pass --password-file or set SWARMRL_PASSWORD when not on a terminal"
        )
    import typer

    return typer.prompt("Password", hide_input=True, confirmation_prompt=confirm)
