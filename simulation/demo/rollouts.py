"""The demo's rollout stage: a volunteer proves its completions, a validator checks them.

Run by `swarmrl demo` after the swarm stage. The default policy is built on
the first run (a few minutes on a laptop CPU) and cached under the models
directory; later runs load it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

import typer

from orchestrator.pretrain import Recipe, build_default_model
from orchestrator.tasks.generators import demo_tasks
from swarmrl.models import tiny
from swarmrl.models.backend import SamplingParams
from swarmrl.models.files import default_models_dir
from swarmrl.models.torch_backend import TorchBackend
from swarmrl.rollouts.checks import Assignment
from swarmrl.rollouts.generate import Provenance, generate_rollouts
from swarmrl.rollouts.records import Rollout, file_digest, read_rollouts, write_rollouts
from swarmrl.rollouts.verify import verify_rollouts
from swarmrl.tasks.code import sandbox_kind, verify_code
from swarmrl.tasks.format import Task
from swarmrl.tasks.rewards import choose_target_length, node_task_reward, task_reward

TASKS, GROUP = 12, 4
TARGETS = (64, 128, 256)
NODE = "0x" + "5a" * 20
SAMPLING = SamplingParams(max_tokens=256, temperature=1.0)
# What the validator asked the volunteer for: it checks every record against this.
ASKED = Assignment(
    run="demo",
    node=NODE,
    step=0,
    group_size=GROUP,
    max_tokens=SAMPLING.max_tokens,
    temperature=SAMPLING.temperature,
    top_p=SAMPLING.top_p,
)
# The tasks a volunteer is given come from a seed the pre-training never drew from.
TASK_SEED = 7


def _say(text: str) -> None:
    typer.echo(text)


def run(workdir: Path) -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    recipe = Recipe()
    model_dir = default_models_dir() / "default"
    _say("[rollouts] the coordinator's initial policy: a tiny Llama pre-trained on the demo tasks")
    began = time.perf_counter()
    build_default_model(model_dir, recipe, progress=_training_progress(recipe))
    backend = TorchBackend(model_dir, device="cpu")
    size = sum(p.numel() for p in backend.model.parameters()) / 1e6
    _say(
        f"  {size:.1f} M parameters, {recipe.steps} pre-training steps, seed {recipe.seed} "
        f"(ready in {time.perf_counter() - began:.0f} s; cached in {model_dir})"
    )

    tasks = demo_tasks(TASKS, seed=TASK_SEED)
    rng = random.Random(0)
    began = time.perf_counter()
    records = generate_rollouts(
        backend,
        tasks,
        n=GROUP,
        params=SAMPLING,
        provenance=Provenance(run=ASKED.run, policy_step=ASKED.step, node=NODE),
        seed=1,
        score=node_task_reward,
        target_for=lambda speed: (
            min(TARGETS) if speed is None else choose_target_length(TARGETS, speed, 2.0, rng)
        ),
    )
    generated = time.perf_counter() - began
    tokens = sum(len(r.output_ids) for r in records)
    proofs = sum(len(r.proofs) for r in records)
    path = workdir / "rollouts.parquet"
    write_rollouts(records, path)
    solved = sum(r.task_reward for r in records)
    _say(
        f"  a volunteer sampled {GROUP} completions for each of {TASKS} tasks: {tokens} tokens "
        f"in {generated:.1f} s, {proofs} TOPLOC proofs, file digest "
        f"0x{file_digest(records).hex()[:16]}..."
    )
    _say(
        f"  solved {solved:.0f}/{len(records)}, mean reward "
        f"{sum(r.reward for r in records) / len(records):.3f}: room for RL to improve"
    )

    began = time.perf_counter()
    from_file = read_rollouts(path)
    task_set = {t.problem_id: t for t in tasks}
    verdicts = verify_rollouts(backend, from_file, task_set, ASKED, task_reward)
    checked = time.perf_counter() - began
    _say(
        f"  the validator replayed every rollout from the file against its own tasks, one "
        f"prefill pass each: {sum(v.accepted for v in verdicts)}/{len(verdicts)} accepted "
        f"in {checked:.1f} s"
    )

    _cheating_scenes(backend, from_file, task_set)
    _cheaper_model_scene(workdir, backend, tasks[:1])
    _sandbox_scene()


COMPLETION_FIELDS = ("output_ids", "logprobs", "proofs", "finish_reason")
REWARD_FIELDS = ("task_reward", "length_penalty", "reward")


def _cheating_scenes(
    backend: TorchBackend, records: list[Rollout], task_set: dict[str, Task]
) -> None:
    """A node that lies about its task, and one that pads its group with copies: each
    group re-verified alone, as the validator sees it."""
    unsolved = next((r for r in records if r.task_reward == 0), None)
    if unsolved is not None:
        group = [r for r in records if r.problem_id == unsolved.problem_id]
        # It rewrites the ground truth in its copy of the task and claims the reward.
        rewritten = unsolved.model_copy(
            update={"verification_info": '{"ground_truth":"?"}', "task_reward": 1.0}
        ).sealed()
        forged = [rewritten if r is unsolved else r for r in group]
        verdict = verify_rollouts(backend, forged, task_set, ASKED, task_reward)[
            group.index(unsolved)
        ]
        _say(f"  a node that rewrites a task's answer: rejected ({verdict.reason})")
    group = records[:GROUP]
    # The longest completion: the least likely to repeat by chance, so the clearest case.
    source = max(group, key=lambda r: len(r.output_ids))
    copied = [
        r
        if r is source
        else r.model_copy(
            update={f: getattr(source, f) for f in (*COMPLETION_FIELDS, *REWARD_FIELDS)}
        ).sealed()
        for r in group
    ]
    verdict = verify_rollouts(backend, copied, task_set, ASKED, task_reward)[0]
    _say(f"  a node that copies one completion across its group: rejected ({verdict.reason})")


def _training_progress(recipe: Recipe) -> Callable[[int, float], None]:
    began = time.perf_counter()

    def report(step: int, loss: float) -> None:
        if step == 1:
            _say("  not cached yet: pre-training on this CPU (a few minutes, once)")
        if step % 100 == 0:
            elapsed = time.perf_counter() - began
            _say(f"  step {step}/{recipe.steps}  loss {loss:.3f}  ({elapsed:.0f} s)")

    return report


def _cheaper_model_scene(workdir: Path, backend: TorchBackend, tasks: list[Task]) -> None:
    model, tokenizer = tiny.build_model(seed=99)
    cheap_dir = workdir / "cheap-model"
    tiny.save(model, tokenizer, cheap_dir)
    cheap = TorchBackend(cheap_dir, device="cpu")
    forged = generate_rollouts(
        cheap,
        tasks,
        n=GROUP,
        params=SAMPLING,
        provenance=Provenance(run=ASKED.run, policy_step=ASKED.step, node=NODE),
        seed=2,
        score=node_task_reward,
        target_for=lambda speed: 64,
    )
    task_set = {t.problem_id: t for t in tasks}
    verdict = verify_rollouts(backend, forged, task_set, ASKED, task_reward)[0]
    _say(f"  a node that generated with a cheaper model: rejected ({verdict.reason})")


def _sandbox_scene() -> None:
    info = {"tests": [{"stdin": "3 4\n", "stdout": "7\n"}, {"stdin": "10 -2\n", "stdout": "8\n"}]}
    programs = {
        "a correct program": "a, b = map(int, input().split())\nprint(a + b)",
        "a wrong one": "a, b = map(int, input().split())\nprint(a * b)",
        "an endless loop": "while True:\n    pass",
        "one that phones home": (
            "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)\nprint(7)"
        ),
    }
    verdicts = []
    for name, source in programs.items():
        began = time.perf_counter()
        ok = verify_code(f"```python\n{source}\n```", info)
        seconds = time.perf_counter() - began
        verdicts.append(f"{name} {'passes' if ok else 'fails'} ({seconds:.1f} s)")
    _say(f"  code tasks run in a {sandbox_kind()} sandbox: " + "; ".join(verdicts))
