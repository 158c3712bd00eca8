use std::fs;
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use serde_json::{json, Value};

use super::codec::{decode_tensor, encode_tensor};
use super::*;
use crate::test_dir::TempDir;

/// Deterministic pseudo-random bytes (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

struct Tensor {
    name: &'static str,
    dtype: &'static str,
    shape: Vec<u64>,
    data: Vec<u8>,
}

fn tensor(name: &'static str, dtype: &'static str, shape: &[u64], rng: &mut Rng) -> Tensor {
    let numel: u64 = shape.iter().product();
    let size = safetensors::known_element_size(dtype).unwrap_or(1);
    Tensor { name, dtype, shape: shape.to_vec(), data: rng.bytes((numel * size) as usize) }
}

/// A safetensors file of `tensors`, in that order, laid out as the library
/// lays them out (header padded with spaces to a multiple of 8).
fn safetensors(tensors: &[Tensor], metadata: &str) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({ "note": metadata }));
    let mut offset = 0;
    for t in tensors {
        let end = offset + t.data.len();
        header.insert(
            t.name.into(),
            json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut json = serde_json::to_vec(&header).unwrap();
    while json.len() % 8 != 0 {
        json.push(b' ');
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    for t in tensors {
        out.extend_from_slice(&t.data);
    }
    out
}

/// Changes `fraction` of the `size`-byte elements of `data`, every byte of
/// each: a changed element then costs XOR as many literal bytes as sparse.
fn change(data: &mut [u8], size: usize, fraction: f64, rng: &mut Rng) -> usize {
    let elements = data.len() / size;
    let count = ((elements as f64) * fraction).ceil() as usize;
    let mut changed = std::collections::BTreeSet::new();
    while changed.len() < count {
        let i = rng.below(elements);
        if changed.insert(i) {
            for byte in &mut data[i * size..(i + 1) * size] {
                *byte ^= 1 + rng.below(255) as u8;
            }
        }
    }
    count
}

/// A small model in both dtypes: unchanged, sparsely changed and fully
/// changed tensors, an empty one, a scalar, and a dtype this build does not
/// know. Returns base, target, and the number of changed elements.
fn model(rng: &mut Rng) -> (Vec<u8>, Vec<u8>, u64) {
    let base = vec![
        tensor("model.embed_tokens.weight", "BF16", &[256, 64], rng),
        tensor("model.layers.0.mlp.up_proj.weight", "BF16", &[64, 192], rng),
        tensor("model.layers.0.mlp.down_proj.weight", "F32", &[192, 64], rng),
        tensor("model.layers.0.input_layernorm.weight", "F32", &[64], rng),
        tensor("model.layers.0.self_attn.q_proj.weight", "BF16", &[64, 64], rng),
        tensor("model.layers.0.self_attn.k_proj.weight", "F32", &[64, 32], rng),
        tensor("model.norm.weight", "BF16", &[64], rng),
        tensor("empty", "F32", &[0, 8], rng),
        tensor("scalar", "F64", &[], rng),
        tensor("packed", "F4", &[2, 50], rng),
    ];
    let mut target: Vec<Tensor> = base
        .iter()
        .map(|t| Tensor {
            name: t.name,
            dtype: t.dtype,
            shape: t.shape.clone(),
            data: t.data.clone(),
        })
        .collect();
    let mut changed = 0;
    changed += change(&mut target[0].data, 2, 0.01, rng); // sparse
    changed += change(&mut target[1].data, 2, 1.0, rng); // dense: xor
    changed += change(&mut target[2].data, 4, 0.01, rng); // sparse
    changed += change(&mut target[5].data, 4, 1.0, rng); // dense: xor
    changed += change(&mut target[8].data, 8, 1.0, rng);
    changed += change(&mut target[9].data, 1, 0.05, rng);
    (safetensors(&base, "same"), safetensors(&target, "same"), changed as u64)
}

struct Case {
    dir: TempDir,
    base: PathBuf,
    target: PathBuf,
    delta: PathBuf,
    target_bytes: Vec<u8>,
}

fn case(seed: u64) -> Case {
    let (base, target, _) = model(&mut Rng(seed));
    let dir = TempDir::new("delta");
    let case = Case {
        base: dir.file("base.safetensors", &base),
        target: dir.file("target.safetensors", &target),
        delta: dir.0.join("step.delta"),
        target_bytes: target,
        dir,
    };
    encode(&case.base, &case.target, &case.delta, 3, Some(2)).unwrap();
    case
}

impl Case {
    fn out(&self) -> PathBuf {
        self.dir.0.join("out.safetensors")
    }

    /// Applies `delta_bytes` as a delta file, over an `out` that already holds
    /// other bytes, and checks that an error leaves them and nothing else.
    fn apply_bytes(&self, delta_bytes: &[u8]) -> Result<(), DeltaError> {
        let delta = self.dir.file("mutated.delta", delta_bytes);
        let out = self.out();
        fs::write(&out, b"previous").unwrap();
        let before = self.dir.names();
        let result = apply(&self.base, &delta, &out, Some(1));
        assert_eq!(self.dir.names(), before, "a temporary file was left behind");
        match &result {
            Ok(()) => assert!(fs::read(&out).unwrap() == self.target_bytes, "applied wrong"),
            Err(_) => assert_eq!(fs::read(&out).unwrap(), b"previous"),
        }
        result
    }
}

/// A delta split into its header (as JSON) and payloads.
fn split(delta: &[u8]) -> (Value, Vec<Vec<u8>>) {
    let len = u64::from_le_bytes(delta[12..20].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&delta[20..20 + len]).unwrap();
    let payloads = header["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let (o, c) = (r["offset"].as_u64().unwrap(), r["compressed"].as_u64().unwrap());
            delta[o as usize..(o + c) as usize].to_vec()
        })
        .collect();
    (header, payloads)
}

/// A delta of `header` and `payloads`, its offsets and lengths left as the
/// header has them.
fn join_as_is(header: &Value, payloads: &[Vec<u8>]) -> Vec<u8> {
    let json = serde_json::to_vec(header).unwrap();
    let mut out = b"SRLDELTA".to_vec();
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    payloads.iter().for_each(|p| out.extend_from_slice(p));
    out
}

/// A delta of `header` and `payloads` with consistent offsets and lengths.
fn join(header: &Value, payloads: &[Vec<u8>]) -> Vec<u8> {
    join_then(header, payloads, &|_| ())
}

/// A delta of `header` and `payloads`, laid out consistently and then
/// changed by `edit`: what `edit` does to offsets and lengths is all that is
/// wrong with them.
fn join_then(header: &Value, payloads: &[Vec<u8>], edit: &dyn Fn(&mut Value)) -> Vec<u8> {
    let mut start = 20;
    loop {
        let mut header = header.clone();
        let mut offset = start;
        for (r, p) in header["tensors"].as_array_mut().unwrap().iter_mut().zip(payloads) {
            r["offset"] = json!(offset);
            r["compressed"] = json!(p.len());
            offset += p.len();
        }
        edit(&mut header);
        let prelude = 20 + serde_json::to_vec(&header).unwrap().len();
        if prelude == start {
            return join_as_is(&header, payloads);
        }
        start = prelude;
    }
}

fn zstd(raw: &[u8]) -> Vec<u8> {
    zstd::bulk::compress(raw, 3).unwrap()
}

fn index_of(header: &Value, name: &str) -> usize {
    header["tensors"].as_array().unwrap().iter().position(|r| r["name"] == name).unwrap()
}

const UP: &str = "model.layers.0.mlp.up_proj.weight";
const EMBED: &str = "model.embed_tokens.weight";

// ---- round trips ---------------------------------------------------------------------

#[test]
fn round_trip_is_bit_identical_and_picks_the_smaller_encoding() {
    for threads in [Some(1), Some(2), None] {
        let (base, target, changed) = model(&mut Rng(7));
        let dir = TempDir::new("delta");
        let (b, t) = (dir.file("b", &base), dir.file("t", &target));
        let (delta, out) = (dir.0.join("d"), dir.0.join("o"));
        let stats = encode(&b, &t, &delta, 3, threads).unwrap();
        apply(&b, &delta, &out, threads).unwrap();
        assert_eq!(fs::read(&out).unwrap(), target);
        assert_eq!(dir.names(), ["b", "d", "o", "t"]);

        assert_eq!(stats.target_bytes, target.len() as u64);
        assert_eq!(stats.delta_bytes, fs::metadata(&delta).unwrap().len());
        assert_eq!(stats.tensors, 10);
        assert_eq!(stats.xor_tensors + stats.sparse_tensors, 10);
        assert_eq!(stats.changed_elements, changed);
        let elements = 256 * 64 + 64 * 192 + 192 * 64 + 64 + 64 * 64 + 64 * 32 + 64 + 1 + 100;
        assert_eq!(stats.total_elements, elements);

        let info = inspect(&delta).unwrap();
        let encoding = |name: &str| info.tensors.iter().find(|r| r.name == name).unwrap().encoding;
        assert_eq!(encoding(EMBED), Encoding::Sparse);
        assert_eq!(encoding("model.layers.0.mlp.down_proj.weight"), Encoding::Sparse);
        assert_eq!(encoding("model.layers.0.input_layernorm.weight"), Encoding::Sparse);
        assert_eq!(encoding(UP), Encoding::Xor);
        assert_eq!(encoding("model.layers.0.self_attn.k_proj.weight"), Encoding::Xor);
        assert_eq!(encoding("model.norm.weight"), Encoding::Sparse);
        assert_eq!(encoding("empty"), Encoding::Sparse);
        assert_eq!(info.base_blake3, *blake3::hash(&base).as_bytes());
        assert_eq!(info.target_blake3, *blake3::hash(&target).as_bytes());
        assert_eq!(info.target_size, target.len() as u64);
        assert_eq!(info.delta_size, stats.delta_bytes);
        // File order, which is the order the data lies in.
        let names: Vec<&str> = info.tensors.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names[0], EMBED);
        assert_eq!(names[9], "packed");
        let up = info.tensors.iter().find(|r| r.name == UP).unwrap();
        let start = 8 + u64::from_le_bytes(target[..8].try_into().unwrap()) as usize;
        let up_bytes = &target[start + 256 * 64 * 2..start + 256 * 64 * 2 + 64 * 192 * 2];
        assert_eq!(up.blake3, *blake3::hash(up_bytes).as_bytes());
        assert_eq!(up.element_size, 2);
    }
}

