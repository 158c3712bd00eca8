//! Whole-file operations: hashing a checkpoint, splitting it into shard files,
//! keeping a store of verified shards, and reassembling the checkpoint.
//!
//! A shard store is a directory holding shard `i` as [`shard_file_name`]`(i)`.
//! Every file lands under its final name by an atomic rename after it was
//! verified and synced, so after a crash the store holds complete shards only
//! (plus, at worst, hidden `.tmp` files from the interrupted write).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::hash::verify_shard;
use super::merkle::merkle_root;
use super::stream::{shard_stream, Segment, ShardSink};
use super::{check_shard_size, Expected, Hash, Layout, ShardError};

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
    sync_dir(out_dir)
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
        file.write(bytes)
    }

    fn shard(&mut self, index: u64, hash: Hash) -> Result<(), ShardError> {
        if hash != *self.expected.hash(index)? {
            return Err(ShardError::ShardHash { index });
        }
        match self.current.take() {
            Some(file) => file.commit(),
            None => Ok(()),
        }
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
    sync_dir(dir)?;
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
    sink.out.commit()?;
    sync_dir(parent(out))
}

struct ReassembleSink<'a> {
    expected: &'a Expected,
    out: TempFile,
    hashes: Vec<Hash>,
}

impl ShardSink for ReassembleSink<'_> {
    fn piece(&mut self, _index: u64, bytes: &[u8]) -> Result<(), ShardError> {
        self.out.write(bytes)
    }

    fn shard(&mut self, index: u64, hash: Hash) -> Result<(), ShardError> {
        if hash != *self.expected.hash(index)? {
            return Err(ShardError::ShardHash { index });
        }
        self.hashes.push(hash);
        Ok(())
    }
}

/// The directory holding `path`; `.` for a bare file name.
fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Makes renames into `dir` durable.
fn sync_dir(dir: &Path) -> Result<(), ShardError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(ShardError::io("sync", dir))
}

/// A file being written under a hidden temporary name next to its
/// destination. Dropped without [`TempFile::commit`], it is deleted.
struct TempFile {
    file: File,
    path: PathBuf,
    dest: PathBuf,
    committed: bool,
}

impl TempFile {
    fn create(dest: &Path) -> Result<Self, ShardError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let name = dest.file_name().ok_or_else(|| ShardError::OutputPath(dest.to_owned()))?;
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{}-{n}.tmp", std::process::id()));
        let path = parent(dest).join(tmp_name);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(ShardError::io("create", &path))?;
        Ok(TempFile { file, path, dest: dest.to_owned(), committed: false })
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), ShardError> {
        self.file.write_all(bytes).map_err(ShardError::io("write", &self.path))
    }

    /// Syncs the file and renames it to its destination.
    fn commit(mut self) -> Result<(), ShardError> {
        self.file.sync_all().map_err(ShardError::io("sync", &self.path))?;
        fs::rename(&self.path, &self.dest).map_err(ShardError::io("rename into", &self.dest))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_file(&self.path);
        }
    }
}
