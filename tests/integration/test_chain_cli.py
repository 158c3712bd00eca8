"""`swarmrl chain up|status|down` as a user runs them: separate processes."""

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swarmrl import keystore
from swarmrl.chain.anvil import connect, is_anvil_pid, pid_running
from swarmrl.chain.deploy import BURN_TREASURY, load_deployment, write_deployment
from swarmrl.locks import exclusive_use

from .conftest import ADMIN, VALIDATOR

SWARMRL = Path(sys.executable).with_name("swarmrl")


def run(*args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SWARMRL, "chain", *args], capture_output=True, text=True, timeout=timeout, **kwargs
    )


def one_error(done: subprocess.CompletedProcess) -> str:
    """The single line a refused command printed on stderr."""
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.slow
def test_up_status_down(tmp_path):
    state = str(tmp_path / "chain")
    up = run("up", "--state-dir", state, "--invalidation-window", "60")
    try:
        assert up.returncode == 0, up.stderr
        assert "chain up: http://127.0.0.1:" in up.stdout
        deployment = load_deployment(tmp_path / "chain" / "deployment.json")
        assert f"deployment: {tmp_path / 'chain' / 'deployment.json'}" in up.stdout
        assert deployment.chain_id == 31337
        assert deployment.params.invalidation_window == 60
        pid = int((tmp_path / "chain" / "anvil.pid").read_text())
        w3 = connect(deployment.rpc_url)
        assert w3.eth.get_code(deployment.contracts.compute_pool)

        # Idle, the local chain still mines, so its latest block's clock keeps up with the
        # wall clock (contracts' views read it).
        deployed = w3.eth.get_block("latest")["timestamp"]
        _wait_until(
            lambda: w3.eth.get_block("latest")["timestamp"] > deployed, "a later block while idle"
        )

        # `advance` moves it at once, as the demo does to end an invalidation window.
        env = {**os.environ, "SWARMRL_CHAIN_DIR": state}
        before = w3.eth.get_block("latest")["timestamp"]
        advanced = run("advance", "600", env=env)
        assert advanced.returncode == 0, advanced.stderr
        now = w3.eth.get_block("latest")["timestamp"]
        assert now >= before + 600
        assert advanced.stdout.startswith("moved the chain's clock 10 min ahead: it reads ")

        status = run("status", "--state-dir", state, "--json")
        assert status.returncode == 0, status.stderr
        info = json.loads(status.stdout)
        assert info["pid"] == pid
        assert info["rpc_url"] == deployment.rpc_url
        assert info["block"] > 0

        again = run("up", "--state-dir", state)
        assert again.returncode == 1
        assert "already running" in again.stderr
        assert len(again.stderr.strip().splitlines()) == 1
    finally:
        down = run("down", "--state-dir", state)
    assert down.returncode == 0
    assert down.stdout.strip() == f"chain stopped (pid {pid})"
    # anvil was orphaned when `up` exited, so reaping it is init's job: it must be dead
    # (gone, or a zombie until init collects it), never still running.
    assert not pid_running(pid)
    assert not is_anvil_pid(pid)
    assert not (tmp_path / "chain" / "anvil.pid").exists()

    status = run("status", "--state-dir", state)
    assert status.returncode == 1
    assert "no chain running" in status.stderr
    assert run("down", "--state-dir", state).stdout.startswith("no chain running")


