//! Bindings for `swarmrl.delta`. Paths in, plain values out; the GIL is
//! released for all the work. A malformed delta, a file that is not the
//! delta's base or two files that cannot be a delta of each other are a
//! `ValueError`, a missing file a `FileNotFoundError`, other I/O failures an
//! `OSError`.

use std::io::ErrorKind;
use std::path::PathBuf;

use pyo3::exceptions::{
    PyFileNotFoundError, PyOSError, PyPermissionError, PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::delta::{self, DeltaError, Info, Stats};

fn to_py(e: DeltaError) -> PyErr {
    let msg = e.to_string();
    match e {
        DeltaError::Io { source, .. } => match source.kind() {
            ErrorKind::NotFound => PyFileNotFoundError::new_err(msg),
            ErrorKind::PermissionDenied => PyPermissionError::new_err(msg),
            _ => PyOSError::new_err(msg),
        },
        DeltaError::Threads(_) => PyRuntimeError::new_err(msg),
        _ => PyValueError::new_err(msg),
    }
}

/// What `encode` did: sizes, how each tensor was encoded, how many elements
/// changed, and how long it took.
#[pyclass(frozen, get_all, module = "swarmrl.delta")]
pub struct DeltaStats {
    target_bytes: u64,
    delta_bytes: u64,
    tensors: u64,
    xor_tensors: u64,
    sparse_tensors: u64,
    changed_elements: u64,
    total_elements: u64,
    seconds: f64,
}

#[pymethods]
impl DeltaStats {
    fn __repr__(&self) -> String {
        format!(
            "DeltaStats(target_bytes={}, delta_bytes={}, tensors={}, xor_tensors={}, \
             sparse_tensors={}, changed_elements={}, total_elements={}, seconds={})",
            self.target_bytes,
            self.delta_bytes,
            self.tensors,
            self.xor_tensors,
            self.sparse_tensors,
            self.changed_elements,
            self.total_elements,
            self.seconds
        )
    }
}

impl From<Stats> for DeltaStats {
    fn from(s: Stats) -> Self {
        DeltaStats {
            target_bytes: s.target_bytes,
            delta_bytes: s.delta_bytes,
            tensors: s.tensors,
            xor_tensors: s.xor_tensors,
            sparse_tensors: s.sparse_tensors,
            changed_elements: s.changed_elements,
            total_elements: s.total_elements,
            seconds: s.seconds,
        }
    }
}

/// One tensor's record in a delta.
#[pyclass(frozen, get_all, module = "swarmrl.delta")]
pub struct DeltaTensor {
    name: String,
    encoding: &'static str,
    element_size: u64,
    length: u64,
    offset: u64,
    compressed: u64,
    blake3: String,
}

#[pymethods]
impl DeltaTensor {
    fn __repr__(&self) -> String {
        format!(
            "DeltaTensor(name={:?}, encoding={:?}, length={}, compressed={}, blake3={:?})",
            self.name, self.encoding, self.length, self.compressed, self.blake3
        )
    }
}

/// What a delta holds, read from its header without a base.
#[pyclass(frozen, get_all, module = "swarmrl.delta")]
pub struct DeltaInfo {
    base_blake3: String,
    target_blake3: String,
    target_size: u64,
    delta_size: u64,
    tensors: Py<PyTuple>,
}

#[pymethods]
impl DeltaInfo {
    #[getter]
    fn tensor_count(&self, py: Python<'_>) -> usize {
        self.tensors.bind(py).len()
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "DeltaInfo(base_blake3={:?}, target_blake3={:?}, target_size={}, delta_size={}, \
             tensors=<{} tensors>)",
            self.base_blake3,
            self.target_blake3,
            self.target_size,
            self.delta_size,
            self.tensor_count(py)
        )
    }
}

fn info_to_py(py: Python<'_>, info: Info) -> PyResult<DeltaInfo> {
    let tensors = info
        .tensors
        .iter()
        .map(|r| {
            Py::new(
                py,
                DeltaTensor {
                    name: r.name.clone(),
                    encoding: r.encoding.as_str(),
                    element_size: r.element_size,
                    length: r.length,
                    offset: r.offset,
                    compressed: r.compressed,
                    blake3: r.blake3_hex(),
                },
            )
        })
        .collect::<PyResult<Vec<_>>>()?;
    Ok(DeltaInfo {
        base_blake3: info.base_hex(),
        target_blake3: info.target_hex(),
        target_size: info.target_size,
        delta_size: info.delta_size,
        tensors: PyTuple::new(py, tensors)?.unbind(),
    })
}

#[pyfunction]
#[pyo3(signature = (base, target, out, level=3, threads=None))]
fn delta_encode(
    py: Python<'_>,
    base: PathBuf,
    target: PathBuf,
    out: PathBuf,
    level: i32,
    threads: Option<usize>,
) -> PyResult<DeltaStats> {
    let stats = py.detach(|| delta::encode(&base, &target, &out, level, threads)).map_err(to_py)?;
    Ok(stats.into())
}

#[pyfunction]
#[pyo3(signature = (base, delta, out, threads=None))]
fn delta_apply(
    py: Python<'_>,
    base: PathBuf,
    delta: PathBuf,
    out: PathBuf,
    threads: Option<usize>,
) -> PyResult<()> {
    py.detach(|| delta::apply(&base, &delta, &out, threads)).map_err(to_py)
}

#[pyfunction]
fn delta_inspect(py: Python<'_>, delta: PathBuf) -> PyResult<DeltaInfo> {
    let info = py.detach(|| delta::inspect(&delta)).map_err(to_py)?;
    info_to_py(py, info)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<DeltaStats>()?;
    m.add_class::<DeltaTensor>()?;
    m.add_class::<DeltaInfo>()?;
    m.add_function(wrap_pyfunction!(delta_encode, m)?)?;
    m.add_function(wrap_pyfunction!(delta_apply, m)?)?;
    m.add_function(wrap_pyfunction!(delta_inspect, m)?)?;
    m.add("DELTA_MAGIC", PyBytes::new(m.py(), delta::MAGIC))?;
    m.add("DELTA_FORMAT_VERSION", delta::FORMAT_VERSION)?;
    m.add("DELTA_MAX_HEADER", delta::MAX_HEADER)?;
    m.add("DELTA_MAX_SAFETENSORS_HEADER", delta::MAX_SAFETENSORS_HEADER)?;
    let levels = zstd::compression_level_range();
    m.add("DELTA_MIN_LEVEL", *levels.start())?;
    m.add("DELTA_MAX_LEVEL", *levels.end())?;
    Ok(())
}
