"""`swarmrl node init`: the node's keys, and its place in the run's pool.

A node has an Ethereum key (its address signs join requests and submissions)
and a libp2p identity beside it. On chain, a provider who staked for it adds it
to its nodes, with the node's signed consent, and joins it to the pool. A
volunteer who is their own provider holds both keys, so one command does all of
it: create what is missing, then send what the chain does not have yet.

Everything is read before anything is created or sent, so a provider without
enough stake, a node taken by another provider or a provider without gas is one
sentence and nothing changes. Every step looks at what is already there, so the
command can be run again after any failure and finishes the rest; once all is
done it changes nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address

from swarmrl import keystore
from swarmrl.chain.contracts import Contracts
from swarmrl.chain.deploy import Deployment
from swarmrl.chain.tx import account_lock, with_rpc_retries
from swarmrl.p2p.identity import load_or_create_peer_key, peer_id_of, peer_key_path

# (key name, whether the key is being created) -> its password
PasswordFor = Callable[[str, bool], str]


class NodeSetupError(ValueError):
    """`node init` cannot go on; the message is one sentence for the user."""


class Step(StrEnum):
    """What one run of `init_node` did, in the order it does it."""

    NODE_KEY = "created the node key"
    PEER_IDENTITY = "created the node's peer identity"
    PROVIDER_REGISTERED = "registered the provider"
    NODE_ADDED = "added the node to the provider's nodes"
    POOL_JOINED = "joined the pool"


@dataclass(frozen=True)
class NodeSetup:
    node: str  # the node's address
    peer_id: str
    provider: str  # the provider's address
    steps: tuple[Step, ...]  # empty when everything was already done

    def summary(self) -> str:
        """One line for the user: what was done, or that nothing needed doing."""
        who = f"node {self.node} (peer {self.peer_id}) with provider {self.provider}"
        if not self.steps:
            return f"nothing to do: {who} is already registered and joined the pool"
        return f"{who}: {', '.join(self.steps)}"


@dataclass(frozen=True)
class _ChainState:
    """What the chain holds about the provider and the node, read before acting."""

    registered_to: str | None  # the node's provider in the registry
    joined_with: str | None  # the provider the node joined the pool with
    is_provider: bool
    stake: int
    nodes: int  # the provider's registered nodes
    min_stake_per_node: int
    gas: int  # the provider's ETH, in wei


def passwords_from(password_file: Path | None) -> PasswordFor:
    """Passwords as every command takes them: the file, else $SWARMRL_PASSWORD, else a
    prompt. `keystore.read_password` prompts for a bare "Password"; node init may ask
    for two keys, so its prompt names the key."""

    def password_for(name: str, new: bool) -> str:
        if not keystore.password_given(password_file) and sys.stdin.isatty():
            import typer

            password: str = typer.prompt(
                f"Password for key {name!r}", hide_input=True, confirmation_prompt=new
            )
            return password
        return keystore.read_password(password_file, confirm=new)

    return password_for


def init_node(
    keystore_dir: Path,
    node_key: str,
    provider_key: str,
    password_for: PasswordFor,
    deployment: Deployment,
    *,
    rpc_url: str | None = None,
    on_wait: Callable[[], None] | None = None,
) -> NodeSetup:
    """Creates the node key `node_key` and its peer identity if missing, and with the
    key `provider_key` registers the provider, adds the node and joins the pool where
    the chain does not have that yet. `on_wait` runs if another command is sending
    from the provider's key and this one has to wait for it."""
    provider = keystore.info(keystore_dir, provider_key).address
    node = _existing_key(keystore_dir, node_key)
    if node is not None and node.address == provider:
        raise NodeSetupError(
            f"the node key {node_key!r} is the provider's key; give the node a key of its "
            "own, since a running node keeps its key unlocked and the stake is the provider's"
        )
    peer_path = peer_key_path(keystore_dir, node_key)
    had_peer_key = peer_path.exists()
    if had_peer_key:
        load_or_create_peer_key(peer_path)  # a damaged one is refused before any work
    with _chain_errors():
        chain = Contracts.connect(deployment, rpc_url=rpc_url)
        # Held from the first read to the last receipt: another command sending from
        # the provider would otherwise act on the same state and collide.
        with account_lock(deployment.chain_id, provider, on_wait=on_wait):
            state = _read_state(chain, provider, node.address if node else None)
            sends = _sends_needed(state, provider, node.address if node else None)
            if sends:
                _check_can_send(state, sends, provider_key, provider)
            steps: list[Step] = []
            node_account: LocalAccount | None = None
            if node is None:
                # Not keystore.create: the new account is kept, so consent needs no unlock.
                node_account = Account.create()
                keystore.save(
                    keystore_dir, node_key, node_account.key, password_for(node_key, True)
                )
                steps.append(Step.NODE_KEY)
                node_address: str = node_account.address
            else:
                node_address = node.address
            peer_id = peer_id_of(load_or_create_peer_key(peer_path))
            if not had_peer_key:
                steps.append(Step.PEER_IDENTITY)
            if sends:
                acting = chain.as_account(
                    keystore.unlock(keystore_dir, provider_key, password_for(provider_key, False))
                )
                if Step.NODE_ADDED in sends and node_account is None:
                    node_account = keystore.unlock(
                        keystore_dir, node_key, password_for(node_key, False)
                    )
                _send(acting, node_account, node_address, sends, steps)
    return NodeSetup(node_address, peer_id, provider, tuple(steps))


