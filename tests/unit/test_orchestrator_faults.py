"""Faults that lost work or wedged the orchestrator (issue 24, section 3), each on real
parts: a real SQLite ledger deleted, emptied or with a page overwritten by zeros; real
checkpoints with a file zeroed or all of them deleted while the weight store has
announced a later step; a chain that does not answer. Each ends in one sentence and a
stop, never in a new empty ledger, a restart from below what the swarm has, or a
traceback; the last tests start `swarmrl orchestrator run` itself on some of them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from eth_account import Account
from transformers import AutoModelForCausalLM

from orchestrator.run_dir import RunDir
from orchestrator.service.ledger import Ledger
from orchestrator.service.ledger.connection import LedgerDamagedError
from orchestrator.service.ledger.home import GENESIS_FILE, ledger_path, open_for_daemon
from orchestrator.tasks.generators import demo_tasks
from orchestrator.trainer import checkpoint as ckpt
from orchestrator.trainer.batch import TokenScorer
from orchestrator.trainer.loop import Trainer
from orchestrator.trainer.optim import build_optimizer
from orchestrator.trainer.recipe import GRPORecipe
from simulation.local_swarm import free_port
from swarmrl import keystore, shards
from swarmrl.chain.deploy import (
    ContractAddresses,
    Deployment,
    ProtocolParams,
    write_deployment,
)
from swarmrl.eip712 import swarm_domain
from swarmrl.models.directory import load_tokenizer
from swarmrl.settings_toml import write_settings
from swarmrl.tasks import write_tasks
from swarmrl.weights.peer_records import Announcement
from swarmrl.weights.store import WeightStore, newest_announced_step
from tests.ledger_faults import RUN, run_ledger, zero_a_page_of_submissions

POOL = "0x" + "12" * 20
RECORDER = Account.from_key(b"\x01" * 32)
VALIDATOR = Account.from_key(b"\x02" * 32)
DEAD_RPC = "http://127.0.0.1:9"  # the discard port: nothing answers there
SWARMRL = Path(sys.executable).with_name("swarmrl")
TASKS = demo_tasks(4, seed=0)


# ---- the ledger ---------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["deleted", "emptied"])
def test_a_data_dir_that_held_a_run_refuses_to_start_without_its_ledger(tmp_path, fault):
    data = tmp_path / "data"
    path = run_ledger(data, submissions=3)
    assert (data / GENESIS_FILE).is_file()
    if fault == "deleted":
        path.unlink()
    else:
        path.write_bytes(b"")
    with pytest.raises(ValueError, match="has held a run") as caught:
        open_for_daemon(data, RUN)
    gone = "missing" if fault == "deleted" else "empty"
    assert str(caught.value) == (
        f"{data} has held a run, but its ledger {path} is {gone}; restore it from a backup "
        "(a new ledger would lose every submission the nodes hold receipts for), or delete "
        f"{data / GENESIS_FILE} to begin a new run here"
    )
    # Nothing was made in its place.
    assert path.exists() == (fault == "emptied")
    assert not path.exists() or path.stat().st_size == 0


def test_a_ledger_made_in_place_of_the_runs_is_refused(tmp_path):
    data = tmp_path / "data"
    path = run_ledger(data, submissions=3)
    path.unlink()
    Ledger(path).close()  # what any other opener of the deleted file would make
    with pytest.raises(ValueError, match="is not the ledger of the run") as caught:
        open_for_daemon(data, RUN)
    assert str(caught.value) == (
        f"{path} is not the ledger of the run {data} has held (its genesis is not the one "
        f"{data / GENESIS_FILE} records); restore that ledger from a backup, or delete "
        f"{data / GENESIS_FILE} to begin a new run here"
    )


def test_the_daemons_children_never_create_a_ledger(tmp_path):
    """A ledger deleted under a running daemon is not recreated empty by a restarted
    validator or recorder (which would split the run's record in two files)."""
    path = ledger_path(tmp_path / "data")
    with pytest.raises(ValueError, match="is gone; only the daemon creates one"):
        Ledger(path, create=False)
    assert not path.exists()
    run_ledger(tmp_path / "data", submissions=1)
    with Ledger(path, create=False) as ledger:
        assert len(ledger.submissions.all()) == 1


def test_a_fresh_data_dir_and_one_from_before_the_mark_start(tmp_path):
    # A fresh data dir gets a new ledger and its mark; so does an empty ledger file there.
    fresh, emptied = tmp_path / "fresh", tmp_path / "emptied"
    emptied.mkdir()
    ledger_path(emptied).write_bytes(b"")
    for data in (fresh, emptied):
        with open_for_daemon(data, RUN) as ledger:
            genesis = ledger.epochs.genesis()
        assert float((data / GENESIS_FILE).read_text()) == genesis
    # A data dir that ran before the mark existed keeps its ledger and is marked now.
    older = tmp_path / "older"
    path = run_ledger(older, submissions=2)
    (older / GENESIS_FILE).unlink()
    with open_for_daemon(older, RUN) as ledger:
        assert len(ledger.submissions.all()) == 2
    with open_for_daemon(older, RUN) as ledger:  # and the mark names it
        assert float((older / GENESIS_FILE).read_text()) == ledger.epochs.genesis()
    assert path.is_file()


def test_a_damaged_ledger_is_refused_at_start_and_one_sentence_when_met_later(tmp_path):
    data = tmp_path / "data"
    path = run_ledger(data, submissions=40)
    zero_a_page_of_submissions(path)
    with pytest.raises(LedgerDamagedError) as caught:
        open_for_daemon(data, RUN)
    found = str(caught.value)
    assert found.startswith(f"the ledger {path} is damaged (SQLite's quick_check: Page ")
    assert "\n" not in found
    assert found.endswith(
        f"); restore it from a backup, or keep what SQLite can still read with "
        f"`sqlite3 {path} .recover`"
    )
    # Opened without the check (as the validator and recorder do), the damage is met at
    # the first query that reads the page, and said the same way.
    with Ledger(path) as ledger, pytest.raises(LedgerDamagedError) as caught:
        ledger.submissions.all()
    assert str(caught.value) == (
        f"the ledger {path} is damaged (database disk image is malformed); restore it from "
        f"a backup, or keep what SQLite can still read with `sqlite3 {path} .recover`"
    )


# ---- checkpoints --------------------------------------------------------------------


def write_checkpoints(run_dir: Path, model_dir: Path, steps: int) -> None:
    """Checkpoints 0 .. steps-1 as the trainer writes them (the newest two with their
    trainer state), of the model in ``model_dir``."""
    model = TokenScorer(AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True))
    tokenizer = load_tokenizer(model_dir)
    optimizer = build_optimizer(model, lr=1e-3, weight_decay=0.0)
    state = {"rng": torch.get_rng_state(), "run": RUN}
    for step in range(steps):
        ckpt.save_checkpoint(run_dir, step, model, optimizer, tokenizer, state)


