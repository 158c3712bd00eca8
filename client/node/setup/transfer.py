"""`swarmrl node key export|import`: a node moved to another machine keeps its history.

The file holds what makes the node itself: its Ethereum key (its address is the
node on chain; it signs joins and submissions), its libp2p identity (the peer id
the orchestrator and its peers know), and its journal's settled record: the
orchestrator's signed receipts and the submissions refused for good, which
`swarmrl node status` lists. Imported on another machine, `node status` shows the
same receipts and `node run` joins as the same node with the same peer id. One
provider can run many nodes this way: each node is its own file.

Not in it: the journal's pending entries, submissions still waiting for a receipt.
Each holds a whole rollout file (up to 64 MiB), and it is sent by the machine that
has it; let the node send them before it moves (`swarmrl node finish` sends them,
then stops the node). Export says how many wait.

Export refuses while the node's daemon runs, though reading the journal would be
safe (every file in it is whole or absent): a node exported while it works would
settle receipts the file misses, and a node that is moved must not run on two
machines at once (each join would replace the other's). It holds the data dir as
`node status` does, so no daemon starts while it reads. Import holds the data dir
and the key as `node run` does (`loop.sole_runner`), so a daemon on either is
refused by name; it writes the key where no key of that name is (the same node's
key there is kept, another is refused), the peer key likewise, and merges the
receipts and refusals into the journal (a digest the journal has settled is kept
as it is). Every check that needs no password comes before the password.

The file is JSON::

    {"format": "swarmrl node key", "version": 1, "node": "0x...",
     "kdf": {"name": "scrypt", "n": 262144, "r": 8, "p": 1, "salt": "<hex>"},
     "cipher": {"name": "aes-256-gcm", "nonce": "<hex>"},
     "ciphertext": "<base64>"}

encrypted with the node key's own password, which the new machine's keystore keeps:
scrypt at the cost the keystores have (eth-account's, within `swarmrl.keystore`'s
caps, which the reader enforces before the kdf runs), then AES-256-GCM over the
zlib-compressed JSON of :class:`NodeBundle`, with every other field of the file as
associated data, so the node address and the parameters in clear cannot be changed
either. Not a JSON V3 keystore itself: its MAC covers only the ciphertext, and
eth-keyfile encrypts nothing but a private key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Final, Literal, Self

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from eth_account import Account
from eth_utils import to_checksum_address
from pydantic import Field, StringConstraints, ValidationError, model_validator

from client.node.settings import ROLE, NodeSettings
from client.node.work.journal import Journal
from swarmrl import keystore
from swarmrl.files import check_data_dir, check_output_path, read_bounded, write_atomically
from swarmrl.p2p.identity import (
    load_or_create_peer_key,
    peer_id_of,
    peer_key_path,
    save_peer_key,
)
from swarmrl.schema import Hex32, HexAddress, Reason, Strict, error_location
from swarmrl.work.submit import Receipt, SubmitHeader

FORMAT: Final = "swarmrl node key"
# What eth-account writes into a keystore, and so what a node key already costs.
SCRYPT_N: Final = 2**18
SCRYPT_R: Final = 8
SCRYPT_P: Final = 1
MAX_SCRYPT_N = keystore.MAX_SCRYPT_BLOCKS // SCRYPT_R
# A receipt is about 600 bytes of JSON: a million fit, years of a busy node.
MAX_RECORDS = 1_000_000
MAX_PLAIN_BYTES = 512 * 1024 * 1024
MAX_FILE_BYTES = 512 * 1024 * 1024

Salt = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]  # 16 bytes, as keystores
Nonce = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{24}$")]  # AES-GCM's 12 bytes
Base64 = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9+/]*={0,2}$")]


class TransferError(ValueError):
    """An export or import cannot go on; the message is one sentence for the user."""


class Scrypt(Strict):
    name: Literal["scrypt"]
    n: int = Field(ge=2, le=MAX_SCRYPT_N)
    r: Literal[8]
    p: Literal[1]
    salt: Salt

    @model_validator(mode="after")
    def _power_of_two(self) -> Self:
        if self.n & (self.n - 1):
            raise ValueError("the scrypt cost n is not a power of two")
        return self

    def key(self, password: str) -> bytes:
        """The AES-256 key for `password`."""
        return hashlib.scrypt(
            password.encode("utf-8", "surrogateescape"),
            salt=bytes.fromhex(self.salt),
            n=self.n,
            r=self.r,
            p=self.p,
            # What OpenSSL's scrypt takes for these costs (128 r (n + p + 2) bytes),
            # and a little more; the costs themselves are capped above.
            maxmem=128 * self.r * (self.n + self.p + 2) + 2**20,
            dklen=32,
        )


class Cipher(Strict):
    name: Literal["aes-256-gcm"]
    nonce: Nonce


class Envelope(Strict):
    """The file as it lies on disk: everything in clear, and the sealed bundle."""

    format: Literal["swarmrl node key"]
    version: Literal[1]
    node: HexAddress
    kdf: Scrypt
    cipher: Cipher
    ciphertext: Base64

    def associated_data(self) -> bytes:
        """What the cipher authenticates besides the ciphertext: every other field."""
        fields = self.model_dump(exclude={"ciphertext"})
        return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


class Refusal(Strict):
    """A submission the orchestrator refused for good, as the journal keeps it."""

    order_id: Hex32
    digest: Hex32
    header: SubmitHeader
    reason: Reason


class NodeBundle(Strict):
    """What the file seals: the node's keys and its journal's settled record."""

    format: Literal["swarmrl node key"]
    version: Literal[1]
    node: HexAddress
    private_key: Hex32
    peer_key: Hex32  # the Ed25519 seed of its libp2p identity, as swarmrl.p2p.identity keeps it
    receipts: list[Receipt] = Field(max_length=MAX_RECORDS)
    refused: list[Refusal] = Field(max_length=MAX_RECORDS)

    @model_validator(mode="after")
    def _one_node(self) -> Self:
        """Every part is the node's own: its key, and the receipts and refusals naming it."""
        node = to_checksum_address(self.node)
        try:
            address = Account.from_key(bytes.fromhex(self.private_key)).address
        except ValueError:
            raise ValueError("its private key is not a valid key") from None
        if address != node:
            raise ValueError("its private key is not the node's")
        if any(to_checksum_address(r.node) != node for r in self.receipts):
            raise ValueError("it holds a receipt of another node")
        if any(to_checksum_address(r.header.node) != node for r in self.refused):
            raise ValueError("it holds a refusal of another node's submission")
        return self

    @property
    def peer_id(self) -> str:
        from libp2p.crypto.ed25519 import create_new_key_pair

        return peer_id_of(create_new_key_pair(bytes.fromhex(self.peer_key)))


