//! Whole-file operations: hashing a checkpoint, splitting it into shard files,
//! keeping a store of verified shards, and reassembling the checkpoint.
//!
//! A shard store is a directory holding shard `i` as [`shard_file_name`]`(i)`.
//! Every file lands under its final name by an atomic rename after it was
//! verified and synced, so after a crash the store holds complete shards only
//! (plus, at worst, hidden `.tmp` files from the interrupted write).

use std::fs;
use std::path::{Path, PathBuf};

use super::hash::verify_shard;
use super::merkle::merkle_root;
use super::stream::{shard_stream, Segment, ShardSink};
use super::{check_shard_size, Expected, Hash, Layout, ShardError};
use crate::atomic::{sync_dir, TempFile};

/// The name of shard `index`'s file in a shard store.
pub fn shard_file_name(index: u64) -> String {
    format!("{index:06}.shard")
}

/// Hashes the file at `path` shard by shard, streaming. Returns the shard
/// hashes and the file size.
pub fn hash_file(
    path: &Path,
    shard_size: u64,
    threads: Option<usize>,
) -> Result<(Vec<Hash>, u64), ShardError> {
    check_shard_size(shard_size)?;
    let meta = fs::metadata(path).map_err(ShardError::io("read", path))?;
    if !meta.is_file() {
        return Err(ShardError::NotAFile(path.to_owned()));
    }
    if meta.len() == 0 {
        return Err(ShardError::EmptyFile(path.to_owned()));
    }
    let layout = Layout::new(meta.len(), shard_size)?;
    let mut hashes = Collect(Vec::new());
    shard_stream(&[Segment::file(path.to_owned(), meta.len())], layout, threads, &mut hashes)?;
    Ok((hashes.0, meta.len()))
}

struct Collect(Vec<Hash>);

impl ShardSink for Collect {
    fn shard(&mut self, _index: u64, hash: Hash) -> Result<(), ShardError> {
        self.0.push(hash);
        Ok(())
    }
}

/// Writes the file at `path` into `out_dir` as one file per shard, checking
/// each shard against `expected` before it gets its name. On error the shards
/// already written stay: each of them is complete and verified.
pub fn split(
    path: &Path,
    out_dir: &Path,
    expected: &Expected,
    threads: Option<usize>,
) -> Result<(), ShardError> {
    let layout = expected.layout();
    let source = Segment::file(path.to_owned(), layout.file_size());
    let mut sink = SplitSink { out_dir, expected, current: None };
    shard_stream(&[source], layout, threads, &mut sink)?;
    // Each shard was renamed into place without syncing the directory; one
    // sync here makes them all durable.
    Ok(sync_dir(out_dir)?)
}

struct SplitSink<'a> {
    out_dir: &'a Path,
    expected: &'a Expected,
    current: Option<TempFile>,
}

impl ShardSink for SplitSink<'_> {
    fn piece(&mut self, index: u64, bytes: &[u8]) -> Result<(), ShardError> {
        let file = match &mut self.current {
            Some(file) => file,
            None => {
                let dest = self.out_dir.join(shard_file_name(index));
                self.current.insert(TempFile::create(&dest)?)
            }
        };
        Ok(file.write(bytes)?)
    }

    fn shard(&mut self, index: u64, hash: Hash) -> Result<(), ShardError> {
        if hash != *self.expected.hash(index)? {
            return Err(ShardError::ShardHash { index });
        }
        if let Some(file) = self.current.take() {
            file.commit_deferring_dir_sync()?;
        }
        Ok(())
    }
}

/// Verifies `data` as shard `index` and stores it in `dir`, replacing any
/// file already there. Returns the shard file's path.
pub fn store_shard(
    dir: &Path,
    layout: Layout,
    index: u64,
    data: &[u8],
    expected: &Hash,
    threads: Option<usize>,
) -> Result<PathBuf, ShardError> {
    verify_shard(layout, index, data, expected, threads)?;
    let dest = dir.join(shard_file_name(index));
    let mut file = TempFile::create(&dest)?;
    file.write(data)?;
    file.commit()?;
    Ok(dest)
}

/// The indices of the shards that `dir` does not hold intact: missing, the
/// wrong length, or not matching their hash. A node resuming a download
/// fetches exactly these.
pub fn missing_shards(
    dir: &Path,
    expected: &Expected,
    threads: Option<usize>,
) -> Result<Vec<u64>, ShardError> {
    let layout = expected.layout();
    let mut missing = Vec::new();
    for index in 0..layout.count() {
        let (_, len) = layout.range(index)?;
        let segment = Segment::shard(dir.join(shard_file_name(index)), len, index);
        let want = expected.hash(index)?;
        let mut hash = Collect(Vec::new());
        match shard_stream(&[segment], layout, threads, &mut hash) {
            Ok(()) if hash.0 == [*want] => {}
            Ok(()) | Err(ShardError::MissingShard { .. }) | Err(ShardError::ShardLength { .. }) => {
                missing.push(index)
            }
            Err(e) => return Err(e),
        }
    }
    Ok(missing)
}

/// Rebuilds the checkpoint from the shard store `dir` at `out`, replacing any
/// file there. Every shard is re-hashed as it is copied and the Merkle root
/// of what was written is checked before the file gets its name; on any
/// mismatch `out` is left as it was and the error names the bad shard.
pub fn reassemble(
    dir: &Path,
    expected: &Expected,
    out: &Path,
    threads: Option<usize>,
) -> Result<(), ShardError> {
    let layout = expected.layout();
    let segments = (0..layout.count())
        .map(|index| {
            let (_, len) = layout.range(index)?;
            Ok(Segment::shard(dir.join(shard_file_name(index)), len, index))
        })
        .collect::<Result<Vec<_>, ShardError>>()?;
    // Fail before writing anything if a shard is missing or the wrong size.
    segments.iter().try_for_each(Segment::check)?;

    let mut sink = ReassembleSink { expected, out: TempFile::create(out)?, hashes: Vec::new() };
    shard_stream(&segments, layout, threads, &mut sink)?;
    if merkle_root(&sink.hashes)? != *expected.root() {
        return Err(ShardError::Root);
    }
    Ok(sink.out.commit()?)
}

struct ReassembleSink<'a> {
    expected: &'a Expected,
    out: TempFile,
    hashes: Vec<Hash>,
}

impl ShardSink for ReassembleSink<'_> {
    fn piece(&mut self, _index: u64, bytes: &[u8]) -> Result<(), ShardError> {
        Ok(self.out.write(bytes)?)
    }

    fn shard(&mut self, index: u64, hash: Hash) -> Result<(), ShardError> {
        if hash != *self.expected.hash(index)? {
            return Err(ShardError::ShardHash { index });
        }
        self.hashes.push(hash);
        Ok(())
    }
}
