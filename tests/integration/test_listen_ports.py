"""A listen port is one process's: real sockets and real libp2p hosts on loopback.

py-libp2p listens with SO_REUSEPORT, so without these checks a second host on a taken
port shared it with the first (the kernel split the connections between them), and a
host whose bind failed went on listening nowhere."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from libp2p.crypto.secp256k1 import create_new_key_pair

from simulation.local_swarm import free_port
from swarmrl import keystore
from swarmrl.chain.deploy import write_deployment
from swarmrl.p2p.host import Host
from swarmrl.p2p.ports import ListenError, check_free, check_sole_listener
from swarmrl.settings_toml import write_settings
from tests.model_fixtures import random_tiny_model

from .conftest import RECORDER, VALIDATOR

SWARMRL = str(Path(sys.executable).with_name("swarmrl"))
DATA = Path(__file__).parent.parent / "data"
ORCHESTRATOR = "/ip4/127.0.0.1/tcp/9/p2p/12D3KooWLyBuoa14i5VcrmMFAGQ8Xn3UPVLL2jwqDMNQQXaoVUS9"


def _listener(ip: str = "127.0.0.1", port: int = 0, *, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    if reuse_port:  # as py-libp2p's listener does
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind((ip, port))
    s.listen()
    return s


def _in_use(listen: str, port: int) -> str:
    return (
        f"cannot listen on {listen}: another process already listens on port {port} of "
        "127.0.0.1; choose another port (0: any free one), or stop that process"
    )


@pytest.mark.parametrize("reuse_port", [False, True], ids=["plain", "reuseport"])
def test_a_port_with_a_listener_is_refused_in_one_sentence(reuse_port):
    with _listener(reuse_port=reuse_port) as taken:
        port = taken.getsockname()[1]
        listen = f"/ip4/127.0.0.1/tcp/{port}"
        with pytest.raises(ListenError) as e:
            check_free(listen)
        assert str(e.value) == _in_use(listen, port)
        with pytest.raises(ListenError) as e:
            Host(create_new_key_pair(), listen=listen)
        assert str(e.value) == _in_use(listen, port)
    check_free(listen)  # once the listener is gone, the port is free again


def test_a_wildcard_listener_takes_the_port_on_loopback_too():
    with _listener("0.0.0.0") as taken:
        port = taken.getsockname()[1]
        with pytest.raises(ListenError, match="already listens on port"):
            check_free(f"/ip4/127.0.0.1/tcp/{port}")


def test_closed_connections_of_an_earlier_run_do_not_hold_the_port():
    with _listener(reuse_port=True) as server:  # an earlier run's libp2p listener
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server's side closes first: its port goes to TIME_WAIT
        client.recv(1)
        client.close()
    with pytest.raises(OSError, match="in use"), socket.socket() as plain:  # it is there
        plain.bind(("127.0.0.1", port))
    check_free(f"/ip4/127.0.0.1/tcp/{port}")


def test_an_address_that_cannot_be_had_is_one_sentence():
    with pytest.raises(ListenError) as e:
        check_free("/ip4/192.0.2.1/tcp/4001")  # TEST-NET-1: on no interface here
    assert str(e.value) == (
        "cannot listen on /ip4/192.0.2.1/tcp/4001: cannot assign requested address"
    )


def test_a_second_host_on_a_taken_port_is_refused_and_the_first_keeps_it():
    with Host(create_new_key_pair(), listen="/ip4/127.0.0.1/tcp/0") as first:
        port = int(first.addrs[0].split("/")[4])
        listen = f"/ip4/127.0.0.1/tcp/{port}"
        with pytest.raises(ListenError) as e:
            Host(create_new_key_pair(), listen=listen)
        assert str(e.value) == _in_use(listen, port)
        check_sole_listener(listen, port)  # the first alone listens there
        with Host(create_new_key_pair()) as dialer:
            assert dialer.connect(first.addrs[0]) == first.peer_id


def test_two_listeners_sharing_a_port_are_found_after_binding():
    """Two processes that both passed `check_free` at once and then bound with
    SO_REUSEPORT: the one that checks after binding sees the other."""
    with _listener(reuse_port=True) as mine:
        port = mine.getsockname()[1]
        listen = f"/ip4/127.0.0.1/tcp/{port}"
        check_sole_listener(listen, port)
        with _listener(reuse_port=True, port=port):
            with pytest.raises(ListenError) as e:
                check_sole_listener(listen, port)
            assert str(e.value) == _in_use(listen, port)
        # Any listener on that port on all addresses takes loopback's connections too.
        with _listener("0.0.0.0", port, reuse_port=True), pytest.raises(ListenError):
            check_sole_listener(listen, port)
        # Another loopback address is another endpoint: no overlap.
        with _listener("127.0.0.2", port, reuse_port=True):
            check_sole_listener(listen, port)


def _swarmrl(*args: object, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SWARMRL, *map(str, args)], capture_output=True, text=True, env=env, timeout=300
    )


def _refused(done: subprocess.CompletedProcess[str], listen: str, port: int) -> None:
    """Exit 1 with the one sentence, nothing else on stderr."""
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [f"error: {_in_use(listen, port)}"]


@pytest.fixture
def keys_env(tmp_path, deployment, accounts):
    keys = tmp_path / "keys"
    keystore.save_public(keys, "recorder", accounts[RECORDER].key, "pw")
    keystore.save_public(keys, "validator", accounts[VALIDATOR].key, "pw")
    write_deployment(tmp_path / "deployment.json", deployment)
    return {**os.environ, "SWARMRL_PASSWORD": "pw", "PYTHONUNBUFFERED": "1"}


def orchestrator_config(tmp_path: Path, listen: str, **settings: object) -> Path:
    """An orchestrator.toml on the keys and deployment of `keys_env` (in `tmp_path`), a
    random tiny model and the bundled tasks, its data in `tmp_path`/orchestrator."""
    return write_settings(
        tmp_path / "orchestrator.toml",
        {
            "model": random_tiny_model(tmp_path / "model", seed=1),
            "tasks": DATA / "intellect2_tasks.jsonl",
            "data_dir": tmp_path / "orchestrator",
            "deployment": tmp_path / "deployment.json",
            "keystore_dir": tmp_path / "keys",
            "listen": listen,
            "metrics_port": free_port(),
            **settings,
        },
    )


def test_orchestrator_run_on_a_taken_port_fails_before_anything_starts(tmp_path, keys_env):
    data = tmp_path / "orchestrator"
    with _listener() as taken:
        port = taken.getsockname()[1]
        listen = f"/ip4/127.0.0.1/tcp/{port}"
        config = orchestrator_config(tmp_path, listen)
        done = _swarmrl("orchestrator", "run", "--config", config, "--headless", env=keys_env)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"error: {_in_use(listen, port)}"
    log = (data / "logs" / "orchestrator.log").read_text()
    assert "started the" not in log  # no trainer, validator or recorder
    assert " up;" not in log
    assert "listening on" not in log


def test_node_run_on_a_taken_port_fails_before_it_unlocks_its_key(tmp_path):
    (tmp_path / "keys").mkdir()
    with _listener() as taken:
        port = taken.getsockname()[1]
        listen = f"/ip4/127.0.0.1/tcp/{port}"
        config = write_settings(
            tmp_path / "node.toml",
            {
                "data_dir": tmp_path / "node",
                "keystore_dir": tmp_path / "keys",  # no key in it: never unlocked
                "orchestrator": ORCHESTRATOR,
                "listen": listen,
            },
        )
        env = {**os.environ, "SWARMRL_PASSWORD": "unused"}
        done = _swarmrl("node", "run", "--config", config, "--headless", env=env)
    _refused(done, listen, port)
    assert not (tmp_path / "node" / "node.log").exists()


def test_weights_serve_on_a_taken_port_fails_and_creates_nothing(tmp_path):
    checkpoint = tmp_path / "model.safetensors"
    checkpoint.write_bytes(b"weights")
    with Host(create_new_key_pair()) as first:  # another swarmrl process, as libp2p binds
        port = int(first.addrs[0].split("/")[4])
        listen = f"/ip4/127.0.0.1/tcp/{port}"
        done = _swarmrl(
            "weights", "serve", checkpoint, "--key", "k", "--listen", listen,
            "--store", tmp_path / "store", env=dict(os.environ),
        )  # fmt: skip
        check_sole_listener(listen, port)
    _refused(done, listen, port)
    assert not (tmp_path / "store").exists()


def test_a_second_node_on_the_metrics_port_is_told_before_it_unlocks_its_key(tmp_path):
    """Two nodes on one machine need their own metrics_port (9465 by default)."""
    (tmp_path / "keys").mkdir()
    with _listener() as taken:
        port = taken.getsockname()[1]
        config = write_settings(
            tmp_path / "node2.toml",
            {
                "data_dir": tmp_path / "node2",
                "keystore_dir": tmp_path / "keys",  # no key in it: never unlocked
                "key": "node2",
                "orchestrator": ORCHESTRATOR,
                "metrics_port": port,
            },
        )
        env = {**os.environ, "SWARMRL_PASSWORD": "unused"}
        done = _swarmrl("node", "run", "--config", config, "--headless", env=env)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: cannot serve metrics on 127.0.0.1:{port} (address already in use); "
        "set metrics_port to a free port"
    ]
