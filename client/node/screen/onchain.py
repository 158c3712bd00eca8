"""The chain as the node's terminal app sees it: the node's standing (its provider's
stake, the pool, each epoch's recorded work and reward) and claiming as the provider.

Both run in worker threads: every call here is a round of RPC calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from client.node.screen.view import ChainFacts, EpochWork

if TYPE_CHECKING:
    from swarmrl.chain.compute_pool import WorkRecord
    from swarmrl.chain.contracts import Contracts
    from swarmrl.chain.recorded_work import LeafRef


def read_facts(
    chain: Contracts,
    node: str,
    epochs: Iterable[int],
    final: dict[int, EpochWork],
    refs: dict[int, LeafRef] | None = None,
) -> ChainFacts:
    """`node`'s standing now; epochs in `final` are not read again, and epochs that
    became final are added to it. `refs` keeps the leaf of each epoch found recorded, so
    that later reads of it are three calls rather than searches of the chain's logs."""
    provider = chain.registry.provider_of(node)
    if provider is None:
        raise ValueError(f"node {node} has no provider on chain; run `swarmrl node init`")
    refs = {} if refs is None else refs
    wanted = sorted(set(epochs))
    # One search of the logs for all the epochs awaiting record, then two for each found.
    unseen = [e for e in wanted if e not in final and e not in refs]
    recorded = set(chain.pool.recorded_epochs(node)) if unseen else set()
    work = []
    for epoch in wanted:
        known = final.get(epoch)
        if known is None:
            known = epoch_work(epoch, _work_of(chain, node, epoch, refs, recorded))
        if known.final:
            final[epoch] = known
        work.append(known)
    return ChainFacts(
        provider=provider,
        stake=chain.stakes.stake_of(provider),
        needed=len(chain.registry.nodes_of(provider)) * chain.stakes.min_stake_per_node(),
        unbonding=chain.stakes.unbonding_of(provider).total,
        joined=chain.pool.is_joined(node),
        now=chain.chain_time(),
        epochs=tuple(work),
    )


def _work_of(
    chain: Contracts, node: str, epoch: int, refs: dict[int, LeafRef], recorded: set[int]
) -> WorkRecord | None:
    """`node`'s work in `epoch`: read by the leaf found before, else searched for if the
    pool logged it (`recorded`), keeping its leaf in `refs`."""
    if epoch in refs:
        return chain.pool.work_at(refs[epoch])
    if epoch not in recorded:
        return None
    record = chain.pool.work_of(epoch, node)
    if record is not None:
        refs[epoch] = record.ref
    return record


def epoch_work(epoch: int, record: WorkRecord | None) -> EpochWork:
    """The chain's record of a node's work in `epoch` as the screen and the wallet show it
    (None: nothing recorded yet)."""
    if record is None:
        return EpochWork(epoch)
    return EpochWork(
        epoch,
        units=record.units,
        reward=record.reward,
        unlocks_at=record.unlocks_at,
        claimed=record.claimed,
        invalidated=record.invalidated,
        # A membership slashed after this epoch was paid took nothing of it.
        slashed=record.slashed and not record.claimed,
        backed=record.provider is not None,
    )


def work_epochs(receipts: Iterable[dict[str, Any]]) -> set[int]:
    """Epochs the orchestrator took some of the node's work in, by its receipts."""
    return {int(r["epoch"]) for r in receipts if r.get("units")}


class ChainReader:
    """Reads :class:`ChainFacts` for the app, connecting on first use (off the UI thread)."""

    def __init__(self, deployment: Path, node: str, epochs: Callable[[], Iterable[int]]) -> None:
        self.deployment = deployment
        self.node = node
        self.epochs = epochs  # of the node's receipts: the daemon's journal has them
        self._chain: Contracts | None = None
        self._final: dict[int, EpochWork] = {}
        self._refs: dict[int, LeafRef] = {}

    def __call__(self) -> ChainFacts:
        if self._chain is None:
            from swarmrl.chain.contracts import Contracts
            from swarmrl.chain.deploy import load_deployment

            self._chain = Contracts.connect(load_deployment(self.deployment))
        return read_facts(self._chain, self.node, self.epochs(), self._final, self._refs)


class ProviderClaimer:
    """Claims the node's rewards as its provider; the provider's key is unlocked once."""

    def __init__(
        self,
        deployment: Path,
        keystore_dir: Path,
        key: str,
        password_file: Path | None,
        node: str,
    ) -> None:
        self.deployment = deployment
        self.keystore_dir = keystore_dir
        self.key = key
        self.password_file = password_file
        self.node = node
        self._account: Any = None

    @property
    def needs_password(self) -> bool:
        """Whether the app must ask for the key's password (there is no prompt to fall
        back on while it owns the terminal)."""
        from swarmrl import keystore

        return self._account is None and not keystore.password_given(self.password_file)

    def claim(self, epochs: list[int], password: str | None) -> int:
        """Claims `epochs`; returns the amount paid. Holds the key's send lock, as
        `swarmrl wallet` does, so a wallet command sending at once cannot collide."""
        from swarmrl import keystore
        from swarmrl.chain.contracts import Contracts
        from swarmrl.chain.deploy import load_deployment
        from swarmrl.chain.tx import account_lock

        if self._account is None:
            if password is None:
                password = keystore.read_password(self.password_file)
            self._account = keystore.unlock(self.keystore_dir, self.key, password)
        chain = Contracts.connect(load_deployment(self.deployment), self._account)
        with account_lock(chain.deployment.chain_id, self._account.address):
            return chain.pool.claim(self.node, epochs)
