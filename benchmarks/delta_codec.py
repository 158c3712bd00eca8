"""The weight-delta codec on a SmolLM2-135M-sized bf16 checkpoint (269 MB).

The base is SmolLM2-135M's tensor set (30 layers, 576 wide, 1536 MLP, 49152-token
tied embedding) with random weights (std 0.02), or the weights of `--model`'s
safetensors file; both are written in bf16. Two targets: 1% of the elements moved
(by 0.002, so every one of them changes in bf16), and every element scaled by
1 + 1e-3 * N(0, 1), about what one optimiser step does (bf16 keeps 8 bits of
mantissa, so only about 1% of the elements then change).

For each: `encode` and `apply` wall time (median of `runs` after a warm-up, page
cache warm) and MB/s of target bytes; the CPU time of one call (every thread; less
sensitive than wall time to other load on a shared machine); the delta's size
against the target's; and, for comparison, BLAKE3 over the same target by
`shards.build_manifest` (64 MiB shards) and by the `blake3` package over the
memory-mapped file, and the times per GB of target against `build_manifest`'s. Peak
RSS of `encode` and `apply` is measured in a fresh process each, against that
process's RSS before the call. MB is 1e6 bytes.

    python -m benchmarks.delta_codec [--runs 3] [--threads N] [--model model.safetensors]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3
import torch
from safetensors.torch import load_file, save_file

from benchmarks.timing import median_seconds
from swarmrl import delta, shards

HIDDEN, MLP, LAYERS, VOCAB, KV = 576, 1536, 30, 49152, 192

# Each operation alone in a fresh process, so that its peak is its own. The peak is
# VmHWM: getrusage's ru_maxrss would carry over the benchmark's own peak, which the
# kernel hands to a child across fork and exec.
PEAK_PROBE = textwrap.dedent(
    """
    import re, sys
    from pathlib import Path
    from swarmrl import delta

    def high_water_kib():
        status = Path("/proc/self/status").read_text()
        return int(re.search(r"VmHWM:\\s+(\\d+) kB", status).group(1))

    op, threads, *paths = sys.argv[1:]
    before = high_water_kib()
    getattr(delta, op)(*paths, threads=int(threads) if threads else None)
    print(before, high_water_kib())
    """
)


def smollm2_shapes() -> dict[str, tuple[int, ...]]:
    """SmolLM2-135M's tensors and shapes (its output head is tied to the embedding)."""
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (HIDDEN,),
            p + "post_attention_layernorm.weight": (HIDDEN,),
            p + "self_attn.q_proj.weight": (HIDDEN, HIDDEN),
            p + "self_attn.k_proj.weight": (KV, HIDDEN),
            p + "self_attn.v_proj.weight": (KV, HIDDEN),
            p + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
            p + "mlp.gate_proj.weight": (MLP, HIDDEN),
            p + "mlp.up_proj.weight": (MLP, HIDDEN),
            p + "mlp.down_proj.weight": (HIDDEN, MLP),
        }
    shapes["model.norm.weight"] = (HIDDEN,)
    return shapes


def random_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    noise = torch.Generator().manual_seed(seed)
    return {
        name: (0.02 * torch.randn(shape, generator=noise)).to(torch.bfloat16)
        for name, shape in smollm2_shapes().items()
    }


def moved(weights: dict[str, torch.Tensor], kind: str, seed: int = 1) -> dict[str, torch.Tensor]:
    """`weights` after one of the two changes the module doc describes."""
    noise = torch.Generator().manual_seed(seed)
    out = {}
    for name, w in weights.items():
        x = w.float()
        if kind == "one_percent":
            picked = torch.rand(x.shape, generator=noise) < 0.01
            x = torch.where(picked, x + 0.002 * torch.randn(x.shape, generator=noise), x)
        else:
            x = x * (1 + 1e-3 * torch.randn(x.shape, generator=noise))
        out[name] = x.to(torch.bfloat16).contiguous()
    return out


def cpu_seconds(fn: Callable[[], Any]) -> float:
    """CPU time (user and system, every thread) of one call of `fn`: unlike wall time,
    what other processes on a shared machine do does not change it much."""
    start = time.process_time()
    fn()
    return time.process_time() - start


def peak_rss_mb(op: str, threads: int | None, *paths: Path) -> tuple[float, float]:
    """The RSS (MB) of a fresh process before `delta.<op>(*paths)`, and its peak."""
    args = [sys.executable, "-c", PEAK_PROBE, op, str(threads or ""), *map(str, paths)]
    out = subprocess.run(args, capture_output=True, text=True, check=True)
    before, peak = (int(kib) * 1024 / 1e6 for kib in out.stdout.split())
    return before, peak


