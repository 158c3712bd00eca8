"""`swarmrl node doctor`: the preflight a volunteer runs before `node run`.

Every check runs, whatever the others found: one wrong password should not hide
that the chain is down too. A check that cannot run without what an earlier one
failed to find says which ("skipped: needs chain"). Each line is either facts
("ok: ...") or one sentence saying what to do.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from client.node.settings import OUTBOUND_ONLY, ROLE, NodeSettings, load_tasks
from swarmrl.files import check_data_dir
from swarmrl.models.backend import BackendName
from swarmrl.sizes import GiB, size

if TYPE_CHECKING:
    from swarmrl.chain.contracts import Contracts

# The weight store holds the version being fetched beside the one in use; two
# copies of the small models a laptop runs fit in this.
MIN_FREE_BYTES = 2 * GiB
# The chain check is a probe: one retry, not the daemon's patient backoff.
RPC_RETRIES = 1
CONNECT_TIMEOUT = 10.0
INIT_HINT = "run `swarmrl node init --provider NAME`"
ZERO_ADDRESS = "0x" + "00" * 20


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str  # "ok: <facts>", "skipped: needs <check>", or one sentence saying what to do


class _CheckFailedError(Exception):
    """The check failed; the message is the sentence for the user."""


class _CheckSkippedError(Exception):
    """The check needs what an earlier check could not provide; the message names it."""


@dataclass
class _Found:
    """What earlier checks learnt that later ones build on."""

    backend: BackendName = "torch"
    device: str = "cpu"
    hardware: bool = False  # the backend check passed: backend and device are known
    node: str | None = None  # the node's address, readable without the password
    account: Any = None  # the unlocked node key
    peer_key: Any = None
    deployment: Any = None
    chain: Contracts | None = None  # the run's contracts, connected
    provider: str | None = None


def run_checks(settings: NodeSettings, password: str | None) -> list[Check]:
    """Every check, in order. `password` unlocks the node key; None: read it as every
    command does (password_file, else $SWARMRL_PASSWORD, else a prompt)."""
    found = _Found()
    checks = [
        ("backend", lambda: _backend(settings, found)),
        ("workers", lambda: _workers(settings, found)),
        ("disk", lambda: _disk(settings)),
        ("sandbox", _sandbox),
        ("keystore", lambda: _keystore(settings, password, found)),
        ("chain", lambda: _chain(settings, found)),
        ("stake", lambda: _stake(found)),
        ("joined", lambda: _joined(found)),
        ("orchestrator", lambda: _orchestrator(settings, found)),
        ("tasks", lambda: _tasks(settings)),
        ("inbound", lambda: _inbound(settings, found)),
    ]
    return [_run(name, check) for name, check in checks]


def render(checks: list[Check]) -> str:
    """One line per check: ok or FAIL, its name, then the facts or what to do."""
    width = max(len(c.name) for c in checks) + 2
    return "\n".join(
        f"{'ok' if c.ok else 'FAIL':<6}{c.name:<{width}}{c.detail.removeprefix('ok: ')}"
        for c in checks
    )


def exit_code(checks: list[Check]) -> int:
    return 0 if all(c.ok for c in checks) else 1


def _run(name: str, check: Callable[[], str]) -> Check:
    from swarmrl.chain.errors import ChainError, rpc_failure_sentence
    from swarmrl.files import os_error_sentence

    try:
        return Check(name, True, check())
    except _CheckSkippedError as e:
        return Check(name, False, f"skipped: needs {e}")
    except (_CheckFailedError, ChainError, ValueError) as e:
        return Check(name, False, _first_line(e))
    except OSError as e:
        return Check(name, False, os_error_sentence(e))
    except Exception as e:
        # web3 raises its own types for a chain that answers nonsense; named, not dumped.
        sentence = rpc_failure_sentence(e)
        if sentence is None:
            raise
        return Check(name, False, sentence)


# ---- the checks, each returning its "ok: ..." facts or raising ------------------------


def _backend(settings: NodeSettings, found: _Found) -> str:
    import torch

    from swarmrl.models import choose_backend, resolve_device

    has_vllm = importlib.util.find_spec("vllm") is not None
    device = resolve_device(settings.device)
    if device.startswith("cuda"):
        hardware = _gpu(torch, device, settings.device)
    elif device == "mps":
        if not torch.backends.mps.is_available():
            raise _CheckFailedError('device is mps but torch sees no Apple GPU; set device = "cpu"')
        hardware = "Apple GPU (mps)"
    else:
        hardware = f"cpu, {len(os.sched_getaffinity(0))} cores"
    backend = choose_backend(settings.backend, settings.device)
    if backend == "vllm" and not has_vllm:
        raise _CheckFailedError(
            'backend is vllm but vllm is not installed; install it or set backend = "torch"'
        )
    if backend == "vllm" and not device.startswith("cuda"):
        raise _CheckFailedError(
            f'backend vllm needs a GPU and the device is {device}; set backend = "torch"'
        )
    found.backend, found.device, found.hardware = backend, device, True
    return f"ok: {backend} on {hardware}; vllm {'installed' if has_vllm else 'not installed'}"


def _workers(settings: NodeSettings, found: _Found) -> str:
    """Each worker the node will run, and on which GPUs (with their free memory) or
    cores."""
    import torch

    from client.node.work.workers import describe, plan_here

    if not found.hardware:
        raise _CheckSkippedError("backend")
    plans = plan_here(settings, device=found.device, backend=found.backend)
    lines = []
    for plan in plans:
        gpus = [f"{torch.cuda.get_device_name(g)} {_free(torch, g)}" for g in plan.gpus]
        lines.append(describe(plan) + (f" ({', '.join(gpus)})" if gpus else ""))
    return f"ok: {len(plans)} worker(s): " + "; ".join(lines)


def _free(torch: Any, gpu: int) -> str:
    free, total = torch.cuda.mem_get_info(gpu)
    return f"{size(free)} of {size(total)} free"


def _gpu(torch: Any, device: str, configured: str) -> str:
    if not torch.cuda.is_available():
        raise _CheckFailedError(
            f'device is {configured} but torch sees no GPU; set device = "cpu" or install '
            "torch built for your CUDA driver"
        )
    index = int(device.split(":")[1]) if ":" in device else 0
    count = torch.cuda.device_count()
    if index >= count:
        raise _CheckFailedError(
            f'device is {device} but torch sees {count} GPU(s); set device = "cuda:0"'
        )
    return f"{torch.cuda.get_device_name(index)} (cuda:{index}), {_free(torch, index)}"


def _disk(settings: NodeSettings) -> str:
    data_dir = Path(settings.data_dir)
    with settings.about("data_dir"):
        # A file, a folder that cannot be made, or an orchestrator's folder (whose
        # weight store and logs the node would share).
        check_data_dir(data_dir, ROLE)
    existing = data_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if free < MIN_FREE_BYTES:
        raise _CheckFailedError(
            f"only {size(free)} free under {data_dir}; free some space or set data_dir "
            f"to a disk with at least {MIN_FREE_BYTES // GiB} GiB free for the weight store"
        )
    return f"ok: {size(free)} free under {data_dir}"


def _sandbox() -> str:
    from swarmrl.tasks import code

    # The module warns once when it falls back to rlimits; this line says it already.
    with _silenced(code.logger):
        try:
            kind = code.sandbox_kind()
        except RuntimeError:
            raise _CheckFailedError(
                "no Python interpreter runs in the code sandbox, so code tasks cannot be "
                "scored; install python3 where the sandbox can run it (/usr/bin/python3)"
            ) from None
    if kind == "bubblewrap":
        return "ok: bubblewrap isolates the code tests"
    why = "is not installed" if shutil.which("bwrap") is None else "does not work here"
    return (
        f"ok: rlimits only (bubblewrap {why}), so code tests run without network or "
        "filesystem isolation"
    )


def _keystore(settings: NodeSettings, password: str | None, found: _Found) -> str:
    from swarmrl import keystore
    from swarmrl.p2p.identity import load_or_create_peer_key, peer_id_of, peer_key_path

    directory, name = Path(settings.keystore_dir), settings.key
    try:
        found.node = keystore.info(directory, name).address
    except keystore.KeystoreError as e:
        if not (directory / f"{name}.json").exists():
            raise _CheckFailedError(f"{e}; {INIT_HINT} to create it") from None
        raise
    if password is None:
        password = keystore.read_password(settings.password_file)
    try:
        account = keystore.unlock(directory, name, password)
    except keystore.KeystoreError as e:
        if str(e).startswith("wrong password"):
            raise _CheckFailedError(
                f"{e}; check password_file in node.toml or $SWARMRL_PASSWORD"
            ) from None
        raise
    peer_path = peer_key_path(directory, name)
    if not peer_path.exists():
        # Checked first: loading a missing peer key would create one.
        raise _CheckFailedError(f"key {name!r} has no peer identity at {peer_path}; {INIT_HINT}")
    found.peer_key = load_or_create_peer_key(peer_path)
    found.account = account
    return f"ok: key {name!r} unlocks: node {account.address}, peer {peer_id_of(found.peer_key)}"


def _chain(settings: NodeSettings, found: _Found) -> str:
    from swarmrl.chain.contracts import Contracts
    from swarmrl.chain.deploy import load_deployment
    from swarmrl.chain.errors import RpcUnavailableError
    from swarmrl.chain.tx import TxSettings

    found.deployment = load_deployment(settings.deployment)
    rpc_url = found.deployment.rpc_url
    try:
        found.chain = Contracts.connect(
            found.deployment, settings=TxSettings(rpc_retries=RPC_RETRIES)
        )
    except RpcUnavailableError as e:
        raise _CheckFailedError(f"{e}; is the chain at {rpc_url} running?") from None
    block = found.chain.w3.eth.block_number
    return f"ok: chain {found.deployment.chain_id} at {rpc_url}, block {block}"


def _stake(found: _Found) -> str:
    from swarmrl.chain.tokens import format_tokens

    chain, node = _needs_chain(found), _needs_node(found)
    provider = chain.registry.provider_of(node)
    if provider is None:
        raise _CheckFailedError(f"node {node} has no provider on chain; {INIT_HINT}")
    found.provider = provider
    stake = chain.stakes.stake_of(provider)
    each = chain.stakes.min_stake_per_node()
    nodes = len(chain.registry.nodes_of(provider))
    needed = each * nodes
    if stake < needed:
        raise _CheckFailedError(
            f"provider {provider} has {format_tokens(stake)} tokens staked but its {nodes} "
            f"node(s) need {format_tokens(needed)}; stake {format_tokens(needed - stake)} more "
            "with `swarmrl wallet stake`"
        )
    return (
        f"ok: provider {provider} stakes {format_tokens(stake)} tokens for {nodes} node(s) "
        f"({format_tokens(each)} each)"
    )


def _joined(found: _Found) -> str:
    chain, node = _needs_chain(found), _needs_node(found)
    if not chain.pool.is_joined(node):
        raise _CheckFailedError(f"node {node} is not in the run's pool; {INIT_HINT} to join it")
    return f"ok: node {node} is in the run's pool"


def _orchestrator(settings: NodeSettings, found: _Found) -> str:
    from client.node.work.session import Identity, Session, node_report
    from swarmrl.eip712 import pool_domain, swarm_domain
    from swarmrl.p2p import wire
    from swarmrl.p2p.host import Host, RemoteError
    from swarmrl.work.join import IncompatibleVersionError

    address = settings.orchestrator
    if address is None:
        raise _CheckFailedError(
            "set orchestrator in node.toml to the multiaddr the orchestrator prints"
        )
    if found.account is None:
        raise _CheckSkippedError("keystore")
    d = found.deployment
    if d is None:
        raise _CheckSkippedError("chain")
    pool = d.contracts.compute_pool
    me = Identity(
        account=found.account,
        # Unknown when the chain is down; the orchestrator's refusal still proves it answers.
        provider=found.provider or ZERO_ADDRESS,
        run=d.run_id,
        swarm_domain=swarm_domain(d.chain_id, pool),
        pool_domain=pool_domain(d.chain_id, pool),
        trusted=frozenset(d.recorders),
    )
    with Host(found.peer_key, listen="/ip4/127.0.0.1/tcp/0") as host:
        try:
            peer = host.connect(address, timeout=CONNECT_TIMEOUT)
        except (ConnectionError, TimeoutError):
            raise _CheckFailedError(
                f"nothing answered at {address}; start the orchestrator, or set orchestrator in "
                "node.toml to the address it prints"
            ) from None
        try:
            response = Session(host, peer, me).join(node_report(found.backend, found.device))
        except IncompatibleVersionError as e:
            raise _CheckFailedError(str(e)) from None
        except RemoteError as refusal:
            return f"ok: {peer} answers; it refused the join: {refusal}"
        except TimeoutError:
            raise _CheckFailedError(
                f"{peer} took the connection but did not answer the join request; is that "
                "address an orchestrator's?"
            ) from None
        except wire.WireError:
            raise _CheckFailedError(
                f"{peer} answered the join request with something this swarmrl cannot read; "
                "update swarmrl to the orchestrator's version"
            ) from None
    if response.run != d.run_id:
        raise _CheckFailedError(
            f"the orchestrator runs {response.run} but the deployment file names {d.run_id}; "
            "use the orchestrator's deployment file"
        )
    return (
        f"ok: {peer} answers: node state {response.state}, policy step "
        f"{'none yet' if response.policy_step is None else response.policy_step}"
    )


def _tasks(settings: NodeSettings) -> str:
    tasks = load_tasks(settings)
    return f"ok: {len(tasks)} tasks in {settings.tasks}"


def _inbound(settings: NodeSettings, found: _Found) -> str:
    listen = settings.listen
    if listen == OUTBOUND_ONLY:
        return (
            "ok: outbound only (listen = none): the node pulls weights, gets work and submits, "
            "and serves no shards"
        )
    from swarmrl.p2p.ports import ListenError, check_free, tcp_endpoint

    _, ip, port = tcp_endpoint(listen)
    try:
        check_free(listen)
    except ListenError as e:
        raise _CheckFailedError(f'{e}, or set listen = "none" to work outbound only') from None
    where = "a free port" if port == 0 else f"port {port}"
    if settings.orchestrator is None or found.peer_key is None:
        return f"ok: the node can listen on {ip}, {where} (no dial-back tried: needs orchestrator)"
    reached = _dial_back(ip, settings.orchestrator, found.peer_key)
    if reached is None:
        return (
            f"ok: the node can listen on {ip}, {where}, but the orchestrator could not dial "
            "its data port back (NAT or a firewall): it pulls, works and submits, and serves "
            "no shards"
        )
    return f"ok: the orchestrator dialled the data port back at {reached}: the node serves shards"


def _dial_back(ip: str, orchestrator: str, peer_key: Any) -> str | None:
    """Asks the orchestrator to dial a data server on `ip` back, as `node run` does
    before it offers shards: the endpoint reached, or None."""
    from swarmrl.p2p.host import Host
    from swarmrl.weights import dialback
    from swarmrl.weights.datapath import ShardServer

    server = ShardServer(lambda manifest_hash: None, host=ip)
    try:
        with Host(peer_key, listen=None) as host:
            try:
                peer = host.connect(orchestrator, timeout=CONNECT_TIMEOUT)
            except (ConnectionError, TimeoutError):
                return None
            reached = dialback.ask(host, server, peer)
    finally:
        server.close()
    return None if reached is None else str(reached)


# ---- helpers ------------------------------------------------------------------------


def _needs_chain(found: _Found) -> Contracts:
    if found.chain is None:
        raise _CheckSkippedError("chain")
    return found.chain


def _needs_node(found: _Found) -> str:
    if found.node is None:
        raise _CheckSkippedError("keystore")
    return found.node


@contextlib.contextmanager
def _silenced(logger: logging.Logger) -> Iterator[None]:
    was = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = was


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0][:400] if str(e) else type(e).__name__
