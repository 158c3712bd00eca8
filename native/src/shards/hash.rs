//! Hashing one shard, on one thread or many.

use std::sync::Arc;

use super::{pool, Hash, Layout, ShardError};

/// Below this, splitting input across threads costs more than it saves
/// (blake3's own guidance for `update_rayon`).
const PARALLEL_MIN: usize = 128 * 1024;

/// Who does the work: `threads` of `None` or `Some(0)` means all cores (or
/// `RAYON_NUM_THREADS`), `Some(1)` the calling thread alone, `Some(n)` a pool
/// of `n`.
pub(crate) enum Workers {
    Caller,
    Pool(Arc<rayon::ThreadPool>),
}

impl Workers {
    pub(crate) fn new(threads: Option<usize>) -> Result<Self, ShardError> {
        Ok(match threads.unwrap_or(0) {
            1 => Workers::Caller,
            n => Workers::Pool(pool(n)?),
        })
    }

    /// Runs `f` on a worker, so that the joins inside it stay in the pool
    /// instead of each being handed over from outside.
    pub(crate) fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match self {
            Workers::Caller => f(),
            Workers::Pool(p) => p.install(f),
        }
    }

    /// Runs `a` and `b`, in parallel when there is a pool.
    pub(crate) fn join<A, B, RA, RB>(&self, a: A, b: B) -> (RA, RB)
    where
        A: FnOnce() -> RA + Send,
        B: FnOnce() -> RB + Send,
        RA: Send,
        RB: Send,
    {
        match self {
            Workers::Caller => (a(), b()),
            Workers::Pool(p) => p.install(|| rayon::join(a, b)),
        }
    }

    pub(crate) fn update(&self, hasher: &mut blake3::Hasher, data: &[u8]) {
        match self {
            Workers::Pool(p) if data.len() >= PARALLEL_MIN => p.install(|| {
                hasher.update_rayon(data);
            }),
            _ => {
                hasher.update(data);
            }
        }
    }
}

/// The BLAKE3 hash of one in-memory shard.
pub fn hash_shard(data: &[u8], threads: Option<usize>) -> Result<Hash, ShardError> {
    let mut hasher = blake3::Hasher::new();
    Workers::new(threads)?.update(&mut hasher, data);
    Ok(*hasher.finalize().as_bytes())
}

/// Checks that `data` is shard `index` of a file cut as `layout`: the right
/// length, and hashing to `expected`.
pub fn verify_shard(
    layout: Layout,
    index: u64,
    data: &[u8],
    expected: &Hash,
    threads: Option<usize>,
) -> Result<(), ShardError> {
    let (_, len) = layout.range(index)?;
    let got = data.len() as u64;
    if got != len {
        return Err(ShardError::ShardLength { index, got, expected: len });
    }
    if hash_shard(data, threads)? != *expected {
        return Err(ShardError::ShardHash { index });
    }
    Ok(())
}