def _existing_key(keystore_dir: Path, name: str) -> keystore.KeyInfo | None:
    """The key `name` if it exists; a damaged keystore is refused, never replaced, and
    a name no key can have is refused by `keystore.info`."""
    if keystore.NAME.fullmatch(name) and not (keystore_dir / f"{name}.json").exists():
        return None
    return keystore.info(keystore_dir, name)


def _read_state(chain: Contracts, provider: str, node: str | None) -> _ChainState:
    registered_to = joined_with = None
    if node is not None:
        registered_to = chain.provider_of(node)
        joined = with_rpc_retries(
            chain.pool.functions.joinedProviderOf(node).call, what="joinedProviderOf"
        )
        joined_with = None if int(joined, 16) == 0 else to_checksum_address(joined)
    return _ChainState(
        registered_to=registered_to,
        joined_with=joined_with,
        is_provider=chain.is_provider(provider),
        stake=chain.stake_of(provider),
        nodes=len(chain.nodes_of(provider)),
        min_stake_per_node=chain.min_stake_per_node(),
        gas=chain.eth_balance(provider),
    )


def _sends_needed(state: _ChainState, provider: str, node: str | None) -> list[Step]:
    """The transactions still missing, in the order the contracts accept them."""
    if state.registered_to is not None and state.registered_to != provider:
        raise NodeSetupError(
            f"node {node} is registered to provider {state.registered_to}, not to {provider}; "
            "that provider must remove it first, or give this node a new key"
        )
    sends = []
    if not state.is_provider:
        sends.append(Step.PROVIDER_REGISTERED)
    if state.registered_to is None:
        sends.append(Step.NODE_ADDED)
    # A membership from a provider who has since given the node up is stale: the
    # contract lets the node's current provider replace it.
    if state.joined_with != provider:
        sends.append(Step.POOL_JOINED)
    return sends


def _check_can_send(
    state: _ChainState, sends: list[Step], provider_key: str, provider: str
) -> None:
    """One sentence, before anything is created or sent, if the provider cannot pay."""
    from swarmrl.chain.tokens import format_tokens

    nodes = state.nodes + (1 if Step.NODE_ADDED in sends else 0)
    needed = nodes * state.min_stake_per_node
    if state.stake < needed:
        missing = format_tokens(needed - state.stake)
        raise NodeSetupError(
            f"provider {provider_key!r} ({provider}) has {format_tokens(state.stake)} tokens "
            f"staked, but {nodes} node(s) need {format_tokens(needed)} "
            f"({format_tokens(state.min_stake_per_node)} each); stake {missing} more with "
            f"`swarmrl wallet stake {provider_key} {missing}`"
        )
    if state.gas == 0:
        raise NodeSetupError(
            f"provider {provider_key!r} ({provider}) has no ETH to pay for gas; send it some first"
        )


def _send(
    acting: Contracts,
    node_account: LocalAccount | None,
    node: str,
    sends: list[Step],
    steps: list[Step],
) -> None:
    """Sends `sends` as the provider, appending each to `steps` once it is mined."""
    from swarmrl.chain.errors import ChainError

    try:
        if Step.PROVIDER_REGISTERED in sends:
            acting.register_provider()
            steps.append(Step.PROVIDER_REGISTERED)
        if Step.NODE_ADDED in sends:
            assert node_account is not None  # unlocked by the caller for this step
            consent, signature = acting.node_consent(node_account, acting.address)
            acting.add_node(node, consent.deadline, signature)
            steps.append(Step.NODE_ADDED)
        if Step.POOL_JOINED in sends:
            acting.join_pool(node)
            steps.append(Step.POOL_JOINED)
    except ChainError as e:
        if not steps:
            raise
        done = ", ".join(steps)
        raise ChainError(f"{e} (it had {done}; run node init again to finish the rest)") from None


@contextmanager
def _chain_errors() -> Iterator[None]:
    """Chain failures as one sentence the CLI prints like any ValueError; RPC failures
    are named, never dumped (web3's messages carry library URLs and raw responses)."""
    from swarmrl.chain.errors import ChainError, rpc_failure_sentence

    try:
        yield
    except ChainError as e:
        raise NodeSetupError(str(e)) from None
    except NodeSetupError:
        raise
    except Exception as e:
        message = rpc_failure_sentence(e)
        if message is None:
            raise
        raise NodeSetupError(message) from None
