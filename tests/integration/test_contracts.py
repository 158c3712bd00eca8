"""The protocol end to end on a real anvil: the whole story, then each rejection.

Every revert is checked by its decoded sentence, as a user would read it.
"""

import re
from dataclasses import replace

import pytest
from eth_utils import keccak, to_checksum_address

from benchmarks.hostile import malleable_twin
from swarmrl import eip712
from swarmrl.chain import anvil as anvil_mod
from swarmrl.chain.compute_pool import Settlement
from swarmrl.chain.deploy import MAX_UNBONDING_PERIOD
from swarmrl.chain.errors import ChainError, RevertedError
from swarmrl.chain.recorded_work import WorkLeaf, WorkPart
from swarmrl.chain.tokens import TOKEN
from swarmrl.chain.tx import TxSender
from swarmrl.times import date_time

from .conftest import (
    ADMIN,
    NODE_A,
    NODE_B,
    OUTSIDER,
    PROVIDER_A,
    PROVIDER_B,
    RECORDER,
    TREASURY,
    VALIDATOR,
    change_roles_after_delay,
)


def _provider_with_node(contracts, provider, node, stake):
    """Provider registers, node consents, provider adds it, stakes, and joins it to the pool."""
    p = contracts.as_account(provider)
    p.registry.register_provider()
    consent, signature = p.registry.node_consent(node, provider.address)
    p.registry.add_node(node.address, consent.deadline, signature)
    p.stakes.stake(stake)
    p.pool.join_pool(node.address)
    return p


def _signed_epoch(contracts, node, steps):
    """The node signs one submission per step; the orchestrator commits to them."""
    subs = [contracts.pool.submission(node.address, s, keccak(text=f"rollout-{s}")) for s in steps]
    sigs = [contracts.pool.sign_submission(node, s) for s in subs]
    tree = eip712.MerkleTree.from_digests([s.digest(contracts.pool.domain()) for s in subs])
    return subs, sigs, tree


def _record(contracts, accounts, epoch, *work, part=0):
    """The recorder records part `part` of `epoch` in one transaction: a leaf per
    (node, units, commitment) under the node's live membership; returns the part."""
    leaves = [
        contracts.pool.leaf(node.address, units, commitment) for node, units, commitment in work
    ]
    recorded = WorkPart(epoch, part, leaves)
    contracts.as_account(accounts[RECORDER]).pool.record_work(recorded)
    return recorded


