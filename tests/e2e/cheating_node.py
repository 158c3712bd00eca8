"""A node that generates with another model than the swarm's policy, and says it used
the policy: what a volunteer saving compute with a smaller model would do.

Usage: python cheating_node.py NODE_TOML OTHER_MODEL_DIR
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from client.node.events import log_event
from client.node.loop import Node
from client.node.settings import NodeSettings
from swarmrl import keystore
from swarmrl.logs import setup_logging
from swarmrl.settings_toml import load_settings


class CheatingNode(Node):
    def __init__(self, *args: object, other: Path, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.other = other

    def _weights(self, at_least: int) -> Path:
        model_dir = super()._weights(at_least)
        # Whatever the swarm sent, generate with the other model (claiming the real step).
        from swarmrl.models import load_backend

        if not getattr(self, "_swapped", False):
            self.backend = load_backend("torch", self.other, device="cpu")
            self._swapped = True
        return model_dir


def main() -> None:
    import torch

    torch.set_num_threads(1)
    settings = load_settings(NodeSettings, Path(sys.argv[1]))
    password = keystore.read_password(settings.password_file)
    account = keystore.unlock(settings.keystore_dir, settings.key, password)
    setup_logging(Path(settings.data_dir) / "node.log")
    node = CheatingNode(settings, account, on_event=log_event, other=Path(sys.argv[2]))
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: node.stop())
    node.run()


if __name__ == "__main__":
    main()
