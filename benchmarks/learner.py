"""The learner: `swarmrl train local` against TRL's GRPOTrainer, from the same weights.

Both train the embedded default model on the same demo tasks for the same wall
time with the settings of ``LearnerSettings`` (what each maps to is written in
``benchmarks/learner_trl.py``). Both save a snapshot every ``snapshot_every``
steps; after both runs every snapshot gets the same held-out evaluation (64 demo
tasks from a seed neither trains on, 4 samples each at temperature 1, seed 0), so
evaluation costs neither learner any of its time. Reported:

- the wall time each takes to first reach ``target`` held-out reward, and the ratio;
- the held-out reward each has at equal wall time (its last snapshot by then);
- samples per second, and the fraction of its time the trainer spent not training
  (ours: waiting for rollouts; TRL: generating, since it trains and samples in turn).

    python -m benchmarks.learner [--minutes 10] [--target 0.12]
    or   swarmrl bench learner
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from benchmarks.learner_settings import LearnerSettings, Snapshot
from orchestrator.evaluate import evaluate
from orchestrator.pretrain import build_default_model
from orchestrator.tasks.generators import demo_tasks
from orchestrator.train_local.run import LocalRun, train_local
from orchestrator.trainer.metrics import read_metrics
from swarmrl.models.backend import SamplingParams
from swarmrl.models.files import default_models_dir
from swarmrl.models.torch_backend import TorchBackend
from swarmrl.tasks import write_tasks
from swarmrl.tasks.format import Task

TRAIN_SEED, HELD_OUT_SEED = 1, 12345


def run_ours(
    model_dir: Path, tasks_file: Path, settings: LearnerSettings, out: Path, max_seconds: float
) -> tuple[list[Snapshot], float]:
    """`swarmrl train local` with the benchmark's settings; its snapshots, and the
    fraction of its time the trainer waited for rollouts."""
    run = LocalRun(
        model=model_dir,
        tasks=tasks_file,
        out=out,
        recipe=settings.recipe,
        run="bench",
        minutes=max_seconds / 60,
        device="cpu",
    )
    train_local(run, say=lambda text: None)
    folder = run.folder
    rows = read_metrics(folder.metrics)
    per_step = settings.recipe.prompts_per_step * settings.recipe.group_size
    snapshots = [Snapshot(0, 0.0, 0, folder.step(0))]
    snapshots += [
        Snapshot(r["step"], r["elapsed"], r["step"] * per_step, folder.step(r["step"]))
        for r in rows
        if r["step"] % settings.snapshot_every == 0
    ]
    waited = sum(r["seconds_waiting"] for r in rows)
    return snapshots, waited / max(rows[-1]["elapsed"], 1e-9) if rows else 1.0


def held_out_reward(path: Path, tasks: list[Task], settings: LearnerSettings) -> float:
    backend = TorchBackend(path, device="cpu")
    params = SamplingParams(
        max_tokens=settings.recipe.max_tokens, temperature=settings.recipe.temperature
    )
    return evaluate(backend, tasks, n=4, params=params, seed=0).mean_reward


def time_to(curve: list[tuple[float, float]], target: float) -> float | None:
    return next((seconds for seconds, reward in curve if reward >= target), None)


def reward_at(curve: list[tuple[float, float]], seconds: float) -> float:
    return [reward for t, reward in curve if t <= seconds][-1]


def main(minutes: float = 10.0, target: float = 0.12) -> None:
    import torch

    from benchmarks.learner_trl import run_trl

    settings = LearnerSettings()
    model = build_default_model(default_models_dir() / "default")
    held_out = demo_tasks(64, seed=HELD_OUT_SEED)
    with tempfile.TemporaryDirectory(prefix="bench-learner-") as tmp:
        root = Path(tmp)
        train = demo_tasks(4096, seed=TRAIN_SEED)
        tasks_file = root / "train.jsonl"
        write_tasks(train, tasks_file)
        print(f"training each learner for {minutes:g} min on {torch.get_num_threads()} threads")
        ours, idle = run_ours(model, tasks_file, settings, root / "ours", minutes * 60)
        trl = run_trl(model, train, settings, root / "trl", minutes * 60, max_steps=1_000_000)
        timing = json.loads((root / "trl" / "trl_timing.json").read_text())
        curves = {}
        torch.set_num_threads(len(os.sched_getaffinity(0)))
        for name, snapshots in (("swarmrl", ours), ("TRL", trl)):
            curves[name] = [
                (s.seconds, held_out_reward(s.path, held_out, settings)) for s in snapshots
            ]
            last = snapshots[-1]
            print(f"\n{name}: {last.step} steps, {last.samples} samples in {last.seconds:.0f} s")
            for s, (_, reward) in zip(snapshots, curves[name], strict=True):
                print(f"  step {s.step:>4}  {s.seconds:6.0f} s  held-out reward {reward:.4f}")
        trl_generating = timing["seconds_generating"] / max(timing["seconds"], 1e-9)
    _report(curves, ours, trl, idle, trl_generating, target)


def _report(
    curves: dict[str, list[tuple[float, float]]],
    ours: list[Snapshot],
    trl: list[Snapshot],
    idle: float,
    trl_generating: float,
    target: float,
) -> None:
    ours_t, trl_t = time_to(curves["swarmrl"], target), time_to(curves["TRL"], target)
    print(f"\ntarget held-out reward {target}:")
    print(f"  swarmrl reaches it in {_seconds(ours_t)}, TRL in {_seconds(trl_t)}")
    if ours_t is not None and trl_t:
        print(f"  wall-time ratio swarmrl / TRL: {ours_t / trl_t:.2f} (goal <= 0.8)")
    equal = min(ours[-1].seconds, trl[-1].seconds)
    print(
        f"  held-out reward at {equal:.0f} s: swarmrl {reward_at(curves['swarmrl'], equal):.4f}, "
        f"TRL {reward_at(curves['TRL'], equal):.4f}"
    )
    for name, snaps in (("swarmrl", ours), ("TRL", trl)):
        print(f"  {name} samples/s: {snaps[-1].samples / max(snaps[-1].seconds, 1e-9):.1f}")
    print(f"  swarmrl trainer idle (waiting for rollouts): {idle:.1%} (goal <= 10%)")
    print(f"  TRL trainer not training (generating): {trl_generating:.1%}")


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.0f} s"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--target", type=float, default=0.12)
    args = parser.parse_args()
    main(args.minutes, args.target)
