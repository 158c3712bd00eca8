//! Bindings for `swarmrl.shards`. Hashes cross as raw 32-byte strings, a list
//! of them as one concatenated `bytes`; the GIL is released for all the work.
//! Bad content is a `ValueError`, a missing shard a `FileNotFoundError`, other
//! I/O failures an `OSError`.

use std::io::ErrorKind;
use std::path::PathBuf;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{
    PyFileNotFoundError, PyOSError, PyPermissionError, PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyBytes;

use crate::shards::{self, Expected, Hash, Layout, ShardError};

fn to_py(e: ShardError) -> PyErr {
    let msg = e.to_string();
    match e {
        ShardError::MissingShard { .. } => PyFileNotFoundError::new_err(msg),
        ShardError::Io { source, .. } => match source.kind() {
            ErrorKind::NotFound => PyFileNotFoundError::new_err(msg),
            ErrorKind::PermissionDenied => PyPermissionError::new_err(msg),
            _ => PyOSError::new_err(msg),
        },
        ShardError::Threads(_) => PyRuntimeError::new_err(msg),
        _ => PyValueError::new_err(msg),
    }
}

fn hash(bytes: &[u8]) -> PyResult<Hash> {
    bytes
        .try_into()
        .map_err(|_| PyValueError::new_err(format!("a hash is 32 bytes, got {}", bytes.len())))
}

fn hashes(blob: &[u8]) -> PyResult<Vec<Hash>> {
    if blob.len() % 32 != 0 {
        return Err(PyValueError::new_err(format!(
            "concatenated hashes must be a multiple of 32 bytes, got {}",
            blob.len()
        )));
    }
    blob.chunks_exact(32).map(hash).collect()
}

fn concat<'py>(py: Python<'py>, hashes: &[Hash]) -> Bound<'py, PyBytes> {
    PyBytes::new(py, hashes.as_flattened())
}

#[pyfunction]
fn shards_file_name(index: u64) -> String {
    shards::shard_file_name(index)
}

#[pyfunction]
#[pyo3(signature = (data, threads=None))]
fn shards_hash<'py>(
    py: Python<'py>,
    data: PyBackedBytes,
    threads: Option<usize>,
) -> PyResult<Bound<'py, PyBytes>> {
    let h = py.detach(|| shards::hash_shard(&data, threads)).map_err(to_py)?;
    Ok(PyBytes::new(py, &h))
}

#[pyfunction]
#[pyo3(signature = (path, shard_size, threads=None))]
fn shards_hash_file<'py>(
    py: Python<'py>,
    path: PathBuf,
    shard_size: u64,
    threads: Option<usize>,
) -> PyResult<(Bound<'py, PyBytes>, u64)> {
    let (hashes, size) =
        py.detach(|| shards::hash_file(&path, shard_size, threads)).map_err(to_py)?;
    Ok((concat(py, &hashes), size))
}

#[pyfunction]
fn shards_merkle_root<'py>(py: Python<'py>, hashes_blob: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
    let hs = hashes(hashes_blob)?;
    let root = py.detach(|| shards::merkle_root(&hs)).map_err(to_py)?;
    Ok(PyBytes::new(py, &root))
}

#[pyfunction]
fn shards_inclusion_proof<'py>(
    py: Python<'py>,
    hashes_blob: &[u8],
    index: u64,
) -> PyResult<Bound<'py, PyBytes>> {
    let hs = hashes(hashes_blob)?;
    let proof = py.detach(|| shards::inclusion_proof(&hs, index)).map_err(to_py)?;
    Ok(concat(py, &proof))
}

#[pyfunction]
fn shards_verify_inclusion(
    root: &[u8],
    count: u64,
    index: u64,
    shard_hash: &[u8],
    proof: &[u8],
) -> PyResult<()> {
    shards::verify_inclusion(&hash(root)?, count, index, &hash(shard_hash)?, &hashes(proof)?)
        .map_err(to_py)
}

/// A manifest as the core checks shards against it: layout, every shard hash
/// and the root, checked against each other once when the manifest is read,
/// then lent to every call on that manifest.
#[pyclass(frozen, module = "swarmrl.shards")]
pub struct ShardPlan(Expected);

#[pymethods]
impl ShardPlan {
    #[new]
    fn new(file_size: u64, shard_size: u64, hashes_blob: &[u8], root: &[u8]) -> PyResult<Self> {
        let layout = Layout::new(file_size, shard_size).map_err(to_py)?;
        Ok(ShardPlan(Expected::new(layout, hashes(hashes_blob)?, hash(root)?).map_err(to_py)?))
    }
}

