//! The read pipeline behind every file operation.
//!
//! The input is a list of files read back to back (the whole checkpoint, or
//! its shard files in order), in blocks through two buffers: the next block is
//! read while the current one is hashed (and perhaps written), so memory is
//! `2 * BLOCK` bytes whatever the file or shard size. Reading and hashing are
//! joined on the same worker pool rather than given a reader thread of their
//! own: the pool then spends every core on whichever has work, where an extra
//! thread would compete with the hashers. With one thread they simply take
//! turns. A [`Sharder`] cuts the byte stream into shards and hashes them.

use std::fs::{self, File};
use std::io::{ErrorKind, Read};
use std::path::PathBuf;

use super::hash::Workers;
use super::{Hash, Layout, ShardError};

/// Large enough that per-block overheads vanish and `update_rayon` has work to
/// split, small enough that a block is still in cache when it is hashed.
const BLOCK: usize = 4 << 20;

/// One input file of known length. The length is checked when the file is
/// opened and again at its end, so a file of the wrong size, or one that
/// changes while it is read, is an error rather than a wrong hash.
pub(crate) struct Segment {
    path: PathBuf,
    len: u64,
    /// Set when the file is one shard; errors then name the shard.
    shard: Option<u64>,
}

impl Segment {
    pub(crate) fn file(path: PathBuf, len: u64) -> Self {
        Segment { path, len, shard: None }
    }

    pub(crate) fn shard(path: PathBuf, len: u64, index: u64) -> Self {
        Segment { path, len, shard: Some(index) }
    }

    fn wrong_len(&self, got: u64) -> ShardError {
        match self.shard {
            Some(index) => ShardError::ShardLength { index, got, expected: self.len },
            None => ShardError::FileSize { path: self.path.clone(), got, expected: self.len },
        }
    }

    /// Checks that the file exists, is a regular file and has the expected
    /// length, without opening it (opening a FIFO would block).
    pub(crate) fn check(&self) -> Result<(), ShardError> {
        let meta = fs::metadata(&self.path).map_err(|e| match (e.kind(), self.shard) {
            (ErrorKind::NotFound, Some(index)) => {
                ShardError::MissingShard { index, path: self.path.clone() }
            }
            _ => ShardError::io("read", &self.path)(e),
        })?;
        if !meta.is_file() {
            return Err(ShardError::NotAFile(self.path.clone()));
        }
        if meta.len() != self.len {
            return Err(self.wrong_len(meta.len()));
        }
        Ok(())
    }
}

/// Reads the segments back to back, a block at a time.
struct Reader<'a> {
    segments: std::slice::Iter<'a, Segment>,
    /// The segment being read, its open file, and how many bytes are left in it.
    current: Option<(&'a Segment, File, u64)>,
    /// The offset in the whole stream.
    pos: u64,
    shard_size: u64,
}

impl Reader<'_> {
    /// Fills the front of `buf` with the next block and returns its length; 0
    /// means the stream is over. Blocks never span two segments.
    fn fill(&mut self, buf: &mut [u8]) -> Result<usize, ShardError> {
        loop {
            if let Some((segment, file, left)) = &mut self.current {
                if *left > 0 {
                    let len = block_len(self.pos, *left, self.shard_size);
                    read_block(segment, file, &mut buf[..len])?;
                    *left -= len as u64;
                    self.pos += len as u64;
                    return Ok(len);
                }
                expect_end(segment, file)?;
                self.current = None;
            }
            let Some(segment) = self.segments.next() else { return Ok(0) };
            segment.check()?;
            let file = File::open(&segment.path).map_err(ShardError::io("open", &segment.path))?;
            self.current = Some((segment, file, segment.len));
        }
    }
}

fn actual_len(file: &File) -> u64 {
    file.metadata().map(|m| m.len()).unwrap_or(0)
}

fn read_block(segment: &Segment, file: &mut File, buf: &mut [u8]) -> Result<(), ShardError> {
    file.read_exact(buf).map_err(|e| match e.kind() {
        ErrorKind::UnexpectedEof => segment.wrong_len(actual_len(file)),
        _ => ShardError::io("read", &segment.path)(e),
    })
}

