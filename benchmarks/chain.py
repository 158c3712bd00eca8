"""Recording an epoch on chain: transactions and gas per epoch at N nodes, on anvil.

    python -m benchmarks.chain [--nodes 10,100,1000] [--json PATH]
    or   swarmrl bench chain ...

For each swarm size N: a real anvil (stopped afterwards), the protocol deployed with
``deploy_dev``, and N nodes set up as providers set them up: providers of at most 10
nodes each register, add each node with the node's signed consent, stake, and join
their nodes to the pool. Epoch 0's work goes into a real ``Ledger`` on disk, as intake
and the validator leave it: a few signed submissions per node, accepted by the
validator's verdict, and on one node one more, rejected as slashable evidence. Once
the epoch has ended, the orchestrator's real ``Recorder.run_once`` records it: the
figures are read from the receipts of the transactions it sent (its round's wall
time includes its chain reads: one membership read per node, the pool's logs). Then
the chain's clock moves past the invalidation window and one provider claims its
nodes' leaves in one transaction.

The goals (the issue's): at most 10 transactions per epoch at 1,000 nodes, at most
30k gas per node amortised.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak
from hexbytes import HexBytes
from web3 import Web3

from orchestrator.service.ledger import Ledger
from orchestrator.service.ledger.submissions import SubmissionRow
from orchestrator.service.recorder import Recorder
from swarmrl import eip712
from swarmrl.chain import anvil as anvil_mod
from swarmrl.chain.anvil import Anvil, dev_accounts, rpc
from swarmrl.chain.artifacts import OUT_DIR
from swarmrl.chain.contracts import Contracts
from swarmrl.chain.deploy import (
    DEV_ADMIN,
    DEV_RECORDER,
    DEV_VALIDATOR,
    Deployment,
    ProtocolParams,
    deploy_dev,
    run_id_from_name,
)
from swarmrl.chain.recorded_work import MAX_LEAVES
from swarmrl.chain.tokens import TOKEN
from swarmrl.chain.tx import TxSettings
from swarmrl.cli_options import parse_counts
from swarmrl.files import check_output_path, write_atomically
from swarmrl.work.states import SubmissionStatus

DEFAULT_SIZES = (10, 100, 1000)
MAX_NODES = 10_000
# Providers of 10 nodes, as the recorded figures were measured (a join's cost once grew
# with its provider's nodes; the registry's node counter, nodeCountOf, keeps it constant).
NODES_PER_PROVIDER = 10
SUBMISSIONS_PER_NODE = 3
UNITS_PER_SUBMISSION = 4
EPOCH_SECONDS = 60.0
GRACE_SECONDS = 30.0
GOAL_TX_PER_EPOCH = 10  # at 1,000 nodes
GOAL_TX_AT = 1000
GOAL_GAS_PER_NODE = 30_000
PARAMS = ProtocolParams()  # the deployment defaults: 100 SRL per node, 50 SRL penalty, 600 s
PROVIDER_ETH = 10**21  # 1,000 ETH of gas money each (anvil_setBalance)
# The setup's senders poll for receipts every 2 ms, not TxSettings' 50 ms: anvil mines
# each transaction at once, and a missed first poll doubled the setup's time at 1,000
# nodes. The recorder keeps the daemon's settings.
SETUP_TX = TxSettings(poll_interval=0.002)


@dataclass
class SizeResult:
    """One swarm size's figures. Gas is receipts' gasUsed."""

    nodes: int
    providers: int
    setup_transactions: int
    setup_seconds: float
    ledger_seconds: float  # writing the epoch's submissions and verdicts
    # The epoch's recording: the recorder's transactions and what they cost.
    transactions: int  # sent by the recorder account for the epoch (nonce delta)
    parts: int
    gas_per_transaction: list[int]
    calldata_bytes: list[int]
    recording_gas: int
    gas_per_node: float  # recording_gas / nodes
    recorder_seconds: float  # Recorder.run_once: reads, the recording and the slash vote
    leaves_on_chain: int  # WorkRecorded leaves of epoch 0, rebuilt from the pool's logs
    nodes_without_leaf: list[str]  # joined nodes with work whose leaf the chain lacks
    block_gas_limit: int
    slash_gas: int
    slash_outcome: str
    # One provider's claim of its leaves, after the window.
    claim_leaves: int
    claim_gas: int
    claim_gas_per_leaf: float
    claimed: int  # tokens (wei) the claim paid
    expected_claim: int  # the leaves' units times the part's reward per unit
    provider_balance_change: int
    errors: list[str] = field(default_factory=list)


def parse_sizes(text: str) -> tuple[int, ...]:
    """Comma-separated swarm sizes, each 1 to MAX_NODES (ValueError otherwise)."""
    return parse_counts(text, "--nodes", "node", MAX_NODES)


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _key(kind: str, i: int) -> LocalAccount:
    """A made-up account, the same on every run (no mnemonic derivation: it is slow)."""
    account: LocalAccount = Account.from_key(keccak(text=f"swarmrl bench chain {kind} {i}"))
    return account


def _gas(w3: Web3, tx_hash: str | bytes) -> int:
    return int(w3.eth.get_transaction_receipt(HexBytes(tx_hash))["gasUsed"])


@dataclass
class Swarm:
    """The chain side of a swarm: providers (each with its own Contracts) and their nodes."""

    providers: list[Contracts]
    nodes: list[list[LocalAccount]]  # by provider
    transactions: int

    def all_nodes(self) -> list[LocalAccount]:
        return [n for group in self.nodes for n in group]


def set_up_swarm(
    w3: Web3,
    deployment: Deployment,
    nodes: int,
    *,
    per_provider: int = NODES_PER_PROVIDER,
    progress: Callable[[str], None] = _progress,
) -> Swarm:
    """`nodes` nodes in the pool, under providers of at most `per_provider` nodes each:
    gas money (anvil_setBalance) and stake tokens (minted by the admin) for each
    provider, who registers, adds its nodes with their signed consent, stakes the
    minimum for them and joins them."""
    accounts = dev_accounts()
    admin = Contracts(w3, deployment, accounts[DEV_ADMIN], SETUP_TX)
    count = math.ceil(nodes / per_provider)
    min_stake = deployment.params.min_stake_per_node
    deadline = admin.chain_time() + 24 * 3600
    domain = admin.registry.domain()
    providers: list[Contracts] = []
    groups: list[list[LocalAccount]] = []
    sent = 0
    made = 0
    started = time.perf_counter()
    for p in range(count):
        account = _key("provider", p)
        size = min(per_provider, nodes - made)
        group = [_key("node", made + i) for i in range(size)]
        made += size
        rpc(w3, "anvil_setBalance", [account.address, hex(PROVIDER_ETH)])
        stake = size * min_stake
        admin.token.mint(account.address, stake)
        provider = Contracts(w3, deployment, account, SETUP_TX)
        provider.registry.register_provider()
        for node in group:
            # A fresh node's consent nonce is 0; the registry refuses any other.
            consent = eip712.NodeConsent(account.address, node.address, 0, deadline)
            provider.registry.add_node(
                node.address, deadline, eip712.sign_consent(node, consent, domain)
            )
        provider.stakes.stake(stake)  # approve + stake
        for node in group:
            provider.pool.join_pool(node.address)
        sent += 1 + 1 + size + 2 + size
        providers.append(provider)
        groups.append(group)
        if (p + 1) % 10 == 0 or p + 1 == count:
            progress(
                f"  {made}/{nodes} nodes joined under {p + 1} providers "
                f"({sent} transactions, {time.perf_counter() - started:.0f} s)"
            )
    return Swarm(providers, groups, sent)


def write_epoch(
    ledger: Ledger,
    chain: Contracts,
    nodes: Sequence[LocalAccount],
    evidence_node: LocalAccount,
    *,
    epoch: int = 0,
    per_node: int = SUBMISSIONS_PER_NODE,
) -> int:
    """Epoch `epoch`'s submissions in the ledger as intake and the validator leave them:
    `per_node` signed submissions per node, accepted with UNITS_PER_SUBMISSION units
    each, and one more of `evidence_node`, rejected as slashable. Returns the rows written."""
    genesis = ledger.epochs.genesis()
    domain = chain.pool.domain()
    written = 0
    for i, node in enumerate(nodes):
        extra = 1 if node.address == evidence_node.address else 0
        for k in range(per_node + extra):
            step = i * (per_node + 1) + k + 1
            order_id = keccak(text=f"order {node.address} {k}").hex()
            sha = keccak(text=f"file {node.address} {k}").hex()
            rollout_digest = keccak(bytes.fromhex(order_id) + bytes.fromhex(sha))
            signed = chain.pool.submission(node.address, step, rollout_digest)
            signature = eip712.sign_submission(node, signed, domain)
            row, created = ledger.submissions.record(
                SubmissionRow(
                    digest=signed.digest(domain).hex(),
                    node=node.address,
                    order_id=order_id,
                    epoch=epoch,
                    step=step,
                    file=f"/data/{node.address}/{k}.parquet",
                    file_sha256=sha,
                    rollout_digest=rollout_digest.hex(),
                    signature="0x" + signature.hex(),
                    received_at=genesis + epoch * EPOCH_SECONDS + 1,
                )
            )
            assert created
            bad = k == per_node  # the evidence node's extra submission
            status = SubmissionStatus.REJECTED if bad else SubmissionStatus.ACCEPTED
            ledger.submissions.set_outcome(
                row.digest,
                status,
                0 if bad else UNITS_PER_SUBMISSION,
                "a reason" if bad else "",
                bad,
                True,
                genesis + epoch * EPOCH_SECONDS + 2,
            )
            written += 1
    return written


def measure(
    nodes: int,
    *,
    per_provider: int = NODES_PER_PROVIDER,
    per_node: int = SUBMISSIONS_PER_NODE,
    data_dir: Path | None = None,
    progress: Callable[[str], None] = _progress,
) -> SizeResult:
    """The figures of one swarm size, on an anvil of its own (stopped afterwards); the
    ledger lives in `data_dir` (a temporary folder if None)."""
    with tempfile.TemporaryDirectory(prefix="swarmrl-bench-chain-") as tmp:
        folder = Path(tmp) if data_dir is None else data_dir
        with Anvil.start() as anvil:
            return _measure(anvil, nodes, per_provider, per_node, folder, progress)


def _measure(
    anvil: Anvil,
    nodes: int,
    per_provider: int,
    per_node: int,
    folder: Path,
    progress: Callable[[str], None],
) -> SizeResult:
    w3 = anvil.web3()
    units_per_node = per_node * UNITS_PER_SUBMISSION
    params = PARAMS
    deployment = deploy_dev(
        anvil,
        run_id=run_id_from_name(f"bench-chain-{nodes}"),
        tokens_each=0,
        # Twice the epoch's rewards: the budget never bounds the recording.
        pool_funding=2 * nodes * units_per_node * params.reward_per_unit,
        params=params,
    )
    progress(f"{nodes} nodes: setting up the swarm on anvil ({anvil.rpc_url})")
    started = time.perf_counter()
    swarm = set_up_swarm(w3, deployment, nodes, per_provider=per_provider, progress=progress)
    setup_seconds = time.perf_counter() - started

    accounts = dev_accounts()
    recorder_chain = Contracts(w3, deployment, accounts[DEV_RECORDER])
    validator_chain = Contracts(w3, deployment, accounts[DEV_VALIDATOR])
    everyone = swarm.all_nodes()
    evidence_node = everyone[-1]  # not one of the claiming provider's, unless it has all
    ledger_path = folder / "ledger.sqlite3"
    with Ledger(ledger_path) as ledger:
        started = time.perf_counter()
        rows = write_epoch(ledger, recorder_chain, everyone, evidence_node, per_node=per_node)
        ledger_seconds = time.perf_counter() - started
        progress(f"  {rows} submissions written to the ledger in {ledger_seconds:.1f} s")

        recorder = Recorder(
            ledger,
            recorder_chain,
            validator_chain,
            epoch_seconds=EPOCH_SECONDS,
            validation_grace=GRACE_SECONDS,
        )
        now = ledger.epochs.genesis() + EPOCH_SECONDS + 1  # epoch 0 has ended
        nonce_before = w3.eth.get_transaction_count(recorder_chain.sender.address)
        started = time.perf_counter()
        report = recorder.run_once(now)
        recorder_seconds = time.perf_counter() - started
        transactions = w3.eth.get_transaction_count(recorder_chain.sender.address) - nonce_before
    progress(f"  recorded in {recorder_seconds:.2f} s: {transactions} transactions")

    hashes = sorted({r.tx_hash for r in report.sent if r.tx_hash is not None})
    gas = [_gas(w3, h) for h in hashes]
    calldata = [len(bytes(w3.eth.get_transaction(HexBytes(h))["input"])) for h in hashes]
    slash_gas, slash_outcome = 0, "none"
    if report.slashes:
        slash = report.slashes[0]
        slash_outcome = str(slash.outcome)
        if slash.tx_hash is not None:
            slash_gas = _gas(w3, slash.tx_hash)
    parts = recorder_chain.pool.recorded_parts(0)
    leaves = sum(len(part.leaves) for part in parts)
    on_chain = {leaf.node for part in parts for leaf in part.leaves}
    without_leaf = [str(n.address) for n in everyone if n.address not in on_chain]
    block_gas_limit = int(w3.eth.get_block("latest")["gasLimit"])

    # The claim: past the window, the first provider claims its nodes' leaves at once
    # (the evidence node's leaf was slashed: never paid, so not claimed).
    anvil_mod.increase_time(w3, params.invalidation_window + 1)
    claimant = swarm.providers[0]
    mine = {n.address for n in swarm.nodes[0]} - {evidence_node.address}
    refs = [part.ref(leaf.node) for part in parts for leaf in part.leaves if leaf.node in mine]
    per_unit = {
        part.part: recorder_chain.pool.record_of(0, part.part).reward_per_unit for part in parts
    }
    expected = sum(ref.leaf.units * per_unit[ref.part] for ref in refs)
    balance_before = claimant.token.balance_of(claimant.address)
    claimed, claim_gas = 0, 0
    if refs:  # none where the first provider's one node is the slashed one
        claimed = claimant.pool.claim_refs(refs)
        block = w3.eth.get_block("latest", full_transactions=False)
        [claim_tx] = block["transactions"]  # anvil mines each transaction in a block of its own
        assert isinstance(claim_tx, bytes)  # a hash: the block was read without full transactions
        claim_gas = _gas(w3, claim_tx)
    balance_change = claimant.token.balance_of(claimant.address) - balance_before

    recording_gas = sum(gas)
    return SizeResult(
        nodes=nodes,
        providers=len(swarm.providers),
        setup_transactions=swarm.transactions,
        setup_seconds=setup_seconds,
        ledger_seconds=ledger_seconds,
        transactions=transactions,
        parts=len(parts),
        gas_per_transaction=gas,
        calldata_bytes=calldata,
        recording_gas=recording_gas,
        gas_per_node=recording_gas / nodes,
        recorder_seconds=recorder_seconds,
        leaves_on_chain=leaves,
        nodes_without_leaf=without_leaf,
        block_gas_limit=block_gas_limit,
        slash_gas=slash_gas,
        slash_outcome=slash_outcome,
        claim_leaves=len(refs),
        claim_gas=claim_gas,
        claim_gas_per_leaf=claim_gas / len(refs) if refs else 0.0,
        claimed=claimed,
        expected_claim=expected,
        provider_balance_change=balance_change,
        errors=list(report.errors),
    )


def hardfork_and_version() -> tuple[str, str]:
    """anvil's hardfork and version, from a throwaway anvil's node info."""
    with Anvil.start() as anvil:
        info = rpc(anvil.web3(), "anvil_nodeInfo", [])
        version = rpc(anvil.web3(), "web3_clientVersion", [])
    hardfork = str(info.get("hardFork", "?")) if isinstance(info, dict) else "?"
    return hardfork, str(version)


def artifacts_digest() -> str:
    """The first 12 hex digits of sha256 over contracts/out's artifacts, in name order:
    which build of the contracts the figures are of."""
    digest = hashlib.sha256()
    for path in sorted(OUT_DIR.glob("*.json")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def compiler_settings() -> str:
    """The EVM version and optimizer settings contracts/out was compiled with."""
    with open(OUT_DIR.parent / "foundry.toml", "rb") as f:
        profile = tomllib.load(f)["profile"]["default"]
    optimizer = (
        f"the optimizer on, {profile.get('optimizer_runs', 200)} runs"
        if profile.get("optimizer")
        else "the optimizer off"
    )
    return f"evm_version {profile.get('evm_version', '?')}, {optimizer}"


def goals(results: Sequence[SizeResult]) -> list[tuple[str, bool | None, str]]:
    """(goal, met (None: not measured), what was measured) for each of the issue's goals."""
    at = [r for r in results if r.nodes == GOAL_TX_AT]
    tx: tuple[str, bool | None, str]
    tx_goal = f"transactions per epoch at {GOAL_TX_AT:,} nodes <= {GOAL_TX_PER_EPOCH}"
    if at:
        tx = (tx_goal, at[0].transactions <= GOAL_TX_PER_EPOCH, f"{at[0].transactions}")
    else:
        tx = (tx_goal, None, f"no size of {GOAL_TX_AT:,} nodes was run")
    worst = max(results, key=lambda r: r.gas_per_node)
    gas = (
        f"gas per recorded node, amortised, <= {GOAL_GAS_PER_NODE:,} (every size)",
        all(r.gas_per_node <= GOAL_GAS_PER_NODE for r in results),
        f"{worst.gas_per_node:,.0f} at worst ({worst.nodes:,} nodes)",
    )
    return [tx, gas]


