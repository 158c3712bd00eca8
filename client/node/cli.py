"""`swarmrl node init|run|status`."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from swarmrl.cli_options import DeploymentFile, KeystoreDir, PasswordFile

if TYPE_CHECKING:  # imported where used: each command loads only what it needs
    from client.node.daemon.control import Status
    from client.node.events import Event, Listener
    from client.node.settings import NodeSettings
    from client.node.work.journal import JournalSummary
    from client.node.work.loop import NodeState

node_app = typer.Typer(help="Run a node: generate proven rollouts for a run, get paid.")

ConfigOption = typer.Option(None, "--config", "-c", help="The node's TOML file.")


@node_app.command("init")
def init(
    provider: str | None = typer.Option(
        None,
        "--provider",
        help="Keystore name of the provider that stakes for this node, when its key is on "
        "this machine.",
    ),
    provider_address: str | None = typer.Option(
        None,
        "--provider-address",
        help="The provider's address, when its key is on another machine (a cold wallet): "
        "sign the node's consent for it into --consent-out and send nothing.",
    ),
    consent_out: Path | None = typer.Option(
        None,
        "--consent-out",
        help="Where to write the node's signed consent for --provider-address; the provider "
        "runs `swarmrl wallet add-node KEY FILE` with it.",
    ),
    consent_valid_for: str | None = typer.Option(
        None,
        "--consent-valid-for",
        help="How long the provider may use the consent, by the chain's clock: 30m, 12h, "
        "7d (a minute to 30 days; default 1d).",
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
    join the run's pool; running it again only checks. With --provider-address instead,
    only sign the node's consent into --consent-out, for `swarmrl wallet add-node` on the
    provider's machine."""
    from client.node.setup.node_init import set_up_node, write_node_config

    valid_for = _consent_seconds(provider, provider_address, consent_out, consent_valid_for)
    if out is None and (data_dir is not None or metrics_port is not None):
        raise typer.BadParameter(
            "they are written into the node's config file; give --config-out too",
            param_hint="'--data-dir' / '--metrics-port'",
        )
    done = set_up_node(
        key=key,
        provider=provider,
        provider_address=provider_address,
        consent_out=consent_out,
        valid_for=valid_for,
        keystore_dir=keystore_dir,
        password_file=password_file,
        deployment=deployment,
        config_out=out,
        data_dir=data_dir,
    )
    for line in done.lines():
        typer.echo(line)
    if out is not None:
        # What this command was told is what `node run` must use: the same key, and the
        # files as this command found them (unset ones stay at their defaults).
        wrote = write_node_config(
            out,
            key=key,
            keystore_dir=keystore_dir,
            password_file=password_file,
            deployment=deployment,
            data_dir=data_dir,
            metrics_port=metrics_port,
        )
        typer.echo(wrote)


# A consent is a standing offer to whoever holds it until its deadline: long enough to
# carry it to a cold wallet, short enough not to outlive the plan it was signed for.
MIN_CONSENT_SECONDS = 60
MAX_CONSENT_SECONDS = 30 * 86400


def _consent_seconds(
    provider: str | None,
    provider_address: str | None,
    consent_out: Path | None,
    valid_for: str | None,
) -> int:
    """`init`'s provider options checked together: one provider, by key or by address,
    and the consent's file and lifetime with the address. The lifetime in seconds."""
    import re

    from swarmrl.times import parse_duration

    if (provider is None) == (provider_address is None):
        raise typer.BadParameter(
            "give one: --provider KEY when the provider's key is on this machine, or "
            "--provider-address 0x... with --consent-out FILE when it is on another",
            param_hint="'--provider' / '--provider-address'",
        )
    if (provider_address is None) != (consent_out is None) or (
        provider_address is None and valid_for is not None
    ):
        raise typer.BadParameter(
            "the consent is written for a provider whose key is on another machine: give "
            "--provider-address and --consent-out together (and --consent-valid-for only "
            "with them)",
            param_hint="'--provider-address' / '--consent-out'",
        )
    if provider_address is not None and not re.fullmatch(r"0x[0-9a-fA-F]{40}", provider_address):
        raise typer.BadParameter(
            f"{provider_address[:60]!r} is not an address (0x and 40 hex digits)",
            param_hint="'--provider-address'",
        )
    seconds = parse_duration("1d" if valid_for is None else valid_for)
    if not MIN_CONSENT_SECONDS <= seconds <= MAX_CONSENT_SECONDS:
        raise typer.BadParameter(
            "a consent is usable from a minute to 30 days", param_hint="'--consent-valid-for'"
        )
    return seconds


