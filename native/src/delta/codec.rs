//! One tensor's two encodings (see [`super::format`]): building both
//! candidates and keeping the smaller, and decoding a payload onto the base's
//! bytes with every count in it checked.
//!
//! Both encodings store XORs with the base, split into byte planes (every
//! element's byte 0, then every element's byte 1, ...). A small update moves
//! a weight by a unit or two in its last place, so its XOR is non-zero only
//! in the low bytes: the planes of the high bytes are long runs of zeros that
//! zstd all but removes, where interleaved they would cut every match short.
//! Measured on SmolLM2-135M in bf16 at lr 1e-6 (BENCHMARKS.md), steps 2-4 ship
//! 0.76-1.63% of the policy this way, 1.04-2.71% as the new values of the
//! changed elements.

use zstd::zstd_safe::{self, zstd_sys::ZSTD_ErrorCode};

use super::format::{Encoding, Record, MAX_VARINT};
use super::{quoted, usize_of, DeltaError};

/// Runs `$body` with `$s` bound to `$size`, as a constant for the element
/// sizes dtypes have, so that the per-byte loops unroll instead of looping
/// over a runtime count.
macro_rules! sized {
    ($size:expr, |$s:ident| $body:block) => {
        match $size {
            1 => {
                let $s = 1usize;
                $body
            }
            2 => {
                let $s = 2usize;
                $body
            }
            4 => {
                let $s = 4usize;
                $body
            }
            8 => {
                let $s = 8usize;
                $body
            }
            n => {
                let $s = n;
                $body
            }
        }
    };
}

/// Elements compared per block: equal blocks, most of a tensor after a small
/// update, cost one comparison of the whole block.
const BLOCK_ELEMENTS: usize = 32;

/// A tensor's payload, and how many of its elements changed.
pub(crate) struct Encoded {
    pub encoding: Encoding,
    pub payload: Vec<u8>,
    pub changed: u64,
}

/// Encodes `target` against `base` (same length), elements of
/// `element_size` bytes, as whichever of XOR and sparse compresses smaller.
pub(crate) fn encode_tensor(
    name: &str,
    base: &[u8],
    target: &[u8],
    element_size: usize,
    level: i32,
) -> Result<Encoded, DeltaError> {
    let scan = scan(base, target, element_size);
    let changed = scan.changed;
    let xor = || compress(name, &xor_planes(base, target, element_size), level);
    let (encoding, payload) = match scan.sparse {
        // Unchanged: a few bytes of sparse record, nothing to compare it with.
        Some(sparse) if changed == 0 => (Encoding::Sparse, compress(name, &sparse, level)?),
        Some(sparse) => match rayon::join(|| compress(name, &sparse, level), xor) {
            (Ok(s), Ok(x)) if s.len() <= x.len() => (Encoding::Sparse, s),
            (Ok(_), Ok(x)) => (Encoding::Xor, x),
            (Err(e), _) | (_, Err(e)) => return Err(e),
        },
        None => (Encoding::Xor, xor()?),
    };
    Ok(Encoded { encoding, payload, changed })
}

/// Rebuilds a tensor from its base bytes and its record's payload.
pub(crate) fn decode_tensor(
    record: &Record,
    base: &[u8],
    payload: &[u8],
) -> Result<Vec<u8>, DeltaError> {
    let cap = record.encoding.decoded_cap(record.length);
    let raw = decompress(&record.name, payload, cap)?;
    match record.encoding {
        Encoding::Xor => {
            if raw.len() as u64 != record.length {
                let (got, length) = (raw.len() as u64, record.length);
                return Err(DeltaError::XorLength { tensor: quoted(&record.name), got, length });
            }
            Ok(from_planes_onto(&raw, base, usize_of(record.element_size)?))
        }
        Encoding::Sparse => patch(record, base, &raw),
    }
}

struct Scan {
    changed: u64,
    /// The sparse stream, or `None` when its gaps and values would not fit in
    /// the tensor's own length.
    sparse: Option<Vec<u8>>,
}

fn scan(base: &[u8], target: &[u8], element_size: usize) -> Scan {
    // `scan_sized` inlined with a constant size: comparing an element is one
    // load and compare rather than a call to memcmp.
    sized!(element_size, |s| { scan_sized(base, target, s) })
}

#[inline(always)]
fn scan_sized(base: &[u8], target: &[u8], size: usize) -> Scan {
    let limit = base.len();
    let (mut gaps, mut values) = (Vec::new(), Vec::new());
    let (mut changed, mut next, mut fits) = (0u64, 0u64, true);
    let block = BLOCK_ELEMENTS * size;
    for (b, (x, y)) in base.chunks(block).zip(target.chunks(block)).enumerate() {
        if x == y {
            continue;
        }
        let first = (b * BLOCK_ELEMENTS) as u64;
        for (i, (p, q)) in x.chunks_exact(size).zip(y.chunks_exact(size)).enumerate() {
            if p == q {
                continue;
            }
            changed += 1;
            if fits {
                let index = first + i as u64;
                put_varint(&mut gaps, index - next);
                values.extend(p.iter().zip(q).map(|(a, b)| a ^ b));
                next = index + 1;
                fits = gaps.len() + values.len() <= limit;
                if !fits {
                    (gaps, values) = (Vec::new(), Vec::new());
                }
            }
        }
    }
    let sparse = fits.then(|| {
        let mut out = Vec::with_capacity(MAX_VARINT as usize + gaps.len() + values.len());
        put_varint(&mut out, changed);
        out.extend_from_slice(&gaps);
        out.extend_from_slice(&to_planes(&values, size));
        out
    });
    Scan { changed, sparse }
}

