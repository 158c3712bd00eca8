"""The trainer as a torch.distributed job of two CPU ranks (gloo), as the daemon runs and
supervises it with ``nproc_per_node = 2``: it trains from the spool; a rank SIGKILLed
while the job waits for rollouts stops the job, which says so in one sentence and,
restarted, resumes from the newest checkpoint with no group lost or used twice; and
the checkpoint the two ranks wrote resumes in one process, weights and optimizer
state whole.
"""

from __future__ import annotations

import itertools
import os
import signal
import time

import psutil
import pytest
import torch

from orchestrator.run_dir import RunDir
from orchestrator.service import trainer_process
from orchestrator.service.child import Child, ChildSpec
from orchestrator.service.trainer_process import TrainerProcessConfig
from orchestrator.tasks.generators import demo_tasks
from orchestrator.trainer.feed import Spool
from orchestrator.trainer.launch import TrainerLaunch
from orchestrator.trainer.loop import Trainer
from orchestrator.trainer.metrics import read_metrics
from orchestrator.trainer.recipe import GRPORecipe
from swarmrl.models.backend import SamplingParams
from swarmrl.models.directory import check_model, read_state_dict
from swarmrl.rollouts.generate import Provenance, generate_rollouts
from swarmrl.tasks.format import write_tasks

# Fresh interpreters importing torch and transformers, three times over: most of a minute.
pytestmark = pytest.mark.slow

TASKS = demo_tasks(8, seed=5)
RECIPE = GRPORecipe(
    steps=3,
    group_size=4,
    prompts_per_step=2,
    max_tokens=8,
    lr=1e-3,
    warmup_steps=0,
    async_level=10,
    micro_batch=2,
)
DEADLINE = 240.0  # seconds: generous for two cold interpreters on a loaded 2-core machine


def spool(backend, run_dir, counter: int, tasks) -> None:
    """One file of groups sampled with policy 0, rewards alternating so every group
    teaches."""
    turns = itertools.cycle([0.0, 1.0])
    records = generate_rollouts(
        backend,
        tasks,
        n=RECIPE.group_size,
        params=SamplingParams(max_tokens=RECIPE.max_tokens),
        provenance=Provenance(run="job", policy_step=0, node="0x" + "33" * 20),
        seed=counter,
        score=lambda task, text: next(turns),
        target_for=lambda _: 128,
    )
    Spool(RunDir(run_dir).spool).put("w0", counter, records)


def wait_for(condition, what: str) -> None:
    end = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"waited {DEADLINE:.0f} s for {what}")
        time.sleep(0.2)


def ranks_of(agent: psutil.Process) -> list[psutil.Process]:
    """The live trainer ranks the agent started (its children that run the trainer)."""
    found = []
    for p in agent.children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "spawn_main" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:  # gone between the listing and the look
            continue
    return found


