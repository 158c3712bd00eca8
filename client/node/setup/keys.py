"""`swarmrl node init` and `swarmrl wallet add-node`: the node's keys, and its place in
the run's pool.

A node has an Ethereum key (its address signs join requests and submissions) and a
libp2p identity beside it. That key is hot: a running node keeps it unlocked, so it
holds no funds. The provider's key is the one with stake and gas; a provider who
staked for a node adds it to its nodes, with the node's signed EIP-712 consent, and
joins it to the pool. Two ways to get there, sharing every step:

- one machine (`init_node`): a volunteer who is their own provider holds both keys,
  and one command creates what is missing and sends what the chain lacks;
- two machines (a cold provider wallet): on the node's, `sign_consent` creates what
  is missing and signs the node's consent for the provider's address, which goes into
  a small file (`ConsentFile`) with no key and no funds in it and nothing sent; on the
  provider's, `add_node_with_consent` checks that file and sends what the chain lacks.
  The consent names the node, the provider, the registry's consent nonce and a
  deadline, under the registry's EIP-712 domain (chain id and contract), so it serves
  that one provider on that one deployment, once.

Everything is read before anything is created or sent, so a provider without
enough stake, a node taken by another provider or a provider without gas is one
sentence and nothing changes. Every step looks at what is already there, so each
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
from typing import Final, Literal

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address
from pydantic import Field, ValidationError

from swarmrl import eip712, keystore
from swarmrl.chain.contracts import Contracts
from swarmrl.chain.deploy import Deployment
from swarmrl.chain.tx import account_lock, with_rpc_retries
from swarmrl.p2p.identity import load_or_create_peer_key, peer_id_of, peer_key_path
from swarmrl.schema import MAX_UINT64, HexAddress, HexSignature, Strict, error_location

# (key name, whether the key is being created) -> its password
PasswordFor = Callable[[str, bool], str]

CONSENT_FORMAT: Final = "swarmrl node consent"
# A consent file is a dozen short fields; anything far larger was not written by us.
MAX_CONSENT_BYTES = 4096
MAX_UINT256 = 2**256 - 1


class NodeSetupError(ValueError):
    """`node init` or `wallet add-node` cannot go on; the message is one sentence."""


class Step(StrEnum):
    """What one run of `init_node`, `sign_consent` or `add_node_with_consent` did, in
    the order they do it."""

    NODE_KEY = "created the node key"
    PEER_IDENTITY = "created the node's peer identity"
    CONSENT_SIGNED = "signed its consent for the provider"
    PROVIDER_REGISTERED = "registered the provider"
    NODE_ADDED = "added the node to the provider's nodes"
    POOL_JOINED = "joined the pool"


@dataclass(frozen=True)
class NodeSetup:
    node: str  # the node's address
    peer_id: str | None  # None on the provider's machine, which has no node files
    provider: str  # the provider's address
    steps: tuple[Step, ...]  # empty when everything was already done

    def summary(self) -> str:
        """One line for the user: what was done, or that nothing needed doing."""
        peer = "" if self.peer_id is None else f" (peer {self.peer_id})"
        who = f"node {self.node}{peer} with provider {self.provider}"
        if not self.steps:
            return f"nothing to do: {who} is already registered and joined the pool"
        return f"{who}: {', '.join(self.steps)}"


class ConsentFile(Strict):
    """The node's signed consent as it travels to the provider's machine: the EIP-712
    `NodeConsent` with its signature, and the domain it was signed in, so the provider
    is told at once when it came from another deployment."""

    format: Literal["swarmrl node consent"]
    version: Literal[1]
    chain_id: int = Field(ge=1, le=MAX_UINT64)
    registry: HexAddress  # the ProviderRegistry: the domain's verifying contract
    provider: HexAddress
    node: HexAddress
    nonce: int = Field(ge=0, le=MAX_UINT256)  # the registry's consentNonce of the node
    deadline: int = Field(ge=0, le=MAX_UINT256)  # unix seconds, by the chain's clock
    signature: HexSignature  # the node's, over the consent in the registry's domain

    @classmethod
    def signed(
        cls, domain: eip712.Domain, consent: eip712.NodeConsent, signature: bytes
    ) -> ConsentFile:
        return cls(
            format=CONSENT_FORMAT,
            version=1,
            chain_id=domain.chain_id,
            registry=to_checksum_address(domain.verifying_contract),
            provider=to_checksum_address(consent.provider),
            node=to_checksum_address(consent.node),
            nonce=consent.nonce,
            deadline=consent.deadline,
            signature=signature.hex(),
        )

    def consent(self) -> eip712.NodeConsent:
        return eip712.NodeConsent(
            provider=to_checksum_address(self.provider),
            node=to_checksum_address(self.node),
            nonce=self.nonce,
            deadline=self.deadline,
        )

    def to_json(self) -> bytes:
        return self.model_dump_json(indent=2).encode() + b"\n"


def read_consent(path: Path) -> ConsentFile:
    """The consent file at `path`, every field checked; NodeSetupError in one sentence
    if it is unreadable, too large or not a consent `sign_consent` writes."""
    from swarmrl.files import read_bounded

    raw = read_bounded(path, MAX_CONSENT_BYTES, "a node's consent")
    try:
        # pydantic's own parser: depth-capped, unlike json.loads under web3.
        return ConsentFile.model_validate_json(raw)
    except ValidationError as e:
        raise NodeSetupError(
            f"{path} is not a node's consent as `swarmrl node init --consent-out` writes it "
            f"(the first problem is at {error_location(e, 'its top level')})"
        ) from None


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


@dataclass(frozen=True)
class _Identity:
    """The node's key and peer identity once both exist."""

    address: str
    peer_id: str
    account: LocalAccount | None  # the key, when this run created it (no unlock to sign)
    steps: tuple[Step, ...]  # what was created


