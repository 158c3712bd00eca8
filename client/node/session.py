"""The node's side of the work protocols: one method per protocol, over the host.

Every answer from the orchestrator is parsed as strictly as the orchestrator
parses the node's requests, and every signed one is checked: a work order and a
receipt count only when a key the deployment names as recorder signed them.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address

from swarmrl.chain.eip712 import UNSIGNED, Domain
from swarmrl.models.backend import BackendName
from swarmrl.p2p import wire
from swarmrl.p2p.protocol import Caller
from swarmrl.work import assign, heartbeat, join, submit
from swarmrl.work.assign import WORK, WorkOrder
from swarmrl.work.heartbeat import HEARTBEAT
from swarmrl.work.join import JOIN
from swarmrl.work.submit import SUBMIT, SubmitHeader, SubmitResponse


@dataclass(frozen=True)
class Identity:
    account: LocalAccount
    provider: str
    run: str
    swarm_domain: Domain
    pool_domain: Domain
    trusted: frozenset[str]  # checksummed addresses that may sign orders and receipts


def node_report(backend: BackendName, device: str) -> join.NodeReport:
    from swarmrl import __version__

    gpu, memory = None, None
    if device.startswith("cuda"):
        import torch

        index = int(device.split(":")[1]) if ":" in device else 0
        gpu = torch.cuda.get_device_name(index)[:128]
        memory = torch.cuda.get_device_properties(index).total_memory / 2**30
    return join.NodeReport(
        backend=backend,
        device=device,
        cpu_cores=len(os.sched_getaffinity(0)),
        gpu=gpu,
        gpu_memory_gib=memory,
        version=f"swarmrl {__version__} on {platform.machine()}",
    )


class Session:
    """Requests to one orchestrator peer through the node's host."""

    def __init__(self, host: Caller, orchestrator_peer: str, me: Identity) -> None:
        self.host = host
        self.peer = orchestrator_peer
        self.me = me

    def join(self, report: join.NodeReport) -> join.JoinResponse:
        claim = join.JoinClaim(
            node=self.me.account.address,
            provider=to_checksum_address(self.me.provider),
            peer_id=self.host.peer_id,
            report=report,
            issued_at=int(time.time()),
        ).signed_by(self.me.account, self.me.swarm_domain)
        return self.host.call(JOIN, self.peer, claim)

    def heartbeat(
        self, step: int | None, speed: float | None, paused: bool = False
    ) -> heartbeat.HeartbeatResponse:
        request = heartbeat.HeartbeatRequest(
            policy_step=step, tokens_per_second=speed, paused=paused
        )
        return self.host.call(HEARTBEAT, self.peer, request)

    def work(self) -> assign.WorkResponse:
        response = self.host.call(WORK, self.peer, assign.WorkRequest())
        if response.order is not None:
            self.check_order(response.order)
        return response

    def check_order(self, order: WorkOrder) -> None:
        if order.run != self.me.run or to_checksum_address(order.node) != self.me.account.address:
            raise wire.WireError("the work order is for another run or node")
        signer = order.signer(self.me.swarm_domain)
        if signer not in self.me.trusted:
            raise wire.WireError(f"the work order is signed by {signer}, not a recorder of the run")

    def sign(self, order: WorkOrder, step: int, path: Path) -> SubmitHeader:
        """The header of a submission: the contract's Submission, signed by the node."""
        header = SubmitHeader(
            order_id=order.digest(self.me.swarm_domain).hex(),
            node=self.me.account.address,
            step=step,
            file_sha256=submit.file_sha256(path),
            size=path.stat().st_size,
            signature=UNSIGNED,
        )
        return header.signed_by(self.me.account, self.me.run, self.me.pool_domain)

    def digest(self, header: SubmitHeader) -> str:
        """The submission's digest: the ledger's key, and what a receipt names."""
        return header.digest(self.me.run, self.me.pool_domain).hex()

    def submit(self, header: SubmitHeader, path: Path) -> SubmitResponse:
        """The orchestrator's answer: a receipt (for this submission, signed by a
        recorder of the run) or its refusal for good; anything else raises."""
        response = self.host.upload(SUBMIT, self.peer, header, path)
        receipt = response.receipt
        if receipt is None:
            return response
        if receipt.submission != self.digest(header) or receipt.run != self.me.run:
            raise wire.WireError("the receipt is for another submission")
        if receipt.signer(self.me.swarm_domain) not in self.me.trusted:
            raise wire.WireError("the receipt is not signed by a recorder of the run")
        return response
