"""`swarmrl orchestrator run`: the coordinator of one training run.

One process holds the libp2p host (the work protocols and the weight origin),
intake and scheduling, the publisher and a supervisor loop; the heavy work runs
in child processes, each a config and a ``main`` that ``child`` starts, restarts
and stops alike, the heavy ones with their share of the cores:

- the trainer (``trainer_process``): validator's spool in, checkpoints out;
- the validator (``validator``): prefill and rewards, outcomes to the ledger;
- the recorder (``recorder``): closed epochs on chain, slashing on evidence.

They share nothing but files: the ledger (SQLite, WAL) and the run folder
(``orchestrator.run_dir``, the contract between them).
``<data_dir>`` holds all of it, so the same command after a crash, a SIGKILL
or a reboot carries on where it stopped, losing nothing it acknowledged.

What it cannot carry on from it refuses before any process starts, in one
sentence: a ledger that is damaged, or missing, empty or another where a run was
held (``ledger.home``); checkpoints the trainer could resume from only below what
the swarm has (``checkpoint.resume_point``); a chain that does not answer. Once
up, a damaged ledger or a child that keeps failing stops it the same way.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eth_account.signers.local import LocalAccount

from orchestrator.run_dir import RunDir
from orchestrator.service import recorder, trainer_process, validator
from orchestrator.service.child import Child, ChildSpec
from orchestrator.service.ledger.home import ledger_path, open_for_daemon
from orchestrator.service.settings import OrchestratorSettings
from orchestrator.service.work_server import ChainView, RunContext, WorkServer
from orchestrator.trainer import checkpoint as ckpt
from swarmrl.chain.deploy import Deployment
from swarmrl.work.states import SubmissionStatus

if TYPE_CHECKING:
    from swarmrl.chain.contracts import Contracts
    from swarmrl.p2p.host import Host

log = logging.getLogger("swarmrl.orchestrator")

SUPERVISE_SECONDS = 1.0
# Every node keeps a connection to the orchestrator (work, receipts, the weights'
# origin): room for a few thousand, where a node's host keeps a few hundred.
ORIGIN_CONNECTIONS = 4096
TRAINER = trainer_process.TRAINER


@dataclass(frozen=True)
class Keys:
    recorder: LocalAccount  # sends recordWork, signs checkpoints, orders and receipts
    validator: LocalAccount  # votes to slash


class ProtocolChainView(ChainView):
    """Join checks against the chain, through a read-only Protocol."""

    def __init__(self, contracts: Contracts) -> None:
        self.contracts = contracts

    def standing(self, node: str, provider: str) -> str | None:
        p = self.contracts
        try:
            if not p.registry.is_provider(provider):
                return f"{provider} is not a registered provider"
            if p.registry.provider_of(node) != provider:
                return f"node {node} is not registered under provider {provider}"
            nodes = max(1, len(p.registry.nodes_of(provider)))
            if p.stakes.stake_of(provider) < p.stakes.min_stake_per_node() * nodes:
                return (
                    f"provider {provider} has staked less than the pool's minimum "
                    f"for {nodes} node(s)"
                )
            if not p.pool.is_joined(node):
                return f"node {node} has not joined this run's pool"
        except Exception as e:  # the chain is unreachable or answered nonsense
            log.warning("chain check for %s failed: %r", node, e)
            return "the orchestrator cannot reach the chain right now; try again later"
        return None


def thread_shares(cores: int) -> tuple[int, int]:
    """(trainer, validator) threads: the trainer gets the larger share."""
    validator = max(1, cores // 3)
    return max(1, cores - validator), validator


class Orchestrator:
    def __init__(
        self,
        settings: OrchestratorSettings,
        deployment: Deployment,
        keys: Keys,
        *,
        log_to_stderr: bool = True,
    ) -> None:
        """``log_to_stderr`` False keeps the worker processes' log lines off the terminal
        (they still go to ``<data_dir>/logs/``)."""
        from swarmrl.eip712 import pool_domain, swarm_domain
        from swarmrl.tasks import read_tasks

        self.settings = settings
        self.deployment = deployment
        self.keys = keys
        self.log_to_stderr = log_to_stderr
        self.data_dir = Path(settings.data_dir)
        self.run_folder = RunDir.of_orchestrator(self.data_dir)
        self.run_folder.root.mkdir(parents=True, exist_ok=True)
        pool = deployment.contracts.compute_pool
        self.context = RunContext(
            run=deployment.run_id,
            swarm_domain=swarm_domain(deployment.chain_id, pool),
            pool_domain=pool_domain(deployment.chain_id, pool),
            signer=keys.recorder,
        )
        self.tasks = {t.problem_id: t for t in read_tasks(settings.tasks)}
        self.ledger = open_for_daemon(self.data_dir, deployment.run_id)
        self.published: int | None = None
        self._stopping = threading.Event()
        self.children: list[Child] = []
        # The process's one libp2p host: the weight swarm and intake share it.
        self.host: Host | None = None
        self.swarm: Any = None
        self.work_server: WorkServer | None = None
        self.metrics: Any = None

    # ---- pieces -------------------------------------------------------------------

    def _start_children(self) -> None:
        # The trainer writes step 0 before anything can be published; validator and
        # recorder only read what others wrote.
        self.children = [Child(spec) for spec in self._child_specs()]
        for child in self.children:
            child.start()

    def _child_specs(self) -> list[ChildSpec[Any]]:
        """The trainer, the validator(s) and the recorder, each with its share of the cores."""
        cores = self.settings.threads or len(os.sched_getaffinity(0))
        trainer_threads, validator_threads = thread_shares(cores)
        log.info(
            "threads: trainer %d, validator %d, on %d cores",
            trainer_threads,
            validator_threads,
            cores,
        )
        return [
            self._trainer_spec(trainer_threads),
            *self._validator_specs(validator_threads),
            self._recorder_spec(),
        ]

    def _trainer_spec(self, threads: int) -> ChildSpec[Any]:
        return trainer_process.spec(
            self.settings,
            self.deployment.run_id,
            threads=threads,
            log_to_stderr=self.log_to_stderr,
        )

    def _validator_specs(self, threads: int) -> list[ChildSpec[Any]]:
        """One child per validator worker, each on its device and with an even part of
        the validator's threads; one worker keeps the name (and log file) `validator`."""
        s = self.settings
        workers = s.validator_workers
        names = ["validator"] if workers == 1 else [f"validator-{i}" for i in range(workers)]
        return [
            ChildSpec(
                name,
                validator.main,
                validator.ValidatorConfig(
                    data_dir=self.data_dir,
                    run_dir=self.run_folder.root,
                    tasks_file=Path(s.tasks),
                    validation_rate=s.validation_rate,
                    trust_after=s.trust_after,
                    code_check_rate=s.code_check_rate,
                    device=s.validator_device(i),
                    async_level=s.async_level,
                    worker=name,  # the spec's name: the same for each restart of it
                ),
                data_dir=self.data_dir,
                log_to_stderr=self.log_to_stderr,
                threads=max(1, threads // workers),
            )
            for i, name in enumerate(names)
        ]

    def _recorder_spec(self) -> ChildSpec[Any]:
        s = self.settings
        config = recorder.RecorderConfig(
            ledger_path=ledger_path(self.data_dir),
            deployment=self.deployment,
            recorder_key=bytes(self.keys.recorder.key),
            validator_key=bytes(self.keys.validator.key),
            epoch_seconds=s.epoch_seconds,
            validation_grace=s.validation_grace,
        )
        return ChildSpec(
            "recorder",
            recorder.main,
            config,
            data_dir=self.data_dir,
            log_to_stderr=self.log_to_stderr,
        )

    def _check_checkpoints(self) -> None:
        """Refuses (one sentence) checkpoints the trainer could resume from only below
        the step the swarm has. Before the publisher starts: a damaged newest checkpoint
        nobody was given yet is moved aside here, never published."""
        from swarmrl.weights.store import newest_announced_step

        published = newest_announced_step(self.run_folder.weights)
        ckpt.resume_point(self.run_folder.root, published)

    def _connect_chain(self) -> Contracts:
        """The deployment's contracts, read-only. A chain that does not answer, after the
        chain layer's bounded retries, is one sentence naming its URL."""
        from swarmrl.chain.contracts import Contracts
        from swarmrl.chain.errors import ChainError, RpcUnavailableError, rpc_failure_sentence

        url = self.deployment.rpc_url
        log.info("connecting to the chain at %s", url)
        try:
            return Contracts.connect(self.deployment)
        except RpcUnavailableError as e:
            raise ValueError(
                f"the chain at {url} does not answer: {e}; start it, or set rpc_url in "
                f"{self.settings.deployment} to one that answers"
            ) from None
        except ChainError as e:
            raise ValueError(f"the chain at {url} cannot be used: {e}") from None
        except Exception as e:
            sentence = rpc_failure_sentence(e)
            if sentence is None:
                raise
            raise ValueError(f"the chain at {url} cannot be used: {sentence}") from None

    def _start_host(self, chain: Contracts) -> None:
        """Starts the process's host, and on it the weight origin and intake."""
        from swarmrl.p2p.host import Host
        from swarmrl.p2p.identity import load_or_create_peer_key
        from swarmrl.weights.gossip import swarm_topics
        from swarmrl.weights.peer import SwarmNode
        from swarmrl.weights.store import WeightStore

        s = self.settings
        # The steps a node may still work with (intake takes work async_level steps old),
        # so a node slower than one step can finish the download it began.
        store = WeightStore(self.run_folder.weights, keep=s.async_level + 1)
        peer_key = load_or_create_peer_key(self.data_dir / "peer.key")
        self.host = host = Host(
            peer_key,
            listen=s.listen,
            topics=swarm_topics(self.deployment.run_id),
            max_connections=ORIGIN_CONNECTIONS,
        )
        self.swarm = SwarmNode(
            host,
            store=store,
            domain=self.context.swarm_domain,
            run=self.deployment.run_id,
            trusted=self.deployment.recorders,
            account=self.keys.recorder,
            reachable=True,  # the address nodes bootstrap from
            bootstrap=s.bootstrap,
        )
        latest = store.latest()
        self.published = latest.step if latest is not None else None
        self.work_server = work_server = WorkServer(
            s,
            self.context,
            self.ledger,
            self.tasks,
            ProtocolChainView(chain),
            published_step=lambda: self.published,
            backlog=self._backlog,
            weights_addrs=lambda: host.addrs,
        )
        incoming = self.data_dir / "incoming"
        for leftover in incoming.glob("upload-*.part"):  # a SIGKILL mid-upload leaves these
            leftover.unlink(missing_ok=True)
        work_server.serve(host, incoming)
        for addr in host.addrs:
            log.info("listening on %s", addr)

    def _backlog(self) -> int:
        """Submissions not yet validated plus rollout files the trainer has not read."""
        unread = self.run_folder.unread_rollouts()
        return self.ledger.submissions.count(SubmissionStatus.RECEIVED) + unread

    def _publish_new(self) -> None:
        step = self.run_folder.latest()
        if step is None or (self.published is not None and step <= self.published):
            return
        began = time.perf_counter()
        self.swarm.publish(
            self.run_folder.step(step),
            model=self.deployment.run_id,
            step=step,
            delta=self.settings.weight_deltas,
        )
        self.published = step
        log.info("published policy step %d (%.2f s)", step, time.perf_counter() - began)

    # ---- the loop -------------------------------------------------------------------

    def stopping(self) -> bool:
        """Whether a signal asked the daemon to stop (it may still be closing down)."""
        return self._stopping.is_set()

    def run(self) -> None:
        from orchestrator.service.metrics import OrchestratorMetrics
        from swarmrl.p2p.ports import check_free

        stop = _StopOnSignal(self._stopping)
        try:
            # Cheapest first: a taken port fails before any process or listener starts,
            # then what the trainer would resume from, then the chain (seconds of
            # retries when it is down).
            self.metrics = OrchestratorMetrics(self.settings.metrics_port)
            check_free(self.settings.listen)
            self._check_checkpoints()
            chain = self._connect_chain()
            self._start_children()
            self._start_host(chain)
            log.info(
                "orchestrator of run %s up; metrics on 127.0.0.1:%d",
                self.deployment.run_id[:10],
                self.settings.metrics_port,
            )
            self._supervise()
        finally:
            stop.restore()
            self.close()

    def _supervise(self) -> None:
        """The daemon's loop, until a signal. What stops it (a damaged ledger, a child
        that keeps failing, a step that cannot be published) is one sentence, logged
        here and raised to the command."""
        done = threading.Event()
        failed: list[Exception] = []
        publisher = threading.Thread(
            target=self._publish_loop, args=(done, failed), name="publisher", daemon=True
        )
        publisher.start()
        seen = self.published
        assert self.work_server is not None  # the host, and intake on it, started first
        try:
            while not self._stopping.is_set():
                if failed:
                    raise failed[0]
                self.work_server.sweep(time.time())
                new_step, seen = self.published != seen, self.published
                for child in self.children:
                    if child.name == TRAINER and new_step:
                        child.progressed()  # a new step: the trainer is not failing in a loop
                    child.check()
                self.metrics.update(self.ledger, self.run_folder, self.published)
                self._stopping.wait(SUPERVISE_SECONDS)
        except ValueError as e:
            log.error("stopping: %s", e)
            raise
        finally:
            # A publish in progress finishes before close() takes the swarm away.
            done.set()
            publisher.join()

    def _publish_loop(self, done: threading.Event, failed: list[Exception]) -> None:
        """Publishes each new step, off the supervisor's loop: hashing a large policy
        and encoding its delta take tens of seconds (about 40 s for a 7B on two
        cores), in which nodes must still be swept and children checked. A failure
        ends the loop and is handed to the supervisor, which stops the daemon."""
        try:
            while not done.is_set():
                self._publish_new()
                done.wait(SUPERVISE_SECONDS)
        except Exception as e:  # handed over whole: the supervisor decides what it means
            failed.append(e)

    def close(self) -> None:
        for child in self.children:
            child.shutdown()
        if self.swarm is not None:
            self.swarm.close()
        if self.host is not None:
            self.host.close()
        if self.work_server is not None:
            self.work_server.close()  # after the host: no heartbeat comes in after it
        if self.metrics is not None:
            self.metrics.close()
        self.ledger.close()
        log.info("orchestrator stopped")


class _StopOnSignal:
    def __init__(self, event: threading.Event) -> None:
        self._old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for s in self._old:
            signal.signal(s, lambda *_: event.set())

    def restore(self) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)
