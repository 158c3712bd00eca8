"""TOPLOC proofs of inference, computed by the native core.

A proof commits to the ``topk`` largest-magnitude activations of each chunk of
``chunk`` rows (rows are tokens, columns the hidden size) as a polynomial over
GF(65497). It is byte-compatible with toploc 0.1.6: ``[modulus: u16 BE]``
followed by ``topk`` coefficients (u16 BE, lowest power first).

Activations are bf16. Pass either a 2-D numpy ``uint16`` array holding bf16 bit
patterns, or a 2-D torch tensor: ``bfloat16`` is used as is, ``float16``,
``float32`` and ``float64`` are first rounded to bf16 (round to nearest even,
as ``tensor.to(torch.bfloat16)`` does), and tensors on a GPU are copied to the
host. Nothing else is accepted.

Verification recomputes each chunk's top-k and compares its bf16 exponents and
mantissas with the values the proof claims (the sign is not compared, as in the
reference). A chunk is accepted when at most ``topk * 38 // 128`` exponents
differ (the reference's 38 of 128, scaled to other k), and the mean and upper
median of the mantissa differences among the matching exponents are at most 10
and 8. A missing (``None``) or malformed proof rejects its chunk; a wrong number
of proofs is a ``ValueError``.

``threads`` defaults to all cores, or to ``RAYON_NUM_THREADS`` when it is set.
The GIL is released while proofs are built or checked.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from swarmrl import _native
from swarmrl._native import VerifyResult

__all__ = [
    "FIELD_PRIME",
    "MAX_EXP_MISMATCH_PER_128",
    "MAX_MANT_ERR_MEAN",
    "MAX_MANT_ERR_MEDIAN",
    "VerifyResult",
    "build_proofs",
    "max_exp_mismatches",
    "proof_size",
    "verify_proofs",
]

FIELD_PRIME: int = _native.TOPLOC_FIELD_PRIME
MAX_EXP_MISMATCH_PER_128: int = _native.TOPLOC_MAX_EXP_MISMATCH_PER_128
MAX_MANT_ERR_MEAN: float = _native.TOPLOC_MAX_MANT_ERR_MEAN
MAX_MANT_ERR_MEDIAN: float = _native.TOPLOC_MAX_MANT_ERR_MEDIAN

_FLOAT_DTYPES = ("float16", "float32", "float64")


def proof_size(topk: int) -> int:
    """Bytes in one proof for ``topk``: the modulus plus one u16 per coefficient."""
    return 2 + 2 * topk


def max_exp_mismatches(topk: int) -> int:
    """Exponent mismatches a chunk may have and still be accepted."""
    return topk * MAX_EXP_MISMATCH_PER_128 // 128


def _bf16_bits(acts: Any) -> np.ndarray:
    """The activations as a C-contiguous 2-D uint16 array of bf16 bit patterns."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(acts, torch.Tensor):
        if acts.dim() != 2:
            raise ValueError(f"activations must be 2-D (tokens x hidden), got {acts.dim()}-D")
        tensor = acts.detach()
        if tensor.dtype != torch.bfloat16:
            if str(tensor.dtype).removeprefix("torch.") not in _FLOAT_DTYPES:
                raise ValueError(f"activations must be a floating-point tensor, got {tensor.dtype}")
            tensor = tensor.to(torch.bfloat16)
        # A same-size integer view of the bits; numpy has no bfloat16.
        bits: np.ndarray = tensor.cpu().contiguous().view(torch.int16).numpy().view(np.uint16)
        return bits
    if isinstance(acts, np.ndarray):
        if acts.dtype != np.uint16:
            raise ValueError(
                f"a numpy array of activations must hold bf16 bit patterns as uint16, "
                f"got {acts.dtype}"
            )
        if acts.ndim != 2:
            raise ValueError(f"activations must be 2-D (tokens x hidden), got {acts.ndim}-D")
        return np.ascontiguousarray(acts)
    raise ValueError(
        f"activations must be a numpy uint16 array or a torch tensor, got {type(acts).__name__}"
    )


def _check_params(chunk: int, topk: int, threads: int | None) -> None:
    for name, value in (("chunk", chunk), ("topk", topk)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
    ):
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}")


def build_proofs(
    acts: Any, chunk: int = 32, topk: int = 128, *, threads: int | None = None
) -> list[bytes]:
    """One proof per chunk of ``chunk`` rows; the last chunk may be shorter.

    Raises ``ValueError`` for malformed activations, or when a chunk holds
    fewer than ``topk`` values.
    """
    _check_params(chunk, topk, threads)
    return _native.toploc_build_proofs(_bf16_bits(acts), chunk, topk, threads)


def verify_proofs(
    acts: Any,
    proofs: Sequence[bytes | None],
    chunk: int = 32,
    topk: int = 128,
    *,
    threads: int | None = None,
) -> list[VerifyResult]:
    """One ``VerifyResult`` per chunk, in order.

    ``proofs`` must hold exactly one entry per chunk; an entry may be ``None``
    (missing), which rejects that chunk like any malformed proof does.
    """
    _check_params(chunk, topk, threads)
    if isinstance(proofs, bytes | bytearray | memoryview | str):
        raise ValueError("proofs must be a sequence of proofs, one per chunk, not a single value")
    normalised: list[bytes | None] = []
    for i, proof in enumerate(proofs):
        if proof is None or isinstance(proof, bytes):
            normalised.append(proof)
        elif isinstance(proof, bytearray | memoryview):
            normalised.append(bytes(proof))
        else:
            raise ValueError(f"proof {i} must be bytes or None, got {type(proof).__name__}")
    return _native.toploc_verify_proofs(_bf16_bits(acts), normalised, chunk, topk, threads)
