"""`swarmrl rollouts generate`: the node's work, sampled, proven, scored and signed.

Progress goes to stderr; stdout carries the rollout file's path.
"""

from __future__ import annotations

import math
import random
import re
from pathlib import Path

import typer

from swarmrl.cli_options import (
    BackendName,
    DeploymentFile,
    Device,
    KeystoreDir,
    MaxTokens,
    ModelDir,
    PasswordFile,
    RunPrecision,
    TasksFile,
    Temperature,
    parse_counts,
    quiet_transformers,
    seed_option,
)
from swarmrl.models.backend import Precision

ZERO_ADDRESS = "0x" + "00" * 20


MAX_TARGET = 65_536


def rollouts_generate(
    model: Path = ModelDir,
    tasks: Path = TasksFile,
    out: Path = typer.Option(..., "--out", help="Output rollout file (.parquet)."),
    n: int = typer.Option(4, "--n", min=1, max=1024, help="Completions per task (the GRPO group)."),
    max_tokens: int = MaxTokens,
    temperature: float = Temperature,
    top_p: float = typer.Option(1.0, "--top-p", max=1.0, help="Nucleus mass kept, in (0, 1]."),
    targets: str = typer.Option(
        "64,128,256", "--targets", help="Thinking budgets to choose from, by measured speed."
    ),
    window: float = typer.Option(
        60.0, "--window", min=0.0, help="Seconds a target may take at the measured speed."
    ),
    seed: int = seed_option("Seed of sampling and target choice."),
    run: str | None = typer.Option(
        None,
        "--run",
        help="Run recorded in every record (default: local; with --key the deployment's run).",
    ),
    step: int = typer.Option(
        0, "--step", min=0, max=2**64 - 1, help="Policy step recorded in every record."
    ),
    node: str | None = typer.Option(
        None, "--node", help="Node address recorded (default: zero; with --key the key's)."
    ),
    key: str | None = typer.Option(
        None,
        "--key",
        help="Keystore name of the node's key: sign the file (EIP-712, for the deployment's "
        "run) with its digest, node, run, step and sampling settings.",
    ),
    keystore_dir: Path | None = KeystoreDir,
    password_file: Path | None = PasswordFile,
    deployment: Path | None = DeploymentFile,
    batch_size: int = typer.Option(
        32, "--batch-size", min=1, max=4096, help="Sequences per batch."
    ),
    backend: str = BackendName,
    device: str = Device,
    precision: Precision = RunPrecision,
) -> None:
    """Sample N proven completions per task, score them, and write a rollout file (signed
    with --key)."""
    from swarmrl import keystore
    from swarmrl.chain.deploy import run_id_from_name
    from swarmrl.chain.eip712 import micros
    from swarmrl.files import check_output_path
    from swarmrl.models import load_backend
    from swarmrl.models.backend import SamplingParams
    from swarmrl.rollouts.generate import Provenance, generate_rollouts
    from swarmrl.rollouts.records import file_digest, write_rollouts
    from swarmrl.rollouts.signing import FileSignature, run_domain
    from swarmrl.tasks import read_tasks
    from swarmrl.tasks.rewards import choose_target_length, node_task_reward

    if out.suffix != ".parquet":
        raise ValueError(f"{out}: rollouts are written as .parquet files")
    check_output_path(out)
    if node is not None and not re.fullmatch(r"0x[0-9a-fA-F]{40}", node):
        raise ValueError(f"--node must be a 0x-prefixed 20-byte address, got {node!r}")
    if not 0 < top_p <= 1:
        raise ValueError(f"--top-p must be in (0, 1], got {top_p}")
    if not 0 < window < math.inf:
        raise ValueError(f"--window must be a positive number of seconds, got {window}")
    if run is not None and not 1 <= len(run) <= 128:
        raise ValueError("--run must be 1 to 128 characters")
    budgets = parse_counts(targets, "--targets", "token", MAX_TARGET)
    account = domain = None
    if key is None:
        run, node = run or "local", node or ZERO_ADDRESS
    else:
        # Everything the signature needs is settled before any sampling is spent.
        micros(temperature, "--temperature")
        micros(top_p, "--top-p")
        domain, run_id = run_domain(deployment)
        if run is not None and run_id_from_name(run) != run_id:
            raise ValueError(f"--run {run!r} is not the deployment's run {run_id}")
        directory = keystore_dir or keystore.default_dir()
        account = keystore.unlock(directory, key, keystore.read_password(password_file))
        if node is not None and node.lower() != account.address.lower():
            raise ValueError(f"--node {node} is not key {key!r}'s address {account.address}")
        run, node = run_id, account.address
    quiet_transformers()
    items = read_tasks(tasks)
    engine = load_backend(backend, model, device=device, precision=precision)
    rng = random.Random(seed)

    def target_for(speed: float | None) -> int:
        if speed is None:
            return min(budgets)
        return choose_target_length(budgets, speed, window, rng)

    def on_batch(done: int, total: int, speed: float) -> None:
        typer.echo(f"{done}/{total} rollouts  {speed:.0f} tokens/s", err=True)

    records = generate_rollouts(
        engine,
        items,
        n=n,
        params=SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p),
        provenance=Provenance(run=run, policy_step=step, node=node),
        seed=seed,
        score=node_task_reward,
        target_for=target_for,
        batch_size=batch_size,
        on_batch=on_batch,
    )
    digest = file_digest(records)
    signature = None
    if account is not None and domain is not None:
        signature = FileSignature.sign(
            account,
            domain,
            digest,
            run=run,
            step=step,
            group_size=n,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
        )
    write_rollouts(records, out, signature)
    solved = sum(r.task_reward > 0 for r in records)
    signed = f"signed by {account.address}" if account is not None else "unsigned"
    typer.echo(
        f"{len(records)} rollouts, {solved} solved; file digest 0x{digest.hex()}, {signed}",
        err=True,
    )
    typer.echo(out)
