"""Nodes that cheat: each way a volunteer might earn rewards without doing the work it
was asked for, or bend training its way, as a strategy a node runs.

The validator must catch each (or say it cannot), and the recorder must slash the ones
that leave evidence with the node's own signed submission: `swarmrl demo` and the
end-to-end tests run the default cheat (a cheaper model) beside honest nodes, and the
trust benchmark (benchmarks/trust_cheats.py) runs every one against the
orchestrator's intake and validator. Both call the same strategy objects, whose
methods are the node's steps: the backend it loads (``load``) and keeps up to date
(``reload``), the records it hands in for an order (``records``) and the signed header
it sends them with (``sign``). :class:`Cheat` itself is an honest node, the control.

The cheater samples with the torch backend on the CPU, in the order's precision.

Usage: python -m simulation.cheater NODE_TOML [--cheat NAME] [--copy-from DATA_DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import shutil
import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from client.node.events import log_event
from client.node.settings import NodeSettings, load_tasks
from client.node.work.loop import Node, Steps, sole_runner
from client.node.work.worker import Generation, LocalWorker, order_rollouts
from swarmrl import keystore
from swarmrl.logs import setup_logging
from swarmrl.settings_toml import load_settings

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from client.node.events import Listener
    from client.node.work.session import Session
    from client.node.work.workers import Workers
    from swarmrl.models.backend import Backend, Precision
    from swarmrl.rollouts.records import Rollout
    from swarmrl.tasks import Task
    from swarmrl.work.assign import WorkOrder
    from swarmrl.work.submit import SubmitHeader

CHEAP_MODEL_SEED = 7
OTHER_MODEL_SEED = 8
TOKENIZER_FILES = ("tokenizer", "special_tokens", "chat_template")
# Tokens an editing cheat replaces in each record: a few, as a node fixing up answers.
EDITS = 3
# The temperature a colder cheat samples at, as a share of the one its order asks for.
COLDER = 0.5
# What a cheat claiming rewards claims: the most a task pays.
FULL_REWARD = 1.0

# A colluding node's signed submission to copy: its header and file.
Source = Callable[[], "tuple[SubmitHeader, Path]"]


class Cheat:
    """A node behaviour; this base class is an honest node (the control), and each
    subclass changes one of its steps. ``workdir`` holds what the cheat builds (cheaper
    models); ``source``, what the copying cheats copy."""

    name: ClassVar[str] = "honest"
    what: ClassVar[str] = "does what its order asks (the control)"
    answers: ClassVar[bool] = True  # False: takes orders and never answers them
    copies: ClassVar[bool] = False  # True: needs a source of another node's submissions

    def __init__(self, workdir: Path, source: Source | None = None) -> None:
        self.workdir = workdir
        self.source = source

    def load(self, policy: Path, precision: Precision) -> Backend:
        """The backend it generates with, given the policy the swarm sent."""
        from swarmrl.models import load_backend

        return load_backend("torch", policy, device="cpu", precision=precision)

    def reload(self, backend: Backend, policy: Path) -> None:
        """A newer policy arrived: the backend takes it in place."""
        backend.load_weights(policy)

    def records(self, backend: Backend, generation: Generation) -> list[Rollout]:
        """The records it hands in for ``generation``'s order, claiming the policy of its
        ``step``."""
        return order_rollouts(backend, generation)

    def sign(
        self, session: Session, order: WorkOrder, step: int, path: Path
    ) -> tuple[SubmitHeader, Path]:
        """The signed header it sends the file at ``path`` with, and the file it sends."""
        return session.sign(order, step, path), path


# ---- another model -----------------------------------------------------------------------


class RandomWeights(Cheat):
    """Generates with the policy's architecture and tokenizer, randomly initialised, and
    never takes the swarm's weights (the demo's cheater)."""

    name = "random-weights"
    what = "generates with random weights of the policy's architecture, claiming the policy"
    seed = CHEAP_MODEL_SEED
    # Wide enough that its outputs depend on the prompt; None: the architecture's own.
    initializer_range: float | None = 0.1

    def load(self, policy: Path, precision: Precision) -> Backend:
        from swarmrl.models import load_backend

        cheap = random_model(policy, self.workdir / self.name, self.seed, self.initializer_range)
        return load_backend("torch", cheap, device="cpu", precision=precision)

    def reload(self, backend: Backend, policy: Path) -> None:
        """Keeps its own model, whatever the swarm sends."""


class OtherSeed(RandomWeights):
    name = "other-seed"
    what = "generates with another random initialisation of the same size"
    seed = OTHER_MODEL_SEED
    initializer_range = None


class _DerivedModel(Cheat):
    """Generates with a model derived from each policy it is sent (``derive`` changes a
    loaded copy in place), rebuilt whenever a newer policy arrives."""

    def derive(self, model: Any) -> None:
        raise NotImplementedError

    def _built(self, policy: Path) -> Path:
        return rewritten_model(policy, self.workdir / self.name, self.derive)

    def load(self, policy: Path, precision: Precision) -> Backend:
        return super().load(self._built(policy), precision)

    def reload(self, backend: Backend, policy: Path) -> None:
        backend.load_weights(self._built(policy))


class SmallerModel(_DerivedModel):
    name = "smaller-model"
    what = "generates with the policy cut to its first half of layers (same tokenizer)"

    def derive(self, model: Any) -> None:
        decoder = model.get_decoder()
        keep = max(1, len(decoder.layers) // 2)
        decoder.layers = decoder.layers[:keep]
        model.config.num_hidden_layers = keep


class QuantisedInt8(_DerivedModel):
    """Generates with the policy's linear layers rounded per output channel, as
    weight-only quantisation serves a model (embeddings and norms kept)."""

    name = "int8-weights"
    what = "generates with the policy's linear weights rounded to int8 per channel"
    bits: int | None = 8  # None: fp8 (e4m3)

    def derive(self, model: Any) -> None:
        import torch

        with torch.no_grad():
            for layer in model.get_decoder().layers:
                for module in layer.modules():
                    if isinstance(module, torch.nn.Linear):
                        module.weight.copy_(rounded(module.weight, self.bits))


class QuantisedInt4(QuantisedInt8):
    name = "int4-weights"
    what = "generates with the policy's linear weights rounded to int4 per channel"
    bits = 4


class QuantisedInt3(QuantisedInt8):
    name = "int3-weights"
    what = "generates with the policy's linear weights rounded to int3 per channel"
    bits = 3


class QuantisedFp8(QuantisedInt8):
    name = "fp8-weights"
    what = "generates with the policy's linear weights rounded to fp8 (e4m3) per channel"
    bits = None


def rounded(weight: Any, bits: int | None) -> Any:
    """``weight`` (out x in) as a per-output-channel quantiser stores it: scaled so each
    row's largest magnitude is the format's, rounded to ``bits``-bit integers (or to fp8
    e4m3 for None), and scaled back."""
    import torch

    top = 448.0 if bits is None else float(2 ** (bits - 1) - 1)  # e4m3's largest finite
    scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / top
    scaled = weight / scale
    if bits is None:
        return scaled.to(torch.float8_e4m3fn).to(weight.dtype) * scale
    return scaled.round().clamp(-top, top) * scale


def random_model(policy: Path, out: Path, seed: int, initializer_range: float | None) -> Path:
    """The policy's architecture and tokenizer with weights drawn from ``seed``, in
    ``out`` (built once)."""
    if (out / "model.safetensors").is_file():
        return out
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(policy)
    if initializer_range is not None:
        config.initializer_range = initializer_range
    torch.manual_seed(seed)
    _save(AutoModelForCausalLM.from_config(config), policy, out)
    return out


def rewritten_model(policy: Path, out: Path, change: Callable[[Any], None]) -> Path:
    """The policy, loaded in fp32 and changed in place by ``change``, in ``out`` (replaced)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
    change(model)
    _save(model, policy, out)
    return out