def test_the_whole_story(contracts, accounts, w3, deployment):
    params = deployment.params
    provider_a, node_a = accounts[PROVIDER_A], accounts[NODE_A]
    provider_b, node_b = accounts[PROVIDER_B], accounts[NODE_B]
    _provider_with_node(contracts, provider_a, node_a, 100 * TOKEN)
    b = _provider_with_node(contracts, provider_b, node_b, 150 * TOKEN)
    assert contracts.registry.provider_of(node_a.address) == provider_a.address
    assert contracts.registry.nodes_of(provider_b.address) == [node_b.address]
    assert contracts.stakes.stake_of(provider_b.address) == 150 * TOKEN
    assert contracts.pool.is_joined(node_a.address)
    assert contracts.pool.is_joined(node_b.address)

    validator = contracts.as_account(accounts[VALIDATOR])
    subs_a, sigs_a, tree_a = _signed_epoch(contracts, node_a, [10, 11, 12])
    _, _, tree_b = _signed_epoch(contracts, node_b, [10, 11])
    # Epoch 1 of both nodes in one transaction, then epoch 2 of node A.
    epoch_1 = _record(contracts, accounts, 1, (node_a, 3, tree_a.root), (node_b, 2, tree_b.root))
    epoch_2 = _record(contracts, accounts, 2, (node_a, 3, tree_a.root))
    record = contracts.pool.work_of(1, node_b.address)
    assert record is not None
    assert record.ref == epoch_1.ref(node_b.address)  # rebuilt from the pool's logs
    assert (record.units, record.ref.leaf.commitment, record.reward, record.membership.penalty) == (
        2,
        tree_b.root,
        2 * params.reward_per_unit,
        params.slash_penalty,
    )
    assert (record.record.root, record.record.nodes, record.record.units) == (epoch_1.root, 2, 5)
    assert record.provider == provider_b.address
    assert record.unlocks_at == record.record.recorded_at + params.invalidation_window
    assert contracts.stakes.bonded_of(provider_b.address) == params.slash_penalty
    assert not record.invalidated
    assert not record.claimed
    assert contracts.pool.work_of(2, node_b.address) is None

    # A validator drops node A's epoch 2 within the window.
    validator.pool.invalidate(epoch_2.ref(node_a.address))
    assert contracts.pool.work_of(2, node_a.address).settlement is Settlement.INVALIDATED

    # ... and slashes node A for epoch 1 with its own signed submission as evidence.
    treasury_before = contracts.token.balance_of(accounts[TREASURY].address)
    validator_before = contracts.token.balance_of(accounts[VALIDATOR].address)
    validator.pool.slash(epoch_1.ref(node_a.address), subs_a[1], sigs_a[1], tree_a.proof(1))
    assert contracts.token.balance_of(accounts[TREASURY].address) == (
        treasury_before + params.slash_penalty
    )
    assert contracts.token.balance_of(accounts[VALIDATOR].address) == validator_before
    assert contracts.stakes.stake_of(provider_a.address) == 100 * TOKEN - params.slash_penalty
    assert contracts.pool.work_of(1, node_a.address).invalidated
    assert not contracts.pool.is_joined(node_a.address)

    # Provider B claims only once the invalidation window has passed.
    with pytest.raises(
        RevertedError, match=r"^ComputePool reverted: WindowOpen\(epoch=1, part=0, unlocksAt="
    ):
        b.pool.claim(node_b.address, [1])
    anvil_mod.increase_time(w3, params.invalidation_window + 1)
    with pytest.raises(
        RevertedError, match=r"^ComputePool reverted: WindowClosed\(epoch=1, part=0\)$"
    ):
        validator.pool.invalidate(epoch_1.ref(node_b.address))
    balance = contracts.token.balance_of(provider_b.address)
    assert b.pool.claim(node_b.address, [1]) == 2 * params.reward_per_unit
    assert contracts.token.balance_of(provider_b.address) == balance + 2 * params.reward_per_unit
    assert contracts.pool.work_of(1, node_b.address).claimed
    # By its leaf: `claim` by epoch refuses a settled one before the pool is asked.
    with pytest.raises(RevertedError, match=r"AlreadySettled\(epoch=1, part=0, node="):
        b.pool.claim_refs([epoch_1.ref(node_b.address)])

    # Unbonding: the stake backing a node stays; the rest waits out the period.
    with pytest.raises(
        RevertedError,
        match=r"^StakeManager reverted: "
        r"StakeBacksNodes\(remaining=0, required=100000000000000000000\)$",
    ):
        b.stakes.request_unbond(150 * TOKEN)
    b.stakes.request_unbond(50 * TOKEN)
    assert contracts.stakes.unbonding_of(provider_b.address).total == 50 * TOKEN
    with pytest.raises(RevertedError, match=r"^StakeManager reverted: NothingToWithdraw\(\)$"):
        b.stakes.withdraw()
    anvil_mod.increase_time(w3, params.unbonding_period + 1)
    assert contracts.stakes.unbonding_of(provider_b.address).withdrawable == 50 * TOKEN
    balance = contracts.token.balance_of(provider_b.address)
    assert b.stakes.withdraw() == 50 * TOKEN
    assert contracts.token.balance_of(provider_b.address) == balance + 50 * TOKEN

    history = contracts.history(provider_b.address)
    names = [e.name for e in history if e.contract != "StakeToken"]
    for expected in ("ProviderRegistered", "NodeAdded", "Staked", "NodeJoined", "RewardClaimed"):
        assert expected in names
    assert names[-2:] == ["UnbondRequested", "Withdrawn"]
    assert history[-1].name == "Transfer"  # the withdrawal's token transfer, last
    assert "NodeSlashed" in [e.name for e in contracts.history(node_a.address)]