/// `base` XOR `target`, as byte planes of `size`-byte elements.
fn xor_planes(base: &[u8], target: &[u8], size: usize) -> Vec<u8> {
    let mut out = vec![0u8; base.len()];
    sized!(size, |s| {
        let n = base.len() / s;
        for (i, (p, q)) in base.chunks_exact(s).zip(target.chunks_exact(s)).enumerate() {
            for b in 0..s {
                out[b * n + i] = p[b] ^ q[b];
            }
        }
    });
    out
}

/// `elements` (back to back, `size` bytes each) as byte planes.
fn to_planes(elements: &[u8], size: usize) -> Vec<u8> {
    let mut out = vec![0u8; elements.len()];
    sized!(size, |s| {
        let n = elements.len() / s;
        for (i, element) in elements.chunks_exact(s).enumerate() {
            for b in 0..s {
                out[b * n + i] = element[b];
            }
        }
    });
    out
}

/// `base` XOR the elements whose byte planes are `planes` (same length).
fn from_planes_onto(planes: &[u8], base: &[u8], size: usize) -> Vec<u8> {
    let mut out = base.to_vec();
    sized!(size, |s| {
        let n = base.len() / s;
        for (i, element) in out.chunks_exact_mut(s).enumerate() {
            for b in 0..s {
                element[b] ^= planes[b * n + i];
            }
        }
    });
    out
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// The LEB128 varint at `*pos`, moving `*pos` past it; `None` when the bytes
/// end inside it or it does not fit in 64 bits.
fn get_varint(raw: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *raw.get(*pos)?;
        *pos += 1;
        let bits = u64::from(byte & 0x7f);
        if shift == 63 && bits > 1 {
            return None;
        }
        value |= bits << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// Applies a decoded sparse stream to a copy of `base`.
fn patch(record: &Record, base: &[u8], raw: &[u8]) -> Result<Vec<u8>, DeltaError> {
    let tensor = || quoted(&record.name);
    let size = usize_of(record.element_size)?;
    let elements = (base.len() / size) as u64;
    let mut pos = 0;
    let count = get_varint(raw, &mut pos).ok_or_else(|| DeltaError::Varint { tensor: tensor() })?;
    if count > elements {
        return Err(DeltaError::SparseCount { tensor: tensor(), count, elements });
    }
    let gaps = &raw[pos..];
    // Gaps first, to find where the values start and check their length;
    // then again, writing each value: twice the parsing, but no list of
    // indices, which could take eight times the tensor.
    let values = &gaps[walk(record, gaps, count, elements, |_, _| Ok(()))?..];
    if values.len() as u128 != u128::from(count) * size as u128 {
        let got = values.len() as u64;
        return Err(DeltaError::SparseValues { tensor: tensor(), got, count, size: size as u64 });
    }
    let mut out = base.to_vec();
    // Byte b of the k-th change is at values[b * count + k] (byte planes).
    let count = count as usize;
    walk(record, gaps, count as u64, elements, |index, rank| {
        let start = index as usize * size;
        let element = out
            .get_mut(start..start + size)
            .ok_or_else(|| DeltaError::SparseRange { tensor: tensor(), elements })?;
        for (b, byte) in element.iter_mut().enumerate() {
            *byte ^= values[b * count + rank as usize];
        }
        Ok(())
    })?;
    Ok(out)
}

/// Walks `count` gaps at the start of `gaps`, calling `visit` with each
/// changed element's index (checked to be below `elements`) and its rank.
/// Returns how many bytes the gaps took.
fn walk(
    record: &Record,
    gaps: &[u8],
    count: u64,
    elements: u64,
    mut visit: impl FnMut(u64, u64) -> Result<(), DeltaError>,
) -> Result<usize, DeltaError> {
    let mut pos = 0;
    let mut next = 0u64;
    // Each gap takes at least a byte, so a count larger than the stream
    // ends in a varint error long before it costs anything.
    for k in 0..count {
        let gap = get_varint(gaps, &mut pos)
            .ok_or_else(|| DeltaError::Varint { tensor: quoted(&record.name) })?;
        let index = next
            .checked_add(gap)
            .filter(|&i| i < elements)
            .ok_or_else(|| DeltaError::SparseRange { tensor: quoted(&record.name), elements })?;
        visit(index, k)?;
        next = index + 1;
    }
    Ok(pos)
}

fn compress(name: &str, data: &[u8], level: i32) -> Result<Vec<u8>, DeltaError> {
    let mut out = Vec::with_capacity(zstd_safe::compress_bound(data.len()));
    zstd_safe::compress(&mut out, data, level).map_err(|code| DeltaError::Compress {
        tensor: quoted(name),
        reason: zstd_safe::get_error_name(code),
    })?;
    // The bound is reserved, not touched; keep only what was written.
    out.shrink_to_fit();
    Ok(out)
}

/// Decompresses a payload into a buffer of `cap` bytes: what a payload claims
/// never makes a larger allocation. One-shot decompression writes straight
/// into that buffer and needs no window buffer of the size a frame declares.
fn decompress(name: &str, payload: &[u8], cap: u64) -> Result<Vec<u8>, DeltaError> {
    // zstd returns errors as the negated code; the codes are stable across
    // zstd versions (zstd_errors.h).
    let too_small = 0usize.wrapping_sub(ZSTD_ErrorCode::ZSTD_error_dstSize_tooSmall as usize);
    let mut out = Vec::with_capacity(usize_of(cap)?);
    match zstd_safe::decompress(&mut out, payload) {
        Ok(_) => Ok(out),
        Err(code) if code == too_small => Err(DeltaError::Oversize { tensor: quoted(name), cap }),
        Err(code) => {
            Err(DeltaError::Zstd { tensor: quoted(name), reason: zstd_safe::get_error_name(code) })
        }
    }
}