key_app = typer.Typer(
    help="Move a node to another machine: its key, peer identity and receipts in one file.",
    no_args_is_help=True,
)
node_app.add_typer(key_app, name="key")


@key_app.command("export")
def key_export(
    out: Path = typer.Option(
        ..., "--out", help="The file to write, encrypted with the node key's password."
    ),
    config: Path | None = ConfigOption,
) -> None:
    """Write the node's key, its peer identity and its journal's receipts and refusals
    into one file, encrypted with the key's password, for `node key import` elsewhere.

    Not in it: submissions still waiting to be sent. Each holds a whole rollout file and
    is sent by the machine that has it, so `swarmrl node finish` the node here first (it
    sends them, then stops); export says how many wait. Refused while the node runs:
    the file would miss the receipts it settles after, and a moved node must never run
    on two machines at once."""
    from client.node.setup.transfer import export_node
    from swarmrl import keystore

    settings = _settings(config)
    done = export_node(settings, out, lambda: keystore.read_password(settings.password_file))
    typer.echo(done.summary(out))
    if (note := done.pending_note()) is not None:
        typer.secho(f"note: {note}", err=True, fg=typer.colors.YELLOW)


@key_app.command("import")
def key_import(
    export_file: Path = typer.Argument(..., help="A file `swarmrl node key export` wrote."),
    config: Path | None = ConfigOption,
) -> None:
    """Make this machine's node (the config's key, keystore and data folder) the node in
    an export file: its key (kept here under the same password), its peer identity, and
    its receipts and refusals merged into the journal. Refused while a node runs on that
    data folder or key, or where another key or peer identity has the name."""
    from client.node.setup.transfer import import_node
    from swarmrl import keystore

    settings = _settings(config)
    done = import_node(
        settings, export_file, lambda: keystore.read_password(settings.password_file)
    )
    typer.echo(done.summary())


def _settings(config: Path | None) -> NodeSettings:
    from client.node.settings import NodeSettings
    from swarmrl.settings_toml import load_settings

    return load_settings(NodeSettings, config)


@node_app.command("run")
def run(
    config: Path | None = ConfigOption,
    headless: bool = typer.Option(
        False,
        "--headless",
        help="Run the daemon here, with log lines (always so when stdout is not a terminal); "
        "on a terminal the daemon runs in the background and the app attaches to it.",
    ),
    spawned: bool = typer.Option(
        False, "--spawned", hidden=True, help="Started by `node run` on a terminal."
    ),
) -> None:
    """Start the node's daemon: it joins the run and works until `swarmrl node stop` (or
    finish, or SIGTERM); on a terminal the app attaches to it, and q leaves it working."""
    import sys

    from client.node.daemon.control import ControlClient

    settings = _settings(config)
    if settings.orchestrator is None:
        raise ValueError("set orchestrator (the multiaddr the orchestrator prints) in the config")
    data_dir = Path(settings.data_dir)
    client = ControlClient(data_dir)
    if client.running():
        pid = client.status().pid
        raise ValueError(
            f"a node already runs for {data_dir} (pid {pid}); "
            "`swarmrl node attach` shows it, `swarmrl node stop` stops it"
        )
    if headless or spawned or not sys.stdout.isatty():
        from client.node.work.loop import sole_runner

        with sole_runner(settings):
            _run(settings, config, spawned)
        return
    from client.node.daemon.background import start_daemon
    from client.node.settings import ROLE
    from swarmrl import keystore
    from swarmrl.files import claim_data_dir

    with settings.about("data_dir"):
        claim_data_dir(data_dir, ROLE)
    pid = start_daemon(config, data_dir, keystore.read_password(settings.password_file))
    typer.echo(f"the node's daemon runs (pid {pid}); attaching (q leaves it working)")
    _attach(settings)


