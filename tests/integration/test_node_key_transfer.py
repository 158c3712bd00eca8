"""`node key export|import` on the session's real anvil: a node set up and joined on
one machine, with a journal of real signed receipts, a refusal and a submission still
pending, moves to another machine (its own keystore and data folder) and is the same
node there: same address, same peer id, same receipts, still in the pool.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from eth_account import Account

from client.node.settings import ROLE, NodeSettings
from client.node.setup.doctor import run_checks
from client.node.setup.keys import init_node
from client.node.setup.transfer import TransferError, export_node, import_node
from client.node.work.journal import Journal
from client.node.work.loop import sole_runner
from swarmrl import keystore
from swarmrl.chain.deploy import write_deployment
from swarmrl.chain.tokens import TOKEN
from swarmrl.eip712 import pool_domain, swarm_domain
from swarmrl.files import claim_data_dir
from swarmrl.locks import FolderBusyError
from swarmrl.p2p.identity import load_or_create_peer_key, peer_id_of, peer_key_path
from swarmrl.settings_toml import write_settings
from swarmrl.work.submit import Receipt, SubmitHeader
from tests.integration.conftest import PROVIDER_A, RECORDER

PASSWORD = "correct horse"
CHEAP = 2**4  # the export's scrypt cost in these tests; the CLI test runs the real one
SWARMRL = Path(sys.executable).with_name("swarmrl")


class History:
    """Writes a node's journal as the daemon does: each submission signed by the node
    and journaled, then settled with the orchestrator's signed receipt or refusal."""

    def __init__(self, settings: NodeSettings, node, recorder, deployment) -> None:
        self.journal = Journal(Path(settings.data_dir) / "journal")
        self.node, self.recorder, self.deployment = node, recorder, deployment
        self.pool = pool_domain(deployment.chain_id, deployment.contracts.compute_pool)
        self.swarm = swarm_domain(deployment.chain_id, deployment.contracts.compute_pool)
        self.folder = Path(settings.data_dir) / "outbox"
        self.folder.mkdir(exist_ok=True)
        self.count = 0

    def submit(self):
        self.count += 1
        body = f"rollouts {self.count}".encode()
        order_id = hashlib.sha256(body).hexdigest()
        header = SubmitHeader(
            order_id=order_id,
            node=self.node.address,
            step=self.count,
            file_sha256=hashlib.sha256(body).hexdigest(),
            size=len(body),
            signature="0" * 130,
        ).signed_by(self.node, self.deployment.run_id, self.pool)
        file = self.folder / f"{self.count}.parquet"
        file.write_bytes(body)
        digest = header.digest(self.deployment.run_id, self.pool).hex()
        return self.journal.add(order_id, digest, header.model_dump(), file)

    def receipt(self, units: int = 8) -> str:
        entry = self.submit()
        receipt = Receipt(
            run=self.deployment.run_id,
            node=self.node.address,
            submission=entry.digest,
            epoch=0,
            units=units,
        ).signed_by(self.recorder, self.swarm)
        self.journal.settle(entry.digest, receipt.model_dump())
        return entry.digest

    def refusal(self) -> str:
        entry = self.submit()
        self.journal.refuse(entry, f"work order {entry.order_id[:4]} is already expired")
        return entry.digest


