"""TOPLOC build and verify: swarmrl's native kernel against toploc 0.1.6.

The standard case: 1024 tokens x 4096 hidden, bf16, k = 128, chunks of 32
tokens. Both implementations get the same activations in the same process;
each figure is the median of `runs` timed calls after warm-up. One-thread
figures pin the process to one core (the reference's verifier starts a thread
per core whatever torch is told), all-thread figures use every core.

"Read once" is one pass over the activations (numpy's max over the bit
patterns): the floor for anything that has to look at every value.

    python -m benchmarks.toploc [--runs 21]      or      swarmrl bench toploc
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from benchmarks.timing import median_seconds, one_core
from swarmrl import toploc

TOKENS, HIDDEN, CHUNK, TOPK = 1024, 4096, 32, 128


def median_ms(fn: Callable[[], Any], runs: int) -> float:
    return median_seconds(fn, runs, warmup=3) * 1e3


@contextmanager
def one_core_one_torch_thread() -> Iterator[None]:
    """One core, and torch told so too (its pools are sized separately)."""
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with one_core():
            yield
    finally:
        torch.set_num_threads(torch_threads)


def load_reference() -> Any | None:
    try:
        import toploc as reference  # the PyPI package, built by `make bench-deps`
    except ImportError:
        return None
    return reference


def main(runs: int = 21) -> dict[str, float]:
    runs = max(runs, 9)
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(TOKENS, HIDDEN, generator=gen).to(torch.bfloat16)
    bits = hidden.view(torch.int16).numpy().view(np.uint16)
    cores = len(os.sched_getaffinity(0))
    proofs = toploc.build_proofs(bits, CHUNK, TOPK)

    reference = load_reference()
    if reference is not None:
        # The reference ships no types: its proofs are Any here.
        ref_build: Callable[[], Any] = lambda: reference.build_proofs_bytes(  # noqa: E731
            hidden, CHUNK, TOPK, skip_prefill=True
        )
        ref_proofs = ref_build()
        ref_verify: Callable[[], Any] = lambda: reference.verify_proofs_bytes(  # noqa: E731
            hidden, ref_proofs, CHUNK, TOPK, skip_prefill=True
        )

    # All cores first: after a process has been pinned and released, the
    # scheduler can take a while to spread its threads out again.
    figures: dict[str, float] = {}
    figures["build_all"] = median_ms(lambda: toploc.build_proofs(bits), runs)
    figures["verify_all"] = median_ms(lambda: toploc.verify_proofs(bits, proofs), runs)
    if reference is not None:
        figures["ref_build_all"] = median_ms(ref_build, runs)
        figures["ref_verify_all"] = median_ms(ref_verify, runs)
    with one_core_one_torch_thread():
        figures["read_once"] = median_ms(lambda: bits.max(), runs)
        figures["build_1t"] = median_ms(lambda: toploc.build_proofs(bits, threads=1), runs)
        figures["verify_1t"] = median_ms(
            lambda: toploc.verify_proofs(bits, proofs, threads=1), runs
        )
        if reference is not None:
            figures["ref_build_1t"] = median_ms(ref_build, runs)
            figures["ref_verify_1t"] = median_ms(ref_verify, runs)

    if reference is not None:
        # Interop on data with ties at the top-k boundary (bf16 randn has many):
        # the chosen set may differ there, so bytes may too, but each side must
        # accept the other's proofs.
        figures["identical_proofs"] = sum(a == b for a, b in zip(proofs, ref_proofs, strict=True))
        figures["ours_accept_ref"] = sum(
            r.accepted for r in toploc.verify_proofs(bits, ref_proofs, CHUNK, TOPK)
        )
        figures["ref_accept_ours"] = sum(
            r.exp_mismatches <= 38 and r.mant_err_mean <= 10 and r.mant_err_median <= 8
            for r in reference.verify_proofs_bytes(hidden, proofs, CHUNK, TOPK, skip_prefill=True)
        )

    report(figures, cores, runs, reference is not None)
    return figures


def report(f: dict[str, float], cores: int, runs: int, have_reference: bool) -> None:
    print(
        f"TOPLOC {TOKENS} tokens x {HIDDEN} hidden bf16, k={TOPK}, chunk={CHUNK}: "
        f"median of {runs} runs, {cores} cores"
    )
    mib = TOKENS * HIDDEN * 2 / 2**20
    print(f"  read once (one pass over {mib:.0f} MiB): {f['read_once']:.3f} ms")
    print(f"  {'':10} {'swarmrl 1t':>11} {'swarmrl all':>12} {'ref 1t':>9} {'ref all':>9}")
    for op in ("build", "verify"):
        ref = f"{f[f'ref_{op}_1t']:>9.2f} {f[f'ref_{op}_all']:>9.2f}" if have_reference else ""
        print(f"  {op:10} {f[f'{op}_1t']:>11.3f} {f[f'{op}_all']:>12.3f} {ref}  (ms)")
    for op in ("build", "verify"):
        line = f"  {op}: {f[f'{op}_1t'] / f['read_once']:.1f}x read-once (1t)"
        line += f", {f[f'{op}_all'] / f['read_once']:.1f}x (all)"
        if have_reference:
            line += f"; {f[f'ref_{op}_1t'] / f[f'{op}_1t']:.1f}x faster than reference (1t)"
            line += f", {f[f'ref_{op}_all'] / f[f'{op}_all']:.1f}x (all)"
        print(line)
    if have_reference:
        n = TOKENS // CHUNK
        print(
            f"  interop: {f['identical_proofs']:.0f}/{n} proofs byte-identical (the rest differ "
            f"only by top-k ties); we accept {f['ours_accept_ref']:.0f}/{n} of the reference's, "
            f"it accepts {f['ref_accept_ours']:.0f}/{n} of ours"
        )
    else:
        print(
            "  reference toploc 0.1.6 is not installed: run `make bench-deps` to build it "
            "and compare in the same run"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    main(parser.parse_args().runs)
