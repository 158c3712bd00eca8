"""A small command line that keeps or breaks the contract on purpose, to check that
the harness tells the two apart (tests/integration/test_cli_contract.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import typer

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


def _count(n: int) -> None:
    if not 1 <= n <= 100:
        raise ValueError(f"--n must be 1 to 100, got {n}")


@app.command()
def good(
    out: Path = typer.Option(..., "--out"),
    n: int = typer.Option(1, "--n", min=1, max=100),
    run: str = typer.Option("contract", "--run"),
) -> None:
    """Checks everything before writing anything."""
    if not run:
        raise ValueError("--run must not be empty")
    # os.path answers False where pathlib would raise (a name too long, say).
    if os.path.isdir(out) or not os.path.isdir(out.parent) or len(out.name) > 255:
        raise ValueError(f"cannot write {out}")
    out.write_text("ok\n" * n)


@app.command()
def crash(n: int = typer.Option(1, "--n")) -> None:
    """Lets a library exception out."""
    if n != 1:
        raise KeyError(n)


@app.command()
def chatty(n: int = typer.Option(1, "--n")) -> None:
    """Says more than one line before it refuses."""
    if n != 1:
        typer.echo("working...", err=True)
        _count(n)
        raise ValueError("the work failed")


@app.command()
def messy(out: Path = typer.Option(..., "--out"), n: int = typer.Option(1, "--n")) -> None:
    """Leaves a partial output file behind."""
    if n != 1 and not out.is_dir() and out.parent.is_dir():
        out.write_text("partial")
    _count(n)
    if n != 1:
        raise ValueError("the work failed")


@app.command()
def orphan(n: int = typer.Option(1, "--n")) -> None:
    """Starts a process in its own session and leaves it running."""
    if n != 1:
        subprocess.Popen(["sleep", "300"], start_new_session=True)
        raise ValueError("the work failed")


@app.command()
def stateful(n: int = typer.Option(1, "--n")) -> None:
    """Writes to its state folder before it refuses."""
    if n != 1:
        state = Path(os.environ["HOME"]) / "state.txt"
        state.write_text(str(n))
        raise ValueError("the work failed")


@app.command()
def slow(n: int = typer.Option(1, "--n")) -> None:
    """Accepts anything and works at it for a long time."""
    if n != 1:
        time.sleep(3600)


@app.command()
def elsewhere(out: Path = typer.Option(..., "--out")) -> None:
    """Reads a relative path as relative to the home folder, not the working one."""
    out = out if out.is_absolute() else Path(os.environ["HOME"]) / out
    if out.is_dir() or not out.parent.is_dir():
        raise ValueError(f"cannot write {out}")
    out.write_text("ok\n")


@app.command()
def writer(
    out: Path = typer.Option(..., "--out"), data_dir: Path = typer.Option(..., "--data-dir")
) -> None:
    """Writes a config with the path it was given as given: read back from the file's
    folder, a relative one names another folder."""
    if out.is_dir() or not out.parent.is_dir() or (data_dir.exists() and not data_dir.is_dir()):
        raise ValueError(f"cannot write {out} naming {data_dir}")
    out.write_text(f'data_dir = "{data_dir}"\n')


def main() -> None:
    """As swarmrl.cli:main: one sentence and exit 1 for ValueError and OSError."""
    try:
        app()
    except (ValueError, OSError) as e:
        typer.secho(f"error: {e}", err=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    sys.exit(main())
