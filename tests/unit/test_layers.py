"""The layering rules of docs/architecture.md, read off the source: the core
(`swarmrl`) imports no app, the two apps (`client`, `orchestrator`) never import each
other, and what drives both (`simulation`, `benchmarks`) is imported by neither; in
the core, the libp2p plumbing (`swarmrl.p2p`) knows neither protocol over it, the
weight swarm (`swarmrl.weights`) and the work (`swarmrl.work`), which never import each
other; only the Python faces of the native core import it. A module named in a string
(`python -m client.node.work.worker`) counts as imported."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APPS = ("client", "orchestrator")
DRIVERS = ("simulation", "benchmarks")  # they drive the apps; nothing below imports them
PACKAGES = ("swarmrl", *APPS, *DRIVERS)
# A string that is nothing but a dotted path into one of the packages.
_MODULE_STRING = re.compile(rf"(?:{'|'.join(PACKAGES)})(?:\.[A-Za-z_]\w*)+")


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, anywhere in it (functions' lazy imports included),
    and every module it names in a string."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and _MODULE_STRING.fullmatch(node.value)
        ):
            found.add(node.value)
    return found


def _sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _offenders(package: str, forbidden: tuple[str, ...]) -> dict[str, list]:
    """The modules of `package` that import a module under one of `forbidden` (dotted
    prefixes: "client", "swarmrl.work")."""
    offenders = {}
    for path in _sources(package):
        bad = sorted(
            m for m in _imports(path) if any(m == f or m.startswith(f"{f}.") for f in forbidden)
        )
        if bad:
            offenders[str(path.relative_to(ROOT))] = bad
    return offenders


def test_the_core_imports_no_app_and_nothing_that_drives_them():
    assert _offenders("swarmrl", APPS + DRIVERS) == {}


@pytest.mark.parametrize(("app", "other"), [("client", "orchestrator"), ("orchestrator", "client")])
def test_the_apps_never_import_each_other_nor_what_drives_them(app, other):
    assert _offenders(app, (other, *DRIVERS)) == {}


def test_the_simulation_never_imports_the_benchmarks():
    assert _offenders("simulation", ("benchmarks",)) == {}


def test_the_libp2p_plumbing_knows_neither_protocol_over_it():
    assert _offenders("swarmrl/p2p", ("swarmrl.weights", "swarmrl.work")) == {}


@pytest.mark.parametrize(
    ("protocol", "other"), [("weights", "swarmrl.work"), ("work", "swarmrl.weights")]
)
def test_the_weight_swarm_and_the_work_never_import_each_other(protocol, other):
    assert _offenders(f"swarmrl/{protocol}", (other,)) == {}


def test_only_the_python_faces_of_the_native_core_import_it():
    faces = {"swarmrl/toploc.py", "swarmrl/shards.py", "swarmrl/delta.py"}
    users = {
        str(path.relative_to(ROOT))
        for package in PACKAGES
        for path in _sources(package)
        if any(m == "swarmrl._native" or m.startswith("swarmrl._native.") for m in _imports(path))
    }
    assert users == faces


def test_the_rules_are_checked_against_real_imports(tmp_path):
    """The reader sees a lazy import inside a function, as the apps' commands use them,
    and a module started by its name."""
    module = tmp_path / "m.py"
    module.write_text(
        "def f():\n    from orchestrator.service import cli\n    import client.wallet\n"
        "    return ['python', '-m', 'simulation.cheater', 'not.a.module']\n"
    )
    assert _imports(module) >= {
        "orchestrator.service",
        "orchestrator.service.cli",
        "client.wallet",
        "simulation.cheater",
    }
    assert "not.a.module" not in _imports(module)
