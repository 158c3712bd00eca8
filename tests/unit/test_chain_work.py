"""An epoch's work cut into parts and leaves, without a chain: the pool's own order and
roots are checked against a real pool in tests/integration/test_contracts.py."""

from __future__ import annotations

import random

import pytest
from eth_utils import to_checksum_address

from swarmrl.chain.recorded_work import MAX_LEAVES, WorkLeaf, WorkPart, parts_of

COMMITMENT = bytes(range(32))


def _leaves(n: int, seed: int = 0) -> list[WorkLeaf]:
    rng = random.Random(seed)
    nodes = {rng.randbytes(20).hex() for _ in range(n)}
    assert len(nodes) == n  # 160 random bits do not collide
    return [WorkLeaf("0x" + node, 1, 1 + i % 7, COMMITMENT) for i, node in enumerate(nodes)]


def test_parts_of_cuts_an_epoch_into_full_parts_in_ascending_node_order():
    leaves = _leaves(2_500)
    parts = parts_of(9, leaves)
    assert [(p.epoch, p.part, len(p.leaves)) for p in parts] == [
        (9, 0, MAX_LEAVES),
        (9, 1, MAX_LEAVES),
        (9, 2, 2_500 - 2 * MAX_LEAVES),
    ]
    nodes = [int(leaf.node, 16) for p in parts for leaf in p.leaves]
    assert nodes == sorted(nodes)  # across parts too, so part k is the same nodes each time
    assert sum(p.units for p in parts) == sum(leaf.units for leaf in leaves)

    shuffled = leaves[:]
    random.Random(1).shuffle(shuffled)
    again = parts_of(9, shuffled)
    assert [(p.part, p.leaves, p.root) for p in again] == [
        (p.part, p.leaves, p.root) for p in parts
    ]


def test_a_part_proves_each_of_its_leaves():
    part = WorkPart(2, 5, _leaves(5))
    for leaf in part.leaves:
        ref = part.ref(leaf.node.lower())
        assert (ref.epoch, ref.part, ref.leaf) == (2, 5, leaf)
        assert list(ref.proof) == part.tree.proof(part.index(leaf.node))
    with pytest.raises(KeyError, match="has no leaf of node"):
        part.ref("0x" + "ab" * 20)


def test_a_work_leaf_needs_units_and_a_32_byte_commitment():
    node = "0x" + "ab" * 20
    assert WorkLeaf(node, 1, 1, COMMITMENT).node == to_checksum_address(node)
    for units in (0, -1):
        with pytest.raises(ValueError, match=f"^a work leaf needs units, got {units}$"):
            WorkLeaf(node, 1, units, COMMITMENT)
    with pytest.raises(ValueError, match="commitment is a 32-byte root"):
        WorkLeaf(node, 1, 1, bytes(31))


def test_a_part_holds_each_node_once_and_at_most_max_leaves():
    leaf = _leaves(1)[0]
    twice = WorkLeaf(leaf.node.lower(), 2, 3, bytes(32))  # the same node, spelled otherwise
    with pytest.raises(ValueError, match=r"^epoch 1 part 0 names a node twice$"):
        WorkPart(1, 0, [leaf, twice])
    with pytest.raises(ValueError, match=f"^a part holds 1 to {MAX_LEAVES} leaves, got 0$"):
        WorkPart(1, 0, [])
    with pytest.raises(ValueError, match=f"got {MAX_LEAVES + 1}$"):
        WorkPart(1, 0, _leaves(MAX_LEAVES + 1))
