"""One real anvil per test session; every test runs on a snapshot of it.

Starting anvil and deploying takes a fraction of a second, but doing it once
keeps the suite fast; `evm_snapshot`/`evm_revert` around each test makes the
tests independent anyway (chain state and time both roll back).
"""

from __future__ import annotations

import pytest

from swarmrl.chain import anvil as anvil_mod
from swarmrl.chain.anvil import Anvil, dev_accounts
from swarmrl.chain.deploy import DEV_ADMIN, DEV_RECORDER, DEV_TREASURY, DEV_VALIDATOR


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


# Who is who on the dev chain (anvil account indexes), as `swarmrl chain up` sets it.
ADMIN, RECORDER, VALIDATOR, TREASURY = DEV_ADMIN, DEV_RECORDER, DEV_VALIDATOR, DEV_TREASURY
PROVIDER_A, NODE_A, PROVIDER_B, NODE_B, OUTSIDER = 4, 5, 6, 7, 8


def change_roles_after_delay(contracts, accounts, role, *indexes, grant=True):
    """The admin schedules granting (or revoking) the pool's `role` for the accounts
    `indexes`; the chain's clock then passes the pool's delay and the changes are applied."""
    admin = contracts.as_account(accounts[ADMIN])
    for index in indexes:
        admin.pool.schedule_role_change(role, accounts[index].address, grant=grant)
    anvil_mod.increase_time(contracts.w3, contracts.pool.change_delay())
    for index in indexes:
        admin.pool.apply_role_change(role, accounts[index].address)


@pytest.fixture(scope="session")
def deployment(anvil):
    """The protocol deployed once per session (the tests revert to a snapshot after it)."""
    from swarmrl.chain.deploy import ProtocolParams, deploy_dev, run_id_from_name
    from swarmrl.chain.tokens import TOKEN

    return deploy_dev(
        anvil,
        run_id=run_id_from_name("integration"),
        params=ProtocolParams(
            min_stake_per_node=100 * TOKEN,
            unbonding_period=3600,
            invalidation_window=600,
            reward_per_unit=TOKEN // 10,
            slash_penalty=50 * TOKEN,
            quorum=1,
        ),
        tokens_each=1_000 * TOKEN,
        pool_funding=10_000 * TOKEN,
    )


@pytest.fixture
def contracts(deployment, w3):
    """A read-only Protocol on a fresh snapshot; `.as_account(...)` to act."""
    from swarmrl.chain.contracts import Contracts

    return Contracts(w3, deployment)
