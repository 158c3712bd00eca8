"""The trainer loop, top to bottom: take fresh groups, take a step, write a checkpoint.

Whoever samples (``swarmrl train local``'s workers today, the swarm's nodes
through the orchestrator next) leaves rollout files in the run's spool; the
trainer never waits for them to catch up with it. It trains step n+1 from any
group sampled with policy n, n-1, ... n-async_level, drops older ones, and after
every optimizer step writes ``checkpoints/step_<n+1>/`` for samplers to load.

A restarted trainer continues from its newest whole checkpoint: weights,
optimizer, step, RNG and data position, so kill -9 at any moment loses at most the
step in flight and never uses a group twice; it never goes back below the newest
step the swarm was given (``checkpoint.resume_point``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from orchestrator.trainer import checkpoint as ckpt
from orchestrator.trainer.feed import Expectations, RolloutFeed, Spool
from orchestrator.trainer.optim import build_optimizer, lr_at
from orchestrator.trainer.recipe import GRPORecipe
from orchestrator.trainer.samples import staleness
from orchestrator.trainer.step import train_step
from swarmrl.models.backend import Precision, torch_dtype
from swarmrl.models.directory import load_tokenizer
from swarmrl.tasks import Task

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class StepReport:
    """One line of ``metrics.jsonl``."""

    step: int
    applied: bool
    task_reward: float
    reward: float
    length: float
    loss: float
    grad_norm: float
    clip_fraction: float
    ratio_mean: float
    ratio_max: float
    kept_groups: int
    stale_groups: int
    filtered_groups: int
    unusable_files: int
    staleness_mean: float
    staleness_max: int
    tokens: int
    samples: int  # completions trained on: kept groups x group size
    seconds_waiting: float
    seconds_training: float
    seconds_checkpoint: float
    lr: float
    time: float  # unix seconds when the step was done: the time base of throughput
    extra: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Trainer:
    """The policy, its optimizer and its feed of rollouts, restored from the run directory;
    it trains run ``run`` by ``recipe``. ``published``: the newest step the swarm was
    given, below which it never resumes (None where nothing publishes)."""

    def __init__(
        self,
        run_dir: Path,
        base_model: Path,
        tasks: list[Task],
        recipe: GRPORecipe,
        *,
        run: str,
        device: str = "cpu",
        published: int | None = None,
        serving: Precision = "fp32",
        keep_checkpoints: int = ckpt.KEEP_STATES,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.recipe = recipe
        self.serving = torch_dtype(serving)
        self.keep_checkpoints = keep_checkpoints
        self.run = run
        self.loss_config = recipe.loss_config()
        ckpt.sweep_staging(self.run_dir)
        resume = ckpt.resume_point(self.run_dir, published)
        source = base_model if resume is None else ckpt.step_dir(self.run_dir, resume.step)
        self.tokenizer = load_tokenizer(source)
        master = base_model if resume is None else ckpt.master_dir(self.run_dir, resume.step)
        self.model = _load_model(master, device)
        # The KL term measures against the weights the run started from, frozen.
        self.reference = None
        if recipe.kl_coef > 0:
            self.reference = _load_model(base_model, device).requires_grad_(False)
        self.optimizer = build_optimizer(self.model, lr=recipe.lr, weight_decay=recipe.weight_decay)
        state: dict[str, Any] = {}
        if resume is not None:
            state = resume.state
            self._check_same_run(state)
            self.optimizer.load_state_dict(state["optimizer"])
            torch.set_rng_state(state["rng"])
        self.step = 0 if resume is None else resume.step
        saved_feed = state.get("feed", {})
        by_id = {t.problem_id: t for t in tasks}
        self.feed = RolloutFeed(
            Spool(self.run_dir / "rollouts"),
            Expectations(
                run=run,
                tasks=by_id,
                tokenizer=self.tokenizer,
                vocab_size=self.model.config.vocab_size,
                group_size=recipe.group_size,
                temperature=recipe.temperature,
            ),
            position=saved_feed.get("position"),
        )
        self.feed.highest_counter.update(saved_feed.get("highest_counter", {}))
        self.feed.counts.update(saved_feed.get("counts", {}))
        if resume is None:
            torch.manual_seed(recipe.seed)
            self._checkpoint()  # step 0, the policy samplers start from

    def train(
        self,
        *,
        should_stop: Callable[[], bool],
        on_step: Callable[[StepReport], None],
        poll_seconds: float = 0.05,
    ) -> None:
        """Train until ``recipe.steps`` or until ``should_stop`` says so."""
        r = self.recipe
        while self.step < r.steps and not should_stop():
            began = time.perf_counter()

            def wait() -> bool:
                time.sleep(poll_seconds)
                return not should_stop()

            taken = self.feed.take(r.prompts_per_step, self.step, r.async_level, wait=wait)
            if taken is None:
                return
            waited = time.perf_counter() - began
            samples = [x for g in taken.groups for x in g.samples(r.advantage_scale)]
            lr = lr_at(self.step, base_lr=r.lr, warmup_steps=r.warmup_steps)
            result = train_step(
                self.model,
                self.optimizer,
                samples,
                self.loss_config,
                lr=lr,
                max_grad_norm=r.max_grad_norm,
                temperature=r.temperature,
                micro_batch=r.micro_batch,
                ratio_against=r.ratio_against,
                reference=self.reference,
            )
            trained = time.perf_counter() - began - waited
            if result.applied:
                self.step += 1
                self._checkpoint()
            saved = time.perf_counter() - began - waited - trained
            records = [r for g in taken.groups for r in g.records]
            ages = [staleness(self.step - result.applied, g) for g in taken.groups]
            on_step(
                StepReport(
                    step=self.step,
                    applied=result.applied,
                    task_reward=statistics.fmean(r.task_reward for r in records),
                    reward=statistics.fmean(r.reward for r in records),
                    length=statistics.fmean(len(r.output_ids) for r in records),
                    loss=result.loss,
                    grad_norm=result.grad_norm,
                    clip_fraction=result.metrics["clip_fraction"],
                    ratio_mean=result.metrics["ratio_mean"],
                    ratio_max=result.metrics["ratio_max"],
                    kept_groups=len(taken.groups),
                    stale_groups=taken.stale,
                    filtered_groups=taken.filtered,
                    unusable_files=self.feed.counts["unusable_files"],
                    staleness_mean=statistics.fmean(ages),
                    staleness_max=max(ages),
                    tokens=sum(len(r.output_ids) for r in records),
                    samples=len(records),
                    seconds_waiting=waited,
                    seconds_training=trained,
                    seconds_checkpoint=saved,
                    lr=lr,
                    time=time.time(),
                )
            )

    def _checkpoint(self) -> None:
        state = {
            "optimizer": self.optimizer.state_dict(),
            "rng": torch.get_rng_state(),
            "feed": self.feed.state(),
            "run": self.run,
        }
        ckpt.save_checkpoint(
            self.run_dir,
            self.step,
            self.model,
            self.tokenizer,
            state,
            dtype=self.serving,
            keep=self.keep_checkpoints,
        )
        self.feed.release()

    def _check_same_run(self, state: dict[str, Any]) -> None:
        if state.get("run") != self.run:
            raise ValueError(f"{self.run_dir} holds run {state.get('run')!r}, not {self.run!r}")


def _load_model(path: Path, device: str) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, local_files_only=True
        )
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is not a loadable model directory ({e})") from None
    # PreTrainedModel.to is functools.wraps(Module.to), which mypy does not bind as a
    # method (it takes the device for `self`).
    loaded: PreTrainedModel = model.to(device).eval()  # type: ignore[arg-type]
    return loaded
