"""The run folder's layout, spelled out once: run folders on disk (a run continued after
an upgrade, a trainer on another machine of a job) keep these names."""

from __future__ import annotations

from pathlib import Path

from orchestrator.run_dir import RunDir


def test_every_path_of_a_run_folder_has_its_name(tmp_path):
    run = RunDir(tmp_path)
    assert run.spool == tmp_path / "rollouts"
    assert run.checkpoints == tmp_path / "checkpoints"
    assert run.step(3) == tmp_path / "checkpoints" / "step_3"
    assert run.staging(3) == tmp_path / "checkpoints" / ".step_3.staging"
    assert run.damaged(3) == tmp_path / "checkpoints" / ".step_3.damaged"
    assert run.metrics == tmp_path / "metrics.jsonl"
    assert run.metrics_plot == tmp_path / "metrics.png"
    assert run.settings == tmp_path / "run.json"
    assert run.sampler_stats("w0") == tmp_path / "samplers" / "w0.json"


def test_an_orchestrators_run_folder_and_weight_store_are_in_its_data_folder():
    run = RunDir.of_orchestrator(Path("/data"))
    assert (run.root, run.weights) == (Path("/data/run"), Path("/data/weights"))
    assert run.step(1) == RunDir(Path("/data/run")).step(1)


def test_the_steps_are_the_whole_checkpoints_oldest_first(tmp_path):
    run = RunDir(tmp_path)
    assert (run.steps(), run.latest(), run.stagings()) == ([], None, [])
    for step in (10, 2, 0):
        run.step(step).mkdir(parents=True)
    run.staging(11).mkdir()
    run.damaged(12).mkdir()
    (run.checkpoints / "step_13").write_text("a file, not a checkpoint")
    assert (run.steps(), run.latest()) == ([0, 2, 10], 10)
    assert run.stagings() == [run.staging(11)]


def test_the_unread_rollouts_are_the_spools_files_not_yet_read(tmp_path):
    run = RunDir(tmp_path)
    assert run.unread_rollouts() == 0  # no spool yet
    (run.spool / "read").mkdir(parents=True)
    for name in ("n1-00000000.parquet", "n1-00000001.parquet", "read/n1-00000002.parquet"):
        (run.spool / name).write_bytes(b"")
    assert run.unread_rollouts() == 2
