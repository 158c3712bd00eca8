"""The reference learner of ``swarmrl bench learner``: TRL's ``GRPOTrainer``.

What it measures: how far a stock, single-process GRPO trainer gets in a given
wall time, from the same weights, on the same tasks, with the same prompts,
reward, loss and optimizer settings as our learner. ``run_trl`` trains and saves
a snapshot of the policy at step 0 and every ``settings.snapshot_every`` optimizer
steps; the snapshots are evaluated later, on held-out tasks, by the benchmark.

How each setting is held equal (``LearnerSettings.recipe`` field -> TRL argument):

- prompts: each dataset row holds the conversation ``[{"role": "user", "content":
  budget_prompt(task.prompt, TARGET_LEN)}]``. TRL renders conversational prompts
  with ``tokenizer.apply_chat_template(..., add_generation_prompt=True,
  tokenize=True)``, the very call ``swarmrl.models.directory.encode_prompt`` makes,
  so the ids are those of ``swarmrl.rollouts.generate.prompt_ids`` (the template
  writes the BOS itself, and no other special token is added). ``run_trl`` checks
  this for every task, through TRL's own tokenizing method, before training.
- reward: ``task_reward(task, text) - length_penalty(TARGET_LEN, n)`` with ``n`` the
  completion's token count. TRL's completion ids run up to and including the first
  EOS, as our sampler's output ids do, so ``n`` counts the EOS when there is one.
  TRL decodes the text with ``skip_special_tokens=True``, as our backend does. The
  task is found by the dataset's ``task_index`` column.
- group_size -> ``num_generations``; ``scale_rewards="none"``, so the advantage is
  the reward minus its group's mean.
- prompts_per_step -> one optimizer step per ``prompts_per_step`` groups:
  ``per_device_train_batch_size = prompts_per_step * group_size``,
  ``gradient_accumulation_steps = 1`` and ``steps_per_generation = 1``: each step
  generates one batch of ``prompts_per_step * group_size`` completions and takes one
  optimizer step on all of them, in one forward and backward pass.
- lr -> ``learning_rate``, warmup_steps -> ``warmup_steps`` with
  ``lr_scheduler_type="constant_with_warmup"``; weight_decay -> ``weight_decay``
  (the Trainer, like ours, exempts norm weights and biases); AdamW betas
  (0.9, 0.999) -> ``adam_beta1``/``adam_beta2``; max_grad_norm -> ``max_grad_norm``.
- eps_low -> ``epsilon``, eps_high -> ``epsilon_high``, delta -> ``delta`` (the
  bound on the ratio, INTELLECT-2's two-sided clip); ``loss_type="dr_grpo"`` (token
  losses summed and divided by sequences times ``max_completion_length``);
  ``beta=0.0`` (no KL term, no reference model); ``num_iterations=1``.
- max_tokens -> ``max_completion_length``; temperature -> ``temperature``;
  ``top_p=1.0``, ``top_k=0``; generation by ``model.generate`` (``use_vllm=False``).
- float32 on the CPU (``use_cpu=True``, ``bf16=False``: TRL's default is bf16), no
  activation (gradient) checkpointing (TRL's default is on; our learner does not
  checkpoint); seed -> ``seed``; tasks are taken in the order given
  (``shuffle_dataset=False``), ``prompts_per_step`` at a time, cycling.
- no logging integration (``report_to="none"``), no checkpoints or evaluation by TRL
  (``save_strategy="no"``, ``eval_strategy="no"``): snapshots are ours, by callback.

What TRL does differently, and cannot be told not to:

- warmup: transformers' ``constant_with_warmup`` gives optimizer step ``k`` (from 1)
  the rate ``lr * (k - 1) / warmup_steps``; ours gives ``lr * k / warmup_steps``. TRL's
  first step runs at rate 0 (AdamW's moments move, the weights do not), and it
  reaches the full rate one step after ours.
- the ratio's reference: with one generation per step and ``num_iterations=1``, TRL
  takes the current policy's detached log-probabilities as the "old" ones, so the
  ratio is exactly 1 and neither clip can bind; ours divides by the sampler's
  log-probabilities (about 1 when fresh, not when stale).
- no online filter: TRL trains on every group, also those whose task rewards are all
  equal (their advantages then come from the length term alone); ours drops them.
- a step with a non-finite loss or gradient norm is applied; ours is skipped.
- samples differ draw by draw: TRL samples from the global torch generator seeded
  once, ours from a seed per batch; with left padding, TRL's training forward shifts
  a prompt's positions by its padding, which rotary embeddings make irrelevant but
  for rounding. TRL also drops the last ``len(tasks) % prompts_per_step`` tasks of
  each pass.

TRL runs alone, so it gets every core (``torch.set_num_threads(os.cpu_count())``).
Nothing is downloaded: the model and tokenizer are loaded here from local files and
handed to the trainer, and the Hub is switched to offline mode.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

# Read by huggingface_hub when it is first imported; run_trl also sets it at run time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch

from benchmarks.learner_settings import TARGET_LEN, LearnerSettings, Snapshot
from swarmrl.rollouts.generate import prompt_ids
from swarmrl.tasks import Task, budget_prompt, length_penalty
from swarmrl.tasks.rewards import task_reward


def _dataset_rows(tasks: list[Task]) -> list[dict[str, Any]]:
    """One row per task: its conversation and its index in ``tasks``. A conversation,
    not a templated string, so that TRL renders it with the chat template exactly as
    ``encode_prompt`` does: the template's BOS, and no special token added besides."""
    return [
        {
            "prompt": [{"role": "user", "content": budget_prompt(task.prompt, TARGET_LEN)}],
            "task_index": i,
        }
        for i, task in enumerate(tasks)
    ]


