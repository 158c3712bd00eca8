//! The weight-delta file format, version 2.
//!
//! ```text
//! offset  bytes  field
//! 0       8      magic b"SRLDELTA"
//! 8       4      format version, u32 little-endian: 2
//! 12      8      header length H, u64 little-endian, at most MAX_HEADER
//! 20      H      header: UTF-8 JSON, below
//! 20 + H  ...    one payload per record, back to back in record order, to the end
//! ```
//!
//! The header is one JSON object (unknown keys refused):
//!
//! * `base_blake3`, `target_blake3`: BLAKE3 (hex) of the whole base and target
//!   files. The delta applies only onto a base of that hash.
//! * `target_size`: the target's size in bytes, which is the base's too.
//! * `safetensors_header_size`, `safetensors_header_blake3`: the size and
//!   BLAKE3 of the bytes before the tensor data (8-byte length and JSON).
//!   They are the same in base and target, so they are not shipped: the
//!   applier copies them from the base once their hash matches.
//! * `tensors`: one record per tensor, in the order of the tensors' data in
//!   the file (the header's own order in every file the safetensors library
//!   writes): `name`; `encoding`, `"xor"` or `"sparse"`; `element_size`, 1, 2, 4
//!   or 8 bytes (from the dtype, 1 for dtypes this build does not know);
//!   `length`, the tensor's bytes; `offset` and `compressed`, where its payload
//!   starts in the delta file and how long it is; `blake3`, the hash of the
//!   target tensor's bytes.
//!
//! A payload is zstd data (one or more frames) that decompresses to:
//!
//! * xor: exactly `length` bytes, the target's elements XOR the base's, as
//!   byte planes: byte 0 of every element in index order, then byte 1 of
//!   every element, and so on up to `element_size` planes;
//! * sparse: a LEB128 varint count `c` of changed elements, then `c` varint
//!   gaps (the first changed element's index, then for each next one its
//!   index minus the previous index minus 1), then the `c` changed elements'
//!   XORs with the base in index order, as byte planes like xor's. The
//!   encoder picks sparse only when gaps and values fit in `length` bytes, so
//!   a sparse payload decompresses to at most `length + 10` bytes (one varint
//!   more). An unchanged tensor is a sparse record with no changes.
//!
//! Version 1 stored xor interleaved and sparse values as the new bytes; its
//! deltas live one step, so nothing reads them any more.
//!
//! A delta arrives from the network, so every number in it is checked before
//! use: the magic, version and header length against the file; the records'
//! encodings and element sizes; payloads back to back from the header's end
//! to the file's end, each within zstd's worst case for its tensor; and the
//! sizes adding up to the target size. Applying checks the record table
//! against the base's own header, decompresses into buffers of the tensor's
//! size at most, and walks sparse gaps within the tensor.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::io::Input;
use super::safetensors::MAX_HEADER as MAX_SAFETENSORS_HEADER;
use super::{plain, quoted, DeltaError, Hash};

pub const MAGIC: &[u8; 8] = b"SRLDELTA";
pub const FORMAT_VERSION: u32 = 2;
/// The largest header accepted. A record is at most about four times the
/// bytes of its tensor's entry in a safetensors header, so the delta of any
/// file within the safetensors cap fits.
pub const MAX_HEADER: u64 = 4 * MAX_SAFETENSORS_HEADER;
/// Magic, version and header length.
pub(crate) const PREAMBLE: u64 = 20;
/// The most bytes a LEB128 varint of a u64 takes.
pub(crate) const MAX_VARINT: u64 = 10;

/// How one tensor's payload encodes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Xor,
    Sparse,
}

impl Encoding {
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Xor => "xor",
            Encoding::Sparse => "sparse",
        }
    }

    /// The most bytes a payload may decompress to for a tensor of `length` bytes.
    pub(crate) fn decoded_cap(self, length: u64) -> u64 {
        match self {
            Encoding::Xor => length,
            Encoding::Sparse => length.saturating_add(MAX_VARINT),
        }
    }
}

