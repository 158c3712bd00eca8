"""`swarmrl weights serve|pull` as a person runs them: separate processes, the real
deployment file of the session's anvil, keys from an encrypted keystore."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from swarmrl import keystore
from swarmrl.chain.deploy import write_deployment

from .conftest import RECORDER

SWARMRL = str(Path(sys.executable).with_name("swarmrl"))


@pytest.fixture
def env(tmp_path, deployment, accounts):
    keys = tmp_path / "keys"
    keystore.save_public(keys, "orchestrator", accounts[RECORDER].key, "pw")
    write_deployment(tmp_path / "deployment.json", deployment)
    return {
        **os.environ,
        "SWARMRL_KEYSTORE_DIR": str(keys),
        "SWARMRL_PASSWORD": "pw",
        "SWARMRL_DEPLOYMENT": str(tmp_path / "deployment.json"),
    }


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(np.random.default_rng(3).integers(0, 256, 3_000_000, np.uint8).tobytes())
    return path


@pytest.fixture
def origin(tmp_path, env, checkpoint):
    """A running `weights serve`; yields its multiaddr (its first line of stdout)."""
    proc = subprocess.Popen(
        [
            SWARMRL,
            "weights",
            "serve",
            str(checkpoint),
            "--key",
            "orchestrator",
            "--step",
            "4",
            "--shard-mib",
            "1",
            "--store",
            str(tmp_path / "origin"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        addr = proc.stdout.readline().strip()
        assert addr.startswith("/ip4/127.0.0.1/tcp/"), proc.stderr.read()
        assert "/p2p/12D3KooW" in addr
        yield addr
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _pull(env, *args, timeout=120):
    return subprocess.run(
        [SWARMRL, "weights", "pull", *args], env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


@pytest.mark.slow
def test_pull_gets_the_served_checkpoint_and_prints_its_path(origin, env, checkpoint, tmp_path):
    out = _pull(env, "--bootstrap", origin, "--out", str(tmp_path / "pulled"))
    assert out.returncode == 0, out.stderr
    path = Path(out.stdout.strip())
    assert path.parent.parent.parent == tmp_path / "pulled"
    assert path.name == checkpoint.name
    assert path.read_bytes() == checkpoint.read_bytes()
    assert "step 4: 3/3 shards" in out.stderr


@pytest.mark.slow
def test_pull_refuses_a_checkpoint_from_an_untrusted_origin(origin, env, tmp_path, accounts):
    out = _pull(
        env, "--bootstrap", origin, "--out", str(tmp_path / "pulled"),
        "--trust", accounts[0].address, "--timeout", "4",
    )  # fmt: skip
    assert out.returncode == 1
    assert "rejected checkpoint step 4: checkpoint step 4 is signed by untrusted" in out.stderr
    assert out.stderr.strip().endswith("error: no complete checkpoint arrived within 4 s")
    assert not (tmp_path / "pulled").exists()  # nothing it took, so nothing to resume from


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bootstrap", "not-a-multiaddr"], "is not a multiaddr with a /p2p/ peer id"),
        (
            [
                "--bootstrap",
                "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN",
            ],
            "could not connect to",
        ),
        (["--bootstrap", "/ip4/127.0.0.1/tcp/1", "--trust", "0x12"], "is not an Ethereum address"),
    ],
)
def test_bad_pull_arguments_are_one_sentence(env, tmp_path, args, message):
    out = _pull(env, *args, "--out", str(tmp_path / "pulled"), timeout=60)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ")
    assert message in last
    assert not (tmp_path / "pulled").exists()  # a folder it made and left empty is gone


def test_serve_without_a_checkpoint_or_key_is_one_sentence(env, tmp_path, checkpoint):
    missing = subprocess.run(
        [SWARMRL, "weights", "serve", str(tmp_path / "nope"), "--key", "orchestrator"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines()[-1] == f"error: no checkpoint at {tmp_path / 'nope'}"
    no_key = subprocess.run(
        [SWARMRL, "weights", "serve", str(checkpoint), "--key", "ghost"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert no_key.returncode == 1
    assert "no key named 'ghost'" in no_key.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_a_seeder_killed_mid_transfer_is_routed_around(
    origin, env, checkpoint, tmp_path, deployment
):
    from libp2p.crypto.ed25519 import create_new_key_pair

    from swarmrl.eip712 import swarm_domain
    from swarmrl.weights.peer import SwarmNode
    from swarmrl.weights.store import WeightStore

    seeder = subprocess.Popen(
        [
            SWARMRL,
            "weights",
            "pull",
            "--bootstrap",
            origin,
            "--out",
            str(tmp_path / "seeder"),
            "--seed",
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert Path(seeder.stdout.readline().strip()).read_bytes() == checkpoint.read_bytes()
        seeder_addr = next(
            line.split("seeding as ", 1)[1].split()[0]
            for line in seeder.stderr
            if "seeding as " in line
        )

        def kill_on_first_shard(event):
            if event.kind == "progress" and seeder.poll() is None:
                seeder.kill()  # SIGKILL: no goodbye to anyone

        node = SwarmNode.standalone(
            store=WeightStore(tmp_path / "node"),
            domain=swarm_domain(deployment.chain_id, deployment.contracts.compute_pool),
            run=deployment.run_id,
            trusted=deployment.recorders,
            peer_key=create_new_key_pair(),
            bootstrap=[seeder_addr, origin],
            on_event=kill_on_first_shard,
        )
        try:
            version = node.wait_for(4, timeout=120)
            assert version.path.read_bytes() == checkpoint.read_bytes()
        finally:
            node.close()
        assert seeder.wait(timeout=10) == -9
    finally:
        seeder.kill()
        seeder.wait()


PEER = "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"


def test_a_second_pull_into_one_folder_fails_at_once_naming_the_first(env, tmp_path):
    from swarmrl.locks import exclusive_use

    out = tmp_path / "pulled"
    out.mkdir()
    with exclusive_use(out / ".lock", out, "swarmrl weights pull"):
        # --timeout 600: only the lock can end this within the subprocess's hang guard.
        second = _pull(env, "--bootstrap", PEER, "--out", str(out), "--timeout", "600", timeout=60)
    assert not (out / ".lock").exists()  # released with the lock
    assert second.returncode == 1
    assert second.stderr.strip().splitlines() == [
        f"error: {out} is in use by `swarmrl weights pull` (pid {os.getpid()}); "
        "wait for it to finish or stop it"
    ]


def test_pull_into_a_file_is_one_sentence(env, tmp_path):
    (tmp_path / "file").write_text("not a folder")
    out = _pull(env, "--bootstrap", PEER, "--out", str(tmp_path / "file"), timeout=60)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"error: --out {tmp_path / 'file'} is a file; give a folder"
    ]


def test_serve_refuses_a_key_that_pullers_would_ignore(env, tmp_path, checkpoint, accounts):
    from .conftest import OUTSIDER

    keystore.save_public(
        Path(env["SWARMRL_KEYSTORE_DIR"]), "stranger", accounts[OUTSIDER].key, "pw"
    )
    stranger = accounts[OUTSIDER].address
    served = subprocess.run(
        [SWARMRL, "weights", "serve", str(checkpoint), "--key", "stranger",
         "--store", str(tmp_path / "store")],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert served.returncode == 1
    assert served.stderr.strip().splitlines() == [
        f"error: key 'stranger' ({stranger}) is not one of the deployment's recorders, so "
        "pullers would ignore its checkpoints: serve with a recorder's key (see "
        "docs/how-it-works.md, Weight broadcast), or pass --any-key if every puller passes "
        f"--trust {stranger}"
    ]
    assert not (tmp_path / "store").exists()


@pytest.mark.slow
def test_any_key_serves_to_pullers_that_trust_it(env, tmp_path, checkpoint, accounts):
    from .conftest import OUTSIDER

    keystore.save_public(
        Path(env["SWARMRL_KEYSTORE_DIR"]), "stranger", accounts[OUTSIDER].key, "pw"
    )
    origin = subprocess.Popen(
        [SWARMRL, "weights", "serve", str(checkpoint), "--key", "stranger", "--any-key",
         "--shard-mib", "1", "--store", str(tmp_path / "store")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        addr = origin.stdout.readline().strip()
        trusted = accounts[OUTSIDER].address
        out = _pull(env, "--bootstrap", addr, "--out", str(tmp_path / "p"), "--trust", trusted)
        assert out.returncode == 0, out.stderr
        assert Path(out.stdout.strip()).read_bytes() == checkpoint.read_bytes()
    finally:
        origin.terminate()
        origin.wait(timeout=20)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--max-gb", "1e80"),
        ("--max-gb", "inf"),
        ("--max-gb", "nan"),
        ("--timeout", "inf"),
        ("--timeout", "nan"),
        ("--timeout", "1e80"),
        ("--step", str(2**64)),
        ("--keep", str(10**80)),
    ],
)
def test_pull_refuses_numbers_out_of_range_as_a_usage_error(env, tmp_path, option, value):
    out = _pull(env, "--bootstrap", PEER, "--out", str(tmp_path / "pulled"), option, value,
                timeout=60)  # fmt: skip
    assert out.returncode == 2
    assert f"Invalid value for '{option}'" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "pulled").exists()


def test_pull_help_states_the_bounds():
    shown = subprocess.run(
        [SWARMRL, "weights", "pull", "--help"], capture_output=True, text=True, timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    ).stdout  # fmt: skip
    for bounds in ("0<=x<=18446744073709551615", "1<=x<=86400.0", "1<=x<=1000", "<=1000000.0"):
        assert bounds in shown


@pytest.mark.parametrize(
    ("args", "password", "message"),
    [
        (["--listen", "garbage"], "pw",
         "--listen 'garbage' is not a multiaddr like /ip4/127.0.0.1/tcp/0"),
        (["--listen", "/ip4/127.0.0.1/udp/1"], "pw", "is not a multiaddr like /ip4/"),
        (["--bootstrap", "garbage"], "pw",
         "--bootstrap 'garbage' is not a multiaddr with a /p2p/ peer id, like /ip4/"),
        (["--key", "../bad"], "pw", "key name '../bad' must be"),
        (["--key", "ghost"], "pw", "no key named 'ghost'"),
        (["--key", "orchestrator"], "wrong", "wrong password for key 'orchestrator'"),
    ],
)  # fmt: skip
def test_a_refused_pull_creates_nothing(env, tmp_path, args, password, message):
    keys = Path(env["SWARMRL_KEYSTORE_DIR"])
    before = sorted(keys.iterdir())
    out = _pull(
        {**env, "SWARMRL_PASSWORD": password},
        "--bootstrap", PEER, "--out", str(tmp_path / "pulled"), *args,
        timeout=60,
    )  # fmt: skip
    assert out.returncode == 1
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: ")
    assert message in line
    assert not (tmp_path / "pulled").exists()
    assert sorted(keys.iterdir()) == before  # no .peer-key beside the key


def test_a_pull_into_a_keystore_that_is_a_file_creates_nothing(env, tmp_path):
    (tmp_path / "not-keys").write_text("a file")
    out = _pull(
        env, "--bootstrap", PEER, "--out", str(tmp_path / "pulled"),
        "--key", "orchestrator", "--keystore-dir", str(tmp_path / "not-keys"),
        timeout=60,
    )  # fmt: skip
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith("error: ")
    assert not (tmp_path / "pulled").exists()
