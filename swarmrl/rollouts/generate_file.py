"""A rollout file from a model and tasks: what `swarmrl rollouts generate` does.

Every setting is checked (and with a key, the key unlocked and the deployment read)
before any sampling is spent; a setting refused is a ValueError in one sentence that
names the command's option.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from swarmrl.models.backend import Precision

ZERO_ADDRESS = "0x" + "00" * 20
MAX_TARGET = 65_536


@dataclass(frozen=True)
class GeneratedFile:
    """The file written: how many rollouts, how many solved, its digest and its signer
    (None when unsigned)."""

    path: Path
    rollouts: int
    solved: int
    digest: bytes
    signer: str | None

    def summary(self) -> str:
        signed = f"signed by {self.signer}" if self.signer is not None else "unsigned"
        return (
            f"{self.rollouts} rollouts, {self.solved} solved; file digest "
            f"0x{self.digest.hex()}, {signed}"
        )


def generate_rollout_file(
    *,
    model: Path,
    tasks: Path,
    out: Path,
    n: int = 4,
    max_tokens: int = 256,
    temperature: float = 1.0,
    top_p: float = 1.0,
    targets: str = "64,128,256",
    window: float = 60.0,
    seed: int = 0,
    run: str | None = None,
    step: int = 0,
    node: str | None = None,
    key: str | None = None,
    keystore_dir: Path | None = None,
    password_file: Path | None = None,
    deployment: Path | None = None,
    batch_size: int = 32,
    backend: str = "torch",
    device: str | None = None,
    precision: Precision = "fp32",
    on_batch: Callable[[int, int, float], None] | None = None,
) -> GeneratedFile:
    """Samples `n` proven completions per task, scores them and writes them to `out`
    (signed with keystore key `key` for the deployment's run); `on_batch(done, total,
    tokens per second)` after each batch."""
    from swarmrl import keystore
    from swarmrl.chain.deploy import run_id_from_name
    from swarmrl.cli_options import parse_counts, quiet_transformers
    from swarmrl.eip712 import micros
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
    return GeneratedFile(
        path=out,
        rollouts=len(records),
        solved=sum(r.task_reward > 0 for r in records),
        digest=digest,
        signer=None if account is None else account.address,
    )