/// One tensor's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub name: String,
    pub encoding: Encoding,
    pub element_size: u64,
    pub length: u64,
    pub offset: u64,
    pub compressed: u64,
    pub blake3: Hash,
}

/// What a delta's header says, checked against itself and its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    pub base_blake3: Hash,
    pub target_blake3: Hash,
    pub target_size: u64,
    pub safetensors_header_size: u64,
    pub safetensors_header_blake3: Hash,
    pub tensors: Vec<Record>,
    /// The delta file's own size.
    pub delta_size: u64,
}

// The renames are what serde's complaints call them.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename = "delta header")]
struct WireHeader {
    base_blake3: String,
    target_blake3: String,
    target_size: u64,
    safetensors_header_size: u64,
    safetensors_header_blake3: String,
    tensors: Vec<WireRecord>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename = "tensor record")]
struct WireRecord {
    name: String,
    encoding: String,
    element_size: u64,
    length: u64,
    offset: u64,
    compressed: u64,
    blake3: String,
}

/// The most compressed bytes zstd may need for a tensor of `length` bytes:
/// its worst-case bound (`ZSTD_COMPRESSBOUND`, at most `n + n / 256 + 64`)
/// for the largest stream the tensor may decode from.
pub(crate) fn payload_cap(length: u64) -> u64 {
    let n = Encoding::Sparse.decoded_cap(length);
    n.saturating_add(n / 256).saturating_add(64)
}

fn hash_from_hex(field: &str, hex: &str) -> Result<Hash, DeltaError> {
    match blake3::Hash::from_hex(hex) {
        Ok(h) => Ok(*h.as_bytes()),
        Err(_) => Err(DeltaError::BadHeader(format!("{field} is not 64 hex digits"))),
    }
}

fn hex(hash: &Hash) -> String {
    blake3::Hash::from_bytes(*hash).to_hex().to_string()
}

impl Info {
    /// The header as it is written: JSON, in the field order of the format.
    pub(crate) fn header_json(&self) -> Vec<u8> {
        let wire = WireHeader {
            base_blake3: hex(&self.base_blake3),
            target_blake3: hex(&self.target_blake3),
            target_size: self.target_size,
            safetensors_header_size: self.safetensors_header_size,
            safetensors_header_blake3: hex(&self.safetensors_header_blake3),
            tensors: self
                .tensors
                .iter()
                .map(|r| WireRecord {
                    name: r.name.clone(),
                    encoding: r.encoding.as_str().to_owned(),
                    element_size: r.element_size,
                    length: r.length,
                    offset: r.offset,
                    compressed: r.compressed,
                    blake3: hex(&r.blake3),
                })
                .collect(),
        };
        // Strings, integers and lists only: serde_json cannot fail on them.
        serde_json::to_vec(&wire).unwrap_or_default()
    }

    /// The file's first bytes: magic, version, header length and header.
    pub(crate) fn prelude(&self) -> Vec<u8> {
        let json = self.header_json();
        let mut out = Vec::with_capacity(PREAMBLE as usize + json.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&(json.len() as u64).to_le_bytes());
        out.extend_from_slice(&json);
        out
    }

    pub fn base_hex(&self) -> String {
        hex(&self.base_blake3)
    }

    pub fn target_hex(&self) -> String {
        hex(&self.target_blake3)
    }
}

impl Record {
    pub fn blake3_hex(&self) -> String {
        hex(&self.blake3)
    }
}

/// Reads and checks the delta at `path` without a base.
pub fn inspect(path: &Path) -> Result<Info, DeltaError> {
    open(path).map(|(_, info)| info)
}