/// The file must end where its length said; if it grew, it is not the file
/// that was measured.
fn expect_end(segment: &Segment, file: &mut File) -> Result<(), ShardError> {
    match file.read(&mut [0]) {
        Ok(0) => Ok(()),
        Ok(_) => Err(segment.wrong_len(actual_len(file))),
        Err(e) => Err(ShardError::io("read", &segment.path)(e)),
    }
}

/// Streams the segments back to back through `consume`, reading each block
/// while the previous one is consumed.
fn stream(
    segments: &[Segment],
    shard_size: u64,
    workers: &Workers,
    mut consume: impl FnMut(&[u8]) -> Result<(), ShardError> + Send,
) -> Result<(), ShardError> {
    let mut reader = Reader { segments: segments.iter(), current: None, pos: 0, shard_size };
    let (mut block, mut next) = (vec![0; BLOCK], vec![0; BLOCK]);
    let mut len = reader.fill(&mut block)?;
    while len > 0 {
        let (read, consumed) = workers.join(|| reader.fill(&mut next), || consume(&block[..len]));
        consumed?;
        len = read?;
        std::mem::swap(&mut block, &mut next);
    }
    Ok(())
}

/// The next block's length at stream offset `pos`. Shards at least a block
/// long are cut at their boundaries, so each shard's hasher is fed
/// block-aligned input that `update_rayon` splits evenly; smaller shards are
/// packed several to a block.
fn block_len(pos: u64, left_in_segment: u64, shard_size: u64) -> usize {
    let mut len = left_in_segment.min(BLOCK as u64);
    if shard_size >= BLOCK as u64 {
        len = len.min(shard_size - pos % shard_size);
    }
    len as usize
}

/// What to do with the shards as they stream by.
pub(crate) trait ShardSink: Send {
    /// The next bytes of shard `index`, in order.
    fn piece(&mut self, _index: u64, _bytes: &[u8]) -> Result<(), ShardError> {
        Ok(())
    }

    /// Shard `index` is complete and hashes to `hash`.
    fn shard(&mut self, index: u64, hash: Hash) -> Result<(), ShardError>;
}

/// Cuts a byte stream into shards of `shard_size` and hashes each.
struct Sharder<'w> {
    shard_size: u64,
    workers: &'w Workers,
    hasher: blake3::Hasher,
    index: u64,
    filled: u64,
}

impl Sharder<'_> {
    fn feed(&mut self, mut data: &[u8], sink: &mut impl ShardSink) -> Result<(), ShardError> {
        while !data.is_empty() {
            let room = self.shard_size - self.filled;
            let (piece, rest) = data.split_at(room.min(data.len() as u64) as usize);
            self.workers.update(&mut self.hasher, piece);
            sink.piece(self.index, piece)?;
            self.filled += piece.len() as u64;
            data = rest;
            if self.filled == self.shard_size {
                self.close(sink)?;
            }
        }
        Ok(())
    }

    fn close(&mut self, sink: &mut impl ShardSink) -> Result<(), ShardError> {
        let hash = *self.hasher.finalize().as_bytes();
        self.hasher.reset();
        self.filled = 0;
        self.index += 1;
        sink.shard(self.index - 1, hash)
    }
}

/// Streams `segments`, which together hold a file cut as `layout`, through
/// `sink` shard by shard.
pub(crate) fn shard_stream(
    segments: &[Segment],
    layout: Layout,
    threads: Option<usize>,
    sink: &mut impl ShardSink,
) -> Result<(), ShardError> {
    let workers = Workers::new(threads)?;
    let mut sharder = Sharder {
        shard_size: layout.shard_size(),
        workers: &workers,
        hasher: blake3::Hasher::new(),
        index: 0,
        filled: 0,
    };
    workers.install(|| {
        stream(segments, layout.shard_size(), &workers, |block| sharder.feed(block, sink))
    })?;
    // The segments' lengths were checked to add up to the file size, so only
    // a short last shard can still be open.
    if sharder.filled > 0 {
        sharder.close(sink)?;
    }
    Ok(())
}
