"""Token amounts as people write them, and back."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarmrl.chain.tokens import format_tokens, parse_tokens


@pytest.mark.parametrize(
    ("text", "units"),
    [
        ("1", 10**18),
        ("12", 12 * 10**18),
        ("2.5", 25 * 10**17),
        ("0.5", 5 * 10**17),
        ("007.50", 75 * 10**17),
        ("0.000000000000000001", 1),
    ],
)
def test_parse(text, units):
    assert parse_tokens(text) == units


@pytest.mark.parametrize(
    "text",
    [
        "abc",
        "",
        "1_000",
        "1e3",
        "1E3",
        "\uff11\uff12",  # full-width digits
        "\u0661\u0662",  # Arabic-Indic digits
        "\U0001d7d9",  # mathematical double-struck one
        "-1",
        "+1",
        " 1",
        "1 ",
        "1 000",
        "1.",
        ".5",
        "1,5",
        "0x10",
        "NaN",
        "Infinity",
        "1.2.3",
    ],
)
def test_only_plain_decimals_are_amounts(text):
    message = f"{text!r} is not an amount of tokens: write a plain decimal such as 12 or 0.5"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        parse_tokens(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0", "'0' must be a positive amount of tokens"),
        ("0.000", "'0.000' must be a positive amount of tokens"),
        ("0.0000000000000000001", "'0.0000000000000000001' has more than the token's 18 decimals"),
        ("9" * 60, f"{'9' * 60!r} is more tokens than can exist"),
        ("1" * 101, "that amount is too long to be an amount of tokens"),
    ],
)
def test_bad_amounts_are_one_clear_error(text, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        parse_tokens(text)


def test_the_largest_amount_that_exists_is_accepted():
    largest = 2**256 - 1
    assert parse_tokens(format_tokens(largest)) == largest
    with pytest.raises(ValueError, match="more tokens than can exist"):
        parse_tokens(format_tokens(largest + 1))


@given(st.integers(min_value=1, max_value=2**256 - 1))
def test_format_then_parse_round_trips(units):
    assert parse_tokens(format_tokens(units)) == units


@given(st.text(max_size=30))
def test_any_text_is_an_amount_or_one_sentence(text):
    try:
        units = parse_tokens(text)
    except ValueError as e:
        sentence = str(e)
    else:
        assert 0 < units < 2**256
        assert text.isascii()
        return
    assert "\n" not in sentence


def test_format_drops_trailing_zeros():
    assert format_tokens(25 * 10**17) == "2.5"
    assert format_tokens(10**18) == "1"
    assert format_tokens(0) == "0"