/// Opens the delta at `path` and checks its header against itself and the
/// file; the file is returned open for reading its payloads.
pub(crate) fn open(path: &Path) -> Result<(Input, Info), DeltaError> {
    let input = Input::open(path)?;
    let size = input.size;
    let mut preamble = [0u8; PREAMBLE as usize];
    let have = size.min(PREAMBLE) as usize;
    input.read_into(0, &mut preamble[..have])?;
    let magic = have.min(MAGIC.len());
    if preamble[..magic] != MAGIC[..magic] {
        return Err(DeltaError::NotADelta);
    }
    if size < PREAMBLE {
        return Err(DeltaError::Truncated { what: "its preamble".into(), need: PREAMBLE - size });
    }
    let mut version = [0u8; 4];
    version.copy_from_slice(&preamble[8..12]);
    let version = u32::from_le_bytes(version);
    if version != FORMAT_VERSION {
        return Err(DeltaError::Version(version));
    }
    let mut header_len = [0u8; 8];
    header_len.copy_from_slice(&preamble[12..20]);
    let header_len = u64::from_le_bytes(header_len);
    if header_len > MAX_HEADER {
        return Err(DeltaError::HeaderTooLarge(header_len));
    }
    let header_end = PREAMBLE + header_len;
    if header_end > size {
        return Err(DeltaError::Truncated { what: "its header".into(), need: header_end - size });
    }
    let json = input.read(PREAMBLE, header_len)?;
    let wire: WireHeader =
        serde_json::from_slice(&json).map_err(|e| DeltaError::BadHeader(plain(&e.to_string())))?;
    drop(json);
    let info = checked(wire, header_end, size)?;
    Ok((input, info))
}
/// The header, its numbers checked against each other and the file's size.
fn checked(wire: WireHeader, header_end: u64, size: u64) -> Result<Info, DeltaError> {
    let mut tensors = Vec::with_capacity(wire.tensors.len());
    let mut end = header_end;
    let mut tensor_bytes = 0u128;
    for r in wire.tensors {
        let tensor = quoted(&r.name);
        let encoding = match r.encoding.as_str() {
            "xor" => Encoding::Xor,
            "sparse" => Encoding::Sparse,
            other => {
                return Err(DeltaError::UnknownEncoding { tensor, encoding: quoted(other) });
            }
        };
        if !matches!(r.element_size, 1 | 2 | 4 | 8) || r.length % r.element_size != 0 {
            let (size, length) = (r.element_size, r.length);
            return Err(DeltaError::ElementSize { tensor, size, length });
        }
        if r.offset < end {
            return Err(DeltaError::PayloadOverlap { tensor, start: r.offset, expected: end });
        }
        if r.offset > end {
            return Err(DeltaError::PayloadGap { tensor, start: r.offset, expected: end });
        }
        if r.compressed > payload_cap(r.length) {
            let (compressed, length) = (r.compressed, r.length);
            return Err(DeltaError::PayloadTooLarge { tensor, compressed, length });
        }
        end = r.offset.saturating_add(r.compressed);
        if end > size {
            return Err(DeltaError::Truncated {
                what: format!("tensor {tensor}"),
                need: end - size,
            });
        }
        tensor_bytes += u128::from(r.length);
        let blake3 = hash_from_hex(&format!("tensor {tensor}'s blake3"), &r.blake3)?;
        tensors.push(Record {
            name: r.name,
            encoding,
            element_size: r.element_size,
            length: r.length,
            offset: r.offset,
            compressed: r.compressed,
            blake3,
        });
    }
    if end < size {
        return Err(DeltaError::TrailingBytes(size - end));
    }
    let (target_size, header) = (wire.target_size, wire.safetensors_header_size);
    if u128::from(header) + tensor_bytes != u128::from(target_size) {
        return Err(DeltaError::Sizes { target_size, header, tensors: tensor_bytes });
    }
    Ok(Info {
        base_blake3: hash_from_hex("base_blake3", &wire.base_blake3)?,
        target_blake3: hash_from_hex("target_blake3", &wire.target_blake3)?,
        target_size,
        safetensors_header_size: header,
        safetensors_header_blake3: hash_from_hex(
            "safetensors_header_blake3",
            &wire.safetensors_header_blake3,
        )?,
        tensors,
        delta_size: size,
    })
}
