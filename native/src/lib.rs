//! The native core of swarmrl: pure, fast functions with no Python policy in them.
//!
//! * [`toploc`]: TOPLOC activation proofs, byte-compatible with toploc 0.1.6.
//! * [`shards`]: fixed-size checkpoint shards, BLAKE3 hashes and their Merkle root.
//!
//! The Python bindings live in `python/` behind the `python` feature, so that
//! `cargo test` exercises the kernels as plain Rust.

mod pool;
pub mod shards;
pub mod toploc;

#[cfg(feature = "python")]
mod python;