@dataclass(frozen=True)
class _NodeFiles:
    """The node's key and peer identity as found before anything is created."""

    keystore_dir: Path
    name: str
    key: keystore.KeyInfo | None  # None: not made yet
    peer_path: Path
    had_peer_key: bool

    @classmethod
    def find(cls, keystore_dir: Path, name: str, provider: str) -> _NodeFiles:
        """What is there; the provider's own key as the node's, or a damaged keystore or
        peer key, is refused before any work."""
        key = _existing_key(keystore_dir, name)
        if key is not None and key.address == provider:
            raise NodeSetupError(
                f"the node key {name!r} is the provider's key; give the node a key of its "
                "own, since a running node keeps its key unlocked and the stake is the provider's"
            )
        peer_path = peer_key_path(keystore_dir, name)
        had_peer_key = peer_path.exists()
        if had_peer_key:
            load_or_create_peer_key(peer_path)
        return cls(keystore_dir, name, key, peer_path, had_peer_key)

    @property
    def address(self) -> str | None:
        return None if self.key is None else self.key.address

    def ensure(self, password_for: PasswordFor) -> _Identity:
        """Creates the key and the peer identity where they are missing."""
        steps: list[Step] = []
        account: LocalAccount | None = None
        if self.key is None:
            # Not keystore.create: the new account is kept, so consent needs no unlock.
            account = Account.create()
            keystore.save(self.keystore_dir, self.name, account.key, password_for(self.name, True))
            steps.append(Step.NODE_KEY)
            address: str = account.address
        else:
            address = self.key.address
        peer_id = peer_id_of(load_or_create_peer_key(self.peer_path))
        if not self.had_peer_key:
            steps.append(Step.PEER_IDENTITY)
        return _Identity(address, peer_id, account, tuple(steps))

    def account(self, identity: _Identity, password_for: PasswordFor) -> LocalAccount:
        """The node's key to sign with: the one just created, else unlocked."""
        if identity.account is not None:
            return identity.account
        return keystore.unlock(self.keystore_dir, self.name, password_for(self.name, False))


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
    files = _NodeFiles.find(keystore_dir, node_key, provider)
    with _chain_errors():
        chain = Contracts.connect(deployment, rpc_url=rpc_url)
        # Held from the first read to the last receipt: another command sending from
        # the provider would otherwise act on the same state and collide.
        with account_lock(deployment.chain_id, provider, on_wait=on_wait):
            sends = _plan(chain, provider_key, provider, files.address)
            identity = files.ensure(password_for)
            steps = list(identity.steps)
            if sends:
                acting = chain.as_account(
                    keystore.unlock(keystore_dir, provider_key, password_for(provider_key, False))
                )
                consent = None
                if Step.NODE_ADDED in sends:
                    node_account = files.account(identity, password_for)
                    consent = ConsentFile.signed(
                        chain.registry.domain(),
                        *chain.registry.node_consent(node_account, provider),
                    )
                _send(acting, identity.address, sends, consent, steps, "node init")
    return NodeSetup(identity.address, identity.peer_id, provider, tuple(steps))


