"""Command-line options that several command groups share, so they read alike.

Defaults are written in parentheses: typer's help renders square brackets as
markup and would swallow them.
"""

from __future__ import annotations

import typer

KeystoreDir = typer.Option(
    None, "--keystore-dir", help="Where keystores live (default: $SWARMRL_KEYSTORE_DIR or XDG)."
)
PasswordFile = typer.Option(
    None, "--password-file", help="Read the password from this file (first line)."
)
DeploymentFile = typer.Option(
    None,
    "--deployment",
    help="The deployment file (default: $SWARMRL_DEPLOYMENT, else the one `chain up` wrote).",
)
