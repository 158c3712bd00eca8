"""The trainer's step time and peak memory per rank, and its output head's memory at a
152k vocabulary.

    swarmrl bench trainer [--steps 3] [--skip-smollm2]
    or   python -m benchmarks.trainer [the same options]

1. Step time and peak memory per rank. The repository's step (``train_step`` in one
   process; ``shard`` and ``data_parallel_step``, FSDP2 over gloo, in two) trains the
   embedded default model and SmolLM2-135M-Instruct (when ``make setup`` installed it)
   on a fixed synthetic batch (seeded random tokens, advantages and sampler
   log-probabilities; the recipe's defaults otherwise), on 1 and 2 ranks, with and
   without activation checkpointing (``TrainerLaunch.activation_checkpointing``: every
   decoder layer recomputed in the backward pass). Every configuration is a job of its
   own under ``ranks.run_job`` (torch elastic, fresh spawned processes; one rank is a
   job of one), so each figure starts from the same clean process. Each rank takes
   its share of the cores (1 rank: all of them, 2 ranks: half each), loads the fp32
   policy, builds AdamW, takes one warm-up step, ``steps`` timed steps and one
   profiled step. Reported: the median step time (rank 0's wall time; the ranks wait
   for each other in every step's collectives), tokens per second (prompt and
   completion tokens of the batch over the step time), the parameters a rank holds,
   and two measures of the memory of the rank that needs most; the ratios are to 1
   rank without checkpointing, on the same model.

   - Peak RSS: the process's resident high-water mark (``VmHWM``), reset right before
     the first step (``/proc/self/clear_refs``, Linux), over every step; and that peak
     above the resident set before the first step (the loaded policy, torch and
     transformers). This is what the machine must hold, gloo's and the libraries'
     memory included, and it is exact where a sampling thread could miss a short peak.
     It also counts what malloc keeps after a free: glibc keeps freed blocks in its
     heaps (once a large block was freed, blocks up to 32 MiB, FSDP2's per-layer
     buffers among them, come from the heap rather than mmap), so it grows over the
     first steps and blurs what sharding saves. (tracemalloc sees none of it: torch
     allocates through malloc, not Python's allocator.)
   - Tensors at peak: the most bytes of tensors a step holds at once beyond the
     loaded policy: AdamW's two moments (its state's bytes) and the peak of one more
     step, run after the timed ones, over what torch's allocator held before it (the
     profiler's allocation and free events, ``peak_allocated``): gradients,
     activations, FSDP2's gathered parameters and unsharded gradients. This is what
     sharding and checkpointing act on, free of malloc's retention.

   What 2 cores can and cannot show: 2 ranks run on the same 2 cores that 1 rank has
   to itself, so data parallelism adds no compute here, and costs the ranks' gloo
   all-gathers and reduce-scatters, which go through memory. A difference in step time
   between them says how well each uses the 2 cores (one process's 2 intra-op threads,
   which small matmuls and a loaded machine keep from scaling, against 2
   single-threaded processes), not what data parallelism gains: that needs one device
   per rank and is not measured here. What the 2-rank figure does show is the memory
   per rank: each holds half the parameters, their gradients and AdamW's state (FSDP2
   shards them), and trains half the batch, so half the activations.

2. The output head at Qwen2's 151,936-token vocabulary (``QWEN_VOCAB``): the peak
   bytes torch's allocator holds during one micro-batch's log-probabilities (and
   entropy) forward and backward through ``TokenScorer``'s chunked head
   (``CHUNK_TOKENS`` rows of logits at a time), against the whole-logits computation
   the trainer did before (``whole_logits_reference``: every position's logits, then
   gathered, log-softmax and entropy), with the theoretical size of one whole fp32
   logits tensor [B, W, V]. A one-layer model with a tiny hidden size, so the head is
   all there is. Here the allocator's counters are the right measure: the memory is
   torch's tensors and nothing else, and malloc keeping freed pages would blur a
   resident-set figure. The reference runs on 1 x 1024 completion tokens only: its
   peak grows with the tokens as the logits do, and at the trainer's 8 x 1024 it
   would be several times 4.9 GiB, more than a 24 GiB machine has (the figure printed
   is that extrapolation).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.tensor import DTensor

from orchestrator.trainer.batch import (
    CHUNK_TOKENS,
    completion_logprobs,
    completion_logprobs_and_entropy,
)
from orchestrator.trainer.launch import TrainerLaunch
from orchestrator.trainer.recipe import GRPORecipe
from orchestrator.trainer.samples import Sample
from swarmrl.models.backend import token_logprobs

if TYPE_CHECKING:  # transformers takes seconds to import: only where used
    from transformers import LlamaForCausalLM

# Qwen2's vocabulary, the largest a policy here is expected to have.
QWEN_VOCAB = 151_936
GIB, MIB = 1 << 30, 1 << 20


@dataclass(frozen=True)
class Batch:
    """A step's synthetic batch: ``samples`` sequences of ``prompt`` + ``completion``
    tokens each."""

    samples: int
    prompt: int
    completion: int

    @property
    def tokens(self) -> int:
        return self.samples * (self.prompt + self.completion)

    def __str__(self) -> str:
        return f"{self.samples} x ({self.prompt} prompt + {self.completion} completion) tokens"


# SmolLM2 does about 170x the default model's work per token (134.5 M parameters
# against 0.8 M), so its batch is smaller: a configuration takes about a minute on 2
# idle cores.
DEFAULT_BATCH = Batch(samples=8, prompt=64, completion=256)
SMOLLM2_BATCH = Batch(samples=8, prompt=32, completion=64)


@dataclass(frozen=True)
class Setup:
    """One configuration: ``steps`` timed steps of ``model`` (an HF directory) on
    ``ranks`` ranks, sharing ``threads`` threads."""

    model: Path
    ranks: int
    checkpointing: bool
    batch: Batch
    steps: int
    threads: int

    def launch(self) -> TrainerLaunch:
        return TrainerLaunch(nproc_per_node=self.ranks, activation_checkpointing=self.checkpointing)


@dataclass(frozen=True)
class RankFigure:
    """What one rank measured: the parameter elements it holds, its resident bytes
    before the first step and at peak over the steps, the most bytes of tensors a step
    holds at once beyond the loaded policy, each timed step's seconds."""

    rank: int
    parameters: int
    loaded: int
    peak: int
    tensors: int
    seconds: list[float]

    @property
    def above(self) -> int:
        """Bytes the steps added to what the rank held before them, at peak."""
        return self.peak - self.loaded


