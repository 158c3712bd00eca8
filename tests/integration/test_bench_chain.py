"""`swarmrl bench chain`'s measuring function at a small size: what its figures stand
on holds (one recording transaction for the whole epoch, every node's leaf on chain,
the claim paid what the leaves earned), so a figure in BENCHMARKS.md cannot come from
a run that recorded nothing or half the swarm."""

from __future__ import annotations

import pytest

from benchmarks import chain as bench


def test_a_small_swarms_epoch_is_one_transaction_with_every_leaf_and_the_claim_pays(tmp_path):
    nodes = 12  # two providers: 10 nodes and 2
    result = bench.measure(nodes, data_dir=tmp_path, progress=lambda _: None)

    assert result.errors == []
    assert (result.providers, result.parts, result.transactions) == (2, 1, 1)
    assert len(result.gas_per_transaction) == 1
    assert (result.leaves_on_chain, result.nodes_without_leaf) == (nodes, [])
    assert 0 < result.gas_per_node < bench.GOAL_GAS_PER_NODE
    assert result.gas_per_node == result.recording_gas / nodes
    assert result.gas_per_transaction[0] < result.block_gas_limit
    # The evidence node's slash vote went out, and slashed (quorum 1).
    assert (result.slash_outcome, result.slash_gas > 0) == ("sent", True)

    # The first provider's 10 nodes, none of them the slashed one: units times the
    # reward per unit, paid to the provider.
    units = bench.SUBMISSIONS_PER_NODE * bench.UNITS_PER_SUBMISSION
    expected = 10 * units * bench.PARAMS.reward_per_unit
    assert result.claim_leaves == 10
    assert result.expected_claim == expected
    assert result.claimed == result.provider_balance_change == expected
    assert result.claim_gas > 0


def test_sizes_are_plain_positive_counts_within_the_bound():
    assert bench.parse_sizes("10,100,1000") == (10, 100, 1000)
    for bad in ("", "abc", "0", "-5", "1,,2", "1_000", " 12", str(bench.MAX_NODES + 1)):
        with pytest.raises(ValueError, match="--nodes"):
            bench.parse_sizes(bad)