def test_contract_digests_match_ours(contracts, accounts):
    node = accounts[NODE_A]
    consent = eip712.NodeConsent(accounts[PROVIDER_A].address, node.address, 0, 2_000_000_000)
    assert contracts.registry.consent_digest(consent) == consent.digest(contracts.registry.domain())
    sub = contracts.pool.submission(node.address, 2**63, keccak(text="x"))
    assert contracts.pool.submission_digest(sub) == sub.digest(contracts.pool.domain())


def test_a_replayed_consent_is_rejected(contracts, accounts):
    provider, node = accounts[PROVIDER_A], accounts[NODE_A]
    p = contracts.as_account(provider)
    p.registry.register_provider()
    consent, signature = p.registry.node_consent(node, provider.address)
    p.registry.add_node(node.address, consent.deadline, signature)
    p.registry.remove_node(node.address)
    with pytest.raises(
        RevertedError, match=rf"^ProviderRegistry reverted: BadConsent\(node={node.address}\)$"
    ):
        p.registry.add_node(node.address, consent.deadline, signature)


def test_a_consent_for_another_chain_is_rejected(contracts, accounts):
    provider, node = accounts[PROVIDER_A], accounts[NODE_A]
    p = contracts.as_account(provider)
    p.registry.register_provider()
    consent = eip712.NodeConsent(provider.address, node.address, 0, contracts.chain_time() + 60)
    other_chain = eip712.registry_domain(84532, contracts.registry.address)
    signature = eip712.sign_consent(node, consent, other_chain)
    with pytest.raises(RevertedError, match=r"BadConsent\(node="):
        p.registry.add_node(node.address, consent.deadline, signature)


def test_a_consent_signed_by_someone_else_or_expired_is_rejected(contracts, accounts, w3):
    provider, node = accounts[PROVIDER_A], accounts[NODE_A]
    p = contracts.as_account(provider)
    p.registry.register_provider()
    consent = eip712.NodeConsent(provider.address, node.address, 0, contracts.chain_time() + 60)
    forged = eip712.sign_digest(accounts[OUTSIDER], consent.digest(contracts.registry.domain()))
    with pytest.raises(RevertedError, match=r"BadConsent"):
        p.registry.add_node(node.address, consent.deadline, forged)
    signature = eip712.sign_consent(node, consent, contracts.registry.domain())
    anvil_mod.increase_time(w3, 120)
    when = re.escape(date_time(consent.deadline))
    with pytest.raises(RevertedError, match=rf"ConsentExpired\(deadline={when} \([^)]+ ago\)\)"):
        p.registry.add_node(node.address, consent.deadline, signature)


def test_slashing_with_bad_evidence_is_rejected(contracts, accounts):
    node = accounts[NODE_A]
    _provider_with_node(contracts, accounts[PROVIDER_A], node, 100 * TOKEN)
    subs, sigs, tree = _signed_epoch(contracts, node, [1, 2])
    ref = _record(contracts, accounts, 1, (node, 2, tree.root)).ref(node.address)
    validator = contracts.as_account(accounts[VALIDATOR])

    forged = replace(ref, leaf=replace(ref.leaf, units=20))  # no longer the recorded leaf
    with pytest.raises(
        RevertedError,
        match=rf"^ComputePool reverted: NotInRecord\(epoch=1, part=0, node={node.address}\)$",
    ):
        validator.pool.slash(forged, subs[0], sigs[0], tree.proof(0))
    by_other_key = eip712.sign_digest(accounts[OUTSIDER], subs[0].digest(contracts.pool.domain()))
    with pytest.raises(RevertedError, match=r"^ComputePool reverted: BadSignature\(\)$"):
        validator.pool.slash(ref, subs[0], by_other_key, tree.proof(0))
    # The node's own signature in the other forms plain ECDSA recovers it from (the
    # high-s twin, v as 0 or 1) is no evidence on chain, so swarmrl takes none of them
    # as the node's either: else a node could sign work no slash would ever accept.
    for bent in (malleable_twin(sigs[0]), sigs[0][:64] + bytes([sigs[0][64] - 27])):
        with pytest.raises(RevertedError, match=r"^ComputePool reverted: BadSignature\(\)$"):
            validator.pool.slash(ref, subs[0], bent, tree.proof(0))
        assert eip712.signer_of(subs[0].digest(contracts.pool.domain()), bent.hex()) is None
    assert eip712.signer_of(subs[0].digest(contracts.pool.domain()), sigs[0].hex()) == node.address
    stray = contracts.pool.submission(node.address, 9, keccak(text="never committed"))
    with pytest.raises(RevertedError, match=r"^ComputePool reverted: NotInCommitment\(\)$"):
        validator.pool.slash(ref, stray, contracts.pool.sign_submission(node, stray), tree.proof(0))
    other_run = eip712.Submission(keccak(text="other"), node.address, 1, subs[0].rollout_digest)
    with pytest.raises(RevertedError, match=r"WrongRun\("):
        validator.pool.slash(ref, other_run, sigs[0], tree.proof(0))
    assert contracts.stakes.stake_of(accounts[PROVIDER_A].address) == 100 * TOKEN


