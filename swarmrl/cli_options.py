"""Command-line options that several command groups share, so they read alike."""

from __future__ import annotations

import re
from typing import Any

import typer

KeystoreDir = typer.Option(
    None, "--keystore-dir", help="Where keystores live (default: $SWARMRL_KEYSTORE_DIR or XDG)."
)
PasswordFile = typer.Option(
    None, "--password-file", help="Read the password from this file (first line)."
)
DeploymentFile = typer.Option(
    None,
    "--deployment",
    help="The deployment file (default: $SWARMRL_DEPLOYMENT, else the one `chain up` wrote).",
)

# Models, tasks and sampling: read alike by the node's and the validator's commands.
ModelDir = typer.Option(..., "--model", help="The policy: an HF model directory (safetensors).")


def _backend_name(name: str) -> str:
    from swarmrl.models import BACKENDS

    if name not in BACKENDS:
        raise typer.BadParameter(f"{name!r} is not one of {', '.join(BACKENDS)}")
    return name


BackendName = typer.Option(
    "torch", "--backend", callback=_backend_name, help="Inference backend: torch or vllm."
)
Device = typer.Option(None, "--device", help="torch device (default: cuda if present, else cpu).")
TasksFile = typer.Option(..., "--tasks", help="Tasks: .parquet or .jsonl.")
MaxTokens = typer.Option(
    256, "--max-tokens", min=1, max=65_536, help="Longest completion, in tokens."
)
Temperature = typer.Option(
    1.0, "--temperature", min=0.0, max=100.0, help="Sampling temperature (0: greedy)."
)

# Its parameter is typed Precision, so the command line refuses any other name.
RunPrecision = typer.Option(
    "fp32",
    "--precision",
    help="The precision the run declared: nodes sample in it, the validator prefills in it.",
)

# Every seed fits the 32 bits that numpy's and reasoning-gym's generators take.
MAX_SEED = 2**32 - 1


def seed_option(help: str) -> Any:
    """A ``--seed`` option, bounded alike in every command."""
    return typer.Option(0, "--seed", min=0, max=MAX_SEED, help=help)


def quiet_transformers() -> None:
    """transformers' progress bars and warnings would drown the command's own output."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def parse_counts(text: str, option: str, noun: str, maximum: int) -> tuple[int, ...]:
    """Comma-separated `noun` counts given to `option`, each 1 to `maximum`; ValueError
    in one sentence otherwise."""
    parts = text.split(",")
    # Plain ASCII digits only: int() would also take "1_000", " 12" and other scripts' digits.
    if not all(re.fullmatch(r"[0-9]{1,6}", p) for p in parts):
        raise ValueError(f"{option} must be comma-separated {noun} counts, got {text!r}")
    counts = tuple(int(p) for p in parts)
    if min(counts) < 1 or max(counts) > maximum:
        raise ValueError(f"{option} must be {noun} counts from 1 to {maximum}, got {text!r}")
    return counts