def sign_consent(
    keystore_dir: Path,
    node_key: str,
    provider: str,
    password_for: PasswordFor,
    deployment: Deployment,
    *,
    valid_for: int,
    rpc_url: str | None = None,
) -> tuple[NodeSetup, ConsentFile]:
    """On the node's machine, where the provider's key is not: creates the node key
    `node_key` and its peer identity if missing, and signs the node's consent to be run
    by the provider at address `provider`, usable for `valid_for` seconds by the chain's
    clock. It reads the chain (its clock, the node's consent nonce and provider) and
    sends nothing."""
    provider = to_checksum_address(provider)
    files = _NodeFiles.find(keystore_dir, node_key, provider)
    with _chain_errors():
        chain = Contracts.connect(deployment, rpc_url=rpc_url)
        if files.address is not None:
            registered_to = chain.registry.provider_of(files.address)
            if registered_to not in (None, provider):
                raise NodeSetupError(_taken(files.address, registered_to, provider))
        identity = files.ensure(password_for)
        node_account = files.account(identity, password_for)
        consent, signature = chain.registry.node_consent(node_account, provider, ttl=valid_for)
    steps = (*identity.steps, Step.CONSENT_SIGNED)
    done = NodeSetup(identity.address, identity.peer_id, provider, steps)
    return done, ConsentFile.signed(chain.registry.domain(), consent, signature)


def add_node_with_consent(
    keystore_dir: Path,
    provider_key: str,
    password_for: PasswordFor,
    deployment: Deployment,
    consent: ConsentFile,
    *,
    rpc_url: str | None = None,
    on_wait: Callable[[], None] | None = None,
) -> NodeSetup:
    """On the provider's machine, where the node's key is not: with the key
    `provider_key` registers the provider, adds the node `consent` names (with that
    consent) and joins it to the pool where the chain does not have that yet.

    The consent must be for this deployment and this key's address and be signed by
    the node it names; when the node still has to be added, its deadline must not have
    passed and its nonce must be the node's current one (no provider has used it, the
    node has not revoked it). A node already added needs no consent, so running this
    again after it succeeded only checks."""
    provider = keystore.info(keystore_dir, provider_key).address
    node = _check_consent(consent, deployment, provider_key, provider)
    with _chain_errors():
        chain = Contracts.connect(deployment, rpc_url=rpc_url)
        with account_lock(deployment.chain_id, provider, on_wait=on_wait):
            sends = _plan(chain, provider_key, provider, node)
            if Step.NODE_ADDED in sends:
                _check_consent_usable(chain, consent)
            steps: list[Step] = []
            if sends:
                acting = chain.as_account(
                    keystore.unlock(keystore_dir, provider_key, password_for(provider_key, False))
                )
                _send(acting, node, sends, consent, steps, "wallet add-node")
    return NodeSetup(node, None, provider, tuple(steps))


def _check_consent(
    consent: ConsentFile, deployment: Deployment, provider_key: str, provider: str
) -> str:
    """The node `consent` names, once it is shown to be for this deployment and this
    provider and signed by that node; one sentence otherwise."""
    registry = to_checksum_address(deployment.contracts.provider_registry)
    if consent.chain_id != deployment.chain_id or to_checksum_address(consent.registry) != registry:
        raise NodeSetupError(
            f"the consent is for the registry {to_checksum_address(consent.registry)} on chain "
            f"{consent.chain_id}, not this deployment's ({registry} on chain "
            f"{deployment.chain_id}); sign it on the node's machine with the same deployment file"
        )
    named = to_checksum_address(consent.provider)
    if named != provider:
        raise NodeSetupError(
            f"the consent is for provider {named}, but key {provider_key!r} is {provider}; "
            f"sign one for it on the node's machine with `swarmrl node init --provider-address "
            f"{provider} --consent-out FILE`"
        )
    node = to_checksum_address(consent.node)
    if node == provider:
        raise NodeSetupError(
            f"the consent's node {node} is the provider's own address; give the node a key "
            "of its own, since a running node keeps its key unlocked and the stake is the "
            "provider's"
        )
    domain = eip712.registry_domain(deployment.chain_id, registry)
    if eip712.signer_of(consent.consent().digest(domain), consent.signature) != node:
        raise NodeSetupError(
            f"the consent is not signed by node {node}: it was changed after signing, or is "
            "damaged; sign a new one on the node's machine"
        )
    return node


