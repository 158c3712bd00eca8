"""Model directories on disk: HF layout, safetensors weights, a tokenizer.

A policy checkpoint is a directory with ``config.json``, ``model.safetensors``
(or shards listed in ``model.safetensors.index.json``) and the tokenizer files.
That is what the trainer writes, what the swarm broadcasts and what every
backend loads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # both are imported where used: they take seconds to load
    import torch
    from transformers import PreTrainedModel

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def check_model_dir(model_dir: Path) -> None:
    """ValueError in one sentence unless ``model_dir`` is an existing directory (before a
    library reads a missing path as the name of a model to download)."""
    if not model_dir.exists():
        raise ValueError(f"model directory {model_dir} does not exist")
    if not model_dir.is_dir():
        raise ValueError(f"{model_dir} is a file, not a model directory")


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files holding a checkpoint's weights."""
    model_dir = Path(model_dir)
    check_model_dir(model_dir)
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


def check_finite(where: Path, name: str, tensor: Any) -> None:
    """ValueError in one sentence if the floating-point ``tensor`` holds NaN or inf."""
    import torch

    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
        raise ValueError(f"{where}: {name} holds values that are not finite")


def check_model(model_dir: Path) -> None:
    """ValueError in one sentence unless the checkpoint is whole: every tensor its
    ``config.json`` calls for is present with that shape, nothing else is, and every
    value is finite. Reads each tensor once, one at a time."""
    from safetensors import SafetensorError, safe_open

    model_dir = Path(model_dir)
    files = weight_files(model_dir)
    skeleton = model_skeleton(model_dir)
    expected = {name: tuple(t.shape) for name, t in skeleton.state_dict().items()}
    tied = getattr(skeleton.config, "tie_word_embeddings", False)
    optional = {"lm_head.weight"} if tied else set()
    found: set[str] = set()
    for path in files:
        try:
            with safe_open(path, framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (a safe_open handle is not a dict)
                    if name not in expected:
                        raise ValueError(f"{path} holds {name}, which config.json lacks")
                    tensor = f.get_tensor(name)
                    if tuple(tensor.shape) != expected[name]:
                        raise ValueError(
                            f"{path}: {name} has shape {tuple(tensor.shape)}, but config.json "
                            f"calls for {expected[name]}"
                        )
                    check_finite(path, name, tensor)
                    found.add(name)
        except (SafetensorError, OSError, RuntimeError) as e:
            raise ValueError(f"{path} is not a whole safetensors file ({e})") from None
    missing = sorted(set(expected) - found - optional)
    if missing:
        raise ValueError(
            f"{model_dir} lacks {len(missing)} tensors config.json calls for, such as {missing[0]}"
        )


def model_skeleton(model_dir: Path, dtype: torch.dtype | None = None) -> PreTrainedModel:
    """The causal LM that ``model_dir``'s ``config.json`` describes, on the meta device:
    its parameters and buffers have shapes and dtypes (``dtype``, default float32) but
    no storage, and nothing but the config is read. Tied weights are one parameter, as
    in the loaded model; in eval mode, as ``from_pretrained`` returns it. ValueError
    (one sentence) if the config is not one transformers can build."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_dir = Path(model_dir)
    check_model_dir(model_dir)
    try:
        config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype or torch.float32)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{model_dir}/config.json is not a usable model config ({e})") from None
    skeleton: PreTrainedModel = model.eval()
    return skeleton


def load_tokenizer(model_dir: Path) -> Any:
    """The checkpoint's tokenizer, from local files only."""
    from transformers import AutoTokenizer

    model_dir = Path(model_dir)
    check_model_dir(model_dir)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except UnicodeDecodeError:
        raise ValueError(
            f"{model_dir} holds no loadable tokenizer (one of its files is not UTF-8 text)"
        ) from None
    except (OSError, ValueError) as e:
        raise ValueError(f"{model_dir} holds no loadable tokenizer ({e})") from None
    encode_prompt(tokenizer, "1 + 1?")  # a broken chat template fails here, not mid-run
    return tokenizer


def eos_token_ids(model_dir: Path, tokenizer: Any) -> frozenset[int]:
    """The tokens that end a completion: the generation config's, the model config's and
    the tokenizer's end-of-sequence ids."""
    ids: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        try:
            eos = json.loads((Path(model_dir) / name).read_text()).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            continue  # absent or unreadable: the other sources still say
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list):
            ids.update(e for e in eos if isinstance(e, int))
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """A user prompt as the model expects it: its chat template when it has one."""
    if getattr(tokenizer, "chat_template", None):
        from jinja2 import TemplateError

        try:
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
        except (TemplateError, ValueError, TypeError) as e:
            raise ValueError(f"the model's chat template cannot be applied ({e})") from None
        # transformers 5 returns a BatchEncoding here; older versions a list.
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    return list(tokenizer(text)["input_ids"])
