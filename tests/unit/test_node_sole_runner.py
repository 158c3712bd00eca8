"""One process per node: a second `swarmrl node run` on the same data dir or the
same key is refused with one sentence naming the first, before it unlocks anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from client.node.settings import NodeSettings
from client.node.work.loop import sole_runner
from swarmrl.locks import FolderBusyError

ORCHESTRATOR = "/ip4/127.0.0.1/tcp/9/p2p/12D3KooWLyBuoa14i5VcrmMFAGQ8Xn3UPVLL2jwqDMNQQXaoVUS9"
SWARMRL = Path(sys.executable).parent / "swarmrl"


def settings(data_dir: Path, keys: Path, key: str = "node") -> NodeSettings:
    return NodeSettings(data_dir=data_dir, keystore_dir=keys, key=key, orchestrator=ORCHESTRATOR)


def test_a_second_runner_on_the_data_dir_or_the_key_is_refused(tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir()
    first = settings(tmp_path / "a", keys)
    with sole_runner(first):
        busy = r"a is in use by `swarmrl node run` \(pid"
        with (
            pytest.raises(FolderBusyError, match=busy),
            sole_runner(settings(tmp_path / "a", keys, key="other")),
        ):
            pass
        busy = r"key 'node' in .*keys is in use by"
        with (
            pytest.raises(FolderBusyError, match=busy),
            sole_runner(settings(tmp_path / "b", keys)),
        ):
            pass
        # Another key in another folder is another node.
        with sole_runner(settings(tmp_path / "c", keys, key="other")):
            pass
    with sole_runner(first):  # released with the first
        pass
    assert not (keys / "node.lock").exists()
    assert not (tmp_path / "a" / ".lock").exists()


def test_node_run_says_who_runs_the_node_and_exits_1(tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir()
    config = tmp_path / "node.toml"
    config.write_text(
        f'data_dir = "{tmp_path / "node"}"\nkeystore_dir = "{keys}"\nkey = "node"\n'
        f'orchestrator = "{ORCHESTRATOR}"\n'
    )
    with sole_runner(settings(tmp_path / "other", keys), command="swarmrl node run --config x"):
        done = subprocess.run(
            [str(SWARMRL), "node", "run", "--config", str(config), "--headless"],
            capture_output=True,
            text=True,
            env={**os.environ, "SWARMRL_PASSWORD": "unused"},
            timeout=120,
        )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert (
        f"key 'node' in {keys} is in use by `swarmrl node run --config x` (pid {os.getpid()})"
        in lines[0]
    )