def _save(model: Any, policy: Path, out: Path) -> None:
    """``model`` with the policy's tokenizer files, as a model directory at ``out``."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for file in policy.iterdir():
        if file.name.startswith(TOKENIZER_FILES):
            shutil.copy(file, tmp / file.name)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


class Stale(Cheat):
    """Keeps the first policy it loaded and claims whichever step is newest: a node
    that does not bother to fetch new weights."""

    name = "stale-step"
    what = "generates with the first policy it got, claiming the newest step"

    def reload(self, backend: Backend, policy: Path) -> None:
        """Keeps the policy it has."""


# ---- the records changed after generating --------------------------------------------


class _Tampered(Cheat):
    """Generates honestly, then changes the records (``tamper``) and seals them again."""

    def tamper(
        self, records: list[Rollout], backend: Backend, tasks: Mapping[str, Task]
    ) -> list[Rollout]:
        raise NotImplementedError

    def records(self, backend: Backend, generation: Generation) -> list[Rollout]:
        honest = super().records(backend, generation)
        return self.tamper(honest, backend, generation.tasks)


def _rng(record: Rollout, what: str) -> random.Random:
    """A random source of its own per record, so a cheat repeats itself exactly."""
    return random.Random(f"{what}/{record.seed}/{record.problem_id}/{record.sample}")


class EditedTokens(_Tampered):
    name = "edited-tokens"
    what = f"replaces {EDITS} output tokens of each record, keeping logprobs and proofs"

    def tamper(
        self, records: list[Rollout], backend: Backend, tasks: Mapping[str, Task]
    ) -> list[Rollout]:
        from swarmrl.tasks.rewards import task_reward

        out = []
        for r in records:
            rng = _rng(r, "edit")
            output = list(r.output_ids)
            # An end-of-sequence token stays last, so the finish still agrees.
            editable = len(output) - (r.finish_reason == "eos")
            # Other tokens of its own prompt: ids the model has, none ending a sequence.
            choices = sorted(set(r.prompt_ids) - backend.eos_ids)
            for i in rng.sample(range(editable), min(EDITS, editable)):
                if others := [t for t in choices if t != output[i]]:
                    output[i] = rng.choice(others)
            # Its rewards are what the verifier says of the edited text: only the edit lies.
            text = backend.tokenizer.decode(output, skip_special_tokens=True)
            reward = task_reward(tasks[r.problem_id], text)
            update = {
                "output_ids": output,
                "task_reward": reward,
                "reward": reward - r.length_penalty,
            }
            out.append(r.model_copy(update=update).sealed())
        return out


class RandomProofs(_Tampered):
    name = "random-proofs"
    what = "replaces each TOPLOC proof with random bytes of its length"

    def tamper(
        self, records: list[Rollout], backend: Backend, tasks: Mapping[str, Task]
    ) -> list[Rollout]:
        out = []
        for r in records:
            rng = _rng(r, "proofs")
            proofs = [rng.randbytes(len(p)) for p in r.proofs]
            out.append(r.model_copy(update={"proofs": proofs}).sealed())
        return out


class OtherProofs(_Tampered):
    name = "other-proofs"
    what = "hands in each record with the proofs of another completion of the submission"

    def tamper(
        self, records: list[Rollout], backend: Backend, tasks: Mapping[str, Task]
    ) -> list[Rollout]:
        out = []
        for i, r in enumerate(records):
            # The next record's proofs, repeated or cut to this one's number of chunks.
            other = records[(i + 1) % len(records)].proofs
            proofs = [other[c % len(other)] for c in range(len(r.proofs))]
            out.append(r.model_copy(update={"proofs": proofs}).sealed())
        return out


class FalseRewards(_Tampered):
    name = "false-rewards"
    what = "claims the full reward for every completion the verifier scores lower"

    def tamper(
        self, records: list[Rollout], backend: Backend, tasks: Mapping[str, Task]
    ) -> list[Rollout]:
        return [
            r
            if r.task_reward >= FULL_REWARD
            else r.model_copy(
                update={"task_reward": FULL_REWARD, "reward": FULL_REWARD - r.length_penalty}
            ).sealed()
            for r in records
        ]


class Colder(Cheat):
    """Samples colder than its order asks (likelier tokens, higher rewards) and reports
    the log-probabilities the validator computes at the temperature asked for: it
    prefills its own output with the policy at that temperature."""

    name = "colder-sampling"
    what = f"samples at {COLDER:g}x the order's temperature, reporting logprobs at the asked one"

    def records(self, backend: Backend, generation: Generation) -> list[Rollout]:
        from swarmrl.models.backend import SamplingParams

        order = generation.order
        colder = SamplingParams(
            max_tokens=order.max_tokens, temperature=order.temperature * COLDER, top_p=order.top_p
        )
        sampled = order_rollouts(backend, generation, params=colder)
        out = []
        for r in sampled:
            claimed = backend.prefill(
                r.prompt_ids, r.output_ids, temperature=order.temperature, top_p=order.top_p
            )
            update = {"temperature": order.temperature, "logprobs": claimed.logprobs}
            out.append(r.model_copy(update=update).sealed())
        return out


# ---- tasks of the order left out ---------------------------------------------------------


def _by_task(records: list[Rollout]) -> dict[str, list[Rollout]]:
    groups: dict[str, list[Rollout]] = {}
    for r in records:
        groups.setdefault(r.problem_id, []).append(r)
    return groups


def _hardest(groups: dict[str, list[Rollout]]) -> str:
    """The task whose group scored lowest."""
    return min(groups, key=lambda p: (sum(r.task_reward for r in groups[p]), p))


class Dropped(_Tampered):
    name = "dropped-task"
    what = "leaves out the group of the task it did worst on"

    def tamper(
        self, records: list[Rollout], backend: Backend, tasks: Mapping[str, Task]
    ) -> list[Rollout]:
        groups = _by_task(records)
        worst = _hardest(groups)
        return [r for r in records if r.problem_id != worst]


class CherryPicked(Cheat):
    name = "cherry-picked-task"
    what = "answers another task of the task set in place of the one it did worst on"

    def records(self, backend: Backend, generation: Generation) -> list[Rollout]:
        order, tasks = generation.order, generation.tasks
        honest = super().records(backend, generation)
        worst = _hardest(_by_task(honest))
        asked = {slot.problem_id for slot in order.tasks}
        other = random.Random(f"pick/{order.seed}").choice(sorted(set(tasks) - asked))
        slot = next(s for s in order.tasks if s.problem_id == worst)
        # Its own copy of the order, asking for the one group it answers in the worst's place.
        picked = order.model_copy(update={"tasks": [slot.model_copy(update={"problem_id": other})]})
        kept = [r for r in honest if r.problem_id != worst]
        return kept + order_rollouts(backend, dataclasses.replace(generation, order=picked))


# ---- another node's work -------------------------------------------------------------------


class Copied(Cheat):
    name = "copied"
    what = "hands in another node's records as they are, signed as its own answer"
    copies = True

    def _copied(self) -> tuple[SubmitHeader, Path]:
        if self.source is None:
            raise ValueError(f"the {self.name} cheat needs another node's submissions to copy")
        return self.source()

    def records(self, backend: Backend, generation: Generation) -> list[Rollout]:
        from swarmrl.rollouts.records import read_rollouts

        return read_rollouts(self._copied()[1])


class Resigned(Copied):
    name = "re-signed"
    what = "hands in another node's records rewritten to name itself and its order's seed"

    def records(self, backend: Backend, generation: Generation) -> list[Rollout]:
        theirs = super().records(backend, generation)
        g = generation
        mine = {"node": g.node, "seed": g.order.seed, "policy_step": g.step}
        return [r.model_copy(update=mine).sealed() for r in theirs]


class Replayed(Copied):
    name = "replayed"
    what = "sends another node's signed submission as it is"

    def sign(
        self, session: Session, order: WorkOrder, step: int, path: Path
    ) -> tuple[SubmitHeader, Path]:
        header, file = self._copied()
        # Into the file it would have sent: the caller owns that one, not the source.
        shutil.copyfile(file, path)
        return header, path


# ---- no work at all ----------------------------------------------------------------------


class Idle(Cheat):
    name = "idle"
    what = "heartbeats and takes orders but never answers them"
    answers = False


CHEATS: dict[str, type[Cheat]] = {
    c.name: c
    for c in (
        Cheat,
        RandomWeights,
        OtherSeed,
        SmallerModel,
        QuantisedInt8,
        QuantisedFp8,
        QuantisedInt4,
        QuantisedInt3,
        EditedTokens,
        RandomProofs,
        OtherProofs,
        FalseRewards,
        Colder,
        Copied,
        Resigned,
        Replayed,
        Dropped,
        CherryPicked,
        Stale,
        Idle,
    )
}
DEFAULT = RandomWeights.name


def journal_source(data_dir: Path) -> Source:
    """The newest submission a colluding node has signed and not yet handed in (its
    journal's newest pending entry), for the copying cheats."""

    def newest() -> tuple[SubmitHeader, Path]:
        from client.node.work.journal import Journal
        from swarmrl.work.submit import SubmitHeader

        pending = Journal(data_dir / "journal").pending()
        if not pending:
            raise OSError(f"{data_dir} holds no signed submission to copy yet")
        return SubmitHeader.model_validate(pending[-1].header), pending[-1].file

    return newest


def cheating_steps(cheat: Cheat, local: LocalWorker) -> Steps:
    """The node's steps as ``cheat`` takes them, generating with ``local``, a worker in
    the node's own process that loads and keeps up to date what the cheat says."""

    def records(workers: Workers, generation: Generation) -> list[Rollout]:
        assert local.backend is not None  # loaded before any order
        return cheat.records(local.backend, generation)

    return Steps(workers=local, records=records, sign=cheat.sign, answers=cheat.answers)


class CheatingNode(Node):
    """A node whose steps are its cheat's (:func:`cheating_steps`)."""

    def __init__(
        self,
        settings: NodeSettings,
        account: LocalAccount,
        cheat: Cheat,
        *,
        on_event: Listener | None = None,
        tasks: dict[str, Any] | None = None,
    ) -> None:
        self.cheat = cheat
        # In the node's own process: the cheat loads and generates as it likes.
        self.local = LocalWorker(cheat.load, cheat.reload)
        steps = cheating_steps(cheat, self.local)
        super().__init__(settings, account, on_event=on_event, tasks=tasks, steps=steps)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m simulation.cheater", description="Run a node that cheats."
    )
    parser.add_argument("config", metavar="NODE_TOML", type=Path)
    parser.add_argument("--cheat", choices=sorted(CHEATS), default=DEFAULT)
    parser.add_argument(
        "--copy-from",
        metavar="DATA_DIR",
        type=Path,
        help="the data dir of a colluding node whose signed submissions the copying cheats hand in",
    )
    args = parser.parse_args()
    kind = CHEATS[args.cheat]
    if kind.copies != (args.copy_from is not None):
        copying = ", ".join(name for name, c in CHEATS.items() if c.copies)
        parser.error(f"--copy-from goes with the copying cheats ({copying}), and they need it")
    try:
        _run(args.config, kind, args.copy_from)
    except (ValueError, OSError) as e:  # as swarmrl's own commands say them
        parser.exit(1, f"error: {e}\n")


def _run(config: Path, kind: type[Cheat], copy_from: Path | None) -> None:
    import torch

    torch.set_num_threads(1)
    settings = load_settings(NodeSettings, config)
    with sole_runner(settings, "python -m simulation.cheater"):
        tasks = load_tasks(settings)
        password = keystore.read_password(settings.password_file)
        account = keystore.unlock(settings.keystore_dir, settings.key, password)
        setup_logging(Path(settings.data_dir) / "node.log")
        source = None if copy_from is None else journal_source(copy_from)
        cheat = kind(Path(settings.data_dir) / "cheat", source)
        node = CheatingNode(settings, account, cheat, on_event=log_event, tasks=tasks)
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, lambda *_: node.stop())
        node.run()


if __name__ == "__main__":
    main()