def test_a_membership_is_slashed_once_and_forfeits_its_other_epochs(
    contracts, accounts, deployment, w3
):
    node, provider = accounts[NODE_A], accounts[PROVIDER_A]
    p = _provider_with_node(contracts, provider, node, 300 * TOKEN)
    subs, sigs, tree = _signed_epoch(contracts, node, [1, 2, 3])
    first = _record(contracts, accounts, 1, (node, 3, tree.root)).ref(node.address)
    other = _record(contracts, accounts, 2, (node, 2, tree.root)).ref(node.address)
    # A slash in the second the epochs were recorded in would end the membership before
    # them (the pool tells by the second; anvil mines this fast within one).
    anvil_mod.increase_time(w3, 1)
    validator = contracts.as_account(accounts[VALIDATOR])
    validator.pool.slash(first, subs[0], sigs[0], tree.proof(0))
    # The other submissions, in either epoch, are as valid evidence, but the membership
    # had its penalty.
    for ref, i in ((first, 1), (first, 2), (other, 1)):
        with pytest.raises(
            RevertedError,
            match=rf"^ComputePool reverted: AlreadySlashed\(node={node.address}, membership=1\)$",
        ):
            validator.pool.slash(ref, subs[i], sigs[i], tree.proof(i))
    penalty = deployment.params.slash_penalty
    assert contracts.stakes.stake_of(provider.address) == 300 * TOKEN - penalty
    # A slashed membership owes nothing more.
    assert contracts.stakes.bonded_of(provider.address) == 0

    # Epoch 2 was never invalidated, yet it forfeited its reward with the membership.
    work = contracts.pool.work_of(2, node.address)
    assert (work.settlement, work.slashed, work.invalidated) == (Settlement.OPEN, True, True)
    anvil_mod.increase_time(w3, deployment.params.invalidation_window + 1)
    with pytest.raises(RevertedError, match=r"^ComputePool reverted: AlreadySlashed\("):
        p.pool.claim_refs([other])
    available = contracts.pool.available_rewards()
    contracts.as_account(accounts[OUTSIDER]).pool.release(other)  # anyone may return it
    assert contracts.pool.available_rewards() == available + work.reward
    assert contracts.pool.settlement_of(2, 0, node.address) is Settlement.RELEASED


def test_roles_are_enforced(contracts, accounts):
    node = accounts[NODE_A]
    _provider_with_node(contracts, accounts[PROVIDER_A], node, 100 * TOKEN)
    outsider = contracts.as_account(accounts[OUTSIDER])
    with pytest.raises(
        RevertedError,
        match=rf"^ComputePool reverted: AccessControlUnauthorizedAccount\(account="
        rf"{accounts[OUTSIDER].address}, neededRole=0x",
    ):
        outsider.pool.record_work(WorkPart(1, 0, [contracts.pool.leaf(node.address, 1, bytes(32))]))
    with pytest.raises(RevertedError, match=r"NotNodeProvider\("):
        outsider.pool.join_pool(node.address)


def test_stake_with_permit_and_insufficient_unbond(contracts, accounts):
    provider = contracts.as_account(accounts[PROVIDER_A])
    provider.registry.register_provider()
    provider.stakes.stake(30 * TOKEN, permit=True)
    assert contracts.stakes.stake_of(accounts[PROVIDER_A].address) == 30 * TOKEN
    with pytest.raises(
        RevertedError,
        match=r"^StakeManager reverted: InsufficientStake\(available=30000000000000000000, "
        r"requested=40000000000000000000\)$",
    ):
        provider.stakes.request_unbond(40 * TOKEN)