@dataclass(frozen=True)
class Figure:
    setup: Setup
    ranks: list[RankFigure]

    @property
    def step_seconds(self) -> float:
        return statistics.median(self.ranks[0].seconds)

    @property
    def tokens_per_second(self) -> float:
        return self.setup.batch.tokens / self.step_seconds

    @property
    def peak(self) -> int:
        """The highest peak of any rank: what each rank's machine must hold."""
        return max(r.peak for r in self.ranks)

    @property
    def above(self) -> int:
        return max(r.above for r in self.ranks)

    @property
    def tensors(self) -> int:
        return max(r.tensors for r in self.ranks)


def synthetic_batch(vocab: int, batch: Batch, seed: int = 0) -> list[Sample]:
    """``batch`` as training samples: random tokens, advantages of both signs, sampler
    log-probabilities that a random policy could have given (around -log(vocab)), so
    that the loss, its clip and its gradient do real work."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(batch.samples):
        tokens = torch.randint(vocab, (batch.prompt + batch.completion,), generator=gen)
        noise = 0.3 * torch.randn(batch.completion, generator=gen)
        out.append(
            Sample(
                prompt_ids=tokens[: batch.prompt].tolist(),
                output_ids=tokens[batch.prompt :].tolist(),
                sampler_logprobs=(noise - torch.log(torch.tensor(float(vocab)))).tolist(),
                advantage=1.0 if i % 2 else -1.0,
                staleness=0,
            )
        )
    return out


def resident_bytes() -> int:
    return _status_kib("VmRSS") * 1024


def peak_resident_bytes() -> int:
    """This process's resident high-water mark since it started or since the last
    ``reset_peak``."""
    return _status_kib("VmHWM") * 1024


def reset_peak() -> None:
    """Sets the resident high-water mark to the present resident set (Linux 4.0+)."""
    Path("/proc/self/clear_refs").write_text("5")


def _status_kib(field: str) -> int:
    found = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    if found is None:
        raise ValueError(f"/proc/self/status has no {field}: this measure needs Linux")
    return int(found.group(1))


def held_parameters(model: torch.nn.Module) -> int:
    """Parameter elements this process holds: its shards' of a sharded model."""
    return sum(
        p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in model.parameters()
    )


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the optimizer's state tensors in this process (its shards' if sharded)."""
    return sum(
        (t.to_local() if isinstance(t, DTensor) else t).nbytes
        for state in optimizer.state.values()
        for t in state.values()
        if isinstance(t, torch.Tensor)
    )


def measure(setup: Setup, job: str) -> Figure:
    """``setup`` run as a job of fresh processes (``ranks.run_job``); every rank's
    figures, as rank 0 gathered them."""
    from orchestrator.trainer.ranks import run_job

    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as tmp:
        out = Path(tmp) / "figures.json"
        run_job(setup.launch(), job, rank_main, setup, out)
        rows = json.loads(out.read_text())
    return Figure(setup, [RankFigure(**row) for row in rows])


@record  # a rank's exception reaches run_job as its sentence
def rank_main(setup: Setup, out: Path) -> None:
    """One rank of ``measure``'s job: load, shard (with 2 ranks or more), train, measure;
    rank 0 writes every rank's figures to ``out`` as JSON."""
    import torch.distributed as dist

    from orchestrator.trainer.distributed import barrier, data_parallel_step
    from orchestrator.trainer.loop import load_policy
    from orchestrator.trainer.optim import build_optimizer
    from orchestrator.trainer.ranks import joined
    from orchestrator.trainer.step import train_step
    from swarmrl.cli_options import quiet_transformers

    quiet_transformers()
    with joined(setup.launch(), "cpu", setup.threads) as device:
        # As the trainer builds it: one rank is a job of one here, and trains unsharded.
        policy = load_policy(setup.model, str(device), setup.launch(), sharded=setup.ranks > 1)
        recipe = GRPORecipe()
        optimizer = build_optimizer(policy, lr=recipe.lr, weight_decay=recipe.weight_decay)
        samples = synthetic_batch(policy.lm.config.vocab_size, setup.batch)
        step = data_parallel_step if setup.ranks > 1 else train_step
        with torch.no_grad():
            # from_pretrained maps the safetensors file, whose pages are resident only
            # once read: read every weight, so that ``loaded`` holds the policy.
            for p in policy.parameters():
                (p.to_local() if isinstance(p, DTensor) else p).sum()

        def one_step() -> None:
            step(
                policy,
                optimizer,
                samples,
                recipe.loss_config(),
                lr=recipe.lr,
                max_grad_norm=recipe.max_grad_norm,
                temperature=recipe.temperature,
                async_level=recipe.async_level,
                micro_batch=recipe.micro_batch,
            )

        loaded = resident_bytes()
        reset_peak()
        seconds = []
        for _ in range(1 + setup.steps):
            barrier()  # every rank starts the step together
            began = time.perf_counter()
            one_step()
            seconds.append(time.perf_counter() - began)
        peak = peak_resident_bytes()
        # One more step, untimed and after the resident peak was read, as the profiler
        # slows it and its records take memory of their own. AdamW's state exists by
        # then, so it is counted apart.
        tensors = state_bytes(optimizer) + peak_allocated(one_step)
        mine = RankFigure(
            rank=dist.get_rank(),
            parameters=held_parameters(policy),
            loaded=loaded,
            peak=peak,
            tensors=tensors,
            seconds=seconds[1:],  # the warm-up step left out
        )
        every: list[RankFigure | None] = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
        if mine.rank == 0:
            out.write_text(json.dumps([asdict(r) for r in every if r is not None]))


