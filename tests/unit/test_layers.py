"""The rules of the house from ARCHITECTURE.md, read off the source: `swarmrl` imports
neither app except in its CLI entry point, the two apps never import each other, and
only `swarmrl.toploc` and `swarmrl.shards` call the native core."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APPS = ("client", "orchestrator")


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, anywhere in it (functions' lazy imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _offenders(package: str, forbidden: tuple[str, ...], allowed: set[str]) -> dict[str, list]:
    offenders = {}
    for path in _sources(package):
        name = str(path.relative_to(ROOT))
        if name in allowed:
            continue
        bad = sorted(m for m in _imports(path) if m.split(".")[0] in forbidden)
        if bad:
            offenders[name] = bad
    return offenders


def test_the_core_imports_no_app_except_to_register_their_commands():
    assert _offenders("swarmrl", APPS, {"swarmrl/cli.py"}) == {}


@pytest.mark.parametrize(("app", "other"), [("client", "orchestrator"), ("orchestrator", "client")])
def test_the_apps_never_import_each_other(app, other):
    assert _offenders(app, (other,), set()) == {}


def test_only_the_python_faces_of_the_native_core_import_it():
    faces = {"swarmrl/toploc.py", "swarmrl/shards.py", "swarmrl/delta.py"}
    users = {
        str(path.relative_to(ROOT))
        for package in ("swarmrl", *APPS, "benchmarks")
        for path in _sources(package)
        if any(m == "swarmrl._native" or m.startswith("swarmrl._native.") for m in _imports(path))
    }
    assert users == faces


def test_the_rules_are_checked_against_real_imports(tmp_path):
    """The reader sees a lazy import inside a function, as the apps' commands use them."""
    module = tmp_path / "m.py"
    module.write_text(
        "def f():\n    from orchestrator.service import cli\n    import client.wallet\n"
    )
    assert _imports(module) >= {"orchestrator.service", "orchestrator.service.cli", "client.wallet"}
