"""swarmrl.delta on real safetensors files: the default architecture's weights saved by
safetensors.torch in bf16 and fp32, cross-checked against the blake3 PyPI package."""

from __future__ import annotations

import itertools
from pathlib import Path

import blake3
import pytest
import torch
from safetensors.torch import load_file, save_file

from swarmrl import delta
from tests.unit.test_shards import leftovers, one_sentence

Weights = dict[str, torch.Tensor]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@pytest.fixture(scope="module")
def weights(model_dirs) -> Weights:
    """The tiny default model's state dict (the session's shared random model)."""
    return load_file(model_dirs[0] / "model.safetensors")


def perturbed(weights: Weights, dtype: torch.dtype, kind: str, seed: int = 0) -> Weights:
    """`weights` in `dtype` after a change of one `kind`: every weight moved by 1e-3 of
    itself (about what an optimiser step does), 1% of the weights moved, or none."""
    noise = torch.Generator().manual_seed(seed)
    out = {}
    for name, w in weights.items():
        w = w.to(dtype)
        if kind == "relative":
            w = (w.float() * (1 + 1e-3 * torch.randn(w.shape, generator=noise))).to(dtype)
        elif kind == "one_percent":
            flat = w.flatten().clone()
            picked = torch.randperm(flat.numel(), generator=noise)[: max(1, flat.numel() // 100)]
            moved = flat[picked].float() + 0.05 * torch.randn(len(picked), generator=noise)
            flat[picked] = moved.to(dtype)
            w = flat.view(w.shape)
        out[name] = w.contiguous()
    return out


def saved(tensors: Weights, path: Path) -> Path:
    save_file(tensors, path)
    return path


@pytest.fixture(scope="module")
def bf16_case(weights, tmp_path_factory) -> tuple[Path, Path, Path]:
    """A bf16 base, its 1e-3-relative step, and the delta between them."""
    root = tmp_path_factory.mktemp("bf16")
    base = saved(perturbed(weights, torch.bfloat16, "none"), root / "base.safetensors")
    target = saved(perturbed(weights, torch.bfloat16, "relative"), root / "target.safetensors")
    delta.encode(base, target, root / "step.delta")
    return base, target, root / "step.delta"


@pytest.mark.parametrize("kind", ["relative", "one_percent", "none"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_round_trip_is_bit_identical(tmp_path, weights, dtype, kind):
    base = saved(perturbed(weights, DTYPES[dtype], "none"), tmp_path / "base.safetensors")
    target = saved(perturbed(weights, DTYPES[dtype], kind), tmp_path / "target.safetensors")
    stats = delta.encode(base, target, tmp_path / "d" / "step.delta")
    delta.apply(base, tmp_path / "d" / "step.delta", tmp_path / "out" / "model.safetensors")
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == target.read_bytes()
    assert leftovers(tmp_path / "d") == ["step.delta"]
    assert leftovers(tmp_path / "out") == ["model.safetensors"]

    assert stats.tensors == len(weights) == stats.xor_tensors + stats.sparse_tensors
    assert stats.total_elements == sum(w.numel() for w in weights.values())
    assert stats.target_bytes == target.stat().st_size
    assert stats.delta_bytes == (tmp_path / "d" / "step.delta").stat().st_size
    assert stats.seconds > 0
    if kind == "none":
        assert (stats.changed_elements, stats.sparse_tensors) == (0, len(weights))
        # The header's record per tensor (name, sizes, hash) is nearly all of it.
        assert stats.delta_bytes < 300 * len(weights)
    if kind == "one_percent":
        assert stats.changed_elements <= stats.total_elements // 100
        assert stats.sparse_tensors == len(weights)
        assert stats.delta_bytes < stats.target_bytes / 20


def test_a_small_step_in_bf16_makes_a_small_delta(bf16_case):
    _, target, step = bf16_case
    info = delta.inspect(step)
    # A 1e-3-relative step moves about 1% of bf16 weights (8 bits of mantissa round
    # the rest back), each by a bit or two.
    assert info.delta_size < target.stat().st_size / 10
    assert {t.encoding for t in info.tensors} <= {"xor", "sparse"}
    assert "sparse" in {t.encoding for t in info.tensors}


def test_inspect_describes_the_delta(bf16_case):
    base, target, step = bf16_case
    info = delta.inspect(step)
    assert info.base_blake3 == blake3.blake3(base.read_bytes()).hexdigest()
    assert info.target_blake3 == blake3.blake3(target.read_bytes()).hexdigest()
    assert info.target_size == target.stat().st_size
    assert info.delta_size == step.stat().st_size
    tensors = load_file(target)
    assert info.tensor_count == len(info.tensors) == len(tensors)
    assert {t.name for t in info.tensors} == set(tensors)
    for record in info.tensors:
        raw = tensors[record.name].contiguous().view(torch.uint8).numpy().tobytes()
        assert record.blake3 == blake3.blake3(raw).hexdigest()
        assert record.length == len(raw)
        assert record.element_size == tensors[record.name].element_size()
    # Payloads lie back to back in file order, up to the end of the delta.
    ends = [(t.offset, t.offset + t.compressed) for t in info.tensors]
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ends))
    assert ends[-1][1] == info.delta_size
    assert step.read_bytes()[:8] == delta.MAGIC
    assert repr(info).startswith("DeltaInfo(")
    assert repr(info.tensors[0]).startswith("DeltaTensor(")


def test_the_delta_does_not_depend_on_the_thread_count(bf16_case, tmp_path):
    base, target, step = bf16_case
    for threads in (1, 2):
        delta.encode(base, target, tmp_path / f"{threads}.delta", threads=threads)
        assert (tmp_path / f"{threads}.delta").read_bytes() == step.read_bytes()
        delta.apply(base, step, tmp_path / f"{threads}.out", threads=threads)
        assert (tmp_path / f"{threads}.out").read_bytes() == target.read_bytes()


def test_files_with_other_headers_cannot_be_deltas(weights, tmp_path):
    base = saved(perturbed(weights, torch.bfloat16, "none"), tmp_path / "base.safetensors")
    fewer = perturbed(weights, torch.bfloat16, "none")
    dropped = sorted(fewer)[-1]
    del fewer[dropped]
    recast = perturbed(weights, torch.bfloat16, "none")
    recast["model.norm.weight"] = recast["model.norm.weight"].float()
    for target, what in [
        (fewer, f"tensor '{dropped}' is only in the base"),
        (recast, "model.norm.weight"),
        (perturbed(weights, torch.float32, "none"), "cannot be a delta of"),
    ]:
        path = saved(target, tmp_path / "target.safetensors")
        with pytest.raises(ValueError, match="cannot be a delta of") as e:
            delta.encode(base, path, tmp_path / "step.delta")
        assert what in one_sentence(e)
        assert str(path) in str(e.value)
        assert str(base) in str(e.value)
        assert leftovers(tmp_path) == ["base.safetensors", "target.safetensors"]


def test_a_delta_applies_only_onto_its_base(bf16_case, weights, tmp_path):
    _, target, step = bf16_case
    # The same header, other weights: a base the delta was not made against.
    other = saved(perturbed(weights, torch.bfloat16, "relative", seed=9), tmp_path / "other")
    out = tmp_path / "out.safetensors"
    out.write_bytes(b"the previous step")
    with pytest.raises(ValueError, match="is not the delta's base") as e:
        delta.apply(other, step, out)
    assert str(other) in one_sentence(e)
    assert out.read_bytes() == b"the previous step"
    assert leftovers(tmp_path) == ["other", "out.safetensors"]
    # The target is not its own base either.
    with pytest.raises(ValueError, match="is not the delta's base"):
        delta.apply(target, step, out)
    assert out.read_bytes() == b"the previous step"


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[:-3], "the delta is truncated: tensor '.*' needs 3 bytes past its end"),
        (lambda b: b[:15], "the delta is truncated: its preamble"),
        (lambda b: b + b"x", "the delta has 1 bytes after its last payload"),
        (lambda b: b"GGUF" + b[4:], "not a swarmrl weight delta"),
        (lambda b: b[:8] + b"\x03" + b[9:], "format version 3"),
        (lambda b: b[:20] + b"[" + b[21:], "header is not valid"),
    ],
)
def test_a_damaged_delta_is_refused_and_out_is_untouched(bf16_case, tmp_path, damage, message):
    base, _, step = bf16_case
    bad = tmp_path / "bad.delta"
    bad.write_bytes(damage(step.read_bytes()))
    out = tmp_path / "out.safetensors"
    with pytest.raises(ValueError, match=message) as e:
        delta.apply(base, bad, out)
    one_sentence(e)
    with pytest.raises(ValueError, match=message):
        delta.inspect(bad)
    assert leftovers(tmp_path) == ["bad.delta"]


