//! Checkpoint shards (filled in by the shards work).