def parameter_count(model_dir: Path) -> int:
    """Parameter elements of the model at ``model_dir`` (a tied head counted once)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def trainer_figures(
    name: str, model_dir: Path, batch: Batch, steps: int, threads: int
) -> list[Figure]:
    """The four configurations of one model, 1 rank without checkpointing first."""
    figures = []
    for ranks in (1, 2):
        for checkpointing in (False, True):
            setup = Setup(model_dir, ranks, checkpointing, batch, steps, threads)
            figure = measure(setup, f"bench-trainer-{ranks}-{int(checkpointing)}")
            print(
                f"  {name}, {ranks} rank(s), checkpointing {_on(checkpointing)}: "
                f"{figure.step_seconds:.2f} s a step, peak RSS {figure.peak / MIB:.0f} MiB, "
                f"tensors {figure.tensors / MIB:.0f} MiB a rank",
                flush=True,
            )
            figures.append(figure)
    return figures


def trainer_table(name: str, figures: Sequence[Figure]) -> None:
    """The figures of one model as a table, with each one's ratios to the first's."""
    base = figures[0]
    print(
        f"\n{name}, {parameter_count(base.setup.model) / 1e6:.2f} M parameters, "
        f"batch {base.setup.batch}, {base.setup.steps} timed steps (median); memory is the "
        "highest rank's:"
    )
    print(
        "| ranks | checkpointing | step (s) | tokens/s | parameters a rank | peak RSS "
        "| RSS above loaded | tensors at peak | RSS above, vs 1 rank | tensors, vs 1 rank "
        "| time vs 1 rank |"
    )
    print("|" + " --- |" * 11)
    for f in figures:
        s = f.setup
        print(
            f"| {s.ranks} | {_on(s.checkpointing)} | {f.step_seconds:.2f} "
            f"| {f.tokens_per_second:.0f} | {f.ranks[0].parameters / 1e6:.2f} M "
            f"| {f.peak / MIB:.0f} MiB | {f.above / MIB:.0f} MiB | {f.tensors / MIB:.0f} MiB "
            f"| {f.above / base.above:.2f} | {f.tensors / base.tensors:.2f} "
            f"| {f.step_seconds / base.step_seconds:.2f} |"
        )


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def whole_logits_reference(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    temperature: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """What the trainer computed before chunking: the LM's logits [B, W, V] for every
    position, the completion positions' gathered, then log-probabilities and entropy
    (``(logprobs, mask, entropy)``, as ``completion_logprobs_and_entropy`` returns)."""
    lengths = [len(p) + len(o) for p, o in zip(prompts, outputs, strict=True)]
    width, steps = max(lengths), max(len(o) for o in outputs)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    attention = torch.zeros_like(ids)
    index = torch.zeros(len(prompts), steps, dtype=torch.long)
    targets = torch.zeros_like(index)
    mask = torch.zeros(len(prompts), steps, dtype=torch.bool)
    for b, (p, o) in enumerate(zip(prompts, outputs, strict=True)):
        ids[b, : lengths[b]] = torch.tensor([*p, *o])
        attention[b, : lengths[b]] = 1
        index[b, : len(o)] = torch.arange(len(p) - 1, len(p) - 1 + len(o))
        targets[b, : len(o)] = torch.tensor(o)
        mask[b, : len(o)] = True
    logits = model(input_ids=ids, attention_mask=attention, use_cache=False).logits
    picked = logits.gather(1, index[:, :, None].expand(-1, -1, logits.shape[-1]))
    vocab = picked.shape[-1]
    flat = token_logprobs(picked.reshape(-1, vocab), targets.reshape(-1), temperature)
    logprobs = flat.reshape(targets.shape).masked_fill(~mask, 0.0)
    scaled = torch.log_softmax(picked.float() / (temperature or 1.0), dim=-1)
    entropy = -(scaled.exp() * scaled).sum(-1).masked_fill(~mask, 0.0)
    return logprobs, mask, entropy


def peak_allocated(run: Callable[[], None]) -> int:
    """The most bytes torch's CPU allocator held at once while ``run`` ran, beyond what
    it held when it started: the running sum of the profiler's allocation and free
    events (allocator-level, so malloc keeping freed pages does not blur it)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    assert prof.profiler is not None  # set once the block ran
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    total = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        total += event.nbytes()  # a free's is negative
        peak = max(peak, total)
    return peak


