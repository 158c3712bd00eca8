use std::fs;
use std::path::Path;

use proptest::prelude::*;

use super::*;
use crate::test_dir::TempDir;

const MIB: usize = 1 << 20;

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

/// Deterministic bytes that differ from shard to shard.
fn data(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect()
}

fn reference_hashes(data: &[u8], shard_size: usize) -> Vec<Hash> {
    data.chunks(shard_size).map(|c| *blake3::hash(c).as_bytes()).collect()
}

fn expected_for(data: &[u8], shard_size: usize) -> Expected {
    let hashes = reference_hashes(data, shard_size);
    let root = merkle_root(&hashes).unwrap();
    Expected::new(Layout::new(data.len() as u64, shard_size as u64).unwrap(), hashes, root).unwrap()
}

fn tagged(tag: u8, parts: &[&[u8]]) -> Hash {
    let mut h = blake3::Hasher::new();
    h.update(&[tag]);
    parts.iter().for_each(|p| {
        h.update(p);
    });
    *h.finalize().as_bytes()
}

#[test]
fn layout_cuts_the_file() {
    let l = Layout::new(10, 4).unwrap();
    assert_eq!(l.count(), 3);
    assert_eq!(l.range(0).unwrap(), (0, 4));
    assert_eq!(l.range(2).unwrap(), (8, 2));
    assert!(matches!(l.range(3), Err(ShardError::Index { index: 3, count: 3 })));
    assert_eq!(Layout::new(8, 4).unwrap().range(1).unwrap(), (4, 4));
    assert_eq!(Layout::new(1, MAX_SHARD_SIZE).unwrap().count(), 1);
    assert!(matches!(Layout::new(8, 0), Err(ShardError::ShardSize(0))));
    assert!(matches!(Layout::new(8, MAX_SHARD_SIZE + 1), Err(ShardError::ShardSize(_))));
    assert!(matches!(Layout::new(0, 4), Err(ShardError::ZeroFileSize)));
}

#[test]
fn expected_checks_count_and_root() {
    let hashes = reference_hashes(&data(10), 4);
    let layout = Layout::new(10, 4).unwrap();
    let root = merkle_root(&hashes).unwrap();
    assert!(Expected::new(layout, hashes.clone(), root).is_ok());
    let err = Expected::new(layout, hashes[..2].to_vec(), root).unwrap_err();
    assert!(matches!(err, ShardError::HashCount { expected: 3, got: 2 }));
    assert!(matches!(Expected::new(layout, hashes, [0; 32]), Err(ShardError::Root)));
}

#[test]
fn shard_hash_is_blake3_on_any_thread_count() {
    let bytes = data(3 * MIB + 17);
    let want = *blake3::hash(&bytes).as_bytes();
    for threads in [None, Some(0), Some(1), Some(2), Some(3)] {
        assert_eq!(hash_shard(&bytes, threads).unwrap(), want);
    }
    assert_eq!(hash_shard(b"", Some(1)).unwrap(), *blake3::hash(b"").as_bytes());
}

#[test]
fn verify_shard_checks_range_length_and_hash() {
    let bytes = data(10);
    let layout = Layout::new(10, 4).unwrap();
    let h = *blake3::hash(&bytes[8..]).as_bytes();
    verify_shard(layout, 2, &bytes[8..], &h, None).unwrap();
    assert!(matches!(
        verify_shard(layout, 3, &bytes[8..], &h, None),
        Err(ShardError::Index { .. })
    ));
    let err = verify_shard(layout, 2, &bytes[7..], &h, None).unwrap_err();
    assert!(matches!(err, ShardError::ShardLength { index: 2, got: 3, expected: 2 }));
    let err = verify_shard(layout, 2, &[0, 0], &h, None).unwrap_err();
    assert!(matches!(err, ShardError::ShardHash { index: 2 }));
}

#[test]
fn merkle_root_known_answers() {
    let h: Vec<Hash> = (0..3u8).map(|i| *blake3::hash(&[i]).as_bytes()).collect();
    let leaf = |x: &Hash| tagged(0, &[x]);
    let node = |l: &Hash, r: &Hash| tagged(1, &[l, r]);
    assert_eq!(merkle_root(&h[..1]).unwrap(), leaf(&h[0]));
    let two = node(&leaf(&h[0]), &leaf(&h[1]));
    assert_eq!(merkle_root(&h[..2]).unwrap(), two);
    assert_eq!(merkle_root(&h).unwrap(), node(&two, &leaf(&h[2])));
    assert!(matches!(merkle_root(&[]), Err(ShardError::NoShards)));
}

