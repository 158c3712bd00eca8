"""Revert data decoded into one sentence, using the contracts' own ABIs.

A revert carries 4 bytes of selector and ABI-encoded arguments. Custom errors
are looked up by selector in every known ABI (the called contract's first, since
a nested call's error bubbles up unchanged), so the user reads
"StakeManager reverted: InsufficientStake(available=0, requested=5)" rather than
a hex blob. Error(string) and Panic(uint256) are the compiler's built-ins.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from eth_abi import decode as abi_decode
from eth_utils import keccak, to_checksum_address

from swarmrl.chain.errors import RevertedError
from swarmrl.times import moment

ERROR_STRING_SELECTOR = bytes.fromhex("08c379a0")  # Error(string)
PANIC_SELECTOR = bytes.fromhex("4e487b71")  # Panic(uint256)
PANIC_REASONS = {
    0x00: "generic compiler panic",
    0x01: "assertion failed",
    0x11: "arithmetic overflow or underflow",
    0x12: "division or modulo by zero",
    0x21: "invalid enum value",
    0x22: "bad storage byte array encoding",
    0x31: "pop on an empty array",
    0x32: "array index out of bounds",
    0x41: "out of memory",
    0x51: "call to an uninitialized function",
}


def canonical_type(param: Mapping[str, Any]) -> str:
    """The ABI type as it appears in a signature, tuples expanded."""
    kind: str = param["type"]
    if kind.startswith("tuple"):
        inner = ",".join(canonical_type(c) for c in param.get("components", []))
        return f"({inner}){kind[len('tuple') :]}"
    return kind


@dataclass(frozen=True)
class ErrorSpec:
    name: str
    names: tuple[str, ...]
    types: tuple[str, ...]

    @property
    def signature(self) -> str:
        return f"{self.name}({','.join(self.types)})"


def selector(signature: str) -> bytes:
    return keccak(text=signature)[:4]


def _wall_clock() -> int:
    return int(time.time())


class _Clock:
    """`now`, asked at most once; the wall clock if asking fails (the decoding of one
    failure must not become another)."""

    def __init__(self, now: Callable[[], int]) -> None:
        self._now = now
        self._read: int | None = None

    def __call__(self) -> int:
        if self._read is None:
            try:
                self._read = int(self._now())
            except Exception:
                self._read = _wall_clock()
        return self._read


class RevertDecoder:
    """Maps error selectors to names and argument types, per contract ABI."""

    def __init__(self, abis: Mapping[str, Iterable[Mapping[str, Any]]]) -> None:
        self._by_contract: dict[str, dict[bytes, ErrorSpec]] = {}
        for contract, abi in abis.items():
            errors: dict[bytes, ErrorSpec] = {}
            for item in abi:
                if item.get("type") != "error":
                    continue
                inputs = item.get("inputs", [])
                spec = ErrorSpec(
                    name=item["name"],
                    names=tuple(p.get("name") or f"arg{i}" for i, p in enumerate(inputs)),
                    types=tuple(canonical_type(p) for p in inputs),
                )
                errors[selector(spec.signature)] = spec
            self._by_contract[contract] = errors

    def lookup(self, sel: bytes, contract: str | None = None) -> ErrorSpec | None:
        if contract in self._by_contract and sel in self._by_contract[contract]:
            return self._by_contract[contract][sel]
        for errors in self._by_contract.values():
            if sel in errors:
                return errors[sel]
        return None

    def decode(
        self, data: bytes, contract: str | None = None, *, now: Callable[[], int] = _wall_clock
    ) -> RevertedError:
        """A RevertedError whose message is one sentence naming the error and arguments;
        an argument that is a unix time is shown as a date and how far it is from `now`
        (the chain's clock, asked only then)."""
        who = f"{contract} reverted" if contract else "the call reverted"
        if not data:
            return RevertedError(f"{who} without a reason", contract=contract, data=data)
        sel, body = data[:4], data[4:]
        try:
            if sel == ERROR_STRING_SELECTOR:
                (reason,) = abi_decode(["string"], body)
                return RevertedError(
                    f"{who}: {reason}",
                    contract=contract,
                    error="Error",
                    args={"reason": reason},
                    data=data,
                )
            if sel == PANIC_SELECTOR:
                (code,) = abi_decode(["uint256"], body)
                meaning = PANIC_REASONS.get(code, "unknown panic code")
                return RevertedError(
                    f"{who}: Panic(0x{code:02x}: {meaning})",
                    contract=contract,
                    error="Panic",
                    args={"code": code},
                    data=data,
                )
            spec = self.lookup(sel, contract)
            if spec is not None:
                values = abi_decode(list(spec.types), body)
                args = dict(zip(spec.names, values, strict=True))
                clock = _Clock(now)
                shown = ", ".join(
                    f"{n}={moment(v, clock()) if is_unix_time(n, t) else _show(v, t)}"
                    for n, v, t in zip(spec.names, values, spec.types, strict=True)
                )
                return RevertedError(
                    f"{who}: {spec.name}({shown})",
                    contract=contract,
                    error=spec.name,
                    args=args,
                    data=data,
                )
        except Exception:  # malformed arguments: fall through to the raw selector
            pass
        return RevertedError(
            f"{who} with unknown error 0x{sel.hex()} ({len(data)} bytes of revert data)",
            contract=contract,
            data=data,
        )


def is_unix_time(name: str, kind: str) -> bool:
    """Whether a contract's error or event argument is a unix time, as the contracts
    name them: `unlocksAt`, `effectiveAt`, `deadline`, `until`, `releaseTime`."""
    return kind.startswith("uint") and (
        name in ("deadline", "until", "releaseTime") or name.endswith("At")
    )


def _show(value: Any, kind: str) -> str:
    """Arguments as a person reads them: decimal numbers, checksummed addresses, 0x bytes."""
    if kind == "address":
        return to_checksum_address(value)
    if isinstance(value, bytes):
        return "0x" + value.hex()
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_show(v, kind.rstrip("[]")) for v in value) + "]"
    return str(value)


def revert_data_of(exc: BaseException) -> bytes | None:
    """The raw revert data carried by a web3 exception, or None if it carries none."""
    data: Any = getattr(exc, "data", None)
    if data is None:
        response = getattr(exc, "rpc_response", None)
        if isinstance(response, Mapping):
            error = response.get("error")
            if isinstance(error, Mapping):
                data = error.get("data")
    if isinstance(data, Mapping):
        data = data.get("data")
    if isinstance(data, bytes):
        return data
    if isinstance(data, str) and data.startswith("0x"):
        try:
            return bytes.fromhex(data[2:])
        except ValueError:
            return None
    return None