def _problem(error: ValidationError, whole: str) -> str:
    """Where the first problem of `error` is and what it is, fit for one line."""
    message = error.errors()[0]["msg"].removeprefix("Value error, ")
    return f"{error_location(error, whole)}: {' '.join(message.split())[:120]}"


def seal(plain: bytes, node: str, password: str, *, scrypt_n: int = SCRYPT_N) -> bytes:
    """The file's bytes: `plain` (a bundle's JSON) compressed and encrypted with
    `password`. `scrypt_n` is lowered only by tests, whose kdf must be cheap."""
    envelope = Envelope(
        format=FORMAT,
        version=1,
        node=to_checksum_address(node),
        kdf=Scrypt(name="scrypt", n=scrypt_n, r=SCRYPT_R, p=SCRYPT_P, salt=secrets.token_hex(16)),
        cipher=Cipher(name="aes-256-gcm", nonce=secrets.token_hex(12)),
        ciphertext="",
    )
    sealed = AESGCM(envelope.kdf.key(password)).encrypt(
        bytes.fromhex(envelope.cipher.nonce), zlib.compress(plain), envelope.associated_data()
    )
    done = envelope.model_copy(update={"ciphertext": base64.b64encode(sealed).decode()})
    return done.model_dump_json().encode() + b"\n"


