//! Properties of build + verify over arbitrary inputs, and the guarantee that
//! untrusted proof bytes never panic the verifier.

use super::*;
use proptest::prelude::*;

fn acts(data: &[u16], width: usize) -> Activations<'_> {
    Activations::new(data, data.len() / width, width).unwrap()
}

#[test]
fn rejects_bad_parameters_with_errors() {
    let data = vec![0x3F80u16; 64];
    let a = acts(&data, 8);
    assert_eq!(build_proofs(a, 0, 4, None), Err(ToplocError::ZeroChunk));
    assert_eq!(build_proofs(a, 2, 0, None), Err(ToplocError::TopK(0)));
    assert_eq!(build_proofs(a, 2, 70_000, None), Err(ToplocError::TopK(70_000)));
    // 8 rows in chunks of 3: the last chunk has 2 rows = 16 values.
    assert_eq!(
        build_proofs(a, 3, 17, None),
        Err(ToplocError::ChunkTooSmall { index: 2, values: 16, topk: 17 })
    );
    assert_eq!(
        build_proofs(a, 3, 25, None),
        Err(ToplocError::ChunkTooSmall { index: 0, values: 24, topk: 25 })
    );
    assert!(matches!(Activations::new(&data, 9, 8), Err(ToplocError::Shape { .. })));
    assert_eq!(Activations::new(&[], 3, 0).unwrap_err(), ToplocError::NoColumns);
    assert_eq!(
        verify_proofs(a, &[None], 4, 4, None),
        Err(ToplocError::ProofCount { expected: 2, got: 1, rows: 8, chunk: 4 })
    );
}

#[test]
fn missing_and_malformed_proofs_are_rejected_not_skipped() {
    let data: Vec<u16> = (0..256u32).map(|i| (0x3F00 + i * 3) as u16).collect();
    let a = acts(&data, 16);
    let good = build_proofs(a, 4, 8, Some(1)).unwrap();
    let bytes: Vec<Vec<u8>> = good.iter().map(Proof::to_bytes).collect();
    let null = vec![0u8; 18];
    let proofs: Vec<Option<&[u8]>> = vec![Some(&bytes[0]), None, Some(&null), Some(&bytes[3][..5])];
    let verdicts = verify_proofs(a, &proofs, 4, 8, None).unwrap();
    let accepted: Vec<bool> = verdicts.iter().map(|v| v.accepted).collect();
    assert_eq!(accepted, vec![true, false, false, false]);
    assert_eq!(verdicts[1].discrepancy, Discrepancy::total(8));
}

#[test]
fn thread_counts_agree() {
    let data: Vec<u16> =
        (0..64 * 512u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 16) as u16).collect();
    let a = acts(&data, 512);
    let one = build_proofs(a, 4, 64, Some(1)).unwrap();
    assert_eq!(build_proofs(a, 4, 64, Some(2)).unwrap(), one);
    assert_eq!(build_proofs(a, 4, 64, Some(3)).unwrap(), one);
    assert_eq!(build_proofs(a, 4, 64, None).unwrap(), one);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn honest_proofs_verify_exactly(
        data in prop::collection::vec(any::<u16>(), 64..2048),
        width in 1usize..64,
        chunk in 1usize..8,
        topk in 1usize..32,
    ) {
        let rows = data.len() / width;
        let data = &data[..rows * width];
        let a = Activations::new(data, rows, width).unwrap();
        match build_proofs(a, chunk, topk, None) {
            Ok(proofs) => {
                let bytes: Vec<Vec<u8>> = proofs.iter().map(Proof::to_bytes).collect();
                let refs: Vec<Option<&[u8]>> = bytes.iter().map(|b| Some(b.as_slice())).collect();
                for v in verify_proofs(a, &refs, chunk, topk, None).unwrap() {
                    // Byte patterns at or above the field prime are NaNs that
                    // reduce modulo P; every other value must come back exactly.
                    prop_assert!(v.discrepancy.exp_mismatches == 0 || data.iter().any(|&x| u32::from(x) >= FIELD_PRIME));
                }
            }
            Err(ToplocError::ChunkTooSmall { .. }) => prop_assert!(chunk * width < topk || rows % chunk * width < topk),
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }

    #[test]
    fn arbitrary_proof_bytes_never_panic(
        data in prop::collection::vec(any::<u16>(), 256),
        proof in prop::collection::vec(any::<u8>(), 0..64),
        modulus in any::<u16>(),
    ) {
        let a = Activations::new(&data, 16, 16).unwrap();
        // Raw garbage, and garbage of the right length behind any modulus.
        let mut shaped = modulus.to_be_bytes().to_vec();
        shaped.extend(proof.iter().copied().cycle().take(2 * 8));
        for p in [&proof, &shaped] {
            let v = verify_proofs(a, &[Some(p.as_slice())], 16, 8, None).unwrap();
            prop_assert_eq!(v.len(), 1);
            let d = v[0].discrepancy;
            prop_assert!(d.exp_mismatches <= 8);
            prop_assert!(d.mant_err_mean >= 0.0 && d.mant_err_median >= 0.0);
        }
    }
}