def test_nonce_resync_after_another_sender_used_the_key(contracts, accounts):
    provider = accounts[PROVIDER_A]
    first = contracts.as_account(provider)
    second = TxSender(contracts.w3, provider, contracts.decoder)
    first.token.approve(contracts.pool.address, 1)  # caches first's nonce
    second.transact(
        contracts.token.contract.functions.approve(contracts.pool.address, 2), "StakeToken"
    )
    first.token.approve(contracts.pool.address, 3)  # stale nonce: the node says so, first resyncs
    assert contracts.token.allowance(provider.address, contracts.pool.address) == 3


def test_a_quorum_of_validators_invalidates(contracts, accounts):
    node = accounts[NODE_A]
    _provider_with_node(contracts, accounts[PROVIDER_A], node, 100 * TOKEN)
    admin = contracts.as_account(accounts[ADMIN])
    change_roles_after_delay(contracts, accounts, "VALIDATOR_ROLE", OUTSIDER)
    assert contracts.pool.has_role("VALIDATOR_ROLE", accounts[OUTSIDER].address)
    admin.pool.set_quorum(2)
    ref = _record(contracts, accounts, 1, (node, 4, bytes(32))).ref(node.address)
    reserved = contracts.pool.reserved_rewards()

    first = contracts.as_account(accounts[VALIDATOR])
    first.pool.invalidate(ref)
    assert not contracts.pool.work_of(1, node.address).invalidated
    with pytest.raises(
        RevertedError, match=rf"AlreadyVoted\(validator={accounts[VALIDATOR].address}\)"
    ):
        first.pool.invalidate(ref)
    contracts.as_account(accounts[OUTSIDER]).pool.invalidate(ref)
    assert contracts.pool.work_of(1, node.address).invalidated
    assert (
        contracts.pool.reserved_rewards()
        == reserved - contracts.pool.work_of(1, node.address).reward
    )


def test_the_pool_accepts_our_proof_for_every_leaf(contracts, accounts):
    """On-chain MerkleProof agrees with our tree at every position, odd leaves included."""
    node = accounts[NODE_A]
    _provider_with_node(contracts, accounts[PROVIDER_A], node, 100 * TOKEN)
    admin = contracts.as_account(accounts[ADMIN])
    change_roles_after_delay(contracts, accounts, "VALIDATOR_ROLE", OUTSIDER)
    admin.pool.set_quorum(2)  # one vote checks evidence, slashes nothing
    subs, sigs, tree = _signed_epoch(contracts, node, range(5))
    ref = _record(contracts, accounts, 3, (node, 5, tree.root)).ref(node.address)
    validator = contracts.as_account(accounts[VALIDATOR])
    for i in range(5):
        receipt = validator.pool.slash(ref, subs[i], sigs[i], tree.proof(i))
        (vote,) = contracts.pool.contract.events.SlashVoted().process_receipt(receipt)
        assert vote["args"]["digest"] == subs[i].digest(contracts.pool.domain())
    assert contracts.stakes.stake_of(accounts[PROVIDER_A].address) == 100 * TOKEN
    assert [e.name for e in contracts.history(node.address, chunk=2)].count("SlashVoted") == 5


