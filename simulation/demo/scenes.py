"""`swarmrl demo --scene NAME`: one part of the system at a time, each run for real on
this machine with the embedded defaults, saying what it showed.

The whole loop (the default of `swarmrl demo`) is simulation/demo/loop.py.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import typer
from eth_account.signers.local import LocalAccount

from swarmrl import shards, toploc

if TYPE_CHECKING:
    from web3 import Web3

    from swarmrl.chain.anvil import Anvil
    from swarmrl.chain.contracts import Contracts
    from swarmrl.chain.deploy import Deployment, ProtocolParams
    from swarmrl.chain.recorded_work import WorkPart
    from swarmrl.eip712 import Domain, MerkleTree, Submission
    from swarmrl.weights.peer import SwarmNode


def _say(text: str) -> None:
    typer.echo(text)


def _ms(start: float) -> str:
    return f"{(time.perf_counter() - start) * 1e3:.1f} ms"


def _toploc_stage() -> None:
    import torch

    _say("[toploc] a volunteer proves the hidden states of 1024 generated tokens (4096 wide)")
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(1024, 4096, generator=gen)
    start = time.perf_counter()
    proofs = toploc.build_proofs(hidden)
    size = sum(map(len, proofs))
    _say(f"  {len(proofs)} proofs ({size} bytes for 8 MiB of activations) in {_ms(start)}")

    rerun = hidden * (1 + 1e-3 * torch.randn(hidden.shape, generator=gen))
    start = time.perf_counter()
    verdicts = toploc.verify_proofs(rerun, proofs)
    accepted = sum(v.accepted for v in verdicts)
    _say(
        f"  validator on other hardware: {accepted}/{len(verdicts)} chunks accepted ({_ms(start)})"
    )

    cheat = torch.randn(hidden.shape, generator=gen)
    cheat[:512] = hidden[:512]  # honest for half the tokens, then a cheaper model
    chunks = [v.accepted for v in toploc.verify_proofs(cheat, proofs)]
    _say(
        f"  cheater who swapped models after token 512: {sum(chunks[:16])}/16 chunks before "
        f"accepted, {16 - sum(chunks[16:])}/16 after rejected"
    )


def _shards_stage(workdir: Path) -> None:
    size = 96 * 2**20
    shard_size = 16 * 2**20
    sizes = f"{size >> 20} MiB checkpoint in {shard_size >> 20} MiB shards"
    _say(f"[shards] the trainer publishes a {sizes}")
    checkpoint = workdir / "model.safetensors"
    rng = np.random.default_rng(0)
    checkpoint.write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())

    start = time.perf_counter()
    manifest = shards.build_manifest(checkpoint, model="demo", step=1, shard_size=shard_size)
    _say(
        f"  manifest: {len(manifest.shard_hashes)} shards, root {manifest.root[:16]}... "
        f"({_ms(start)}, {len(manifest.to_json())} bytes of canonical JSON)"
    )
    store = workdir / "received"
    shards.split(checkpoint, store, manifest)

    bad_index = 2
    good = shards.read_shard(checkpoint, manifest, bad_index)
    corrupted = bytearray(good)
    corrupted[12345] ^= 0x01
    try:
        shards.verify_shard(manifest, bad_index, bytes(corrupted))
    except ValueError as e:
        _say(f"  a peer sends shard {bad_index} with one bit flipped: refused ({e})")
    start = time.perf_counter()
    out = shards.reassemble(store, manifest, workdir / "pulled" / checkpoint.name)
    same = out.read_bytes() == checkpoint.read_bytes()
    _say(f"  node reassembles from verified shards: whole-file check passed, identical={same}")


# The swarm scene's checkpoint: random bytes, in shards small enough that four nodes
# share the work.
SWARM_CHECKPOINT_BYTES = 96 * 2**20
SWARM_SHARD_BYTES = 8 * 2**20


@dataclass
class _Peers:
    """The swarm scene's peers on one run's domain, each closed at the end of the scene;
    `events` is what each heard, by name."""

    workdir: Path
    domain: Domain
    run: str
    origin_key: LocalAccount
    events: list[str] = field(default_factory=list)
    nodes: list[SwarmNode] = field(default_factory=list)

    def node(
        self, name: str, bootstrap: list[str], account: LocalAccount | None = None
    ) -> SwarmNode:
        """A peer trusting the origin's key; with `account`, an origin others dial."""
        from libp2p.crypto.ed25519 import create_new_key_pair

        from swarmrl.weights.peer import SwarmNode
        from swarmrl.weights.store import WeightStore

        made = SwarmNode.standalone(
            store=WeightStore(self.workdir / "swarm" / name),
            domain=self.domain,
            run=self.run,
            trusted=[self.origin_key.address],
            peer_key=create_new_key_pair(),
            account=account,
            reachable=account is not None,  # an origin: the address the others dial
            bootstrap=bootstrap,
            on_event=lambda e: self.events.append(f"{name}: {e.kind} {e.detail}"),
        )
        self.nodes.append(made)
        return made

    def close(self) -> None:
        for n in self.nodes:
            n.close()