def _wait_until(condition, what: str, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {limit:.0f} s"
        time.sleep(0.1)


def test_advance_refuses_a_chain_that_is_not_a_local_anvil(tmp_path, deployment, anvil):
    remote = deployment.model_copy(update={"rpc_url": "https://sepolia.base.org"})
    write_deployment(tmp_path / "remote.json", remote)
    refused = one_error(run("advance", "60", "--deployment", str(tmp_path / "remote.json")))
    assert refused == (
        "error: the chain at https://sepolia.base.org is not an anvil on this machine; "
        "only a local chain's clock can be moved"
    )
    # The command line is checked before any chain: exit 2.
    assert run("advance", "0", "--deployment", str(tmp_path / "remote.json")).returncode == 2


def test_chain_up_defaults_are_the_protocol_s():
    from swarmrl.chain.cli import DEV_INVALIDATION_WINDOW, DEV_UNBONDING_PERIOD
    from swarmrl.chain.deploy import ProtocolParams

    defaults = ProtocolParams()
    assert defaults.invalidation_window == DEV_INVALIDATION_WINDOW
    assert defaults.unbonding_period == DEV_UNBONDING_PERIOD


def test_down_ignores_a_stale_pid_file(tmp_path):
    (tmp_path / "anvil.pid").write_text(f"{os.getpid()}\n")  # alive, but not anvil
    down = run("down", "--state-dir", str(tmp_path))
    assert down.returncode == 0
    assert "no chain running" in down.stdout
    assert not (tmp_path / "anvil.pid").exists()


@pytest.mark.parametrize(
    "content", ["9" * 40, "99999999999", "-5", "abc", "\uff11\uff12\uff13", ""]
)
def test_a_damaged_pid_file_is_a_stale_one(tmp_path, content):
    (tmp_path / "anvil.pid").write_text(content + "\n")
    status = run("status", "--state-dir", str(tmp_path))
    assert one_error(status) == f"error: no chain running from {tmp_path}: run `swarmrl chain up`"
    down = run("down", "--state-dir", str(tmp_path))
    assert down.returncode == 0, down.stderr
    assert down.stdout.strip() == f"no chain running from {tmp_path}"
    assert list(tmp_path.iterdir()) == []  # the stale pid file is gone, no lock file left


def test_a_pid_file_that_is_a_folder_is_one_sentence(tmp_path):
    (tmp_path / "anvil.pid").mkdir()
    message = one_error(run("down", "--state-dir", str(tmp_path)))
    assert message == f"error: cannot read the pid file {tmp_path / 'anvil.pid'}: is a directory"


@pytest.mark.parametrize("below", ["", "sub"])
def test_down_refuses_a_state_folder_that_is_a_file_like_up(tmp_path, below):
    (tmp_path / "file").write_text("not a folder")
    state = tmp_path / "file" / below if below else tmp_path / "file"
    for command in ("up", "down"):
        message = one_error(run(command, "--state-dir", str(state), timeout=60))
        where = f"under {tmp_path / 'file'}, which is " if below else ""
        assert message == f"error: the state folder {state} is {where}a file"
    assert (tmp_path / "file").read_text() == "not a folder"


def test_chain_up_refuses_at_once_while_another_holds_the_state_folder(tmp_path):
    state = tmp_path / "chain"
    state.mkdir()
    with exclusive_use(state / "chain.lock", state, "swarmrl chain up"):
        up = run("up", "--state-dir", str(state), timeout=60)
        down = run("down", "--state-dir", str(state), timeout=60)
    busy = f"error: {state} is in use by `swarmrl chain up` (pid {os.getpid()}); wait for it"
    assert one_error(up).startswith(busy)
    assert one_error(down).startswith(busy)
    assert not (state / "anvil.pid").exists()  # no anvil was started
    assert not (state / "deployment.json").exists()


@pytest.fixture
def deployer(tmp_path, accounts):
    """The admin's key in a keystore folder, and the environment that unlocks it."""
    keystore.save_public(tmp_path / "keys", "deployer", accounts[ADMIN].key, "pw")
    env = {**os.environ, "SWARMRL_KEYSTORE_DIR": str(tmp_path / "keys"), "SWARMRL_PASSWORD": "pw"}
    return env


def deploy_args(rpc_url: str, out: Path, *extra: str) -> list[str]:
    return ["deploy", "--rpc-url", rpc_url, "--key", "deployer", "--out", str(out), *extra]


@pytest.mark.slow
def test_deploy_to_another_chain_from_a_keystore(tmp_path, accounts, deployer):
    from swarmrl.chain.anvil import Anvil

    out = tmp_path / "sepolia.json"
    with Anvil.start(chain_id=84532) as chain:
        args = deploy_args(chain.rpc_url, out, "--run", "r1")
        args += ["--validator", accounts[VALIDATOR].address, "--quorum", "1"]
        done = run(*args, env=deployer)
        assert done.returncode == 0, done.stderr
        assert "deployed on chain 84532" in done.stdout
        deployment = load_deployment(out)
        assert deployment.chain_id == 84532
        assert deployment.treasury == BURN_TREASURY  # never the deployer unless named
        assert deployment.validators == [accounts[VALIDATOR].address]

        again = one_error(run(*args, env=deployer))
        assert again == f"error: {out} exists; pass --force to overwrite it"
        wrong = one_error(run(*args, "--force", env={**deployer, "SWARMRL_PASSWORD": "no"}))
        assert wrong == "error: wrong password for key 'deployer'"
        typo = one_error(run(*args, "--force", "--recorder", "0x1234", env=deployer))
        assert typo == "error: '0x1234' is not an Ethereum address"


VALIDATOR_ADDRESS = "0x" + "11" * 20


@pytest.mark.parametrize(
    ("extra", "sentence"),
    [
        (
            ["--validator", VALIDATOR_ADDRESS, "--quorum", "2"],
            "error: --quorum 2 needs at least 2 distinct --validator addresses",
        ),
        (  # one validator written twice, in two letter cases, is still one
            ["--validator", "0x" + "ab" * 20, "--validator", "0x" + "AB" * 20, "--quorum", "2"],
            "error: --quorum 2 needs at least 2 distinct --validator addresses",
        ),
        (
            ["--validator", VALIDATOR_ADDRESS, "--quorum", str(10**30)],
            f"error: --quorum {10**30} needs at least {10**30} distinct --validator addresses",
        ),
        (
            ["--invalidation-window", "7200", "--unbonding-period", "3600"],
            "error: the invalidation window (7200 s) must not be longer than the unbonding "
            "period (3600 s)",
        ),
        (
            ["--slash-penalty", "101", "--min-stake", "100"],
            "error: the slash penalty must not be more than the minimum stake per node",
        ),
        (["--min-stake", str(10**60)], f"error: --min-stake {10**60} is above 10^59 tokens"),
        (
            ["--reward-per-unit-wei", str(2**256)],
            f"error: --reward-per-unit-wei {2**256} is above 10^59 tokens",
        ),
        (
            ["--run", "0x1234"],
            "error: run '0x1234' starts with 0x but is not a 32-byte run id (0x and 64 hex "
            "digits); give a run name without 0x instead",
        ),
        (["--run", " "], "error: the run name is empty"),
        (
            ["--validator", VALIDATOR_ADDRESS, "--treasury", "bank"],
            "error: 'bank' is not an Ethereum address",
        ),
        (
            ["--validator", VALIDATOR_ADDRESS, "--rpc-url", "sepolia.base.org"],
            "error: 'sepolia.base.org' is not an RPC URL: write it as http://HOST:PORT or "
            "https://HOST/...",
        ),
    ],
)
def test_deploy_checks_its_parameters_before_any_transaction(tmp_path, extra, sentence):
    """The key does not exist and nothing answers on the URL: a refusal proves that the
    check came before the key, the chain and the first transaction."""
    out = tmp_path / "deployment.json"
    done = run(*deploy_args("http://127.0.0.1:9", out), *extra)
    assert one_error(done) == sentence
    assert not out.exists()


def test_deploy_refuses_a_window_or_period_outside_the_contracts_bounds(tmp_path):
    args = deploy_args("http://127.0.0.1:9", tmp_path / "o")
    assert run(*args, "--invalidation-window", "0").returncode == 2
    assert run(*args, "--unbonding-period", str(31 * 24 * 3600)).returncode == 2
    assert run(*args, "--quorum", "0").returncode == 2


def test_deploy_help_states_the_bounds():
    shown = " ".join(run("deploy", "--help").stdout.split())
    for bound in (
        "at most the number of validators",
        "Stake per node, in whole tokens: 0 to 10^59.",
        "Seconds, 1 minute to 30 days.",
        "Seconds, 1 minute to the unbonding period.",
        "Token wei per work unit: 0 to 10^59 tokens' worth.",
        "Tokens slashed per slash: 0 to the stake per node.",
    ):
        assert bound in shown


@pytest.mark.parametrize(
    ("out", "sentence"),
    [
        (".", "error: . is a directory; give a file name to write"),
        ("file/new/d.json", "error: cannot write file/new/d.json: {tmp}/file is not a folder"),
        ("/proc/d.json", "error: cannot write /proc/d.json: the folder /proc is not writable"),
    ],
)
def test_deploy_checks_out_before_it_deploys(tmp_path, deployer, out, sentence):
    (tmp_path / "file").write_text("mine")
    done = run(
        *deploy_args("http://127.0.0.1:9", Path(out), "--validator", VALIDATOR_ADDRESS),
        env=deployer,
        cwd=tmp_path,
    )
    assert one_error(done) == sentence.format(tmp=tmp_path)


def test_a_paid_deployment_whose_file_cannot_be_written_is_printed(tmp_path, w3, deployer):
    """The file-size limit lets the check pass (an empty probe file) but not the write,
    as a disk that fills up during the deployment would."""
    from swarmrl.chain.deploy import Deployment

    out = tmp_path / "deployment.json"
    rpc_url = w3.provider.endpoint_uri

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (256, 256))

    done = run(
        *deploy_args(rpc_url, out, "--validator", VALIDATOR_ADDRESS),
        env=deployer,
        preexec_fn=small_files,
    )
    message = one_error(done)
    assert message.startswith(f"error: the protocol is deployed but {out} could not be written")
    assert message.endswith("the deployment file is printed on stdout instead: save it")
    printed = Deployment.model_validate_json(done.stdout)
    assert w3.eth.get_code(printed.contracts.compute_pool)
    assert not out.exists()
    assert list(tmp_path.glob(".deployment.json*")) == []