#[test]
fn identical_files_make_a_tiny_delta() {
    let (base, _, _) = model(&mut Rng(3));
    let dir = TempDir::new("delta");
    let b = dir.file("b", &base);
    let stats = encode(&b, &b, &dir.0.join("d"), 3, None).unwrap();
    assert_eq!((stats.sparse_tensors, stats.changed_elements), (10, 0));
    assert!(stats.delta_bytes < 3000, "{stats:?}");
    apply(&b, &dir.0.join("d"), &dir.0.join("o"), None).unwrap();
    assert_eq!(fs::read(dir.0.join("o")).unwrap(), base);
}

#[test]
fn a_file_without_tensors_round_trips() {
    let dir = TempDir::new("delta");
    let empty = dir.file("b", &safetensors(&[], "x"));
    let stats = encode(&empty, &empty, &dir.0.join("d"), 3, None).unwrap();
    assert_eq!(stats.tensors, 0);
    apply(&empty, &dir.0.join("d"), &dir.0.join("o"), None).unwrap();
    assert_eq!(fs::read(dir.0.join("o")).unwrap(), fs::read(&empty).unwrap());
}

#[test]
fn a_model_of_several_windows_round_trips_and_checks_its_base_to_the_end() {
    let rng = &mut Rng(17);
    let names = ["w0", "w1", "w2", "w3", "w4", "w5"];
    let len = (WINDOW_BYTES / 3) as usize;
    let base: Vec<Tensor> = names
        .iter()
        .map(|n| Tensor {
            name: n,
            dtype: "BF16",
            shape: vec![len as u64 / 2],
            data: rng.bytes(len),
        })
        .collect();
    let mut target: Vec<Tensor> = base
        .iter()
        .map(|t| Tensor {
            name: t.name,
            dtype: t.dtype,
            shape: t.shape.clone(),
            data: t.data.clone(),
        })
        .collect();
    for t in &mut target[1..] {
        change(&mut t.data, 2, 0.001, rng);
    }
    let (base, target) = (safetensors(&base, ""), safetensors(&target, ""));
    let dir = TempDir::new("delta");
    let (b, t) = (dir.file("b", &base), dir.file("t", &target));
    let (d, o) = (dir.0.join("d"), dir.0.join("o"));
    let stats = encode(&b, &t, &d, 1, None).unwrap();
    assert_eq!(windows(&[len as u64; 6]).len(), 2);
    assert_eq!(stats.sparse_tensors, 6);
    apply(&b, &d, &o, None).unwrap();
    assert!(fs::read(&o).unwrap() == target);
    // A base wrong in its first tensor: that tensor fails its hash, and the rest
    // of the base is still hashed to tell a wrong base from a bad delta.
    let mut wrong = base.clone();
    wrong[8 + u64::from_le_bytes(base[..8].try_into().unwrap()) as usize + 5] ^= 1;
    let wrong = dir.file("wrong", &wrong);
    let err = apply(&wrong, &d, &o, Some(2)).unwrap_err();
    assert!(matches!(err, DeltaError::WrongBase { .. }), "{err}");
}

