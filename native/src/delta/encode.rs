//! Making a delta of a target safetensors file against a base.

use std::ops::Range;
use std::path::Path;
use std::time::Instant;

use rayon::prelude::*;

use super::codec::{encode_tensor, Encoded};
use super::format::{Encoding, Info, Record, MAX_HEADER, PREAMBLE};
use super::io::Input;
use super::safetensors::{difference, read_header};
use super::{hash, pipelined, pool, update, usize_of, windows, DeltaError};
use crate::atomic::TempFile;

/// What [`encode`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    pub target_bytes: u64,
    pub delta_bytes: u64,
    pub tensors: u64,
    pub xor_tensors: u64,
    pub sparse_tensors: u64,
    pub changed_elements: u64,
    pub total_elements: u64,
    pub seconds: f64,
}

/// One tensor of a window, encoded, with the bytes the whole-file hashes
/// still need.
struct Piece {
    base: Vec<u8>,
    target: Vec<u8>,
    hash: super::Hash,
    encoded: Encoded,
}

/// Writes the delta of `target` against `base` at `out` (replacing any file
/// there), with zstd at `level`. The two files must have identical
/// safetensors headers; otherwise the error says what differs, and the
/// caller ships the whole file instead.
pub fn encode(
    base: &Path,
    target: &Path,
    out: &Path,
    level: i32,
    threads: Option<usize>,
) -> Result<Stats, DeltaError> {
    let started = Instant::now();
    let levels = zstd::compression_level_range();
    if !levels.contains(&level) {
        return Err(DeltaError::Level { got: level, min: *levels.start(), max: *levels.end() });
    }
    let base_in = Input::open(base)?;
    let target_in = Input::open(target)?;
    let header = read_header(&base_in)?;
    let target_header = read_header(&target_in)?;
    if header.bytes != target_header.bytes {
        let what = difference(&header, &target_header);
        return Err(DeltaError::Mismatch {
            base: base.to_owned(),
            target: target.to_owned(),
            what,
        });
    }
    drop(target_header);
    let tensors = &header.tensors;
    let lengths: Vec<u64> = tensors.iter().map(|t| t.len).collect();

    // Payloads go to a scratch file first: the header, which comes before
    // them, holds their lengths and the whole files' hashes.
    let mut payloads = TempFile::create(out)?;
    let mut stats = Stats {
        target_bytes: target_in.size,
        delta_bytes: 0,
        tensors: tensors.len() as u64,
        xor_tensors: 0,
        sparse_tensors: 0,
        changed_elements: 0,
        total_elements: 0,
        seconds: 0.0,
    };
    let mut records = Vec::with_capacity(tensors.len());
    let mut base_hash = blake3::Hasher::new();
    let mut target_hash = blake3::Hasher::new();
    base_hash.update(&header.bytes);
    target_hash.update(&header.bytes);
    // In memory: at most two windows of base and target bytes (see
    // `pipelined`), and per tensor being encoded its XOR, its sparse stream
    // (never longer than the tensor) and the two compressed candidates.
    let compute = |window: Range<usize>| {
        tensors[window]
            .par_iter()
            .map(|t| {
                let base = base_in.read(t.start, t.len)?;
                let target = target_in.read(t.start, t.len)?;
                let size = usize_of(t.element_size)?;
                let encoded = encode_tensor(&t.name, &base, &target, size, level)?;
                Ok(Piece { hash: hash(&target), base, target, encoded })
            })
            .collect::<Result<Vec<_>, DeltaError>>()
    };
    let finish = |window: Range<usize>, pieces: Result<Vec<Piece>, DeltaError>| {
        for (t, piece) in tensors[window].iter().zip(pieces?) {
            update(&mut base_hash, &piece.base);
            update(&mut target_hash, &piece.target);
            let Encoded { encoding, payload, changed } = piece.encoded;
            payloads.write(&payload)?;
            match encoding {
                Encoding::Xor => stats.xor_tensors += 1,
                Encoding::Sparse => stats.sparse_tensors += 1,
            }
            stats.changed_elements += changed;
            stats.total_elements += t.len / t.element_size;
            records.push(Record {
                name: t.name.clone(),
                encoding,
                element_size: t.element_size,
                length: t.len,
                offset: 0,
                compressed: payload.len() as u64,
                blake3: piece.hash,
            });
        }
        Ok(true)
    };
    pool(threads)?.install(|| pipelined(windows(&lengths), compute, finish))?;

    let mut info = Info {
        base_blake3: *base_hash.finalize().as_bytes(),
        target_blake3: *target_hash.finalize().as_bytes(),
        target_size: target_in.size,
        safetensors_header_size: header.bytes.len() as u64,
        safetensors_header_blake3: *blake3::hash(&header.bytes).as_bytes(),
        tensors: records,
        delta_size: 0,
    };
    let prelude = place_payloads(&mut info)?;
    let mut delta = TempFile::create(out)?;
    delta.write(&prelude)?;
    delta.append(&mut payloads)?;
    delta.commit()?;
    let payload_bytes: u64 = info.tensors.iter().map(|r| r.compressed).sum();
    stats.delta_bytes = prelude.len() as u64 + payload_bytes;
    stats.seconds = started.elapsed().as_secs_f64();
    Ok(stats)
}

/// Sets every record's payload offset and returns the file's prelude
/// (magic, version, header length, header). The offsets are written in the
/// header and so move with its length: starting from the shortest possible
/// header, each pass can only lengthen it, so the passes settle, in two or
/// three as digits are few.
fn place_payloads(info: &mut Info) -> Result<Vec<u8>, DeltaError> {
    let mut start = PREAMBLE;
    loop {
        let mut offset = start;
        for record in &mut info.tensors {
            record.offset = offset;
            offset += record.compressed;
        }
        let prelude = info.prelude();
        let header_len = prelude.len() as u64 - PREAMBLE;
        if header_len > MAX_HEADER {
            return Err(DeltaError::HeaderTooLarge(header_len));
        }
        if prelude.len() as u64 == start {
            return Ok(prelude);
        }
        start = prelude.len() as u64;
    }
}
