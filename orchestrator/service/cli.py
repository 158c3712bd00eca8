"""`swarmrl orchestrator init|run|status|ledger`."""

from __future__ import annotations

import faulthandler
import json
import signal
import sys
from pathlib import Path

import typer

orchestrator_app = typer.Typer(
    help="Coordinate a training run: schedule, validate, train, broadcast, record on chain.",
    no_args_is_help=True,
)

ConfigOption = typer.Option(
    None, "--config", "-c", help="The orchestrator's TOML file (see `orchestrator init`)."
)


def _settings(config: Path | None):
    from orchestrator.service.settings import OrchestratorSettings
    from swarmrl.settings_toml import load_settings

    return load_settings(OrchestratorSettings, config)


@orchestrator_app.command("init")
def init(
    out: Path = typer.Option(
        Path("orchestrator.toml"), "--out", "-o", help="Where to write the commented config."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
) -> None:
    """Write a commented config with every setting at its default."""
    from orchestrator.service.settings import OrchestratorSettings
    from swarmrl.files import check_output_path, write_atomically
    from swarmrl.settings_toml import template

    check_output_path(out)
    if out.exists() and not force:
        raise ValueError(f"{out} exists; pass --force to overwrite it")
    write_atomically(out, template(OrchestratorSettings).encode())
    typer.echo(f"wrote {out}; edit it, then: swarmrl orchestrator run --config {out}")


@orchestrator_app.command("run")
def run(
    config: Path | None = ConfigOption,
    headless: bool = typer.Option(
        False,
        "--headless",
        help="Log lines to stderr instead of the live view (the default when stdout is "
        "not a terminal).",
    ),
) -> None:
    """Run the orchestrator until Ctrl-C or SIGTERM; the same command resumes it.

    On a terminal it shows a live view of the run; the log lines go to
    <data_dir>/logs/ then."""
    from orchestrator.service.daemon import Keys, Orchestrator
    from swarmrl import keystore
    from swarmrl.chain.deploy import load_deployment
    from swarmrl.logs import setup_logging
    from swarmrl.models.checkpoint import check_model, load_tokenizer
    from swarmrl.tasks import read_tasks

    settings = _settings(config)
    read_tasks(settings.tasks)
    check_model(settings.model)
    load_tokenizer(settings.model)
    deployment = load_deployment(settings.deployment)
    password = keystore.read_password(settings.password_file)
    recorder = keystore.unlock(settings.keystore_dir, settings.recorder_key, password)
    validator = keystore.unlock(settings.keystore_dir, settings.validator_key, password)
    if recorder.address not in deployment.recorders:
        raise ValueError(
            f"key {settings.recorder_key} ({recorder.address}) is not a recorder of this deployment"
        )
    if validator.address not in deployment.validators:
        raise ValueError(
            f"key {settings.validator_key} ({validator.address}) is not a validator of this "
            "deployment"
        )
    live = not headless and sys.stdout.isatty()
    setup_logging(Path(settings.data_dir) / "logs" / "orchestrator.log", stderr=not live)
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID` prints every thread's stack
    orchestrator = Orchestrator(
        settings, deployment, Keys(recorder, validator), log_to_stderr=not live
    )
    if not live:
        orchestrator.run()
        return
    from orchestrator.service.live import LiveView

    view = LiveView(Path(settings.data_dir), deployment.run_id, orchestrator.stopping)
    view.start()
    try:
        orchestrator.run()
    finally:
        view.stop()  # before any error is printed: the view owns the screen until then


@orchestrator_app.command("status")
def status(
    config: Path | None = ConfigOption,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """One screen on the run: policy step, reward, nodes, submissions, chain records."""
    from orchestrator.service.status import read_status, render_status

    summary = read_status(Path(_settings(config).data_dir))
    typer.echo(json.dumps(summary, indent=2) if as_json else render_status(summary))


@orchestrator_app.command("ledger")
def ledger(
    config: Path | None = ConfigOption,
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line."),
) -> None:
    """Every acknowledged submission: digest, node, epoch, outcome."""
    from orchestrator.service.status import ledger_rows

    rows = ledger_rows(Path(_settings(config).data_dir))
    for row in rows:
        if as_json:
            typer.echo(json.dumps(row))
        else:
            typer.echo(
                f"{row['digest'][:16]}  {row['node']}  epoch {row['epoch']:>4}  "
                f"{row['status']:<8} {row['units']:>4}  {row['reason']}"
            )