def _run(settings: NodeSettings, config: Path | None, spawned: bool) -> None:
    import sys

    from client.node.daemon.metrics import NodeMetrics
    from client.node.daemon.reload import SettingsFile
    from client.node.daemon.runner import Daemon
    from client.node.events import log_event
    from client.node.machine.conditions import Conditions, LinuxMachine
    from client.node.settings import OUTBOUND_ONLY, load_tasks
    from client.node.work.loop import Node, thread_count
    from swarmrl import keystore
    from swarmrl.cores import take_threads
    from swarmrl.logs import setup_logging
    from swarmrl.models import resolve_device
    from swarmrl.p2p.ports import check_free

    # Both ports first, before the key's slow unlock and anything else starts: a second
    # node on the machine is told at once which one it shares.
    if settings.listen != OUTBOUND_ONLY:
        check_free(settings.listen)
    metrics = NodeMetrics(settings.metrics_port)
    tasks = load_tasks(settings)  # before the password, and long before the network
    try:
        # Started by `node run` on a terminal: the password comes on stdin, and the log
        # goes only to the file (its output file keeps what came before, or a crash).
        password = (
            sys.stdin.readline().rstrip("\n")
            if spawned
            else keystore.read_password(settings.password_file)
        )
        account = keystore.unlock(settings.keystore_dir, settings.key, password)
        take_threads(thread_count(settings))
        setup_logging(Path(settings.data_dir) / "node.log", stderr=not spawned)
        # The daemon listens too once it exists, and it needs the node first.
        listeners: list[Listener] = [log_event, metrics.on_event]
        watchers: list[Callable[[NodeState, int], None]] = [metrics.update]

        def on_event(event: Event) -> None:
            for listener in listeners:
                listener(event)

        def on_state(state: NodeState, peers: int) -> None:
            for watcher in watchers:
                watcher(state, peers)

        node = Node(settings, account, on_event=on_event, on_state=on_state, tasks=tasks)
        gpu = resolve_device(settings.device) != "cpu"
        daemon = Daemon(
            node,
            Path(settings.data_dir),
            journal=node.journal,
            settings_file=SettingsFile(config, settings),
            judges=[Conditions(settings, LinuxMachine(), gpu=gpu), node.limits],
        )
        listeners.append(daemon.hear)
        watchers.append(daemon.hear_state)
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, lambda *_: daemon.stop())
        if spawned:
            signal.signal(signal.SIGHUP, signal.SIG_IGN)  # no terminal holds it
        daemon.run()
    finally:
        metrics.close()


@node_app.command("attach")
def attach(config: Path | None = ConfigOption) -> None:
    """Show the running node in the terminal app; q leaves it working."""
    _attach(_settings(config))


def _attach(settings: NodeSettings) -> None:
    from client.node.daemon.control import ControlClient
    from client.node.screen.app import NodeApp
    from client.node.screen.onchain import ChainReader, ProviderClaimer

    client = ControlClient(Path(settings.data_dir))
    status = client.status()  # NotRunningError, in one sentence, if there is none
    reader = ChainReader(settings.deployment, status.node, client.epochs)
    claimer = None
    if settings.provider_key is not None:
        claimer = ProviderClaimer(
            settings.deployment,
            settings.keystore_dir,
            settings.provider_key,
            settings.password_file,
            status.node,
        )
    app = NodeApp(client, status.node, reader, claimer)
    app.run()
    if app.failure:
        raise ValueError(app.failure)


@node_app.command("doctor")
def doctor(config: Path | None = ConfigOption) -> None:
    """Check everything `node run` needs, one line each; exit 1 if anything fails."""
    from client.node.setup.doctor import exit_code, render, run_checks

    checks = run_checks(_settings(config), None)
    typer.echo(render(checks))
    raise typer.Exit(exit_code(checks))


