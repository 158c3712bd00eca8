"""`swarmrl model init`: the embedded default policy, pre-trained from scratch.

A tiny character-level Llama (``swarmrl.models.tiny``) learns the demo tasks'
worked solutions by plain next-token prediction on the completion part, for a
fixed number of steps: enough to answer some problems, not enough to answer
most, so RL has something to improve. Like much fine-tuning data, its solutions
do not always state the answer the way the verifier reads it: only a fraction
(``boxed_fraction``) end in ``\\boxed{...}``, the rest in "Answer: ...", which
scores nothing. Learning to box every answer, on top of getting more of them
right, is the first thing RL teaches it, and it shows within minutes on a CPU.

Everything is seeded and runs on the CPU, so the same seed gives the same
weights on the same machine and thread count (matrix kernels add up in an order
that depends on both).

The default recipe's build ships with swarmrl (``orchestrator/default_model``, 3 MB,
built on one thread): `swarmrl model init` copies it in a moment, where training it
takes minutes of a core that every newcomer's demo and every test run spent. Change
the recipe and ``tests/integration/test_rollouts_cli.py`` fails until the shipped
build is made again from it::

    taskset -c 0 swarmrl model init --from-scratch --out orchestrator/default_model
"""

from __future__ import annotations

import json
import math
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from orchestrator.tasks.generators import demo_solution, demo_tasks
from swarmrl.models import tiny
from swarmrl.models.directory import encode_prompt
from swarmrl.tasks import budget_prompt

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM, PreTrainedTokenizerBase, PreTrainedTokenizerFast

# Written last into a finished model directory: its presence means "complete".
RECIPE_FILE = "swarmrl-init.json"
# The default recipe's build, as `swarmrl model init --from-scratch` wrote it.
SHIPPED = Path(__file__).with_name("default_model")
# Thinking budgets the demo states in its prompts.
DEMO_TARGETS = (64, 128, 256)


@dataclass(frozen=True)
class Recipe:
    """Everything that decides the initial weights."""

    seed: int = 0
    steps: int = 600
    batch: int = 32
    lr: float = 3e-3
    warmup: int = 30
    weight_decay: float = 0.01
    boxed_fraction: float = 0.3


class Progress:
    """A ``progress`` callback that reports the first step, then every ``every`` steps
    and the last, each with the time left estimated from the steps so far: the first
    line comes seconds after training starts, not a hundred steps later."""

    def __init__(self, steps: int, say: Callable[[str], None], every: int = 25) -> None:
        self.steps = steps
        self.say = say
        self.every = every
        self.began = time.perf_counter()

    def __call__(self, step: int, loss: float) -> None:
        if step == 0:  # the data is ready: time the steps alone
            self.began = time.perf_counter()
            return
        if not (step == 1 or step % self.every == 0 or step == self.steps):
            return
        elapsed = time.perf_counter() - self.began
        left = elapsed / step * (self.steps - step)
        self.say(f"step {step}/{self.steps}  loss {loss:.3f}  about {_duration(left)} left")


