"""A peer of its own that serves a checkpoint to the swarm, or pulls one from it: what
`swarmrl weights serve` and `pull` do.

Both read the deployment file: its chain id and ComputePool make the domain every
swarm signature is bound to, its run id names the topics, and its recorders are the
keys a puller trusts by default. Every check (the key's password last, as the
slowest) comes before the store folder or a peer key is created, each refusal a
ValueError (or OSError) in one sentence naming the command's option. Both run until
the event `until_stopped()` makes is set (a signal, in the command); it is made once
every check has passed.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from swarmrl.files import os_error_reason

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from swarmrl.eip712 import Domain
    from swarmrl.weights.peer import SwarmNode
    from swarmrl.weights.peer_events import Event
    from swarmrl.weights.store import Version

ANNOUNCE_EVERY = 10.0
LISTEN_EXAMPLE = "/ip4/127.0.0.1/tcp/0"
PEER_EXAMPLE = "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooW..."
# In the store's folder; held while a command uses it, so two cannot write it at once.
STORE_LOCK_FILE = ".lock"
# A puller without a key makes a throwaway libp2p identity in its store.
PEER_KEY_FILE = ".peer-key"


class StoppedError(Exception):
    """The stop event was set before a checkpoint arrived."""


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


def _check_multiaddrs(listen: str, bootstrap: Sequence[str]) -> None:
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
    from swarmrl.eip712 import swarm_domain

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


def serve_checkpoint(
    path: Path,
    *,
    key: str,
    on_serving: Callable[[str], None],
    step: int = 0,
    model: str | None = None,
    store: Path = Path("swarm-store"),
    shard_mib: int = 64,
    listen: str = LISTEN_EXAMPLE,
    bootstrap: Sequence[str] = (),
    any_key: bool = False,
    keystore_dir: Path | None = None,
    password_file: Path | None = None,
    deployment: Path | None = None,
    until_stopped: Callable[[], threading.Event] = threading.Event,
) -> None:
    """Signs the checkpoint at `path` (a file, or a directory's files) with keystore key
    `key`, keeps it in `store` and serves it, announced every ANNOUNCE_EVERY seconds,
    until stopped; `on_serving(multiaddr)` once it is published. A key that is not one of
    the deployment's recorders is refused unless `any_key`."""
    from swarmrl import keystore
    from swarmrl.p2p.identity import load_or_create_peer_key
    from swarmrl.weights.peer import SwarmNode
    from swarmrl.weights.store import WeightStore

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
            "would ignore its checkpoints: serve with a recorder's key (see "
            "docs/how-it-works.md, Weight broadcast), or pass --any-key if every puller passes "
            f"--trust {address}"
        )
    with _os_errors_in_words(), _store_folder(store, "--store", "swarmrl weights serve"):
        account, identity = _unlock(key, keystore_dir, password_file)
        peer_key = load_or_create_peer_key(identity)
        stop = until_stopped()
        node = SwarmNode.standalone(
            store=WeightStore(store),
            domain=domain,
            run=run,
            trusted=[account.address],
            peer_key=peer_key,
            account=account,
            listen=listen,
            reachable=True,  # the address pullers bootstrap from
            bootstrap=list(bootstrap),
        )
        with node:
            version = node.publish(
                path, model=model or path.stem, step=step, shard_size=shard_mib << 20
            )
            on_serving(node.addrs[0])
            logging.getLogger("swarmrl.p2p").info(
                "serving step %d (%d shards, root %s) as %s",
                step,
                version.manifest.shard_count,
                version.manifest.root[:16],
                account.address,
            )
            while not stop.wait(ANNOUNCE_EVERY):
                node.announce(version)


def pull_checkpoint(
    *,
    bootstrap: Sequence[str],
    out: Path,
    on_pulled: Callable[[Version], None],
    trust: Sequence[str] = (),
    step: int | None = None,
    seed: bool = False,
    timeout: float = 600.0,
    keep: int = 3,
    max_gb: float | None = None,
    workers: int = 4,
    key: str | None = None,
    listen: str = LISTEN_EXAMPLE,
    keystore_dir: Path | None = None,
    password_file: Path | None = None,
    deployment: Path | None = None,
    on_event: Callable[[Event], None] | None = None,
    until_stopped: Callable[[], threading.Event] = threading.Event,
) -> Version:
    """Joins the swarm through `bootstrap`, waits for the newest checkpoint (at `step` or
    newer) signed by a `trust`ed origin (default: the deployment's recorders) into the
    store `out`, and calls `on_pulled` with it; with `seed`, keeps serving until stopped.
    TimeoutError after `timeout` seconds; StoppedError if stopped before it arrived."""
    from eth_utils import is_address

    from swarmrl.p2p.identity import load_or_create_peer_key
    from swarmrl.weights.peer import SwarmNode
    from swarmrl.weights.store import WeightStore

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
        stop = until_stopped()
        store = WeightStore(out, keep=keep, max_bytes=None if max_gb is None else int(max_gb * 1e9))
        node = SwarmNode.standalone(
            store=store,
            domain=domain,
            run=run,
            trusted=list(trust) or recorders,
            peer_key=peer_key,
            account=account,
            listen=listen,
            bootstrap=list(bootstrap),
            workers=workers,
            on_event=on_event,
        )
        with node:
            version = _wait_for_version(node, step, timeout, stop)
            on_pulled(version)
            if seed:
                logging.getLogger("swarmrl.p2p").info("seeding as %s until stopped", node.addrs[0])
                stop.wait()
    return version


def _wait_for_version(
    node: SwarmNode, step: int | None, timeout: float, stop: threading.Event
) -> Version:
    """The newest trusted version (at `step` or newer), polling so a stop ends it."""
    deadline = time.monotonic() + timeout
    while True:
        if stop.is_set():
            raise StoppedError("stopped before a checkpoint arrived")
        try:
            return node.wait_for(step, timeout=min(1.0, deadline - time.monotonic()))
        except TimeoutError:
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"no complete checkpoint{'' if step is None else f' at step {step}+'} "
                    f"arrived within {timeout:.0f} s"
                ) from None
