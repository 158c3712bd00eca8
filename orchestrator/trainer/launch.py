"""How many processes the trainer runs as, and how they are sharded: its launch settings.

One process per GPU, as torchrun starts them: ``nproc_per_node`` on this machine,
``nnodes`` machines in all meeting at ``rdzv_endpoint`` (torch.distributed.elastic's
c10d rendezvous, served by the first machine). With more than one process the trainer
shards the policy with FSDP2 (``orchestrator.trainer.distributed``); with one it is the
plain single-process trainer. These settings change how a step is computed, never what
it computes (the recipe, ``orchestrator.trainer.recipe``, is that), so a run may resume
on another number of processes.

No torch here: the daemon's settings and the command line import it at start.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from swarmrl.settings_toml import heading


class TrainerLaunch(BaseModel):
    """The trainer's processes: how many, on how many machines, and how each holds the
    policy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    nproc_per_node: int = Field(
        1,
        ge=1,
        le=64,
        description="Trainer processes on this machine, one per GPU (cuda devices 0..n-1 "
        "when `device` is cuda); more than one shards the policy with FSDP2.",
        json_schema_extra=heading("Trainer processes"),
    )
    nnodes: int = Field(
        1,
        ge=1,
        le=1024,
        description="Machines the trainer spans; the others run `swarmrl orchestrator "
        "trainer --config FILE` with this file, and every machine mounts the data "
        "folder at the same path (each rank writes its part of a checkpoint).",
    )
    rdzv_endpoint: str = Field(
        "127.0.0.1:29400",
        description="host:port where the trainer's processes meet (torch.distributed "
        "c10d rendezvous, served by this machine); another machine's address only with "
        "nnodes > 1.",
    )
    activation_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer's activations in the backward pass "
        "instead of keeping them: about a third more compute for a fraction of the "
        "activation memory.",
    )
    optimizer_offload: bool = Field(
        False,
        description="Keep the sharded parameters, gradients and AdamW state in host "
        "memory and step the optimizer on the CPU (FSDP2 CPU offload): frees about 12 "
        "bytes a parameter of GPU memory, costs host-device copies every step.",
    )

    @field_validator("rdzv_endpoint")
    @classmethod
    def _host_port(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9.\-\[\]:]+:\d{1,5}", value) or not (
            0 < int(value.rsplit(":", 1)[1]) < 65536
        ):
            raise ValueError("must be host:port, like 127.0.0.1:29400")
        return value

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    @property
    def distributed(self) -> bool:
        """Whether the trainer runs as a torch.distributed job (FSDP2)."""
        return self.world_size > 1

    def threads_per_process(self, threads: int) -> int:
        """Each of this machine's trainer processes' share of ``threads`` (at least 1)."""
        return max(1, threads // self.nproc_per_node)

    def launch_fields(self) -> TrainerLaunch:
        """These settings on their own (from a model that composes them with others)."""
        return TrainerLaunch(**{name: getattr(self, name) for name in TrainerLaunch.model_fields})
