"""What one policy step ships: weight deltas over real training, the codec's speed, and
the broadcast they buy.

    swarmrl bench delta [--smollm2-steps 4] [--default-steps 4] [--runs 5]
                        [--nodes 1000] [--skip-learner] [--skip-codec] [--skip-sim]
                        [--skip-anchor]
    or   python -m benchmarks.delta [the same options]

The quick form, seconds (what the tests run): ``--skip-learner --skip-codec
--skip-anchor --nodes 10``. Three figures, each printed with its assumptions:

1. Bytes a step ships over the full policy's. The repository's trainer
   (:class:`orchestrator.trainer.loop.Trainer`: its feed, GRPO loss, AdamW and
   checkpoints) trains a model for a few steps on real rollouts, sampled by the torch
   backend from the newest published step whenever the trainer runs out of groups
   (one node that always keeps up: no group is more than a step old). Each consecutive
   pair of published checkpoints (``checkpoints/step_<n>/model.safetensors``, in the
   run's serving dtype) goes through :func:`swarmrl.delta.encode`: the figure is the
   delta's bytes over the target file's, with the fraction of elements that changed.
   A step's other files (config, tokenizer) do not change, so they ship nothing
   (:mod:`swarmrl.weights.delta_versions`). The first step is reported apart: AdamW's first
   update moves every weight by the whole learning rate (its moments are one gradient,
   whose ratio is the sign), the most one step at that rate moves a weight, while
   later steps move each by the rate times |m / sqrt(v)|, which a noisy gradient keeps
   lower. The figure is the median and max over the later steps.

   - SmolLM2-135M-Instruct, imported offline from its PyPI GGUF, published in bf16
     (fp32 masters), at lr 1e-6 from the first step (a warm-up's smaller steps would
     understate the figure). It trains on reasoning-gym's tasks: it solves none of
     the demo's in a short budget, so all its groups would agree and be dropped, while
     reasoning-gym gives partial credit to an answer that contains the right one.
     Batches are small (2 tasks x 4 completions of at most 32 tokens), as a step of
     a 135 M model takes a minute on 2 cores: a small batch's gradient is noisier than
     a large one's, so its later steps understate what a large batch ships, and the
     first step bounds both. Goal: at most 1% (grail's PULSE reports 0.77% for a 7B
     model, TRL's delta sync 1.7-2.9%).
   - The default model at the demo's recipe (``LEARNING_RECIPE``: lr 3e-4 after 5
     warm-up steps, published in fp32 as the demo publishes it) on the demo's tasks. No
     goal: at that rate nearly every fp32 weight changes every step, and the delta
     carries the low mantissa bits that changed, which do not compress.

2. The codec's speed against BLAKE3 over the same bytes, and its peak memory:
   :mod:`benchmarks.delta_codec` (its doc says what is timed), on SmolLM2-135M's
   tensor set in bf16.

3. How long until 90% and 99% of 1,000 nodes hold a step, shipped whole (a 15.2 GB bf16
   7B policy) or as a 1% delta: :mod:`benchmarks.broadcast_sim`, a flow-level
   simulation of the code's fetch policy, whose doc lists every assumption.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from benchmarks import broadcast_sim, delta_codec
from benchmarks.broadcast_sim import MIB
from benchmarks.learner_settings import DEMO_RECIPE
from orchestrator.pretrain import build_default_model
from orchestrator.run_dir import RunDir
from orchestrator.tasks.generators import demo_tasks
from orchestrator.train_local.sampler import GENERATE_BATCH, draw_tasks, node_address
from orchestrator.trainer.loop import StepReport, Trainer
from orchestrator.trainer.recipe import GRPORecipe
from swarmrl import delta
from swarmrl.cli_options import quiet_transformers
from swarmrl.models.backend import Precision, SamplingParams
from swarmrl.models.directory import SINGLE_FILE
from swarmrl.models.files import default_models_dir
from swarmrl.models.torch_backend import TorchBackend
from swarmrl.rollouts.generate import Provenance, batch_seed, generate_rollouts
from swarmrl.shards import DEFAULT_SHARD_SIZE
from swarmrl.tasks import Task, reasoning_gym
from swarmrl.tasks.rewards import task_reward
from swarmrl.weights.delta_versions import DELTA_SHARD_SIZE

RUN = "bench-delta"
SAMPLER = "bench"
TASKS_PER_MODEL, TASK_SEED = 256, 1
# Batches sampled for one step before a run gives up: a model whose groups' rewards
# always agree on its tasks would otherwise sample forever.
MAX_IDLE_BATCHES = 20

SMOLLM2_GOAL = 0.01
SMOLLM2_RECIPE = GRPORecipe(
    lr=1e-6,
    warmup_steps=0,
    group_size=4,
    prompts_per_step=2,
    max_tokens=32,
    target_len=32,
)

Score = Callable[[Task, str], float]


@dataclass(frozen=True)
class StepDelta:
    """Step ``step``'s published weights as a delta against step ``step - 1``'s."""

    step: int
    full_bytes: int
    delta_bytes: int
    changed_fraction: float

    @property
    def ratio(self) -> float:
        return self.delta_bytes / self.full_bytes


def train(
    model: Path,
    tasks: list[Task],
    recipe: GRPORecipe,
    serving: Precision,
    run_dir: Path,
    *,
    score: Score = task_reward,
    say: Callable[[str], None] = print,
) -> None:
    """Trains ``recipe.steps`` steps into ``run_dir``, publishing every step in
    ``serving``, on groups sampled from the newest published step whenever the trainer
    has none left to read."""
    trainer = Trainer(run_dir, model, tasks, recipe, run=RUN, device="cpu", serving=serving)
    sampler = _Sampler(trainer, tasks, score)

    def report(r: StepReport) -> None:
        say(
            f"  step {r.step}: reward {r.task_reward:.3f}, {r.kept_groups} groups kept, "
            f"{r.filtered_groups} agreed; trained {r.seconds_training:.1f} s, "
            f"checkpoint {r.seconds_checkpoint:.1f} s"
        )

    trainer.train(should_stop=sampler.sample_if_starved, on_step=report)


class _Sampler:
    """One node inside the trainer's loop: it samples a step's worth of groups with the
    newest published policy whenever the trainer would otherwise wait, so no group is
    older than the step before (an asynchronous run's samples are older, which changes
    what a step learns, not how far AdamW moves the weights)."""

    def __init__(self, trainer: Trainer, tasks: list[Task], score: Score) -> None:
        self.trainer, self.tasks, self.score = trainer, tasks, score
        self.recipe = r = trainer.recipe
        self.step = trainer.step
        # On the CPU the backend computes in fp32 whatever the checkpoint's dtype: bf16
        # matmuls there are slow, and the rollouts only have to be real ones of the policy.
        self.backend = TorchBackend(trainer.run_folder.step(self.step), device="cpu")
        self.params = SamplingParams(
            max_tokens=r.max_tokens, temperature=r.temperature, top_p=r.top_p
        )
        self.node = node_address(SAMPLER)
        self.batch = 0
        self.idle = 0  # batches sampled since the last step

    def sample_if_starved(self) -> bool:
        """The loop's ``should_stop``: never stops it, but spools a batch first when the
        trainer has fewer groups in hand than a step takes."""
        feed, r = self.trainer.feed, self.recipe
        if feed.spool.files() or len(feed.queue) >= r.prompts_per_step:
            return False
        if self.trainer.step != self.step:
            self.step = self.trainer.step
            self.backend.load_weights(self.trainer.run_folder.step(self.step))
            self.idle = 0
        if self.idle >= MAX_IDLE_BATCHES:
            raise ValueError(
                f"no step after {self.idle} batches (nearly every group's rewards agreed): "
                "the model cannot learn these tasks"
            )
        records = generate_rollouts(
            self.backend,
            draw_tasks(self.tasks, r.prompts_per_step, r.seed, SAMPLER, self.batch),
            n=r.group_size,
            params=self.params,
            provenance=Provenance(run=RUN, policy_step=self.step, node=self.node),
            seed=batch_seed(r.seed, self.batch),
            score=self.score,
            target_for=lambda _speed: r.target_len,
            batch_size=max(r.group_size, GENERATE_BATCH),
        )
        feed.spool.put(SAMPLER, self.batch, records)
        self.batch += 1
        self.idle += 1
        return False


def step_deltas(run_dir: Path, out: Path) -> list[StepDelta]:
    """Each published step of ``run_dir`` encoded against the one before it, into
    ``out``."""
    deltas, folder = [], RunDir(run_dir)
    for base, target in pairwise(folder.steps()):
        stats = delta.encode(
            folder.step(base) / SINGLE_FILE,
            folder.step(target) / SINGLE_FILE,
            out / f"step_{target}.delta",
        )
        deltas.append(
            StepDelta(
                step=target,
                full_bytes=stats.target_bytes,
                delta_bytes=stats.delta_bytes,
                changed_fraction=stats.changed_elements / stats.total_elements,
            )
        )
    return deltas


def report_deltas(label: str, deltas: list[StepDelta], goal: float | None) -> None:
    print(
        "| step | full MB | delta MB | delta / full | elements changed |\n"
        "| --- | --- | --- | --- | --- |"
    )
    for d in deltas:
        print(
            f"| {d.step - 1} -> {d.step} | {d.full_bytes / 1e6:.1f} | {d.delta_bytes / 1e6:.2f} "
            f"| {d.ratio:.2%} | {d.changed_fraction:.2%} |"
        )
    # The first step apart: AdamW's first update is its largest (the module's doc).
    first, later = deltas[0], deltas[1:] or deltas
    ratios = [d.ratio for d in later]
    median = statistics.median(ratios)
    verdict = ""
    if goal is not None:
        verdict = f" (goal: median <= {goal:.0%}: {'met' if median <= goal else 'NOT met'})"
    print(
        f"{label}: delta / full, steps {later[0].step}-{later[-1].step}: median {median:.2%}, "
        f"max {max(ratios):.2%}{verdict}; elements changed, median "
        f"{statistics.median(d.changed_fraction for d in later):.2%}; step {first.step} "
        f"(AdamW's first): {first.ratio:.2%}"
    )


def learner_figure(smollm2_steps: int, default_steps: int, root: Path) -> None:
    print(
        f"1. Bytes a step ships / full policy bytes: the trainer on real rollouts, "
        f"swarmrl.delta.encode (zstd level {delta.DEFAULT_LEVEL}) on each pair of published "
        "checkpoints (model.safetensors)."
    )
    quiet_transformers()
    try:
        from swarmrl.models.smollm2 import import_smollm2

        smollm2 = import_smollm2(root / "smollm2")
    except ValueError as e:
        print(f"SmolLM2-135M skipped: {e}")
    else:
        r = SMOLLM2_RECIPE
        print(
            f"\nSmolLM2-135M-Instruct, published in bf16 (fp32 masters), lr {r.lr:g} without "
            f"warm-up, {smollm2_steps} steps of {r.prompts_per_step} reasoning-gym tasks x "
            f"{r.group_size} completions (<= {r.max_tokens} tokens):"
        )
        tasks = reasoning_gym.generate(reasoning_gym.DATASETS, TASKS_PER_MODEL, TASK_SEED)
        _run_learner(
            f"SmolLM2-135M, bf16, lr {r.lr:g}",
            smollm2,
            tasks,
            r.model_copy(update={"steps": smollm2_steps}),
            "bf16",
            root / "smollm2-run",
            SMOLLM2_GOAL,
        )
    r = DEMO_RECIPE
    print(
        f"\nThe default model at the demo's recipe, published in fp32, lr {r.lr:g} after "
        f"{r.warmup_steps} warm-up steps, {default_steps} steps of {r.prompts_per_step} demo "
        f"tasks x {r.group_size} completions (<= {r.max_tokens} tokens):"
    )
    _run_learner(
        f"default model, fp32, lr {r.lr:g}",
        build_default_model(default_models_dir() / "default"),
        demo_tasks(TASKS_PER_MODEL, TASK_SEED),
        r.model_copy(update={"steps": default_steps}),
        "fp32",
        root / "default-run",
        None,
    )


def _run_learner(
    label: str,
    model: Path,
    tasks: list[Task],
    recipe: GRPORecipe,
    serving: Precision,
    run_dir: Path,
    goal: float | None,
) -> None:
    began = time.perf_counter()
    train(model, tasks, recipe, serving, run_dir)
    trained = time.perf_counter() - began
    deltas = step_deltas(run_dir, run_dir / "deltas")
    print(f"  {recipe.steps} steps in {trained:.0f} s")
    report_deltas(label, deltas, goal)


def codec_figure(runs: int) -> None:
    print(
        f"2. Delta encode and apply against BLAKE3 over the same bytes: benchmarks.delta_codec "
        f"--runs {runs}, SmolLM2-135M's tensors in bf16, random weights (std 0.02)."
    )
    delta_codec.main(runs)


def broadcast_figure(nodes: int, skip_anchor: bool) -> None:
    argv = ["--nodes", str(nodes), *(["--skip-anchor"] if skip_anchor else [])]
    print(
        f"3. Time until 90% and 99% of {nodes} nodes hold step n, full against delta: "
        f"benchmarks.broadcast_sim {' '.join(argv)}. Assumptions beside the network printed "
        "below (the simulation's doc lists them all): the full version is a 7B policy in "
        f"bf16 ({broadcast_sim.FULL_BYTES / 1e9:g} GB), the delta "
        f"{broadcast_sim.DELTA_FRACTION:.0%} of it; bandwidth is fluid and max-min fair (no "
        "TCP slow start, core congestion, disk or hashing time, or churn); nodes that are "
        "not reachable serve nobody; 'code' is the fetch policy as the code has it, "
        f"'{broadcast_sim.BEFORE}' the policy before the simulation's findings went in.\n"
    )
    results = broadcast_sim.main(argv)
    print(
        "\nFull against delta, each in the shards the code ships it in (p90, p99: when 90% "
        "and 99% of the nodes were ready; floor: what no schedule beats on this network):\n"
        "| version | policy | shard MiB | p90 | p99 | floor p90 / p99 | goal for p90 |\n"
        "| --- | --- | --- | --- | --- | --- | --- |"
    )
    fmt = broadcast_sim._fmt  # the simulation's own table's format
    shipped = {
        "anchor": (DEFAULT_SHARD_SIZE, broadcast_sim.ANCHOR_GOAL_SECONDS),
        "delta": (DELTA_SHARD_SIZE, broadcast_sim.DELTA_GOAL_SECONDS),
    }
    for row, runs in results.items():
        shard_size, goal = shipped[row.version]
        shown = row.policy in ("code", broadcast_sim.BEFORE) and not row.warm
        if not shown or row.shard_mib * MIB != shard_size:
            continue
        r = runs[0]
        print(
            f"| {'full' if row.version == 'anchor' else 'delta'}, {r.size_bytes / 1e9:g} GB | "
            f"{row.policy} | {row.shard_mib} | {fmt(r.p90())} | {fmt(r.p99())} | "
            f"{fmt(r.lower_bound(0.9))} / {fmt(r.lower_bound(0.99))} | "
            f"{fmt(goal)}: {'met' if r.p90() <= goal else 'NOT met'} |"
        )


def main(argv: list[str] | None = None) -> None:
    """The three figures; ``argv`` as on the command line (None: every default)."""
    parser = argparse.ArgumentParser(prog="benchmarks.delta", description=__doc__.splitlines()[0])
    parser.add_argument("--smollm2-steps", type=int, default=4)
    parser.add_argument("--default-steps", type=int, default=4)
    parser.add_argument("--runs", type=int, default=5, help="timed runs per codec figure")
    parser.add_argument("--nodes", type=int, default=1000, help="nodes in the simulation")
    parser.add_argument("--skip-learner", action="store_true")
    parser.add_argument("--skip-codec", action="store_true")
    parser.add_argument("--skip-sim", action="store_true")
    parser.add_argument("--skip-anchor", action="store_true", help="simulate the delta alone")
    args = parser.parse_args([] if argv is None else argv)
    print(f"swarmrl bench delta {' '.join(argv or [])}".rstrip())
    print(f"{len(os.sched_getaffinity(0))} cores\n")
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="swarmrl-bench-delta-") as tmp:
        if not args.skip_learner:
            _timed(
                "learner", lambda: learner_figure(args.smollm2_steps, args.default_steps, Path(tmp))
            )
        if not args.skip_codec:
            _timed("codec", lambda: codec_figure(args.runs))
        if not args.skip_sim:
            _timed("simulation", lambda: broadcast_figure(args.nodes, args.skip_anchor))
    print(f"bench delta: {time.perf_counter() - began:.0f} s in all")


def _timed(part: str, run: Callable[[], None]) -> None:
    began = time.perf_counter()
    run()
    print(f"\n({part}: {time.perf_counter() - began:.0f} s)\n")


if __name__ == "__main__":
    main(sys.argv[1:])
