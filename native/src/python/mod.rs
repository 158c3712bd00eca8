//! `swarmrl._native`: the private extension module. `swarmrl.toploc`,
//! `swarmrl.shards` and `swarmrl.delta` are its only Python faces.

use pyo3::prelude::*;

mod delta;
mod shards;
mod toploc;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    toploc::register(m)?;
    shards::register(m)?;
    delta::register(m)?;
    Ok(())
}