def _swarm_stage(workdir: Path, deployment: Deployment, origin_key: LocalAccount) -> None:
    from swarmrl.eip712 import swarm_domain
    from swarmrl.p2p.host import quiet_libp2p_logs

    quiet_libp2p_logs()
    logging.getLogger("swarmrl.p2p").setLevel(logging.ERROR)  # the demo says it itself
    size = SWARM_CHECKPOINT_BYTES
    _say(f"[swarm] the orchestrator broadcasts a {size >> 20} MiB checkpoint over libp2p")
    checkpoint = workdir / "swarm" / "model.safetensors"
    checkpoint.parent.mkdir()
    checkpoint.write_bytes(np.random.default_rng(1).integers(0, 256, size, np.uint8).tobytes())
    domain = swarm_domain(deployment.chain_id, deployment.contracts.compute_pool)
    peers = _Peers(workdir, domain, deployment.run_id, origin_key)
    try:
        origin, volunteers, copy = _broadcast(peers, checkpoint, deployment.chain_id)
        newcomer = _catch_a_bad_node(peers, checkpoint, origin, volunteers, copy)
        _reject_an_impostor(peers, checkpoint, newcomer)
    finally:
        peers.close()


def _broadcast(
    peers: _Peers, checkpoint: Path, chain_id: int
) -> tuple[SwarmNode, list[SwarmNode], Path]:
    """The origin publishes the checkpoint and four nodes fetch it from it and each
    other: the origin, the nodes and the first node's copy."""
    origin = peers.node("origin", [], peers.origin_key)
    volunteers = [peers.node(f"node{i}", origin.addrs) for i in range(4)]
    start = time.perf_counter()
    origin.publish(checkpoint, model="demo", step=1, shard_size=SWARM_SHARD_BYTES)
    copies = [v.wait_for(1, timeout=120).path for v in volunteers]
    same = all(c.read_bytes() == checkpoint.read_bytes() for c in copies)
    served = [n.server.bytes_served if n.server else 0 for n in (origin, *volunteers)]
    _say(
        f"  manifest signed by {peers.origin_key.address[:10]}... (EIP-712, chain "
        f"{chain_id}, this run's pool); 4 nodes hold a verified copy after "
        f"{_ms(start)}, identical={same}; the origin sent {served[0] / sum(served):.0%} "
        "of the bytes, the nodes the rest"
    )
    return origin, volunteers, copies[0]