def test_our_parts_are_the_pools_and_rebuild_from_its_logs(contracts, accounts, w3, deployment):
    """Python's part root is the one `rootOf` computes and `recordWork` stores, at every
    size that leaves a level odd; the parts rebuilt from the logs prove a leaf for a claim."""
    node_a, node_b = accounts[NODE_A], accounts[NODE_B]
    a = _provider_with_node(contracts, accounts[PROVIDER_A], node_a, 100 * TOKEN)
    b = _provider_with_node(contracts, accounts[PROVIDER_B], node_b, 100 * TOKEN)
    # Nodes that never joined: the pool records their leaves, but never pays them.
    strangers = [
        WorkLeaf(to_checksum_address(keccak(text=f"stranger {i}")[:20]), 1, 1 + i, bytes(32))
        for i in range(18)
    ]
    mine = [contracts.pool.leaf(n.address, 4, keccak(text=n.address)) for n in (node_a, node_b)]
    # Parts of 1, 2, 3, 5 and 9 leaves, as parts_of would cut them: each node in one part.
    sizes = [strangers[:1], strangers[1:3], strangers[3:6], strangers[6:11], strangers[11:] + mine]
    recorder = contracts.as_account(accounts[RECORDER])
    parts = []
    for k, leaves in enumerate(sizes):
        part = WorkPart(7, k, leaves)
        tuples = [leaf.as_tuple() for leaf in part.leaves]
        assert bytes(contracts.pool.contract.functions.rootOf(tuples).call()) == part.root
        recorder.pool.record_work(part)
        assert contracts.pool.record_of(7, k).root == part.root
        assert (contracts.pool.record_of(7, k).nodes, contracts.pool.record_of(7, k).units) == (
            len(leaves),
            part.units,
        )
        parts.append(part)

    rebuilt = contracts.pool.recorded_parts(7)
    assert [(p.part, p.leaves, p.root) for p in rebuilt] == [
        (p.part, p.leaves, p.root) for p in parts
    ]
    assert [p.part for p in contracts.pool.recorded_parts(7, node_a.address)] == [4]
    anvil_mod.increase_time(w3, deployment.params.invalidation_window + 1)
    per_unit = deployment.params.reward_per_unit
    assert a.pool.claim_refs([rebuilt[4].ref(node_a.address)]) == 4 * per_unit
    assert b.pool.claim(node_b.address, [7]) == 4 * per_unit  # its ref found in the logs
    available = contracts.pool.available_rewards()
    contracts.as_account(accounts[OUTSIDER]).pool.release(rebuilt[3].ref(strangers[8].node))
    assert contracts.pool.available_rewards() == available + strangers[8].units * per_unit


def test_funding_leaving_and_work_recorded_after_the_node_left(contracts, accounts, w3):
    """Work recorded under a membership that had ended (a recorder's stale view) is
    never paid nor slashed, and anyone may return its reward to the budget."""
    node, provider = accounts[NODE_A], accounts[PROVIDER_A]
    p = _provider_with_node(contracts, provider, node, 100 * TOKEN)
    available = contracts.pool.available_rewards()
    contracts.as_account(accounts[OUTSIDER]).pool.fund(25 * TOKEN)  # anyone may fund
    assert contracts.pool.available_rewards() == available + 25 * TOKEN
    with pytest.raises(RevertedError, match=r"^ComputePool reverted: ZeroAmount\(\)$"):
        contracts.as_account(accounts[OUTSIDER]).pool.fund(0)

    subs, sigs, tree = _signed_epoch(contracts, node, [1])
    stale = contracts.pool.leaf(node.address, 2, tree.root)
    contracts.as_account(node).pool.leave_pool(node.address)  # a node may leave on its own
    assert not contracts.pool.is_joined(node.address)
    with pytest.raises(ChainError, match=rf"^node {node.address} is not in the pool; "):
        contracts.pool.leaf(node.address, 2, tree.root)
    part = WorkPart(1, 0, [stale])
    contracts.as_account(accounts[RECORDER]).pool.record_work(part)
    ref = part.ref(node.address)
    work = contracts.pool.work_of(1, node.address)
    assert (work.provider, work.invalidated) == (None, False)  # open, but nobody's to claim

    not_backed = rf"^ComputePool reverted: NotBacked\(node={node.address}, membership=1\)$"
    with pytest.raises(RevertedError, match=not_backed):
        contracts.as_account(accounts[VALIDATOR]).pool.slash(ref, subs[0], sigs[0], tree.proof(0))
    anvil_mod.increase_time(w3, contracts.deployment.params.invalidation_window + 1)
    with pytest.raises(RevertedError, match=not_backed):
        p.pool.claim_refs([ref])
    available = contracts.pool.available_rewards()
    contracts.as_account(accounts[OUTSIDER]).pool.release(ref)
    assert contracts.pool.available_rewards() == available + work.reward
    assert contracts.pool.work_of(1, node.address).settlement is Settlement.RELEASED
    assert contracts.stakes.stake_of(provider.address) == 100 * TOKEN