#[test]
fn windows_group_tensors_up_to_the_window_size() {
    let w = WINDOW_BYTES;
    assert_eq!(windows(&[]), Vec::<std::ops::Range<usize>>::new());
    let one = windows(&[1, 2, 3]);
    assert_eq!((one.len(), one[0].clone()), (1, 0..3));
    assert_eq!(windows(&[w, 1, w - 1, 1]), [0..1, 1..3, 3..4]);
    assert_eq!(windows(&[1, 3 * w, 1]), [0..1, 1..2, 2..3]);
    assert_eq!(windows(&[0, 0, u64::MAX, 0]), [0..2, 2..3, 3..4]);
}

// ---- what cannot be a delta ----------------------------------------------------------

#[test]
fn files_with_other_headers_cannot_be_deltas_of_each_other() {
    let rng = &mut Rng(5);
    let a = tensor("a", "BF16", &[4, 4], rng);
    let b = tensor("b", "F32", &[4], rng);
    let same = |t: &Tensor| Tensor {
        name: t.name,
        dtype: t.dtype,
        shape: t.shape.clone(),
        data: t.data.clone(),
    };
    let dir = TempDir::new("delta");
    let base = dir.file("base", &safetensors(&[same(&a), same(&b)], "m"));
    let cases: [(Vec<Tensor>, &str, &str); 5] = [
        (vec![same(&a)], "m", "tensor 'b' is only in the base"),
        (
            vec![same(&a), same(&b), tensor("c", "U8", &[3], rng)],
            "m",
            "tensor 'c' is only in the target",
        ),
        (
            vec![same(&a), Tensor { dtype: "I32", ..same(&b) }],
            "m",
            "tensor 'b' is F32 [4] in the base but I32 [4] in the target",
        ),
        (vec![same(&b), same(&a)], "m", "another order"),
        (vec![same(&a), same(&b)], "other", "differ in their metadata"),
    ];
    for (tensors, metadata, what) in cases {
        let target = dir.file("target", &safetensors(&tensors, metadata));
        let err = encode(&base, &target, &dir.0.join("d"), 3, None).unwrap_err();
        assert!(matches!(err, DeltaError::Mismatch { .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("cannot be a delta of") && msg.contains(what), "{msg}");
    }
    assert_eq!(dir.names(), ["base", "target"]);
}

#[test]
fn bad_safetensors_files_are_refused() {
    let rng = &mut Rng(9);
    let good = safetensors(&[tensor("a", "BF16", &[4], rng), tensor("b", "F32", &[2], rng)], "m");
    let n = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let with_header = |json: &str| {
        let mut f = (json.len() as u64).to_le_bytes().to_vec();
        f.extend_from_slice(json.as_bytes());
        f.extend_from_slice(&[0; 16]);
        f
    };
    let e = r#""dtype":"U8","shape":[8]"#;
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (good[..5].to_vec(), "too short for its header length"),
        ([&u64::MAX.to_le_bytes()[..], &good[8..]].concat(), "more than the 100000000 allowed"),
        (good[..n].to_vec(), "only"),
        (with_header("[1, 2]"), "not a JSON object"),
        (
            with_header(&format!(
                r#"{{"a":{{{e},"data_offsets":[0,8],"x":1}},"b":{{{e},"data_offsets":[8,16]}}}}"#
            )),
            "tensor 'a' is not described right",
        ),
        (
            with_header(&format!(
                r#"{{"a":{{{e},"data_offsets":[0,8]}},"b":{{{e},"data_offsets":[9,17]}}}}"#
            )),
            "leaves a gap",
        ),
        (
            with_header(&format!(
                r#"{{"a":{{{e},"data_offsets":[0,8]}},"b":{{{e},"data_offsets":[7,15]}}}}"#
            )),
            "overlaps",
        ),
        (
            with_header(&format!(
                r#"{{"a":{{{e},"data_offsets":[0,8]}},"b":{{{e},"data_offsets":[8,16]}},"c":{{{e},"data_offsets":[16,24]}}}}"#
            )),
            "runs past the end",
        ),
        (
            with_header(&format!(r#"{{"a":{{{e},"data_offsets":[0,8]}}}}"#)),
            "its tensors hold 8 bytes of data, but the file holds 16",
        ),
        (
            with_header(r#"{"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,16]}}"#),
            "not the 16 bytes",
        ),
        (
            with_header(
                r#"{"a":{"dtype":"BF16","shape":[4294967296, 4294967296],"data_offsets":[0,16]}}"#,
            ),
            "not the 16 bytes",
        ),
        (with_header(r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[16,0]}}"#), "end first"),
    ];
    let dir = TempDir::new("delta");
    let ok = dir.file("ok", &good);
    for (bytes, what) in cases {
        let bad = dir.file("bad", &bytes);
        for err in [
            encode(&bad, &ok, &dir.0.join("d"), 3, None).unwrap_err(),
            encode(&ok, &bad, &dir.0.join("d"), 3, None).unwrap_err(),
        ] {
            assert!(matches!(err, DeltaError::Safetensors { .. }), "{err}");
            assert!(err.to_string().contains(what), "{err} should say {what}");
        }
    }
    // An unknown dtype is bytes of size 1, any length.
    let odd = dir.file(
        "odd",
        &with_header(r#"{"a":{"dtype":"F6_E3M2","shape":[3],"data_offsets":[0,16]}}"#),
    );
    encode(&odd, &odd, &dir.0.join("d"), 3, None).unwrap();
}

#[test]
fn inputs_that_are_missing_or_not_files_are_io_errors() {
    let c = case(1);
    let missing = c.dir.0.join("missing");
    let err = encode(&missing, &c.target, &c.dir.0.join("x"), 3, None).unwrap_err();
    assert!(
        matches!(&err, DeltaError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    );
    let err = apply(&c.base, &missing, &c.out(), None).unwrap_err();
    assert!(
        matches!(&err, DeltaError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    );
    assert!(matches!(apply(&c.dir.0, &c.delta, &c.out(), None), Err(DeltaError::NotAFile(_))));
    assert!(matches!(inspect(&c.dir.0), Err(DeltaError::NotAFile(_))));
    assert!(matches!(
        apply(&c.base, &c.delta, Path::new("/"), None),
        Err(DeltaError::OutputPath(_))
    ));
    assert!(matches!(
        encode(&c.base, &c.target, &c.out(), 99, None),
        Err(DeltaError::Level { got: 99, .. })
    ));
}

// ---- applying only onto the base -----------------------------------------------------

#[test]
fn a_delta_applies_only_onto_its_base() {
    let c = case(2);
    let (_, other, _) = model(&mut Rng(3)); // same header, other bytes
    let other = c.dir.file("other", &other);
    let out = c.out();
    let err = apply(&other, &c.delta, &out, None).unwrap_err();
    assert!(matches!(err, DeltaError::WrongBase { .. }), "{err}");
    assert!(
        err.to_string().ends_with(
            "is not the delta's base: its BLAKE3 is not the base hash the delta carries"
        ),
        "{err}"
    );

    // One flipped bit in an unchanged tensor's bytes: every tensor decodes
    // and matches, only the base's hash tells.
    let mut near = fs::read(&c.base).unwrap();
    let last = near.len() - 1;
    near[last] ^= 1;
    let near = c.dir.file("near", &near);
    let err = apply(&near, &c.delta, &out, None).unwrap_err();
    assert!(matches!(err, DeltaError::WrongBase { .. }), "{err}");

    let mut longer = fs::read(&c.base).unwrap();
    longer.push(0);
    let longer = c.dir.file("longer", &longer);
    let err = apply(&longer, &c.delta, &out, None).unwrap_err();
    assert!(err.to_string().contains("bytes, but the delta's base is"), "{err}");

    let rng = &mut Rng(4);
    let fresh =
        safetensors(&[tensor("x", "U8", &[fs::metadata(&c.base).unwrap().len() - 64], rng)], "");
    let mut fresh = fresh[..fs::metadata(&c.base).unwrap().len() as usize].to_vec();
    let n = u64::from_le_bytes(fresh[..8].try_into().unwrap()) as usize;
    let json = String::from_utf8(fresh[8..8 + n].to_vec()).unwrap();
    let fixed = json.replace(
        &format!("{}]", fs::metadata(&c.base).unwrap().len() - 64),
        &format!("{}]", fresh.len() - 8 - n),
    );
    assert_eq!(fixed.len(), json.len(), "the test's header kept its length");
    fresh[8..8 + n].copy_from_slice(fixed.as_bytes());
    let fresh = c.dir.file("fresh", &fresh);
    let err = apply(&fresh, &c.delta, &out, None).unwrap_err();
    assert!(err.to_string().contains("its safetensors header is not the one"), "{err}");
    assert!(!out.exists());
}

// ---- every malformation, its own error -----------------------------------------------

fn err_of(c: &Case, bytes: &[u8]) -> DeltaError {
    let err = c.apply_bytes(bytes).unwrap_err();
    let inspected = inspect(&c.dir.0.join("mutated.delta"));
    // What inspect sees (the header and layout) it refuses the same way.
    if let Err(e) = inspected {
        assert_eq!(e.to_string(), err.to_string());
    }
    err
}

#[test]
fn structural_damage_is_named() {
    let c = case(11);
    let good = fs::read(&c.delta).unwrap();
    let (header, payloads) = split(&good);
    let last =
        header["tensors"].as_array().unwrap().last().unwrap()["name"].as_str().unwrap().to_owned();

    let err = err_of(&c, &good[..good.len() - 3]);
    assert_eq!(
        err.to_string(),
        format!("the delta is truncated: tensor '{last}' needs 3 bytes past its end")
    );
    let err = err_of(&c, &good[..12]);
    assert_eq!(err.to_string(), "the delta is truncated: its preamble needs 8 bytes past its end");
    let err = err_of(&c, &good[..100]);
    assert!(
        matches!(err, DeltaError::Truncated { .. }) && err.to_string().contains("its header needs"),
        "{err}"
    );
    assert!(matches!(err_of(&c, b"SRLDELT"), DeltaError::Truncated { .. }));
    assert!(matches!(err_of(&c, b""), DeltaError::Truncated { .. }));
    assert!(matches!(err_of(&c, b"PK\x03\x04 not a delta at all"), DeltaError::NotADelta));

    let mut v3 = good.clone();
    v3[8] = 3;
    assert_eq!(
        err_of(&c, &v3).to_string(),
        "the delta is format version 3; this build reads version 2"
    );
    let mut huge = good.clone();
    huge[12..20].copy_from_slice(&(MAX_HEADER + 1).to_le_bytes());
    assert!(matches!(err_of(&c, &huge), DeltaError::HeaderTooLarge(_)));

    let mut extra = good.clone();
    extra.extend_from_slice(b"junk");
    assert_eq!(err_of(&c, &extra).to_string(), "the delta has 4 bytes after its last payload");

    let mut not_json = good.clone();
    not_json[20] = b'[';
    assert!(matches!(err_of(&c, &not_json), DeltaError::BadHeader(_)));

    let edit = |f: &dyn Fn(&mut Value)| {
        let mut h = header.clone();
        f(&mut h);
        join(&h, &payloads)
    };
    let up = index_of(&header, UP);
    let err = err_of(&c, &edit(&|h| h["admin"] = json!(true)));
    assert!(matches!(err, DeltaError::BadHeader(_)) && err.to_string().contains("admin"), "{err}");
    let err = err_of(&c, &edit(&|h| h["tensors"][up]["encoding"] = json!("rle\nERROR forged")));
    assert_eq!(
        err.to_string(),
        format!("tensor '{UP}' has encoding 'rle\\nERROR forged', which this build does not know")
    );
    let err = err_of(&c, &edit(&|h| h["tensors"][up]["element_size"] = json!(3)));
    assert!(matches!(err, DeltaError::ElementSize { size: 3, .. }), "{err}");
    let err = err_of(&c, &edit(&|h| h["tensors"][up]["element_size"] = json!(0)));
    assert!(matches!(err, DeltaError::ElementSize { size: 0, .. }), "{err}");
    let err = err_of(&c, &edit(&|h| h["base_blake3"] = json!("xyz")));
    assert_eq!(
        err.to_string(),
        "the delta's header is not valid: base_blake3 is not 64 hex digits"
    );
    let err = err_of(&c, &edit(&|h| h["target_size"] = json!(5)));
    assert!(matches!(err, DeltaError::Sizes { target_size: 5, .. }), "{err}");

    // Payload positions and lengths, changed after the layout.
    let laid_out = |f: &dyn Fn(&mut Value)| join_then(&header, &payloads, f);
    let offset = |h: &Value| h["tensors"][up]["offset"].as_u64().unwrap();
    let err = err_of(&c, &laid_out(&|h| h["tensors"][up]["offset"] = json!(offset(h) - 1)));
    assert!(matches!(err, DeltaError::PayloadOverlap { .. }), "{err}");
    let err = err_of(&c, &laid_out(&|h| h["tensors"][up]["offset"] = json!(offset(h) + 1)));
    assert!(matches!(err, DeltaError::PayloadGap { .. }), "{err}");
    let err = err_of(&c, &laid_out(&|h| h["tensors"][up]["compressed"] = json!(u64::MAX)));
    assert!(matches!(err, DeltaError::PayloadTooLarge { .. }), "{err}");
    let length = header["tensors"][up]["length"].as_u64().unwrap();
    let err = err_of(&c, &laid_out(&|h| h["tensors"][up]["compressed"] = json!(length * 2)));
    assert!(matches!(err, DeltaError::PayloadTooLarge { .. }), "{err}");
    // Longer than it is: the next payload then starts inside it.
    let n = payloads[up].len();
    let err = err_of(&c, &laid_out(&|h| h["tensors"][up]["compressed"] = json!(n + 10)));
    assert!(matches!(err, DeltaError::PayloadOverlap { .. }), "{err}");
    let grown = |h: &mut Value| {
        let n = h["tensors"][9]["compressed"].as_u64().unwrap();
        h["tensors"][9]["compressed"] = json!(n + 5);
    };
    let err = err_of(&c, &laid_out(&grown));
    assert_eq!(
        err.to_string(),
        format!("the delta is truncated: tensor '{last}' needs 5 bytes past its end")
    );
}

#[test]
fn a_record_table_that_is_not_the_bases_is_refused() {
    let c = case(12);
    let (header, payloads) = split(&fs::read(&c.delta).unwrap());
    let edit = |f: &dyn Fn(&mut Value)| {
        let mut h = header.clone();
        f(&mut h);
        join(&h, &payloads)
    };
    let up = index_of(&header, UP);
    let err = err_of(&c, &edit(&|h| h["tensors"][up]["name"] = json!("renamed")));
    assert_eq!(err.to_string(), format!("the delta's record table disagrees with the base's safetensors header: record {up} is tensor 'renamed', where the base has '{UP}'"));
    // Two lengths moved by the same amount keep the sizes adding up.
    let embed = index_of(&header, EMBED);
    let err = err_of(
        &c,
        &edit(&|h| {
            let l = h["tensors"][embed]["length"].as_u64().unwrap();
            h["tensors"][embed]["length"] = json!(l + 2);
            let l = h["tensors"][up]["length"].as_u64().unwrap();
            h["tensors"][up]["length"] = json!(l - 2);
        }),
    );
    assert!(
        err.to_string()
            .contains(&format!("tensor '{EMBED}' is 32768 bytes in the base, 32770 in the delta")),
        "{err}"
    );
    let err = err_of(&c, &edit(&|h| h["tensors"][up]["element_size"] = json!(1)));
    assert!(err.to_string().contains("2-byte elements in the base, 1-byte in the delta"), "{err}");
    // One record fewer, its bytes given to another: the sizes still add up.
    let (mut h, mut p) = (header.clone(), payloads.clone());
    let l = h["tensors"].as_array_mut().unwrap().pop().unwrap()["length"].as_u64().unwrap();
    p.pop();
    h["tensors"][embed]["length"] = json!(h["tensors"][embed]["length"].as_u64().unwrap() + l);
    let err = err_of(&c, &join(&h, &p));
    assert!(err.to_string().ends_with("the base has 10 tensors, the delta records 9"), "{err}");
}

#[test]
fn damaged_payloads_are_named() {
    let c = case(13);
    let (header, payloads) = split(&fs::read(&c.delta).unwrap());
    let up = index_of(&header, UP); // xor, 64 * 192 bf16
    let embed = index_of(&header, EMBED); // sparse, 256 * 64 bf16
    let with = |i: usize, encoding: &str, payload: Vec<u8>| {
        let mut h = header.clone();
        h["tensors"][i]["encoding"] = json!(encoding);
        let mut p = payloads.clone();
        p[i] = payload;
        join(&h, &p)
    };
    let length = 64 * 192 * 2;
    let err = err_of(&c, &with(up, "xor", b"not zstd at all".to_vec()));
    assert!(matches!(err, DeltaError::Zstd { .. }), "{err}");
    let err = err_of(&c, &with(up, "xor", zstd(&vec![0; length + 1])));
    assert_eq!(
        err.to_string(),
        format!("tensor '{UP}''s payload decompresses to more than the {length} bytes it may hold")
    );
    // A frame that does not declare its size is stopped at the cap all the same.
    let mut streamed = Vec::new();
    let mut encoder = zstd::stream::write::Encoder::new(&mut streamed, 3).unwrap();
    std::io::Write::write_all(&mut encoder, &vec![0; 10 * length]).unwrap();
    encoder.finish().unwrap();
    let err = err_of(&c, &with(up, "xor", streamed));
    assert!(matches!(err, DeltaError::Oversize { .. }), "{err}");
    let err = err_of(&c, &with(up, "xor", zstd(&vec![0; length - 2])));
    assert!(matches!(err, DeltaError::XorLength { got, .. } if got == length as u64 - 2), "{err}");
    let err = err_of(&c, &with(up, "sparse", zstd(&vec![0; length + 11])));
    assert!(matches!(err, DeltaError::Oversize { cap, .. } if cap == length as u64 + 10), "{err}");

    let elements = 256 * 64u64;
    let sparse = |raw: &[u8]| with(embed, "sparse", zstd(raw));
    let err = err_of(&c, &sparse(&[0x80]));
    assert!(matches!(err, DeltaError::Varint { .. }), "{err}");
    let err = err_of(&c, &sparse(&[2, 0, 0x80]));
    assert!(matches!(err, DeltaError::Varint { .. }), "{err}");
    let err = err_of(&c, &sparse(&[0xff; 11]));
    assert!(matches!(err, DeltaError::Varint { .. }), "{err}");
    let mut count = Vec::new();
    codec_varint(&mut count, elements + 1);
    let err = err_of(&c, &sparse(&count));
    assert!(matches!(err, DeltaError::SparseCount { .. }), "{err}");
    let mut past = vec![2, 5];
    codec_varint(&mut past, elements - 6); // 5, then 5 + 1 + (elements - 6) = elements
    past.extend_from_slice(&[1, 2, 3, 4]);
    let err = err_of(&c, &sparse(&past));
    assert_eq!(
        err.to_string(),
        format!("tensor '{EMBED}''s sparse gaps run past its {elements} elements")
    );
    let mut overflow = vec![2, 5];
    codec_varint(&mut overflow, u64::MAX);
    let err = err_of(&c, &sparse(&overflow));
    assert!(matches!(err, DeltaError::SparseRange { .. }), "{err}");
    let err = err_of(&c, &sparse(&[1, 0, 9]));
    assert_eq!(err.to_string(), format!("tensor '{EMBED}''s sparse payload holds 1 bytes of changed values, but 1 changes of 2 bytes need 2"));
    let err = err_of(&c, &sparse(&[1, 0, 9, 9, 9]));
    assert!(matches!(err, DeltaError::SparseValues { got: 3, .. }), "{err}");

    // Well-formed but wrong: a valid payload of other bytes.
    let err = err_of(&c, &sparse(&[1, 0, 9, 9]));
    assert_eq!(
        err.to_string(),
        format!("tensor '{EMBED}' does not match its BLAKE3 after applying the delta")
    );
    let mut h = header.clone();
    h["target_blake3"] = json!("00".repeat(32));
    let err = err_of(&c, &join(&h, &payloads));
    assert!(matches!(err, DeltaError::TargetHash), "{err}");
    let mut h = header.clone();
    h["base_blake3"] = json!("00".repeat(32));
    let err = err_of(&c, &join(&h, &payloads));
    assert!(matches!(err, DeltaError::WrongBase { .. }), "{err}");
    // Untouched, the same bytes still apply.
    c.apply_bytes(&join(&header, &payloads)).unwrap();
}

fn codec_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[test]
fn error_messages_quote_names_safely() {
    assert_eq!(quoted("a\nb'c"), "'a\\nb\\'c'");
    let long = "x".repeat(200);
    assert_eq!(quoted(&long), format!("'{}...'", "x".repeat(80)));
    assert_eq!(quoted("é"), "'é'");
}

// ---- fuzz ------------------------------------------------------------------------------

fn record(encoding: Encoding, element_size: u64, length: u64) -> Record {
    Record {
        name: "t".into(),
        encoding,
        element_size,
        length,
        offset: 0,
        compressed: 0,
        blake3: [0; 32],
    }
}

/// The payload layout `format.rs` documents, decoded by hand-made payloads:
/// both encodings hold XORs with the base as byte planes, low bytes first.
#[test]
fn payloads_are_xors_in_byte_planes() {
    // Three 2-byte elements; the base's bytes are 10, 11, 20, 21, 30, 31.
    let base = [10u8, 11, 20, 21, 30, 31];
    // xor: plane 0 (each element's byte 0), then plane 1.
    let xor = zstd(&[1, 2, 3, 4, 5, 6]);
    let out = decode_tensor(&record(Encoding::Xor, 2, 6), &base, &xor).unwrap();
    assert_eq!(out, [10 ^ 1, 11 ^ 4, 20 ^ 2, 21 ^ 5, 30 ^ 3, 31 ^ 6]);
    // sparse: two changes (elements 0 and 2: gaps 0 and 1), then their planes.
    let sparse = zstd(&[2, 0, 1, 7, 8, 0, 9]);
    let out = decode_tensor(&record(Encoding::Sparse, 2, 6), &base, &sparse).unwrap();
    assert_eq!(out, [10 ^ 7, 11, 20, 21, 30 ^ 8, 31 ^ 9]);
    // And the encoder writes what the decoder reads: the same changes in a
    // tensor long enough for sparse to be the smaller encoding.
    let (mut long_base, mut long_target) = (vec![0u8; 2048], vec![0u8; 2048]);
    long_base[..6].copy_from_slice(&base);
    long_target[..6].copy_from_slice(&out);
    let encoded = encode_tensor("t", &long_base, &long_target, 2, 3).unwrap();
    assert_eq!(encoded.encoding, Encoding::Sparse);
    assert_eq!(zstd::bulk::decompress(&encoded.payload, 64).unwrap(), [2, 0, 1, 7, 8, 0, 9]);
}

/// A base, and a target with some elements changed.
fn base_and_target() -> impl Strategy<Value = (Vec<u8>, Vec<u8>, usize)> {
    (prop::sample::select(vec![1usize, 2, 4, 8]), 0usize..300)
        .prop_flat_map(|(size, elements)| {
            let n = size * elements;
            (
                prop::collection::vec(any::<u8>(), n),
                prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..=n.min(64)),
                Just(size),
            )
        })
        .prop_map(|(base, edits, size)| {
            let mut target = base.clone();
            for (at, value) in edits {
                if !target.is_empty() {
                    let i = at.index(target.len());
                    target[i] = value;
                }
            }
            (base, target, size)
        })
}

/// A mutation of a valid delta: bits flipped, bytes cut out or inserted, the
/// end cut off or extended.
#[derive(Debug, Clone)]
enum Mutation {
    Flip(prop::sample::Index, u8),
    Cut(prop::sample::Index, usize),
    Insert(prop::sample::Index, Vec<u8>),
    Truncate(prop::sample::Index),
    Extend(Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<prop::sample::Index>(), 0u8..8).prop_map(|(i, b)| Mutation::Flip(i, b)),
        1 => (any::<prop::sample::Index>(), 1usize..16).prop_map(|(i, n)| Mutation::Cut(i, n)),
        1 => (any::<prop::sample::Index>(), prop::collection::vec(any::<u8>(), 1..8)).prop_map(|(i, b)| Mutation::Insert(i, b)),
        1 => any::<prop::sample::Index>().prop_map(Mutation::Truncate),
        1 => prop::collection::vec(any::<u8>(), 1..8).prop_map(Mutation::Extend),
    ]
}

fn mutate(bytes: &mut Vec<u8>, m: &Mutation) {
    if bytes.is_empty() {
        return;
    }
    match m {
        Mutation::Flip(i, bit) => {
            let i = i.index(bytes.len());
            bytes[i] ^= 1 << bit;
        }
        Mutation::Cut(i, n) => {
            let i = i.index(bytes.len());
            bytes.drain(i..(i + n).min(bytes.len()));
        }
        Mutation::Insert(i, b) => {
            let i = i.index(bytes.len());
            bytes.splice(i..i, b.iter().copied());
        }
        Mutation::Truncate(i) => bytes.truncate(i.index(bytes.len())),
        Mutation::Extend(b) => bytes.extend_from_slice(b),
    }
}

proptest! {
    #[test]
    fn tensors_round_trip_through_either_encoding((base, target, size) in base_and_target(), level in -5i32..=5) {
        let encoded = encode_tensor("t", &base, &target, size, level).unwrap();
        let r = record(encoded.encoding, size as u64, base.len() as u64);
        prop_assert_eq!(decode_tensor(&r, &base, &encoded.payload).unwrap(), target.clone());
        let changed = base.chunks(size).zip(target.chunks(size)).filter(|(a, b)| a != b).count();
        prop_assert_eq!(encoded.changed, changed as u64);
        if changed == 0 {
            prop_assert_eq!(encoded.encoding, Encoding::Sparse);
        }
    }

    #[test]
    fn fuzz_payloads_decode_within_their_cap_or_fail(
        payload in prop::collection::vec(any::<u8>(), 0..200),
        raw in prop::collection::vec(any::<u8>(), 0..200),
        size in prop::sample::select(vec![1u64, 2, 4, 8]),
        elements in 0u64..64,
        sparse in any::<bool>(),
    ) {
        let encoding = if sparse { Encoding::Sparse } else { Encoding::Xor };
        let r = record(encoding, size, size * elements);
        let base = vec![7u8; (size * elements) as usize];
        for p in [payload, zstd(&raw)] {
            if let Ok(out) = decode_tensor(&r, &base, &p) {
                prop_assert_eq!(out.len(), base.len());
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    // The fuzz target of a delta from the network: whatever is done to a
    // valid delta ends in an error that leaves `out` alone, or in the exact
    // target (a mutation that changes nothing the format reads).
    #[test]
    fn fuzz_mutated_deltas_apply_exactly_or_fail(mutations in prop::collection::vec(mutation(), 1..4)) {
        thread_local! { static CASE: Case = case(21); }
        CASE.with(|c| {
            let mut bytes = fs::read(&c.delta).unwrap();
            for m in &mutations {
                mutate(&mut bytes, m);
            }
            let _ = c.apply_bytes(&bytes);
        });
    }

    #[test]
    fn fuzz_random_bytes_are_refused(bytes in prop::collection::vec(any::<u8>(), 0..512), magic in any::<bool>()) {
        thread_local! { static CASE: Case = case(22); }
        CASE.with(|c| {
            let mut bytes = bytes.clone();
            if magic {
                bytes.splice(0..0, b"SRLDELTA\x01\0\0\0".iter().copied());
            }
            assert!(c.apply_bytes(&bytes).is_err());
        });
    }
}
