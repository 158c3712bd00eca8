"""`swarmrl chain`: a local development chain with the protocol deployed.

`up` starts anvil detached from this process (its pid file and log live in the
state directory), deploys every contract with the dev accounts in their roles,
and writes deployment.json; `down` stops it (and its state is gone); `status`
says whether it runs; `advance` moves a local anvil's clock. `deploy` puts the
protocol on any other chain (Base Sepolia) with a key from the keystore and writes
the deployment file that every other command reads. `mint` and `fund` are a test
network's faucet and its reward budget. Every check that needs no transaction
runs before the first one. Heavy imports (web3) happen inside the commands so
`swarmrl --help` stays fast.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from swarmrl.chain.deploy_protocol import MAX_TOKENS_TEXT
from swarmrl.chain.paths import DEPLOYMENT_FILE, default_state_dir
from swarmrl.cli_options import DeploymentFile, KeystoreDir, PasswordFile

if TYPE_CHECKING:
    from swarmrl.chain.contracts import Contracts

chain_app = typer.Typer(
    help="The protocol on chain: a local anvil, deployments, test tokens, the reward budget.",
    no_args_is_help=True,
)

PID_FILE = "anvil.pid"
LOG_FILE = "anvil.log"
LOCK_FILE = "chain.lock"
# A pid file holds one number; reading more would only read garbage.
PID_FILE_BYTES = 64
DEV_TOKENS = 10_000
# deploy.ProtocolParams' defaults, written here too because --help is built before web3
# (and so swarmrl.chain.deploy) loads; a test holds them equal.
DEV_INVALIDATION_WINDOW = 600
DEV_UNBONDING_PERIOD = 3600
# A year: how far `advance` moves the clock at most.
MAX_ADVANCE_SECONDS = 365 * 24 * 3600
# The local chain mines a block at least this often, so that its clock (windows, unbonding)
# follows the wall clock while no transaction is sent.
LOCAL_BLOCK_SECONDS = 1
DEV_POOL_FUNDING = 100_000

StateDir = typer.Option(
    None,
    "--state-dir",
    help="Where the pid file, log and deployment.json live "
    "(default: $SWARMRL_CHAIN_DIR or $XDG_DATA_HOME/swarmrl/chain).",
)


@contextmanager
def _one_sentence_errors() -> Iterator[None]:
    """Chain, RPC and file-system failures end as one sentence on stderr and exit 1."""
    from swarmrl.chain.errors import ChainError, rpc_failure_sentence
    from swarmrl.files import os_error_sentence

    try:
        yield
    except ChainError as e:
        _fail(str(e))
    except Exception as e:
        sentence = rpc_failure_sentence(e)
        if sentence is None and isinstance(e, OSError):
            sentence = os_error_sentence(e)
        if sentence is None:
            raise
        _fail(sentence)


def _fail(sentence: str) -> None:
    typer.secho(f"error: {sentence}", err=True, fg=typer.colors.RED)
    raise typer.Exit(1)


def _read_pid(state_dir: Path) -> int | None:
    """The pid in the pid file; None if there is none, or it holds no plausible pid (a
    stale or damaged file is not a running chain)."""
    from swarmrl.chain.anvil import MAX_PID
    from swarmrl.chain.errors import ChainConfigError
    from swarmrl.files import os_error_reason

    path = state_dir / PID_FILE
    try:
        with open(path, "rb") as f:
            words = f.read(PID_FILE_BYTES).split()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ChainConfigError(f"cannot read the pid file {path}: {os_error_reason(e)}") from None
    if not words or not words[0].isdigit():  # bytes.isdigit: ASCII digits only
        return None
    pid = int(words[0])
    return pid if 0 < pid <= MAX_PID else None


def _running_pid(state_dir: Path) -> int | None:
    from swarmrl.chain.anvil import is_anvil_pid

    pid = _read_pid(state_dir)
    return pid if pid is not None and is_anvil_pid(pid) else None


def _check_state_folder(state_dir: Path) -> None:
    """One sentence if `state_dir`, or a folder above it, is a file: `down` would
    otherwise report no chain there and exit 0, where `up` cannot use it."""
    from swarmrl.chain.errors import ChainConfigError

    nearest = state_dir
    while not nearest.exists() and nearest != nearest.parent:
        nearest = nearest.parent
    if nearest == state_dir and not state_dir.is_dir():
        raise ChainConfigError(f"the state folder {state_dir} is a file")
    if not nearest.is_dir():
        raise ChainConfigError(f"the state folder {state_dir} is under {nearest}, which is a file")


@chain_app.command()
def up(
    state_dir: Path | None = StateDir,
    run: str = typer.Option("dev", "--run", help="Run name or 0x-prefixed bytes32 run id."),
    invalidation_window: int = typer.Option(
        DEV_INVALIDATION_WINDOW,
        "--invalidation-window",
        min=60,
        max=DEV_UNBONDING_PERIOD,
        help="Seconds recorded work stays slashable before it can be claimed.",
    ),
) -> None:
    """Start anvil in the background on 127.0.0.1 and deploy the protocol."""
    state_dir = state_dir or default_state_dir()
    with _one_sentence_errors():
        from swarmrl.chain.anvil import DEV_ACCOUNTS, Anvil
        from swarmrl.chain.deploy import (
            DEV_ADMIN,
            DEV_RECORDER,
            DEV_TREASURY,
            DEV_VALIDATOR,
            ProtocolParams,
            deploy_dev,
            run_id_from_name,
            write_deployment,
        )
        from swarmrl.chain.errors import ChainError
        from swarmrl.chain.tokens import TOKEN
        from swarmrl.locks import exclusive_use

        params = ProtocolParams.checked(
            unbonding_period=DEV_UNBONDING_PERIOD, invalidation_window=invalidation_window
        )
        run_id = run_id_from_name(run)
        _check_state_folder(state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        with exclusive_use(state_dir / LOCK_FILE, state_dir, "swarmrl chain up"):
            if (pid := _running_pid(state_dir)) is not None:
                raise ChainError(
                    f"a chain is already running from {state_dir} (pid {pid}); "
                    "run `swarmrl chain down` first"
                )
            anvil = Anvil.start(
                log_path=state_dir / LOG_FILE, detached=True, block_seconds=LOCAL_BLOCK_SECONDS
            )
            try:
                (state_dir / PID_FILE).write_text(f"{anvil.pid}\n")
                deployment = deploy_dev(
                    anvil,
                    run_id=run_id,
                    tokens_each=DEV_TOKENS * TOKEN,
                    pool_funding=DEV_POOL_FUNDING * TOKEN,
                    params=params,
                )
                path = state_dir / DEPLOYMENT_FILE
                write_deployment(path, deployment)
            except BaseException:
                anvil.stop()
                (state_dir / PID_FILE).unlink(missing_ok=True)
                raise
        typer.echo(f"chain up: {anvil.rpc_url} (chain id {deployment.chain_id}, pid {anvil.pid})")
        typer.echo(f"deployment: {path}")
        typer.echo(
            f"dev accounts: #{DEV_ADMIN} admin, #{DEV_RECORDER} recorder, "
            f"#{DEV_VALIDATOR} validator, #{DEV_TREASURY} treasury, "
            f"#{DEV_TREASURY + 1}-#{DEV_ACCOUNTS - 1} "
            f"{DEV_TOKENS} SRL each (anvil's dev mnemonic)"
        )


@chain_app.command()
def down(state_dir: Path | None = StateDir) -> None:
    """Stop the chain started by `swarmrl chain up`, discarding its state for good."""
    state_dir = state_dir or default_state_dir()
    with _one_sentence_errors():
        from swarmrl.chain.anvil import stop_pid
        from swarmrl.locks import exclusive_use

        _check_state_folder(state_dir)
        if not state_dir.is_dir():
            typer.echo(f"no chain running from {state_dir}")
            return
        with exclusive_use(state_dir / LOCK_FILE, state_dir, "swarmrl chain down"):
            pid = _read_pid(state_dir)
            stopped = pid is not None and stop_pid(pid)
            (state_dir / PID_FILE).unlink(missing_ok=True)
        if stopped:
            typer.echo(f"chain stopped (pid {pid})")
        else:
            typer.echo(f"no chain running from {state_dir}")


@chain_app.command()
def status(
    state_dir: Path | None = StateDir,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Say whether the local chain runs, where, and at which block. Exit 1 if not."""
    state_dir = state_dir or default_state_dir()
    with _one_sentence_errors():
        from swarmrl.chain.anvil import connect
        from swarmrl.chain.contracts import require_contracts
        from swarmrl.chain.deploy import load_deployment
        from swarmrl.chain.errors import ChainError
        from swarmrl.chain.tx import with_rpc_retries

        pid = _running_pid(state_dir)
        if pid is None:
            raise ChainError(f"no chain running from {state_dir}: run `swarmrl chain up`")
        deployment = load_deployment(state_dir / DEPLOYMENT_FILE)
        w3 = connect(deployment.rpc_url)
        block = with_rpc_retries(lambda: w3.eth.block_number, what="eth_blockNumber", retries=2)
        require_contracts(w3, deployment)
        info = {
            "running": True,
            "pid": pid,
            "rpc_url": deployment.rpc_url,
            "chain_id": deployment.chain_id,
            "block": block,
            "deployment": str(state_dir / DEPLOYMENT_FILE),
            "contracts": deployment.contracts.model_dump(),
        }
        if as_json:
            typer.echo(json.dumps(info))
            return
        typer.echo(f"chain running: {deployment.rpc_url} (chain id {deployment.chain_id})")
        typer.echo(f"pid {pid}, block {block}")
        typer.echo(f"deployment: {state_dir / DEPLOYMENT_FILE}")
        for name, address in deployment.contracts.model_dump().items():
            typer.echo(f"  {name:18} {address}")