def parse_envelope(raw: bytes) -> Envelope:
    """The file's clear part, every field checked; no password is needed for it."""
    if len(raw) > MAX_FILE_BYTES:
        raise TransferError("the file is too large to be a node export")
    try:
        # pydantic's own parser: depth-capped, unlike json.loads under web3.
        return Envelope.model_validate_json(raw)
    except ValidationError as e:
        raise TransferError(
            "the file is not a node export as `swarmrl node key export` writes it "
            f"({_problem(e, 'the whole file')})"
        ) from None


def open_bundle(envelope: Envelope, password: str) -> NodeBundle:
    """The bundle `envelope` seals; one sentence for a wrong password, a changed or
    damaged file, or contents that are not one node's."""
    try:
        sealed = base64.b64decode(envelope.ciphertext, validate=True)
    except binascii.Error:
        raise TransferError("the node export is damaged: its ciphertext is not base64") from None
    try:
        compressed = AESGCM(envelope.kdf.key(password)).decrypt(
            bytes.fromhex(envelope.cipher.nonce), sealed, envelope.associated_data()
        )
    except InvalidTag:
        raise TransferError(
            "wrong password for the node export, or the file was changed or is damaged"
        ) from None
    inflate = zlib.decompressobj()
    try:
        # Bounded: whoever knows the password could still seal a compression bomb.
        plain = inflate.decompress(compressed, MAX_PLAIN_BYTES + 1)
    except zlib.error:
        raise TransferError("the node export is damaged: its contents do not inflate") from None
    if len(plain) > MAX_PLAIN_BYTES or inflate.unconsumed_tail:
        raise TransferError("the node export holds more than swarmrl reads")
    if not inflate.eof:
        raise TransferError("the node export is damaged: its contents are cut short")
    try:
        bundle = NodeBundle.model_validate_json(plain)
    except ValidationError as e:
        raise TransferError(
            f"the node export holds no node this swarmrl reads ({_problem(e, 'its contents')})"
        ) from None
    if to_checksum_address(bundle.node) != to_checksum_address(envelope.node):
        raise TransferError("the node export is damaged: it names two different nodes")
    return bundle


def read_export(raw: bytes, password: str) -> NodeBundle:
    """The bundle in an export file's bytes, or TransferError in one sentence."""
    return open_bundle(parse_envelope(raw), password)


@dataclass(frozen=True)
class Exported:
    node: str
    peer_id: str
    receipts: int
    refused: int
    pending: int  # submissions still waiting to be sent, not in the file
    left_out: int  # damaged journal files, or another node's

    def summary(self, out: Path) -> str:
        """One line for the user: what the file holds."""
        line = (
            f"wrote {out}: node {self.node} (peer {self.peer_id}), {self.receipts} "
            f"receipt(s) and {self.refused} refusal(s)"
        )
        if self.left_out:
            line += f"; left out {self.left_out} damaged journal file(s) or another node's"
        return line

    def pending_note(self) -> str | None:
        """What to do about submissions the file does not carry, or None."""
        if not self.pending:
            return None
        return (
            f"{self.pending} submission(s) wait to be sent from this machine and are not in "
            "the file: start the node here once more and `swarmrl node finish` it, so it sends "
            "them, before it runs elsewhere"
        )