def test_the_stake_behind_recorded_work_stays_until_its_window_ends(contracts, accounts, w3):
    """The attack: take the node out and unbond everything while its work is slashable."""
    provider, node = accounts[PROVIDER_A], accounts[NODE_A]
    p = _provider_with_node(contracts, provider, node, 100 * TOKEN)
    penalty = contracts.deployment.params.slash_penalty
    assert contracts.stakes.bonded_of(provider.address) == penalty  # joined: bonded, work or not
    _record(contracts, accounts, 1, (node, 1, bytes(32)))
    anvil_mod.increase_time(w3, 1)  # the leave comes a second after the record
    p.pool.leave_pool(node.address)
    p.registry.remove_node(node.address)
    assert contracts.pool.work_of(1, node.address).provider == provider.address  # still slashable
    assert contracts.stakes.bonded_of(provider.address) == penalty
    with pytest.raises(
        RevertedError,
        match=r"^StakeManager reverted: "
        r"StakeBacksWork\(remaining=0, bonded=50000000000000000000\)$",
    ):
        p.stakes.request_unbond(100 * TOKEN)
    p.stakes.request_unbond(50 * TOKEN)  # what no work needs may go
    anvil_mod.increase_time(w3, contracts.deployment.params.invalidation_window)
    assert contracts.stakes.bonded_of(provider.address) == 0
    p.stakes.request_unbond(50 * TOKEN)
    assert contracts.stakes.stake_of(provider.address) == 0


def test_one_signed_submission_is_evidence_for_one_penalty(contracts, accounts):
    """The attack: a recorder commits the same signed leaf again, under the node's next
    membership, once the first was slashed."""
    node = accounts[NODE_A]
    p = _provider_with_node(contracts, accounts[PROVIDER_A], node, 200 * TOKEN)
    subs, sigs, tree = _signed_epoch(contracts, node, [1])
    first = _record(contracts, accounts, 1, (node, 1, tree.root)).ref(node.address)
    validator = contracts.as_account(accounts[VALIDATOR])
    validator.pool.slash(first, subs[0], sigs[0], tree.proof(0))
    p.pool.join_pool(node.address)
    again = _record(contracts, accounts, 2, (node, 1, tree.root)).ref(node.address)
    assert again.leaf.membership == 2
    digest = "0x" + subs[0].digest(contracts.pool.domain()).hex()
    with pytest.raises(
        RevertedError, match=rf"^ComputePool reverted: EvidenceUsed\(digest={digest}\)$"
    ):
        validator.pool.slash(again, subs[0], sigs[0], tree.proof(0))
    assert contracts.stakes.stake_of(accounts[PROVIDER_A].address) == 150 * TOKEN


def test_a_revoked_validators_vote_stops_counting(contracts, accounts, w3):
    node = accounts[NODE_A]
    _provider_with_node(contracts, accounts[PROVIDER_A], node, 100 * TOKEN)
    admin = contracts.as_account(accounts[ADMIN])
    change_roles_after_delay(contracts, accounts, "VALIDATOR_ROLE", OUTSIDER, TREASURY)
    admin.pool.set_quorum(2)
    revoked = accounts[VALIDATOR].address
    with pytest.raises(RevertedError, match=r"^ComputePool reverted: RoleChangeDelayed\("):
        admin.pool.revoke_role("VALIDATOR_ROLE", revoked)
    admin.pool.schedule_role_change("VALIDATOR_ROLE", revoked, grant=False)
    grant, due = contracts.pool.pending_role_change("VALIDATOR_ROLE", revoked)
    assert not grant
    anvil_mod.increase_time(w3, due - contracts.chain_time() - 300)
    ref = _record(contracts, accounts, 1, (node, 1, bytes(32))).ref(node.address)
    contracts.as_account(accounts[VALIDATOR]).pool.invalidate(ref)
    with pytest.raises(RevertedError, match=r"^ComputePool reverted: RoleChangeNotDue\("):
        admin.pool.apply_role_change("VALIDATOR_ROLE", revoked)
    anvil_mod.increase_time(w3, 300)
    contracts.as_account(accounts[OUTSIDER]).pool.apply_role_change("VALIDATOR_ROLE", revoked)
    assert not contracts.pool.has_role("VALIDATOR_ROLE", revoked)
    contracts.as_account(accounts[OUTSIDER]).pool.invalidate(ref)
    assert not contracts.pool.work_of(1, node.address).invalidated  # one current vote
    contracts.as_account(accounts[TREASURY]).pool.invalidate(ref)
    assert contracts.pool.work_of(1, node.address).invalidated


