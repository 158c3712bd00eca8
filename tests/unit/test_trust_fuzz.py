"""The trust suite's fuzz targets in short form: every decoder of untrusted bytes takes
a few hundred hostile inputs without a crash, a hang or an unbounded allocation;
and the runner counts each of those when a decoder has one.

The long form is `python -m benchmarks.trust_fuzz --inputs N` (and the Rust half,
the `fuzz_*` proptests, runs in `cargo test`)."""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import strategies as st
from pydantic import BaseModel

from benchmarks import trust_fuzz
from benchmarks.fuzz_targets import PROTOCOLS, SIGNED, TARGETS, Session, Target, expect
from swarmrl.eip712 import Signed, signer_of
from swarmrl.p2p.protocol import RequestResponse, Upload

SHORT = 200
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", list(TARGETS))
def test_every_decoder_survives_hostile_input(name):
    result = trust_fuzz.fuzz(TARGETS[name], SHORT)
    assert result.inputs >= SHORT
    assert result.clean, trust_fuzz.table([result])


def _modules_defining(*needles: str) -> Iterator[object]:
    """Every swarmrl module whose source mentions one of `needles`, imported."""
    for path in sorted((ROOT / "swarmrl").rglob("*.py")):
        if any(n in path.read_text() for n in needles):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            yield importlib.import_module(name.removesuffix(".__init__"))


def test_every_protocol_is_a_target():
    """A new protocol cannot escape the fuzzer: every spec swarmrl defines is in the
    registry, both sides."""
    specs = {
        value.id
        for module in _modules_defining("RequestResponse(", "Upload(")
        for value in vars(module).values()
        if isinstance(value, RequestResponse | Upload)
    }
    assert specs == {spec.id for spec, _, _ in PROTOCOLS.values()}
    for protocol, (spec, _, _) in PROTOCOLS.items():
        asked = "header" if isinstance(spec, Upload) else "request"
        assert {f"{protocol}/{asked}", f"{protocol}/response"} <= set(TARGETS)


def test_every_signed_message_is_a_target():
    """Every message that carries an EIP-712 signature has its signature fuzzed."""
    signed = {
        value
        for module in _modules_defining("signature", "(Signed)")
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, BaseModel)
        and "signature" in value.model_fields
        and value is not Signed
    }
    assert signed == {kind.model for kind in SIGNED.values()}


# ---- the runner counts what goes wrong ----------------------------------------------


def _target(session: Session) -> Target:
    @contextmanager
    def setup(workdir: Path) -> Iterator[Session]:
        yield session

    return Target("probe", "a decoder made to fail", setup)


def _decode(value: int) -> int:
    if value == 7:
        raise TypeError("seven")
    if value == 8:
        raise ValueError("eight\nnine")  # a refusal, but not one sentence
    if value == 9:
        time.sleep(30)
    if value == 10:
        # Three times the limit, so the traced growth (peak less the start, which
        # memory freed meanwhile lowers by a few hundred bytes) still passes twice it.
        return len(bytearray(trust_fuzz.ALLOCATION_LIMIT * 3))
    if value == 11:
        time.sleep(0.5)
    if value < 0:
        raise ValueError("negative")
    return value


def _count(*examples: int, inputs: st.SearchStrategy | None = None, **kw):
    """Runs a decoder that fails on some values: `examples`, then one from `inputs`."""

    def sound(value: int, decoded: int) -> None:
        expect(value != 3, "three")

    session = Session(
        st.just(0) if inputs is None else inputs, _decode, (ValueError,), sound, examples=examples
    )
    return trust_fuzz.fuzz(_target(session), 1, **kw)


def test_a_clean_run_counts_inputs_and_refusals():
    result = _count(-1, 1, inputs=st.integers(0, 2))
    assert (result.inputs, result.accepted) == (3, 2)
    assert result.clean


@pytest.mark.parametrize(
    ("value", "crash"),
    [
        (7, "TypeError: seven on input 7"),
        (8, "a refusal that is not one sentence: ValueError('eight\\nnine') on input 8"),
        (3, "UnsoundError: three on input 3"),
    ],
)
def test_a_crash_is_counted_with_its_input(value, crash):
    result = _count(value)
    assert (result.crashes, result.first_crash) == (1, crash)
    assert not result.clean


def test_an_input_past_its_time_is_a_hang_and_the_run_goes_on():
    result = _count(9, 1, hang_seconds=1.0)
    assert (result.hangs, result.crashes, result.accepted) == (1, 0, 2)
    assert result.first_hang.endswith("s on 9")


def test_an_allocation_past_the_limit_is_counted():
    result = _count(10, trace=True)
    assert result.overallocations == 1
    assert result.input_growth >= 2 * trust_fuzz.ALLOCATION_LIMIT


def test_a_target_states_a_larger_budget_for_its_documented_cost():
    """A key file's kdf may cost seconds and 256 MiB by design: within its own budget
    that is no hang and no unbounded allocation."""
    session = Session(st.just(10), _decode, (ValueError,), examples=(11,), seconds=5.0)
    assert trust_fuzz.fuzz(_target(session), 1, hang_seconds=0.2).hangs == 0
    session = Session(st.just(11), _decode, (ValueError,), examples=(10,), memory=2**40)
    assert trust_fuzz.fuzz(_target(session), 1, trace=True).overallocations == 0
    # The same two inputs past the runner's defaults:
    assert _count(11, hang_seconds=0.2).hangs == 1
    assert _count(10, trace=True).overallocations == 1


def test_the_table_names_what_went_wrong():
    rows = trust_fuzz.table([_count(1), _count(7)]).splitlines()
    assert rows[0].startswith("| target | inputs |")
    assert rows[-1] == "- probe: TypeError: seven on input 7"
    assert rows[-3].startswith("| **total** | 4 | 3 | 1 | 0 | 0 |")


# ---- regressions the fuzzer found ---------------------------------------------------


@pytest.mark.parametrize("name", list(SIGNED))
def test_a_signature_in_a_form_the_contracts_refuse_recovers_no_signer(name):
    """Found by the signature targets: the high-s twin of a signature, and v as 0 or 1,
    recovered the signer, while the contracts' ECDSA refuses both (so no slash could
    ever use them). Each target also runs these as its first examples."""
    kind = SIGNED[name]
    target = TARGETS[f"signature/{name}"]
    with target.session(Path("/nonexistent")) as session:
        assert len(session.examples) == 2
        for raw in session.examples:
            message = kind.model.model_validate_json(raw)
            assert signer_of(kind.digest(message), message.signature) is None
    assert signer_of(kind.digest(kind.message), kind.message.signature) is not None


@pytest.mark.parametrize("name", ["manifest", "manifest/response", "rollouts/parquet"])
def test_a_refusal_quotes_no_key_raw(name, tmp_path):
    """Found by the manifest targets: a key with a newline in a manifest (and, alike, a
    column or signature key in a rollout file) went raw into the refusal, forging a
    second log line. Each target runs these as its first examples."""
    with TARGETS[name].session(tmp_path) as session:
        assert session.examples
        for raw in session.examples:
            with pytest.raises(session.refusals) as e:
                session.decode(raw)
            assert "forged\\nERROR" in str(e.value)
            assert str(e.value).isprintable()