#[test]
fn hash_file_matches_reference_across_block_boundaries() {
    let tmp = TempDir::new("shards");
    let bytes = data(9 * MIB + 3);
    let path = tmp.file("model.bin", &bytes);
    for shard_size in [1 << 10, MIB, 4 * MIB, 5 * MIB + 1, 8 * MIB, 16 * MIB] {
        for threads in [Some(1), None] {
            let (hashes, size) = hash_file(&path, shard_size as u64, threads).unwrap();
            assert_eq!(size, bytes.len() as u64);
            assert_eq!(hashes, reference_hashes(&bytes, shard_size), "shard size {shard_size}");
        }
    }
}

#[test]
fn hash_file_rejects_what_is_not_a_checkpoint() {
    let tmp = TempDir::new("shards");
    let empty = tmp.file("empty.bin", b"");
    assert!(matches!(hash_file(&empty, 4, None), Err(ShardError::EmptyFile(_))));
    assert!(matches!(hash_file(&tmp.0, 4, None), Err(ShardError::NotAFile(_))));
    let missing = tmp.0.join("nope.bin");
    let err = hash_file(&missing, 4, None).unwrap_err();
    assert!(
        matches!(&err, ShardError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    );
    assert!(err.to_string().contains("nope.bin"), "{err}");
    let one = tmp.file("one.bin", b"x");
    assert!(matches!(hash_file(&one, 0, None), Err(ShardError::ShardSize(0))));
}

#[test]
fn split_names_shards_and_reassemble_restores_the_file() {
    let tmp = TempDir::new("shards");
    let bytes = data(5 * MIB + 7);
    let src = tmp.file("model.bin", &bytes);
    let expected = expected_for(&bytes, 2 * MIB);
    let store = tmp.dir("store");
    split(&src, &store, &expected, None).unwrap();
    assert_eq!(names(&store), ["000000.shard", "000001.shard", "000002.shard"]);
    assert_eq!(fs::read(store.join("000002.shard")).unwrap(), &bytes[4 * MIB..]);
    let out = tmp.0.join("out.bin");
    reassemble(&store, &expected, &out, Some(2)).unwrap();
    assert_eq!(fs::read(&out).unwrap(), bytes);
    assert_eq!(missing_shards(&store, &expected, None).unwrap(), Vec::<u64>::new());
}

#[test]
fn split_refuses_a_file_that_is_not_the_expected_one() {
    let tmp = TempDir::new("shards");
    let bytes = data(100);
    let expected = expected_for(&bytes, 30);
    let store = tmp.dir("store");
    let mut other = bytes.clone();
    other[65] ^= 1;
    let src = tmp.file("other.bin", &other);
    let err = split(&src, &store, &expected, None).unwrap_err();
    assert!(matches!(err, ShardError::ShardHash { index: 2 }), "{err}");
    // The two good shards before it are kept; nothing else is.
    assert_eq!(names(&store), ["000000.shard", "000001.shard"]);
    let short = tmp.file("short.bin", &bytes[..99]);
    let err = split(&short, &store, &expected, None).unwrap_err();
    assert!(matches!(err, ShardError::FileSize { got: 99, expected: 100, .. }), "{err}");
}

#[test]
fn reassemble_names_the_bad_shard_and_leaves_nothing() {
    let tmp = TempDir::new("shards");
    let bytes = data(1000);
    let expected = expected_for(&bytes, 300);
    let store = tmp.dir("store");
    split(&tmp.file("model.bin", &bytes), &store, &expected, None).unwrap();
    let out_dir = tmp.dir("out");
    let out = out_dir.join("model.bin");

    let third = store.join(shard_file_name(2));
    let mut corrupt = fs::read(&third).unwrap();
    corrupt[299] ^= 0x80;
    fs::write(&third, &corrupt).unwrap();
    let err = reassemble(&store, &expected, &out, None).unwrap_err();
    assert!(matches!(err, ShardError::ShardHash { index: 2 }), "{err}");
    assert!(names(&out_dir).is_empty());
    assert_eq!(missing_shards(&store, &expected, None).unwrap(), [2]);

    fs::write(&third, &corrupt[..250]).unwrap();
    let err = reassemble(&store, &expected, &out, None).unwrap_err();
    assert!(matches!(err, ShardError::ShardLength { index: 2, got: 250, expected: 300 }));
    assert!(names(&out_dir).is_empty());

    fs::remove_file(&third).unwrap();
    fs::remove_file(store.join(shard_file_name(0))).unwrap();
    let err = reassemble(&store, &expected, &out, None).unwrap_err();
    assert!(matches!(err, ShardError::MissingShard { index: 0, .. }), "{err}");
    assert!(err.to_string().contains("000000.shard"), "{err}");
    assert!(names(&out_dir).is_empty());
    assert_eq!(missing_shards(&store, &expected, None).unwrap(), [0, 2]);
}

#[test]
fn reassemble_rejects_an_output_path_without_a_name() {
    let tmp = TempDir::new("shards");
    let bytes = data(10);
    let expected = expected_for(&bytes, 4);
    let store = tmp.dir("store");
    split(&tmp.file("m.bin", &bytes), &store, &expected, None).unwrap();
    let err = reassemble(&store, &expected, Path::new("/"), None).unwrap_err();
    assert!(matches!(err, ShardError::OutputPath(_)), "{err}");
}

#[test]
fn store_shard_keeps_only_verified_shards() {
    let tmp = TempDir::new("shards");
    let bytes = data(10);
    let expected = expected_for(&bytes, 4);
    let layout = expected.layout();
    let store = tmp.dir("store");
    let h = *expected.hash(1).unwrap();
    let err = store_shard(&store, layout, 1, &bytes[..4], &h, None).unwrap_err();
    assert!(matches!(err, ShardError::ShardHash { index: 1 }));
    assert!(names(&store).is_empty());
    let path = store_shard(&store, layout, 1, &bytes[4..8], &h, None).unwrap();
    assert_eq!(path, store.join("000001.shard"));
    assert_eq!(fs::read(&path).unwrap(), &bytes[4..8]);
    assert_eq!(missing_shards(&store, &expected, None).unwrap(), [0, 2]);
}

/// Data and a shard size cutting it into at most 20 shards (every shard is a
/// synced file, so many shards make a slow case).
fn data_and_shard_size() -> impl Strategy<Value = (Vec<u8>, usize)> {
    (prop::collection::vec(any::<u8>(), 1..2048), 1usize..=20).prop_map(|(d, count)| {
        let size = d.len().div_ceil(count);
        (d, size)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn split_then_reassemble_round_trips((bytes, shard_size) in data_and_shard_size(),
                                         threads in prop::sample::select(vec![None, Some(1), Some(2)])) {
        let tmp = TempDir::new("shards");
        let src = tmp.file("model.bin", &bytes);
        let (hashes, size) = hash_file(&src, shard_size as u64, threads).unwrap();
        prop_assert_eq!(size, bytes.len() as u64);
        prop_assert_eq!(&hashes, &reference_hashes(&bytes, shard_size));
        let root = merkle_root(&hashes).unwrap();
        let expected = Expected::new(Layout::new(size, shard_size as u64).unwrap(), hashes, root).unwrap();
        let store = tmp.dir("store");
        split(&src, &store, &expected, threads).unwrap();
        let out = tmp.0.join("out.bin");
        reassemble(&store, &expected, &out, threads).unwrap();
        prop_assert_eq!(fs::read(&out).unwrap(), bytes);
    }

    #[test]
    fn root_changes_when_any_leaf_changes(
        hashes in prop::collection::vec(any::<Hash>(), 1..40),
        pick in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        let root = merkle_root(&hashes).unwrap();
        let mut changed = hashes.clone();
        let i = pick.index(hashes.len());
        changed[i][i % 32] ^= 1 << bit;
        prop_assert_ne!(merkle_root(&changed).unwrap(), root);
        // Neither dropping the last leaf nor repeating it keeps the root.
        if hashes.len() > 1 {
            prop_assert_ne!(merkle_root(&hashes[..hashes.len() - 1]).unwrap(), root);
        }
        let mut longer = hashes.clone();
        longer.push(hashes[hashes.len() - 1]);
        prop_assert_ne!(merkle_root(&longer).unwrap(), root);
    }

    #[test]
    fn inclusion_proofs_verify_and_only_for_their_shard(
        hashes in prop::collection::vec(any::<Hash>(), 1..40),
        pick in any::<prop::sample::Index>(),
    ) {
        let root = merkle_root(&hashes).unwrap();
        let n = hashes.len() as u64;
        let i = pick.index(hashes.len());
        let proof = inclusion_proof(&hashes, i as u64).unwrap();
        prop_assert!(proof.len() <= 6);
        verify_inclusion(&root, n, i as u64, &hashes[i], &proof).unwrap();
        let mut wrong = hashes[i];
        wrong[0] ^= 1;
        prop_assert!(verify_inclusion(&root, n, i as u64, &wrong, &proof).is_err());
        if n > 1 {
            let other = (i + 1) % hashes.len();
            prop_assert!(verify_inclusion(&root, n, other as u64, &hashes[i], &proof).is_err());
            prop_assert!(verify_inclusion(&root, n, i as u64, &hashes[i], &proof[1..]).is_err());
        }
        let mut longer = proof.clone();
        longer.push([0; 32]);
        prop_assert!(verify_inclusion(&root, n, i as u64, &hashes[i], &longer).is_err());
        prop_assert!(verify_inclusion(&root, n, n, &hashes[i], &proof).is_err());
    }
}

// The fuzz targets of the trust suite (`benchmarks/trust_fuzz.py` runs them with
// PROPTEST_CASES set; `cargo test` runs the default 256 cases): what a manifest
// or a peer claims (sizes, counts, indexes, hashes, proofs, shard bytes) ends in
// a verdict or a ShardError, never a panic, an overflow or a huge allocation.
proptest! {
    #[test]
    fn fuzz_shard_claims(
        file_size in any::<u64>(),
        shard_size in prop_oneof![any::<u64>(), 0u64..=4096, Just(MAX_SHARD_SIZE), Just(MAX_SHARD_SIZE + 1)],
        index in prop_oneof![any::<u64>(), 0u64..8],
        hashes in prop::collection::vec(any::<Hash>(), 0..8),
        data in prop::collection::vec(any::<u8>(), 0..2048),
    ) {
        let Ok(layout) = Layout::new(file_size, shard_size) else { return Ok(()) };
        prop_assert!(layout.count() >= 1);
        if let Ok((offset, len)) = layout.range(index) {
            prop_assert!(index < layout.count());
            prop_assert!(len >= 1 && len <= shard_size && offset.checked_add(len).is_some_and(|end| end <= file_size));
        }
        if let Ok(root) = merkle_root(&hashes) {
            if let Ok(expected) = Expected::new(layout, hashes.clone(), root) {
                prop_assert_eq!(expected.layout().count(), hashes.len() as u64);
                if let Ok(h) = expected.hash(index) {
                    if verify_shard(layout, index, &data, h, Some(1)).is_ok() {
                        prop_assert_eq!(hash_shard(&data, Some(1)).unwrap(), *h);
                    }
                }
            }
        }
    }

    #[test]
    fn fuzz_inclusion_proofs(
        hashes in prop::collection::vec(any::<Hash>(), 1..24),
        count in prop_oneof![any::<u64>(), 0u64..32],
        index in prop_oneof![any::<u64>(), 0u64..32],
        claimed in any::<Hash>(),
        pick in any::<prop::sample::Index>(),
        extra in prop::collection::vec(any::<Hash>(), 0..70),
        cut in 0usize..8,
    ) {
        let root = merkle_root(&hashes).unwrap();
        let i = pick.index(hashes.len());
        let honest = inclusion_proof(&hashes, i as u64).unwrap();
        let n = hashes.len() as u64;
        // A damaged honest proof, then claims of any count and index with any siblings.
        let mut shortened = honest.clone();
        shortened.truncate(honest.len().saturating_sub(cut));
        for (c, idx, leaf, proof) in [
            (n, i as u64, hashes[i], shortened),
            (count, index, claimed, extra),
            (count, index, hashes[i], honest.clone()),
        ] {
            if verify_inclusion(&root, c, idx, &leaf, &proof).is_ok() {
                prop_assert!(idx < c);
                prop_assert!(proof.len() <= 64);
            }
        }
    }
}
