"""The orchestrator daemon's settings: ``orchestrator.toml`` and ``SWARMRL_*``.

The service's own keys (files, keys, network, processes, validation, nodes and epochs)
and, beside them in the same file, the trainer's processes
(``orchestrator.trainer.launch.TrainerLaunch``) and every key of the training recipe
(``orchestrator.trainer.recipe.GRPORecipe``), which the trainer takes as they are. Read
with ``swarmrl.settings_toml.load_settings(OrchestratorSettings, path)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode

from orchestrator.trainer.launch import TrainerLaunch
from orchestrator.trainer.recipe import GRPORecipe
from swarmrl.chain.paths import deployment_path
from swarmrl.files import role_data_dir
from swarmrl.models.backend import Precision
from swarmrl.models.files import default_models_dir
from swarmrl.settings_toml import (
    SettingError,
    SwarmrlSettings,
    check_listen,
    check_peers,
    heading,
    split_commas,
)

DAY = 24 * 3600
# The orchestrator's name for its data folder: its default place (role_data_dir) and its
# claim on it (swarmrl.files.claim_data_dir).
ROLE = "orchestrator"
# A node held back for abandoning orders waits at most 2**this times abandon_cooldown.
MAX_COOLDOWN_DOUBLINGS = 3


def default_data_dir() -> Path:
    return role_data_dir(ROLE)


def _default_keystore_dir() -> Path:
    from swarmrl.keystore import default_dir  # eth_account: only when no keystore is given

    return default_dir()


class ServiceSettings(SwarmrlSettings):
    """The orchestrator service's own keys; OrchestratorSettings adds the training
    recipe's."""

    # -- files ---------------------------------------------------------------------
    model: Path = Field(
        default_factory=lambda: default_models_dir() / "default",
        description="The policy training starts from: an HF model directory (safetensors); "
        "`swarmrl model init` builds the default.",
        json_schema_extra=heading("Files"),
    )
    tasks: Path = Field(
        default_factory=lambda: default_data_dir() / "tasks.jsonl",
        description="The training tasks, .jsonl or .parquet (`swarmrl tasks generate`).",
    )
    data_dir: Path = Field(
        default_factory=default_data_dir,
        description="Everything the orchestrator needs to restart: ledger, checkpoints, "
        "rollouts, its peer identity. $SWARMRL_DATA_DIR moves the default to its "
        "orchestrator/ subfolder (no variable sets this key: a node and an orchestrator "
        "started from one shell keep apart).",
    )
    deployment: Path = Field(
        # A lambda: pydantic would pass a one-argument factory the other values.
        default_factory=lambda: deployment_path(),
        description="The chain deployment file (the one `swarmrl chain up` wrote by default). "
        "$SWARMRL_DEPLOYMENT moves the default for every command, as $SWARMRL_CHAIN_DIR does "
        "the chain folder it is in (no variable sets this key: a file's deployment wins).",
    )

    # -- keys ----------------------------------------------------------------------
    keystore_dir: Path = Field(
        default_factory=_default_keystore_dir,
        description="Where the keystores below live. $SWARMRL_KEYSTORE_DIR moves the default "
        "for every command (no variable sets this key: a file's keystore_dir wins).",
        json_schema_extra=heading("Keys"),
    )
    recorder_key: str = Field(
        "recorder",
        min_length=1,
        description="Keystore name of the key with the recorder role: it sends each epoch's "
        "work to the chain, and signs checkpoints, work orders and receipts (nodes trust "
        "the deployment's recorders).",
    )
    validator_key: str = Field(
        "validator",
        min_length=1,
        description="Keystore name of the key with the validator role: it slashes on evidence.",
    )
    password_file: Path | None = Field(
        None,
        description="The keystores' password, first line; unset: $SWARMRL_PASSWORD.",
        json_schema_extra={"example": "~/.config/swarmrl/password"},
    )

    # -- network -------------------------------------------------------------------
    listen: str = Field(
        "/ip4/127.0.0.1/tcp/4001",
        description="Multiaddr the libp2p host listens on; /ip4/0.0.0.0/... to accept "
        "nodes from other machines.",
        json_schema_extra=heading("Network"),
    )
    metrics_port: int = Field(
        9464, ge=1, le=65535, description="Prometheus metrics on 127.0.0.1 at this port."
    )
    bootstrap: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Other peers of the weight swarm, multiaddrs ending in /p2p/<peer id> "
        "(in the environment: separated by commas).",
    )

    # -- processes -----------------------------------------------------------------
    threads: int = Field(
        0,
        ge=0,
        le=1024,
        description="CPU threads per process (0: chosen from the cores).",
        json_schema_extra=heading("Processes"),
    )
    device: str = Field(
        "cpu", description="torch device of the trainer and validator: cpu, cuda:N."
    )

    # -- validation ----------------------------------------------------------------
    validation_rate: float = Field(
        0.25,
        ge=0,
        le=1,
        description="Share of a trusted node's submissions checked by prefill (TOPLOC and "
        "log-probabilities).",
        json_schema_extra=heading("Validation"),
    )
    trust_after: int = Field(
        3,
        ge=0,
        le=1_000_000,
        description="Fully checked submissions a new node passes before it is sampled at "
        "validation_rate.",
    )
    max_backlog: int = Field(
        8,
        ge=1,
        le=100_000,
        description="Submissions awaiting validation or training, per validator worker, "
        "before nodes are told to wait (the bound is max_backlog x validator_workers): "
        "work beyond it would only go stale.",
    )
    validator_workers: int = Field(
        1,
        ge=1,
        le=256,
        description="Validator processes, each prefilling on its own device and leasing "
        "submissions from the ledger (a dead one's lease expires and another takes its "
        "submission over); the intake backlog bound grows with them.",
    )
    validator_devices: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="torch devices of the validator processes, one per worker in order "
        "(cuda:4,cuda:5); empty: every worker on `device` (in the environment: separated "
        "by commas).",
    )
    code_check_rate: float = Field(
        1.0, ge=0, le=1, description="Share of code rewards recomputed in the sandbox."
    )
    validation_grace: float = Field(
        600.0,
        ge=0,
        le=30 * DAY,
        description="Seconds after an epoch ends that validation may hold its record back.",
    )
    precision: Precision = Field(
        "fp32",
        description="fp32 or bf16: the dtype nodes sample in (their work orders say so) and "
        "the validator prefills in, so both compute alike, and the dtype the policy is "
        "published in (the trainer's master weights stay fp32): a node downloads no bit it "
        "would round away. bf16 for a run whose nodes have GPUs (also with the validator on "
        "a CPU; it halves every download); fp32 keeps a CPU-only run fast, as bf16 matmuls "
        "on a CPU are slow.",
    )
    weight_deltas: bool = Field(
        True,
        description="Also publish each step as its difference from the step before "
        "(about 1% of the policy at real learning rates), so a node holding that step "
        "downloads only what changed; a node without it fetches the whole step.",
    )
    keep_checkpoints: int = Field(
        2,
        ge=1,
        le=10_000,
        description="Newest checkpoints that keep what resuming needs (optimizer state, "
        "fp32 master weights); older ones keep their published policy only.",
    )

    # -- nodes and epochs -----------------------------------------------------------
    prompts_per_assignment: int = Field(
        4,
        ge=1,
        le=10_000,
        description="Tasks in one assignment given to a node.",
        json_schema_extra=heading("Nodes and epochs"),
    )
    assignment_seconds: float = Field(
        300.0,
        gt=0,
        le=7 * DAY,
        description="Deadline of an assignment; unanswered, it goes to another node.",
    )
    abandon_limit: int = Field(
        3,
        ge=2,
        le=1_000_000,
        description="Orders a node may leave unanswered past their deadlines in a row "
        "before it gets no new work for abandon_cooldown; an answered order starts the "
        "count over, so an order lost to a crash now and then costs an honest node nothing.",
    )
    abandon_cooldown: float = Field(
        600.0,
        gt=0,
        le=DAY,
        description="Seconds a node held back by abandon_limit waits for new work after "
        "its last order's deadline, doubled for each further order it abandons (at most "
        f"{2**MAX_COOLDOWN_DOUBLINGS} times this).",
    )
    heartbeat_seconds: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="How often nodes send a heartbeat, while the swarm is small enough "
        "for heartbeat_rate.",
    )
    heartbeat_rate: float = Field(
        20.0,
        gt=0,
        le=1e6,
        description="Heartbeats a second asked of the whole swarm at most: past "
        "heartbeat_rate x heartbeat_seconds nodes, a joining node is told to beat less "
        "often (at most every gone_after / (silent_after + 1) seconds).",
    )
    silent_after: int = Field(
        3, ge=1, le=1000, description="Missed heartbeats before a node counts as silent."
    )
    gone_after: float = Field(
        300.0,
        gt=0,
        le=30 * DAY,
        description="Seconds without a heartbeat before a node counts as gone; more than "
        "silent_after x heartbeat_seconds.",
    )
    epoch_seconds: int = Field(
        3600,
        ge=1,
        le=30 * DAY,
        description="Length of an epoch, the unit of work recorded on chain (the demo: 120).",
    )

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        return check_listen(value)

    @field_validator("bootstrap", "validator_devices", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        return split_commas(value)

    @field_validator("bootstrap")
    @classmethod
    def _bootstrap(cls, value: list[str]) -> list[str]:
        return check_peers("bootstrap", value)

    @model_validator(mode="after")
    def _a_device_per_validator(self) -> ServiceSettings:
        given = len(self.validator_devices)
        if given and given != self.validator_workers:
            raise SettingError(
                ("validator_devices", "validator_workers"),
                f"validator_devices names {given} device(s) for {self.validator_workers} "
                "validator worker(s): name one per worker, or none",
            )
        return self

    def validator_device(self, worker: int) -> str:
        """The torch device of validator worker ``worker`` (0-based)."""
        return self.validator_devices[worker] if self.validator_devices else self.device

    @model_validator(mode="after")
    def _heartbeats_before_gone(self) -> ServiceSettings:
        silent = self.silent_after * self.heartbeat_seconds
        if self.gone_after <= silent:
            raise SettingError(
                ("gone_after", "silent_after", "heartbeat_seconds"),
                f"gone_after must be more than silent_after x heartbeat_seconds = {silent:g} "
                f"seconds, got {self.gone_after:g}",
            )
        return self


# The bases in this order put the service's keys first, the trainer's processes next and
# the recipe's last, in the template and wherever else the fields are listed (pydantic
# lists the fields of the last base first). Their model_config are ConfigDicts and a
# SettingsConfigDict, which pydantic merges and mypy takes for a clash.
class OrchestratorSettings(GRPORecipe, TrainerLaunch, ServiceSettings):  # type: ignore[misc]
    """Settings of the swarmrl orchestrator (`swarmrl orchestrator run --config FILE`).

    The defaults run a small swarm on one laptop against `swarmrl chain up`."""

    def recipe(self) -> GRPORecipe:
        """The training recipe of this configuration on its own, as the trainer takes it."""
        return GRPORecipe(**{name: getattr(self, name) for name in GRPORecipe.model_fields})