@chain_app.command()
def advance(
    seconds: int = typer.Argument(
        ..., min=1, max=MAX_ADVANCE_SECONDS, help="How far to move the clock, in seconds."
    ),
    deployment: Path | None = DeploymentFile,
) -> None:
    """Move a local chain's clock forward, as the demo does to end an invalidation window
    at once; anvil on this machine only (no other chain's clock can be moved)."""
    with _one_sentence_errors():
        from swarmrl.chain.anvil import increase_time, is_anvil, is_loopback
        from swarmrl.chain.contracts import Contracts
        from swarmrl.chain.deploy import load_deployment
        from swarmrl.chain.errors import ChainConfigError
        from swarmrl.times import date_time, duration

        loaded = load_deployment(deployment)
        refusal = ChainConfigError(
            f"the chain at {loaded.rpc_url} is not an anvil on this machine; "
            "only a local chain's clock can be moved"
        )
        if not is_loopback(loaded.rpc_url):  # refused before anything is sent there
            raise refusal
        chain = Contracts.connect(loaded)
        if not is_anvil(chain.w3):
            raise refusal
        increase_time(chain.w3, seconds)
        typer.echo(
            f"moved the chain's clock {duration(seconds)} ahead: "
            f"it reads {date_time(chain.chain_time())}"
        )


