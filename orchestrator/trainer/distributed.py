"""Data-parallel GRPO steps over several processes with FSDP2 (``fully_shard``).

Every rank is handed the whole batch and trains on its own strided slice of it.
Because the loss divides by a constant normalizer (Dr. GRPO), the loss of the
batch is the sum of its slices' losses and so is the gradient: gradients are
SUMMED across ranks, never averaged, and a step over N ranks is the single-process
``train_step`` on the same batch, up to float rounding.

The same code runs on GPUs (NCCL) and on CPU (gloo), which is how it is tested.

The process group must be initialised (on GPUs, with each rank's device set by
``torch.cuda.set_device``) and the model moved to its device before ``shard``;
the optimizer is built after it (``fully_shard`` replaces the parameters).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from orchestrator.trainer.loss import LossConfig
from orchestrator.trainer.recipe import RatioAgainst
from orchestrator.trainer.samples import Sample
from orchestrator.trainer.step import TOKEN_WEIGHTED, StepResult, accumulate_gradients


def shard(model: torch.nn.Module) -> torch.nn.Module:
    """Shard a Llama-like HF causal LM over every rank of the default process group.

    Each decoder layer is its own FSDP unit, so only one layer's full weights live
    at a time; the root unit keeps the rest (embeddings, final norm, and the output
    head, which the default model ties to the embeddings: both names hold one
    parameter, so they stay one sharded parameter). The mesh follows the model's
    device, so a CPU model shards over gloo even on a machine that has a GPU.
    """
    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    layers = model.get_submodule("model.layers")  # a decoder-only HF model's
    assert isinstance(layers, torch.nn.ModuleList)
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # The normalizer is global already: the ranks' gradients add up, as
            # their losses do (FSDP2 would average them). With a factor of 1 it
            # would still multiply by 1 (PREMUL_SUM); a plain SUM skips that and
            # keeps NCCL's zero-copy reduce-scatter available.
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return model


def data_parallel_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    samples: Sequence[Sample],
    loss_config: LossConfig,
    *,
    lr: float,
    max_grad_norm: float,
    temperature: float,
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
    device = next(model.parameters()).device
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss, metrics = accumulate_gradients(
        model,
        mine,
        loss_config,
        temperature=temperature,
        micro_batch=micro_batch,
        ratio_against=ratio_against,
        reference=reference,
    )
    # Each forward and backward is a round of collectives: a rank with fewer
    # micro-batches (or none) joins the others' extra rounds with passes that add
    # nothing to the gradient.
    longest = math.ceil(len(samples) / world)
    for _ in range(_passes(longest, micro_batch) - _passes(len(mine), micro_batch)):
        _idle_pass(model, device)

    tokens = metrics["tokens"]
    sums = torch.tensor(
        [loss, tokens, *(metrics[key] * tokens for key in TOKEN_WEIGHTED)],
        dtype=torch.float64,
        device=device,
    )
    dist.all_reduce(sums)
    peak = torch.tensor([metrics["ratio_max"]], dtype=torch.float64, device=device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    total_loss, total_tokens, *weighted = sums.tolist()
    merged = {
        key: value / max(total_tokens, 1.0)
        for key, value in zip(TOKEN_WEIGHTED, weighted, strict=True)
    }
    merged |= {"ratio_max": peak.item(), "tokens": total_tokens}

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
    return StepResult(applied=applied, loss=total_loss, grad_norm=grad_norm, metrics=merged)


def full_state_dict(model: torch.nn.Module) -> dict[str, Tensor]:
    """The whole model's weights as plain CPU tensors, for ``save_checkpoint(weights=...)``.

    Every rank must call it (it gathers the shards), but only rank 0 gets the
    tensors, to hold one full copy in host memory rather than one per rank; the
    other ranks get an empty dict.
    """
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    # A model's state dict holds tensors only (the ValueType it is declared with also
    # covers optimizer states).
    return cast(dict[str, Tensor], get_model_state_dict(model, options=options))


def _passes(n_samples: int, micro_batch: int) -> int:
    return math.ceil(n_samples / micro_batch)


def _idle_pass(model: torch.nn.Module, device: torch.device) -> None:
    """A forward and backward on one token whose loss is zero times the logits:
    it runs every collective a real micro-batch runs and adds exactly zero."""
    ids = torch.zeros(1, 1, dtype=torch.long, device=device)
    logits = model(input_ids=ids, use_cache=False).logits
    (logits.sum() * 0.0).backward()
