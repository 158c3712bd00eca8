"""swarmrl.delta on hostile deltas: random bytes, and valid deltas damaged by byte, by
header field and in their payloads (the strategies of benchmarks.hostile).

Every outcome of `apply` is the exact target, or a ValueError or OSError of one
sentence that leaves the output path as it was and no temporary file behind; `inspect`
reads the same input or refuses it with a ValueError. Never another exception, and
never a wrong file at the output path.

The small delta, its damage and the checks of apply are those of the long-form fuzz
targets `delta/apply` and `delta/inspect` (benchmarks.fuzz_targets); here each kind of
damage gets its own run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.fuzz_targets import (
    SmallDelta,
    damaged_delta_header,
    damaged_delta_payloads,
    random_delta,
    small_delta,
)
from benchmarks.hostile import mutated_bytes

T = TypeVar("T")
FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> SmallDelta:
    return small_delta(tmp_path_factory.mktemp("delta-fuzz"))


def outcome(call: Callable[[], T], refusals: tuple[type[Exception], ...]) -> T | str:
    """What `call` returns, or the sentence it is refused with; anything else raises."""
    try:
        return call()
    except refusals as e:
        return str(e)


def apply_and_inspect(case: SmallDelta, data: bytes) -> None:
    """Applies and reads `data` as the delta and checks both outcomes."""
    applied = outcome(lambda: case.apply(data), (ValueError, OSError))
    if not isinstance(applied, str):
        assert applied == case.target
    inspected = outcome(lambda: case.inspect(data), (ValueError,))
    for refusal in (r for r in (applied, inspected) if isinstance(r, str)):
        assert refusal.strip()
        assert "\n" not in refusal
    if not isinstance(inspected, str):
        assert inspected.delta_size == len(data)


def test_the_valid_delta_applies(case):
    """The undamaged delta rebuilds the step, and holds both encodings to damage."""
    assert case.apply(case.valid) == case.target
    assert {t.encoding for t in case.inspect(case.valid).tensors} == {"xor", "sparse"}


@FUZZ
@given(data=st.data())
def test_damaged_bytes(case, data):
    apply_and_inspect(case, data.draw(mutated_bytes(case.valid)))


@FUZZ
@given(data=st.data())
def test_damaged_header_fields(case, data):
    apply_and_inspect(case, data.draw(damaged_delta_header(case)))


@FUZZ
@given(data=st.data())
def test_damaged_payloads(case, data):
    apply_and_inspect(case, data.draw(damaged_delta_payloads(case)))


@FUZZ
@given(data=random_delta())
def test_random_bytes(case, data):
    apply_and_inspect(case, data)
