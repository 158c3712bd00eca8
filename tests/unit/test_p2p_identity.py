"""swarmrl.p2p.identity: the persistent libp2p key beside a node's keystore."""

from __future__ import annotations

import re
import stat
import threading
from pathlib import Path

import pytest

from swarmrl.p2p.identity import load_or_create_peer_key, peer_id_of, peer_key_path


def test_peer_key_lives_beside_the_keystore(tmp_path):
    assert peer_key_path(tmp_path, "node1") == tmp_path / "node1.peer-key"
    assert peer_key_path(str(tmp_path), "node1") == tmp_path / "node1.peer-key"


def test_key_is_created_once_private_and_reloaded(tmp_path):
    path = peer_key_path(tmp_path / "keys", "node1")  # the directory does not exist yet
    first = peer_id_of(load_or_create_peer_key(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}\n", text)
    assert sorted(p.name for p in path.parent.iterdir()) == ["node1.peer-key"]  # no temp files

    again = load_or_create_peer_key(path)
    assert peer_id_of(again) == first
    assert path.read_text() == text  # never rewritten
    assert again.private_key.to_bytes() == load_or_create_peer_key(path).private_key.to_bytes()
    assert first.startswith("12D3KooW")  # an Ed25519 peer id, as libp2p prints it


def test_each_key_file_is_its_own_identity(tmp_path):
    a = peer_id_of(load_or_create_peer_key(tmp_path / "a.peer-key"))
    b = peer_id_of(load_or_create_peer_key(tmp_path / "b.peer-key"))
    assert a != b


def test_the_stored_seed_decides_the_peer_id(tmp_path):
    path = tmp_path / "k.peer-key"
    path.write_text("07" * 32 + "\n")
    first = peer_id_of(load_or_create_peer_key(path))
    other = tmp_path / "copy.peer-key"
    other.write_text("07" * 32)  # no newline: still the same key
    assert peer_id_of(load_or_create_peer_key(other)) == first


def test_concurrent_creation_agrees_on_one_key(tmp_path):
    path = tmp_path / "shared.peer-key"
    ids: list[str] = []
    barrier = threading.Barrier(8)

    def create() -> None:
        barrier.wait()
        ids.append(peer_id_of(load_or_create_peer_key(path)))

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(ids) == 8
    assert len(set(ids)) == 1
    assert peer_id_of(load_or_create_peer_key(path)) == ids[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared.peer-key"]


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not a key\n",
        b"ab" * 31 + b"\n",  # too short
        b"ab" * 33 + b"\n",  # too long
        b"AB" * 32 + b"\n",  # upper case
        b"ab" * 31 + b"zz\n",
        b"\xff\xfe\x00\x01" * 16,  # binary garbage
        b"\x80" + b"ab" * 32,
    ],
    ids=["empty", "text", "short", "long", "upper", "non-hex", "binary", "non-ascii"],
)
def test_corrupt_key_file_is_one_value_error_and_left_alone(tmp_path: Path, content):
    path = tmp_path / "node1.peer-key"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="is not a peer key") as e:
        load_or_create_peer_key(path)
    assert str(e.value) == f"{path} is not a peer key (64 lowercase hex characters)"
    assert path.read_bytes() == content  # a corrupt identity is never silently replaced
