"""`swarmrl orchestrator init|run|status|ledger`."""

from __future__ import annotations

import faulthandler
import json
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from swarmrl.cli_options import DeploymentFile

if TYPE_CHECKING:
    from orchestrator.service.settings import OrchestratorSettings

orchestrator_app = typer.Typer(
    help="Coordinate a training run: schedule, validate, train, broadcast, record on chain.",
    no_args_is_help=True,
)

ConfigOption = typer.Option(
    None, "--config", "-c", help="The orchestrator's TOML file (see `orchestrator init`)."
)


def _settings(config: Path | None) -> OrchestratorSettings:
    from orchestrator.service.settings import OrchestratorSettings
    from swarmrl.settings_toml import load_settings

    return load_settings(OrchestratorSettings, config)


@orchestrator_app.command("init")
def init(
    out: Path = typer.Option(
        Path("orchestrator.toml"), "--out", "-o", help="Where to write the commented config."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
    model: Path | None = typer.Option(
        None, "--model", help="The policy training starts from: an HF model directory."
    ),
    tasks: Path | None = typer.Option(
        None, "--tasks", help="The training tasks, .jsonl or .parquet (`swarmrl tasks generate`)."
    ),
    data_dir: Path | None = typer.Option(
        None, "--data-dir", help="Where the orchestrator keeps its ledger, checkpoints, identity."
    ),
    deployment: Path | None = DeploymentFile,
) -> None:
    """Write a commented config with every setting at its default, or as given here (each
    checked as `run` checks it, and written absolute)."""
    from orchestrator.service.settings import ROLE, OrchestratorSettings
    from swarmrl.chain.deploy import load_deployment
    from swarmrl.files import check_data_dir, check_output_path
    from swarmrl.models.directory import check_model, load_tokenizer
    from swarmrl.settings_toml import write_settings
    from swarmrl.tasks import read_tasks

    check_output_path(out)
    if out.exists() and not force:
        raise ValueError(f"{out} exists; pass --force to overwrite it")
    if tasks is not None:
        read_tasks(tasks)
    if model is not None:
        check_model(model)
        load_tokenizer(model)
    if data_dir is not None:
        check_data_dir(data_dir, ROLE)
    if deployment is not None:
        load_deployment(deployment)
    given = {"model": model, "tasks": tasks, "data_dir": data_dir, "deployment": deployment}
    write_settings(out, given, template_of=OrchestratorSettings)
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
    from orchestrator.service.settings import ROLE
    from swarmrl import keystore
    from swarmrl.chain.deploy import load_deployment
    from swarmrl.files import check_data_dir, claim_data_dir
    from swarmrl.logs import setup_logging
    from swarmrl.models.directory import check_model, load_tokenizer
    from swarmrl.tasks import read_tasks

    settings = _settings(config)
    tasks, model = Path(settings.tasks), Path(settings.model)
    make_tasks = f"make it with `swarmrl tasks generate --out {tasks}`"
    with settings.about("tasks", None if tasks.exists() else make_tasks):
        read_tasks(tasks)
    make_model = f"build the default policy there with `swarmrl model init --out {model}`"
    with settings.about("model", None if model.exists() else make_model):
        check_model(model)
        load_tokenizer(model)
    with settings.about("deployment"):
        deployment = load_deployment(settings.deployment)
    with settings.about("data_dir"):
        check_data_dir(Path(settings.data_dir), ROLE)  # claimed below, once all is checked
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
    with settings.about("data_dir"):
        claim_data_dir(Path(settings.data_dir), ROLE)
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


@orchestrator_app.command("trainer")
def trainer(config: Path | None = ConfigOption) -> None:
    """This machine's trainer processes of a run whose trainer spans several machines
    (nnodes > 1): they join the job at rdzv_endpoint, where the machine running
    `orchestrator run` waits for them. Run it with the same config file, the data
    folder mounted at the same path; a job that stopped (a rank died anywhere) is
    joined again, until the run's last step or Ctrl-C."""
    import os
    import time

    from orchestrator.service import trainer_process
    from orchestrator.service.child import Child
    from orchestrator.service.daemon import SUPERVISE_SECONDS
    from swarmrl.chain.deploy import load_deployment
    from swarmrl.logs import setup_logging

    settings = _settings(config)
    if settings.nnodes < 2:
        raise ValueError(
            f"nnodes is {settings.nnodes}: `orchestrator run` trains alone; this command "
            "adds a machine to a trainer that spans several (nnodes > 1)"
        )
    with settings.about("deployment"):
        deployment = load_deployment(settings.deployment)
    data_dir = Path(settings.data_dir)
    setup_logging(data_dir / "logs" / "trainer-machine.log", stderr=True)
    cores = settings.threads or len(os.sched_getaffinity(0))
    job = Child(
        trainer_process.spec(settings, deployment.run_id, threads=cores, log_to_stderr=True)
    )
    job.start()
    try:
        while not job.finished:
            job.check()  # restarted when it failed, ChildFailedError when it keeps failing
            time.sleep(SUPERVISE_SECONDS)
    finally:
        job.shutdown()


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
                + ("  (late: its epoch was recorded before its verdict, unpaid)" * row["late"])
            )
