//! Rebuilding a target from its base and a delta.

use std::ops::Range;
use std::path::Path;

use rayon::prelude::*;

use super::codec::decode_tensor;
use super::format::{self, Info, Record};
use super::io::Input;
use super::safetensors::{read_header, Header, Tensor};
use super::{hash, pipelined, pool, quoted, update, usize_of, windows, DeltaError, Hash};
use crate::atomic::TempFile;

/// Hashing the rest of a base after a mismatch reads it in blocks this large.
const BLOCK: u64 = 4 << 20;

/// Rebuilds at `out` (replacing any file there) the target that the delta at
/// `delta` encodes against `base`. The base must be the exact file the delta
/// was made against; each rebuilt tensor and the whole file must match the
/// hashes the delta carries. On any error `out` is left as it was.
pub fn apply(
    base: &Path,
    delta: &Path,
    out: &Path,
    threads: Option<usize>,
) -> Result<(), DeltaError> {
    let (delta_in, info) = format::open(delta)?;
    let base_in = Input::open(base)?;
    let wrong_base = |reason: String| DeltaError::WrongBase { path: base.to_owned(), reason };
    if base_in.size != info.target_size {
        return Err(wrong_base(format!(
            "it is {} bytes, but the delta's base is {}",
            base_in.size, info.target_size
        )));
    }
    let header = read_header(&base_in)?;
    if header.bytes.len() as u64 != info.safetensors_header_size
        || *blake3::hash(&header.bytes).as_bytes() != info.safetensors_header_blake3
    {
        return Err(wrong_base(
            "its safetensors header is not the one the delta was made against".into(),
        ));
    }
    check_table(&header.tensors, &info.tensors)?;

    let mut output = TempFile::create(out)?;
    let rebuilt =
        pool(threads)?.install(|| rebuild(&base_in, &delta_in, &header, &info, &mut output))?;
    if rebuilt.base != info.base_blake3 {
        return Err(wrong_base("its BLAKE3 is not the base hash the delta carries".into()));
    }
    if let Some(tensor) = rebuilt.mismatch {
        return Err(DeltaError::TensorHash { tensor });
    }
    if rebuilt.target != info.target_blake3 {
        return Err(DeltaError::TargetHash);
    }
    Ok(output.commit()?)
}

/// The record table must describe the base's tensors, in the same order.
fn check_table(tensors: &[Tensor], records: &[Record]) -> Result<(), DeltaError> {
    if tensors.len() != records.len() {
        return Err(DeltaError::Table(format!(
            "the base has {} tensors, the delta records {}",
            tensors.len(),
            records.len()
        )));
    }
    for (i, (t, r)) in tensors.iter().zip(records).enumerate() {
        let name = quoted(&t.name);
        let disagreement = if t.name != r.name {
            format!("record {i} is tensor {}, where the base has {name}", quoted(&r.name))
        } else if t.len != r.length {
            format!("tensor {name} is {} bytes in the base, {} in the delta", t.len, r.length)
        } else if t.element_size != r.element_size {
            format!(
                "tensor {name} has {}-byte elements in the base, {}-byte in the delta",
                t.element_size, r.element_size
            )
        } else {
            continue;
        };
        return Err(DeltaError::Table(disagreement));
    }
    Ok(())
}

/// What streaming the tensors found: the base's hash, the rebuilt file's, and
/// the first tensor that did not match its record. After a mismatch nothing
/// more is rebuilt, but the base is still hashed to the end: a wrong base is
/// the likelier cause, and the error should say so.
struct Rebuilt {
    base: Hash,
    target: Hash,
    mismatch: Option<String>,
}

/// One tensor of a window: its base bytes (for the base's hash), its rebuilt
/// bytes, and whether they match the record's hash.
struct Piece {
    base: Vec<u8>,
    rebuilt: Vec<u8>,
    matches: bool,
}

fn rebuild(
    base_in: &Input,
    delta_in: &Input,
    header: &Header,
    info: &Info,
    output: &mut TempFile,
) -> Result<Rebuilt, DeltaError> {
    let mut base_hash = blake3::Hasher::new();
    let mut target_hash = blake3::Hasher::new();
    base_hash.update(&header.bytes);
    target_hash.update(&header.bytes);
    output.write(&header.bytes)?;
    let mut mismatch = None;
    let lengths: Vec<u64> = info.tensors.iter().map(|r| r.length).collect();
    // In memory: at most two windows of base and rebuilt bytes (see
    // `pipelined`), and per tensor being decoded its payload and its decoded
    // stream (never longer than the tensor plus one varint).
    let compute = |window: Range<usize>| {
        // Every result is kept, in order, so that the error reported is the
        // first tensor's, whichever thread finished first.
        info.tensors[window.clone()]
            .par_iter()
            .zip(&header.tensors[window])
            .map(|(record, tensor)| {
                let base = base_in.read(tensor.start, tensor.len)?;
                let payload = delta_in.read(record.offset, record.compressed)?;
                let rebuilt = decode_tensor(record, &base, &payload)?;
                let matches = hash(&rebuilt) == record.blake3;
                Ok(Piece { base, rebuilt, matches })
            })
            .collect::<Vec<Result<Piece, DeltaError>>>()
    };
    let finish = |window: Range<usize>, pieces: Vec<Result<Piece, DeltaError>>| {
        for (piece, tensor) in pieces.into_iter().zip(&header.tensors[window]) {
            let piece = piece?;
            update(&mut base_hash, &piece.base);
            if !piece.matches {
                mismatch = Some(tensor);
                return Ok(false);
            }
            update(&mut target_hash, &piece.rebuilt);
            output.write(&piece.rebuilt)?;
        }
        Ok(true)
    };
    pipelined(windows(&lengths), compute, finish)?;
    Ok(match mismatch {
        Some(tensor) => Rebuilt {
            base: hash_rest(base_in, base_hash, tensor.start + tensor.len)?,
            target: [0; 32],
            mismatch: Some(quoted(&tensor.name)),
        },
        None => Rebuilt {
            base: *base_hash.finalize().as_bytes(),
            target: *target_hash.finalize().as_bytes(),
            mismatch: None,
        },
    })
}

/// Finishes `hasher` with the base's bytes from `from` to its end.
fn hash_rest(base_in: &Input, mut hasher: blake3::Hasher, from: u64) -> Result<Hash, DeltaError> {
    let mut buf = vec![0u8; usize_of(BLOCK.min(base_in.size - from))?];
    let mut pos = from;
    while pos < base_in.size {
        let n = usize_of(BLOCK.min(base_in.size - pos))?;
        base_in.read_into(pos, &mut buf[..n])?;
        update(&mut hasher, &buf[..n]);
        pos += n as u64;
    }
    Ok(*hasher.finalize().as_bytes())
}
