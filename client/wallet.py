"""`swarmrl wallet`: keys, stake and rewards for stakers and node operators.

Keys live in encrypted JSON V3 keystores (see `swarmrl.keystore`). The password
comes from --password-file, else $SWARMRL_PASSWORD (for daemons), else a
prompt. Commands that touch the chain read the deployment file that `swarmrl
chain up` writes (or --deployment, for Base Sepolia or any other network).
Every failure is one sentence on stderr and exit code 1 (`list` writes one per
damaged keystore), and changes nothing. Commands that send hold the key's send
lock (see `swarmrl.chain.tx.account_lock`) from their checks to their last
receipt. Amounts are plain decimals of tokens (18 decimals), e.g. 12 or 2.5.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import typer

from swarmrl import keystore
from swarmrl.chain.tokens import format_tokens, parse_tokens
from swarmrl.cli_options import DeploymentFile, KeystoreDir, PasswordFile
from swarmrl.times import date_time, duration

if TYPE_CHECKING:
    from client.node.screen.view import EpochWork
    from swarmrl.chain.contracts import Contracts
    from swarmrl.chain.recorded_work import LeafRef

app = typer.Typer(
    help="Keys, stake and rewards: stake, unstake and claim from an encrypted keystore.",
    no_args_is_help=True,
)

RpcUrl = typer.Option(None, "--rpc-url", help="Override the deployment's RPC URL.")
MAX_KEY_FILE_BYTES = 1024  # 64 hex digits, a 0x and a newline, with room to spare
MAX_EPOCH = 2**64 - 1  # ComputePool keys work by uint64 epoch


def _dir(path: Path | None) -> Path:
    return path or keystore.default_dir()


@app.command()
def new(
    name: str = typer.Argument(..., help="A name for the key, e.g. 'node1'."),
    keystore_dir: Path | None = KeystoreDir,
    password_file: Path | None = PasswordFile,
) -> None:
    """Create a new random key, encrypted with a password."""
    keystore.check_folder(_dir(keystore_dir))  # before the password is asked for
    key = keystore.create(
        _dir(keystore_dir), name, keystore.read_password(password_file, confirm=True)
    )
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
    keystore.check_folder(_dir(keystore_dir))  # before the password is asked for
    try:
        with private_key_file.open("rb") as f:
            # Bounded: a device or a large file given by mistake is refused, not read.
            raw = f.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as e:
        raise keystore.KeystoreError(f"cannot read the private key file: {e.strerror}") from None
    if len(raw) > MAX_KEY_FILE_BYTES:
        raise keystore.KeystoreError("the private key file is too large to hold one key")
    try:
        key_bytes = bytes.fromhex(raw.decode("ascii").strip().removeprefix("0x"))
    except ValueError:  # UnicodeDecodeError included
        raise keystore.KeystoreError("the private key file does not hold hex digits") from None
    key = keystore.save(
        _dir(keystore_dir), name, key_bytes, keystore.read_password(password_file, confirm=True)
    )
    typer.echo(f"{key.name} {key.address}")


@app.command("list")
def list_keys(keystore_dir: Path | None = KeystoreDir) -> None:
    """Every key in the keystore directory, with the address its file records.

    Without the password an address cannot be checked against its key; every
    command that unlocks a key checks it and refuses a key that is not the
    address its file records. Each damaged file is one line on stderr, and the
    exit code is then 1, after the good keys are listed.
    """
    listing = keystore.list_keys(_dir(keystore_dir))
    for key in listing.keys:
        typer.echo(f"{key.name} {key.address}")
    for damaged in listing.damaged:
        typer.secho(f"error: {damaged}", err=True, fg=typer.colors.RED)
    if listing.damaged:
        raise typer.Exit(1)


@app.command()
def address(
    name: str = typer.Argument(..., help="The key's name."),
    keystore_dir: Path | None = KeystoreDir,
) -> None:
    """Print the address a key's file records (no password needed, so not checked
    against the key; commands that unlock the key check it)."""
    typer.echo(keystore.info(_dir(keystore_dir), name).address)


@contextmanager
def _chain_errors() -> Iterator[None]:
    """Chain failures end like every other: one sentence and exit code 1. RPC failures
    the chain layer did not foresee are named, never dumped: web3's messages carry
    URLs of its docs and whole RPC responses."""
    from swarmrl.chain.errors import ChainError, rpc_failure_sentence

    try:
        yield
    except ChainError as e:
        message = str(e)
    except Exception as e:
        sentence = rpc_failure_sentence(e)
        if sentence is None:
            raise
        message = sentence
    else:
        return
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    raise typer.Exit(1)


def _protocol(deployment: Path | None, rpc_url: str | None) -> Contracts:
    from swarmrl.chain.contracts import Contracts
    from swarmrl.chain.deploy import load_deployment

    return Contracts.connect(load_deployment(deployment), rpc_url=rpc_url)


@contextmanager
def _acting_as(
    name: str,
    keystore_dir: Path | None,
    password_file: Path | None,
    deployment: Path | None,
    rpc_url: str | None,
) -> Iterator[Contracts]:
    """The protocol with the unlocked key `name` signing; chain errors end the command.

    The block holds the key's send lock: two commands sending from one key would
    otherwise check the same state, then collide on nonces or permits and revert.
    """
    from swarmrl.chain.contracts import Contracts
    from swarmrl.chain.deploy import load_deployment
    from swarmrl.chain.tx import account_lock

    with _chain_errors():
        # Read before the key: a damaged file must not cost the seconds of decryption first.
        loaded = load_deployment(deployment)
    signer = keystore.unlock(
        _dir(keystore_dir), name, keystore.read_password(password_file, confirm=False)
    )
    with _chain_errors():
        chain = Contracts.connect(loaded, signer, rpc_url=rpc_url)

        def say_waiting() -> None:
            typer.echo(f"waiting for another command sending from {signer.address}", err=True)

        with account_lock(chain.deployment.chain_id, signer.address, on_wait=say_waiting):
            yield chain


@app.command()
def balance(
    name: str = typer.Argument(..., help="The key's name."),
    keystore_dir: Path | None = KeystoreDir,
    deployment: Path | None = DeploymentFile,
    rpc_url: str | None = RpcUrl,
) -> None:
    """Token and gas balances, active stake and unbonding stake (no password needed)."""
    account = keystore.info(_dir(keystore_dir), name).address
    with _chain_errors():
        chain = _protocol(deployment, rpc_url)
        unbonding = chain.stakes.unbonding_of(account)
        typer.echo(f"address      {account}")
        typer.echo(f"tokens       {format_tokens(chain.token.balance_of(account))}")
        typer.echo(f"gas (ETH)    {format_tokens(chain.eth_balance(account))}")
        typer.echo(f"staked       {format_tokens(chain.stakes.stake_of(account))}")
        typer.echo(
            f"bonded       {format_tokens(chain.stakes.bonded_of(account))} "
            "(your nodes' slash penalties in the pools: held while a node is joined, and after "
            "it leaves until the work recorded before has passed its invalidation window)"
        )
        typer.echo(
            f"unbonding    {format_tokens(unbonding.total)} "
            f"({format_tokens(unbonding.withdrawable)} withdrawable now)"
        )


@app.command()
def stake(
    name: str = typer.Argument(..., help="The key's name (the provider)."),
    amount: str = typer.Argument(..., help="Tokens to stake, e.g. 100 or 2.5."),
    keystore_dir: Path | None = KeystoreDir,
    password_file: Path | None = PasswordFile,
    deployment: Path | None = DeploymentFile,
    rpc_url: str | None = RpcUrl,
) -> None:
    """Stake tokens as a provider (registering as one first if needed)."""
    units = parse_tokens(amount)
    with _acting_as(name, keystore_dir, password_file, deployment, rpc_url) as chain:
        have = chain.token.balance_of(chain.address)
        if have < units:
            raise ValueError(f"insufficient balance: {format_tokens(have)} tokens, {amount} needed")
        if not chain.registry.is_provider(chain.address):
            chain.registry.register_provider()
        chain.stakes.stake(units, permit=True)
        typer.echo(
            f"staked {amount}; now {format_tokens(chain.stakes.stake_of(chain.address))} staked"
        )


@app.command("add-node")
def add_node(
    name: str = typer.Argument(..., help="The key's name (the provider)."),
    consent_file: Path = typer.Argument(
        ...,
        help="The node's signed consent, written on the node's machine by `swarmrl node init "
        "--provider-address ADDRESS --consent-out FILE`.",
    ),
    keystore_dir: Path | None = KeystoreDir,
    password_file: Path | None = PasswordFile,
    deployment: Path | None = DeploymentFile,
    rpc_url: str | None = RpcUrl,
) -> None:
    """Take on a node whose key is on another machine: check its consent (signed by the
    node it names, for this key's address and this deployment, not expired), register
    as a provider if needed, add the node and join it to the run's pool; running it
    again only checks."""
    from client.node.setup.keys import add_node_with_consent, passwords_from, read_consent
    from swarmrl.chain.deploy import load_deployment

    consent = read_consent(consent_file)
    with _chain_errors():
        loaded = load_deployment(deployment)

    def say_waiting() -> None:
        typer.echo("waiting for another command sending from the provider's key", err=True)

    done = add_node_with_consent(
        _dir(keystore_dir),
        name,
        passwords_from(password_file),
        loaded,
        consent,
        rpc_url=rpc_url,
        on_wait=say_waiting,
    )
    typer.echo(done.summary())


@app.command()
def unstake(
    name: str = typer.Argument(..., help="The key's name (the provider)."),
    amount: str = typer.Argument(..., help="Tokens to start unbonding."),
    keystore_dir: Path | None = KeystoreDir,
    password_file: Path | None = PasswordFile,
    deployment: Path | None = DeploymentFile,
    rpc_url: str | None = RpcUrl,
) -> None:
    """Start unbonding stake; it stays slashable until the unbonding period ends.

    Stake that backs your registered nodes, or that the pools bond for your nodes
    (while joined, and after leaving until the work recorded before has passed its
    invalidation window), stays active until then.
    """
    units = parse_tokens(amount)
    with _acting_as(name, keystore_dir, password_file, deployment, rpc_url) as chain:
        _check_unbondable(chain, units)
        chain.stakes.request_unbond(units)
        typer.echo(f"unbonding {amount}; withdraw it after the unbonding period")


def _check_unbondable(chain: Contracts, units: int) -> None:
    """One sentence, before any transaction, if `units` cannot leave active stake now."""
    me = chain.address
    active, bonded = chain.stakes.stake_of(me), chain.stakes.bonded_of(me)
    nodes = len(chain.registry.nodes_of(me))
    backing = nodes * chain.stakes.min_stake_per_node()
    free = max(0, active - max(bonded, backing))
    if units <= free:
        return
    reasons = []
    if backing:
        reasons.append(f"{format_tokens(backing)} backs your {nodes} registered node(s)")
    if bonded:
        reasons.append(
            f"{format_tokens(bonded)} is bonded by your nodes in the pools, joined or with "
            "work still in its invalidation window"
        )
    why = f" ({'; '.join(reasons)})" if reasons else ""
    raise ValueError(
        f"only {format_tokens(free)} of your {format_tokens(active)} staked "
        f"can be unbonded now{why}"
    )


@app.command()
def withdraw(
    name: str = typer.Argument(..., help="The key's name (the provider)."),
    keystore_dir: Path | None = KeystoreDir,
    password_file: Path | None = PasswordFile,
    deployment: Path | None = DeploymentFile,
    rpc_url: str | None = RpcUrl,
) -> None:
    """Withdraw every unbonded amount whose unbonding period has passed."""
    with _acting_as(name, keystore_dir, password_file, deployment, rpc_url) as chain:
        _check_withdrawable(chain)
        typer.echo(f"withdrew {format_tokens(chain.stakes.withdraw())}")


def _check_withdrawable(chain: Contracts) -> None:
    """One sentence, before any transaction, saying when stake becomes withdrawable."""
    unbonding = chain.stakes.unbonding_of(chain.address)
    if unbonding.withdrawable:
        return
    entries = chain.sender.call(
        chain.stakes.contract.functions.unbondingEntries(chain.address), "StakeManager"
    )
    pending = [(amount, release) for amount, release in entries if amount]
    if not pending:
        raise ValueError("nothing to withdraw: no stake is unbonding (see `wallet unstake`)")
    first = min(release for _, release in pending)
    due = sum(amount for amount, release in pending if release == first)
    left = max(0, first - chain.chain_time())
    raise ValueError(
        f"nothing to withdraw yet: {format_tokens(due)} of your "
        f"{format_tokens(unbonding.total)} unbonding becomes withdrawable at {date_time(first)} "
        f"(in {duration(left)}, by the chain's clock)"
    )


@app.command()
def claim(
    name: str = typer.Argument(..., help="The key's name (the node's provider)."),
    node: str = typer.Option(..., "--node", help="The node whose rewards to claim."),
    epochs: list[int] = typer.Option(
        [],
        "--epoch",
        min=0,
        max=MAX_EPOCH,
        help="An epoch to claim; repeat for more (none: every claimable epoch).",
    ),
    keystore_dir: Path | None = KeystoreDir,
    password_file: Path | None = PasswordFile,
    deployment: Path | None = DeploymentFile,
    rpc_url: str | None = RpcUrl,
) -> None:
    """Claim a node's rewards for epochs whose invalidation window has passed: those
    given, or without --epoch every one that is claimable (see `wallet claimable`)."""
    _check_address(node, "--node")
    with _acting_as(name, keystore_dir, password_file, deployment, rpc_url) as chain:
        if epochs:
            amount = chain.pool.claim(node, epochs)
        else:
            ready = _claimable_now(chain, name, node)
            epochs = [found.work.epoch for found in ready]
            # The refs are at hand already: no second search of the logs.
            amount = chain.pool.claim_refs([found.ref for found in ready])
        typer.echo(f"claimed {format_tokens(amount)} for epochs {', '.join(map(str, epochs))}")


def _claimable_now(chain: Contracts, name: str, node: str) -> list[Unclaimed]:
    """The work of `node` that the signing key `name` can claim now; ValueError saying
    when the first becomes claimable, whose key claims it, or that there is none."""
    from client.node.screen.view import CLAIMABLE, PENDING, epoch_status

    now = chain.chain_time()
    every = _unclaimed(chain, [node])
    unclaimed = [found for found in every if found.provider == chain.address]
    ready = [found for found in unclaimed if epoch_status(found.work, now) == CLAIMABLE]
    if ready:
        return ready
    pending = [
        found.work for found in unclaimed if epoch_status(found.work, now).startswith(PENDING)
    ]
    if not pending:
        others = _not_yours(name, chain.address, node, every, now)
        if others is not None:
            raise ValueError(others)
        if unclaimed:
            raise ValueError(
                f"nothing to claim: the unclaimed work of node {node} is never to be paid "
                "(see `wallet claimable`)"
            )
        raise ValueError(f"nothing to claim: no unclaimed work of node {node} is recorded")
    first = min(pending, key=lambda work: work.unlocks_at)
    raise ValueError(
        f"nothing to claim yet: epoch {first.epoch} becomes claimable at "
        f"{date_time(first.unlocks_at)} (in {duration(first.unlocks_at - now)}, by the "
        "chain's clock)"
    )


@app.command()
def claimable(
    name: str = typer.Argument(..., help="The key's name (the provider)."),
    node: str | None = typer.Option(
        None, "--node", help="Only this node (default: every node the provider added)."
    ),
    keystore_dir: Path | None = KeystoreDir,
    deployment: Path | None = DeploymentFile,
    rpc_url: str | None = RpcUrl,
) -> None:
    """The provider's recorded, unclaimed rewards per node and epoch, claimable now or
    when, or why they never will be (no password needed)."""
    from client.node.screen.view import CLAIMABLE, epoch_status

    if node is not None:
        _check_address(node, "--node")
    provider = keystore.info(_dir(keystore_dir), name).address
    with _chain_errors():
        chain = _protocol(deployment, rpc_url)
        every = _unclaimed(chain, [node] if node else chain.registry.nodes_ever_of(provider))
        now = chain.chain_time()
    unclaimed = [found for found in every if found.provider == provider]
    if not unclaimed:
        others = None if node is None else _not_yours(name, provider, node, every, now)
        typer.echo(others or f"no unclaimed work is recorded for provider {provider}")
        return
    ready = 0
    for found in unclaimed:
        work = found.work
        status = epoch_status(work, now)
        ready += work.reward if status == CLAIMABLE else 0
        typer.echo(f"node {found.node}  epoch {work.epoch}  {format_tokens(work.reward)}  {status}")
    typer.echo(
        f"claimable now: {format_tokens(ready)} tokens "
        f"(`swarmrl wallet claim {name} --node NODE` claims a node's)"
    )


class Unclaimed(NamedTuple):
    """A node's recorded work of one epoch, as shown, the leaf that claims it, and the
    provider of the membership it was recorded under: the only one who can claim it."""

    node: str
    work: EpochWork
    ref: LeafRef
    provider: str | None


def _unclaimed(chain: Contracts, nodes: list[str]) -> list[Unclaimed]:
    """Every epoch's work of `nodes` that is still open (neither claimed, invalidated
    nor released), in order, whichever provider it was recorded under: payable or not,
    since a leaf of a slashed membership or of one that had left is shown as such."""
    from eth_utils import to_checksum_address

    from client.node.screen.onchain import epoch_work
    from swarmrl.chain.compute_pool import Settlement

    found: list[Unclaimed] = []
    for node in nodes:
        for epoch in chain.pool.recorded_epochs(node):
            work = chain.pool.work_of(epoch, node)
            if work is not None and work.settlement is Settlement.OPEN:
                found.append(
                    Unclaimed(
                        to_checksum_address(node),
                        epoch_work(epoch, work),
                        work.ref,
                        work.membership.provider,
                    )
                )
    return found


def _not_yours(
    name: str, account: str, node: str, unclaimed: list[Unclaimed], now: int
) -> str | None:
    """The sentence naming the other providers whose keys claim the payable work of
    `node` among `unclaimed`, and how much each, for key `name` (of `account`) that
    has none; None if no other provider's key claims any."""
    from client.node.screen.view import CLAIMABLE, PENDING, epoch_status

    owed: dict[str, int] = {}
    for found in unclaimed:
        status = epoch_status(found.work, now)
        payable = status == CLAIMABLE or status.startswith(PENDING)
        if payable and found.provider is not None and found.provider != account:
            owed[found.provider] = owed.get(found.provider, 0) + found.work.reward
    if not owed:
        return None
    whose = ", and ".join(
        f"provider {provider}, whose key claims its {format_tokens(reward)} tokens"
        for provider, reward in owed.items()
    )
    return (
        f"nothing to claim with key {name} ({account}): the unclaimed work of node "
        f"{node} was recorded under {whose}"
    )


