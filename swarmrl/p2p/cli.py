"""`swarmrl weights`: serve a checkpoint to the swarm, or pull one from it.

Both read the deployment file (like the wallet): its chain id and ComputePool
make the domain every swarm signature is bound to, its run id names the
topics, and its recorders are the keys a puller trusts by default. Logs go to
stderr, one line per event worth seeing; stdout carries only what a script
needs (the origin's multiaddr, the pulled checkpoint's path).
"""

from __future__ import annotations

import logging
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import typer

from swarmrl.cli_options import DeploymentFile, KeystoreDir, PasswordFile
from swarmrl.files import os_error_reason
from swarmrl.p2p.events import Event, SwarmEventKind

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from swarmrl.chain.eip712 import Domain
    from swarmrl.p2p.store import Version
    from swarmrl.p2p.swarm import SwarmNode

weights_app = typer.Typer(
    help="Peer-to-peer weight broadcast: serve a checkpoint, or pull one.", no_args_is_help=True
)

Listen = typer.Option(
    "/ip4/127.0.0.1/tcp/0", "--listen", help="Multiaddr to listen on (shard bytes use the same IP)."
)
ANNOUNCE_EVERY = 10.0
MAX_STEP = 2**64 - 1  # steps are uint64 in signed checkpoint records
MAX_TIMEOUT_S = 86400.0
MAX_KEEP = 1000
MAX_GB = 1e6  # a petabyte: beyond any disk, and far below float overflow in bytes
LISTEN_EXAMPLE = "/ip4/127.0.0.1/tcp/0"
PEER_EXAMPLE = "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooW..."
# In the store's folder; held while a command uses it, so two cannot write it at once.
STORE_LOCK_FILE = ".lock"
# A puller without a key makes a throwaway libp2p identity in its store.
PEER_KEY_FILE = ".peer-key"


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


@contextmanager
def _store_folder(folder: Path, flag: str, command: str) -> Iterator[None]:
    """Creates `folder` and holds its lock for the block; a file in its place, or another
    command already using it, is one sentence at once (not a wait for the timeout). A
    folder this call made is removed again if the block fails before anything worth
    keeping (a shard to resume from) is in it."""
    from swarmrl.locks import exclusive_use

    _check_folder(folder, flag)
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with exclusive_use(folder / STORE_LOCK_FILE, folder, command):
            yield
    except BaseException:
        if made and {p.name for p in folder.iterdir()} <= {PEER_KEY_FILE, STORE_LOCK_FILE}:
            shutil.rmtree(folder, ignore_errors=True)
        raise


def _check_multiaddrs(listen: str, bootstrap: list[str]) -> None:
    """One sentence in the user's terms for an address libp2p would refuse in its own
    words, or a listen port another process holds, before anything is created or
    unlocked."""
    import multiaddr
    from libp2p.peer.peerinfo import info_from_p2p_addr

    from swarmrl.p2p.ports import check_free

    try:
        names = [protocol.name for protocol in multiaddr.Multiaddr(listen).protocols()]
    except ValueError:
        names = []
    # The shard server listens on the same IP over plain TCP.
    if names[:2] not in (["ip4", "tcp"], ["ip6", "tcp"]):
        raise ValueError(f"--listen {listen[:100]!r} is not a multiaddr like {LISTEN_EXAMPLE}")
    check_free(listen)
    for peer in bootstrap:
        try:
            info_from_p2p_addr(multiaddr.Multiaddr(peer))
        except ValueError:
            raise ValueError(
                f"--bootstrap {peer[:100]!r} is not a multiaddr with a /p2p/ peer id, "
                f"like {PEER_EXAMPLE}"
            ) from None


def _check_folder(folder: Path, flag: str) -> None:
    """One sentence if `folder`, or a folder above it, is a file; nothing is created."""
    nearest = folder
    while not nearest.exists() and nearest != nearest.parent:
        nearest = nearest.parent
    if nearest.is_dir():
        return
    if nearest == folder:
        raise ValueError(f"{flag} {folder} is a file; give a folder")
    raise ValueError(f"{flag} {folder} is under {nearest}, which is a file; give a folder")


@contextmanager
def _os_errors_in_words() -> Iterator[None]:
    """A file-system failure is raised again as one sentence without errno numbers."""
    from swarmrl.files import os_error_sentence

    try:
        yield
    except OSError as e:
        raise OSError(os_error_sentence(e)) from None


def _context(deployment: Path | None) -> tuple[Domain, str, list[str]]:
    """The swarm domain, run id and recorders of the deployment file."""
    from swarmrl.chain.deploy import load_deployment
    from swarmrl.chain.eip712 import swarm_domain

    d = load_deployment(deployment)
    return swarm_domain(d.chain_id, d.contracts.compute_pool), d.run_id, list(d.recorders)


