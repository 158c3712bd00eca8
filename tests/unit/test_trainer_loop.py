"""The trainer loop: steps from spooled groups, a checkpoint per step, and a resume that
continues exactly where the last checkpoint left off."""

from __future__ import annotations

import itertools

import pytest
import torch

from orchestrator.run_dir import RunDir
from orchestrator.service.trainer_process import StepWriter
from orchestrator.tasks.generators import demo_tasks
from orchestrator.trainer import checkpoint as ckpt
from orchestrator.trainer.loop import Trainer
from orchestrator.trainer.metrics import read_metrics
from orchestrator.trainer.recipe import GRPORecipe
from swarmrl import shards
from swarmrl.models.backend import SamplingParams
from swarmrl.models.directory import read_state_dict
from swarmrl.rollouts.generate import Provenance, generate_rollouts

TASKS = demo_tasks(6, seed=4)
SETTINGS = GRPORecipe(
    steps=2, group_size=4, prompts_per_step=2, max_tokens=8, lr=1e-3, warmup_steps=0
)


def _spool_groups(backend, trainer: Trainer, counter: int, tasks, step: int) -> None:
    turns = itertools.cycle([0.0, 1.0])
    records = generate_rollouts(
        backend,
        tasks,
        n=SETTINGS.group_size,
        params=SamplingParams(max_tokens=SETTINGS.max_tokens),
        provenance=Provenance(run="t", policy_step=step, node="0x" + "22" * 20),
        seed=counter,
        score=lambda task, text: next(turns),
        target_for=lambda _: 128,
    )
    trainer.feed.spool.put("w0", counter, records)


def _stop_when_idle():
    return lambda: False


def test_steps_write_checkpoints_and_a_restart_continues(tmp_path, model_dirs, backend):
    run_dir = tmp_path / "run"
    trainer = Trainer(run_dir, model_dirs[0], TASKS, SETTINGS, run="t")
    assert RunDir(run_dir).steps() == [0]  # the policy samplers start from
    _spool_groups(backend, trainer, 0, TASKS[:4], step=0)
    _spool_groups(backend, trainer, 1, TASKS[4:6], step=0)
    reports = []
    # What the orchestrator's trainer process does after each step, on the real reports.
    writer = StepWriter(run_dir, resume_step=0, title="test run")

    def on_step(report):
        reports.append(report)
        writer(report)

    trainer.train(should_stop=lambda: False, on_step=on_step)
    writer.close()
    assert [r.step for r in reports] == [1, 2]
    assert all(r.applied and r.kept_groups == 2 for r in reports)
    assert reports[1].staleness_mean == 1.0  # step 2 trained on policy-0 samples
    # The mismatch, by staleness: none at step 1 (the sampler's policy is the trainer's,
    # up to float noise); at step 2 every token is one step old, and the policy moved.
    first, second = reports
    assert [first.tokens_by_staleness, second.tokens_by_staleness] == [
        [first.tokens, 0, 0],
        [0, second.tokens, 0],
    ]
    assert reports[0].mismatch_kl < 1e-6
    assert reports[1].mismatch_kl > 1e-4
    assert reports[1].mismatch_kl_by_staleness == [0.0, pytest.approx(second.mismatch_kl), 0.0]
    rows = read_metrics(RunDir(run_dir).metrics)
    assert [(row["step"], row["samples"]) for row in rows] == [(1, 8), (2, 8)]  # 2 groups of 4
    assert rows[0]["time"] <= rows[1]["time"]
    assert RunDir(run_dir).metrics_plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert RunDir(run_dir).steps() == [0, 1, 2]
    # Weights moved, and only the newest checkpoints keep optimizer state.
    first, last = (
        read_state_dict(RunDir(run_dir).step(0)),
        read_state_dict(RunDir(run_dir).step(2)),
    )
    assert any(not torch.equal(first[k], last[k]) for k in first)
    assert not ckpt.trainer_dir(run_dir, 0).exists()
    assert sorted(p.name for p in ckpt.trainer_dir(run_dir, 2).iterdir()) == [
        ckpt.DCP_DIR,
        ckpt.STATE_FILE,
    ]
    # The first file is used up and deleted; the second waits with both its groups.
    assert [p.name for p in trainer.feed.spool.read_files()] == ["w0-00000001.parquet"]

    resumed = Trainer(run_dir, model_dirs[0], TASKS, GRPORecipe(**dict(SETTINGS)), run="t")
    assert resumed.step == 2
    assert [(q.file, q.index) for q in resumed.feed.queue] == [
        ("w0-00000001.parquet", 0),
        ("w0-00000001.parquet", 1),
    ]
    for name, value in resumed.model.state_dict().items():
        assert torch.equal(value, trainer.model.state_dict()[name]), name
    saved = trainer.optimizer.state_dict()["state"]
    restored = resumed.optimizer.state_dict()["state"]
    assert saved.keys() == restored.keys()
    assert all(torch.equal(saved[k]["exp_avg"], restored[k]["exp_avg"]) for k in saved)