@node_app.command("status")
def status(
    config: Path | None = ConfigOption,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Whether the node works and if not why; what it has submitted, the receipts it holds
    and what was refused for good (read from its journal when it does not run)."""
    data_dir = _data_dir(config)
    running, journal = _status_or_journal(data_dir)
    if as_json:
        out = {
            "running": None if running is None else running.model_dump(exclude={"journal"}),
            **({} if journal is None else journal.model_dump()),
        }
        typer.echo(json.dumps(out, indent=2))
        return
    if running is None:
        typer.echo(f"not running (`swarmrl node run` starts it); data in {data_dir}")
    else:
        step = "-" if running.policy_step is None else running.policy_step
        typer.echo(
            "\n".join([running.reason, *(f"waiting for {w}" for w in running.waiting)]) + "\n"
            f"node {running.node}  swarmrl {running.version}  pid {running.pid}  "
            f"workers {running.workers}  policy step {step}  peers {running.peers or 0}  "
            f"rollouts {running.rollouts}"
        )
    if journal is not None:
        typer.echo(
            f"receipts {journal.receipts}  units {journal.units_at_intake}  "
            f"rejected {journal.rejected_at_intake}  refused {len(journal.refused)}  "
            f"waiting to be sent {journal.pending}"
        )
        for r in journal.refused:
            typer.echo(f"refused {r.digest[:12]} (order {r.order_id[:12]}): {r.reason}")


# How long `node status` asks again while a daemon holds the data dir without answering.
STATUS_SETTLE_SECONDS = 10.0


def _status_or_journal(data_dir: Path) -> tuple[Status | None, JournalSummary | None]:
    """The running daemon's status and journal, or (None, the journal read from disk).
    A daemon holds the data dir a moment before its socket answers and a moment after it
    stops answering (starting, stopping): in that window the command asks again rather
    than call the folder busy, which is true only of another command."""
    from client.node.daemon.control import ControlClient, NotRunningError
    from swarmrl.locks import FolderBusyError

    deadline = time.monotonic() + STATUS_SETTLE_SECONDS
    while True:
        try:
            running = ControlClient(data_dir).status()
            return running, running.journal
        except NotRunningError:
            try:
                return None, _journal_summary(data_dir)
            except FolderBusyError:
                if time.monotonic() >= deadline:
                    raise
        time.sleep(0.2)


def _journal_summary(data_dir: Path) -> JournalSummary:
    """The journal of a node that does not run, read holding its data dir (a node
    starting meanwhile is refused until this is done, and so cannot race the read)."""
    from client.node.settings import ROLE
    from client.node.work.journal import Journal
    from client.node.work.loop import holding_data_dir

    folder = data_dir / "journal"
    if not folder.is_dir():
        raise ValueError(f"{data_dir} holds no node journal; has the node run yet?")
    with holding_data_dir(data_dir, f"swarmrl {ROLE} status"):
        return Journal(folder).summary()


def _data_dir(config: Path | None) -> Path:
    """The node's data dir, for the commands that talk to its daemon: the config's, or
    while the config does not load (an edit half done, a file cut short), the one the
    daemon started with it noted (control.note_config), so that a node can be looked at
    and stopped whatever its file holds now."""
    from client.node.daemon.control import ControlClient, noted_data_dir

    try:
        return Path(_settings(config).data_dir)
    except ValueError as e:
        noted = None if config is None else noted_data_dir(config)
        if noted is None or not ControlClient(noted).running():
            raise
        typer.secho(
            f"warning: {e}; asking the node that runs with it", err=True, fg=typer.colors.YELLOW
        )
        return noted


def _control(config: Path | None, command: str, **fields: Any) -> Any:
    from client.node.daemon.control import Command, ControlClient

    return ControlClient(_data_dir(config)).call(Command(command), **fields)


@node_app.command("pause")
def pause(config: Path | None = ConfigOption) -> None:
    """Take no new work until resumed; the order in flight is finished and handed in."""
    typer.echo(_control(config, "pause").status.reason)


@node_app.command("resume")
def resume(config: Path | None = ConfigOption) -> None:
    """Work again after a pause or a snooze."""
    typer.echo(_control(config, "resume").status.reason)


@node_app.command("snooze")
def snooze(
    duration: str = typer.Argument(..., help="How long: 90s, 30m, 1h, 2h30m (a number: minutes)."),
    config: Path | None = ConfigOption,
) -> None:
    """Pause for a while, then work again by itself."""
    from client.node.daemon.control import MAX_SNOOZE
    from swarmrl.times import parse_duration

    seconds = parse_duration(duration)
    if not 0 < seconds <= MAX_SNOOZE:
        raise typer.BadParameter("a snooze lasts from a second to 7 days", param_hint="DURATION")
    typer.echo(_control(config, "snooze", seconds=float(seconds)).status.reason)


@node_app.command("finish")
def finish(config: Path | None = ConfigOption) -> None:
    """Finish the order in flight, send what waits, tell the orchestrator the node leaves,
    then stop."""
    typer.echo(_control(config, "finish").status.reason)


@node_app.command("stop")
def stop(config: Path | None = ConfigOption) -> None:
    """Stop the daemon once the order in flight is handed in (what waits to be sent stays
    in the journal for the next start)."""
    typer.echo(_control(config, "stop").status.reason)


@node_app.command("logs")
def logs(
    config: Path | None = ConfigOption,
    lines: int = typer.Option(100, "--lines", "-n", min=1, max=2000, help="How many lines."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Then print new ones as they come."),
) -> None:
    """The running node's last log lines (its log file holds them all)."""
    from client.node.daemon.control import Command, ControlClient

    client = ControlClient(_data_dir(config))
    if not follow:
        for line in client.call(Command.LOGS, lines=lines).lines:
            typer.echo(line)
        return
    # The watch's first update holds the lines so far, so none falls between the two.
    for i, update in enumerate(client.watch()):
        for line in update.lines[-lines:] if i == 0 else update.lines:
            typer.echo(line)