def _reward_function(tasks: list[Task]) -> Any:
    """TRL's reward function: our task reward minus INTELLECT-2's length term."""

    def swarmrl_reward(
        completions: list[list[dict[str, str]]],
        completion_ids: list[list[int]],
        task_index: list[int],
        **_: Any,
    ) -> list[float]:
        return [
            task_reward(tasks[i], completion[-1]["content"]) - length_penalty(TARGET_LEN, len(ids))
            for completion, ids, i in zip(completions, completion_ids, task_index, strict=True)
        ]

    return swarmrl_reward


def _check_prompts(
    trainer: Any, tokenizer: Any, tasks: list[Task], rows: list[dict[str, Any]]
) -> None:
    """Raise unless TRL tokenizes every prompt to exactly our trainer's ids."""
    # _tokenize_prompts is the method TRL's generation step calls on a batch of prompts.
    theirs, _, _ = trainer._tokenize_prompts([row["prompt"] for row in rows])
    for task, ids in zip(tasks, theirs, strict=True):
        ours = prompt_ids(tokenizer, task.prompt, TARGET_LEN)
        if list(ids) != ours:
            raise RuntimeError(
                f"TRL tokenizes the prompt of {task.problem_id} as {list(ids)}, not {ours}"
            )


def _grpo_config(settings: LearnerSettings, out: Path, max_steps: int) -> Any:
    from trl import GRPOConfig

    recipe = settings.recipe
    return GRPOConfig(
        output_dir=str(out / "trl"),
        # The batch: prompts_per_step groups of group_size, one optimizer step each.
        num_generations=recipe.group_size,
        per_device_train_batch_size=recipe.prompts_per_step * recipe.group_size,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        shuffle_dataset=False,
        max_steps=max_steps,
        # Sampling.
        max_completion_length=recipe.max_tokens,
        temperature=recipe.temperature,
        top_p=1.0,
        top_k=0,
        use_vllm=False,
        # The loss.
        loss_type="dr_grpo",
        scale_rewards="none",
        beta=0.0,
        epsilon=recipe.eps_low,
        epsilon_high=recipe.eps_high,
        delta=recipe.delta,
        # The optimizer and its schedule.
        learning_rate=recipe.lr,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=recipe.warmup_steps,
        weight_decay=recipe.weight_decay,
        optim="adamw_torch",
        adam_beta1=0.9,
        adam_beta2=0.999,
        max_grad_norm=recipe.max_grad_norm,
        # The machine: float32 on the CPU.
        use_cpu=True,
        bf16=False,
        fp16=False,
        activation_checkpointing=False,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        seed=recipe.seed,
        # Nothing but training: no integrations, checkpoints or evaluation.
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
    )


