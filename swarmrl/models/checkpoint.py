"""Model directories on disk: HF layout, safetensors weights, a tokenizer.

A policy checkpoint is a directory with ``config.json``, ``model.safetensors``
(or shards listed in ``model.safetensors.index.json``) and the tokenizer files.
That is what the trainer writes, what the swarm broadcasts and what every
backend loads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files holding a checkpoint's weights."""
    model_dir = Path(model_dir)
    if (model_dir / SINGLE_FILE).is_file():
        return [model_dir / SINGLE_FILE]
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{index} is not a valid safetensors index ({e})") from None
        if any("/" in n or n.startswith(".") for n in names):
            raise ValueError(f"{index} names files outside its directory")
        return [model_dir / n for n in names]
    raise ValueError(f"{model_dir} holds no {SINGLE_FILE} (is it a model directory?)")


def read_state_dict(model_dir: Path) -> dict[str, Any]:
    """Every tensor of a checkpoint, on the CPU."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    state: dict[str, Any] = {}
    for path in weight_files(model_dir):
        try:
            state.update(load_file(path))
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{path} is not a readable safetensors file ({e})") from None
    return state


def load_tokenizer(model_dir: Path) -> Any:
    """The checkpoint's tokenizer, from local files only."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(Path(model_dir), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ValueError(f"{model_dir} holds no loadable tokenizer ({e})") from None


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """A user prompt as the model expects it: its chat template when it has one."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        # transformers 5 returns a BatchEncoding here; older versions a list.
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    return list(tokenizer(text)["input_ids"])
