"""Deploying the protocol and the deployment file that tells everyone where it is.

`deploy` puts StakeToken, ProviderRegistry, StakeManager and one ComputePool
(for one run id) on any chain the deployer's key can pay for: anvil locally,
Base Sepolia publicly. Nothing here assumes chain 31337; only the dev defaults
in `swarmrl chain up` do. The deployment file is the one input every other
process needs besides an RPC URL and a key; it is written atomically (temp
file, fsync, rename) so a reader never sees half of it.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Annotated, Any

import pydantic_core
from eth_account.signers.local import LocalAccount
from eth_typing import ChecksumAddress
from eth_utils import is_address, keccak, to_checksum_address
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from web3 import Web3
from web3.logs import DISCARD

from swarmrl.chain.anvil import Anvil, dev_accounts
from swarmrl.chain.artifacts import CONTRACTS, load_artifact
from swarmrl.chain.errors import ChainConfigError, ChainError
from swarmrl.chain.paths import deployment_path
from swarmrl.chain.revert import RevertDecoder
from swarmrl.chain.tokens import MAX_UINT256, TOKEN
from swarmrl.chain.tx import TxSender, TxSettings
from swarmrl.files import os_error_reason, write_atomically

# 2: the pool is created by the stake manager through a PoolFactory, and records lock stake.
DEPLOYMENT_VERSION = 2
# Bounds of the amounts a deployment takes, round and within a uint256 (10**77 wei is
# below 2**256), so --help can state them.
MAX_TOKENS = 10**59
MAX_WEI = MAX_TOKENS * TOKEN
# A deployment file is about 1 KiB; reading is capped so that a wrong path (a device,
# a model) is refused rather than read whole.
MAX_DEPLOYMENT_BYTES = 1 << 20
MAX_RUN_NAME = 128  # as `rollouts generate --run` allows
# The contracts' bounds (StakeManager and ComputePool constants), checked here
# before the first transaction so that a bad value costs no gas.
MIN_UNBONDING_PERIOD = MIN_INVALIDATION_WINDOW = 60
MAX_UNBONDING_PERIOD = 30 * 24 * 3600
# Who is who on a dev chain, by anvil account index; the accounts after the
# treasury are providers and nodes, funded with tokens.
DEV_ADMIN, DEV_RECORDER, DEV_VALIDATOR, DEV_TREASURY = 0, 1, 2, 3
# The treasury that burns slashed stake. The stake manager's treasury is fixed at
# deployment, so a deployer who named itself would profit from every slash.
BURN_TREASURY = "0x" + "00" * 20


def _shown(value: object) -> str:
    """`value` quoted for a message, cut short: a damaged file may hold megabytes."""
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."


def checked_address(value: str) -> str:
    """The checksummed address, or ValueError naming the value that is not one."""
    if not isinstance(value, str) or not is_address(value):
        raise ValueError(f"{_shown(value)} is not an Ethereum address")
    return to_checksum_address(value)


def _bytes32_hex(value: str) -> str:
    raw = value.removeprefix("0x")
    if len(raw) != 64 or any(c not in "0123456789abcdefABCDEF" for c in raw):
        raise ValueError(f"{_shown(value)} is not 32 bytes of hex")
    return "0x" + raw.lower()


Address = Annotated[str, AfterValidator(checked_address)]
Bytes32Hex = Annotated[str, AfterValidator(_bytes32_hex)]


class ContractAddresses(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    stake_token: Address
    provider_registry: Address
    stake_manager: Address
    compute_pool: Address

    def by_name(self) -> dict[str, str]:
        """Addresses keyed by contract name, as in contracts/out."""
        return dict(zip(CONTRACTS, self.model_dump().values(), strict=True))


class ProtocolParams(BaseModel):
    """The numbers the contracts were deployed with (token amounts in wei, times
    in seconds), within the contracts' own bounds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_stake_per_node: int = Field(100 * TOKEN, ge=0, le=MAX_WEI)
    unbonding_period: int = Field(3600, ge=MIN_UNBONDING_PERIOD, le=MAX_UNBONDING_PERIOD)
    invalidation_window: int = Field(600, ge=MIN_INVALIDATION_WINDOW)
    reward_per_unit: int = Field(TOKEN // 10, ge=0, le=MAX_WEI)
    slash_penalty: int = Field(50 * TOKEN, ge=0, le=MAX_WEI)
    quorum: int = Field(1, ge=1, le=MAX_UINT256)

    @model_validator(mode="after")
    def _within_each_other(self) -> ProtocolParams:
        if self.invalidation_window > self.unbonding_period:
            raise ValueError(
                f"the invalidation window ({self.invalidation_window} s) must not be longer "
                f"than the unbonding period ({self.unbonding_period} s)"
            )
        if self.slash_penalty > self.min_stake_per_node:
            raise ValueError("the slash penalty must not be more than the minimum stake per node")
        return self

    @classmethod
    def checked(cls, **values: int) -> ProtocolParams:
        """The parameters, or ChainConfigError naming the first one out of bounds."""
        try:
            return cls(**values)
        except ValidationError as e:
            first = e.errors()[0]
            msg = first["msg"].removeprefix("Value error, ")
            where = ".".join(str(p) for p in first["loc"])
            sentence = f"{where.replace('_', ' ')} {msg.lower()}" if where else msg
            raise ChainConfigError(sentence) from None


class Deployment(BaseModel):
    """Where one deployment of the protocol lives; the content of deployment.json."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = DEPLOYMENT_VERSION
    chain_id: int = Field(gt=0)
    rpc_url: str
    run_id: Bytes32Hex
    deploy_block: int = Field(ge=0)
    admin: Address
    treasury: Address
    recorders: list[Address]
    validators: list[Address]
    contracts: ContractAddresses
    params: ProtocolParams

    @property
    def run_id_bytes(self) -> bytes:
        return bytes.fromhex(self.run_id[2:])


def run_id_from_name(name: str) -> str:
    """A run id for a human name: keccak256 of it, or the value itself if already bytes32.
    A name starting with 0x must be a whole run id: a shortened one would silently
    become the hash of a different run."""
    if not name.strip():
        raise ChainConfigError("the run name is empty")
    if len(name) > MAX_RUN_NAME:
        raise ChainConfigError(f"the run name is longer than {MAX_RUN_NAME} characters")
    if name.startswith("0x"):
        try:
            return _bytes32_hex(name)
        except ValueError:
            raise ChainConfigError(
                f"run {_shown(name)} starts with 0x but is not a 32-byte run id "
                "(0x and 64 hex digits); give a run name without 0x instead"
            ) from None
    return "0x" + keccak(text=name).hex()


def write_deployment(path: Path, deployment: Deployment) -> None:
    """Writes the file atomically: readers see the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, (deployment.model_dump_json(indent=2) + "\n").encode())
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_deployment(path: Path | None = None) -> Deployment:
    """Reads and validates a deployment file (`path`, else the default one, see
    `swarmrl.chain.paths.deployment_path`); errors are one sentence."""
    path = deployment_path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_DEPLOYMENT_BYTES + 1)
    except FileNotFoundError:
        raise ChainConfigError(f"no deployment file at {path}: run `swarmrl chain up`") from None
    except IsADirectoryError:
        raise ChainConfigError(f"{path} is a folder, not a deployment file") from None
    except OSError as e:
        reason = os_error_reason(e)
        raise ChainConfigError(f"cannot read deployment file {path}: {reason}") from None
    if len(data) > MAX_DEPLOYMENT_BYTES:
        raise ChainConfigError(f"{path} is not a deployment file: it is larger than 1 MiB")
    try:
        # Not json.loads: web3 raises the recursion limit past what the C stack
        # survives, and pydantic-core caps nesting itself.
        raw = pydantic_core.from_json(data)
    except ValueError:
        raise ChainConfigError(
            f"cannot read deployment file {path}: it is not valid JSON"
        ) from None
    if not isinstance(raw, dict):
        raise ChainConfigError(f"deployment file {path} is invalid: it is not a JSON object")
    version = raw.get("version")
    if isinstance(version, int) and version != DEPLOYMENT_VERSION:
        raise ChainConfigError(
            f"deployment file {path} is version {version}, but this swarmrl reads version "
            f"{DEPLOYMENT_VERSION}: deploy the protocol again "
            "(`swarmrl chain up`, or `swarmrl chain deploy`)"
        )
    try:
        return Deployment.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "top level"
        raise ChainConfigError(
            f"deployment file {path} is invalid at {where}: {_problem(first)}"
        ) from None


