"""The trainer loop, top to bottom: take fresh groups, take a step, write a checkpoint.

Whoever samples (``swarmrl train local``'s workers, the swarm's nodes through the
orchestrator's validator) leaves rollout files in the run's spool; the
trainer never waits for them to catch up with it. It trains step n+1 from any
group sampled with policy n, n-1, ... n-async_level, drops older ones, and after
every optimizer step writes ``checkpoints/step_<n+1>/`` for samplers to load.

A restarted trainer continues from its newest whole checkpoint: weights,
optimizer, step, RNG and data position, so kill -9 at any moment loses at most the
step in flight and never uses a group twice; it never goes back below the newest
step the swarm was given (``checkpoint.resume_point``).

The same loop runs as one process or as every rank of a torch.distributed job
(``ranks``), where the policy is sharded with FSDP2 and rank 0 reads the spool.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.distributed as dist

from orchestrator.run_dir import RunDir
from orchestrator.trainer import checkpoint as ckpt
from orchestrator.trainer.batch import TokenScorer
from orchestrator.trainer.distributed import data_parallel_step, is_main, shard
from orchestrator.trainer.feed import Expectations, RolloutFeed, Spool, Taken
from orchestrator.trainer.launch import TrainerLaunch
from orchestrator.trainer.optim import build_optimizer, lr_at
from orchestrator.trainer.recipe import GRPORecipe
from orchestrator.trainer.samples import staleness
from orchestrator.trainer.step import StepResult, train_step
from swarmrl.models.backend import Precision, torch_dtype
from swarmrl.models.directory import load_tokenizer, model_skeleton
from swarmrl.tasks import Task

if TYPE_CHECKING:
    from transformers import PreTrainedModel

T = TypeVar("T")


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
    # The sampler's policy against the trainer's on the step's tokens (see
    # ``orchestrator.trainer.step``): the early warning of off-policy collapse.
    mismatch_kl: float = 0.0
    mismatch_ratio_std: float = 0.0
    mismatch_ratio_min: float = 0.0
    mismatch_ratio_max: float = 0.0
    # Index k: the tokens sampled k steps behind the trainer, and their mismatch.
    mismatch_kl_by_staleness: list[float] = field(default_factory=list)
    tokens_by_staleness: list[int] = field(default_factory=list)
    tis_fraction: float = 0.0  # tokens whose importance weight was truncated
    icepop_fraction: float = 0.0  # tokens masked out of the loss
    extra: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Trainer:
    """The policy, its optimizer and its feed of rollouts, restored from the run directory;
    it trains run ``run`` by ``recipe``. ``published``: the newest step the swarm was
    given, below which it never resumes (None where nothing publishes).

    Made on every rank of a process group (see ``orchestrator.trainer.ranks``), it is
    the same trainer sharded with FSDP2: rank 0 alone reads the spool and writes what
    one process writes (the data position, the metrics); every step it hands each rank
    the step's samples, of which each trains its own slice."""

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
        launch: TrainerLaunch | None = None,
    ) -> None:
        launch = launch or TrainerLaunch()
        self.run_dir = Path(run_dir)
        self.run_folder = RunDir(self.run_dir)
        self.recipe = recipe
        self.serving = torch_dtype(serving)
        self.keep_checkpoints = keep_checkpoints
        self.run = run
        self.loss_config = recipe.loss_config()
        self.sharded = dist.is_initialized()
        self.main = is_main()
        resume: ckpt.Resume | None = None
        if self.main:
            ckpt.sweep_staging(self.run_dir)
            # Rank 0 alone: a damaged checkpoint is moved aside once.
            resume = ckpt.resume_point(self.run_dir, published)
        resume_step = _from_main(None if resume is None else resume.step)
        source = base_model if resume_step is None else self.run_folder.step(resume_step)
        self.tokenizer = load_tokenizer(source)
        # What is trained: the LM (``model``) inside the module that scores tokens with it.
        self.policy = load_policy(base_model, device, launch, sharded=self.sharded)
        self.model = self.policy.lm
        # The KL term measures against the weights the run started from, frozen.
        self.reference = None
        if recipe.kl_coef > 0:
            self.reference = load_policy(
                base_model, device, launch, sharded=self.sharded
            ).requires_grad_(False)
        self.optimizer = build_optimizer(
            self.policy, lr=recipe.lr, weight_decay=recipe.weight_decay
        )
        state: dict[str, Any] = {}
        if resume_step is not None:
            ckpt.load_resumable(self.run_dir, resume_step, self.policy, self.optimizer)
            state = resume.state if resume is not None else ckpt.load_state(run_dir, resume_step)
            self._check_same_run(state)
            torch.set_rng_state(state["rng"])
        self.step = 0 if resume_step is None else resume_step
        self._feed: RolloutFeed | None = None
        if self.main:
            saved_feed = state.get("feed", {})
            self._feed = RolloutFeed(
                Spool(self.run_folder.spool),
                Expectations(
                    run=run,
                    tasks={t.problem_id: t for t in tasks},
                    tokenizer=self.tokenizer,
                    vocab_size=self.model.config.vocab_size,
                    group_size=recipe.group_size,
                    temperature=recipe.temperature,
                ),
                position=saved_feed.get("position"),
            )
            self._feed.highest_counter.update(saved_feed.get("highest_counter", {}))
            self._feed.counts.update(saved_feed.get("counts", {}))
        if resume_step is None:
            torch.manual_seed(recipe.seed)
            self._checkpoint()  # step 0, the policy samplers start from

    @property
    def feed(self) -> RolloutFeed:
        """The rollouts from the spool, which rank 0 alone reads."""
        if self._feed is None:
            raise RuntimeError("only rank 0 reads the spool")
        return self._feed

    def train(
        self,
        *,
        should_stop: Callable[[], bool],
        on_step: Callable[[StepReport], None],
        poll_seconds: float = 0.05,
    ) -> None:
        """Train until ``recipe.steps`` or until ``should_stop`` (asked on rank 0) says so."""
        r = self.recipe
        while self.step < r.steps:
            began = time.perf_counter()
            taken = self._take(should_stop, poll_seconds)
            if taken is None:
                return
            # Rank 0's groups; the other ranks took none and get rank 0's samples.
            samples = _from_main(
                [x for g in taken.groups for x in g.samples(r.advantage_scale, self.step)]
            )
            waited = time.perf_counter() - began
            lr = lr_at(self.step, base_lr=r.lr, warmup_steps=r.warmup_steps)
            step = data_parallel_step if self.sharded else train_step
            result = step(
                self.policy,
                self.optimizer,
                samples,
                self.loss_config,
                lr=lr,
                max_grad_norm=r.max_grad_norm,
                temperature=r.temperature,
                micro_batch=r.micro_batch,
                ratio_against=r.ratio_against,
                reference=self.reference,
                async_level=r.async_level,
            )
            trained = time.perf_counter() - began - waited
            if result.applied:
                self.step += 1
                self._checkpoint()
            saved = time.perf_counter() - began - waited - trained
            if self.main:
                on_step(self._report(taken, result, lr, (waited, trained, saved)))

    def _take(self, should_stop: Callable[[], bool], poll_seconds: float) -> Taken | None:
        """The step's groups from the spool (rank 0), None when told to stop. The other
        ranks get an empty ``Taken`` (their samples come with ``_from_main``) and the
        stop with everyone: while rank 0 waits for rollouts it tells them so every
        ``WAIT_NOTICE`` seconds, so no collective waits longer than that."""
        r = self.recipe
        if not self.main:
            while (word := _from_main(None)) == _WAITING:
                pass
            return None if word == _STOP else Taken([], 0, 0)
        noticed = time.monotonic()

        def wait() -> bool:
            nonlocal noticed
            time.sleep(poll_seconds)
            if self.sharded and time.monotonic() - noticed > WAIT_NOTICE:
                _from_main(_WAITING)
                noticed = time.monotonic()
            return not should_stop()

        taken = (
            None
            if should_stop()
            else self.feed.take(r.prompts_per_step, self.step, r.async_level, wait=wait)
        )
        if self.sharded:
            _from_main(_STOP if taken is None else _GO)
        return taken

    def _report(
        self, taken: Taken, result: StepResult, lr: float, seconds: tuple[float, float, float]
    ) -> StepReport:
        waited, trained, saved = seconds
        records = [r for g in taken.groups for r in g.records]
        ages = [staleness(self.step - result.applied, g) for g in taken.groups]
        m, buckets = result.metrics, range(self.recipe.async_level + 1)
        return StepReport(
            step=self.step,
            applied=result.applied,
            task_reward=statistics.fmean(r.task_reward for r in records),
            reward=statistics.fmean(r.reward for r in records),
            length=statistics.fmean(len(r.output_ids) for r in records),
            loss=result.loss,
            grad_norm=result.grad_norm,
            clip_fraction=m["clip_fraction"],
            ratio_mean=m["ratio_mean"],
            ratio_max=m["ratio_max"],
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
            mismatch_kl=m["mismatch_kl"],
            mismatch_ratio_std=m["mismatch_ratio_std"],
            mismatch_ratio_min=m["mismatch_ratio_min"],
            mismatch_ratio_max=m["mismatch_ratio_max"],
            mismatch_kl_by_staleness=[m[f"mismatch_kl_stale{k}"] for k in buckets],
            tokens_by_staleness=[int(m[f"tokens_stale{k}"]) for k in buckets],
            tis_fraction=m["tis_fraction"],
            icepop_fraction=m["icepop_fraction"],
        )

    def _checkpoint(self) -> None:
        state: dict[str, Any] = {"rng": torch.get_rng_state(), "run": self.run}
        if self._feed is not None:
            state["feed"] = self._feed.state()
        ckpt.save_checkpoint(
            self.run_dir,
            self.step,
            self.policy,
            self.optimizer,
            self.tokenizer,
            state,
            dtype=self.serving,
            keep=self.keep_checkpoints,
        )
        if self._feed is not None:
            self._feed.release()

    def _check_same_run(self, state: dict[str, Any]) -> None:
        if state.get("run") != self.run:
            raise ValueError(f"{self.run_dir} holds run {state.get('run')!r}, not {self.run!r}")


