"""The false-positive table's cross-hardware rows: honest rollouts sampled on a GPU,
judged on this CPU with the validator's defaults.

A node with a GPU samples with CUDA's kernels in the precision its run declares; the
validator prefills the same records in that precision on its CPU. ``generate`` runs on
the GPU machine and writes the records of every variation below into one archive,
with what they were sampled on and the digest of each model's weights; ``verify``
judges them here exactly as benchmarks/trust_honest.py judges the CPU's own rows (one
node's submissions in turn, the validator's own tasks) and prints the same table.

    python -m benchmarks.trust_gpu [--models DIR] generate --out gpu-rollouts.tar  (GPU)
    python -m benchmarks.trust_gpu [--models DIR] verify gpu-rollouts.tar          (CPU)

``--models`` (default: swarmrl's models folder) holds ``default/`` and ``smollm2/``,
each built or imported there when missing; ``verify`` refuses an archive whose
weights differ from its own.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

import torch

from benchmarks import trust_honest
from benchmarks.trust_honest import LONGEST, Row, Variation
from swarmrl.models.backend import torch_dtype
from swarmrl.models.torch_backend import TorchBackend
from swarmrl.rollouts.records import read_rollouts, write_rollouts
from swarmrl.tasks import Task

MANIFEST, ENVIRONMENT = "variations.json", "environment.json"
MODELS = ("default", "smollm2")


def variations() -> list[Variation]:
    """What a GPU node samples: both precisions a run may declare, greedy and not,
    top-p, the longest completions; a few thousand records (SmolLM2 is 50x dearer to
    verify on a CPU)."""
    default = Variation("default", "bf16", "bf16", 1.0, 1.0, 8, 64, 1, 128, 1024, "cuda")
    fp32 = replace(default, sampled="fp32", verified="fp32")
    smol = replace(default, model="smollm2", rollouts=256)
    return [
        default,
        replace(default, temperature=0.0),
        replace(default, top_p=0.9),
        replace(default, max_tokens=LONGEST["default"], rollouts=256),
        fp32,
        replace(fp32, temperature=0.0),
        smol,
        replace(smol, temperature=0.0),
        replace(smol, top_p=0.9, rollouts=128),
        replace(smol, max_tokens=LONGEST["smollm2"], rollouts=32),
        replace(smol, sampled="fp32", verified="fp32", rollouts=128),
    ]


def weights_digest(model_dir: Path) -> str:
    """sha256 of a model's weights file: the GPU and the CPU must hold the same policy."""
    digest = hashlib.sha256()
    with open(model_dir / "model.safetensors", "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def generate(
    out: Path,
    models: Path,
    *,
    device: str = "cuda",
    scale: float = 1.0,
    only: Sequence[str] = MODELS,
    rows: Sequence[int] = (),
) -> None:
    """Sample every variation of the models ``only`` names on ``device`` (a GPU; the CPU
    for the suite's test) and write the archive ``out``; ``rows``: these rows of
    `variations` alone (from 0), to measure one again at another scale."""
    import transformers

    chosen_variations = [
        replace(v, sampled_on=device)
        for i, v in enumerate(variations())
        if v.model in only and (not rows or i in rows)
    ]
    dirs = {name: trust_honest.model_dir(name, models) for name in only}
    environment = {
        "device": torch.cuda.get_device_name() if device == "cuda" else device,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "scale": scale,
        "weights": {name: weights_digest(path) for name, path in dirs.items()},
    }
    print(json.dumps(environment), flush=True)
    tasks = trust_honest.honest_tasks()
    manifest = []
    with tempfile.TemporaryDirectory() as tmp:
        backends: dict[tuple[str, str], TorchBackend] = {}
        for i, variation in enumerate(chosen_variations):
            key = (variation.model, variation.sampled)
            if key not in backends:
                backends[key] = TorchBackend(
                    dirs[variation.model], device=device, dtype=torch_dtype(variation.sampled)
                )
            began = time.perf_counter()
            chosen = trust_honest.chosen_tasks(variation, tasks, scale)
            records = trust_honest.sample(variation, backends[key], chosen)
            name = f"{i:02d}-{variation.model}.parquet"
            write_rollouts(records, Path(tmp) / name)
            manifest.append({"file": name, "variation": asdict(variation)})
            tokens = sum(len(r.output_ids) for r in records)
            print(
                f"  {variation.label()}: {len(records)} rollouts, {tokens} tokens "
                f"({time.perf_counter() - began:.0f} s)",
                flush=True,
            )
        (Path(tmp) / ENVIRONMENT).write_text(json.dumps(environment, indent=2))
        (Path(tmp) / MANIFEST).write_text(json.dumps(manifest, indent=2))
        with tarfile.open(out, "w") as tar:
            for path in sorted(Path(tmp).iterdir()):
                tar.add(path, arcname=path.name)


