//! Weight deltas: policy step `n` shipped as its difference from step `n-1`.
//!
//! Both steps are safetensors files with the same header (names, dtypes,
//! shapes, offsets), so only tensor bytes differ. [`encode`] writes, for each
//! tensor in file order, the smaller of two zstd-compressed encodings: the
//! XOR of the two byte ranges, or the changed elements' indices and XORs
//! (both as byte planes: see [`format`] for the file layout). [`apply`] rebuilds the target
//! from the base and the delta, only onto the exact base it was made against,
//! and checks every tensor and the whole result against the hashes the delta
//! carries; [`inspect`] says what a delta holds without a base.
//!
//! Both directions stream: tensors are read with positioned reads of their
//! byte ranges, a window of consecutive tensors at a time (at most
//! [`WINDOW_BYTES`], or one tensor when it alone is larger), encoded or
//! decoded in parallel within the window, then hashed into the whole-file
//! hashes and written in order while the next window is coded. Memory is
//! therefore a few times `max(WINDOW_BYTES, largest tensor)`, never the
//! model: two windows of base and target bytes (encode) or of base and
//! rebuilt bytes (apply), plus, per tensor being coded, its XOR, sparse
//! stream and compressed candidates (encode) or its payload and decoded
//! stream (apply).
//!
//! Outputs are written under a hidden temporary name next to their
//! destination, synced, and renamed into place only once every check passed;
//! on any error nothing is left behind. A delta is untrusted input: every
//! length and offset in it is checked before it is used, decompression never
//! produces more than the tensor's own size, and each malformation is a
//! distinct [`DeltaError`] of one sentence.

mod apply;
mod codec;
mod encode;
mod format;
mod io;
mod safetensors;

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::atomic;

pub use apply::apply;
pub use encode::{encode, Stats};
pub use format::{inspect, Encoding, Info, Record, FORMAT_VERSION, MAGIC, MAX_HEADER};
pub use safetensors::MAX_HEADER as MAX_SAFETENSORS_HEADER;

/// A BLAKE3 digest.
pub type Hash = [u8; 32];

/// How many tensor bytes one window holds. Large enough that a window has
/// dozens of a small model's tensors to spread over the cores, small enough
/// that its buffers stay a small fraction of a model.
pub const WINDOW_BYTES: u64 = 32 << 20;

#[derive(Debug, thiserror::Error)]
pub enum DeltaError {
    #[error("{} is not a usable safetensors file: {reason}", path.display())]
    Safetensors { path: PathBuf, reason: String },
    #[error("{} cannot be a delta of {}: {what}", target.display(), base.display())]
    Mismatch { base: PathBuf, target: PathBuf, what: String },
    #[error("the zstd level must be between {min} and {max}, got {got}")]
    Level { got: i32, min: i32, max: i32 },
    #[error("the file does not start with SRLDELTA: it is not a swarmrl weight delta")]
    NotADelta,
    #[error("the delta is format version {0}; this build reads version {FORMAT_VERSION}")]
    Version(u32),
    #[error("the delta's header claims {0} bytes, more than the {MAX_HEADER} allowed")]
    HeaderTooLarge(u64),
    #[error("the delta is truncated: {what} needs {need} bytes past its end")]
    Truncated { what: String, need: u64 },
    #[error("the delta's header is not valid: {0}")]
    BadHeader(String),
    #[error("tensor {tensor} has encoding {encoding}, which this build does not know")]
    UnknownEncoding { tensor: String, encoding: String },
    #[error("tensor {tensor} is {length} bytes, not a whole number of {size}-byte elements")]
    ElementSize { tensor: String, size: u64, length: u64 },
    #[error(
        "tensor {tensor}'s payload starts at byte {start}, inside the previous payload, \
         which ends at byte {expected}"
    )]
    PayloadOverlap { tensor: String, start: u64, expected: u64 },
    #[error(
        "tensor {tensor}'s payload starts at byte {start}, but payloads are back to back \
         and the previous one ends at byte {expected}"
    )]
    PayloadGap { tensor: String, start: u64, expected: u64 },
    #[error(
        "tensor {tensor}'s payload is {compressed} bytes, more than zstd makes of its {length}"
    )]
    PayloadTooLarge { tensor: String, compressed: u64, length: u64 },
    #[error("the delta has {0} bytes after its last payload")]
    TrailingBytes(u64),
    #[error(
        "the delta's sizes do not add up: its target is {target_size} bytes, but its \
         {header}-byte safetensors header and {tensors} bytes of tensors make {}",
        *header as u128 + tensors
    )]
    Sizes { target_size: u64, header: u64, tensors: u128 },
    #[error("{} is not the delta's base: {reason}", path.display())]
    WrongBase { path: PathBuf, reason: String },
    #[error("the delta's record table disagrees with the base's safetensors header: {0}")]
    Table(String),
    #[error("tensor {tensor}'s payload is not valid zstd: {reason}")]
    Zstd { tensor: String, reason: &'static str },
    #[error("tensor {tensor}'s payload decompresses to more than the {cap} bytes it may hold")]
    Oversize { tensor: String, cap: u64 },
    #[error("tensor {tensor}'s XOR payload decompresses to {got} bytes instead of {length}")]
    XorLength { tensor: String, got: u64, length: u64 },
    #[error("tensor {tensor}'s sparse payload ends inside a varint or has one over 64 bits")]
    Varint { tensor: String },
    #[error("tensor {tensor}'s sparse payload claims {count} changes in {elements} elements")]
    SparseCount { tensor: String, count: u64, elements: u64 },
    #[error("tensor {tensor}'s sparse gaps run past its {elements} elements")]
    SparseRange { tensor: String, elements: u64 },
    #[error(
        "tensor {tensor}'s sparse payload holds {got} bytes of changed values, but {count} changes \
         of {size} bytes need {}",
        *count as u128 * *size as u128
    )]
    SparseValues { tensor: String, got: u64, count: u64, size: u64 },
    #[error("tensor {tensor} does not match its BLAKE3 after applying the delta")]
    TensorHash { tensor: String },
    #[error("the rebuilt file does not match the delta's target BLAKE3")]
    TargetHash,
    #[error("zstd could not compress tensor {tensor}: {reason}")]
    Compress { tensor: String, reason: &'static str },
    #[error("{} ended early: it changed while being read", .0.display())]
    Shrunk(PathBuf),
    #[error("{} is not a regular file", .0.display())]
    NotAFile(PathBuf),
    #[error("{} does not name a file to write", .0.display())]
    OutputPath(PathBuf),
    #[error("{0} bytes do not fit in this machine's address space")]
    TooLarge(u64),
    #[error("could not {op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("could not start {0} worker threads")]
    Threads(usize),
}