def test_a_flipped_payload_byte_is_caught(bf16_case, tmp_path):
    base, _, step = bf16_case
    data = bytearray(step.read_bytes())
    data[-1000] ^= 0x10
    bad = tmp_path / "bad.delta"
    bad.write_bytes(data)
    with pytest.raises(ValueError, match=r"^tensor '") as e:
        delta.apply(base, bad, tmp_path / "out")
    one_sentence(e)
    assert leftovers(tmp_path) == ["bad.delta"]


def test_missing_files_and_bad_arguments(bf16_case, tmp_path):
    base, target, step = bf16_case
    with pytest.raises(FileNotFoundError):
        delta.apply(tmp_path / "missing", step, tmp_path / "out")
    with pytest.raises(FileNotFoundError):
        delta.apply(base, tmp_path / "missing", tmp_path / "out")
    with pytest.raises(FileNotFoundError):
        delta.encode(base, tmp_path / "missing", tmp_path / "d")
    with pytest.raises(FileNotFoundError):
        delta.inspect(tmp_path / "missing")
    with pytest.raises(ValueError, match="not a regular file"):
        delta.inspect(tmp_path)
    for level in (delta.MAX_LEVEL + 1, delta.MIN_LEVEL - 1, 2.5, True):
        with pytest.raises(ValueError, match="level"):
            delta.encode(base, target, tmp_path / "d", level=level)
    assert leftovers(tmp_path) == []
