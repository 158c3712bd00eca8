"""Compiled contracts: the ABI and creation bytecode committed in contracts/out.

The files are committed so that Python never needs node or solc at run time;
`make contracts` rebuilds them from contracts/src.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from eth_typing import ABI

from swarmrl.chain.errors import ChainConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = REPO_ROOT / "contracts" / "out"
CONTRACTS = ("StakeToken", "ProviderRegistry", "StakeManager", "ComputePool")


@dataclass(frozen=True)
class Artifact:
    name: str
    abi: ABI
    bytecode: str  # 0x-prefixed creation code


@cache
def load_artifact(name: str, out_dir: Path = OUT_DIR) -> Artifact:
    """Reads contracts/out/<name>.json; a clear error names `make contracts` if absent."""
    path = out_dir / f"{name}.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ChainConfigError(
            f"compiled contract {path} is missing: run `make contracts`"
        ) from None
    except (OSError, json.JSONDecodeError) as e:
        raise ChainConfigError(f"cannot read compiled contract {path}: {e}") from None
    abi, bytecode = raw.get("abi"), raw.get("bytecode")
    if not isinstance(abi, list) or not isinstance(bytecode, str) or not bytecode:
        raise ChainConfigError(f"{path} has no abi or bytecode: run `make contracts`")
    if not bytecode.startswith("0x"):
        bytecode = "0x" + bytecode
    return Artifact(name=name, abi=abi, bytecode=bytecode)


def load_all() -> dict[str, Artifact]:
    return {name: load_artifact(name) for name in CONTRACTS}
