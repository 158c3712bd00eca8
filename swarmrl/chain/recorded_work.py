"""An epoch's recorded work as the pool holds it: one leaf per node, in parts of at
most MAX_LEAVES nodes, each part a Merkle tree whose root goes on chain in one
transaction.

The pool computes each part's root from the leaves it is sent and logs every leaf,
so the recorder, a validator and a provider's wallet all rebuild the same tree here
(from the ledger or from the chain's logs) to prove one leaf.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from eth_abi import encode as abi_encode
from eth_utils import keccak, to_checksum_address

from swarmrl.eip712 import MerkleTree

# ComputePool.MAX_LEAVES: the most nodes one recording transaction carries (about
# 7M gas at 1,024: `swarmrl bench chain`), so an epoch of a thousand nodes is one
# transaction.
MAX_LEAVES = 1024


@dataclass(frozen=True)
class WorkLeaf:
    """One node's work in one epoch: ComputePool.WorkLeaf."""

    node: str
    membership: int  # the node's membership its work was done under (1 is its first)
    units: int
    commitment: bytes  # root over the node's signed submissions of the epoch

    def __post_init__(self) -> None:
        object.__setattr__(self, "node", to_checksum_address(self.node))
        if self.units <= 0:
            raise ValueError(f"a work leaf needs units, got {self.units}")
        if len(self.commitment) != 32:
            raise ValueError("a work leaf's commitment is a 32-byte root")

    def hash(self) -> bytes:
        """keccak256(abi.encode(node, membership, units, commitment)), as the pool hashes it."""
        return keccak(
            abi_encode(
                ["address", "uint32", "uint128", "bytes32"],
                [self.node, self.membership, self.units, self.commitment],
            )
        )

    def as_tuple(self) -> tuple[str, int, int, bytes]:
        return (self.node, self.membership, self.units, self.commitment)


@dataclass(frozen=True)
class LeafRef:
    """A leaf with the part it was recorded in and its proof: what claim, invalidate
    and slash take (ComputePool.LeafRef)."""

    epoch: int
    part: int
    leaf: WorkLeaf
    proof: tuple[bytes, ...]

    def as_tuple(self) -> tuple[int, int, tuple[str, int, int, bytes], list[bytes]]:
        return (self.epoch, self.part, self.leaf.as_tuple(), list(self.proof))


class WorkPart:
    """Part `part` of `epoch`: its leaves in the pool's order (ascending node address)
    and their tree."""

    def __init__(self, epoch: int, part: int, leaves: Sequence[WorkLeaf]) -> None:
        if not 0 < len(leaves) <= MAX_LEAVES:
            raise ValueError(f"a part holds 1 to {MAX_LEAVES} leaves, got {len(leaves)}")
        ordered = sorted(leaves, key=_node_order)
        if any(_node_order(a) == _node_order(b) for a, b in pairwise(ordered)):
            raise ValueError(f"epoch {epoch} part {part} names a node twice")
        self.epoch = epoch
        self.part = part
        self.leaves: tuple[WorkLeaf, ...] = tuple(ordered)
        self.tree = MerkleTree([leaf.hash() for leaf in ordered])

    @property
    def root(self) -> bytes:
        return self.tree.root

    @property
    def units(self) -> int:
        return sum(leaf.units for leaf in self.leaves)

    def index(self, node: str) -> int:
        """The position of `node`'s leaf; KeyError if the part has none."""
        node = to_checksum_address(node)
        for i, leaf in enumerate(self.leaves):
            if leaf.node == node:
                return i
        raise KeyError(f"epoch {self.epoch} part {self.part} has no leaf of node {node}")

    def ref(self, node: str) -> LeafRef:
        """`node`'s leaf with its proof against this part's root."""
        i = self.index(node)
        return LeafRef(self.epoch, self.part, self.leaves[i], tuple(self.tree.proof(i)))


def parts_of(
    epoch: int, leaves: Iterable[WorkLeaf], *, first: int = 0, size: int = MAX_LEAVES
) -> list[WorkPart]:
    """An epoch's leaves cut into parts of at most `size` in ascending node order,
    numbered from `first` (the parts already on chain keep theirs)."""
    ordered = sorted(leaves, key=_node_order)
    return [
        WorkPart(epoch, first + k, ordered[i : i + size])
        for k, i in enumerate(range(0, len(ordered), size))
    ]


def _node_order(leaf: WorkLeaf) -> int:
    """The pool compares addresses as numbers."""
    return int(leaf.node, 16)
