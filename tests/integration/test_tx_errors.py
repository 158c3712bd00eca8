"""Revert decoding, RPC retries and the send lock, without the protocol contracts."""

import re
import subprocess
import sys
import time

import pytest
import requests
from eth_abi import encode
from web3 import Web3

from swarmrl.chain import tx as tx_mod
from swarmrl.chain.errors import ChainError, RevertedError, RpcUnavailableError
from swarmrl.chain.revert import RevertDecoder, selector

ABI = [
    {
        "type": "error",
        "name": "InsufficientStake",
        "inputs": [
            {"name": "available", "type": "uint256"},
            {"name": "requested", "type": "uint256"},
        ],
    },
    {"type": "error", "name": "NotProvider", "inputs": [{"name": "account", "type": "address"}]},
    {"type": "error", "name": "NothingToWithdraw", "inputs": []},
    {
        "type": "error",
        "name": "WindowOpen",
        "inputs": [
            {"name": "epoch", "type": "uint64"},
            {"name": "node", "type": "address"},
            {"name": "unlocksAt", "type": "uint256"},
        ],
    },
    {
        "type": "error",
        "name": "ConsentExpired",
        "inputs": [{"name": "deadline", "type": "uint256"}],
    },
]
OTHER = [{"type": "error", "name": "BadSignature", "inputs": []}]
DECODER = RevertDecoder({"StakeManager": ABI, "ComputePool": OTHER})
ADDRESS = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"


def test_custom_error_by_name_and_arguments():
    data = selector("InsufficientStake(uint256,uint256)") + encode(["uint256", "uint256"], [0, 5])
    error = DECODER.decode(data, "StakeManager")
    assert str(error) == "StakeManager reverted: InsufficientStake(available=0, requested=5)"
    assert error.error == "InsufficientStake"
    assert error.args_by_name == {"available": 0, "requested": 5}


def test_addresses_are_checksummed_and_nested_errors_found():
    who = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8"
    data = selector("NotProvider(address)") + encode(["address"], [who])
    assert str(DECODER.decode(data, "ComputePool")) == (
        f"ComputePool reverted: NotProvider(account={Web3.to_checksum_address(who)})"
    )


def test_unix_times_are_dates_and_how_far_from_the_chain_s_clock():
    window_open = selector("WindowOpen(uint64,address,uint256)")
    data = window_open + encode(["uint64", "address", "uint256"], [3, ADDRESS, 1795658956])
    error = DECODER.decode(data, "ComputePool", now=lambda: 1795658956 - 599)
    assert str(error) == (
        f"ComputePool reverted: WindowOpen(epoch=3, node={ADDRESS}, "
        "unlocksAt=2026-11-26 02:09:16 UTC (in 9 min 59 s))"
    )
    assert error.args_by_name["unlocksAt"] == 1795658956  # the number itself, for callers
    expired = selector("ConsentExpired(uint256)") + encode(["uint256"], [1795658956])
    assert str(DECODER.decode(expired, "X", now=lambda: 1795658956 + 3 * 3600 + 120)) == (
        "X reverted: ConsentExpired(deadline=2026-11-26 02:09:16 UTC (3 h 2 min ago))"
    )
    # Beyond any calendar: the number as it is.
    beyond = selector("ConsentExpired(uint256)") + encode(["uint256"], [2**255])
    assert str(DECODER.decode(beyond, "X", now=lambda: 0)) == (
        f"X reverted: ConsentExpired(deadline={2**255})"
    )
    # Amounts are not times, whatever the clock.
    stake = selector("InsufficientStake(uint256,uint256)") + encode(["uint256"] * 2, [0, 5])
    assert "available=0, requested=5" in str(DECODER.decode(stake, "StakeManager", now=lambda: 9))


def test_a_clock_that_fails_gives_way_to_the_wall_clock():
    def unreachable() -> int:
        raise RpcUnavailableError("the RPC endpoint did not answer")

    later = int(time.time()) + 3 * 86400 + 7200 + 30  # 3 d 2 h ahead, give or take a second
    data = selector("ConsentExpired(uint256)") + encode(["uint256"], [later])
    assert re.fullmatch(
        r"X reverted: ConsentExpired\(deadline=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC "
        r"\(in 3 d 2 h\)\)",
        str(DECODER.decode(data, "X", now=unreachable)),
    )


def test_error_string_panic_empty_and_unknown():
    data = bytes.fromhex("08c379a0") + encode(["string"], ["not allowed"])
    assert str(DECODER.decode(data, "X")) == "X reverted: not allowed"
    panic = bytes.fromhex("4e487b71") + encode(["uint256"], [0x11])
    assert str(DECODER.decode(panic, "X")) == (
        "X reverted: Panic(0x11: arithmetic overflow or underflow)"
    )
    assert str(DECODER.decode(b"", "X")) == "X reverted without a reason"
    assert "unknown error 0xdeadbeef" in str(DECODER.decode(bytes.fromhex("deadbeef"), "X"))
    assert str(DECODER.decode(selector("NothingToWithdraw()"), None)) == (
        "the call reverted: NothingToWithdraw()"
    )
    assert isinstance(DECODER.decode(b"", "X"), RevertedError)


def test_transient_errors_are_retried_with_backoff(monkeypatch):
    calls = []
    sleeps = []
    monkeypatch.setattr(tx_mod.time, "sleep", sleeps.append)

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise requests.ConnectionError("refused")
        return 42

    assert tx_mod.with_rpc_retries(flaky, what="x", retries=5, backoff=0.1) == 42
    assert sleeps == [0.1, 0.2]


def test_an_unreachable_rpc_is_one_sentence(monkeypatch):
    monkeypatch.setattr(tx_mod.time, "sleep", lambda s: None)
    w3 = Web3(Web3.HTTPProvider("http://127.0.0.1:9", exception_retry_configuration=None))
    with pytest.raises(RpcUnavailableError, match=r"did not answer eth_chainId after 3 attempts"):
        tx_mod.with_rpc_retries(lambda: w3.eth.chain_id, what="eth_chainId", retries=2)


def test_non_transient_errors_are_not_retried():
    calls = []

    def broken():
        calls.append(1)
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        tx_mod.with_rpc_retries(broken, what="x")
    assert len(calls) == 1


def test_the_account_lock_waits_for_another_process_then_is_taken(tmp_path):
    """A second holder waits (and is told so) until the first process lets go."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from swarmrl.chain.tx import account_lock\n"
            f"with account_lock(1, {ADDRESS!r}, directory=Path({str(tmp_path)!r})):\n"
            "    print('held', flush=True); sys.stdin.readline()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline() == "held\n"
        waited = []

        def release() -> None:
            waited.append(True)
            child.stdin.write("done\n")
            child.stdin.flush()

        with tx_mod.account_lock(1, ADDRESS, directory=tmp_path, on_wait=release):
            assert child.wait(timeout=30) == 0  # it let go before this block began
        assert waited == [True]
        with tx_mod.account_lock(1, ADDRESS, directory=tmp_path, on_wait=release):
            pass  # free again: no wait
        assert waited == [True]
    finally:
        child.kill()
        child.wait()


def test_an_unusable_lock_folder_is_one_sentence(tmp_path):
    taken = tmp_path / "file"
    taken.write_text("")
    message = f"cannot take the send lock of {ADDRESS}: {taken} is not a folder"
    with (
        pytest.raises(ChainError, match=f"^{re.escape(message)}$"),
        tx_mod.account_lock(1, ADDRESS, directory=taken),
    ):
        pass
