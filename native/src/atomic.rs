//! Output files that appear whole or not at all.
//!
//! A [`TempFile`] is written under a hidden temporary name next to its
//! destination and renamed over it only once complete and synced, so a crash
//! or an error leaves either the old file or the new one, never a mix (plus,
//! after a crash, at worst a hidden `.tmp` file). Shard stores and weight
//! deltas both write this way; each maps [`Error`] to its own error type, so
//! the messages stay theirs.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Why writing an output failed, with what the callers' messages name.
#[derive(Debug)]
pub(crate) enum Error {
    /// The destination names no file (`/`, `..`): there is nothing to rename to.
    NoFileName(PathBuf),
    /// Could not `op` the file at `path`.
    Io { op: &'static str, path: PathBuf, source: io::Error },
}

impl Error {
    /// For `map_err`: an I/O failure to `op` the file at `path`.
    fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> Self + 'a {
        move |source| Error::Io { op, path: path.to_owned(), source }
    }
}

/// The directory holding `path`; `.` for a bare file name.
fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Makes the renames already done into `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), Error> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(Error::io("sync", dir))
}

/// A file being written under a hidden temporary name next to its
/// destination. Dropped without being committed, it is deleted.
pub(crate) struct TempFile {
    file: File,
    path: PathBuf,
    dest: PathBuf,
    committed: bool,
}

impl TempFile {
    pub fn create(dest: &Path) -> Result<Self, Error> {
        // Process id and counter keep concurrent writers of one destination,
        // in this process or another, off each other's temporary file.
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let name = dest.file_name().ok_or_else(|| Error::NoFileName(dest.to_owned()))?;
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut tmp_name = OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{}-{n}.tmp", std::process::id()));
        let path = parent(dest).join(tmp_name);
        // Readable too, so that a scratch file can be copied into another
        // output (`TempFile::append`); create_new so that nothing already
        // there, a link included, is ever written through.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(Error::io("create", &path))?;
        Ok(TempFile { file, path, dest: dest.to_owned(), committed: false })
    }

    pub fn write(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.file.write_all(bytes).map_err(Error::io("write", &self.path))
    }

    /// Appends everything written to `scratch` so far, for an output whose
    /// beginning is known only after the rest was produced.
    pub fn append(&mut self, scratch: &mut TempFile) -> Result<(), Error> {
        scratch.file.seek(SeekFrom::Start(0)).map_err(Error::io("read", &scratch.path))?;
        io::copy(&mut scratch.file, &mut self.file).map_err(Error::io("write", &self.path))?;
        Ok(())
    }

    /// Syncs the file, renames it to its destination and makes the rename
    /// durable.
    pub fn commit(mut self) -> Result<(), Error> {
        self.rename()?;
        sync_dir(parent(&self.dest))
    }

    /// Syncs the file and renames it to its destination, leaving the
    /// directory's sync to the caller: one [`sync_dir`] after placing many
    /// files costs one sync instead of one per file.
    pub fn commit_deferring_dir_sync(mut self) -> Result<(), Error> {
        self.rename()
    }

    fn rename(&mut self) -> Result<(), Error> {
        self.file.sync_all().map_err(Error::io("sync", &self.path))?;
        fs::rename(&self.path, &self.dest).map_err(Error::io("rename into", &self.dest))?;
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
