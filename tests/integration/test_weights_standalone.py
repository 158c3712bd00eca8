"""`weights serve` and `pull` as libraries (swarmrl/weights/standalone.py), in this
process: a served checkpoint pulled over loopback libp2p, without typer."""

from __future__ import annotations

import queue
import threading

import numpy as np
import pytest

from swarmrl import keystore
from swarmrl.chain.deploy import write_deployment
from swarmrl.weights.standalone import StoppedError, pull_checkpoint, serve_checkpoint

from .conftest import OUTSIDER, RECORDER


@pytest.fixture
def files(tmp_path, deployment, accounts):
    """The recorder's and an outsider's keys, a password file and the deployment file."""
    keys = tmp_path / "keys"
    keystore.save_public(keys, "orchestrator", accounts[RECORDER].key, "pw")
    keystore.save_public(keys, "outsider", accounts[OUTSIDER].key, "pw")
    (tmp_path / "password").write_text("pw\n")
    write_deployment(tmp_path / "deployment.json", deployment)
    return {
        "keystore_dir": keys,
        "password_file": tmp_path / "password",
        "deployment": tmp_path / "deployment.json",
    }


def test_a_served_checkpoint_is_pulled_and_a_stop_ends_both(tmp_path, files):
    checkpoint = tmp_path / "model.safetensors"
    checkpoint.write_bytes(np.random.default_rng(3).integers(0, 256, 2_500_000, np.uint8).tobytes())
    addrs: queue.Queue[str] = queue.Queue()
    stop = threading.Event()
    serving = threading.Thread(
        target=serve_checkpoint,
        args=(checkpoint,),
        kwargs={
            **files,
            "key": "orchestrator",
            "on_serving": addrs.put,
            "step": 4,
            "shard_mib": 1,
            "store": tmp_path / "origin",
            "until_stopped": lambda: stop,
        },
        daemon=True,
    )
    serving.start()
    try:
        addr = addrs.get(timeout=60)
        assert addr.startswith("/ip4/127.0.0.1/tcp/")
        pulled = []
        version = pull_checkpoint(
            **files, bootstrap=[addr], out=tmp_path / "pulled", on_pulled=pulled.append
        )
        assert pulled == [version]
        assert version.manifest.step == 4
        assert version.path.read_bytes() == checkpoint.read_bytes()
        assert version.path.is_relative_to(tmp_path / "pulled")

        # Stopped before step 5 arrived: an error, and nothing is handed on.
        stopped = threading.Event()
        stopped.set()
        with pytest.raises(StoppedError):
            pull_checkpoint(
                **files,
                bootstrap=[addr],
                out=tmp_path / "never",
                step=5,
                on_pulled=pulled.append,
                until_stopped=lambda: stopped,
            )
        assert len(pulled) == 1
    finally:
        stop.set()
        serving.join(timeout=30)
    assert not serving.is_alive()


def test_serve_refuses_a_key_pullers_would_ignore_before_making_its_store(tmp_path, files):
    checkpoint = tmp_path / "model.safetensors"
    checkpoint.write_bytes(b"weights")
    with pytest.raises(ValueError, match="is not one of the deployment's recorders"):
        serve_checkpoint(
            checkpoint,
            **files,
            key="outsider",
            on_serving=lambda addr: None,
            store=tmp_path / "store",
        )
    with pytest.raises(ValueError, match=r"^no checkpoint at "):
        serve_checkpoint(
            tmp_path / "nope", **files, key="orchestrator", on_serving=lambda addr: None
        )
    assert not (tmp_path / "store").exists()
