"""`swarmrl weights`: serve a checkpoint to the swarm, or pull one from it.

Both read the deployment file (like the wallet): its chain id and ComputePool
make the domain every swarm signature is bound to, its run id names the
topics, and its recorders are the keys a puller trusts by default. Logs go to
stderr, one line per event worth seeing; stdout carries only what a script
needs (the origin's multiaddr, the pulled checkpoint's path).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import typer

from swarmrl.cli_options import DeploymentFile, KeystoreDir, PasswordFile
from swarmrl.weights.peer_events import Event, SwarmEventKind

if TYPE_CHECKING:
    from swarmrl.weights.store import Version

weights_app = typer.Typer(
    help="Peer-to-peer weight broadcast: serve a checkpoint, or pull one.", no_args_is_help=True
)

Listen = typer.Option(
    "/ip4/127.0.0.1/tcp/0", "--listen", help="Multiaddr to listen on (shard bytes use the same IP)."
)
MAX_STEP = 2**64 - 1  # steps are uint64 in signed checkpoint records
MAX_TIMEOUT_S = 86400.0
MAX_KEEP = 1000
MAX_GB = 1e6  # a petabyte: beyond any disk, and far below float overflow in bytes


def _logging() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr
    )
    from swarmrl.p2p.host import quiet_libp2p_logs

    quiet_libp2p_logs()


def _until_signalled() -> threading.Event:
    """An event set by SIGTERM or SIGINT, so daemons shut down cleanly."""
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


class _ProgressLine:
    """A progress bar on a terminal; a line per quarter elsewhere (logs, CI)."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self._quarter = -1

    def __call__(self, event: Event) -> None:
        if event.kind is SwarmEventKind.PROGRESS and event.progress is not None:
            p = event.progress
            rate = p.bytes_done / max(p.seconds, 1e-9) / 1e6
            text = f"step {p.step}: {p.held}/{p.total} shards, {rate:.0f} MB/s"
            if self.tty:
                width = 30
                filled = width * p.held // p.total
                sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {text}")
                sys.stderr.flush()
            elif (q := 4 * p.held // p.total) != self._quarter:
                self._quarter = q
                typer.echo(text, err=True)
        elif event.kind is SwarmEventKind.READY and self.tty:
            sys.stderr.write("\n")


@weights_app.command()
def serve(
    path: Path = typer.Argument(
        ..., help="The checkpoint: a file, or a directory's files (not its subfolders)."
    ),
    key: str = typer.Option(..., "--key", help="Keystore name of the origin's signing key."),
    step: int = typer.Option(0, "--step", min=0, help="The policy step this checkpoint is."),
    model: str | None = typer.Option(None, "--model", help="Model name (default: the path's)."),
    store: Path = typer.Option(
        Path("swarm-store"), "--store", help="Where the versions served are kept."
    ),
    shard_mib: int = typer.Option(64, "--shard-mib", min=1, max=1024, help="Shard size (MiB)."),
    listen: str = Listen,
    bootstrap: list[str] = typer.Option([], "--bootstrap", help="Peers to join (multiaddrs)."),
    any_key: bool = typer.Option(
        False,
        "--any-key",
        help="Serve with a key that is not one of the deployment's recorders "
        "(pullers then need --trust with its address).",
    ),
    keystore_dir: Path | None = KeystoreDir,
    password_file: Path | None = PasswordFile,
    deployment: Path | None = DeploymentFile,
) -> None:
    """Sign, announce and serve a checkpoint; print this peer's multiaddr first."""
    from swarmrl.weights.standalone import serve_checkpoint

    def on_serving(addr: str) -> None:
        typer.echo(addr, nl=True)
        sys.stdout.flush()

    _logging()
    serve_checkpoint(
        path,
        key=key,
        on_serving=on_serving,
        step=step,
        model=model,
        store=store,
        shard_mib=shard_mib,
        listen=listen,
        bootstrap=bootstrap,
        any_key=any_key,
        keystore_dir=keystore_dir,
        password_file=password_file,
        deployment=deployment,
        until_stopped=_until_signalled,
    )


@weights_app.command()
def pull(
    bootstrap: list[str] = typer.Option(..., "--bootstrap", help="Peers to join (multiaddrs)."),
    out: Path = typer.Option(..., "--out", help="Where checkpoints are kept."),
    trust: list[str] = typer.Option(
        [], "--trust", help="Origin addresses to accept (default: the deployment's recorders)."
    ),
    step: int | None = typer.Option(
        None, "--step", min=0, max=MAX_STEP, help="Wait for this step or newer."
    ),
    seed: bool = typer.Option(False, "--seed", help="Keep serving (and following) afterwards."),
    # With a max, typer's range check refuses inf and nan too.
    timeout: float = typer.Option(
        600.0, "--timeout", min=1, max=MAX_TIMEOUT_S, help="Give up after this long (s)."
    ),
    keep: int = typer.Option(3, "--keep", min=1, max=MAX_KEEP, help="Versions to keep."),
    max_gb: float | None = typer.Option(
        None, "--max-gb", min=0.001, max=MAX_GB, help="Disk budget (GB)."
    ),
    workers: int = typer.Option(4, "--workers", min=1, max=64, help="Parallel shard fetches."),
    key: str | None = typer.Option(
        None, "--key", help="Keystore name to bind this peer to (optional)."
    ),
    listen: str = Listen,
    keystore_dir: Path | None = KeystoreDir,
    password_file: Path | None = PasswordFile,
    deployment: Path | None = DeploymentFile,
) -> None:
    """Join the swarm, fetch the newest trusted checkpoint, print its path; exit 0."""
    from swarmrl.weights.standalone import StoppedError, pull_checkpoint

    def on_pulled(version: Version) -> None:
        typer.echo(str(version.path))
        sys.stdout.flush()

    _logging()
    try:
        pull_checkpoint(
            bootstrap=bootstrap,
            out=out,
            on_pulled=on_pulled,
            trust=trust,
            step=step,
            seed=seed,
            timeout=timeout,
            keep=keep,
            max_gb=max_gb,
            workers=workers,
            key=key,
            listen=listen,
            keystore_dir=keystore_dir,
            password_file=password_file,
            deployment=deployment,
            on_event=_ProgressLine(),
            until_stopped=_until_signalled,
        )
    except StoppedError:
        raise typer.Exit(130) from None