def run_trl(
    model_dir: Path,
    tasks: list[Task],
    settings: LearnerSettings,
    out: Path,
    max_seconds: float,
    max_steps: int,
) -> list[Snapshot]:
    """Train ``model_dir`` with TRL's GRPOTrainer on ``tasks`` for at most ``max_steps``
    optimizer steps or ``max_seconds`` of training time; return the snapshots saved
    under ``out/step_<n>/``. The clock starts when the Trainer begins its training loop
    (model loading and the trainer's setup are not counted). TRL's own log, one entry
    per step with its mean reward, goes to ``out/trl_log.json``."""
    import huggingface_hub.constants
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOTrainer

    from swarmrl.models.directory import load_tokenizer

    # The environment variable only counts if huggingface_hub was not imported yet.
    huggingface_hub.constants.HF_HUB_OFFLINE = True
    torch.set_num_threads(os.cpu_count() or 1)
    groups = settings.recipe.prompts_per_step
    if len(tasks) < groups:
        raise ValueError(f"{len(tasks)} tasks cannot fill a step of {groups} prompts")
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, local_files_only=True
    )
    # The Trainer turns the config's use_cache off for training; snapshots keep the original.
    use_cache = model.config.use_cache
    rows = _dataset_rows(tasks)
    snapshots: list[Snapshot] = []

    class Snapshots(TrainerCallback):
        """Saves the policy at step 0 and every ``snapshot_every`` steps; keeps the
        training clock (saving excluded) and stops the run when it runs out."""

        def __init__(self) -> None:
            self.began = 0.0
            self.saving = 0.0

        def elapsed(self) -> float:
            return time.perf_counter() - self.began - self.saving

        def save(self, step: int, seconds: float, model: Any) -> None:
            began = time.perf_counter()
            path = out / f"step_{step}"
            training_use_cache, model.config.use_cache = model.config.use_cache, use_cache
            model.save_pretrained(path)
            model.config.use_cache = training_use_cache
            tokenizer.save_pretrained(path)
            size = settings.recipe.group_size
            snapshots.append(Snapshot(step, seconds, step * groups * size, path))
            self.saving += time.perf_counter() - began

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.began = time.perf_counter()
            self.save(0, 0.0, kwargs["model"])

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            seconds, step = self.elapsed(), state.global_step
            if step % settings.snapshot_every == 0:
                self.save(step, seconds, kwargs["model"])
            if seconds >= max_seconds:
                control.should_training_stop = True
            return control

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=_reward_function(tasks),
        args=_grpo_config(settings, out, max_steps),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[clock := Snapshots()],
    )
    _check_prompts(trainer, tokenizer, tasks, rows)
    # TRL 1.16 logs no generation time of its own: time its generation method.
    generate, generating = trainer._generate, 0.0

    def timed_generate(*args: Any, **kwargs: Any) -> Any:
        nonlocal generating
        began = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            generating += time.perf_counter() - began

    trainer._generate = timed_generate
    trainer.train()
    (out / "trl_log.json").write_text(json.dumps(trainer.state.log_history, indent=1))
    timing = {"seconds_generating": generating, "seconds": clock.elapsed()}
    (out / "trl_timing.json").write_text(json.dumps(timing))
    return snapshots
