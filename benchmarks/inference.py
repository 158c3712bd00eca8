"""Rollout inference on the CPU: swarmrl's torch backend against transformers.

Three figures per model from ``runs`` rounds after a warm-up, the contenders timed
in turn within each round; ratios are medians of same-round ratios, which cancel
most of this VM's drift:

1. Tokens/s of ``TorchBackend.generate`` (proofs off) against plain
   ``model.generate()`` of transformers on the same weights, batch and lengths:
   sampling at temperature 1, every sequence exactly ``length`` new tokens (the
   reference with ``min_new_tokens``; ours with end-of-sequence ignored), so
   both do the same work.
2. The cost of proving: generation with proof capture and TOPLOC building
   against generation without, as a fraction of the latter.
3. Prefill validation: one forward pass over prompt + ``length``-token output
   (``TorchBackend.prefill``, what a validator runs per rollout) against
   generating that one sequence.

Models: the embedded default (random weights of its architecture: speed does
not depend on training) and SmolLM2-135M-Instruct when ``make setup`` has
installed it (imported to safetensors once, into a temporary directory).

    python -m benchmarks.inference [--runs 5] [--batch 8] [--length 256]
    or   swarmrl bench inference
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from benchmarks.timing import interleaved_times, median_seconds, paired_ratio
from swarmrl import toploc
from swarmrl.models.backend import SamplingParams
from swarmrl.models.directory import encode_prompt
from swarmrl.models.torch_backend import TorchBackend

PROMPT = "What is 47 + 38?\nThink for 256 tokens before giving a response."


def measure(model_dir: Path, batch: int, length: int, runs: int) -> dict[str, float]:
    backend = TorchBackend(model_dir, device="cpu")
    # Fixed-length outputs, as min_new_tokens gives the reference.
    backend.eos_ids = frozenset()
    prompt = encode_prompt(backend.tokenizer, PROMPT)
    prompts = [prompt] * batch
    params = SamplingParams(max_tokens=length, temperature=1.0, seed=0)
    ids = torch.tensor(prompts)
    mask = torch.ones_like(ids)

    def reference() -> None:
        with torch.inference_mode():
            out = backend.model.generate(
                ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=length,
                min_new_tokens=length,
                pad_token_id=backend.tokenizer.pad_token_id or 0,
            )
        assert out.shape[1] == ids.shape[1] + length

    def ours(prove: bool) -> None:
        out = backend.generate(prompts, params, prove=prove)
        assert all(len(c.output_ids) == length for c in out)

    tokens = batch * length
    times = interleaved_times(
        {"reference": reference, "plain": lambda: ours(False), "proved": lambda: ours(True)}, runs
    )
    medians = {name: statistics.median(t) for name, t in times.items()}
    # The work proving adds, timed alone: building every row's proofs from captured states.
    states = torch.randn(batch, length, backend.model.config.hidden_size)
    build_s = median_seconds(lambda: [toploc.build_proofs(s, 32, 128) for s in states], runs)
    completion = backend.generate([prompt], params, prove=False)[0]
    single = interleaved_times(
        {
            "generate": lambda: backend.generate([prompt], params, prove=False),
            "prefill": lambda: backend.prefill(completion.prompt_ids, completion.output_ids),
        },
        runs,
    )
    return {
        "reference_tps": tokens / medians["reference"],
        "ours_tps": tokens / medians["plain"],
        "speedup": paired_ratio(times, "reference", "plain"),
        "proof_overhead": paired_ratio(times, "proved", "plain") - 1,
        "build_share": build_s / medians["plain"],
        "single_s": statistics.median(single["generate"]),
        "prefill_s": statistics.median(single["prefill"]),
        "prefill_ratio": paired_ratio(single, "generate", "prefill"),
    }


def report(name: str, params: int, batch: int, length: int, figures: dict[str, float]) -> None:
    f = figures
    print(f"{name} ({params / 1e6:.1f} M parameters), batch {batch} x {length} new tokens")
    print(f"  transformers generate()        {f['reference_tps']:>9.0f} tokens/s")
    print(
        f"  swarmrl torch backend          {f['ours_tps']:>9.0f} tokens/s   "
        f"{f['speedup']:.2f}x   (goal >= 1.0x)"
    )
    print(
        f"  proof capture + TOPLOC build   {f['proof_overhead']:>+9.1%} end to end, "
        f"{f['build_share']:.1%} building alone   (goal <= 5%)"
    )
    print(
        f"  prefill of one {length}-token rollout {f['prefill_s'] * 1e3:.1f} ms vs generating it "
        f"{f['single_s'] * 1e3:.0f} ms: {f['prefill_ratio']:.0f}x cheaper "
        "(goal >= 10x)"
    )


def main(runs: int = 5, batch: int = 8, length: int = 256) -> None:
    from transformers.utils import logging as hf_logging

    from swarmrl.models import tiny

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU; {runs} rounds")
    with tempfile.TemporaryDirectory() as tmp:
        model, tokenizer = tiny.build_model(seed=0)
        default = Path(tmp) / "default"
        tiny.save(model, tokenizer, default)
        params = sum(p.numel() for p in model.parameters())
        report("embedded default", params, batch, length, measure(default, batch, length, runs))
        try:
            from swarmrl.models.smollm2 import import_smollm2

            smol = import_smollm2(Path(tmp) / "smollm2")
        except ValueError as e:
            print(f"SmolLM2-135M skipped: {e}")
            return
        backend = TorchBackend(smol, device="cpu")
        params = sum(p.numel() for p in backend.model.parameters())
        del backend
        # A 135 M model decodes ~50x slower here: fewer, shorter runs keep it minutes.
        smol_runs, smol_length = max(3, runs // 2), length // 2
        figures = measure(smol, batch, smol_length, smol_runs)
        report("SmolLM2-135M-Instruct", params, batch, smol_length, figures)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=256)
    args = parser.parse_args()
    main(args.runs, args.batch, args.length)