def report(results: Sequence[SizeResult], hardfork: str, version: str, build: str) -> None:
    print(
        "\nRecording an epoch on chain (anvil; gas is receipts' gasUsed; the recorder's "
        "round includes its chain reads and one slash vote)"
    )
    header = (
        "| nodes | tx / epoch | gas / tx | gas / node | calldata / tx | recorder round | "
        "slash vote | claim: leaves, gas, gas / leaf |"
    )
    print(header)
    print("| --- " * 8 + "|")
    for r in results:
        gas = " + ".join(f"{g:,}" for g in r.gas_per_transaction)
        calldata = " + ".join(f"{b:,} B" for b in r.calldata_bytes)
        print(
            f"| {r.nodes:,} | {r.transactions} | {gas} | {r.gas_per_node:,.0f} | {calldata} | "
            f"{r.recorder_seconds:.2f} s | {r.slash_gas:,} | "
            f"{r.claim_leaves}, {r.claim_gas:,}, {r.claim_gas_per_leaf:,.0f} |"
        )
    print()
    for r in results:
        share = max(r.gas_per_transaction, default=0) / r.block_gas_limit
        ok = (
            r.leaves_on_chain == r.nodes
            and not r.nodes_without_leaf
            and r.claimed == r.expected_claim == r.provider_balance_change
            and not r.errors
        )
        print(
            f"{r.nodes:,} nodes: {r.providers} providers, setup {r.setup_transactions:,} "
            f"transactions in {r.setup_seconds:.0f} s, ledger {r.ledger_seconds:.1f} s; "
            f"{r.parts} part(s), {r.leaves_on_chain:,} leaves on chain; largest recording "
            f"{share:.1%} of the block gas limit ({r.block_gas_limit:,}); claim paid "
            f"{r.claimed / TOKEN:g} SRL (expected {r.expected_claim / TOKEN:g}); slash "
            f"{r.slash_outcome}; {'all checks hold' if ok else 'CHECK FAILED'}"
            + (f"; errors: {r.errors}" if r.errors else "")
        )
    print(
        f"\nassumptions: anvil {version}, its default hardfork ({hardfork}) and block gas "
        "limit, automine (one block per transaction); contracts from contracts/out (sha256 "
        f"{build}), compiled with {compiler_settings()} (contracts/foundry.toml);"
        f" providers of at most {NODES_PER_PROVIDER} nodes each (a join costs the same "
        f"whatever its provider's nodes: the registry counts them); {SUBMISSIONS_PER_NODE} "
        "signed submissions per node, accepted at "
        f"{UNITS_PER_SUBMISSION} units each, plus one slashable rejected submission on one "
        "node, written to a real SQLite ledger as intake and the validator would (no files, "
        "no model, no p2p); the recorder and validator are the dev accounts of "
        f"`swarmrl chain up`; one part holds up to {MAX_LEAVES} nodes; the claim is one "
        "provider's, paid by it, not by the recorder."
    )
    print()
    for goal, met, measured in goals(results):
        verdict = "NOT MEASURED" if met is None else ("PASS" if met else "FAIL")
        print(f"{verdict}: {goal}: " + (measured if met is None else f"measured {measured}"))


def main(argv: Sequence[str] = ()) -> None:
    """The benchmark with `argv`'s options (none: the defaults, as `swarmrl bench all`
    runs it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default=",".join(str(n) for n in DEFAULT_SIZES))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    sizes = parse_sizes(args.nodes)
    if args.json is not None:
        check_output_path(args.json)  # refused now, not after minutes of measuring
    hardfork, version = hardfork_and_version()
    build = artifacts_digest()
    results = []
    for n in sizes:
        results.append(measure(n))
    report(results, hardfork, version, build)
    if args.json is not None:
        figures = {
            "sizes": [asdict(r) for r in results],
            "goals": [{"goal": g, "met": m, "measured": s} for g, m, s in goals(results)],
            "anvil": {"version": version, "hardfork": hardfork},
            "contracts_out_sha256": build,
        }
        write_atomically(args.json, json.dumps(figures, indent=1).encode())


if __name__ == "__main__":
    main(sys.argv[1:])