/// A proof's bytes with a few of them replaced, cut out or appended: damage that
/// gets past the length check as often as not.
fn damaged(honest: &[u8], edits: &[(usize, u8, u8)]) -> Vec<u8> {
    let mut bytes = honest.to_vec();
    for &(at, value, kind) in edits {
        let at = at % (bytes.len() + 1);
        match kind % 3 {
            0 if at < bytes.len() => bytes[at] = value,
            1 if at < bytes.len() => {
                bytes.remove(at);
            }
            _ => bytes.insert(at, value),
        }
    }
    bytes
}

// The fuzz targets of the trust suite (`benchmarks/trust_fuzz.py` runs them with
// PROPTEST_CASES set; `cargo test` runs the default 256 cases): untrusted proof
// bytes end in a parsed proof or a ProofFormatError, never a panic.
proptest! {
    #[test]
    fn fuzz_proof_parse(
        bytes in prop::collection::vec(any::<u8>(), 0..600),
        topk in 0usize..300,
        data in prop::collection::vec(any::<u16>(), 128),
        edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..6),
    ) {
        let honest = proof::prove_chunk(&data, 16).to_bytes();
        for (candidate, k) in [(bytes, topk), (damaged(&honest, &edits), 16)] {
            if let Ok(p) = Proof::parse(&candidate, k) {
                // Whatever parses is the one encoding of a well-formed proof.
                prop_assert_eq!(p.coeffs.len(), k);
                prop_assert!(p.modulus as usize >= k && p.modulus <= FIELD_PRIME);
                prop_assert_eq!(p.to_bytes(), candidate);
            }
        }
    }

    #[test]
    fn fuzz_verify_proofs(
        data in prop::collection::vec(any::<u16>(), 64..1024),
        width in 1usize..32,
        chunk in 1usize..6,
        topk in 1usize..24,
        garbage in prop::collection::vec(prop::option::of(prop::collection::vec(any::<u8>(), 0..64)), 0..6),
        edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..4),
        pick in any::<prop::sample::Index>(),
    ) {
        let rows = data.len() / width;
        let a = Activations::new(&data[..rows * width], rows, width).unwrap();
        let Ok(honest) = build_proofs(a, chunk, topk, Some(1)) else { return Ok(()) };
        let mut proofs: Vec<Option<Vec<u8>>> = honest.iter().map(|p| Some(p.to_bytes())).collect();
        let i = pick.index(proofs.len());
        proofs[i] = Some(damaged(&honest[i].to_bytes(), &edits));
        // The honest count with one damaged proof, then arbitrary garbage of any count.
        for candidate in [proofs, garbage] {
            let refs: Vec<Option<&[u8]>> = candidate.iter().map(|p| p.as_deref()).collect();
            match verify_proofs(a, &refs, chunk, topk, Some(1)) {
                Ok(verdicts) => {
                    prop_assert_eq!(verdicts.len(), honest.len());
                    for (v, p) in verdicts.iter().zip(&refs) {
                        prop_assert!(v.discrepancy.exp_mismatches <= topk);
                        if p.is_none_or(|b| b.len() != 2 + 2 * topk) {
                            prop_assert!(!v.accepted);
                        }
                    }
                }
                Err(ToplocError::ProofCount { expected, got, .. }) => {
                    prop_assert_eq!(expected, honest.len());
                    prop_assert_ne!(got, expected);
                }
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
        }
    }
}
