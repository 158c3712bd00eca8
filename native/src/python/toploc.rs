//! Bindings for `swarmrl.toploc`. Shapes and dtypes are normalised on the
//! Python side; here the GIL is released for all the work.

use numpy::{PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::toploc::{self, Activations, ToplocError};

fn value_error(e: ToplocError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

fn view<'a>(acts: &'a PyReadonlyArray2<'_, u16>) -> PyResult<Activations<'a>> {
    let [rows, width] = acts.shape() else { unreachable!("a 2-D array has two dimensions") };
    let (rows, width) = (*rows, *width);
    let data = acts
        .as_slice()
        .map_err(|_| PyValueError::new_err("activations must be a C-contiguous array"))?;
    Activations::new(data, rows, width).map_err(value_error)
}

/// The verdict on one chunk: how far its recomputed top-k is from the proof,
/// and whether that is within the acceptance thresholds.
#[pyclass(frozen, get_all, module = "swarmrl.toploc")]
pub struct VerifyResult {
    exp_mismatches: usize,
    mant_err_mean: f64,
    mant_err_median: f64,
    accepted: bool,
}

#[pymethods]
impl VerifyResult {
    fn __repr__(&self) -> String {
        format!(
            "VerifyResult(exp_mismatches={}, mant_err_mean={}, mant_err_median={}, accepted={})",
            self.exp_mismatches,
            self.mant_err_mean,
            self.mant_err_median,
            if self.accepted { "True" } else { "False" }
        )
    }
}

#[pyfunction]
#[pyo3(signature = (acts, chunk, topk, threads=None))]
fn toploc_build_proofs<'py>(
    py: Python<'py>,
    acts: PyReadonlyArray2<'py, u16>,
    chunk: usize,
    topk: usize,
    threads: Option<usize>,
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    let a = view(&acts)?;
    let proofs =
        py.detach(|| toploc::build_proofs(a, chunk, topk, threads)).map_err(value_error)?;
    Ok(proofs.iter().map(|p| PyBytes::new(py, &p.to_bytes())).collect())
}

#[pyfunction]
#[pyo3(signature = (acts, proofs, chunk, topk, threads=None))]
fn toploc_verify_proofs(
    py: Python<'_>,
    acts: PyReadonlyArray2<'_, u16>,
    proofs: Vec<Option<Vec<u8>>>,
    chunk: usize,
    topk: usize,
    threads: Option<usize>,
) -> PyResult<Vec<VerifyResult>> {
    let a = view(&acts)?;
    let refs: Vec<Option<&[u8]>> = proofs.iter().map(Option::as_deref).collect();
    let verdicts =
        py.detach(|| toploc::verify_proofs(a, &refs, chunk, topk, threads)).map_err(value_error)?;
    Ok(verdicts
        .into_iter()
        .map(|v| VerifyResult {
            exp_mismatches: v.discrepancy.exp_mismatches,
            mant_err_mean: v.discrepancy.mant_err_mean,
            mant_err_median: v.discrepancy.mant_err_median,
            accepted: v.accepted,
        })
        .collect())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<VerifyResult>()?;
    m.add_function(wrap_pyfunction!(toploc_build_proofs, m)?)?;
    m.add_function(wrap_pyfunction!(toploc_verify_proofs, m)?)?;
    m.add("TOPLOC_FIELD_PRIME", toploc::FIELD_PRIME)?;
    m.add("TOPLOC_MAX_EXP_MISMATCH_PER_128", toploc::MAX_EXP_MISMATCH_PER_128)?;
    m.add("TOPLOC_MAX_MANT_ERR_MEAN", toploc::MAX_MANT_ERR_MEAN)?;
    m.add("TOPLOC_MAX_MANT_ERR_MEDIAN", toploc::MAX_MANT_ERR_MEDIAN)?;
    Ok(())
}