def announce(store: Path, step: int) -> None:
    """What the daemon's publisher leaves in its weight store once it gave the swarm
    step ``step``: a signed announcement of a file served in place."""
    weights = store.parent / f"published-{step}.bin"
    weights.write_bytes(b"w" * 64)
    manifest = shards.build_manifest(weights, model=RUN, step=step)
    announcement = Announcement.sign(RECORDER, manifest, swarm_domain(31337, POOL))
    WeightStore(store).add_origin(weights, manifest, announcement).close()


def zero(path: Path) -> None:
    path.write_bytes(bytes(path.stat().st_size))


@pytest.fixture
def run_dir(tmp_path, model_dirs):
    run_dir = tmp_path / "run"
    write_checkpoints(run_dir, model_dirs[0], steps=3)
    return run_dir


def test_the_store_says_which_step_the_swarm_has(tmp_path):
    store = tmp_path / "weights"
    assert newest_announced_step(store) is None
    for step in (3, 5, 4):
        announce(store, step)
    assert newest_announced_step(store) == 5


def test_a_damaged_newest_checkpoint_nobody_has_is_moved_aside(run_dir):
    zero(RunDir(run_dir).step(2) / "model.safetensors")
    resume = ckpt.resume_point(run_dir, published=1)
    assert resume is not None
    assert resume.step == 1
    assert resume.state["run"] == RUN
    # Step 2 can be trained again; the damaged files are kept apart, never read.
    assert RunDir(run_dir).steps() == [0, 1]
    assert (RunDir(run_dir).damaged(2) / "model.safetensors").is_file()


INDEX = f"{ckpt.TRAINER_DIR}/{ckpt.DCP_DIR}/.metadata"  # DCP's index of the shards


@pytest.mark.parametrize(
    "file", ["model.safetensors", f"{ckpt.TRAINER_DIR}/{ckpt.STATE_FILE}", INDEX]
)
def test_a_damaged_checkpoint_the_swarm_has_stops_the_trainer(run_dir, model_dirs, file):
    zeroed = RunDir(run_dir).step(2) / file
    zero(zeroed)
    recipe = GRPORecipe(steps=4, group_size=2, prompts_per_step=1, max_tokens=8)
    with pytest.raises(ValueError, match="cannot resume from checkpoint 2") as caught:
        Trainer(run_dir, model_dirs[0], TASKS, recipe, run=RUN, published=2)
    said = str(caught.value)
    why = {
        "model.safetensors": f"{zeroed} is not a whole safetensors file (",
        INDEX: f"{zeroed.parent} holds no readable index of the master weights and optimizer state",
    }.get(file, f"{zeroed} is not a whole trainer state: torch cannot load it")
    assert said.startswith(f"cannot resume from checkpoint 2: {why}")
    assert said.endswith(
        "; the swarm has this step already, so training cannot go back before it: restore "
        f"{RunDir(run_dir).checkpoints} from a backup"
    )
    assert "\n" not in said
    assert RunDir(run_dir).steps() == [0, 1, 2]  # nothing moved, nothing written