def _unlock(
    key: str, keystore_dir: Path | None, password_file: Path | None
) -> tuple[LocalAccount, Path]:
    """Key `key` from its keystore, and where the libp2p identity beside it is kept
    (created by the caller only once every check has passed)."""
    from swarmrl import keystore
    from swarmrl.p2p.identity import peer_key_path

    directory = keystore_dir or keystore.default_dir()
    account = keystore.unlock(directory, key, keystore.read_password(password_file))
    return account, peer_key_path(directory, key)


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
    from swarmrl import keystore
    from swarmrl.p2p.identity import load_or_create_peer_key
    from swarmrl.p2p.store import WeightStore
    from swarmrl.p2p.swarm import SwarmNode

    _logging()
    try:
        path.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise ValueError(f"no checkpoint at {path}") from None
    except OSError as e:  # a name too long, a loop of links: the errno text names no cause
        raise ValueError(f"{str(path)[:120]} cannot be used: {os_error_reason(e)}") from None
    _check_multiaddrs(listen, bootstrap)
    domain, run, recorders = _context(deployment)
    address = keystore.info(keystore_dir or keystore.default_dir(), key).address
    if address not in recorders and not any_key:
        raise ValueError(
            f"key {key!r} ({address}) is not one of the deployment's recorders, so pullers "
            "would ignore its checkpoints: serve with a recorder's key (see README, Weight "
            f"broadcast), or pass --any-key if every puller passes --trust {address}"
        )
    with _os_errors_in_words(), _store_folder(store, "--store", "swarmrl weights serve"):
        account, identity = _unlock(key, keystore_dir, password_file)
        peer_key = load_or_create_peer_key(identity)
        stop = _until_signalled()
        node = SwarmNode.standalone(
            store=WeightStore(store),
            domain=domain,
            run=run,
            trusted=[account.address],
            peer_key=peer_key,
            account=account,
            listen=listen,
            reachable=True,  # the address pullers bootstrap from
            bootstrap=bootstrap,
        )
        with node:
            version = node.publish(
                path, model=model or path.stem, step=step, shard_size=shard_mib << 20
            )
            typer.echo(node.addrs[0], nl=True)
            sys.stdout.flush()
            logging.getLogger("swarmrl.p2p").info(
                "serving step %d (%d shards, root %s) as %s",
                step,
                version.manifest.shard_count,
                version.manifest.root[:16],
                account.address,
            )
            while not stop.wait(ANNOUNCE_EVERY):
                node.announce(version)


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
    from eth_utils import is_address

    from swarmrl.p2p.identity import load_or_create_peer_key
    from swarmrl.p2p.store import WeightStore
    from swarmrl.p2p.swarm import SwarmNode

    _logging()
    for address in trust:
        if not is_address(address):
            raise ValueError(f"--trust {address!r} is not an Ethereum address")
    _check_multiaddrs(listen, bootstrap)
    domain, run, recorders = _context(deployment)
    # Every check (the key's password last, as the slowest) before --out or a peer key
    # is created: a refused command leaves nothing behind.
    with _os_errors_in_words():
        _check_folder(out, "--out")
        if key is not None:
            account, identity = _unlock(key, keystore_dir, password_file)
        else:  # an anonymous peer, but the same one across restarts of this store
            account, identity = None, out / PEER_KEY_FILE
    with _os_errors_in_words(), _store_folder(out, "--out", "swarmrl weights pull"):
        peer_key = load_or_create_peer_key(identity)
        stop = _until_signalled()
        store = WeightStore(out, keep=keep, max_bytes=None if max_gb is None else int(max_gb * 1e9))
        node = SwarmNode.standalone(
            store=store,
            domain=domain,
            run=run,
            trusted=trust or recorders,
            peer_key=peer_key,
            account=account,
            listen=listen,
            bootstrap=bootstrap,
            workers=workers,
            on_event=_ProgressLine(),
        )
        with node:
            version = _wait_for_version(node, step, timeout, stop)
            typer.echo(str(version.path))
            sys.stdout.flush()
            if seed:
                logging.getLogger("swarmrl.p2p").info("seeding as %s until stopped", node.addrs[0])
                stop.wait()


def _wait_for_version(
    node: SwarmNode, step: int | None, timeout: float, stop: threading.Event
) -> Version:
    """The newest trusted version (at `step` or newer), polling so a signal stops it."""
    deadline = time.monotonic() + timeout
    while True:
        if stop.is_set():
            raise typer.Exit(130)
        try:
            return node.wait_for(step, timeout=min(1.0, deadline - time.monotonic()))
        except TimeoutError:
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"no complete checkpoint{'' if step is None else f' at step {step}+'} "
                    f"arrived within {timeout:.0f} s"
                ) from None
