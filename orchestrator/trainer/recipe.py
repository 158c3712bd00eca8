"""The GRPO training recipe: every knob of a run's sampling, loss and optimizer, once.

Each field carries its default, its bounds and its meaning, and everything else is
generated from them: the orchestrator's settings take the recipe's keys in
``orchestrator.toml`` and ``SWARMRL_*`` (``OrchestratorSettings`` is a recipe),
``swarmrl train local`` has one option per field (``--group-size``), the trainer loop
takes a recipe, and docs/configuration.md's reference table is rendered from this model.

Defaults are INTELLECT-2's where it states them (clip 0.2, delta 4, gradient norm
0.1, async level 2) and what the default model learns with for the rest.

No torch here: the daemon's settings and the command line import it at start.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from swarmrl.cli_options import MAX_SEED
from swarmrl.settings_toml import SettingError, heading

if TYPE_CHECKING:
    from orchestrator.trainer.loss import LossConfig

# Advantages: reward minus the group's mean (none), or that divided by the group's std.
AdvantageScale = Literal["none", "std"]
# The importance ratio's denominator (see orchestrator.trainer.step).
RatioAgainst = Literal["sampler", "trainer"]


class GRPORecipe(BaseModel):
    """How a policy is trained with asynchronous GRPO: what is sampled, the loss, the
    optimizer."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    steps: int = Field(
        100,
        ge=1,
        le=10_000_000,
        description="Policy steps to train.",
        json_schema_extra=heading("Training recipe"),
    )
    group_size: int = Field(8, ge=2, le=1024, description="Completions sampled per task.")
    prompts_per_step: int = Field(
        16, ge=1, le=100_000, description="Tasks (groups) per optimizer step."
    )
    async_level: int = Field(
        2,
        ge=0,
        le=1000,
        description="How many steps behind the trainer the policy a sample was generated "
        "with may be; older samples are dropped.",
    )
    max_tokens: int = Field(128, ge=1, le=65_536, description="Longest completion, in tokens.")
    target_len: int = Field(
        128,
        ge=1,
        le=65_536,
        description="Thinking budget stated in prompts; the orchestrator gives it to a node "
        "whose speed is not known yet, and known speeds earn budgets that fit the "
        "assignment's deadline.",
    )
    temperature: float = Field(1.0, gt=0, le=100, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass (1: off).")
    lr: float = Field(1e-4, gt=0, le=1, description="Peak learning rate (AdamW).")
    warmup_steps: int = Field(
        5, ge=0, le=10_000_000, description="Steps of linear learning-rate warm-up."
    )
    weight_decay: float = Field(0.0, ge=0, le=1, description="AdamW weight decay.")
    max_grad_norm: float = Field(0.1, gt=0, description="Gradient norm clip.")
    eps_low: float = Field(0.2, ge=0, lt=1, description="PPO clip below: ratio >= 1 - eps_low.")
    eps_high: float = Field(0.2, ge=0, description="PPO clip above: ratio <= 1 + eps_high.")
    delta: float = Field(
        4.0,
        ge=1,
        description="Dual clip: the ratio's bound where the advantage is negative; "
        "at least 1 + eps_high.",
    )
    advantage_scale: AdvantageScale = Field(
        "none", description="Advantages divided by the group's std (std) or not (none)."
    )
    ratio_against: RatioAgainst = Field(
        "sampler",
        description="The importance ratio's denominator: the sampler's log-probabilities "
        "(those the tokens were drawn with) or the trainer's, recomputed before the update "
        "(as INTELLECT-2 did).",
    )
    tis_cap: float = Field(
        0.0,
        ge=0,
        description="Truncated importance sampling: each token's policy gradient weighed by "
        "min(trainer / sampler probability ratio, tis_cap) (0: off; else at least 1). "
        "Needs ratio_against = trainer: against the sampler the ratio is that weight "
        "already.",
    )
    icepop_low: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="IcePop: tokens whose trainer / sampler probability ratio is below "
        "this are left out of the loss (0: none).",
    )
    icepop_high: float = Field(
        0.0,
        ge=0,
        description="IcePop: tokens whose trainer / sampler probability ratio is above "
        "this are left out of the loss (0: none; else more than 1).",
    )
    kl_coef: float = Field(0.0, ge=0, description="k3 KL penalty to the starting model (0: off).")
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus (0: off).")
    micro_batch: int = Field(
        32, ge=1, le=65_536, description="Sequences per forward/backward pass."
    )
    seed: int = Field(
        0,
        ge=0,
        le=MAX_SEED,
        description="Seed of the trainer's random state (`train local`: also of sampling and "
        "of the task order).",
    )

    @field_validator("temperature", "top_p")
    @classmethod
    def _signable(cls, value: float) -> float:
        # Work orders sign them as integer millionths.
        if round(value * 1_000_000) / 1_000_000 != value:
            raise ValueError("must be a multiple of 0.000001")
        return value

    @field_validator("tis_cap")
    @classmethod
    def _cap_at_least_one(cls, value: float) -> float:
        # A cap below 1 would shrink every token's weight, not bound the outliers.
        if value != 0 and value < 1:
            raise ValueError("must be 0 (off) or at least 1")
        return value

    @field_validator("icepop_high")
    @classmethod
    def _upper_bound_above_one(cls, value: float) -> float:
        # With icepop_low < 1 (its field's bound), [low, high] holds ratio 1: the
        # tokens the trainer and the sampler agree on are never dropped.
        if value != 0 and value <= 1:
            raise ValueError("must be 0 (none) or more than 1")
        return value

    @model_validator(mode="after")
    def _tis_against_the_trainer(self) -> GRPORecipe:
        if self.tis_cap > 0 and self.ratio_against != "trainer":
            raise SettingError(
                ("tis_cap", "ratio_against"),
                "tis_cap needs ratio_against = trainer: against the sampler the PPO ratio "
                "is the importance weight already, and TIS would weigh tokens by its square",
            )
        return self

    @model_validator(mode="after")
    def _dual_clip_above_the_clip(self) -> GRPORecipe:
        if self.delta < 1 + self.eps_high:
            raise SettingError(
                ("delta", "eps_high"),
                f"delta must be at least 1 + eps_high = {1 + self.eps_high:g}, got {self.delta:g}",
            )
        return self

    def loss_config(self) -> LossConfig:
        """The loss's knobs. Its normalizer is Dr. GRPO's constant: sequences per step x
        the longest completion allowed."""
        from orchestrator.trainer.loss import LossConfig  # torch

        return LossConfig(
            normalizer=float(self.prompts_per_step * self.group_size * self.max_tokens),
            eps_low=self.eps_low,
            eps_high=self.eps_high,
            delta=self.delta,
            kl_coef=self.kl_coef,
            entropy_coef=self.entropy_coef,
            tis_cap=self.tis_cap,
            icepop_low=self.icepop_low,
            # The recipe says "no upper bound" with 0, as it has no infinities.
            icepop_high=self.icepop_high or math.inf,
        )
