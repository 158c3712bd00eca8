"""Amounts of the stake token: written by people as plain decimals ("12", "0.5"),
held on chain in base units (18 decimals, as StakeToken has)."""

from __future__ import annotations

import re

TOKEN_DECIMALS = 18  # StakeToken's
TOKEN: int = 10**TOKEN_DECIMALS  # int ** int is Any to mypy: the exponent might be negative
MAX_UINT256 = 2**256 - 1
# Decimal() would also take "1_000", "1e3", signs, spaces and any script's digits.
_PLAIN_DECIMAL = re.compile(r"([0-9]+)(?:\.([0-9]+))?")
_MAX_CHARS = 100  # a uint256 is 78 digits; anything longer was given by mistake


def parse_tokens(text: str) -> int:
    """Tokens as a person writes them ("12", "0.5") to base units: a plain decimal in
    ASCII digits, positive, with at most the token's 18 decimals, and no more than a
    uint256 holds. ValueError with one sentence otherwise."""
    if len(text) > _MAX_CHARS:
        raise ValueError("that amount is too long to be an amount of tokens")
    match = _PLAIN_DECIMAL.fullmatch(text)
    if match is None:
        raise ValueError(
            f"{text!r} is not an amount of tokens: write a plain decimal such as 12 or 0.5"
        )
    whole, fraction = match.group(1), match.group(2) or ""
    if len(fraction) > TOKEN_DECIMALS:
        raise ValueError(f"{text!r} has more than the token's {TOKEN_DECIMALS} decimals")
    units = int(whole) * TOKEN + int(fraction.ljust(TOKEN_DECIMALS, "0"))
    if units == 0:
        raise ValueError(f"{text!r} must be a positive amount of tokens")
    if units > MAX_UINT256:
        raise ValueError(f"{text!r} is more tokens than can exist")
    return units


def format_tokens(units: int) -> str:
    """Base units as tokens, without trailing zeros."""
    whole, fraction = divmod(units, TOKEN)
    return f"{whole}.{fraction:0{TOKEN_DECIMALS}d}".rstrip("0").rstrip(".")
