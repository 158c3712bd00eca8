"""A peer's libp2p identity: an Ed25519 key kept next to its Ethereum keystore.

The key is what the peer id is derived from, so keeping it makes a node the
same peer across restarts (its signed peer record, bans and reputation stay
with it). It is a 32-byte seed in hex, in a file only the owner can read,
written once atomically and never overwritten.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID

PEER_KEY_SUFFIX = ".peer-key"


def peer_key_path(keystore_dir: Path, name: str) -> Path:
    """Where key `name`'s peer identity lives: beside `<name>.json`."""
    return Path(keystore_dir) / f"{name}{PEER_KEY_SUFFIX}"


def load_or_create_peer_key(path: Path) -> KeyPair:
    """The key pair stored at `path`, created there first if there is none."""
    path = Path(path)
    try:
        # Undecodable bytes fail the format check below, like any other corruption.
        text = path.read_bytes().decode("ascii", errors="replace").strip()
    except FileNotFoundError:
        seed = secrets.token_bytes(32)
        if not save_peer_key(path, seed):
            return load_or_create_peer_key(path)  # another process just wrote one
        return create_new_key_pair(seed)
    if not re.fullmatch(r"[0-9a-f]{64}", text):
        raise ValueError(f"{path} is not a peer key (64 lowercase hex characters)")
    return create_new_key_pair(bytes.fromhex(text))


def save_peer_key(path: Path, seed: bytes) -> bool:
    """Writes the identity of `seed` at `path` (the owner's alone, synced) unless a file
    is there; whether it wrote it. Never replaces a key another process just wrote."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(seed.hex() + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
    finally:
        tmp.unlink(missing_ok=True)
    return True


def peer_id_of(key_pair: KeyPair) -> str:
    return ID.from_pubkey(key_pair.public_key).to_base58()
