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
from typing import Any

from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address

from swarmrl.chain.eip712 import Domain, Submission, sign_submission
from swarmrl.p2p import wire
from swarmrl.work import assign, heartbeat, join, submit
from swarmrl.work.assign import WorkOrder
from swarmrl.work.submit import Receipt, SubmitHeader


@dataclass(frozen=True)
class Identity:
    account: LocalAccount
    provider: str
    run: str
    swarm_domain: Domain
    pool_domain: Domain
    trusted: frozenset[str]  # checksummed addresses that may sign orders and receipts


def node_report(backend: str, device: str) -> join.NodeReport:
    from swarmrl import __version__

    gpu, memory = None, None
    if device.startswith("cuda"):
        import torch

        index = int(device.split(":")[1]) if ":" in device else 0
        gpu = torch.cuda.get_device_name(index)[:128]
        memory = torch.cuda.get_device_properties(index).total_memory / 2**30
    return join.NodeReport(
        backend=backend,  # type: ignore[arg-type]
        device=device,
        cpu_cores=len(os.sched_getaffinity(0)),
        gpu=gpu,
        gpu_memory_gib=memory,
        version=f"swarmrl {__version__} on {platform.machine()}",
    )


class Session:
    """Requests to one orchestrator peer through the node's host."""

    def __init__(self, host: Any, orchestrator_peer: str, me: Identity) -> None:
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
        (body,) = self.host.request(
            self.peer,
            join.PROTOCOL,
            wire.dump(claim),
            response_limit=join.RESPONSE_LIMIT,
            timeout=join.DEADLINE,
        )
        return wire.parse(join.JoinResponse, body)

    def heartbeat(
        self, step: int | None, speed: float | None, paused: bool = False
    ) -> heartbeat.HeartbeatResponse:
        request = heartbeat.HeartbeatRequest(
            policy_step=step, tokens_per_second=speed, paused=paused
        )
        (body,) = self.host.request(
            self.peer,
            heartbeat.PROTOCOL,
            wire.dump(request),
            response_limit=heartbeat.RESPONSE_LIMIT,
            timeout=heartbeat.DEADLINE,
        )
        return wire.parse(heartbeat.HeartbeatResponse, body)

    def work(self) -> assign.WorkResponse:
        (body,) = self.host.request(
            self.peer,
            assign.PROTOCOL,
            wire.dump(assign.WorkRequest()),
            response_limit=assign.RESPONSE_LIMIT,
            timeout=assign.DEADLINE,
        )
        response = wire.parse(assign.WorkResponse, body)
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
        sha = submit.file_sha256(path)
        order_id = order.digest(self.me.swarm_domain).hex()
        submission = Submission(
            run_id=bytes.fromhex(self.me.run[2:]),
            node=self.me.account.address,
            step=step,
            rollout_digest=submit.rollout_digest(order_id, sha),
        )
        signature = sign_submission(self.me.account, submission, self.me.pool_domain)
        return SubmitHeader(
            order_id=order_id,
            node=self.me.account.address,
            step=step,
            file_sha256=sha,
            size=path.stat().st_size,
            signature=signature.hex(),
        )

    def digest(self, header: SubmitHeader) -> str:
        """The submission's digest: the ledger's key, and what a receipt names."""
        return (
            Submission(
                run_id=bytes.fromhex(self.me.run[2:]),
                node=self.me.account.address,
                step=header.step,
                rollout_digest=header.rollout_digest(),
            )
            .digest(self.me.pool_domain)
            .hex()
        )

    def submit(self, header: SubmitHeader, path: Path) -> Receipt:
        (body,) = self.host.upload(
            self.peer,
            submit.PROTOCOL,
            wire.dump(header),
            path,
            response_limit=submit.RESPONSE_LIMIT,
            timeout=submit.DEADLINE,
        )
        receipt = wire.parse(submit.SubmitResponse, body).receipt
        if receipt.submission != self.digest(header) or receipt.run != self.me.run:
            raise wire.WireError("the receipt is for another submission")
        if receipt.signer(self.me.swarm_domain) not in self.me.trusted:
            raise wire.WireError("the receipt is not signed by a recorder of the run")
        return receipt
