"""The protocol deployed to any chain with a keystore key: what `swarmrl chain deploy`
does.

Everything that costs nothing (the parameters, the addresses, the URL, the output
file, the keystore) is checked before the key is decrypted and long before the first
transaction: a typo must not cost gas. Each refusal is a `ChainConfigError` (a
ValueError) in one sentence that names the command's option. The module itself
imports nothing heavy, so `--help` can read its bound without web3.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from swarmrl.chain.errors import ChainError

if TYPE_CHECKING:
    from swarmrl.chain.deploy import Deployment

# deploy.MAX_TOKENS, the bound the contracts' uint256 leaves for whole tokens, as text.
MAX_TOKENS_TEXT = "10^59"


class DeploymentNotWrittenError(ChainError):
    """The protocol is deployed but its deployment file could not be written; the
    deployment is kept here, since the contracts it names were paid for and cannot be
    found again otherwise."""

    def __init__(self, sentence: str, deployment: Deployment) -> None:
        super().__init__(sentence)
        self.deployment = deployment


@dataclass(frozen=True)
class Deployed:
    """The chain deployed on, and the deployment written to `path`."""

    chain_id: int
    deployment: Deployment
    path: Path

    def summary(self) -> list[str]:
        return [
            f"deployed on chain {self.chain_id}: pool {self.deployment.contracts.compute_pool}",
            f"deployment: {self.path}",
        ]


def deploy_protocol(
    *,
    rpc_url: str,
    key: str,
    out: Path,
    run: str = "dev",
    recorders: Sequence[str] = (),
    validators: Sequence[str] = (),
    treasury: str | None = None,
    quorum: int = 1,
    min_stake: int = 100,
    unbonding_period: int = 7 * 24 * 3600,
    invalidation_window: int = 24 * 3600,
    reward_per_unit_wei: int = 10**17,
    slash_penalty: int = 50,
    force: bool = False,
    keystore_dir: Path | None = None,
    password_file: Path | None = None,
) -> Deployed:
    """Deploys the protocol on `rpc_url` with keystore key `key` as admin and payer
    (stakes and the penalty in whole tokens) and writes the deployment file `out`
    (over an existing one only with `force`)."""
    from swarmrl import keystore
    from swarmrl.chain.anvil import check_rpc_url, connect
    from swarmrl.chain.deploy import (
        BURN_TREASURY,
        MAX_TOKENS,
        ProtocolParams,
        checked_address,
        deploy,
        run_id_from_name,
        write_deployment,
    )
    from swarmrl.chain.errors import ChainConfigError
    from swarmrl.chain.tokens import TOKEN
    from swarmrl.chain.tx import with_rpc_retries
    from swarmrl.files import check_output_path, os_error_sentence

    for flag, tokens in (("--min-stake", min_stake), ("--slash-penalty", slash_penalty)):
        if tokens > MAX_TOKENS:
            raise ChainConfigError(f"{flag} {tokens} is above {MAX_TOKENS_TEXT} tokens")
    if reward_per_unit_wei > MAX_TOKENS * TOKEN:
        raise ChainConfigError(
            f"--reward-per-unit-wei {reward_per_unit_wei} is above {MAX_TOKENS_TEXT} tokens"
        )
    params = ProtocolParams.checked(
        min_stake_per_node=min_stake * TOKEN,
        unbonding_period=unbonding_period,
        invalidation_window=invalidation_window,
        reward_per_unit=reward_per_unit_wei,
        slash_penalty=slash_penalty * TOKEN,
        quorum=quorum,
    )
    run_id = run_id_from_name(run)
    try:
        recorder_addresses = [checked_address(a) for a in recorders]
        validator_addresses = [checked_address(a) for a in validators]
        treasury = None if treasury is None else checked_address(treasury)
    except ValueError as e:
        raise ChainConfigError(str(e)) from None
    if len(set(validator_addresses)) < quorum:
        raise ChainConfigError(
            f"--quorum {quorum} needs at least {quorum} distinct --validator addresses"
        )
    check_rpc_url(rpc_url)
    check_output_path(out)
    if out.exists() and not force:
        raise ChainConfigError(f"{out} exists; pass --force to overwrite it")
    directory = keystore_dir or keystore.default_dir()
    keystore.info(directory, key)  # the keystore exists and is readable
    password = keystore.read_password(password_file)
    w3 = connect(rpc_url)
    chain_id = with_rpc_retries(lambda: w3.eth.chain_id, what="eth_chainId")
    admin = keystore.unlock(directory, key, password)
    deployment = deploy(
        w3,
        admin,
        rpc_url=rpc_url,
        run_id=run_id,
        recorders=recorder_addresses,
        validators=validator_addresses,
        treasury=treasury or BURN_TREASURY,
        params=params,
    )
    try:
        write_deployment(out, deployment)
    except OSError as e:
        raise DeploymentNotWrittenError(
            f"the protocol is deployed but {out} could not be written ({os_error_sentence(e)}); "
            "the deployment file is printed on stdout instead: save it",
            deployment,
        ) from None
    return Deployed(chain_id, deployment, out)
