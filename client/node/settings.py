"""The node daemon's settings: ``node.toml`` and ``SWARMRL_*``.

Read with ``swarmrl.settings_toml.load_settings(NodeSettings, path)``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import NoDecode

from swarmrl.chain.paths import deployment_path
from swarmrl.files import role_data_dir
from swarmrl.settings_toml import (
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
        description="The chain deployment file (the one `swarmrl chain up` wrote by default).",
    )
    keystore_dir: Path = Field(
        default_factory=_default_keystore_dir, description="Where the node's keystore lives."
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
    max_download_mbps: float | None = Field(
        None,
        gt=0,
        le=1_000_000,
        description="Cap on the average rate of weight downloads, in Mbit/s (none: no cap), "
        "for a link the machine also uses. A download slower than a training step is "
        "finished while the orchestrator still takes work on its step.",
        json_schema_extra={"example": 50.0},
    )

    @field_validator("orchestrator")
    @classmethod
    def _orchestrator(cls, value: str | None) -> str | None:
        return value if value is None else check_peer(value)

    @field_validator("bootstrap", mode="before")
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
