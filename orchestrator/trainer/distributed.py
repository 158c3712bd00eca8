"""Data-parallel GRPO steps over several processes with FSDP2 (``fully_shard``).

Every rank is handed the whole batch and trains on its own strided slice of it.
Because the loss divides by a constant normalizer (Dr. GRPO), the loss of the
batch is the sum of its slices' losses and so is the gradient: gradients are
SUMMED across ranks, never averaged, and a step over N ranks is the single-process
``train_step`` on the same batch, up to float rounding.

The same code runs on GPUs (NCCL) and on CPU (gloo), which is how it is tested.

The process group must be initialised (on GPUs, with each rank's device set by
``torch.cuda.set_device``) before ``shard``, which takes the weights of rank 0's model
(the others' may be built on the meta device); the optimizer is built after it
(``fully_shard`` replaces the parameters).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor

from orchestrator.trainer.batch import TokenScorer, completion_logprobs, compute_device
from orchestrator.trainer.loss import LossConfig
from orchestrator.trainer.recipe import RatioAgainst
from orchestrator.trainer.samples import Sample
from orchestrator.trainer.step import StepResult, accumulate_gradients


def shard(
    model: TokenScorer,
    *,
    device: torch.device,
    mixed_precision: bool | None = None,
    offload: bool = False,
) -> torch.nn.Module:
    """Shard a Llama-like HF causal LM, in the ``TokenScorer`` the trainer scores tokens
    with (the root unit), over every rank of the default process group, with rank 0's
    weights: every rank passes the same architecture, and only rank 0's model needs
    its weights. The others' may be on the meta device (``model_skeleton``): each rank
    materialises its shards only and fills them from rank 0's, so no rank but rank 0
    ever holds the whole model.

    Each decoder layer is its own FSDP unit, so only one layer's full weights live
    at a time; the root unit keeps the rest (embeddings, final norm, and the output
    head, which the default model ties to the embeddings: both names hold one
    parameter, so they stay one sharded parameter). The mesh is on ``device``, so a
    CPU model shards over gloo even on a machine that has a GPU; a model loaded on
    the CPU and sharded onto a GPU moves there one unit at a time, never whole.

    ``mixed_precision`` (default: on a GPU) computes in bf16 from the fp32 master
    shards and reduces gradients in fp32, so the sum across ranks loses nothing to
    bf16's 8-bit mantissa; on a CPU bf16 matmuls are slower than fp32. ``offload``
    keeps the shards, their gradients and so the optimizer's state in host memory
    (FSDP2's CPU offload: the optimizer steps on the CPU).
    """
    # Rank 0's weights as loaded, before fully_shard replaces its parameters: what every
    # rank's shards are filled from below (rank 0 keeps the loaded tensors until then).
    weights = model.state_dict() if dist.get_rank() == 0 else {}
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    if mixed_precision is None:
        mixed_precision = device.type == "cuda"
    options: dict[str, Any] = {"mesh": mesh}
    if mixed_precision:
        options["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    if offload:
        options["offload_policy"] = CPUOffloadPolicy()
    layers = model.lm.get_decoder().layers
    assert isinstance(layers, torch.nn.ModuleList)
    for layer in layers:
        fully_shard(layer, **options)
    fully_shard(model, **options)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # The normalizer is global already: the ranks' gradients add up, as
            # their losses do (FSDP2 would average them). With a factor of 1 it
            # would still multiply by 1 (PREMUL_SUM); a plain SUM skips that and
            # keeps NCCL's zero-copy reduce-scatter available.
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    if dist.get_rank() != 0:
        # Storage for this rank's shards only (on the CPU where they are offloaded),
        # uninitialised until rank 0's weights arrive. FSDP2 swaps the sharded
        # parameters in place, so a tied parameter stays one.
        model.to_empty(device=torch.device("cpu") if offload else device)
    # Rank 0 broadcasts one tensor at a time; each rank keeps its slice of it.
    set_model_state_dict(
        model, weights, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )
    _broadcast_buffers(model, device)
    return model


def _broadcast_buffers(model: torch.nn.Module, device: torch.device) -> None:
    """Rank 0's buffers on every rank, on ``device`` (where FSDP2 keeps them, offloaded or
    not). The non-persistent ones, computed when the model is built (a rotary
    embedding's inverse frequencies), are in no state dict, and a model built on the
    meta device holds uninitialised memory for them. They are small: sent as objects,
    with rank 0's shapes and dtypes."""
    box = [
        {name: b.cpu() for name, b in model.named_buffers(remove_duplicate=False)}
        if dist.get_rank() == 0
        else None
    ]
    dist.broadcast_object_list(box, src=0)
    assert box[0] is not None
    for name, value in box[0].items():
        owner, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(owner), leaf, value.to(device))


