"""The trust suite: what the validator costs honest nodes and what it costs cheaters,
and what hostile bytes do to every decoder, measured.

- False positives (benchmarks/trust_honest.py): honest rollouts of the default model
  and, when it is imported, SmolLM2-135M-Instruct, every way an honest node samples
  them, verified with the validator's defaults; per variation the rejections and
  the evidence, per check the worst distance against its thresholds.
- Cheats (benchmarks/trust_cheats.py): every behaviour of simulation/cheater.py
  against the orchestrator's intake and validator: how it is caught, how soon, and
  the stake it loses.
- Fuzz (benchmarks/trust_fuzz.py): every decoder of untrusted bytes, Python and
  Rust: crashes, hangs and memory.
- Faults (benchmarks/trust_faults.py): whole swarms on loopback whose node,
  orchestrator, trainer and anvil are killed with SIGKILL at random points and
  started again; the faults per target and the violations of what must hold after.

The short form (scale 1) measures about 1,500 honest rollouts in minutes; the long
form (``--long``) scales the default model's variations to at least 330,000
rollouts, where zero evidence bounds the false-evidence rate below 1e-5 per rollout
(the rule of three: 3 / 330,000 at 95 % confidence), the fuzz to 1,000,000 inputs
and the fault runs from 3 to 50 (a few minutes each). SmolLM2 stays at scale 1 in
both: a CPU decodes it about 50 times slower.

    python -m benchmarks.trust [--scale 1] [--long] [--results rows.jsonl]
    swarmrl bench trust [--scale 1] [--long]

``--results`` keeps each honest row as it is measured and takes it up again on the
next run at the same scale: the long form's hours can be spread over several runs.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks import trust_cheats, trust_faults, trust_fuzz, trust_honest
from benchmarks.fuzz_targets import TARGETS
from swarmrl.models.files import default_models_dir

LONG_ROLLOUTS = 330_000
SHORT_FUZZ, LONG_FUZZ = 40_000, 1_000_000  # inputs over every target
SHORT_FAULT_RUNS, LONG_FAULT_RUNS = trust_faults.RUNS, 50


def _models() -> dict[str, Path]:
    models = {"default": trust_honest.model_dir("default", default_models_dir())}
    try:
        models["smollm2"] = trust_honest.model_dir("smollm2", default_models_dir())
    except ValueError as e:
        print(f"SmolLM2-135M skipped: {e}")
    return models


def long_scale() -> float:
    """The scale at which the default model's variations hold LONG_ROLLOUTS rollouts."""
    per_scale = sum(v.rollouts for v in trust_honest.variations(["default"]))
    return LONG_ROLLOUTS / per_scale


def main(scale: float = 1.0, long: bool = False, results: Path | None = None) -> None:
    honest(scale, long, results)
    print()
    trust_cheats.main()
    print()
    print("Fuzz: hostile bytes against every decoder of untrusted input")
    print()
    per_target = -(-(LONG_FUZZ if long else SHORT_FUZZ) // len(TARGETS))
    trust_fuzz.main(["--inputs", str(per_target)])
    print()
    trust_faults.main(runs=LONG_FAULT_RUNS if long else SHORT_FAULT_RUNS)


def honest(scale: float, long: bool, results: Path | None = None) -> list[trust_honest.Row]:
    """The false-positive table (``results``: rows kept and taken up again, see
    `trust_honest.run`)."""
    from swarmrl.cli_options import quiet_transformers

    quiet_transformers()
    tasks = trust_honest.honest_tasks()
    models = _models()
    print(f"torch {torch.__version__}, CPU; the validator's defaults; scale {scale:g}")
    began = time.perf_counter()
    rows = []
    for name, path in models.items():
        model_scale = long_scale() if long and name == "default" else scale
        rows += trust_honest.run(
            {name: path},
            tasks,
            scale=model_scale,
            on_row=lambda r: print(
                f"  {r.variation.label()}: {r.rollouts} rollouts, {r.rejected} rejected, "
                f"{r.evidence} evidence ({r.seconds:.0f} s)",
                flush=True,
            ),
            results=results,
        )
    print()
    print("False positives: honest rollouts judged by the validator's defaults")
    print()
    print(trust_honest.table(rows))
    total = sum(r.rollouts for r in rows)
    evidence = sum(r.evidence for r in rows)
    print(
        f"\n{total} honest rollouts, {sum(r.rejected for r in rows)} rejected, "
        f"{evidence} evidence, in {time.perf_counter() - began:.0f} s"
    )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--long", action="store_true")
    parser.add_argument(
        "--results", type=Path, default=None, help="keep the honest rows here and resume from it"
    )
    args = parser.parse_args()
    if args.results is not None and args.results.is_dir():
        parser.error(f"--results {args.results} is a folder, not a file of rows")
    main(args.scale, args.long, args.results)
