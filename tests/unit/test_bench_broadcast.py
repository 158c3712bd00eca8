"""benchmarks.broadcast: its swarmrl side, small (the reference needs the bench extras)."""

from __future__ import annotations

from benchmarks import broadcast
from benchmarks.shards import write_random_file


def test_the_swarmrl_side_leaves_a_whole_copy_with_every_node(tmp_path):
    checkpoint = tmp_path / "model.safetensors"
    write_random_file(checkpoint, 3 * broadcast.SHARD_MIB * broadcast.MIB // 2)
    # run_swarmrl raises unless each node's store holds the file at its full size.
    result = broadcast.run_swarmrl(checkpoint, 2, tmp_path)
    assert result.seconds > 0
    assert 0 < result.origin_share <= 1
    assert result.sent_per_needed >= 1
