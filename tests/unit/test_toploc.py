"""swarmrl.toploc: interop with the reference, input handling, bad proofs, threads."""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmrl import toploc
from tests.unit.toploc_vectors import VECTORS, load_cases

CASES = load_cases()
REFERENCE_NO_MATCH = 2.0**64  # what the reference reports when no exponent matched
SHARED_VECTORS = Path(__file__).resolve().parents[3] / "shared" / "toploc" / "vectors.json"


def bits_of(tensor: torch.Tensor) -> np.ndarray:
    return tensor.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def random_bits(rows: int, width: int, seed: int = 0) -> np.ndarray:
    gen = torch.Generator().manual_seed(seed)
    return bits_of(torch.randn(rows, width, generator=gen))


# -- interop with toploc 0.1.6 ---------------------------------------------------------


@pytest.mark.skipif(not SHARED_VECTORS.exists(), reason="../shared is not beside this checkout")
def test_vendored_vectors_are_the_shared_ones():
    assert VECTORS.read_bytes() == SHARED_VECTORS.read_bytes()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_generator_reproduces_reference_activations(case):
    bits = case.activations()
    digest = hashlib.sha256(bits.astype("<u2").tobytes()).hexdigest()
    assert digest == case.raw["activations_sha256"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_proofs_are_byte_identical_to_reference(case):
    proofs = toploc.build_proofs(case.activations(), case.raw["chunk"], case.raw["topk"])
    assert proofs == case.proofs
    assert all(len(p) == toploc.proof_size(case.raw["topk"]) for p in proofs)


@pytest.mark.parametrize("variant", ["identical", "perturbed", "unrelated"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_verifier_reports_what_reference_reports(case, variant):
    results = toploc.verify_proofs(
        case.activations(variant), case.proofs, case.raw["chunk"], case.raw["topk"]
    )
    expected = case.raw["checks"][variant]["cpp_path"]
    assert len(results) == len(expected)
    for got, (mismatches, mean, median) in zip(results, expected, strict=True):
        assert got.exp_mismatches == mismatches
        # Where nothing matched the reference reports 2^64; we report infinity.
        assert got.mant_err_mean == (math.inf if mean == REFERENCE_NO_MATCH else mean)
        assert got.mant_err_median == (math.inf if median == REFERENCE_NO_MATCH else median)
        assert got.accepted is (variant != "unrelated")


def test_forced_collision_case_uses_a_reduced_modulus():
    case = next(c for c in CASES if c.raw["force_positions"])
    modulus = int.from_bytes(case.proofs[0][:2], "big")
    assert modulus < toploc.FIELD_PRIME
    assert len({p % modulus for p in case.raw["force_positions"]}) == 2


def test_thresholds_scale_with_k():
    assert toploc.max_exp_mismatches(128) == 38
    assert toploc.max_exp_mismatches(64) == 19
    assert toploc.max_exp_mismatches(4) == 1


# -- what a validator sees in practice -------------------------------------------------


def test_honest_rerun_on_other_hardware_is_accepted_and_other_model_rejected():
    gen = torch.Generator().manual_seed(7)
    hidden = torch.randn(96, 512, generator=gen) * 3
    proofs = toploc.build_proofs(hidden, chunk=32, topk=64)
    # Another GPU: the same computation with float noise far below bf16 precision
    # at times, and across a rounding boundary at others.
    rerun = hidden * (1 + 1e-3 * torch.randn(96, 512, generator=gen))
    assert all(r.accepted for r in toploc.verify_proofs(rerun, proofs, chunk=32, topk=64))
    other = torch.randn(96, 512, generator=gen) * 3
    assert not any(r.accepted for r in toploc.verify_proofs(other, proofs, chunk=32, topk=64))


def test_one_tampered_chunk_is_pinpointed():
    bits = random_bits(128, 256)
    proofs = toploc.build_proofs(bits, chunk=32, topk=32)
    tampered = bits.copy()
    # Chunk 2 computed by another model: a handful of changed rows would stay
    # within the tolerance that absorbs hardware noise.
    tampered[64:96] = random_bits(32, 256, seed=99)
    verdicts = [r.accepted for r in toploc.verify_proofs(tampered, proofs, chunk=32, topk=32)]
    assert verdicts == [True, True, False, True]


# -- inputs ------------------------------------------------------------------------------


def test_torch_bf16_and_numpy_bits_give_the_same_proofs():
    gen = torch.Generator().manual_seed(3)
    t = torch.randn(40, 300, generator=gen).to(torch.bfloat16)
    assert toploc.build_proofs(t, 16, 32) == toploc.build_proofs(bits_of(t), 16, 32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_float_tensors_are_rounded_to_bf16_first(dtype):
    gen = torch.Generator().manual_seed(4)
    t = torch.randn(40, 300, generator=gen, dtype=torch.float64).to(dtype)
    assert toploc.build_proofs(t, 16, 32) == toploc.build_proofs(t.to(torch.bfloat16), 16, 32)


def test_non_contiguous_arrays_are_accepted():
    bits = random_bits(300, 40)
    transposed = bits.T
    assert not transposed.flags.c_contiguous
    assert toploc.build_proofs(transposed, 8, 16) == toploc.build_proofs(
        np.ascontiguousarray(transposed), 8, 16
    )


def test_empty_activations_have_no_proofs():
    empty = np.zeros((0, 64), dtype=np.uint16)
    assert toploc.build_proofs(empty) == []
    assert toploc.verify_proofs(empty, []) == []


@pytest.mark.parametrize(
    ("acts", "message"),
    [
        (np.zeros((4, 4), dtype=np.float32), "uint16"),
        (np.zeros((4, 4, 4), dtype=np.uint16), "2-D"),
        (np.zeros(16, dtype=np.uint16), "2-D"),
        (torch.zeros(4, 4, dtype=torch.int32), "floating-point"),
        (torch.zeros(4), "2-D"),
        ([[1, 2], [3, 4]], "numpy uint16 array or a torch tensor"),
        (np.zeros((4, 0), dtype=np.uint16), "at least one column"),
    ],
)
def test_bad_activations_are_one_clear_value_error(acts, message):
    with pytest.raises(ValueError, match=message):
        toploc.build_proofs(acts, 2, 1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chunk": 0}, "chunk must be a positive integer"),
        ({"topk": 0}, "topk must be a positive integer"),
        ({"topk": True}, "topk must be a positive integer"),
        ({"topk": 2.0}, "topk must be a positive integer"),
        ({"threads": 0}, "threads must be a positive integer"),
        ({"topk": 65_498}, "topk must be between 1 and 65497"),
        ({"topk": 200}, "chunk 0 holds 128 values, fewer than topk = 200"),
    ],
)
def test_bad_parameters_are_one_clear_value_error(kwargs, message):
    bits = random_bits(4, 64)
    params = {"chunk": 2, "topk": 8, **kwargs}
    with pytest.raises(ValueError, match=message):
        toploc.build_proofs(bits, **params)


def test_short_last_chunk_below_topk_is_an_error():
    with pytest.raises(ValueError, match="chunk 2 holds 64 values, fewer than topk = 100"):
        toploc.build_proofs(random_bits(5, 64), chunk=2, topk=100)


# -- bad proofs ---------------------------------------------------------------------------


def test_wrong_number_of_proofs_is_an_error_not_a_silent_skip():
    bits = random_bits(64, 64)
    proofs = toploc.build_proofs(bits, 32, 16)
    with pytest.raises(ValueError, match=r"expected 2 proofs \(64 rows in chunks of 32\), got 1"):
        toploc.verify_proofs(bits, proofs[:1], 32, 16)
    with pytest.raises(ValueError, match="expected 2 proofs"):
        toploc.verify_proofs(bits, [*proofs, proofs[0]], 32, 16)


def test_missing_null_short_and_garbage_proofs_reject_their_chunk():
    bits = random_bits(160, 64)
    good = toploc.build_proofs(bits, 32, 16)
    null = bytes(toploc.proof_size(16))  # the reference's ProofPoly.null
    proofs = [good[0], None, null, good[3][:-1], b"\xff" * toploc.proof_size(16)]
    results = toploc.verify_proofs(bits, proofs, 32, 16)
    assert [r.accepted for r in results] == [True, False, False, False, False]
    assert results[1].exp_mismatches == 16
    assert math.isinf(results[1].mant_err_mean)


def test_proofs_may_be_bytearray_or_memoryview():
    bits = random_bits(32, 64)
    (proof,) = toploc.build_proofs(bits, 32, 16)
    for wrapped in (bytearray(proof), memoryview(proof)):
        assert toploc.verify_proofs(bits, [wrapped], 32, 16)[0].accepted


@pytest.mark.parametrize(
    ("proofs", "message"),
    [
        (b"\x00\x01", "a sequence of proofs"),
        ("abc", "a sequence of proofs"),
        (["00ff"], "proof 0 must be bytes or None, got str"),
        ([12], "proof 0 must be bytes or None, got int"),
    ],
)
def test_proofs_of_the_wrong_type_are_a_value_error(proofs, message):
    with pytest.raises(ValueError, match=message):
        toploc.verify_proofs(random_bits(32, 64), proofs, 32, 16)


@settings(max_examples=300, deadline=None)
@given(proof=st.binary(max_size=80))
def test_fuzzed_proof_bytes_only_ever_reject(proof):
    bits = random_bits(32, 64)
    (honest,) = toploc.build_proofs(bits, 32, 16)
    (result,) = toploc.verify_proofs(bits, [proof], 32, 16)
    assert result.accepted == (proof == honest)
    assert 0 <= result.exp_mismatches <= 16


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 20),
    width=st.integers(1, 40),
    chunk=st.integers(1, 8),
    topk=st.integers(1, 64),
    data=st.data(),
)
def test_fuzzed_shapes_either_round_trip_or_raise_value_error(rows, width, chunk, topk, data):
    # Finite bf16 values only: an exponent of all ones is inf or NaN.
    finite = st.integers(0, 0xFFFF).filter(lambda b: (b >> 7) & 0xFF != 0xFF)
    values = data.draw(st.lists(finite, min_size=rows * width, max_size=rows * width))
    bits = np.array(values, dtype=np.uint16).reshape(rows, width)
    chunk_sizes = [min(chunk, rows - start) * width for start in range(0, rows, chunk)]
    if min(chunk_sizes) < topk:
        with pytest.raises(ValueError, match="fewer than topk"):
            toploc.build_proofs(bits, chunk, topk)
        return
    proofs = toploc.build_proofs(bits, chunk, topk)
    assert len(proofs) == math.ceil(rows / chunk)
    for result in toploc.verify_proofs(bits, proofs, chunk, topk):
        assert result.accepted
        assert result.exp_mismatches == 0
        assert result.mant_err_mean == 0.0


# -- threads and the GIL -------------------------------------------------------------------


def test_every_thread_count_gives_the_same_proofs():
    bits = random_bits(256, 512)
    one = toploc.build_proofs(bits, threads=1)
    assert toploc.build_proofs(bits, threads=2) == one
    assert toploc.build_proofs(bits, threads=5) == one
    assert toploc.build_proofs(bits) == one


def test_rayon_num_threads_sizes_the_default_pool():
    script = (
        "import os, numpy as np\n"
        "from swarmrl import toploc\n"
        "before = len(os.listdir('/proc/self/task'))\n"
        "toploc.build_proofs(np.ones((64, 256), dtype=np.uint16))\n"
        "print(len(os.listdir('/proc/self/task')) - before)\n"
    )
    env = {**os.environ, "RAYON_NUM_THREADS": "3"}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert int(out.stdout) == 3


def test_the_gil_is_released_while_proving():
    # Large k makes each chunk slow (k² field operations), so the call lasts
    # long enough for the main thread to be scheduled many times, which it can
    # only be if the worker is not holding the GIL.
    bits = random_bits(512, 2048)
    done = threading.Event()

    def prove() -> None:
        toploc.build_proofs(bits, chunk=32, topk=2048, threads=1)
        done.set()

    worker = threading.Thread(target=prove)
    worker.start()
    ticks = 0
    while not done.is_set():
        time.sleep(0.0005)
        ticks += 1
    worker.join()
    assert ticks >= 10
