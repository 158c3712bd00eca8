"""Settings every test shares."""

import os
import signal
from pathlib import Path

import pytest
from filelock import FileLock
from hypothesis import HealthCheck, settings
from xdist.remote import Producer
from xdist.scheduler import Scheduling

from tests import workers

# Before anything imports torch: torch and rayon size their pools from this share.
workers.take_my_share_of_the_cores()

# A shell starts a background job (`make test &`, a CI runner's script) with SIGINT
# ignored, and an ignored signal stays ignored in every process started below it: the
# tests that press Ctrl-C on a command would find it deaf. Handled here, it reaches
# every command the tests start as it does at a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Generation speed and per-example deadlines measure the machine, not the code:
# on a loaded 2-core CI box they fail healthy tests. CI also runs derandomized,
# so a red run reproduces exactly.
settings.register_profile(
    "swarmrl",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=bool(os.environ.get("CI")),
)
settings.load_profile("swarmrl")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return workers.auto_num_workers()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    xdist_worker = "PYTEST_XDIST_WORKER" in os.environ
    run = workers.run_folder(config._tmp_path_factory) if xdist_worker else None
    workers.order_for_the_default_model(items, run)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> Scheduling | None:
    if config.getvalue("dist") != "loadfile" or not workers.ModelAwareScheduling.fits_xdist():
        return None  # xdist's own
    # The workers' run folder is the controller's temporary folder.
    return workers.ModelAwareScheduling(config, config._tmp_path_factory.getbasetemp(), log)


@pytest.fixture(scope="session")
def default_model(tmp_path_factory):
    """The embedded default policy, as `swarmrl model init` writes it (the shipped
    build's copy), once per run in the run's folder: no test touches the shipped one."""
    from orchestrator.pretrain import build_default_model

    root = workers.run_folder(tmp_path_factory)
    with FileLock(root / "default-model.lock"):
        model = build_default_model(workers.default_model_dir(root))
        workers.mark_ready(root)
        return model


def held_out_reward(model, tasks) -> float:
    """The held-out evaluation every learning claim uses: `swarmrl eval`, 8 samples of
    each task at temperature 1, fixed seed."""
    import json
    import subprocess
    import sys

    swarmrl = Path(sys.executable).with_name("swarmrl")
    args = ["eval", "--model", model, "--tasks", tasks, "--n", 8, "--max-tokens", 128, "--json"]
    out = subprocess.run(
        [str(swarmrl), *map(str, args)], capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["mean_reward"]


@pytest.fixture(scope="session")
def held_out(tmp_path_factory):
    """96 demo tasks from a seed no training set uses."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("held-out") / "held-out.jsonl"
    swarmrl = Path(sys.executable).with_name("swarmrl")
    args = ["tasks", "generate", "--n", "96", "--seed", "12345", "--out", str(out)]
    subprocess.run([str(swarmrl), *args], check=True, capture_output=True, timeout=300)
    return out


@pytest.fixture(scope="session")
def default_model_held_out(default_model, held_out):
    """The default model's held-out reward, measured once for every learning test."""
    return held_out_reward(default_model, held_out)