def verify(archives: Sequence[Path], models: Path) -> list[Row]:
    """Judge the archives' records on this CPU with the validator's defaults, in one
    table; SystemExit if an archive's weights are not those under ``models``."""
    from swarmrl.cli_options import quiet_transformers

    quiet_transformers()
    tasks = trust_honest.honest_tasks()
    rows: list[Row] = []
    threads = torch.get_num_threads()
    try:
        for archive in archives:
            rows += _verify(archive, models, tasks)
    finally:
        torch.set_num_threads(threads)
    print()
    print(trust_honest.table(rows))
    return rows


def _verify(archive: Path, models: Path, tasks: list[Task]) -> list[Row]:
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        environment = json.loads((Path(tmp) / ENVIRONMENT).read_text())
        manifest = json.loads((Path(tmp) / MANIFEST).read_text())
        dirs = {name: trust_honest.model_dir(name, models) for name in environment["weights"]}
        for name, path in dirs.items():
            if weights_digest(path) != environment["weights"][name]:
                raise SystemExit(f"The archive's {name} weights are not those in {path}.")
        print(
            f"{archive.name}: sampled on {environment['device']} (torch {environment['torch']}, "
            f"CUDA {environment['cuda']}, transformers {environment['transformers']}); verified "
            f"on this CPU (torch {torch.__version__}) with the validator's defaults",
            flush=True,
        )
        rows = []
        for entry in manifest:
            variation = Variation(**entry["variation"])
            torch.set_num_threads(variation.threads)
            began = time.perf_counter()
            validator = TorchBackend(
                dirs[variation.model], device="cpu", dtype=torch_dtype(variation.verified)
            )
            chosen = trust_honest.chosen_tasks(variation, tasks, environment["scale"])
            records = read_rollouts(Path(tmp) / entry["file"])
            row = trust_honest.judge(variation, validator, chosen, records)
            row.seconds = time.perf_counter() - began
            rows.append(row)
            print(
                f"  {variation.label()}: {row.rollouts} rollouts, {row.rejected} rejected, "
                f"{row.evidence} evidence, reasons {row.reasons} ({row.seconds:.0f} s)",
                flush=True,
            )
    return rows


if __name__ == "__main__":
    from swarmrl.models.files import default_models_dir

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", type=Path, default=None, help="holds default/ and smollm2/ (default: ours)"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="sample on the GPU")
    gen.add_argument("--out", type=Path, required=True, help="the archive to write (.tar)")
    gen.add_argument("--scale", type=float, default=1.0, help="multiplies every row's rollouts")
    gen.add_argument(
        "--only", choices=MODELS, action="append", help="this model's rows only (repeatable)"
    )
    gen.add_argument(
        "--row", type=int, action="append", help="this row of the table only, from 0 (repeatable)"
    )
    ver = commands.add_parser("verify", help="judge archives on this CPU, in one table")
    ver.add_argument("archives", type=Path, nargs="+")
    args = parser.parse_args()
    models = args.models or default_models_dir()
    if args.command == "generate":
        if not torch.cuda.is_available():
            parser.error("generate samples on a CUDA device, and this machine has none")
        generate(args.out, models, scale=args.scale, only=args.only or MODELS, rows=args.row or ())
    else:
        verify(args.archives, models)