def test_a_bf16_run_publishes_the_policy_alone_in_bf16_and_resumes_from_fp32(
    tmp_path, model_dirs, backend
):
    run_dir = tmp_path / "run"
    trainer = Trainer(
        run_dir, model_dirs[0], TASKS, SETTINGS, run="t", serving="bf16", keep_checkpoints=1
    )
    _spool_groups(backend, trainer, 0, TASKS[:4], step=0)
    _spool_groups(backend, trainer, 1, TASKS[4:6], step=0)
    trainer.train(should_stop=lambda: False, on_step=lambda report: None)
    assert RunDir(run_dir).steps() == [0, 1, 2]
    published = RunDir(run_dir).step(2)
    # What the origin publishes: the policy's files, no optimizer state, nothing fp32.
    files = [p.name for p in shards.version_files(published)]
    assert {"model.safetensors", "config.json"} <= set(files)
    assert not [name for name in files if name.endswith((".pt", ".bin"))]
    served = read_state_dict(published)
    masters = trainer.model.state_dict()
    assert {t.dtype for t in served.values()} == {torch.bfloat16}
    for name, value in served.items():
        assert torch.equal(value, masters[name].to(torch.bfloat16)), name
    # keep_checkpoints=1: only the newest keeps what resuming needs.
    assert [s for s in (0, 1, 2) if ckpt.trainer_dir(run_dir, s).exists()] == [2]
    resumed = Trainer(run_dir, model_dirs[0], TASKS, SETTINGS, run="t", serving="bf16")
    assert resumed.step == 2
    for name, value in resumed.model.state_dict().items():
        assert torch.equal(value, masters[name]), name  # the fp32 masters, not the bf16


def test_a_stop_request_ends_the_loop_without_a_step(tmp_path, model_dirs):
    trainer = Trainer(tmp_path / "run", model_dirs[0], TASKS, SETTINGS, run="t")
    calls = itertools.count()
    trainer.train(should_stop=lambda: next(calls) > 3, on_step=pytest.fail)
    assert trainer.step == 0


def test_a_run_directory_continues_only_its_own_run(tmp_path, model_dirs):
    Trainer(tmp_path / "run", model_dirs[0], TASKS, SETTINGS, run="t")
    with pytest.raises(ValueError, match="holds run 't'"):
        Trainer(tmp_path / "run", model_dirs[0], TASKS, SETTINGS, run="another")


def test_a_half_written_checkpoint_is_never_loaded(tmp_path, model_dirs):
    run_dir = tmp_path / "run"
    Trainer(run_dir, model_dirs[0], TASKS, SETTINGS, run="t")
    staging = RunDir(run_dir).staging(1)
    staging.mkdir()
    (staging / "model.safetensors").write_bytes(b"half")
    resumed = Trainer(run_dir, model_dirs[0], TASKS, SETTINGS, run="t")
    assert resumed.step == 0
    assert not staging.exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("steps", 0),
        ("group_size", 1),
        ("lr", 0.0),
        ("advantage_scale", "max"),
        ("delta", 1.0),
        ("ratio_against", "old"),
        ("kl_coef", -1.0),
    ],
)
def test_bad_settings_are_refused_in_one_sentence(field, value):
    with pytest.raises(ValueError, match=field if field != "delta" else "delta"):
        GRPORecipe(**{field: value})


def test_the_kl_entropy_and_trainer_ratio_options_train(tmp_path, model_dirs, backend):
    options = {"steps": 1, "kl_coef": 0.1, "entropy_coef": 0.01, "ratio_against": "trainer"}
    settings = GRPORecipe(**{**dict(SETTINGS), **options})
    trainer = Trainer(tmp_path / "run", model_dirs[0], TASKS, settings, run="t")
    assert trainer.reference is not None
    assert not any(p.requires_grad for p in trainer.reference.parameters())
    _spool_groups(backend, trainer, 0, TASKS[:2], step=0)
    reports = []
    trainer.train(should_stop=lambda: False, on_step=reports.append)
    assert [(r.step, r.applied) for r in reports] == [(1, True)]
    assert reports[0].ratio_mean == pytest.approx(1.0, abs=1e-6)
    # The reference is the starting model and does not move with the policy.
    start = read_state_dict(model_dirs[0])
    reference, policy = trainer.reference.lm.state_dict(), trainer.model.state_dict()
    assert all(torch.equal(reference[k], v) for k, v in start.items())
    assert any(not torch.equal(policy[k], v) for k, v in start.items())
