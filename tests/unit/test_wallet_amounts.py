"""Token amounts as people write them, and back."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client.wallet import format_amount, parse_amount


@pytest.mark.parametrize(
    ("text", "units"),
    [("1", 10**18), ("2.5", 25 * 10**17), ("0.000000000000000001", 1), ("1e3", 10**21)],
)
def test_parse(text, units):
    assert parse_amount(text) == units


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("abc", "not an amount"),
        ("", "not an amount"),
        ("0", "positive"),
        ("-1", "positive"),
        ("0.0000000000000000001", "at most 18 decimals"),
        ("NaN", "positive"),
        ("Infinity", "positive"),
        ("1e999999999", "more tokens than can exist"),
        ("1" * 101, "too long"),
    ],
)
def test_bad_amounts_are_one_clear_error(text, message):
    with pytest.raises(ValueError, match=message):
        parse_amount(text)


@given(st.integers(min_value=1, max_value=10**40))
def test_format_then_parse_round_trips(units):
    assert parse_amount(format_amount(units)) == units


def test_format_drops_trailing_zeros():
    assert format_amount(25 * 10**17) == "2.5"
    assert format_amount(10**18) == "1"
    assert format_amount(0) == "0"