def _duration(seconds: float) -> str:
    """``seconds`` as a person reads a wait: "40 s", "6 min"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min"


def build_default_model(
    out: Path,
    recipe: Recipe = Recipe(),
    *,
    progress: Callable[[int, float], None] | None = None,
    from_scratch: bool = False,
) -> Path:
    """The default model of ``recipe`` into ``out`` unless it is there already: the
    shipped build's copy where it is this recipe's, else trained. ``from_scratch``
    trains it whatever is there or shipped.

    ``progress(step, loss)`` is called with step 0 when the training data is ready,
    then after every step; a copy trains nothing and calls it never.
    """
    out = Path(out)
    if is_built(out, recipe) and not from_scratch:
        return out
    # A default model of an older recipe is replaced; anything else is not ours to touch.
    if out.exists() and any(out.iterdir()) and not (out / RECIPE_FILE).is_file():
        raise ValueError(f"{out} exists and holds something other than this default model")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".init-", dir=out.parent))
    try:
        if trains(out, recipe, from_scratch=from_scratch):
            model, tokenizer = _train(recipe, progress)
            tiny.save(model, tokenizer, staging)
            (staging / RECIPE_FILE).write_text(json.dumps(asdict(recipe), indent=2) + "\n")
        else:
            shutil.copytree(SHIPPED, staging, dirs_exist_ok=True)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def trains(out: Path, recipe: Recipe, *, from_scratch: bool = False) -> bool:
    """Whether `build_default_model` trains (minutes), rather than keep what ``out``
    holds or copy the shipped build."""
    return from_scratch or not (is_built(out, recipe) or is_built(SHIPPED, recipe))


def is_built(out: Path, recipe: Recipe) -> bool:
    """Whether ``out`` holds the finished default model of ``recipe``."""
    done = Path(out) / RECIPE_FILE
    try:
        return done.is_file() and json.loads(done.read_text()) == asdict(recipe)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False  # damaged: built again


def training_texts(
    seed: int, count: int, boxed_fraction: float = 1.0
) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids) pairs: demo tasks with budgets and worked solutions,
    a ``boxed_fraction`` of them ending in a boxed answer and the rest in "Answer: ..."."""
    tokenizer = tiny.build_tokenizer()
    rng = random.Random(seed)
    pairs = []
    for task in demo_tasks(count, seed=seed):
        prompt = encode_prompt(tokenizer, budget_prompt(task.prompt, rng.choice(DEMO_TARGETS)))
        solution = demo_solution(task)
        if rng.random() >= boxed_fraction:
            solution = unboxed(solution)
        answer = tokenizer(solution, add_special_tokens=False)["input_ids"]
        pairs.append((prompt, [*answer, tokenizer.eos_token_id]))
    return pairs


def unboxed(solution: str) -> str:
    """A worked solution with its final ``\\boxed{x}`` line written as "Answer: x"."""
    body, _, last = solution.rpartition("\n")
    opening = "\\boxed{"
    if not (last.startswith(opening) and last.endswith("}")):
        raise ValueError("a worked solution ends in a boxed answer")
    return f"{body}\nAnswer: {last[len(opening) : -1]}"


def _train(
    recipe: Recipe, progress: Callable[[int, float], None] | None
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    model, tokenizer = tiny.build_model(recipe.seed)
    # The training set's tasks come from a seed the demo's evaluation tasks never use.
    pairs = training_texts(
        seed=10_000 + recipe.seed,
        count=recipe.steps * recipe.batch,
        boxed_fraction=recipe.boxed_fraction,
    )
    if progress is not None:
        progress(0, math.nan)
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=recipe.lr, betas=(0.9, 0.95), weight_decay=recipe.weight_decay
    )
    for step in range(recipe.steps):
        ids, labels = _batch(pairs[step * recipe.batch : (step + 1) * recipe.batch], tokenizer)
        for group in optimizer.param_groups:
            group["lr"] = _lr(step, recipe)
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if progress is not None:
            progress(step + 1, loss.item())
    return model.eval(), tokenizer


def _batch(
    pairs: list[tuple[list[int], list[int]]], tokenizer: PreTrainedTokenizerBase
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids with labels only on the completion (the prompt is given)."""
    width = max(len(p) + len(c) for p, c in pairs)
    ids = torch.full((len(pairs), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(pairs), width), -100, dtype=torch.long)
    for row, (prompt, completion) in enumerate(pairs):
        seq = prompt + completion
        ids[row, : len(seq)] = torch.tensor(seq)
        labels[row, len(prompt) : len(seq)] = torch.tensor(completion)
    return ids, labels


def _lr(step: int, recipe: Recipe) -> float:
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    done = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
    return recipe.lr * 0.5 * (1 + math.cos(math.pi * done))
