//! TOPLOC: locality-sensitive proofs that a model produced given activations.
//!
//! Rows are tokens, columns the hidden size. Rows are grouped into chunks of
//! `chunk` rows; each chunk gets one proof over its `topk` largest-magnitude
//! values (see [`proof`]). Proofs are byte-compatible with toploc 0.1.6 and
//! chunks are processed in parallel.
//!
//! Unlike the reference, nothing here panics on bad input: shapes and
//! parameters are checked up front, and a missing or malformed proof is
//! reported as a rejected chunk, never skipped.

mod field;
pub mod proof;
mod topk;

use rayon::prelude::*;

use crate::pool::pool;

pub use proof::{Discrepancy, Proof, ProofFormatError};

/// The field prime; moduli and coefficients are below it.
pub const FIELD_PRIME: u32 = field::P;

/// Acceptance thresholds of the reference for k = 128: at most 38 exponent
/// mismatches, mean mantissa error <= 10, median <= 8. The mismatch budget
/// scales with k as the same fraction (38/128, rounded down); the mantissa
/// bounds are per element and do not depend on k.
pub const MAX_EXP_MISMATCH_PER_128: usize = 38;
pub const MAX_MANT_ERR_MEAN: f64 = 10.0;
pub const MAX_MANT_ERR_MEDIAN: f64 = 8.0;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToplocError {
    #[error("activations have {len} values, which is not {rows} rows x {width} columns")]
    Shape { len: usize, rows: usize, width: usize },
    #[error("activations need at least one column")]
    NoColumns,
    #[error("chunk must be at least 1 row")]
    ZeroChunk,
    #[error("topk must be between 1 and {FIELD_PRIME}, got {0}")]
    TopK(usize),
    #[error("chunk {index} holds {values} values, fewer than topk = {topk}")]
    ChunkTooSmall { index: usize, values: usize, topk: usize },
    #[error("expected {expected} proofs ({rows} rows in chunks of {chunk}), got {got}")]
    ProofCount { expected: usize, got: usize, rows: usize, chunk: usize },
    #[error("could not start {0} worker threads")]
    Threads(usize),
}

/// A row-major view of bf16 bit patterns.
#[derive(Debug, Clone, Copy)]
pub struct Activations<'a> {
    data: &'a [u16],
    rows: usize,
    width: usize,
}

impl<'a> Activations<'a> {
    pub fn new(data: &'a [u16], rows: usize, width: usize) -> Result<Self, ToplocError> {
        if rows.checked_mul(width) != Some(data.len()) {
            return Err(ToplocError::Shape { len: data.len(), rows, width });
        }
        if width == 0 {
            return Err(ToplocError::NoColumns);
        }
        Ok(Activations { data, rows, width })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The flattened chunks of `chunk` rows; the last one may be shorter.
    fn chunks(&self, chunk: usize, topk: usize) -> Result<Vec<&'a [u16]>, ToplocError> {
        if chunk == 0 {
            return Err(ToplocError::ZeroChunk);
        }
        if topk == 0 || topk > FIELD_PRIME as usize {
            return Err(ToplocError::TopK(topk));
        }
        let chunks: Vec<&[u16]> = self.data.chunks(chunk.saturating_mul(self.width)).collect();
        if let Some((index, c)) = chunks.iter().enumerate().find(|(_, c)| c.len() < topk) {
            return Err(ToplocError::ChunkTooSmall { index, values: c.len(), topk });
        }
        Ok(chunks)
    }
}

/// The outcome of checking one chunk.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    pub discrepancy: Discrepancy,
    pub accepted: bool,
}

impl Verdict {
    fn judge(discrepancy: Discrepancy, topk: usize) -> Self {
        let budget = topk * MAX_EXP_MISMATCH_PER_128 / 128;
        let accepted = discrepancy.exp_mismatches <= budget
            && discrepancy.mant_err_mean <= MAX_MANT_ERR_MEAN
            && discrepancy.mant_err_median <= MAX_MANT_ERR_MEDIAN;
        Verdict { discrepancy, accepted }
    }
}

/// Runs `f` over the items on `threads` workers: `None` means rayon's global
/// pool (all cores, or `RAYON_NUM_THREADS`), 1 means this thread alone.
fn run_parallel<T: Sync, R: Send>(
    items: &[T],
    threads: Option<usize>,
    f: impl Fn(&T) -> R + Sync + Send,
) -> Result<Vec<R>, ToplocError> {
    match threads {
        Some(1) => Ok(items.iter().map(f).collect()),
        None | Some(0) => Ok(items.par_iter().map(f).collect()),
        Some(n) => Ok(pool(n)
            .map_err(|_| ToplocError::Threads(n))?
            .install(|| items.par_iter().map(f).collect())),
    }
}

/// One proof per chunk of `chunk` rows.
pub fn build_proofs(
    acts: Activations<'_>,
    chunk: usize,
    topk: usize,
    threads: Option<usize>,
) -> Result<Vec<Proof>, ToplocError> {
    let chunks = acts.chunks(chunk, topk)?;
    run_parallel(&chunks, threads, |c| proof::prove_chunk(c, topk))
}

/// Checks each chunk against its proof. `proofs[i]` is the raw bytes of the
/// proof for chunk `i`, or `None` where it is missing; either way the chunk
/// gets a verdict, and a malformed or missing proof is simply rejected.
pub fn verify_proofs(
    acts: Activations<'_>,
    proofs: &[Option<&[u8]>],
    chunk: usize,
    topk: usize,
    threads: Option<usize>,
) -> Result<Vec<Verdict>, ToplocError> {
    let chunks = acts.chunks(chunk, topk)?;
    if chunks.len() != proofs.len() {
        return Err(ToplocError::ProofCount {
            expected: chunks.len(),
            got: proofs.len(),
            rows: acts.rows,
            chunk,
        });
    }
    let pairs: Vec<(&[u16], Option<&[u8]>)> =
        chunks.into_iter().zip(proofs.iter().copied()).collect();
    run_parallel(&pairs, threads, |&(c, bytes)| {
        let discrepancy = match bytes.map(|b| Proof::parse(b, topk)) {
            Some(Ok(p)) => proof::check_chunk(c, &p, topk),
            _ => Discrepancy::total(topk),
        };
        Verdict::judge(discrepancy, topk)
    })
}

#[cfg(test)]
mod tests;