@app.command()
def history(
    name: str = typer.Argument(..., help="The key's name."),
    keystore_dir: Path | None = KeystoreDir,
    deployment: Path | None = DeploymentFile,
    rpc_url: str | None = RpcUrl,
) -> None:
    """Every protocol event that names the address this key's file records, oldest
    first, amounts in tokens and times as dates (no password needed, so that address
    is not checked against the key)."""
    account = keystore.info(_dir(keystore_dir), name).address
    with _chain_errors():
        chain = _protocol(deployment, rpc_url)
        roles = _role_names(chain)
        for event in chain.history(account):
            kinds = chain.event_types(event.contract, event.name)
            args = ", ".join(f"{k}={_shown(k, v, kinds[k], roles)}" for k, v in event.args.items())
            typer.echo(f"block {event.block}  {event.contract}.{event.name}({args})")


def _role_names(chain: Contracts) -> dict[bytes, str]:
    """Role ids to names: OpenZeppelin's admin role is zero, every other role is the
    keccak of its constant's name (`bytes32 public constant X_ROLE = keccak256("X_ROLE")`)."""
    from eth_utils import filter_abi_by_type, keccak

    names = {bytes(32): "DEFAULT_ADMIN_ROLE"}
    for handle in chain.handles.values():
        for item in filter_abi_by_type("function", handle.contract.abi):
            name = item["name"]
            if name.endswith("_ROLE") and not item["inputs"]:
                names.setdefault(keccak(text=name), name)
    return names


def _shown(name: str, value: object, kind: str, roles: dict[bytes, str]) -> str:
    """An event argument as a person reads it: token amounts in tokens (the contracts
    name them amount, value, reward, ...Amount), unix times as dates, role names, hex
    for other bytes."""
    from swarmrl.chain.revert import is_unix_time

    if isinstance(value, int) and kind.startswith("uint"):
        if name in ("amount", "value", "reward") or name.endswith("Amount"):
            return f"{format_tokens(value)} tokens"
        if is_unix_time(name, kind):
            return date_time(value)
    if not isinstance(value, bytes):
        return str(value)
    # OpenZeppelin's role events name them role, previousAdminRole and newAdminRole;
    # other bytes32 (a zero commitment, say) must not read as a role.
    if name == "role" or name.endswith("AdminRole"):
        return roles.get(value) or "0x" + value.hex()
    return "0x" + value.hex()


def _check_address(text: str, option: str) -> None:
    if not re.fullmatch(r"0x[0-9a-fA-F]{40}", text):
        raise ValueError(f"{option} {text[:60]!r} is not an address (0x and 40 hex digits)")