def measure(
    base: Path, target: Path, workdir: Path, runs: int = 3, threads: int | None = None
) -> dict[str, float]:
    """Times and sizes of encoding `target` against `base` and applying the result, with
    BLAKE3 over the same target for comparison. Files go to `workdir`."""
    step, rebuilt = workdir / "step.delta", workdir / "rebuilt.safetensors"
    stats = delta.encode(base, target, step, threads=threads)
    delta.apply(base, step, rebuilt, threads=threads)
    want = blake3.blake3(max_threads=blake3.blake3.AUTO).update_mmap(target).hexdigest()
    got = blake3.blake3(max_threads=blake3.blake3.AUTO).update_mmap(rebuilt).hexdigest()
    assert got == want == delta.inspect(step).target_blake3, "the round trip changed the file"
    size = stats.target_bytes

    encode_s = median_seconds(lambda: delta.encode(base, target, step, threads=threads), runs)
    apply_s = median_seconds(lambda: delta.apply(base, step, rebuilt, threads=threads), runs)
    manifest_s = median_seconds(
        lambda: shards.build_manifest(target, model="bench", step=0, threads=threads), runs
    )
    blake3_s = median_seconds(
        lambda: blake3.blake3(max_threads=blake3.blake3.AUTO).update_mmap(target), runs
    )
    encode_cpu_s = cpu_seconds(lambda: delta.encode(base, target, step, threads=threads))
    apply_cpu_s = cpu_seconds(lambda: delta.apply(base, step, rebuilt, threads=threads))
    manifest_cpu_s = cpu_seconds(
        lambda: shards.build_manifest(target, model="bench", step=0, threads=threads)
    )
    encode_before, encode_peak = peak_rss_mb("encode", threads, base, target, step)
    apply_before, apply_peak = peak_rss_mb("apply", threads, base, step, rebuilt)
    largest = max(t.length for t in delta.inspect(step).tensors)
    return {
        "target_mb": size / 1e6,
        "delta_mb": stats.delta_bytes / 1e6,
        "delta_ratio": stats.delta_bytes / size,
        "changed_fraction": stats.changed_elements / stats.total_elements,
        "tensors": stats.tensors,
        "xor_tensors": stats.xor_tensors,
        "sparse_tensors": stats.sparse_tensors,
        "largest_tensor_mb": largest / 1e6,
        "encode_s": encode_s,
        "encode_mb_s": size / encode_s / 1e6,
        "encode_cpu_s": encode_cpu_s,
        "apply_s": apply_s,
        "apply_cpu_s": apply_cpu_s,
        "apply_mb_s": size / apply_s / 1e6,
        "manifest_s": manifest_s,
        "manifest_mb_s": size / manifest_s / 1e6,
        "manifest_cpu_s": manifest_cpu_s,
        "blake3_s": blake3_s,
        "blake3_mb_s": size / blake3_s / 1e6,
        "encode_rss_before_mb": encode_before,
        "encode_peak_rss_mb": encode_peak,
        "apply_rss_before_mb": apply_before,
        "apply_peak_rss_mb": apply_peak,
    }


def main(
    runs: int = 3, threads: int | None = None, model: Path | None = None
) -> dict[str, dict[str, float]]:
    cores = len(os.sched_getaffinity(0))
    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="swarmrl-bench-") as tmp:
        workdir = Path(tmp)
        if model is None:
            weights = random_weights()
        else:
            weights = {k: v.to(torch.bfloat16) for k, v in load_file(model).items()}
        base = workdir / "base.safetensors"
        save_file(weights, base)
        for kind in ("one_percent", "relative"):
            target = workdir / f"{kind}.safetensors"
            save_file(moved(weights, kind), target)
            figures[kind] = measure(base, target, workdir, runs, threads)
            target.unlink()
    report(figures, runs, threads or cores, "random" if model is None else str(model))
    return figures


def report(figures: dict[str, dict[str, float]], runs: int, threads: int, weights: str) -> None:
    first = next(iter(figures.values()))
    print(
        f"Weight-delta codec: {first['target_mb']:.0f} MB bf16 checkpoint, SmolLM2-135M "
        f"shapes, {weights} weights, {threads} threads, median of {runs} runs, page cache"
    )
    labels = {"one_percent": "1% of elements moved", "relative": "all scaled by 1+1e-3*N"}
    for kind, f in figures.items():
        print(
            f"  {labels[kind]}: {f['changed_fraction']:.2%} of elements changed, delta "
            f"{f['delta_mb']:.2f} MB = {f['delta_ratio']:.2%} of the target "
            f"({f['sparse_tensors']} sparse, {f['xor_tensors']} xor tensors)"
        )
        print(
            f"    encode {f['encode_s']:.3f} s ({f['encode_mb_s']:.0f} MB/s, "
            f"{f['encode_cpu_s']:.2f} CPU s)   apply {f['apply_s']:.3f} s "
            f"({f['apply_mb_s']:.0f} MB/s, {f['apply_cpu_s']:.2f} CPU s)"
        )
        print(
            f"    BLAKE3: build_manifest {f['manifest_s']:.3f} s ({f['manifest_mb_s']:.0f} MB/s, "
            f"{f['manifest_cpu_s']:.2f} CPU s), "
            f"blake3 mmap {f['blake3_s']:.3f} s ({f['blake3_mb_s']:.0f} MB/s)"
        )
        # Per GB of target, against the hashing every node does on the same bytes anyway.
        gb = f["target_mb"] / 1e3
        print(
            f"    per GB: encode {f['encode_s'] / gb:.2f} s, apply {f['apply_s'] / gb:.2f} s, "
            f"BLAKE3 {f['manifest_s'] / gb:.2f} s (build_manifest); encode / BLAKE3 "
            f"{f['encode_s'] / f['manifest_s']:.1f}x, apply / BLAKE3 "
            f"{f['apply_s'] / f['manifest_s']:.1f}x"
        )
        print(
            f"    peak RSS: encode {f['encode_peak_rss_mb']:.0f} MB "
            f"(from {f['encode_rss_before_mb']:.0f}), apply {f['apply_peak_rss_mb']:.0f} MB "
            f"(from {f['apply_rss_before_mb']:.0f}); largest tensor "
            f"{f['largest_tensor_mb']:.1f} MB"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args()
    main(args.runs, args.threads, args.model)