def _catch_a_bad_node(
    peers: _Peers,
    checkpoint: Path,
    origin: SwarmNode,
    volunteers: list[SwarmNode],
    copy: Path,
) -> SwarmNode:
    """Node 0's copy turns bad and everyone else leaves; a newcomer that reaches only it
    bans it, then gets a good copy from node 1 back from a restart: the newcomer."""
    liar = volunteers[0]
    with open(copy, "r+b") as f:  # node 0 turns bad: one flipped bit per shard
        for offset in range(0, SWARM_CHECKPOINT_BYTES, SWARM_SHARD_BYTES):
            f.seek(offset)
            byte = f.read(1)[0]
            f.seek(offset)
            f.write(bytes([byte ^ 1]))
    for honest in (origin, *volunteers[1:]):
        honest.close()
    newcomer = peers.node("newcomer", liar.addrs)
    deadline = time.monotonic() + 60
    while not newcomer.book.is_banned(liar.peer_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    banned = newcomer.book.is_banned(liar.peer_id)
    # node1 restarts: its store re-checks the copy on disk and seeds it again.
    back = peers.node("node1", [])
    newcomer.join(back.addrs[0])
    got = newcomer.wait_for(1, timeout=120).path.read_bytes() == checkpoint.read_bytes()
    _say(
        f"  the origin and nodes 1-3 leave, node0 turns bad (a flipped bit per shard); a "
        f"newcomer that reaches only node0 catches each bad shard before writing it "
        f"(node0 banned={banned}), then gets a verified copy from node1, back from a "
        f"restart: identical={got}"
    )
    return newcomer


def _reject_an_impostor(peers: _Peers, checkpoint: Path, newcomer: SwarmNode) -> None:
    """A peer with a key of its own announces a step; the newcomer rejects it."""
    from eth_account import Account
    from libp2p.crypto.ed25519 import create_new_key_pair

    from swarmrl.weights.peer import SwarmNode
    from swarmrl.weights.store import WeightStore

    impostor = Account.create()
    fake = SwarmNode.standalone(
        store=WeightStore(peers.workdir / "swarm" / "impostor"),
        domain=peers.domain,
        run=peers.run,
        trusted=[impostor.address],
        peer_key=create_new_key_pair(),
        account=impostor,
        reachable=True,
    )
    peers.nodes.append(fake)
    fake.publish(checkpoint, model="demo", step=2, shard_size=SWARM_SHARD_BYTES)
    newcomer.join(fake.addrs[0])
    rejected = [e for e in peers.events if e.startswith("newcomer: rejected")]
    _say(f"  an impostor announced step 2 with its own key: {rejected[-1].split(': ', 1)[1]}")


@dataclass(frozen=True)
class _DemoChain:
    """The chain scene's protocol and who is who on it."""

    w3: Web3
    contracts: Contracts
    deployment: Deployment
    params: ProtocolParams
    recorder: LocalAccount
    validator: LocalAccount
    treasury: LocalAccount
    honest: LocalAccount
    honest_node: LocalAccount
    cheater: LocalAccount
    cheater_node: LocalAccount


# A node's signed submissions of an epoch and their Merkle tree.
_Epoch = tuple[list["Submission"], list[bytes], "MerkleTree"]


def _chain_stage() -> tuple[Deployment, LocalAccount]:
    from swarmrl.chain.anvil import Anvil

    _say("[chain] a local anvil with the protocol deployed")
    chain = Anvil.start()
    try:
        demo = _deploy_demo(chain)
        _stake_two_providers(demo)
        part, epochs = _record_an_epoch(demo)
        _cheater_cannot_unbond(demo)
        _slash_the_cheater(demo, part, epochs[demo.cheater_node.address])
        _honest_claims_and_withdraws(demo)
        return demo.deployment, demo.recorder
    finally:
        chain.stop()


def _deploy_demo(chain: Anvil) -> _DemoChain:
    """The protocol deployed with a day's invalidation window and a week's unbonding."""
    from swarmrl.chain.anvil import dev_accounts
    from swarmrl.chain.contracts import Contracts
    from swarmrl.chain.deploy import (
        DEV_RECORDER,
        DEV_TREASURY,
        DEV_VALIDATOR,
        ProtocolParams,
        deploy_dev,
        run_id_from_name,
    )
    from swarmrl.chain.tokens import TOKEN

    w3 = chain.web3()
    accounts = dev_accounts()
    recorder, validator, treasury = (
        accounts[i] for i in (DEV_RECORDER, DEV_VALIDATOR, DEV_TREASURY)
    )
    honest, honest_node, cheater, cheater_node = accounts[DEV_TREASURY + 1 :][:4]
    params = ProtocolParams(invalidation_window=24 * 3600, unbonding_period=7 * 24 * 3600)
    deployment = deploy_dev(
        chain,
        run_id=run_id_from_name("demo"),
        params=params,
        tokens_each=1_000 * TOKEN,
        pool_funding=10_000 * TOKEN,
    )
    contracts = Contracts(w3, deployment)
    _say(f"  contracts at {deployment.contracts.compute_pool} (run 'demo'), {chain.rpc_url}")
    return _DemoChain(
        w3,
        contracts,
        deployment,
        params,
        recorder,
        validator,
        treasury,
        honest,
        honest_node,
        cheater,
        cheater_node,
    )


def _stake_two_providers(demo: _DemoChain) -> None:
    """Each provider registers, adds its node with the node's consent, stakes and joins."""
    from swarmrl.chain.tokens import TOKEN

    for provider, node in ((demo.honest, demo.honest_node), (demo.cheater, demo.cheater_node)):
        p = demo.contracts.as_account(provider)
        p.registry.register_provider()
        consent, signature = p.registry.node_consent(node, provider.address)
        p.registry.add_node(node.address, consent.deadline, signature)
        p.stakes.stake(150 * TOKEN, permit=True)
        p.pool.join_pool(node.address)
    _say("  two providers staked 150 SRL each; their nodes consented and joined the pool")


def _record_an_epoch(demo: _DemoChain) -> tuple[WorkPart, dict[str, _Epoch]]:
    """The orchestrator records epoch 1, three signed submissions per node: the part
    recorded and each node's epoch, by address."""
    from eth_utils import keccak

    from swarmrl import eip712
    from swarmrl.chain.recorded_work import WorkPart

    contracts = demo.contracts
    epochs: dict[str, _Epoch] = {}
    leaves = []
    for node in (demo.honest_node, demo.cheater_node):
        subs = [
            contracts.pool.submission(node.address, s, keccak(text=f"{node.address}{s}"))
            for s in (1, 2, 3)
        ]
        sigs = [contracts.pool.sign_submission(node, sub) for sub in subs]
        tree = eip712.MerkleTree.from_digests([sub.digest(contracts.pool.domain()) for sub in subs])
        leaves.append(contracts.pool.leaf(node.address, len(subs), tree.root))
        epochs[node.address] = (subs, sigs, tree)
    part = WorkPart(1, 0, leaves)
    contracts.as_account(demo.recorder).pool.record_work(part)
    _say(
        "  the orchestrator recorded epoch 1 (3 signed rollouts per node) in one "
        "transaction, paying the gas"
    )
    return part, epochs


def _cheater_cannot_unbond(demo: _DemoChain) -> None:
    """The cheater takes its node out and tries to unbond everything: refused."""
    from swarmrl.chain import anvil as anvil_mod
    from swarmrl.chain.errors import RevertedError
    from swarmrl.chain.tokens import TOKEN

    # A minute on: a leave in the second of a record counts as before it, and this
    # chain mines the whole scene within one.
    anvil_mod.increase_time(demo.w3, 60)
    dodge = demo.contracts.as_account(demo.cheater)
    dodge.pool.leave_pool(demo.cheater_node.address)
    dodge.registry.remove_node(demo.cheater_node.address)
    try:
        dodge.stakes.request_unbond(150 * TOKEN)
    except RevertedError as e:
        bonded = e.args_by_name["bonded"] // TOKEN
    else:
        raise RuntimeError("the stake behind recorded work could be unbonded")
    _say(
        f"  the cheater took its node out and tried to unbond all 150 SRL: refused, "
        f"{bonded} SRL stays bonded until the epoch's invalidation window ends"
    )


def _slash_the_cheater(demo: _DemoChain, part: WorkPart, epoch: _Epoch) -> None:
    """A validator slashes with one of the cheater's own signed submissions."""
    from swarmrl.chain.tokens import TOKEN

    contracts = demo.contracts
    subs, sigs, tree = epoch
    before = (
        contracts.token.balance_of(demo.treasury.address),
        contracts.token.balance_of(demo.validator.address),
    )
    cheat = part.ref(demo.cheater_node.address)
    contracts.as_account(demo.validator).pool.slash(cheat, subs[1], sigs[1], tree.proof(1))
    gained = contracts.token.balance_of(demo.treasury.address) - before[0]
    validator_gain = contracts.token.balance_of(demo.validator.address) - before[1]
    _say(
        f"  a validator found a bad rollout and slashed with the cheater's own signature as "
        f"evidence: {gained // TOKEN} SRL to the treasury, {validator_gain} to the validator"
    )


def _honest_claims_and_withdraws(demo: _DemoChain) -> None:
    """Past the window the honest provider claims; past the unbonding period it withdraws."""
    from swarmrl.chain import anvil as anvil_mod
    from swarmrl.chain.tokens import TOKEN

    anvil_mod.increase_time(demo.w3, demo.params.invalidation_window + 1)
    # The provider needs nothing from the orchestrator: its proof is rebuilt from the logs.
    reward = demo.contracts.as_account(demo.honest).pool.claim(demo.honest_node.address, [1])
    _say(f"  after the 24 h invalidation window the honest provider claimed {reward / TOKEN} SRL")

    h = demo.contracts.as_account(demo.honest)
    h.stakes.request_unbond(50 * TOKEN)
    anvil_mod.increase_time(demo.w3, demo.params.unbonding_period + 1)
    _say(f"  it unbonded 50 SRL and withdrew {h.stakes.withdraw() // TOKEN} after the 7-day period")


def _deployment_only() -> tuple[Deployment, LocalAccount]:
    """What the swarm scene needs from a chain when the chain scene did not run: the
    deployment's addresses and the recorder's key, from a throwaway anvil."""
    from swarmrl.chain.anvil import Anvil, dev_accounts
    from swarmrl.chain.deploy import DEV_RECORDER, deploy_dev, run_id_from_name

    chain = Anvil.start()
    try:
        # Addresses only: the swarm scene moves no tokens.
        deployment = deploy_dev(
            chain, run_id=run_id_from_name("demo"), tokens_each=0, pool_funding=0
        )
        return deployment, dev_accounts()[DEV_RECORDER]
    finally:
        chain.stop()


SCENES = ("toploc", "chain", "shards", "swarm", "rollouts")


def run_scenes(names: Sequence[str]) -> None:
    """Runs the named scenes in the order of ``SCENES``."""
    unknown = [n for n in names if n not in SCENES]
    if unknown:
        raise ValueError(f"no demo scene {unknown[0]!r}; the scenes are {', '.join(SCENES)}")
    wanted = [n for n in SCENES if n in names]
    chain: tuple[Deployment, LocalAccount] | None = None
    with tempfile.TemporaryDirectory(prefix="swarmrl-demo-") as tmp:
        workdir = Path(tmp)
        for name in wanted:
            if name == "toploc":
                _toploc_stage()
            elif name == "chain":
                chain = _chain_stage()
            elif name == "shards":
                _shards_stage(workdir)
            elif name == "swarm":
                _swarm_stage(workdir, *(chain or _deployment_only()))
            else:
                from simulation.demo.rollouts import run as rollouts_scene

                rollouts_scene(workdir)
