"""A node that cheats: it generates with a cheaper model than the swarm's policy and
says it used the policy, as a volunteer saving compute would.

The validator must catch it (TOPLOC and the logprob check fail), the recorder
must slash it with its own signed submission; `swarmrl demo` and the end-to-end
tests run it beside honest nodes to show that they do. The cheaper model is the
policy's architecture with random weights, built once in the node's data dir.

Usage: python -m client.node.cheater NODE_TOML
"""

from __future__ import annotations

import shutil
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from client.node.events import log_event
from client.node.loop import Node, sole_runner
from client.node.settings import NodeSettings, load_tasks
from swarmrl import keystore
from swarmrl.logs import setup_logging
from swarmrl.settings_toml import load_settings

if TYPE_CHECKING:
    from swarmrl.models.backend import Backend, Precision

CHEAP_MODEL_SEED = 7
TOKENIZER_FILES = ("tokenizer", "special_tokens", "chat_template")


class CheatingNode(Node):
    def _load_backend(self, model_dir: Path, precision: Precision) -> Backend:
        # Whatever the swarm sent, generate with the cheap model (claiming the real step),
        # in the precision the order asks for.
        from swarmrl.models import load_backend

        cheap = cheap_model(model_dir, self.data_dir / "cheap-model")
        return load_backend("torch", cheap, device="cpu", precision=precision)


def cheap_model(policy: Path, out: Path) -> Path:
    """The policy's architecture and tokenizer with seeded random weights, in ``out``."""
    if (out / "model.safetensors").is_file():
        return out
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(policy)
    config.initializer_range = 0.1  # wide enough that its outputs depend on the prompt
    torch.manual_seed(CHEAP_MODEL_SEED)
    model = AutoModelForCausalLM.from_config(config)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for file in policy.iterdir():
        if file.name.startswith(TOKENIZER_FILES):
            shutil.copy(file, tmp / file.name)
    tmp.rename(out)
    return out


def main() -> None:
    import torch

    torch.set_num_threads(1)
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m client.node.cheater NODE_TOML")
    settings = load_settings(NodeSettings, Path(sys.argv[1]))
    with sole_runner(settings, "python -m client.node.cheater"):
        tasks = load_tasks(settings)
        password = keystore.read_password(settings.password_file)
        account = keystore.unlock(settings.keystore_dir, settings.key, password)
        setup_logging(Path(settings.data_dir) / "node.log")
        node = CheatingNode(settings, account, on_event=log_event, tasks=tasks)
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, lambda *_: node.stop())
        node.run()


if __name__ == "__main__":
    main()
