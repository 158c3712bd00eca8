"""Regenerate the documentation's generated parts.

- docs/configuration.md: the configuration reference, from the settings models. Each
  generated block sits between ``<!-- BEGIN generated: NAME -->`` and
  ``<!-- END generated -->``; only the text between the two markers is rewritten, so a
  second run changes nothing.
- benchmarks/BENCHMARKS.md: the benchmarks' summary, a copy of its source,
  docs/benchmarks/index.md, with the relative links pointed from benchmarks/ into
  docs/benchmarks/ (the site builds from docs/, the summary is read beside the code).

``make docs`` runs it; tests/unit/test_docs_generated.py fails when either file is
stale.

    .venv/bin/python docs/generate.py           # rewrite what is stale
    .venv/bin/python docs/generate.py --check   # exit 1 if anything is stale
"""

from __future__ import annotations

import importlib
import os
import posixpath
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGURATION = ROOT / "docs" / "configuration.md"
BENCHMARKS_SOURCE = ROOT / "docs" / "benchmarks" / "index.md"
BENCHMARKS_SUMMARY = ROOT / "benchmarks" / "BENCHMARKS.md"

# Block name -> (module, settings class) rendered by swarmrl.settings_toml.reference_markdown.
# orchestrator.toml's keys are two tables: the service's own, and the training recipe's,
# which are `train local`'s options too.
BLOCKS = {
    "node settings": ("client.node.settings", "NodeSettings"),
    "orchestrator settings": ("orchestrator.service.settings", "ServiceSettings"),
    "training recipe": ("orchestrator.trainer.recipe", "GRPORecipe"),
}

_BLOCK = re.compile(
    r"(?P<begin><!-- BEGIN generated: (?P<name>[^>]*?) -->\n)"
    r"(?P<body>.*?)"
    r"(?P<end><!-- END generated -->)",
    re.DOTALL,
)

# A markdown link or image target: `](target)`, where target has no spaces.
_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")

SUMMARY_NOTE = (
    "<!-- Generated from docs/benchmarks/index.md by `make docs`: edit that file. -->\n\n"
)


@contextmanager
def _default_environment() -> Iterator[None]:
    """Defaults such as data_dir follow $SWARMRL_* and $XDG_DATA_HOME: the reference shows
    them as they are with neither set, whoever runs this."""
    saved = {
        name: value
        for name, value in os.environ.items()
        if name.upper().startswith("SWARMRL_") or name == "XDG_DATA_HOME"
    }
    for name in saved:
        del os.environ[name]
    try:
        yield
    finally:
        os.environ.update(saved)


def generated(name: str) -> str:
    """The body of block ``name``: a blank line, the settings table, a blank line."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from swarmrl.settings_toml import reference_markdown

    module, cls = BLOCKS[name]
    with _default_environment():
        table = reference_markdown(getattr(importlib.import_module(module), cls))
    return f"\n{table}\n"


def blocks(text: str) -> dict[str, str]:
    """Block name -> its body as the text has it."""
    found: dict[str, str] = {}
    for m in _BLOCK.finditer(text):
        name = m["name"]
        if name not in BLOCKS:
            raise ValueError(
                f"{CONFIGURATION.name} has a generated block {name!r}; known: {', '.join(BLOCKS)}"
            )
        if name in found:
            raise ValueError(f"{CONFIGURATION.name} has the generated block {name!r} twice")
        found[name] = m["body"]
    missing = [name for name in BLOCKS if name not in found]
    if missing:
        raise ValueError(f"{CONFIGURATION.name} lacks the generated block(s): {', '.join(missing)}")
    return found


def render(text: str) -> str:
    """``text`` with every block's body replaced by freshly generated text."""
    blocks(text)  # every block present once, none unknown
    return _BLOCK.sub(lambda m: m["begin"] + generated(m["name"]) + m["end"], text)


def _from_benchmarks(target: str) -> str:
    """A link target of docs/benchmarks/index.md as benchmarks/BENCHMARKS.md reaches it."""
    if target.startswith(("#", "/")) or re.match(r"[a-z][a-z0-9+.-]*:", target):
        return target  # an anchor on the page itself, or an absolute address
    return posixpath.normpath(posixpath.join("../docs/benchmarks", target))


def summary(source: str) -> str:
    """benchmarks/BENCHMARKS.md made from docs/benchmarks/index.md."""
    body = _LINK.sub(lambda m: f"]({_from_benchmarks(m['target'])})", source)
    return SUMMARY_NOTE + body


def _outputs() -> list[tuple[Path, str, str]]:
    """(file, what it holds now, what it should hold) for each generated file."""
    configuration = CONFIGURATION.read_text(encoding="utf-8")
    source = BENCHMARKS_SOURCE.read_text(encoding="utf-8")
    try:
        current = BENCHMARKS_SUMMARY.read_text(encoding="utf-8")
    except FileNotFoundError:
        current = ""
    return [
        (CONFIGURATION, configuration, render(configuration)),
        (BENCHMARKS_SUMMARY, current, summary(source)),
    ]


def main(argv: list[str]) -> int:
    check = argv == ["--check"]
    if argv and not check:
        print("usage: generate.py [--check]", file=sys.stderr)
        return 2
    try:
        outputs = _outputs()
    except (OSError, ValueError) as e:
        print(e, file=sys.stderr)
        return 1
    stale = [(path, new) for path, old, new in outputs if old != new]
    for path, _, _ in outputs:
        name = path.relative_to(ROOT)
        if all(path != p for p, _ in stale):
            print(f"{name}: up to date")
    if check:
        for path, _ in stale:
            print(f"{path.relative_to(ROOT)}: stale; run `make docs`", file=sys.stderr)
        return 1 if stale else 0
    for path, new in stale:
        path.write_text(new, encoding="utf-8")
        print(f"{path.relative_to(ROOT)}: regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