def test_a_validator_appointed_later_slashes_only_once_stakers_could_leave(contracts, accounts, w3):
    """The deployment's validators vote at once; one the admin appoints later (here an
    outsider, as the admin could appoint itself) holds the role only once the pool's
    delay has passed, and even then the penalty goes to the treasury."""
    node, newcomer = accounts[NODE_A], accounts[OUTSIDER]
    _provider_with_node(contracts, accounts[PROVIDER_A], node, 200 * TOKEN)
    admin = contracts.as_account(accounts[ADMIN])
    with pytest.raises(RevertedError, match=r"^ComputePool reverted: RoleChangeDelayed\("):
        admin.pool.grant_role("VALIDATOR_ROLE", newcomer.address)
    admin.pool.schedule_role_change("VALIDATOR_ROLE", newcomer.address)
    subs, sigs, tree = _signed_epoch(contracts, node, [1, 2])
    early = _record(contracts, accounts, 1, (node, 2, tree.root)).ref(node.address)
    with pytest.raises(
        RevertedError,
        match=r"^ComputePool reverted: AccessControlUnauthorizedAccount\("
        rf"account={newcomer.address}, ",
    ):
        contracts.as_account(newcomer).pool.slash(early, subs[0], sigs[0], tree.proof(0))
    with pytest.raises(
        RevertedError,
        match=r"^ComputePool reverted: RoleChangeNotDue\(role=0x[0-9a-f]{64}, "
        rf"account={newcomer.address}, effectiveAt=\S+ \S+ UTC \(in 6[01] d",
    ):
        contracts.as_account(newcomer).pool.apply_role_change("VALIDATOR_ROLE", newcomer.address)
    assert contracts.stakes.stake_of(accounts[PROVIDER_A].address) == 200 * TOKEN

    delay = contracts.pool.change_delay()
    assert delay > 2 * MAX_UNBONDING_PERIOD  # the longest window plus the longest unbonding
    anvil_mod.increase_time(w3, delay)
    contracts.as_account(newcomer).pool.apply_role_change("VALIDATOR_ROLE", newcomer.address)
    later = _record(contracts, accounts, 2, (node, 2, tree.root)).ref(node.address)
    before = [contracts.token.balance_of(a.address) for a in (accounts[TREASURY], newcomer)]
    contracts.as_account(newcomer).pool.slash(later, subs[0], sigs[0], tree.proof(0))
    penalty = contracts.deployment.params.slash_penalty
    assert contracts.stakes.stake_of(accounts[PROVIDER_A].address) == 200 * TOKEN - penalty
    after = [contracts.token.balance_of(a.address) for a in (accounts[TREASURY], newcomer)]
    assert after == [before[0] + penalty, before[1]]


def test_the_admin_cannot_set_a_quorum_above_the_validators(contracts, accounts):
    with pytest.raises(
        RevertedError, match=r"^ComputePool reverted: BadQuorum\(quorum=2, validators=1\)$"
    ):
        contracts.as_account(accounts[ADMIN]).pool.set_quorum(2)


def test_a_node_revokes_a_consent_it_has_not_used(contracts, accounts):
    provider, node = accounts[PROVIDER_A], accounts[NODE_A]
    p = contracts.as_account(provider)
    p.registry.register_provider()
    consent, signature = p.registry.node_consent(node, provider.address)
    contracts.as_account(node).registry.revoke_consent()
    with pytest.raises(RevertedError, match=rf"BadConsent\(node={node.address}\)"):
        p.registry.add_node(node.address, consent.deadline, signature)