def _problem(error: Any) -> str:
    """One validation error in words, without pydantic's class names."""
    kind = error["type"]
    if kind == "missing":
        return "the field is missing"
    if kind == "extra_forbidden":
        return "no such field belongs in a deployment file"
    if kind in ("model_type", "dict_type"):
        return "it should be a JSON object"
    message = str(error["msg"]).removeprefix("Value error, ")
    return message[0].lower() + message[1:]


@cache
def decoder() -> RevertDecoder:
    """A revert decoder knowing every protocol contract's errors."""
    return RevertDecoder({name: load_artifact(name).abi for name in CONTRACTS})


def _deploy_contract(sender: TxSender, w3: Web3, name: str, *args: Any) -> ChecksumAddress:
    artifact = load_artifact(name)
    factory = w3.eth.contract(abi=artifact.abi, bytecode=artifact.bytecode)
    receipt = sender.transact(factory.constructor(*args), name)
    address = receipt["contractAddress"]
    if address is None:
        raise ChainError(f"deploying {name} created no contract")
    return to_checksum_address(address)


def deploy(
    w3: Web3,
    admin: LocalAccount,
    *,
    rpc_url: str,
    run_id: str,
    recorders: list[str],
    validators: list[str],
    treasury: str,
    params: ProtocolParams | None = None,
    mint_to: dict[str, int] | None = None,
    pool_funding: int = 0,
    settings: TxSettings | None = None,
) -> Deployment:
    """Deploys and wires the protocol; `admin` pays gas and holds every admin role.

    `treasury` receives slashed stake for good (`BURN_TREASURY` burns it). The
    recorders, validators and `params` named here are part of the deployment and act
    at once; a recorder or validator appointed or revoked later, and a later window or
    reward per unit, apply only after the pool's SLASH_CHANGE_DELAY.
    `mint_to` mints tokens to accounts (a dev or test-net faucet), and
    `pool_funding` is minted to the admin and added to the pool's reward budget.
    """
    params = params or ProtocolParams()
    try:  # before any transaction: a typo must not leave a half-wired deployment
        run_id = _bytes32_hex(run_id)
        recorders = [checked_address(a) for a in recorders]
        validators = [checked_address(a) for a in validators]
        treasury = checked_address(treasury)
    except ValueError as e:
        raise ChainConfigError(str(e)) from None
    if len(set(validators)) < params.quorum:
        raise ChainConfigError(
            f"a quorum of {params.quorum} needs at least {params.quorum} distinct validators, "
            f"got {len(set(validators))}"
        )
    sender = TxSender(w3, admin, decoder(), settings)
    chain_id = sender.chain_id()
    deploy_block = w3.eth.block_number

    token = _deploy_contract(sender, w3, "StakeToken", admin.address)
    registry = _deploy_contract(sender, w3, "ProviderRegistry")
    factory = _deploy_contract(sender, w3, "PoolFactory")
    stake_manager = _deploy_contract(
        sender,
        w3,
        "StakeManager",
        token,
        registry,
        factory,
        admin.address,
        params.min_stake_per_node,
        params.unbonding_period,
        to_checksum_address(treasury),
    )
    # The stake manager creates the pool (and trusts only pools it created);
    # the pool's constructor grants the recorder and validator roles.
    manager_c = w3.eth.contract(address=stake_manager, abi=load_artifact("StakeManager").abi)
    pool_params = (
        params.invalidation_window,
        params.reward_per_unit,
        params.slash_penalty,
        params.quorum,
    )
    receipt = sender.transact(
        manager_c.functions.createPool(
            bytes.fromhex(run_id[2:]), admin.address, pool_params, recorders, validators
        ),
        "StakeManager",
    )
    (created,) = manager_c.events.PoolCreated().process_receipt(receipt, errors=DISCARD)
    pool = to_checksum_address(created["args"]["pool"])
    addresses = ContractAddresses(
        stake_token=token,
        provider_registry=registry,
        stake_manager=stake_manager,
        compute_pool=pool,
    )

    pool_c = w3.eth.contract(address=pool, abi=load_artifact("ComputePool").abi)
    token_c = w3.eth.contract(address=token, abi=load_artifact("StakeToken").abi)
    for account, amount in (mint_to or {}).items():
        if amount:
            sender.transact(
                token_c.functions.mint(to_checksum_address(account), amount), "StakeToken"
            )
    if pool_funding:
        sender.transact(token_c.functions.mint(admin.address, pool_funding), "StakeToken")
        sender.transact(token_c.functions.approve(pool, pool_funding), "StakeToken")
        sender.transact(pool_c.functions.fund(pool_funding), "ComputePool")

    return Deployment(
        chain_id=chain_id,
        rpc_url=rpc_url,
        run_id=run_id,
        deploy_block=deploy_block,
        admin=admin.address,
        treasury=treasury,
        recorders=recorders,
        validators=validators,
        contracts=addresses,
        params=params,
    )


def deploy_dev(
    anvil: Anvil,
    *,
    run_id: str,
    tokens_each: int,
    pool_funding: int,
    params: ProtocolParams | None = None,
) -> Deployment:
    """The protocol on a dev anvil with the dev accounts in their roles: every
    account after the treasury gets `tokens_each`, the pool `pool_funding`."""
    accounts = dev_accounts()
    return deploy(
        anvil.web3(),
        accounts[DEV_ADMIN],
        rpc_url=anvil.rpc_url,
        run_id=run_id,
        recorders=[accounts[DEV_RECORDER].address],
        validators=[accounts[DEV_VALIDATOR].address],
        treasury=accounts[DEV_TREASURY].address,
        params=params,
        mint_to={a.address: tokens_each for a in accounts[DEV_TREASURY + 1 :]},
        pool_funding=pool_funding,
    )