def _check_consent_usable(chain: Contracts, consent: ConsentFile) -> None:
    """One sentence, before anything is sent, if the registry would refuse `consent`."""
    from swarmrl.times import date_time

    if consent.deadline < chain.chain_time():
        raise NodeSetupError(
            f"the consent expired at {date_time(consent.deadline)} (by the chain's clock); "
            "sign a new one on the node's machine"
        )
    current = chain.registry.consent_nonce(consent.node)
    if consent.nonce != current:
        raise NodeSetupError(
            f"the consent was used or revoked already (it names the node's consent nonce "
            f"{consent.nonce}, which is now {current}); sign a new one on the node's machine"
        )


def _existing_key(keystore_dir: Path, name: str) -> keystore.KeyInfo | None:
    """The key `name` if it exists; a damaged keystore is refused, never replaced, and
    a name no key can have is refused by `keystore.info`."""
    if keystore.NAME.fullmatch(name) and not (keystore_dir / f"{name}.json").exists():
        return None
    return keystore.info(keystore_dir, name)


def _plan(chain: Contracts, provider_key: str, provider: str, node: str | None) -> list[Step]:
    """The transactions still missing for `node` (None: a key not made yet), once the
    chain shows that the provider can pay for them."""
    state = _read_state(chain, provider, node)
    sends = _sends_needed(state, provider, node)
    if sends:
        _check_can_send(state, sends, provider_key, provider)
    return sends


def _read_state(chain: Contracts, provider: str, node: str | None) -> _ChainState:
    registered_to = joined_with = None
    if node is not None:
        registered_to = chain.registry.provider_of(node)
        joined = with_rpc_retries(
            chain.pool.contract.functions.joinedProviderOf(node).call, what="joinedProviderOf"
        )
        joined_with = None if int(joined, 16) == 0 else to_checksum_address(joined)
    return _ChainState(
        registered_to=registered_to,
        joined_with=joined_with,
        is_provider=chain.registry.is_provider(provider),
        stake=chain.stakes.stake_of(provider),
        nodes=len(chain.registry.nodes_of(provider)),
        min_stake_per_node=chain.stakes.min_stake_per_node(),
        gas=chain.eth_balance(provider),
    )


def _taken(node: str | None, registered_to: str, provider: str) -> str:
    return (
        f"node {node} is registered to provider {registered_to}, not to {provider}; "
        "that provider must remove it first, or give this node a new key"
    )


def _sends_needed(state: _ChainState, provider: str, node: str | None) -> list[Step]:
    """The transactions still missing, in the order the contracts accept them."""
    if state.registered_to is not None and state.registered_to != provider:
        raise NodeSetupError(_taken(node, state.registered_to, provider))
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
    node: str,
    sends: list[Step],
    consent: ConsentFile | None,
    steps: list[Step],
    command: str,
) -> None:
    """Sends `sends` as the provider, appending each to `steps` once it is mined; a
    failure after the first says what is done and to run `command` again."""
    from swarmrl.chain.errors import ChainError

    try:
        if Step.PROVIDER_REGISTERED in sends:
            acting.registry.register_provider()
            steps.append(Step.PROVIDER_REGISTERED)
        if Step.NODE_ADDED in sends:
            assert consent is not None  # signed or checked by the caller for this step
            acting.registry.add_node(node, consent.deadline, bytes.fromhex(consent.signature))
            steps.append(Step.NODE_ADDED)
        if Step.POOL_JOINED in sends:
            acting.pool.join_pool(node)
            steps.append(Step.POOL_JOINED)
    except ChainError as e:
        if not steps:
            raise
        done = ", ".join(steps)
        raise ChainError(f"{e} (it had {done}; run {command} again to finish the rest)") from None


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