impl DeltaError {
    /// For `map_err`: an I/O failure to `op` the file at `path`.
    pub(crate) fn io<'a>(
        op: &'static str,
        path: &'a Path,
    ) -> impl FnOnce(std::io::Error) -> Self + 'a {
        move |source| DeltaError::Io { op, path: path.to_owned(), source }
    }
}

/// A failed output file is this module's own error, so its message reads like
/// the rest: `OutputPath`, or `Io` naming the same operation and path.
impl From<atomic::Error> for DeltaError {
    fn from(e: atomic::Error) -> Self {
        match e {
            atomic::Error::NoFileName(path) => DeltaError::OutputPath(path),
            atomic::Error::Io { op, path, source } => DeltaError::Io { op, path, source },
        }
    }
}

/// Text from a file as an error message quotes it: control characters and
/// quotes escaped, cut after `max` characters, so that a name in an untrusted
/// file can neither forge a log line nor flood one.
fn escaped(text: &str, max: usize) -> String {
    let mut out: String = text.chars().take(max).flat_map(char::escape_debug).collect();
    if text.chars().nth(max).is_some() {
        out.push_str("...");
    }
    out
}

/// A tensor name, quoted for an error message.
pub(crate) fn quoted(name: &str) -> String {
    format!("'{}'", escaped(name, 80))
}

/// A parser's complaint about untrusted bytes, made safe to repeat.
pub(crate) fn plain(message: &str) -> String {
    escaped(message, 160)
}

/// A length from a file as an in-memory size.
pub(crate) fn usize_of(n: u64) -> Result<usize, DeltaError> {
    usize::try_from(n).map_err(|_| DeltaError::TooLarge(n))
}

/// Below this, splitting a hash across threads costs more than it saves
/// (blake3's own guidance for `update_rayon`).
const PARALLEL_HASH_MIN: usize = 128 * 1024;

/// Feeds `data` to `hasher`, on every worker of the current pool when it is
/// large enough to split.
pub(crate) fn update(hasher: &mut blake3::Hasher, data: &[u8]) {
    if data.len() >= PARALLEL_HASH_MIN {
        hasher.update_rayon(data);
    } else {
        hasher.update(data);
    }
}

/// The BLAKE3 hash of `data`.
pub(crate) fn hash(data: &[u8]) -> Hash {
    let mut hasher = blake3::Hasher::new();
    update(&mut hasher, data);
    *hasher.finalize().as_bytes()
}

/// The shared pool of `threads` workers (`None` or 0: every core, or
/// `RAYON_NUM_THREADS`), or why it could not start. With one thread the pool
/// has one worker: rayon's parallel iterators would otherwise fall back to
/// the global pool of every core.
pub(crate) fn pool(threads: Option<usize>) -> Result<Arc<rayon::ThreadPool>, DeltaError> {
    let n = threads.unwrap_or(0);
    crate::pool::pool(n).map_err(|_| DeltaError::Threads(n))
}

/// Consecutive runs of tensors, by their byte lengths, each at most
/// [`WINDOW_BYTES`] long or a single larger tensor: the unit read and coded
/// in parallel, then hashed and written in order.
pub(crate) fn windows(lengths: &[u64]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0u64);
    for (i, &len) in lengths.iter().enumerate() {
        if i > start && bytes.saturating_add(len) > WINDOW_BYTES {
            out.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes = bytes.saturating_add(len);
    }
    if start < lengths.len() {
        out.push(start..lengths.len());
    }
    out
}

/// Runs `compute` on each window in turn, in parallel with `finish` on the
/// window before it, so that the ordered, mostly serial part (whole-file
/// hashes, writing) overlaps the parallel part; at most two windows are in
/// memory. `finish` returns whether to go on.
pub(crate) fn pipelined<T: Send>(
    windows: Vec<Range<usize>>,
    compute: impl Fn(Range<usize>) -> T + Sync,
    mut finish: impl FnMut(Range<usize>, T) -> Result<bool, DeltaError> + Send,
) -> Result<(), DeltaError> {
    let mut pending: Option<(Range<usize>, T)> = None;
    let mut windows = windows.into_iter();
    loop {
        let window = windows.next();
        let (computed, go_on) = rayon::join(
            || window.clone().map(&compute),
            || match pending.take() {
                Some((w, done)) => finish(w, done),
                None => Ok(true),
            },
        );
        if !go_on? {
            return Ok(());
        }
        match window.zip(computed) {
            Some(next) => pending = Some(next),
            None => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
