//! Rayon pools of a chosen size, shared by every kernel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use rayon::{ThreadPool, ThreadPoolBuildError, ThreadPoolBuilder};

/// A pool of `n` workers (0: rayon's default, all cores or
/// `RAYON_NUM_THREADS`), started once per distinct `n` and kept: starting
/// threads costs more than proving a short completion or hashing a small shard.
pub fn pool(n: usize) -> Result<Arc<ThreadPool>, ThreadPoolBuildError> {
    static POOLS: OnceLock<Mutex<HashMap<usize, Arc<ThreadPool>>>> = OnceLock::new();
    let mut pools = POOLS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = pools.get(&n) {
        return Ok(p.clone());
    }
    let p =
        ThreadPoolBuilder::new().num_threads(n).thread_name(|i| format!("swarmrl-{i}")).build()?;
    Ok(pools.entry(n).or_insert(Arc::new(p)).clone())
}
