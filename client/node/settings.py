"""The node daemon's settings: ``node.toml`` and ``SWARMRL_*``.

Read with ``swarmrl.settings_toml.load_settings(NodeSettings, path)``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import NoDecode

from client.node.machine.conditions import parse_window
from swarmrl.chain.paths import deployment_path
from swarmrl.files import role_data_dir
from swarmrl.settings_toml import (
    SettingError,
    SwarmrlSettings,
    check_listen,
    check_peer,
    check_peers,
    heading,
    split_commas,
)

# "none": the node dials out only (behind NAT) and serves no shards.
OUTBOUND_ONLY = "none"
# The node's name for its data folder: its default place (role_data_dir) and its claim
# on it (swarmrl.files.claim_data_dir).
ROLE = "node"
_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d{1,3})?")


def default_data_dir() -> Path:
    return role_data_dir(ROLE)


def _default_keystore_dir() -> Path:
    from swarmrl.keystore import default_dir  # eth_account: only when no keystore is given

    return default_dir()


class NodeSettings(SwarmrlSettings):
    """Settings of a swarmrl node (`swarmrl node run --config FILE`).

    Set orchestrator to the address the orchestrator prints; the rest works as it is on
    one laptop against `swarmrl chain up`."""

    # -- files and keys ------------------------------------------------------------
    data_dir: Path = Field(
        default_factory=default_data_dir,
        description="Everything the node needs to restart: its journal of submissions and "
        "receipts, and the weight store; a folder of its own, never an orchestrator's. "
        "$SWARMRL_DATA_DIR moves the default to its node/ subfolder (no variable sets this "
        "key: a node and an orchestrator started from one shell keep apart).",
        json_schema_extra=heading("Files and keys"),
    )
    deployment: Path = Field(
        # A lambda: pydantic would pass a one-argument factory the other values.
        default_factory=lambda: deployment_path(),
        description="The chain deployment file (the one `swarmrl chain up` wrote by default). "
        "$SWARMRL_DEPLOYMENT moves the default for every command, as $SWARMRL_CHAIN_DIR does "
        "the chain folder it is in (no variable sets this key: a file's deployment wins).",
    )
    keystore_dir: Path = Field(
        default_factory=_default_keystore_dir,
        description="Where the node's keystore lives. $SWARMRL_KEYSTORE_DIR moves the default "
        "for every command (no variable sets this key: a file's keystore_dir wins).",
    )
    key: str = Field(
        "node",
        min_length=1,
        description="Keystore name of the node's key (`swarmrl node init` creates it).",
    )
    password_file: Path | None = Field(
        None,
        description="The keystore's password, first line; unset: $SWARMRL_PASSWORD.",
        json_schema_extra={"example": "~/.config/swarmrl/password"},
    )
    provider_key: str | None = Field(
        None,
        min_length=1,
        description="Keystore name of the provider's key, for claiming rewards from the "
        "terminal app (key c); its password: password_file, else asked for; unset: claim "
        "with `swarmrl wallet claim`.",
        json_schema_extra={"example": "provider"},
    )

    tasks: Path = Field(
        default_factory=lambda: default_data_dir() / "tasks.jsonl",
        description="The run's task set (the orchestrator's publishes it): prompts and "
        "answers the node scores its own completions with.",
    )

    # -- network -------------------------------------------------------------------
    orchestrator: str | None = Field(
        None,
        description="The orchestrator's multiaddr, ending in /p2p/<peer id>; required to run.",
        json_schema_extra={
            "example": "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooW...",
            **heading("Network"),
        },
    )
    bootstrap: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="More peers to pull weights from, multiaddrs ending in /p2p/<peer id> "
        "(in the environment: separated by commas).",
    )
    listen: str = Field(
        "/ip4/127.0.0.1/tcp/0",
        description="Multiaddr the node listens on (port 0: any free one); none: outbound "
        "only, as behind NAT.",
    )
    metrics_port: int = Field(
        9465, ge=1, le=65535, description="Prometheus metrics on 127.0.0.1 at this port."
    )

    # -- generation ----------------------------------------------------------------
    backend: Literal["auto", "torch", "vllm"] = Field(
        "auto",
        description="Inference backend; auto: vllm when it is installed and a GPU is there, "
        "else torch.",
        json_schema_extra=heading("Generation"),
    )
    device: str = Field(
        "auto", description="torch device: auto (cuda when present, else cpu), cpu, cuda:N."
    )
    threads: int = Field(
        0, ge=0, le=1024, description="CPU threads for generation (0: chosen from the cores)."
    )
    max_batch: int = Field(32, ge=1, le=65_536, description="Most sequences generated at once.")
    weights_timeout: float = Field(
        600.0,
        gt=0,
        le=86_400,
        description="Seconds to wait for a policy's weights before asking the swarm again.",
    )

    # -- workers and GPUs ----------------------------------------------------------
    gpus: Annotated[list[int], NoDecode] = Field(
        default_factory=list,
        description="The GPUs to work on, by CUDA index, when the device is cuda (in the "
        "environment: separated by commas); empty: every GPU torch sees. The node runs a "
        "worker per GPU (per tensor_parallel_size GPUs), all under its one key and stake.",
        json_schema_extra={"example": [0, 1], **heading("Workers and GPUs")},
    )
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        le=64,
        description="GPUs one worker shards the model over (vllm); it must divide the GPUs.",
    )
    gpu_memory_fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Share of each GPU's memory a worker may take (none: vllm's 0.9, all for "
        "torch); lower it to leave room for the machine's own use of the GPU.",
        json_schema_extra={"example": 0.8},
    )
    max_model_len: int | None = Field(
        None,
        ge=16,
        le=1 << 20,
        description="Longest prompt and completion vllm plans memory for (none: the "
        "model's); lower it when the model's own does not fit the GPU.",
        json_schema_extra={"example": 8192},
    )
    cpu_workers: int = Field(
        1,
        ge=1,
        le=256,
        description="Workers on a CPU node, each pinned to its share of the cores (one per "
        "socket, say).",
    )
    worker_memory_gib: float | None = Field(
        None,
        gt=0,
        le=1_000_000,
        description="RAM cap of each worker, in GiB (none: no cap): a worker past it is "
        "stopped and started again, which counts as one of its exits.",
        json_schema_extra={"example": 16.0},
    )
    worker_exits: int = Field(
        100,
        ge=1,
        le=100_000,
        description="Worker exits in a row, with no order done between them, after which "
        "the node takes no work until you resume it (BOINC gives a task 100).",
    )

    # -- limits --------------------------------------------------------------------
    max_download_mbps: float | None = Field(
        None,
        gt=0,
        le=1_000_000,
        description="Cap on the average rate of weight downloads, in Mbit/s (none: no cap), "
        "for a link the machine also uses. A download slower than a training step is "
        "finished while the orchestrator still takes work on its step.",
        json_schema_extra={"example": 50.0, **heading("Limits")},
    )
    max_upload_mbps: float | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="Cap on the average rate of all the node sends, in Mbit/s (none: no cap): "
        "weights served to peers and its submissions, which go first (the orchestrator "
        "cuts off a submission slower than 0.5 Mbit/s).",
        json_schema_extra={"example": 10.0},
    )
    max_weight_store_gib: float | None = Field(
        None,
        gt=0,
        le=1_000_000,
        description="Most disk the downloaded weights may take, in GiB (none: no cap); the "
        "oldest versions go first, the newest is always kept.",
        json_schema_extra={"example": 20.0},
    )
    min_free_disk_gib: float = Field(
        1.0,
        # Never 0: the node needs room for its own files (an order's rollouts, their
        # copy in the journal, the receipt), and a disk it fills to the last byte
        # fails those writes, not the weights'.
        ge=0.25,
        le=1_000_000,
        description="Free disk to leave where data_dir is, in GiB: below it the node takes "
        "no work, and it fetches no weights that would take the disk below it.",
    )
    monthly_transfer_gib: float | None = Field(
        None,
        gt=0,
        le=1_000_000,
        description="Most the node may move in a calendar month (UTC), in GiB: weights "
        "fetched and served and submissions, in and out (none: no quota). Past it nothing "
        "moves and the node takes no work until the month turns.",
        json_schema_extra={"example": 500.0},
    )

    # -- when to run ---------------------------------------------------------------
    idle_minutes: float = Field(
        0.0,
        ge=0,
        le=1440,
        description="Work only once the keyboard, the mouse and the terminals have been left "
        "alone this many minutes; 0: whether or not someone uses the machine.",
        json_schema_extra=heading("When to run"),
    )
    pause_gpu_while_active: bool = Field(
        True,
        description="A node that generates on a GPU pauses while the machine is in use: "
        "input within idle_minutes, or within the last 3 minutes when idle_minutes is 0.",
    )
    pause_on_battery: bool = Field(True, description="Pause while the machine runs on battery.")
    max_other_load: int = Field(
        0,
        ge=0,
        le=100,
        description="Pause while processes other than the node keep the CPUs busier than "
        "this percentage of all cores, averaged over a minute; 0: never.",
    )
    schedule: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description='Weekly windows to work in, local time, e.g. "mon-fri 18:00-08:00", '
        '"sat-sun", "daily 22:00-07:00"; one that ends before it starts runs into the next '
        "day (in the environment: separated by commas); empty: any time.",
    )
    pause_while_running: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Programs that pause work while any of them runs, by the name ps shows "
        "(any case), e.g. steam (in the environment: separated by commas).",
    )

    @field_validator("orchestrator")
    @classmethod
    def _orchestrator(cls, value: str | None) -> str | None:
        return value if value is None else check_peer(value)

    @field_validator("bootstrap", "schedule", "pause_while_running", "gpus", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        return split_commas(value)

    @field_validator("bootstrap")
    @classmethod
    def _bootstrap(cls, value: list[str]) -> list[str]:
        return check_peers("bootstrap", value)

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        return value if value == OUTBOUND_ONLY else check_listen(value)

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                parse_window(entry)
            except ValueError as e:
                raise SettingError(("schedule",), f"schedule {entry[:100]!r} {e}") from None
        return value

    @field_validator("pause_while_running")
    @classmethod
    def _programs(cls, value: list[str]) -> list[str]:
        for name in value:
            if not name.strip():
                raise SettingError(
                    ("pause_while_running",), "pause_while_running has an empty name"
                )
            if "/" in name:
                raise SettingError(
                    ("pause_while_running",),
                    f"pause_while_running {name[:100]!r} must be a program's name, not a "
                    f"path: {name.rstrip('/').rsplit('/', 1)[-1][:100]!r}",
                )
        return value

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value: list[int]) -> list[int]:
        if any(g < 0 for g in value) or len(set(value)) != len(value):
            raise SettingError(("gpus",), "gpus must list each GPU's index once, from 0")
        return value

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not _DEVICE.fullmatch(value):
            raise ValueError("must be auto, cpu, mps, cuda or cuda:N")
        return value


def load_tasks(settings: NodeSettings) -> dict[str, Any]:
    """The run's task set by problem id, or one sentence naming the tasks setting: read
    when the node starts, before the password or the network, not at its first order."""
    from swarmrl.tasks import read_tasks

    with settings.about("tasks"):
        return {t.problem_id: t for t in read_tasks(Path(settings.tasks))}


# What the daemon applies when node.toml changes while it runs (client.node.daemon.reload);
# every other key takes effect at the next start.
LIVE_KEYS = frozenset(
    {
        "threads",
        # When to run
        "idle_minutes",
        "pause_gpu_while_active",
        "pause_on_battery",
        "max_other_load",
        "schedule",
        "pause_while_running",
        # Limits
        "max_download_mbps",
        "max_upload_mbps",
        "max_weight_store_gib",
        "min_free_disk_gib",
        "monthly_transfer_gib",
    }
)