def export_node(
    settings: NodeSettings,
    out: Path,
    password: Callable[[], str],
    *,
    scrypt_n: int = SCRYPT_N,
) -> Exported:
    """Writes the node of `settings` (its key, peer identity and settled journal) to
    `out`, encrypted with the key's password, which `password` gives (asked for only
    once nothing cheaper can refuse)."""
    keys, name, data_dir = Path(settings.keystore_dir), settings.key, Path(settings.data_dir)
    check_output_path(out)
    keystore.info(keys, name)  # no such key, or a damaged one: said before the password
    peer_path = peer_key_path(keys, name)
    if not peer_path.is_file():
        raise TransferError(
            f"key {name!r} has no peer identity beside it ({peer_path}); "
            "`swarmrl node init` makes one"
        )
    peer = load_or_create_peer_key(peer_path)  # a damaged one is refused
    seed = peer_path.read_text(encoding="ascii").strip()  # its format checked just now
    with _data_dir_held(data_dir, "swarmrl node key export"):
        given = password()
        account = keystore.unlock(keys, name, given)
        receipts, refused, pending, left_out = _settled(data_dir / "journal", account.address)
    bundle = NodeBundle(
        format=FORMAT,
        version=1,
        node=account.address,
        private_key=account.key.hex().removeprefix("0x"),
        peer_key=seed,
        receipts=receipts,
        refused=refused,
    )
    plain = bundle.model_dump_json().encode()
    if len(plain) > MAX_PLAIN_BYTES:
        raise TransferError(
            f"the node's journal is too large to export ({len(plain)} bytes; at most "
            f"{MAX_PLAIN_BYTES})"
        )
    write_atomically(out, seal(plain, account.address, given, scrypt_n=scrypt_n))
    return Exported(
        account.address, peer_id_of(peer), len(receipts), len(refused), pending, left_out
    )


@contextmanager
def _data_dir_held(data_dir: Path, command: str) -> Iterator[None]:
    """The node's data dir for this process alone while its journal is read, as `node
    status` holds it: a daemon on it is refused naming its pid (FolderBusyError), and
    none starts meanwhile. A data dir not made yet holds nothing to read or guard."""
    if not data_dir.is_dir():
        yield
        return
    check_data_dir(data_dir, ROLE)
    from client.node.work.loop import holding_data_dir

    with holding_data_dir(data_dir, command):
        yield


def _settled(folder: Path, node: str) -> tuple[list[Receipt], list[Refusal], int, int]:
    """The journal's receipts and refusals of `node`, oldest first, the number of
    submissions still pending, and the number of files left out (damaged, or
    another node's). Call it holding the data dir: a Journal tidies up as it opens."""
    if not folder.is_dir():
        return [], [], 0, 0
    journal = Journal(folder)
    receipts: list[Receipt] = []
    refused: list[Refusal] = []
    left_out = 0
    for stored in journal.receipts():
        try:
            receipt = Receipt.model_validate(stored)
        except ValidationError:
            left_out += 1
            continue
        if to_checksum_address(receipt.node) != node:
            left_out += 1
            continue
        receipts.append(receipt)
    for kept in journal.refusals():
        try:
            header = SubmitHeader.model_validate(kept.header)
            refusal = Refusal(
                order_id=kept.order_id, digest=kept.digest, header=header, reason=kept.reason
            )
        except ValidationError:
            left_out += 1
            continue
        if to_checksum_address(header.node) != node:
            left_out += 1
            continue
        refused.append(refusal)
    return receipts, refused, len(journal.pending()), left_out


@dataclass(frozen=True)
class Imported:
    node: str
    peer_id: str
    key: str  # the keystore name it has here
    wrote_key: bool
    wrote_peer_key: bool
    added: int  # receipts and refusals the journal did not have
    kept: int  # those it had already

    def summary(self) -> str:
        """One line for the user: what is here now, and what this run wrote."""
        wrote = [
            *(["the key"] if self.wrote_key else []),
            *(["its peer identity"] if self.wrote_peer_key else []),
        ]
        keys = f"wrote {' and '.join(wrote)}" if wrote else "the key and peer identity were here"
        return (
            f"node {self.node} (peer {self.peer_id}) is key {self.key!r}: {keys}; added "
            f"{self.added} receipt(s) and refusal(s) to the journal ({self.kept} were there)"
        )


