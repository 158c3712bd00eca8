//! `swarmrl._native`: the private extension module. `swarmrl.toploc` and
//! `swarmrl.shards` are its only Python faces.

use pyo3::prelude::*;

mod shards;
mod toploc;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    toploc::register(m)?;
    shards::register(m)?;
    Ok(())
}
