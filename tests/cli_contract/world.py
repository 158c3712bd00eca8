"""A sandbox for running commands: its own HOME, XDG and SWARMRL_* folders, valid
inputs of every kind the commands read, and damaged copies of each."""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

PASSWORD = "contract-password"
KEY_NAME = "alice"
ADDRESS = "0x" + "12" * 20


class _WrongChain(BaseHTTPRequestHandler):
    """A JSON-RPC endpoint of another chain (id 1): a command that reaches the RPC is
    refused at once, where a closed port would cost it seconds of retries."""

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        calls = request if isinstance(request, list) else [request]
        answers = [
            {"jsonrpc": "2.0", "id": c.get("id"), "result": "0x1"}
            if c.get("method") in ("eth_chainId", "net_version")
            else {"jsonrpc": "2.0", "id": c.get("id"), "error": {"code": -32601, "message": "no"}}
            for c in calls
        ]
        body = json.dumps(answers if isinstance(request, list) else answers[0]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def wrong_chain_rpc() -> Iterator[str]:
    """The URL of a JSON-RPC endpoint on 127.0.0.1 that serves another chain."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _WrongChain)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class World:
    """Where a contract run keeps everything; nothing outside ``root`` is written."""

    root: Path
    rpc_url: str
    peer_addr: str = ""  # a libp2p address on 127.0.0.1 where no peer listens
    env: dict[str, str] = field(default_factory=dict)
    # Valid inputs by kind ("tasks", "model", "keystore", ...), and damaged variants
    # of each: kind -> {label: path}.
    valid: dict[str, Path] = field(default_factory=dict)
    damaged: dict[str, dict[str, Path]] = field(default_factory=dict)

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def inputs(self) -> Path:
        return self.root / "inputs"

    @property
    def watched(self) -> list[Path]:
        """What no failing command may change: the state folders and every input."""
        return [self.home, self.inputs]


def sandbox_env(root: Path, home: Path) -> dict[str, str]:
    """The environment commands run in: every place swarmrl or a library would keep
    state points into ``home``, and nothing is fetched from the network."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SWARMRL_", "XDG_", "HF_", "TRANSFORMERS_"))
    }
    env.update(
        HOME=str(home),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_STATE_HOME=str(home / ".local" / "state"),
        XDG_RUNTIME_DIR=str(home / "run"),
        SWARMRL_KEYSTORE_DIR=str(home / "keystore"),
        SWARMRL_CHAIN_DIR=str(home / "chain"),
        SWARMRL_MODELS_DIR=str(home / "models"),
        SWARMRL_PASSWORD=PASSWORD,
        HF_HOME=str(home / ".cache" / "huggingface"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TMPDIR=str(root / "tmp"),
        # The repository, for the worker; the sandbox is the working directory.
        PYTHONPATH=str(Path(__file__).resolve().parents[2]),
        PYTHONDONTWRITEBYTECODE="1",
        # Marks every process a command starts, so one left behind is found even
        # if it left the process group.
        SWARMRL_CONTRACT_MARK=root.name,
    )
    return env


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _truncated(source: Path, dest: Path) -> Path:
    data = source.read_bytes()
    return _write(dest, data[: len(data) // 2])


def _garbage(dest: Path) -> Path:
    return _write(dest, bytes(range(256)) * 16 + "ü\x00\xff".encode())


def _file_variants(kind: str, valid: Path, where: Path) -> dict[str, Path]:
    """What goes wrong with any input file: missing, empty, a folder, garbage, cut short,
    an unreadable name."""
    where.mkdir(parents=True, exist_ok=True)
    suffix = valid.suffix
    folder = where / f"{kind}-folder{suffix}"
    folder.mkdir()
    return {
        "missing": where / f"{kind}-missing{suffix}",
        "empty": _write(where / f"{kind}-empty{suffix}", b""),
        "directory": folder,
        "garbage": _garbage(where / f"{kind}-garbage{suffix}"),
        "truncated": _truncated(valid, where / f"{kind}-truncated{suffix}"),
        "unicode-missing": where / f"ünï\u202e-{kind}{suffix}",
        "name-too-long": where / ("x" * 300 + suffix),
    }


def _huge(where: Path, kind: str, suffix: str) -> Path:
    """A sparse 3 GiB file: a reader that loads whole files must refuse it by size."""
    where.mkdir(exist_ok=True)
    path = where / f"{kind}-huge{suffix}"
    with open(path, "wb") as f:
        f.truncate(3 << 30)
    return path


def build_world(root: Path, rpc_url: str, *, huge_files: bool) -> World:
    """The sandbox with valid inputs and their damaged variants under ``root``; the
    chain it names is at ``rpc_url``."""
    home = root / "home"
    for sub in ("keystore", "chain", "models", "run", ".cache"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    (root / "tmp").mkdir()
    world = World(root=root, rpc_url=rpc_url, peer_addr=_absent_peer())
    world.env = sandbox_env(root, home)
    inputs = world.inputs
    inputs.mkdir()

    valid = world.valid
    valid["tasks"] = _tasks(inputs / "tasks.parquet")
    valid["tasks-jsonl"] = _tasks(inputs / "tasks.jsonl")
    valid["completions"] = _completions(inputs / "completions.jsonl")
    valid["rollouts"] = _rollouts(inputs / "rollouts.parquet")
    valid["model"] = _model(inputs / "model")
    valid["keystore"], valid["private-key"] = _keystore(home / "keystore", inputs)
    valid["password"] = _write(inputs / "password.txt", f"{PASSWORD}\n".encode())
    valid["deployment"] = _deployment(home / "chain" / "deployment.json", world.rpc_url)
    valid["weights"] = _write(inputs / "weights.bin", b"\x01" * 4096)
    # A daemon's settings: one key both daemons have, pointing into the sandbox.
    valid["config"] = _write(inputs / "config.toml", f'data_dir = "{home}/daemon"\n'.encode())
    valid["export-file"] = _node_export(inputs / "node-export.json")
    # Signed for the sandbox's key and deployment: `wallet add-node` takes it as far as
    # the chain, which refuses at once.
    provider = "0x" + json.loads(valid["keystore"].read_text())["address"]
    valid["consent-file"] = _consent(inputs / "consent.json", provider)

    damaged = world.damaged
    variants = inputs / "damaged"
    for kind in (
        "tasks",
        "tasks-jsonl",
        "completions",
        "rollouts",
        "keystore",
        "private-key",
        "password",
        "deployment",
        "weights",
        "export-file",
        "consent-file",
    ):
        damaged[kind] = _file_variants(kind, valid[kind], variants)
        if huge_files:
            # Outside the watched inputs: restoring those copies them, sparse or not.
            damaged[kind]["huge"] = _huge(root / "huge", kind, valid[kind].suffix)
    damaged["config"] = _file_variants("config", valid["config"], variants)
    del damaged["config"]["empty"]  # an empty config is every default: a valid one
    damaged["config"]["unknown key"] = _write(variants / "config-typo.toml", b"no_such_key = 1\n")
    damaged["config"]["out of range"] = _write(variants / "config-port.toml", b"metrics_port = 0\n")
    damaged["keystore"].update(_keystore_variants(valid["keystore"], variants))
    damaged["deployment"].update(_deployment_variants(valid["deployment"], variants))
    damaged["export-file"].update(_export_variants(valid["export-file"], variants))
    damaged["consent-file"].update(_consent_variants(valid["consent-file"], variants))
    damaged["model"] = _model_variants(valid["model"], variants)
    damaged["keystore-dir"] = _keystore_dir_variants(damaged["keystore"], variants)
    damaged["state-dir"] = _state_dir_variants(variants)
    return world


def _absent_peer() -> str:
    """A well-formed address of a peer that is not there (port 1 on 127.0.0.1)."""
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID

    peer = ID.from_pubkey(create_new_key_pair(b"\x01" * 32).public_key)
    return f"/ip4/127.0.0.1/tcp/1/p2p/{peer.to_base58()}"


def _tasks(path: Path) -> Path:
    from orchestrator.tasks.generators import demo_tasks
    from swarmrl.tasks import write_tasks

    write_tasks(demo_tasks(2, seed=0), path)
    return path


def _completions(path: Path) -> Path:
    from orchestrator.tasks.generators import demo_solution, demo_tasks

    lines = [
        json.dumps({"problem_id": t.problem_id, "completion": demo_solution(t)})
        for t in demo_tasks(2, seed=0)
    ]
    return _write(path, ("\n".join(lines) + "\n").encode())


def _rollouts(path: Path) -> Path:
    from swarmrl.rollouts.records import Rollout, write_rollouts

    record = Rollout(
        run="local",
        policy_step=0,
        node="0x" + "00" * 20,
        problem_id="arith-0-0",
        task_type="math",
        prompt="What is 2 + 2?",
        verification_info='{"ground_truth":"4"}',
        seed=5,
        sample=0,
        temperature=1.0,
        top_p=1.0,
        max_tokens=8,
        target_len=8,
        prompt_ids=[1, 2, 3],
        output_ids=[4, 5],
        logprobs=[-0.25, -1.5],
        finish_reason="length",
        task_reward=0.0,
        length_penalty=0.0018,
        reward=-0.0018,
        proofs=[b"\x00\x01" * 129],
    ).sealed()
    write_rollouts([record], path)
    return path


def _model(path: Path) -> Path:
    from tests.model_fixtures import random_tiny_model

    return random_tiny_model(path, seed=1)


def _keystore(directory: Path, inputs: Path) -> tuple[Path, Path]:
    """A valid keystore with a cheap scrypt cost, so that the many cases that unlock
    it do not each spend seconds in the kdf."""
    from eth_account import Account

    account = Account.create()
    document = Account.encrypt(account.key, PASSWORD, kdf="scrypt", iterations=2**10)
    path = _write(directory / f"{KEY_NAME}.json", json.dumps(document).encode())
    key_file = _write(inputs / "private-key.txt", (account.key.hex() + "\n").encode())
    return path, key_file


def _keystore_variants(valid: Path, where: Path) -> dict[str, Path]:
    """Keystores damaged in the ways the issue names: each must be one sentence."""
    document = json.loads(valid.read_text())

    def variant(label: str, change: dict) -> tuple[str, Path]:
        doc = json.loads(json.dumps(document))
        for dotted, value in change.items():
            *parents, last = dotted.split(".")
            section = doc
            for p in parents:
                section = section[p]
            if value is None:
                section.pop(last)
            else:
                section[last] = value
        return label, _write(where / f"keystore-{label}.json", json.dumps(doc).encode())

    variants = dict(
        [
            variant("no-crypto", {"crypto": None}),
            variant("unknown-kdf", {"crypto.kdf": "argon9"}),
            variant("huge-scrypt-cost", {"crypto.kdfparams.n": 2**40}),
            variant("wrong-address", {"address": "ab" * 20}),
            variant("bad-mac", {"crypto.mac": "00" * 32}),
        ]
    )
    variants["json-list"] = _write(where / "keystore-json-list.json", b"[]")
    return variants


def _keystore_dir_variants(keystores: dict[str, Path], where: Path) -> dict[str, Path]:
    """Keystore folders: a file instead of a folder, and folders whose `alice` key is
    each of the damaged keystores."""
    variants = {"a-file": _write(where / "keystore-dir-file", b"not a folder")}
    for label, source in keystores.items():
        if not os.path.isfile(source):  # Path.is_file raises on a too-long name
            continue
        folder = where / f"keystore-dir-{label}"
        folder.mkdir()
        shutil.copyfile(source, folder / f"{KEY_NAME}.json")
        variants[label] = folder
    return variants


def _deployment(path: Path, rpc_url: str) -> Path:
    from swarmrl.chain.deploy import (
        ContractAddresses,
        Deployment,
        ProtocolParams,
        run_id_from_name,
        write_deployment,
    )

    deployment = Deployment(
        chain_id=31337,
        rpc_url=rpc_url,
        run_id=run_id_from_name("dev"),
        deploy_block=0,
        admin=ADDRESS,
        treasury=ADDRESS,
        recorders=[ADDRESS],
        validators=[ADDRESS],
        contracts=ContractAddresses(
            stake_token=ADDRESS,
            provider_registry=ADDRESS,
            stake_manager=ADDRESS,
            compute_pool=ADDRESS,
        ),
        params=ProtocolParams(),
    )
    write_deployment(path, deployment)
    return path


def _deployment_variants(valid: Path, where: Path) -> dict[str, Path]:
    document = json.loads(valid.read_text())
    bad_address = {**document, "contracts": {**document["contracts"], "stake_manager": "0x12"}}
    return {
        "bad-address": _write(
            where / "deployment-bad-address.json", json.dumps(bad_address).encode()
        ),
        "deep-nesting": _write(where / "deployment-deep.json", b"[" * 200_000),
    }


# The export's scrypt cost here: the lowest the reader takes, so that the cases that
# open one (a wrong password, a sealed bundle that is no node) spend no time in the kdf.
CHEAP_SCRYPT_N = 2


def _bundle(account: object) -> dict[str, object]:
    """What `node key export` seals for a node with no history: its key and a peer
    identity (an Ed25519 seed, as swarmrl.p2p.identity keeps it)."""
    return {
        "format": "swarmrl node key",
        "version": 1,
        "node": account.address,
        "private_key": account.key.hex().removeprefix("0x"),
        "peer_key": "5e" * 32,
        "receipts": [],
        "refused": [],
    }


def _seal(path: Path, bundle: dict[str, object], password: str) -> Path:
    from client.node.setup.transfer import seal

    plain = json.dumps(bundle).encode()
    return _write(path, seal(plain, str(bundle["node"]), password, scrypt_n=CHEAP_SCRYPT_N))


def _node_export(path: Path) -> Path:
    """A node export as `node key export` writes it, under the sandbox's password."""
    from eth_account import Account

    return _seal(path, _bundle(Account.create()), PASSWORD)


def _export_variants(valid: Path, where: Path) -> dict[str, Path]:
    """Exports that parse but must not import: each refused in one sentence."""
    from eth_account import Account

    document = json.loads(valid.read_text())
    changed = {**document, "node": "0x" + "ab" * 20}  # in the associated data
    no_node = {**_bundle(Account.create()), "private_key": "11" * 32}  # not the node's key
    return {
        "wrong-password": _seal(
            where / "export-wrong-password.json", _bundle(Account.create()), "not-" + PASSWORD
        ),
        "changed-node": _write(where / "export-changed-node.json", json.dumps(changed).encode()),
        "not-a-node": _seal(where / "export-not-a-node.json", no_node, PASSWORD),
        "json-list": _write(where / "export-json-list.json", b"[]"),
        "deep-nesting": _write(where / "export-deep.json", b"[" * 200_000),
    }


def _consent(path: Path, provider: str, **change: object) -> Path:
    """A node's consent as `node init --consent-out` writes it: a new node's, signed in
    the sandbox deployment's registry domain (its chain and registry, as `_deployment`
    writes them) for ``provider``; ``change`` alters the signed consent."""
    import time

    from eth_account import Account
    from eth_utils import to_checksum_address

    from client.node.setup.keys import ConsentFile
    from swarmrl import eip712

    node = Account.create()
    values = {"provider": to_checksum_address(provider), "node": node.address, "nonce": 0}
    values.update(deadline=int(time.time()) + 86400, **change)
    consent = eip712.NodeConsent(**values)
    domain = eip712.registry_domain(31337, ADDRESS)
    signed = ConsentFile.signed(domain, consent, eip712.sign_consent(node, consent, domain))
    return _write(path, signed.to_json())


def _consent_variants(valid: Path, where: Path) -> dict[str, Path]:
    """Consents that parse but are not this provider's on this deployment, or are no
    consent: each refused in one sentence, before the chain is asked."""
    document = json.loads(valid.read_text())
    changed = {**document, "deadline": document["deadline"] + 1}  # not what was signed
    elsewhere = {**document, "chain_id": 84532}
    return {
        "another-provider": _consent(where / "consent-another-provider.json", ADDRESS),
        "changed": _write(where / "consent-changed.json", json.dumps(changed).encode()),
        "another-chain": _write(where / "consent-chain.json", json.dumps(elsewhere).encode()),
        "json-list": _write(where / "consent-json-list.json", b"[]"),
        "deep-nesting": _write(where / "consent-deep.json", b"[" * 4000),
        # Whitespace is valid JSON: only the size refuses it.
        "too-large": _write(where / "consent-too-large.json", valid.read_bytes() + b" " * 4096),
    }


def _model_variants(valid: Path, where: Path) -> dict[str, Path]:
    """Model folders: missing, empty, a file, and copies with one part broken."""
    variants = {
        "missing": where / "model-missing",
        "a-file": _write(where / "model-file", b"not a folder"),
        "unicode-missing": where / "mödel\u202e-missing",
    }
    empty = where / "model-empty"
    empty.mkdir()
    variants["empty"] = empty

    def copy(label: str) -> Path:
        dest = where / f"model-{label}"
        shutil.copytree(valid, dest)
        variants[label] = dest
        return dest

    weights = valid / "model.safetensors"
    _truncated(weights, copy("truncated-weights") / "model.safetensors")
    _garbage(copy("garbage-weights") / "model.safetensors")
    _write(copy("empty-weights") / "model.safetensors", b"")
    (copy("no-weights") / "model.safetensors").unlink()
    _write(copy("garbage-config") / "config.json", b"{not json")
    config = json.loads((valid / "config.json").read_text())
    wider = {**config, "hidden_size": config["hidden_size"] * 2}
    _write(copy("config-mismatch") / "config.json", json.dumps(wider).encode())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (valid / name).exists():
            _garbage(copy(f"garbage-{name.removesuffix('.json')}") / name)
    return variants


def _state_dir_variants(where: Path) -> dict[str, Path]:
    """Chain state folders: a file instead, and pid files no chain wrote."""
    variants = {"a-file": _write(where / "state-file", b"not a folder")}
    for label, content in (
        ("pid-garbage", b"\xff\xfe garbage"),
        ("pid-huge", str(10**30).encode()),
        ("pid-negative", b"-5"),
        ("pid-empty", b""),
    ):
        folder = where / f"state-{label}"
        folder.mkdir()
        _write(folder / "anvil.pid", content)
        variants[label] = folder
    return variants