def data_parallel_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    samples: Sequence[Sample],
    loss_config: LossConfig,
    *,
    lr: float,
    max_grad_norm: float,
    temperature: float,
    async_level: int,
    micro_batch: int = 32,
    ratio_against: RatioAgainst = "sampler",
    reference: torch.nn.Module | None = None,
) -> StepResult:
    """``train_step`` for a sharded model: the same result, computed across ranks.

    Every rank must call it with the same ``samples`` and settings. The loss,
    gradient norm, metrics and the decision to skip a non-finite step come from
    collectives, so they are identical on every rank and no rank steps alone.
    """
    if not samples:
        raise ValueError("a step needs at least one sample")
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = samples[rank::world]
    device = compute_device(model)
    model.train()
    optimizer.zero_grad(set_to_none=True)
    tally = accumulate_gradients(
        model,
        mine,
        loss_config,
        temperature=temperature,
        micro_batch=micro_batch,
        async_level=async_level,
        ratio_against=ratio_against,
        reference=reference,
    )
    # Each forward and backward is a round of collectives: a rank with fewer
    # micro-batches (or none) joins the others' extra rounds with passes that add
    # nothing to the gradient.
    longest = math.ceil(len(samples) / world)
    for _ in range(_passes(longest, micro_batch) - _passes(len(mine), micro_batch)):
        _idle_pass(model)

    # The tally's sums add up across ranks and its extremes are the ranks' extremes:
    # merged, it is the tally one process counts on the whole batch, and so are the
    # metrics read off it (means, the ratio's std, staleness buckets alike).
    sums, lows, highs = tally.tensors(device)
    dist.all_reduce(sums)
    dist.all_reduce(lows, op=dist.ReduceOp.MIN)
    dist.all_reduce(highs, op=dist.ReduceOp.MAX)
    merged = tally.with_tensors(sums, lows, highs)
    total_loss = merged.loss

    params = [p for p in model.parameters() if p.requires_grad]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    if isinstance(norm, DTensor):
        # Each rank holds the norm of its shards; full_tensor() all-reduces them.
        norm = norm.full_tensor()
    grad_norm = float(norm)
    # Both numbers came out of all-reduces, so every rank reaches the same verdict.
    applied = math.isfinite(total_loss) and math.isfinite(grad_norm)
    if applied:
        torch.nn.utils.clip_grads_with_norm_(params, max_grad_norm, norm)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    return StepResult(
        applied=applied, loss=total_loss, grad_norm=grad_norm, metrics=merged.metrics()
    )


def full_state_dict(model: torch.nn.Module) -> dict[str, Tensor]:
    """The whole model's weights as plain CPU tensors, for publishing.

    Every rank of a sharded model must call it (it gathers the shards), but only rank 0
    gets the tensors, to hold one full copy in host memory rather than one per rank;
    the other ranks get an empty dict. Without a process group: the model's own.
    """
    if not dist.is_initialized():
        return {name: t.detach().cpu() for name, t in model.state_dict().items()}
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    # A model's state dict holds tensors only (the ValueType it is declared with also
    # covers optimizer states).
    return cast(dict[str, Tensor], get_model_state_dict(model, options=options))


def is_main() -> bool:
    """Whether this process writes what one process writes (rank 0, or the only one)."""
    return not dist.is_initialized() or dist.get_rank() == 0


def barrier() -> None:
    """Waits for every rank; nothing without a process group."""
    if dist.is_initialized():
        dist.barrier()


def _passes(n_samples: int, micro_batch: int) -> int:
    return math.ceil(n_samples / micro_batch)


def _idle_pass(model: torch.nn.Module) -> None:
    """A forward and backward on one token whose loss is zero times its score: it runs
    every collective a real micro-batch runs and adds exactly zero."""
    logprobs, _ = completion_logprobs(model, [[0]], [[0]], temperature=1.0)
    (logprobs.sum() * 0.0).backward()
