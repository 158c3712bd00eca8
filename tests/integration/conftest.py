"""One real anvil per test session; every test runs on a snapshot of it.

Starting anvil and deploying takes a fraction of a second, but doing it once
keeps the suite fast; `evm_snapshot`/`evm_revert` around each test makes the
tests independent anyway (chain state and time both roll back).
"""

from __future__ import annotations

import pytest

from swarmrl.chain import anvil as anvil_mod
from swarmrl.chain.anvil import Anvil, dev_accounts


@pytest.fixture(scope="session")
def anvil():
    node = Anvil.start()
    yield node
    node.stop()


@pytest.fixture(scope="session")
def accounts():
    return dev_accounts()


@pytest.fixture
def w3(anvil):
    """A Web3 on the session's anvil, with the chain reverted after the test."""
    web3 = anvil.web3()
    snap = anvil_mod.snapshot(web3)
    yield web3
    anvil_mod.revert(web3, snap)