@chain_app.command("deploy")
def deploy_cmd(
    rpc_url: str = typer.Option(..., "--rpc-url", help="Any chain, e.g. Base Sepolia's RPC URL."),
    key: str = typer.Option(
        ..., "--key", help="Keystore name of the deployer's key; it pays gas and is admin."
    ),
    out: Path = typer.Option(..., "--out", help="Where to write the deployment file."),
    run: str = typer.Option("dev", "--run", help="Run name or 0x-prefixed bytes32 run id."),
    recorder: list[str] = typer.Option(
        [], "--recorder", help="Orchestrator address allowed to record work (repeatable)."
    ),
    validator: list[str] = typer.Option([], "--validator", help="Validator address (repeatable)."),
    treasury: str | None = typer.Option(
        None,
        "--treasury",
        help="Receiver of slashed stake, fixed for good (default: none, slashed stake is burnt).",
    ),
    quorum: int = typer.Option(
        1, min=1, help="Validator votes to invalidate or slash; at most the number of validators."
    ),
    min_stake: int = typer.Option(
        100, min=0, help=f"Stake per node, in whole tokens: 0 to {MAX_TOKENS_TEXT}."
    ),
    unbonding_period: int = typer.Option(
        7 * 24 * 3600, min=60, max=30 * 24 * 3600, help="Seconds, 1 minute to 30 days."
    ),
    invalidation_window: int = typer.Option(
        24 * 3600, min=60, help="Seconds, 1 minute to the unbonding period."
    ),
    reward_per_unit_wei: int = typer.Option(
        10**17, min=0, help=f"Token wei per work unit: 0 to {MAX_TOKENS_TEXT} tokens' worth."
    ),
    slash_penalty: int = typer.Option(
        50, min=0, help="Tokens slashed per slash: 0 to the stake per node."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing --out file."),
    keystore_dir: Path | None = KeystoreDir,
    password_file: Path | None = PasswordFile,
) -> None:
    """Deploy the protocol to any chain, such as Base Sepolia, and write its deployment file."""
    with _one_sentence_errors():
        from swarmrl.chain.deploy_protocol import DeploymentNotWrittenError, deploy_protocol

        try:
            done = deploy_protocol(
                rpc_url=rpc_url,
                key=key,
                out=out,
                run=run,
                recorders=recorder,
                validators=validator,
                treasury=treasury,
                quorum=quorum,
                min_stake=min_stake,
                unbonding_period=unbonding_period,
                invalidation_window=invalidation_window,
                reward_per_unit_wei=reward_per_unit_wei,
                slash_penalty=slash_penalty,
                force=force,
                keystore_dir=keystore_dir,
                password_file=password_file,
            )
        except DeploymentNotWrittenError as e:
            # The contracts it names were paid for and cannot be found again otherwise.
            typer.echo(e.deployment.model_dump_json(indent=2))
            raise
        for line in done.summary():
            typer.echo(line)


def _coordinator(
    key: str,
    keystore_dir: Path | None,
    password_file: Path | None,
    deployment: Path | None,
    check: Callable[[Contracts, str], None],
) -> Contracts:
    """The deployment's protocol and the unlocked key `key`; `check` runs on the key's
    address before the password is asked for, so a refusal costs nothing."""
    from swarmrl import keystore
    from swarmrl.chain.contracts import Contracts
    from swarmrl.chain.deploy import load_deployment

    directory = keystore_dir or keystore.default_dir()
    address = keystore.info(directory, key).address
    chain = Contracts.connect(load_deployment(deployment))
    check(chain, address)
    return chain.as_account(keystore.unlock(directory, key, keystore.read_password(password_file)))


@chain_app.command()
def mint(
    to: str = typer.Option(..., "--to", help="The address that receives the tokens."),
    amount: str = typer.Option(..., "--amount", help="Tokens, in plain digits: 1000 or 2.5."),
    key: str = typer.Option(
        ..., "--key", help="Keystore name of a key with the minter role (the deployer's)."
    ),
    keystore_dir: Path | None = KeystoreDir,
    password_file: Path | None = PasswordFile,
    deployment: Path | None = DeploymentFile,
) -> None:
    """Mint test tokens, a test network's faucet: the key needs the token's minter role."""
    with _one_sentence_errors():
        from swarmrl.chain.deploy import checked_address
        from swarmrl.chain.errors import ChainConfigError
        from swarmrl.chain.tokens import format_tokens, parse_tokens

        units = parse_tokens(amount)
        try:
            receiver = checked_address(to)
        except ValueError as e:
            raise ChainConfigError(f"--to: {e}") from None

        def has_minter_role(chain: Contracts, address: str) -> None:
            if not chain.token.has_role("MINTER_ROLE", address):
                raise ChainConfigError(
                    f"key {key!r} ({address}) does not hold the minter role on the stake "
                    f"token {chain.token.address}; mint with the deployer's key"
                )

        chain = _coordinator(key, keystore_dir, password_file, deployment, has_minter_role)
        chain.token.mint(receiver, units)
        balance = format_tokens(chain.token.balance_of(receiver))
        typer.echo(f"minted {format_tokens(units)} to {receiver}; it now holds {balance}")


@chain_app.command()
def fund(
    amount: str = typer.Option(..., "--amount", help="Tokens, in plain digits: 1000 or 2.5."),
    key: str = typer.Option(..., "--key", help="Keystore name of the key whose tokens fund it."),
    keystore_dir: Path | None = KeystoreDir,
    password_file: Path | None = PasswordFile,
    deployment: Path | None = DeploymentFile,
) -> None:
    """Add tokens to the pool's reward budget, which pays for recorded work."""
    with _one_sentence_errors():
        from swarmrl.chain.errors import ChainConfigError
        from swarmrl.chain.tokens import format_tokens, parse_tokens

        units = parse_tokens(amount)

        def holds_enough(chain: Contracts, address: str) -> None:
            if (held := chain.token.balance_of(address)) < units:
                raise ChainConfigError(
                    f"key {key!r} ({address}) holds {format_tokens(held)} tokens, "
                    f"less than the {format_tokens(units)} to fund"
                )

        chain = _coordinator(key, keystore_dir, password_file, deployment, holds_enough)
        chain.pool.fund(units)
        budget = format_tokens(chain.pool.available_rewards())
        typer.echo(f"funded the pool with {format_tokens(units)}; its reward budget is {budget}")
