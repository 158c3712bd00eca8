"""`swarmrl wallet`: keys, stake and rewards for stakers and node operators.

Keys live in encrypted JSON V3 keystores (see `client.keystore`). The password
comes from --password-file, else $SWARMRL_PASSWORD (for daemons), else a
prompt. Every failure is one sentence on stderr and exit code 1, and changes
nothing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from client import keystore

app = typer.Typer(
    help="Keys, stake and rewards: stake, unstake and claim from an encrypted keystore.",
    no_args_is_help=True,
)

KeystoreDir = typer.Option(
    None, "--keystore-dir", help="Where keystores live [default: $SWARMRL_KEYSTORE_DIR or XDG]."
)
PasswordFile = typer.Option(
    None, "--password-file", help="Read the password from this file (first line)."
)


def _dir(path: Path | None) -> Path:
    return path or keystore.default_dir()


def _password(password_file: Path | None, *, confirm: bool) -> str:
    if password_file is not None:
        try:
            return password_file.read_text().splitlines()[0] if password_file.stat().st_size else ""
        except OSError as e:
            raise keystore.KeystoreError(f"cannot read the password file: {e.strerror}") from None
    if (env := os.environ.get("SWARMRL_PASSWORD")) is not None:
        return env
    if not sys.stdin.isatty():
        raise keystore.KeystoreError(
            "no password: pass --password-file or set SWARMRL_PASSWORD when not on a terminal"
        )
    return typer.prompt("Password", hide_input=True, confirmation_prompt=confirm)


@app.command()
def new(
    name: str = typer.Argument(..., help="A name for the key, e.g. 'node1'."),
    keystore_dir: Path | None = KeystoreDir,
    password_file: Path | None = PasswordFile,
) -> None:
    """Create a new random key, encrypted with a password."""
    key = keystore.create(_dir(keystore_dir), name, _password(password_file, confirm=True))
    typer.echo(f"{key.name} {key.address}")


@app.command("import")
def import_key(
    name: str = typer.Argument(..., help="A name for the key."),
    private_key_file: Path = typer.Option(
        ..., "--private-key-file", help="A file holding the hex private key (never argv)."
    ),
    keystore_dir: Path | None = KeystoreDir,
    password_file: Path | None = PasswordFile,
) -> None:
    """Encrypt an existing private key into a new keystore."""
    try:
        raw = private_key_file.read_text().strip()
    except OSError as e:
        raise keystore.KeystoreError(f"cannot read the private key file: {e.strerror}") from None
    try:
        key_bytes = bytes.fromhex(raw.removeprefix("0x"))
    except ValueError:
        raise keystore.KeystoreError("the private key file does not hold hex digits") from None
    key = keystore.save(_dir(keystore_dir), name, key_bytes, _password(password_file, confirm=True))
    typer.echo(f"{key.name} {key.address}")


@app.command("list")
def list_keys(keystore_dir: Path | None = KeystoreDir) -> None:
    """Every key in the keystore directory, with its address."""
    for key in keystore.list_keys(_dir(keystore_dir)):
        typer.echo(f"{key.name} {key.address}")


@app.command()
def address(
    name: str = typer.Argument(..., help="The key's name."),
    keystore_dir: Path | None = KeystoreDir,
) -> None:
    """Print a key's address (no password needed)."""
    typer.echo(keystore.info(_dir(keystore_dir), name).address)