@pytest.fixture(scope="module")
def job(tmp_path_factory, model_dirs, backend):
    """Runs the two-rank job to its last step with a SIGKILL in the middle; returns the
    run directory and the pids the ranks had before and after the kill."""
    root = tmp_path_factory.mktemp("job")
    folder = RunDir.of_orchestrator(root)
    run_dir = folder.root
    write_tasks(TASKS, root / "tasks.jsonl")
    config = TrainerProcessConfig(
        run_dir=run_dir,
        store_dir=folder.weights,
        model=model_dirs[0],
        tasks_file=root / "tasks.jsonl",
        run="job",
        recipe=RECIPE,
        device="cpu",
        serving="fp32",
        keep_checkpoints=2,
        launch=TrainerLaunch(nproc_per_node=2),
        data_dir=root,
        log_to_stderr=False,
        threads=2,
    )
    # Supervised as the daemon supervises it: a job that failed is started again.
    trainer = Child(
        ChildSpec(
            "trainer",
            trainer_process.main,
            config,
            data_dir=root,
            log_to_stderr=False,
            threads=2,
            finishes=True,
        )
    )
    spool(backend, run_dir, 0, TASKS[:2])  # step 1's groups, and no more yet
    trainer.start()
    try:
        wait_for(lambda: RunDir(run_dir).latest() == 1, "step 1")
        agent = psutil.Process(trainer.process.pid)
        wait_for(lambda: len(ranks_of(agent)) == 2, "both ranks")
        before = sorted(p.pid for p in ranks_of(agent))
        os.kill(before[-1], signal.SIGKILL)  # one rank, while rank 0 waits for rollouts
        wait_for(lambda: not trainer.process.is_alive(), "the job to stop")
        trainer.check()  # the daemon's supervision: the job again, from its checkpoint
        assert trainer.failure == "trainer rank 1 was killed by SIGKILL; the job stopped"
        agent = psutil.Process(trainer.process.pid)
        wait_for(lambda: len(ranks_of(agent)) == 2, "the restarted ranks")
        after = sorted(p.pid for p in ranks_of(agent))
        for counter, tasks in ((1, TASKS[2:4]), (2, TASKS[4:6])):
            spool(backend, run_dir, counter, tasks)
        trainer.process.join(DEADLINE)
        if trainer.process.exitcode is None:  # stuck: every rank's stack to stderr
            for rank in ranks_of(agent):
                rank.send_signal(signal.SIGUSR1)
            time.sleep(2)
        assert trainer.process.exitcode == 0, (root / "logs" / "trainer.log").read_text()[-3000:]
    finally:
        trainer.shutdown()
    return run_dir, before, after


def test_the_job_trains_every_group_once_across_a_killed_rank(job):
    run_dir, before, after = job
    assert len(before) == len(after) == 2
    assert not set(before) & set(after)
    assert RunDir(run_dir).steps() == [0, 1, 2, 3]
    rows = read_metrics(RunDir(run_dir).metrics)
    # Each step once, each on its two fresh groups: the restart from step 1 neither
    # trained step 1's groups again nor lost the groups spooled while it restarted.
    assert [(r["step"], r["kept_groups"], r["samples"]) for r in rows] == [
        (1, 2, 8),
        (2, 2, 8),
        (3, 2, 8),
    ]
    assert not Spool(RunDir(run_dir).spool).files()
    assert not Spool(RunDir(run_dir).spool).read_files()
    first, last = (
        read_state_dict(RunDir(run_dir).step(0)),
        read_state_dict(RunDir(run_dir).step(3)),
    )
    assert any(not torch.equal(first[k], last[k]) for k in first)
    # What nodes load: the tied output head written once, as the model declares it.
    assert first.keys() == last.keys()
    assert "lm_head.weight" not in last
    check_model(RunDir(run_dir).step(3))


def test_the_ranks_start_from_the_models_weights(job, model_dirs):
    """Rank 0 alone read the model's files and rank 1 received its shards: step 0, the
    policy both ranks' shards make before any step, is the files' weights bit for bit
    (fp32 serving: the masters)."""
    run_dir, _, _ = job
    files = read_state_dict(model_dirs[0])
    start = read_state_dict(RunDir(run_dir).step(0))
    assert start.keys() == files.keys()
    for name, value in files.items():
        assert torch.equal(start[name], value), name


def test_a_two_rank_checkpoint_resumes_in_one_process(job, model_dirs, backend):
    run_dir, _, _ = job
    recipe = GRPORecipe(**{**dict(RECIPE), "steps": 4})
    trainer = Trainer(run_dir, model_dirs[0], TASKS, recipe, run="job")
    assert trainer.step == 3
    published = read_state_dict(RunDir(run_dir).step(3))
    masters = trainer.model.state_dict()
    for name, value in published.items():
        assert torch.equal(masters[name], value), name  # fp32 serving: the masters
    moments = trainer.optimizer.state_dict()["state"]
    assert moments
    assert all(int(m["step"]) == 3 for m in moments.values())
    assert all(m["exp_avg_sq"].abs().sum() > 0 for m in moments.values())
    spool(backend, run_dir, 3, TASKS[6:8])
    trainer.train(should_stop=lambda: False, on_step=lambda report: None)
    assert trainer.step == 4