def test_the_trainer_never_starts_over_below_what_the_swarm_has(run_dir):
    root = RunDir(run_dir).checkpoints
    with pytest.raises(ValueError, match="the newest checkpoint") as caught:
        ckpt.resume_point(run_dir, published=5)
    assert str(caught.value) == (
        f"the newest checkpoint in {root} is step 2, but the swarm has policy step 5 "
        "already; restore the checkpoints from a backup (training again from there would "
        "publish other policies under steps the nodes hold)"
    )
    shutil.rmtree(root)
    with pytest.raises(ValueError, match="holds no checkpoint") as caught:
        ckpt.resume_point(run_dir, published=5)
    assert str(caught.value) == (
        f"{root} holds no checkpoint, but the swarm has policy step 5 already; restore the "
        "checkpoints from a backup (training again from step 0 would publish other "
        "policies under steps the nodes hold)"
    )
    assert ckpt.resume_point(run_dir, published=None) is None  # a run that published nothing


# ---- the daemon, started as its operator starts it ----------------------------------


@pytest.fixture
def orchestrator(tmp_path, model_dirs):
    """An orchestrator's config (its chain at DEAD_RPC) and its data dir, not run yet."""
    write_tasks(TASKS, tmp_path / "tasks.jsonl")
    keystore.save_public(tmp_path / "keys", "recorder", RECORDER.key, "pw")
    keystore.save_public(tmp_path / "keys", "validator", VALIDATOR.key, "pw")
    write_deployment(
        tmp_path / "deployment.json",
        Deployment(
            chain_id=31337,
            rpc_url=DEAD_RPC,
            run_id=RUN,
            deploy_block=0,
            admin=POOL,
            treasury=POOL,
            recorders=[RECORDER.address],
            validators=[VALIDATOR.address],
            contracts=ContractAddresses(
                stake_token=POOL, provider_registry=POOL, stake_manager=POOL, compute_pool=POOL
            ),
            params=ProtocolParams(),
        ),
    )
    config = write_settings(
        tmp_path / "orchestrator.toml",
        {
            "model": model_dirs[0],
            "tasks": tmp_path / "tasks.jsonl",
            "data_dir": tmp_path / "data",
            "deployment": tmp_path / "deployment.json",
            "keystore_dir": tmp_path / "keys",
            "listen": f"/ip4/127.0.0.1/tcp/{free_port()}",
            "metrics_port": free_port(),
        },
    )
    return config, tmp_path / "data"


def daemon_refusal(config: Path) -> str:
    """`swarmrl orchestrator run`, which must stop with exit 1 and one sentence, no
    traceback; the sentence."""
    env = {**os.environ, "SWARMRL_PASSWORD": "pw"}
    done = subprocess.run(
        [str(SWARMRL), "orchestrator", "run", "--headless", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done.stderr.strip().splitlines()[-1].removeprefix("error: ")


# One fault of each kind: the others of a kind take the same check, tested above.
@pytest.mark.parametrize("fault", ["ledger deleted", "checkpoints deleted"])
def test_orchestrator_run_refuses_a_data_dir_it_cannot_carry_on_from(
    orchestrator, model_dirs, fault
):
    config, data = orchestrator
    path = run_ledger(data, submissions=3)
    folder = RunDir.of_orchestrator(data)
    write_checkpoints(folder.root, model_dirs[0], steps=3)
    announce(folder.weights, 2)
    root = folder.checkpoints
    if fault == "ledger deleted":
        path.unlink()
        says = f"{data} has held a run, but its ledger {path} is missing;"
    else:
        shutil.rmtree(root)
        says = f"{root} holds no checkpoint, but the swarm has policy step 2 already;"
    assert daemon_refusal(config).startswith(says)
    assert "started the" not in (data / "logs" / "orchestrator.log").read_text()
    # Nothing was made in place of what is missing.
    assert not path.exists() if fault == "ledger deleted" else not root.exists()


def test_orchestrator_run_names_a_chain_that_does_not_answer(orchestrator):
    config, data = orchestrator
    said = daemon_refusal(config)
    assert said == (
        f"the chain at {DEAD_RPC} does not answer: the RPC endpoint did not answer eth_chainId "
        "after 6 attempts (connection refused or reset); start it, or set rpc_url in "
        f"{config.parent / 'deployment.json'} to one that answers"
    )
    assert "started the" not in (data / "logs" / "orchestrator.log").read_text()