@pytest.fixture
def old(tmp_path, contracts, deployment, accounts, monkeypatch):
    """The first machine: its node joined with a staked provider, three receipts (one of
    zero units), a refusal and a submission still waiting to be sent."""
    monkeypatch.setenv("SWARMRL_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.delenv("SWARMRL_PASSWORD", raising=False)
    keys = tmp_path / "old" / "keys"
    keystore.save_public(keys, "provider", accounts[PROVIDER_A].key, PASSWORD)
    provider = contracts.as_account(accounts[PROVIDER_A])
    provider.registry.register_provider()
    provider.stakes.stake(100 * TOKEN, permit=True)
    init_node(keys, "node", "provider", lambda name, new: PASSWORD, deployment)
    write_deployment(tmp_path / "deployment.json", deployment)
    (tmp_path / "password").write_text(PASSWORD + "\n")
    settings = machine(tmp_path, "old")
    claim_data_dir(settings.data_dir, ROLE)
    history = History(
        settings, keystore.unlock(keys, "node", PASSWORD), accounts[RECORDER], deployment
    )
    history.receipt(8)
    history.receipt(0)
    history.receipt(16)
    history.refusal()
    history.submit()
    return settings, history


def machine(tmp_path: Path, name: str, **overrides: object) -> NodeSettings:
    values: dict[str, object] = {
        "data_dir": tmp_path / name / "data",
        "keystore_dir": tmp_path / name / "keys",
        "deployment": tmp_path / "deployment.json",
        "password_file": tmp_path / "password",
    }
    return NodeSettings(**(values | overrides))


def password() -> str:
    return PASSWORD


def never() -> str:
    raise AssertionError("the password was asked for")


def identity(settings: NodeSettings) -> tuple[str, str]:
    keys = Path(settings.keystore_dir)
    address = keystore.unlock(keys, settings.key, PASSWORD).address
    return address, peer_id_of(load_or_create_peer_key(peer_key_path(keys, settings.key)))


def summary(settings: NodeSettings):
    return Journal(Path(settings.data_dir) / "journal").summary()


def test_a_moved_node_is_the_same_node_with_the_same_receipts(
    old, tmp_path, contracts, deployment, w3
):
    settings, _ = old
    out = tmp_path / "node.key"

    exported = export_node(settings, out, password, scrypt_n=CHEAP)

    node, peer_id = identity(settings)
    assert (exported.node, exported.peer_id) == (node, peer_id)
    assert (exported.receipts, exported.refused, exported.pending) == (3, 1, 1)
    assert exported.summary(out) == (
        f"wrote {out}: node {node} (peer {peer_id}), 3 receipt(s) and 1 refusal(s)"
    )
    assert exported.pending_note() == (
        "1 submission(s) wait to be sent from this machine and are not in the file: start "
        "the node here once more and `swarmrl node finish` it, so it sends them, before it "
        "runs elsewhere"
    )
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert PASSWORD.encode() not in out.read_bytes()
    key = keystore.unlock(settings.keystore_dir, "node", PASSWORD).key
    assert key.hex().removeprefix("0x").encode() not in out.read_bytes().lower()

    new = machine(tmp_path, "new")
    imported = import_node(new, out, password)

    assert identity(new) == (node, peer_id)
    assert imported.summary() == (
        f"node {node} (peer {peer_id}) is key 'node': wrote the key and its peer identity; "
        "added 4 receipt(s) and refusal(s) to the journal (0 were there)"
    )
    before, after = summary(settings), summary(new)
    assert (before.pending, after.pending) == (1, 0)
    assert after.model_dump(exclude={"pending"}) == before.model_dump(exclude={"pending"})
    assert (after.receipts, after.units_at_intake, after.rejected_at_intake) == (3, 24, 1)
    # The new machine holds no provider key, and `node run`'s checks pass there.
    assert sorted(p.name for p in Path(new.keystore_dir).iterdir() if p.suffix != ".lock") == [
        "node.json",
        "node.peer-key",
    ]
    found = {check.name: check for check in run_checks(new, PASSWORD)}
    assert found["keystore"].detail == f"ok: key 'node' unlocks: node {node}, peer {peer_id}"
    assert found["joined"].detail == f"ok: node {node} is in the run's pool"


def test_importing_again_writes_nothing_and_later_receipts_merge(old, tmp_path, w3):
    settings, history = old
    first = tmp_path / "first.key"
    export_node(settings, first, password, scrypt_n=CHEAP)
    new = machine(tmp_path, "new")
    import_node(new, first, password)

    again = import_node(new, first, password)
    assert (again.wrote_key, again.wrote_peer_key, again.added, again.kept) == (
        False,
        False,
        0,
        4,
    )
    assert "the key and peer identity were here" in again.summary()

    latest = history.receipt(4)  # the old machine worked on before it moved
    second = tmp_path / "second.key"
    export_node(settings, second, password, scrypt_n=CHEAP)
    merged = import_node(new, second, password)
    assert (merged.added, merged.kept) == (1, 4)
    assert latest in summary(new).receipt_digests
    assert summary(new).receipts == 4


def test_export_is_refused_while_the_node_runs(old, tmp_path):
    settings, _ = old
    out = tmp_path / "node.key"
    with sole_runner(settings), pytest.raises(FolderBusyError) as refused:
        export_node(settings, out, never, scrypt_n=CHEAP)
    assert str(refused.value) == (
        f"{settings.data_dir} is in use by `swarmrl node run` (pid {os.getpid()}); "
        "wait for it to finish or stop it"
    )
    assert not out.exists()


def test_import_is_refused_while_a_node_runs_on_the_data_folder(old, tmp_path, accounts):
    settings, _ = old
    out = tmp_path / "node.key"
    export_node(settings, out, password, scrypt_n=CHEAP)
    # Another node already runs on the new machine's data folder.
    new = machine(tmp_path, "new")
    keystore.save(new.keystore_dir, "other", Account.create().key, PASSWORD)
    running = machine(tmp_path, "new", key="other")
    with sole_runner(running), pytest.raises(FolderBusyError) as refused:
        import_node(new, out, never)
    assert str(refused.value).startswith(f"{new.data_dir} is in use by `swarmrl node run` (pid ")
    assert not (Path(new.keystore_dir) / "node.json").exists()


def test_import_keeps_another_key_of_that_name(old, tmp_path):
    settings, _ = old
    out = tmp_path / "node.key"
    export_node(settings, out, password, scrypt_n=CHEAP)
    new = machine(tmp_path, "new")
    other = keystore.save(new.keystore_dir, "node", Account.create().key, PASSWORD)
    node, _ = identity(settings)

    with pytest.raises(TransferError) as refused:
        import_node(new, out, never)

    assert str(refused.value) == (
        f"the keystore {new.keystore_dir} has another key named 'node' ({other.address}); "
        f"import node {node} under a name of its own (`key` in the node's config)"
    )
    assert not peer_key_path(new.keystore_dir, "node").exists()
    assert not Path(new.data_dir).exists()


def test_import_keeps_another_peer_identity_of_that_name(old, tmp_path):
    settings, _ = old
    out = tmp_path / "node.key"
    export_node(settings, out, password, scrypt_n=CHEAP)
    new = machine(tmp_path, "new")
    theirs = peer_id_of(load_or_create_peer_key(peer_key_path(new.keystore_dir, "node")))
    node, peer_id = identity(settings)

    with pytest.raises(TransferError) as refused:
        import_node(new, out, password)

    assert str(refused.value) == (
        f"{peer_key_path(new.keystore_dir, 'node')} holds another peer identity ({theirs}) "
        f"than node {node}'s ({peer_id}); import it under a key name of its own (`key` in "
        "the node's config)"
    )
    assert not (Path(new.keystore_dir) / "node.json").exists()


def test_a_wrong_password_writes_nothing(old, tmp_path):
    settings, _ = old
    out = tmp_path / "node.key"
    export_node(settings, out, password, scrypt_n=CHEAP)
    new = machine(tmp_path, "new")

    with pytest.raises(TransferError) as refused:
        import_node(new, out, lambda: "battery staple")

    assert str(refused.value) == (
        "wrong password for the node export, or the file was changed or is damaged"
    )
    assert not Path(new.keystore_dir).exists()
    assert not Path(new.data_dir).exists()


def test_a_data_folder_with_another_nodes_journal_is_refused(old, tmp_path, deployment, accounts):
    settings, _ = old
    out = tmp_path / "node.key"
    export_node(settings, out, password, scrypt_n=CHEAP)
    new = machine(tmp_path, "new")
    claim_data_dir(new.data_dir, ROLE)
    stranger = Account.create()
    History(new, stranger, accounts[RECORDER], deployment).receipt()
    node, _ = identity(settings)

    with pytest.raises(TransferError) as refused:
        import_node(new, out, password)

    assert str(refused.value) == (
        f"the journal in {new.data_dir} holds receipts of another node ({stranger.address}); "
        f"give node {node} a data folder of its own (`data_dir` in its config)"
    )
    assert not (Path(new.keystore_dir) / "node.json").exists()


def test_export_and_import_from_the_command_line(old, tmp_path, w3):
    settings, _ = old
    old_config, new_config = tmp_path / "old.toml", tmp_path / "new.toml"
    write_settings(old_config, settings.model_dump(include=set(machine_keys())))
    write_settings(new_config, machine(tmp_path, "new").model_dump(include=set(machine_keys())))
    env = {**os.environ, "SWARMRL_LOCK_DIR": str(tmp_path / "locks")}
    env.pop("SWARMRL_PASSWORD", None)

    def swarmrl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SWARMRL, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180
        )

    exported = swarmrl("node", "key", "export", "--out", "node.key", "--config", str(old_config))
    assert exported.returncode == 0, exported.stderr
    node, peer_id = identity(settings)
    assert exported.stdout == (
        f"wrote node.key: node {node} (peer {peer_id}), 3 receipt(s) and 1 refusal(s)\n"
    )
    assert exported.stderr.startswith("note: 1 submission(s) wait to be sent from this machine")

    imported = swarmrl("node", "key", "import", "node.key", "--config", str(new_config))
    assert imported.returncode == 0, imported.stderr
    status = swarmrl("node", "status", "--config", str(new_config))
    assert status.returncode == 0, status.stderr
    assert "receipts 3  units 24  rejected 1  refused 1  waiting to be sent 0" in status.stdout

    damaged = tmp_path / "damaged.key"
    # Half the scrypt cost in clear: a file changed to be cheaper to guess at is refused.
    sealed = (tmp_path / "node.key").read_bytes()
    damaged.write_bytes(sealed.replace(b'"n":262144', b'"n":131072'))
    assert damaged.read_bytes() != sealed
    refused = swarmrl("node", "key", "import", "damaged.key", "--config", str(new_config))
    assert refused.returncode == 1
    assert refused.stderr == (
        "error: wrong password for the node export, or the file was changed or is damaged\n"
    )


def machine_keys() -> tuple[str, ...]:
    return ("data_dir", "keystore_dir", "deployment", "password_file")
