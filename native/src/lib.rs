//! The native core of swarmrl: pure, fast functions with no Python policy in them.
//!
//! * [`toploc`]: TOPLOC activation proofs, byte-compatible with toploc 0.1.6.
//! * [`shards`]: fixed-size checkpoint shards, BLAKE3 hashes and their Merkle root.
//! * [`delta`]: a checkpoint as the difference from the previous one.
//!
//! Shards and deltas write their outputs through the private `atomic` module:
//! files that appear whole or not at all.
//!
//! The Python bindings live in `python/` behind the `python` feature, so that
//! `cargo test` exercises the kernels as plain Rust.

mod atomic;
pub mod delta;
mod pool;
pub mod shards;
pub mod toploc;

#[cfg(test)]
mod test_dir;

#[cfg(feature = "python")]
mod python;