# What rank 0 tells the others while it gathers a step's groups.
_WAITING, _GO, _STOP = "waiting", "go", "stop"
# Seconds between rank 0's notices that it still waits for rollouts.
WAIT_NOTICE = 5.0


def _from_main(value: T) -> T:
    """``value`` as rank 0 has it, on every rank (itself without a process group)."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def load_policy(path: Path, device: str, launch: TrainerLaunch, *, sharded: bool) -> TokenScorer:
    """The fp32 policy at ``path`` on ``device``, in the module that scores tokens with
    it; ``sharded``: over every rank of the process group (loaded on the CPU by rank 0
    and moved one FSDP unit at a time)."""
    if not sharded:
        model = _load_model(path, device)
    elif is_main():
        model = _load_model(path, "cpu")
    else:
        # Rank 0 alone reads the weights: were every rank to load the whole fp32
        # model, each would hold it in host memory (8 ranks of a 7B policy: 8 x 28
        # GB). The others build it on the meta device, without storage, and receive
        # their shards of rank 0's weights in ``shard``.
        model = model_skeleton(path)
    if launch.activation_checkpointing:
        # Per decoder layer; not reentrant, so it composes with FSDP2's hooks.
        model.gradient_checkpointing_enable({"use_reentrant": False})
    policy = TokenScorer(model)
    if sharded:
        placed = torch.device(device)
        if placed.type == "cuda":
            placed = torch.device("cuda", torch.cuda.current_device())
        shard(policy, device=placed, offload=launch.optimizer_offload)
    return policy


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