def large_vocabulary_model(vocab: int = QWEN_VOCAB, hidden: int = 32) -> LlamaForCausalLM:
    """One decoder layer of width ``hidden`` under a tied output head of ``vocab``
    tokens, seeded: a model whose memory is its head's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def head_pass(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    *,
    whole: bool,
    entropy: bool,
    chunk_tokens: int = CHUNK_TOKENS,
) -> None:
    """One micro-batch's scores and their backward, at temperature 0.7: through the
    chunked head, or (``whole``) the whole-logits reference; ``entropy`` adds the
    entropy to the loss (the reference computes it either way)."""
    if whole:
        logprobs, _, entropies = whole_logits_reference(model, prompts, outputs, 0.7)
        loss = logprobs.sum() + (0.1 * entropies.sum() if entropy else 0.0)
    elif entropy:
        logprobs, _, entropies = completion_logprobs_and_entropy(
            model, prompts, outputs, 0.7, chunk_tokens=chunk_tokens
        )
        loss = logprobs.sum() + 0.1 * entropies.sum()
    else:
        # As the trainer without an entropy bonus: no entropy computed at all.
        logprobs, _ = completion_logprobs(model, prompts, outputs, 0.7, chunk_tokens=chunk_tokens)
        loss = logprobs.sum()
    loss.backward()
    model.zero_grad(set_to_none=True)


def head_table(rows: int, reference_rows: int, prompt: int, completion: int) -> None:
    """Peak allocated bytes of one micro-batch's ``head_pass`` at ``QWEN_VOCAB``: the
    whole-logits reference on ``reference_rows`` sequences, the chunked head on those
    and on ``rows``; each against the reference's peak, at ``rows`` extrapolated."""
    model = large_vocabulary_model()
    gen = torch.Generator().manual_seed(0)
    print(
        f"\nOutput head at a {QWEN_VOCAB:,}-token vocabulary (hidden size 32, 1 layer, tied "
        f"head): one micro-batch's forward and backward, {prompt}-token prompts, peak bytes "
        f"allocated; chunked: {CHUNK_TOKENS} rows of logits at a time (CHUNK_TOKENS):"
    )
    print(
        "| micro-batch | computation | peak allocated | in whole fp32 logits copies "
        "| vs whole logits + entropy |"
    )
    print("| --- | --- | --- | --- | --- |")
    per_copy = 0.0  # the reference's peak in copies of its whole logits, measured first
    for b in (reference_rows, rows):
        tokens = torch.randint(QWEN_VOCAB, (b, prompt + completion), generator=gen).tolist()
        prompts, outputs = [t[:prompt] for t in tokens], [t[prompt:] for t in tokens]
        whole_copy = b * (prompt + completion) * QWEN_VOCAB * 4
        variants = [
            ("chunked, log-probabilities (the trainer's default)", False, False),
            ("chunked, log-probabilities + entropy", False, True),
        ]
        if b == reference_rows:
            # Larger micro-batches would ask a shared machine for tens of GiB.
            variants.insert(0, ("whole logits + entropy (reference)", True, True))
        for label, whole, entropy in variants:
            peak = peak_allocated(
                partial(head_pass, model, prompts, outputs, whole=whole, entropy=entropy)
            )
            if whole:
                per_copy = peak / whole_copy
            # Past the reference's size, its peak grows with the logits' size.
            versus = peak / (per_copy * whole_copy)
            print(
                f"| {b} x {completion} | {label} | {peak / GIB:.2f} GiB "
                f"| {peak / whole_copy:.2f} of {whole_copy / GIB:.2f} GiB "
                f"| {versus:.2f}{'' if b == reference_rows else ' (extrapolated)'} |",
                flush=True,
            )
    print(
        f"The whole-logits reference at {rows} x {completion} would peak near "
        f"{per_copy * rows * (prompt + completion) * QWEN_VOCAB * 4 / GIB:.1f} GiB "
        f"({per_copy:.2f} copies of its logits, as at {reference_rows} x {completion}); "
        "not run here."
    )


