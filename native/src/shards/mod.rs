//! Checkpoint shards: a file cut into fixed-size pieces, each hashed with
//! BLAKE3, all bound together by one Merkle root.
//!
//! A file of `file_size` bytes in `shard_size`-byte shards has
//! `ceil(file_size / shard_size)` shards, all full except perhaps the last.
//! Empty files are rejected: a checkpoint with no bytes is always a mistake,
//! and a Merkle tree needs at least one leaf.
//!
//! Files are streamed through a few fixed-size buffers ([`stream`]), so memory
//! does not grow with the file or the shard size. Whatever is written (shard
//! files, reassembled checkpoints) gets its final name only once it is
//! complete, verified and synced; on error no partial file is left behind.

mod files;
mod hash;
mod merkle;
mod stream;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::atomic;

pub use files::{hash_file, missing_shards, reassemble, shard_file_name, split, store_shard};
pub use hash::{hash_shard, verify_shard};
pub use merkle::{inclusion_proof, merkle_root, verify_inclusion};

/// A BLAKE3 digest.
pub type Hash = [u8; 32];

/// The largest shard accepted. A shard is the unit a peer holds in memory to
/// verify and serve, so it must stay small next to the machine's RAM.
pub const MAX_SHARD_SIZE: u64 = 1 << 30;

#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error("shard size must be between 1 and {MAX_SHARD_SIZE} bytes, got {0}")]
    ShardSize(u64),
    #[error("a checkpoint must hold at least one byte, got a file size of 0")]
    ZeroFileSize,
    #[error("{} is empty; a checkpoint must hold at least one byte", .0.display())]
    EmptyFile(PathBuf),
    #[error("{} is not a regular file", .0.display())]
    NotAFile(PathBuf),
    #[error(
        "{} is {got} bytes, expected {expected}; it is the wrong file or changed while being read",
        path.display()
    )]
    FileSize { path: PathBuf, got: u64, expected: u64 },
    #[error("shard index {index} is out of range: there are {count} shards")]
    Index { index: u64, count: u64 },
    #[error("expected {expected} shard hashes, got {got}")]
    HashCount { expected: u64, got: u64 },
    #[error("a Merkle root needs at least one shard hash")]
    NoShards,
    #[error("the Merkle root of the shard hashes is not the expected root")]
    Root,
    #[error("the inclusion proof does not lead to the Merkle root")]
    Proof,
    #[error("shard {index} is missing: {} does not exist", path.display())]
    MissingShard { index: u64, path: PathBuf },
    #[error("shard {index} is {got} bytes, expected {expected}")]
    ShardLength { index: u64, got: u64, expected: u64 },
    #[error("shard {index} does not match its expected hash")]
    ShardHash { index: u64 },
    #[error("{} does not name a file to write", .0.display())]
    OutputPath(PathBuf),
    #[error("could not {op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("could not start {0} worker threads")]
    Threads(usize),
}

impl ShardError {
    /// For `map_err`: an I/O failure to `op` the file at `path`.
    pub(crate) fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> Self + 'a {
        move |source| ShardError::Io { op, path: path.to_owned(), source }
    }
}

/// A failed output file is this module's own error, so its message reads like
/// the rest: `OutputPath`, or `Io` naming the same operation and path.
impl From<atomic::Error> for ShardError {
    fn from(e: atomic::Error) -> Self {
        match e {
            atomic::Error::NoFileName(path) => ShardError::OutputPath(path),
            atomic::Error::Io { op, path, source } => ShardError::Io { op, path, source },
        }
    }
}

/// How a file of `file_size` bytes is cut into `shard_size`-byte shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    file_size: u64,
    shard_size: u64,
}

impl Layout {
    pub fn new(file_size: u64, shard_size: u64) -> Result<Self, ShardError> {
        check_shard_size(shard_size)?;
        if file_size == 0 {
            return Err(ShardError::ZeroFileSize);
        }
        Ok(Layout { file_size, shard_size })
    }

    pub fn file_size(&self) -> u64 {
        self.file_size
    }

    pub fn shard_size(&self) -> u64 {
        self.shard_size
    }

    pub fn count(&self) -> u64 {
        self.file_size.div_ceil(self.shard_size)
    }

    /// The byte offset and length of shard `index`.
    pub fn range(&self, index: u64) -> Result<(u64, u64), ShardError> {
        if index >= self.count() {
            return Err(ShardError::Index { index, count: self.count() });
        }
        let offset = index * self.shard_size;
        Ok((offset, self.shard_size.min(self.file_size - offset)))
    }
}

pub(crate) fn check_shard_size(shard_size: u64) -> Result<(), ShardError> {
    if shard_size == 0 || shard_size > MAX_SHARD_SIZE {
        return Err(ShardError::ShardSize(shard_size));
    }
    Ok(())
}

/// What a manifest promises about a file: how it is cut, every shard's hash,
/// and the Merkle root over them, checked to agree on construction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    layout: Layout,
    hashes: Vec<Hash>,
    root: Hash,
}

impl Expected {
    pub fn new(layout: Layout, hashes: Vec<Hash>, root: Hash) -> Result<Self, ShardError> {
        let got = hashes.len() as u64;
        if got != layout.count() {
            return Err(ShardError::HashCount { expected: layout.count(), got });
        }
        if merkle_root(&hashes)? != root {
            return Err(ShardError::Root);
        }
        Ok(Expected { layout, hashes, root })
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    pub fn root(&self) -> &Hash {
        &self.root
    }

    pub fn hash(&self, index: u64) -> Result<&Hash, ShardError> {
        self.layout.range(index)?;
        Ok(&self.hashes[index as usize])
    }
}

/// The shared pool of `n` workers, or why it could not start.
fn pool(n: usize) -> Result<Arc<rayon::ThreadPool>, ShardError> {
    crate::pool::pool(n).map_err(|_| ShardError::Threads(n))
}

#[cfg(test)]
mod tests;
