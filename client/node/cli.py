"""`swarmrl node init|run|status`."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import typer

from swarmrl.cli_options import DeploymentFile, KeystoreDir, PasswordFile

node_app = typer.Typer(help="Run a node: generate proven rollouts for a run, get paid.")

ConfigOption = typer.Option(None, "--config", "-c", help="The node's TOML file.")


@node_app.command("init")
def init(
    provider: str = typer.Option(
        ..., "--provider", help="Keystore name of the provider that stakes for this node."
    ),
    key: str = typer.Option("node", "--key", help="Keystore name of the node's key."),
    keystore_dir: Path | None = KeystoreDir,
    password_file: Path | None = PasswordFile,
    deployment: Path | None = DeploymentFile,
    out: Path | None = typer.Option(
        None,
        "--config-out",
        help="Also write a commented node.toml here, with the key, keystore, password file "
        "and deployment given.",
    ),
    data_dir: Path | None = typer.Option(
        None,
        "--data-dir",
        help="The node's data folder, written into --config-out (a second node on one "
        "machine needs its own).",
    ),
    metrics_port: int | None = typer.Option(
        None,
        "--metrics-port",
        min=1,
        max=65535,
        help="Its Prometheus port on 127.0.0.1, written into --config-out (a second node "
        "on one machine needs its own; the default is 9465).",
    ),
) -> None:
    """Create the node's key and identity, and with the provider's key register it and
    join the run's pool; running it again only checks."""
    from client.node.settings import ROLE, NodeSettings
    from client.node.setup import init_node, passwords_from
    from swarmrl import keystore
    from swarmrl.chain.deploy import load_deployment
    from swarmrl.files import check_data_dir, check_output_path
    from swarmrl.settings_toml import write_settings

    if out is None and (data_dir is not None or metrics_port is not None):
        raise typer.BadParameter(
            "they are written into the node's config file; give --config-out too",
            param_hint="'--data-dir' / '--metrics-port'",
        )
    if out is not None:
        check_output_path(out)
    if data_dir is not None:
        check_data_dir(data_dir, ROLE)
    done = init_node(
        keystore_dir or keystore.default_dir(),
        key,
        provider,
        passwords_from(password_file),
        load_deployment(deployment),
    )
    typer.echo(done.summary())
    if out is not None:
        # What this command was told is what `node run` must use: the same key, and the
        # files as this command found them (unset ones stay at their defaults).
        given = {
            "key": key,
            "keystore_dir": keystore_dir,
            "password_file": password_file,
            "deployment": deployment,
            "data_dir": data_dir,
            "metrics_port": metrics_port,
        }
        write_settings(out, given, template_of=NodeSettings)
        typer.echo(f"wrote {out}; set orchestrator in it, then: swarmrl node run --config {out}")


def _settings(config: Path | None) -> Any:
    from client.node.settings import NodeSettings
    from swarmrl.settings_toml import load_settings

    return load_settings(NodeSettings, config)


@node_app.command("run")
def run(
    config: Path | None = ConfigOption,
    headless: bool = typer.Option(
        False,
        "--headless",
        help="Log lines instead of the terminal app (always so when stdout is not a terminal).",
    ),
) -> None:
    """Join the run and work until Ctrl-C, q or SIGTERM; the same command resumes it."""
    from client.node.loop import sole_runner

    settings = _settings(config)
    if settings.orchestrator is None:
        raise ValueError("set orchestrator (the multiaddr the orchestrator prints) in the config")
    with sole_runner(settings):
        _run(settings, headless)


def _run(settings: Any, headless: bool) -> None:
    import sys

    from client.node.events import log_event
    from client.node.loop import Node, thread_count
    from client.node.metrics import NodeMetrics
    from client.node.settings import OUTBOUND_ONLY, load_tasks
    from swarmrl import keystore
    from swarmrl.logs import setup_logging
    from swarmrl.p2p.ports import check_free

    # Both ports first, before the key's slow unlock and anything else starts: a second
    # node on the machine is told at once which one it shares.
    if settings.listen != OUTBOUND_ONLY:
        check_free(settings.listen)
    metrics = NodeMetrics(settings.metrics_port)
    tasks = load_tasks(settings)  # before the password, and long before the network
    try:
        account = keystore.unlock(
            settings.keystore_dir, settings.key, keystore.read_password(settings.password_file)
        )
        threads = thread_count(settings)
        from swarmrl.cores import take_threads

        take_threads(threads)
        terminal = not headless and sys.stdout.isatty()
        # Log lines on stderr would tear through the app's screen: then only the file has them.
        setup_logging(Path(settings.data_dir) / "node.log", stderr=not terminal)
        # The app listens too once it exists, and it needs the node first.
        listeners: list[Any] = [log_event, metrics.on_event]
        watchers: list[Any] = [metrics.update]

        def on_event(event: Any) -> None:
            for listener in listeners:
                listener(event)

        def on_state(state: Any, peers: int) -> None:
            for watcher in watchers:
                watcher(state, peers)

        node = Node(settings, account, on_event=on_event, on_state=on_state, tasks=tasks)
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, lambda *_: node.stop())
        if terminal:
            from client.node.app import run_until_stopped

            app = _terminal_app(settings, node)
            listeners.append(app.hear)
            watchers.append(app.hear_state)
            run_until_stopped(app)
        else:
            node.run()
    finally:
        metrics.close()


def _terminal_app(settings: Any, node: Any) -> Any:
    from client.node.app import NodeApp
    from client.node.onchain import ChainReader, ProviderClaimer

    reader = ChainReader(settings.deployment, node.address, node.journal.receipts)
    claimer = None
    if settings.provider_key is not None:
        claimer = ProviderClaimer(
            settings.deployment,
            settings.keystore_dir,
            settings.provider_key,
            settings.password_file,
            node.address,
        )
    return NodeApp(node, reader, claimer)


@node_app.command("doctor")
def doctor(config: Path | None = ConfigOption) -> None:
    """Check everything `node run` needs, one line each; exit 1 if anything fails."""
    from client.node.doctor import exit_code, render, run_checks

    checks = run_checks(_settings(config), None)
    typer.echo(render(checks))
    raise typer.Exit(exit_code(checks))


@node_app.command("status")
def status(
    config: Path | None = ConfigOption,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """What this node has submitted, the receipts it holds and what was refused for good."""
    from client.node.journal import Journal

    settings = _settings(config)
    folder = Path(settings.data_dir) / "journal"
    if not folder.is_dir():
        raise ValueError(f"{settings.data_dir} holds no node journal; has the node run yet?")
    journal = Journal(folder)
    receipts = journal.receipts()
    refusals = journal.refusals()
    summary = {
        "pending": len(journal.pending()),
        "receipts": len(receipts),
        "receipt_digests": sorted(str(r["submission"]) for r in receipts),
        "units_at_intake": sum(int(r.get("units", 0)) for r in receipts),
        "rejected_at_intake": sum(1 for r in receipts if not r.get("units")),
        "refused": [
            {"digest": r.digest, "order_id": r.order_id, "reason": r.reason} for r in refusals
        ],
    }
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
    else:
        typer.echo(
            f"receipts {summary['receipts']}  units {summary['units_at_intake']}  "
            f"rejected {summary['rejected_at_intake']}  refused {len(refusals)}  "
            f"waiting to be sent {summary['pending']}"
        )
        for r in refusals:
            typer.echo(f"refused {r.digest[:12]} (order {r.order_id[:12]}): {r.reason}")