def main(steps: int = 3, skip_smollm2: bool = False) -> None:
    from orchestrator.pretrain import build_default_model
    from swarmrl.cli_options import quiet_transformers
    from swarmrl.models.files import default_models_dir

    quiet_transformers()
    threads = len(os.sched_getaffinity(0))
    print(
        f"swarmrl bench trainer --steps {steps}{' --skip-smollm2' if skip_smollm2 else ''}: "
        f"torch {torch.__version__}, CPU, {threads} cores; each configuration in fresh "
        f"processes, 1 rank on {threads} threads, 2 ranks (FSDP2, gloo) on "
        f"{max(1, threads // 2)} each"
    )
    print(
        f"On {threads} cores, 2 ranks share the cores 1 rank has alone: data parallelism "
        "adds no compute here and pays for gloo's all-gathers and reduce-scatters through "
        "memory, so a step-time difference says how well 1 process's threads or 2 "
        "processes use the same cores, not what data parallelism gains (that needs one "
        "device per rank; not measured here). What 2 ranks do show is the memory per "
        "rank: half the parameters, gradients and AdamW state, half the batch's activations."
    )
    models = {
        "default model": (build_default_model(default_models_dir() / "default"), DEFAULT_BATCH)
    }
    if not skip_smollm2:
        from swarmrl.models.smollm2 import import_smollm2

        try:
            models["SmolLM2-135M"] = (
                import_smollm2(default_models_dir() / "smollm2"),
                SMOLLM2_BATCH,
            )
        except ValueError as e:
            print(f"SmolLM2-135M skipped: {e}")
    tables = {
        name: trainer_figures(name, path, batch, steps, threads)
        for name, (path, batch) in models.items()
    }
    for name, figures in tables.items():
        trainer_table(name, figures)
    head_table(rows=8, reference_rows=1, prompt=64, completion=1024)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps per figure")
    parser.add_argument("--skip-smollm2", action="store_true", help="leave out SmolLM2-135M")
    args = parser.parse_args()
    main(args.steps, args.skip_smollm2)
