"""Regenerate the configuration reference in README.md from the settings models.

Each generated block sits between ``<!-- BEGIN generated: NAME -->`` and
``<!-- END generated -->``; only the text between the two markers is rewritten, so a
second run changes nothing. ``make readme`` runs it; tests/unit/test_readme.py fails
when the README's blocks differ from what the models say.

    .venv/bin/python docs/readme_reference.py           # rewrite README.md
    .venv/bin/python docs/readme_reference.py --check   # exit 1 if README.md is stale
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

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
                f"README.md has a generated block {name!r}; known: {', '.join(BLOCKS)}"
            )
        if name in found:
            raise ValueError(f"README.md has the generated block {name!r} twice")
        found[name] = m["body"]
    missing = [name for name in BLOCKS if name not in found]
    if missing:
        raise ValueError(f"README.md lacks the generated block(s): {', '.join(missing)}")
    return found


def render(text: str) -> str:
    """``text`` with every block's body replaced by freshly generated text."""
    blocks(text)  # every block present once, none unknown
    return _BLOCK.sub(lambda m: m["begin"] + generated(m["name"]) + m["end"], text)


def main(argv: list[str]) -> int:
    check = argv == ["--check"]
    if argv and not check:
        print("usage: readme_reference.py [--check]", file=sys.stderr)
        return 2
    try:
        text = README.read_text(encoding="utf-8")
        new = render(text)
    except (OSError, ValueError) as e:
        print(e, file=sys.stderr)
        return 1
    if new == text:
        print("README.md: the configuration reference is up to date")
        return 0
    if check:
        print("README.md: the configuration reference is stale; run `make readme`", file=sys.stderr)
        return 1
    README.write_text(new, encoding="utf-8")
    print("README.md: the configuration reference regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
