//! The safetensors header, read defensively: on a node the file it comes from
//! was downloaded, and the delta is checked against it.
//!
//! A safetensors file is an 8-byte little-endian length `n`, `n` bytes of JSON
//! (tensor name to `dtype`, `shape` and `data_offsets`, plus an optional
//! `__metadata__` map of strings), then the data. The tensors' byte ranges
//! must tile the data exactly (back to back from 0, no gap, no overlap, to the
//! end of the file), as the safetensors library itself writes and requires:
//! the header and the tensors are then the whole file, which is what lets a
//! delta rebuild a file byte for byte from the header and its tensors.
//!
//! Parsed with serde_json rather than the `safetensors` crate: that crate
//! refuses dtypes it does not know (new 4-, 6- and 8-bit formats keep
//! appearing) and hands tensors back in a hash map, while a delta needs only
//! each tensor's byte range and element size, in file order.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::io::Input;
use super::{plain, quoted, DeltaError};

/// The largest JSON header accepted: the safetensors library's own limit.
pub const MAX_HEADER: u64 = 100_000_000;

/// One tensor, as a delta needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tensor {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    /// Bytes per element: from the dtype, 1 for dtypes this build does not
    /// know (their bytes are then compared one by one).
    pub element_size: u64,
    /// The absolute offset of the tensor's bytes in the file.
    pub start: u64,
    pub len: u64,
}

/// A safetensors file's header bytes (the 8-byte length and the JSON) and its
/// tensors in the order of their data.
#[derive(Debug)]
pub(crate) struct Header {
    pub bytes: Vec<u8>,
    pub tensors: Vec<Tensor>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
}

/// Bytes per element of the dtypes whose size is fixed and known; `None` for
/// the rest (sub-byte formats, and whatever appears after this build).
pub(crate) fn known_element_size(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" => 1,
        "U16" | "I16" | "F16" | "BF16" => 2,
        "U32" | "I32" | "F32" => 4,
        "U64" | "I64" | "F64" | "C64" => 8,
        _ => return None,
    })
}

/// Reads and checks the header of the safetensors file `input`.
pub(crate) fn read_header(input: &Input) -> Result<Header, DeltaError> {
    let file_size = input.size;
    let bad = |reason: String| DeltaError::Safetensors { path: input.path.clone(), reason };
    if file_size < 8 {
        return Err(bad(format!("it is {file_size} bytes, too short for its header length")));
    }
    let mut prefix = [0u8; 8];
    input.read_into(0, &mut prefix)?;
    let n = u64::from_le_bytes(prefix);
    if n > MAX_HEADER {
        return Err(bad(format!(
            "its header claims {n} bytes, more than the {MAX_HEADER} allowed"
        )));
    }
    let header_end = 8 + n;
    if header_end > file_size {
        return Err(bad(format!(
            "its header claims {n} bytes, but only {} follow its length",
            file_size - 8
        )));
    }
    let bytes = input.read(0, header_end)?;

    let entries: HashMap<String, &RawValue> = serde_json::from_slice(&bytes[8..])
        .map_err(|e| bad(format!("its header is not a JSON object: {}", plain(&e.to_string()))))?;
    let mut tensors = Vec::with_capacity(entries.len());
    for (name, raw) in entries {
        if name == "__metadata__" {
            continue;
        }
        let entry: Entry = serde_json::from_str(raw.get()).map_err(|e| {
            bad(format!(
                "tensor {} is not described right: {}",
                quoted(&name),
                plain(&e.to_string())
            ))
        })?;
        tensors.push(tensor(name, entry, header_end).map_err(bad)?);
    }
    // File order; equal starts only for empty tensors, which names then order.
    tensors.sort_by(|a, b| (a.start, a.len, &a.name).cmp(&(b.start, b.len, &b.name)));
    let mut end = header_end;
    for t in &tensors {
        if t.start != end {
            let how = if t.start < end { "overlaps the tensor before it" } else { "leaves a gap" };
            return Err(bad(format!(
                "tensor {} starts at data byte {}, where the data so far ends at {}: it {how}",
                quoted(&t.name),
                t.start - header_end,
                end - header_end
            )));
        }
        end = end.checked_add(t.len).filter(|&e| e <= file_size).ok_or_else(|| {
            bad(format!("tensor {} runs past the end of the file", quoted(&t.name)))
        })?;
    }
    if end != file_size {
        return Err(bad(format!(
            "its tensors hold {} bytes of data, but the file holds {}",
            end - header_end,
            file_size - header_end
        )));
    }
    Ok(Header { bytes, tensors })
}

/// One header entry as a [`Tensor`], or why it is not one.
fn tensor(name: String, entry: Entry, header_end: u64) -> Result<Tensor, String> {
    let (begin, end) = entry.data_offsets;
    if end < begin {
        return Err(format!(
            "tensor {} has data offsets [{begin}, {end}], end first",
            quoted(&name)
        ));
    }
    let len = end - begin;
    let element_size = match known_element_size(&entry.dtype) {
        Some(size) => {
            let bytes = entry
                .shape
                .iter()
                .try_fold(size, |acc, &dim| acc.checked_mul(dim))
                .filter(|&bytes| bytes == len);
            if bytes.is_none() {
                return Err(format!(
                    "tensor {} is {} {:?}, which is not the {len} bytes its data offsets span",
                    quoted(&name),
                    plain(&entry.dtype),
                    entry.shape
                ));
            }
            size
        }
        None => 1,
    };
    let start = header_end
        .checked_add(begin)
        .ok_or_else(|| format!("tensor {} starts past any file", quoted(&name)))?;
    Ok(Tensor { name, dtype: entry.dtype, shape: entry.shape, element_size, start, len })
}

/// What differs between two headers that are not byte for byte the same, in
/// words, the first difference found.
pub(crate) fn difference(base: &Header, target: &Header) -> String {
    let names = |h: &Header| h.tensors.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
    let (a, b) = (names(base), names(target));
    if let Some(name) = a.iter().find(|n| !b.contains(n)) {
        return format!("tensor {} is only in the base", quoted(name));
    }
    if let Some(name) = b.iter().find(|n| !a.contains(n)) {
        return format!("tensor {} is only in the target", quoted(name));
    }
    for (x, y) in base.tensors.iter().zip(&target.tensors) {
        if x.name != y.name {
            return format!(
                "their tensors lie in another order ({} where the base has {})",
                quoted(&y.name),
                quoted(&x.name)
            );
        }
        if (&x.dtype, &x.shape) != (&y.dtype, &y.shape) {
            return format!(
                "tensor {} is {} {:?} in the base but {} {:?} in the target",
                quoted(&x.name),
                plain(&x.dtype),
                x.shape,
                plain(&y.dtype),
                y.shape
            );
        }
        let data_offset = |h: &Header, t: &Tensor| t.start - h.bytes.len() as u64;
        if data_offset(base, x) != data_offset(target, y) {
            return format!("tensor {} lies at another offset", quoted(&x.name));
        }
    }
    "their safetensors headers differ in their metadata or their formatting".to_owned()
}
