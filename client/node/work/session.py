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
from libp2p.protocol_muxer.exceptions import MultiselectClientError

from swarmrl import __version__
from swarmrl.eip712 import UNSIGNED, Domain
from swarmrl.models.backend import BackendName
from swarmrl.p2p import wire
from swarmrl.p2p.host import RemoteError
from swarmrl.p2p.protocol import Caller
from swarmrl.work import VERSION_REFUSAL, WORK_PROTOCOL, assign, heartbeat, join, submit
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


def node_report(backend: BackendName, device: str, workers: int = 1) -> join.NodeReport:
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
        workers=workers,
        version=f"swarmrl {__version__} on {platform.machine()}",
        protocol=WORK_PROTOCOL,
    )


class Session:
    """Requests to one orchestrator peer through the node's host."""

    def __init__(self, host: Caller, orchestrator_peer: str, me: Identity) -> None:
        self.host = host
        self.peer = orchestrator_peer
        self.me = me

    def join(self, report: join.NodeReport) -> join.JoinResponse:
        """The orchestrator's answer to this node's signed claim. `IncompatibleVersionError`
        (one sentence, saying what to install) where the two run releases of swarmrl
        that cannot work together: the orchestrator refused the node's work protocol,
        answered in another, or serves no join protocol of this id at all."""
        claim = join.JoinClaim(
            node=self.me.account.address,
            provider=to_checksum_address(self.me.provider),
            peer_id=self.host.peer_id,
            report=report,
            issued_at=int(time.time()),
        ).signed_by(self.me.account, self.me.swarm_domain)
        try:
            response = self.host.call(JOIN, self.peer, claim)
        # A refusal arrives as a RemoteError over libp2p, as the Refusal itself in process.
        except (RemoteError, wire.Refusal) as e:
            if str(e).startswith(VERSION_REFUSAL):
                raise join.IncompatibleVersionError(str(e)) from None
            raise
        except ConnectionError as e:
            if _unsupported(e):
                raise join.IncompatibleVersionError(
                    f"the orchestrator does not speak {JOIN.id}: it runs another release of "
                    "swarmrl; run the node with that release"
                ) from None
            raise
        if response.protocol != WORK_PROTOCOL:
            raise join.IncompatibleVersionError(
                f"the orchestrator speaks work protocol {response.protocol} and this node "
                f"{WORK_PROTOCOL} (swarmrl {__version__}): run the node with the release of "
                "the orchestrator"
            )
        return response

    def heartbeat(
        self, step: int | None, speed: float | None, paused: bool = False, *, leaving: bool = False
    ) -> heartbeat.HeartbeatResponse:
        """`leaving`: the node's last heartbeat, sent once it stops; the orchestrator counts
        it gone and hands its open order's tasks to other nodes at once."""
        request = heartbeat.HeartbeatRequest(
            policy_step=step, tokens_per_second=speed, paused=paused, leaving=leaving
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


def _unsupported(error: BaseException) -> bool:
    """Whether `error` ends a request that the remote peer answered with multistream-select's
    "na": it serves no protocol of that id. py-libp2p says so only in the words of the
    MultiselectClientError beneath the host's ConnectionError (the typed
    ProtocolNotSupportedError it raises first is dropped before the error leaves it)."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, MultiselectClientError):
            return "not supported" in str(cause)
        cause = cause.__cause__ or cause.__context__
    return False
