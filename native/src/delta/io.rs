//! Inputs read by positioned reads of byte ranges, so that the tensors of one
//! window can be read by several threads at once without a shared cursor.
//! (Outputs are written through [`crate::atomic::TempFile`].)

use std::fs::{self, File};
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::{usize_of, DeltaError};

/// A regular file open for reading, with the size it had when opened.
pub(crate) struct Input {
    pub path: PathBuf,
    pub file: File,
    pub size: u64,
}

impl Input {
    /// Opens `path`, refusing what is not a regular file (checked before
    /// opening: opening a FIFO would block).
    pub fn open(path: &Path) -> Result<Self, DeltaError> {
        let meta = fs::metadata(path).map_err(DeltaError::io("read", path))?;
        if !meta.is_file() {
            return Err(DeltaError::NotAFile(path.to_owned()));
        }
        let file = File::open(path).map_err(DeltaError::io("open", path))?;
        Ok(Input { path: path.to_owned(), file, size: meta.len() })
    }

    /// `len` bytes from `offset`. Callers check ranges against `size` first,
    /// so a short read means the file shrank since it was opened.
    pub fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, DeltaError> {
        let mut buf = vec![0u8; usize_of(len)?];
        self.read_into(offset, &mut buf)?;
        Ok(buf)
    }

    pub fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeltaError> {
        self.file.read_exact_at(buf, offset).map_err(|e| match e.kind() {
            ErrorKind::UnexpectedEof => DeltaError::Shrunk(self.path.clone()),
            _ => DeltaError::io("read", &self.path)(e),
        })
    }
}