/// Any contiguous byte buffer (bytes, bytearray, memoryview, mmap) read in place:
/// a shard arriving from the network is checked where it landed, not copied first
/// (a fresh 64 MiB copy costs more than hashing it). The export keeps the memory
/// alive; the caller must not write to it during the call.
struct Borrowed(PyBuffer<u8>);

impl Borrowed {
    fn new(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        let buf = PyBuffer::<u8>::get(obj)?;
        if !buf.is_c_contiguous() {
            return Err(PyValueError::new_err("shard data must be a contiguous buffer"));
        }
        Ok(Self(buf))
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: a C-contiguous buffer of u8 of len_bytes() bytes at buf_ptr(), kept
        // exported (so neither freed nor resized) for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.0.buf_ptr() as *const u8, self.0.len_bytes()) }
    }
}

#[pyfunction]
#[pyo3(signature = (data, plan, index, threads=None))]
fn shards_verify(
    py: Python<'_>,
    data: &Bound<'_, PyAny>,
    plan: &Bound<'_, ShardPlan>,
    index: u64,
    threads: Option<usize>,
) -> PyResult<()> {
    let exp = &plan.get().0;
    let h = exp.hash(index).map_err(to_py)?;
    let data = Borrowed::new(data)?;
    let bytes = data.as_slice();
    py.detach(|| shards::verify_shard(exp.layout(), index, bytes, h, threads)).map_err(to_py)
}

#[pyfunction]
#[pyo3(signature = (dir, data, plan, index, threads=None))]
fn shards_store(
    py: Python<'_>,
    dir: PathBuf,
    data: PyBackedBytes,
    plan: &Bound<'_, ShardPlan>,
    index: u64,
    threads: Option<usize>,
) -> PyResult<PathBuf> {
    let exp = &plan.get().0;
    let h = exp.hash(index).map_err(to_py)?;
    py.detach(|| shards::store_shard(&dir, exp.layout(), index, &data, h, threads)).map_err(to_py)
}

#[pyfunction]
#[pyo3(signature = (path, out_dir, plan, threads=None))]
fn shards_split(
    py: Python<'_>,
    path: PathBuf,
    out_dir: PathBuf,
    plan: &Bound<'_, ShardPlan>,
    threads: Option<usize>,
) -> PyResult<()> {
    let exp = &plan.get().0;
    py.detach(|| shards::split(&path, &out_dir, exp, threads)).map_err(to_py)
}

#[pyfunction]
#[pyo3(signature = (dir, plan, threads=None))]
fn shards_missing(
    py: Python<'_>,
    dir: PathBuf,
    plan: &Bound<'_, ShardPlan>,
    threads: Option<usize>,
) -> PyResult<Vec<u64>> {
    let exp = &plan.get().0;
    py.detach(|| shards::missing_shards(&dir, exp, threads)).map_err(to_py)
}

#[pyfunction]
#[pyo3(signature = (dir, out, plan, threads=None))]
fn shards_reassemble(
    py: Python<'_>,
    dir: PathBuf,
    out: PathBuf,
    plan: &Bound<'_, ShardPlan>,
    threads: Option<usize>,
) -> PyResult<()> {
    let exp = &plan.get().0;
    py.detach(|| shards::reassemble(&dir, exp, &out, threads)).map_err(to_py)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ShardPlan>()?;
    m.add_function(wrap_pyfunction!(shards_file_name, m)?)?;
    m.add_function(wrap_pyfunction!(shards_hash, m)?)?;
    m.add_function(wrap_pyfunction!(shards_hash_file, m)?)?;
    m.add_function(wrap_pyfunction!(shards_merkle_root, m)?)?;
    m.add_function(wrap_pyfunction!(shards_inclusion_proof, m)?)?;
    m.add_function(wrap_pyfunction!(shards_verify_inclusion, m)?)?;
    m.add_function(wrap_pyfunction!(shards_verify, m)?)?;
    m.add_function(wrap_pyfunction!(shards_store, m)?)?;
    m.add_function(wrap_pyfunction!(shards_split, m)?)?;
    m.add_function(wrap_pyfunction!(shards_missing, m)?)?;
    m.add_function(wrap_pyfunction!(shards_reassemble, m)?)?;
    m.add("SHARDS_MAX_SHARD_SIZE", shards::MAX_SHARD_SIZE)?;
    Ok(())
}
