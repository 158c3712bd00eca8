"""TOPLOC's honest scatter by chunk size: how far an honest bf16 sampler's proofs lie
from the validator's prefill when a completion is proved in chunks of 1 to 32 tokens.

A completion is proved in chunks of ``PROOF_CHUNK`` tokens, so its last chunk holds
anything from one token to a full chunk. This measures, per chunk size, the distance
(`swarmrl.rollouts.tolerances.chunk_distance`: a share of TOPLOC's bounds) between
proofs built from the sampler's own states and the validator's prefill in bf16 and
fp32. The sampler's states are taken where the node's path hands them to
`toploc.build_proofs` (the backend returns proofs, not states), so they are exactly
the states a node proves (swarmrl.models.torch_backend calls it through the module).

    python -m benchmarks.trust_chunks [--model default] [--rollouts 512]
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import torch

from benchmarks import trust_gpu, trust_honest
from benchmarks.trust_honest import Variation
from swarmrl import toploc
from swarmrl.models.backend import PROOF_CHUNK, PROOF_TOPK
from swarmrl.models.files import default_models_dir
from swarmrl.models.torch_backend import TorchBackend
from swarmrl.rollouts.tolerances import chunk_distance

SIZES = (1, 2, 4, 8, 16, 32)


def main(model: str = "default", rollouts: int = 512) -> None:
    torch.set_num_threads(1)
    model_dir = trust_honest.model_dir(model, default_models_dir())
    sampler = TorchBackend(model_dir, device="cpu", dtype=torch.bfloat16)
    states: list[torch.Tensor] = []
    build = toploc.build_proofs

    def kept(
        acts: Any, chunk: int = PROOF_CHUNK, topk: int = PROOF_TOPK, *, threads: int | None = None
    ) -> list[bytes]:
        states.append(acts.detach().clone())
        return build(acts, chunk, topk, threads=threads)

    toploc.build_proofs = kept
    try:
        variation = Variation(model, "bf16", "bf16", 1.0, 1.0, 8, 16, 1, 128, rollouts)
        tasks = trust_honest.chosen_tasks(variation, trust_honest.honest_tasks(), 1.0)
        records = trust_honest.sample(variation, sampler, tasks)
    finally:
        toploc.build_proofs = build
    print(f"{model}: {len(records)} honest bf16 completions sampled on this CPU")
    print()
    print(
        "| verified in | chunk tokens | chunks | median | 99th pct | 99.9th pct | worst "
        "| > 0.5 | > 1 |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for precision in ("bf16", "fp32"):
        validator = sampler if precision == "bf16" else TorchBackend(model_dir, device="cpu")
        ratios: dict[int, list[float]] = {size: [] for size in SIZES}
        for record, sampled in zip(records, states, strict=True):
            hidden = validator.prefill(record.prompt_ids, record.output_ids).hidden
            for size in SIZES:
                proofs = build(sampled, size, PROOF_TOPK)
                for result in toploc.verify_proofs(hidden, proofs, size, PROOF_TOPK):
                    ratios[size].append(chunk_distance(result))
        for size in SIZES:
            d = np.array(ratios[size])
            print(
                f"| {precision} | {size} | {len(d)} | {np.median(d):.3f} | "
                f"{np.percentile(d, 99):.3f} | {np.percentile(d, 99.9):.3f} | {d.max():.3f} | "
                f"{(d > 0.5).sum()} | {(d > 1).sum()} |",
                flush=True,
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=trust_gpu.MODELS, default="default")
    parser.add_argument("--rollouts", type=int, default=512)
    args = parser.parse_args()
    if args.rollouts < 8:
        parser.error("--rollouts must be at least 8 (one group)")
    main(args.model, args.rollouts)