def import_node(settings: NodeSettings, source: Path, password: Callable[[], str]) -> Imported:
    """Makes this machine's node of `settings` the node exported into `source`: its key
    (encrypted here with the export's password, which `password` gives), its peer
    identity, and its receipts and refusals merged into the journal. Run again, it
    writes nothing that is there."""
    keys, name, data_dir = Path(settings.keystore_dir), settings.key, Path(settings.data_dir)
    envelope = parse_envelope(read_bounded(source, MAX_FILE_BYTES, "a node export"))
    node = to_checksum_address(envelope.node)
    keystore.check_folder(keys)
    existing = _existing_key(keys, name)
    if existing is not None and existing.address != node:
        raise TransferError(
            f"the keystore {keys} has another key named {name!r} ({existing.address}); import "
            f"node {node} under a name of its own (`key` in the node's config)"
        )
    peer_path = peer_key_path(keys, name)
    had_peer = peer_path.exists()
    here = peer_id_of(load_or_create_peer_key(peer_path)) if had_peer else None
    check_data_dir(data_dir, ROLE)
    with _data_dir_held(data_dir, "swarmrl node key import"):
        pass  # a daemon on it is refused now, before the password and the kdf
    given = password()
    bundle = open_bundle(envelope, given)
    peer_id = bundle.peer_id
    if here is not None and here != peer_id:
        raise TransferError(
            f"{peer_path} holds another peer identity ({here}) than node {node}'s ({peer_id}); "
            "import it under a key name of its own (`key` in the node's config)"
        )
    from client.node.work.loop import sole_runner

    # The key's lock lives beside its keystore, which a new machine may not have yet.
    keys.mkdir(parents=True, exist_ok=True, mode=0o700)
    with sole_runner(settings, "swarmrl node key import"):
        journal = Journal(data_dir / "journal")
        _check_journal_is_of(journal, node, data_dir)
        if existing is None:
            keystore.save(keys, name, bytes.fromhex(bundle.private_key), given)
        if not had_peer:
            _write_peer_key(peer_path, bundle.peer_key, peer_id)
        added, kept = _merge(journal, bundle)
    return Imported(node, peer_id, name, existing is None, not had_peer, added, kept)


def _existing_key(keys: Path, name: str) -> keystore.KeyInfo | None:
    """The key `name` if there is one; a damaged keystore is refused, never replaced."""
    if keystore.NAME.fullmatch(name) and not (keys / f"{name}.json").exists():
        return None
    return keystore.info(keys, name)


def _check_journal_is_of(journal: Journal, node: str, data_dir: Path) -> None:
    """One journal keeps one node's history: a data dir that served another node is
    refused rather than mixed."""
    for receipt in journal.receipts():
        other = str(receipt.get("node", ""))
        if other.lower() != node.lower():
            raise TransferError(
                f"the journal in {data_dir} holds receipts of another node ({other[:42]}); "
                f"give node {node} a data folder of its own (`data_dir` in its config)"
            )


def _write_peer_key(path: Path, seed: str, peer_id: str) -> None:
    """Writes the node's peer key where none was, and checks it reads back as its peer."""
    if not save_peer_key(path, bytes.fromhex(seed)):
        raise TransferError(f"{path} appeared while importing; run the import again")
    if peer_id_of(load_or_create_peer_key(path)) != peer_id:
        raise TransferError(f"{path} does not read back as peer {peer_id}")


def _merge(journal: Journal, bundle: NodeBundle) -> tuple[int, int]:
    """Settles in `journal` every receipt and refusal of `bundle` it has not settled,
    oldest first (the journal orders them by when it settled them); (added, kept)."""
    added = kept = 0
    for receipt in bundle.receipts:
        if journal.settled(receipt.submission):
            kept += 1
            continue
        journal.settle(receipt.submission, receipt.model_dump())
        added += 1
    for refusal in bundle.refused:
        if journal.settled(refusal.digest):
            kept += 1
            continue
        journal.keep_refusal(
            refusal.order_id, refusal.digest, refusal.header.model_dump(), refusal.reason
        )
        added += 1
    return added, kept
