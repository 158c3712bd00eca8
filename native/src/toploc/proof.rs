//! One TOPLOC proof: the polynomial through a chunk's top-k activations.
//!
//! Wire format (toploc 0.1.6): `[modulus: u16 BE][c_0 .. c_{k-1}: u16 BE]`,
//! coefficients lowest power first. The polynomial maps `index mod modulus` to
//! the bf16 bits of the activation at that flat index of the chunk.

use super::field::{self, P};
use super::topk::top_k_indices;

/// Why a proof's bytes cannot be a proof for the expected `topk`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofFormatError {
    #[error("proof is {got} bytes, expected {expected} (2 + 2 x topk)")]
    Length { got: usize, expected: usize },
    #[error("proof modulus {0} is outside [topk, {P}]")]
    Modulus(u32),
    #[error("proof coefficient {0} is not below the field prime {P}")]
    Coefficient(u32),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proof {
    pub modulus: u32,
    pub coeffs: Vec<u32>,
}

impl Proof {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(2 + 2 * self.coeffs.len());
        out.extend_from_slice(&(self.modulus as u16).to_be_bytes());
        for &c in &self.coeffs {
            out.extend_from_slice(&(c as u16).to_be_bytes());
        }
        out
    }

    /// Parses untrusted bytes, insisting on everything an honest prover
    /// produces: exactly `topk` coefficients, each a field element, and a
    /// modulus that could be injective on `topk` distinct indices.
    pub fn parse(bytes: &[u8], topk: usize) -> Result<Self, ProofFormatError> {
        let expected = 2 + 2 * topk;
        if bytes.len() != expected {
            return Err(ProofFormatError::Length { got: bytes.len(), expected });
        }
        let mut words = bytes.chunks_exact(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])));
        let modulus = words.next().expect("length checked");
        if (modulus as usize) < topk || modulus > P {
            return Err(ProofFormatError::Modulus(modulus));
        }
        let coeffs: Vec<u32> = words.collect();
        if let Some(&bad) = coeffs.iter().find(|&&c| c >= P) {
            return Err(ProofFormatError::Coefficient(bad));
        }
        Ok(Proof { modulus, coeffs })
    }
}

/// The largest modulus `m <= P` under which the indices stay distinct, as the
/// reference chooses it. Indices below `m` are distinct already, so the usual
/// answer is found on the first try.
fn injective_modulus(indices: &[usize]) -> Option<u32> {
    let mut seen = vec![0u64; (P as usize).div_ceil(64)];
    (1..=P).rev().find(|&m| {
        let mut injective = true;
        for &i in indices {
            let r = i % m as usize;
            let (word, bit) = (r / 64, 1u64 << (r % 64));
            if seen[word] & bit != 0 {
                injective = false;
                break;
            }
            seen[word] |= bit;
        }
        for &i in indices {
            let r = i % m as usize;
            seen[r / 64] = 0;
        }
        injective
    })
}

/// The proof for one chunk (its activations flattened row-major).
///
/// Callers guarantee `1 <= topk <= chunk.len()` and `topk <= P`.
pub fn prove_chunk(chunk: &[u16], topk: usize) -> Proof {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { prove_chunk_avx2(chunk, topk) };
    }
    prove_chunk_portable(chunk, topk)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn prove_chunk_avx2(chunk: &[u16], topk: usize) -> Proof {
    prove_chunk_portable(chunk, topk)
}

#[inline(always)]
fn prove_chunk_portable(chunk: &[u16], topk: usize) -> Proof {
    let indices = top_k_indices(chunk, topk);
    let modulus = injective_modulus(&indices).expect("topk <= P distinct indices always fit");
    let xs: Vec<u32> = indices.iter().map(|&i| (i % modulus as usize) as u32).collect();
    let ys: Vec<u32> = indices.iter().map(|&i| u32::from(chunk[i])).collect();
    Proof { modulus, coeffs: field::interpolate(&xs, &ys) }
}

/// How far a chunk's own top-k is from what a proof claims it was.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Discrepancy {
    /// Top-k positions whose bf16 exponent differs from the proof's value.
    pub exp_mismatches: usize,
    /// Mean |mantissa difference| over the positions whose exponent matched.
    pub mant_err_mean: f64,
    /// Upper median of the same differences (the reference's choice).
    pub mant_err_median: f64,
}

impl Discrepancy {
    /// What a missing or malformed proof earns: nothing matched.
    pub fn total(topk: usize) -> Self {
        Discrepancy {
            exp_mismatches: topk,
            mant_err_mean: f64::INFINITY,
            mant_err_median: f64::INFINITY,
        }
    }
}

/// Compares a chunk against its proof the way the reference's production
/// verifier does: recompute the top-k, evaluate the proof at each index (mod
/// the proof's modulus) and compare exponent and mantissa bits; the sign bit
/// is not compared.
pub fn check_chunk(chunk: &[u16], proof: &Proof, topk: usize) -> Discrepancy {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { check_chunk_avx2(chunk, proof, topk) };
    }
    check_chunk_portable(chunk, proof, topk)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn check_chunk_avx2(chunk: &[u16], proof: &Proof, topk: usize) -> Discrepancy {
    check_chunk_portable(chunk, proof, topk)
}

#[inline(always)]
fn check_chunk_portable(chunk: &[u16], proof: &Proof, topk: usize) -> Discrepancy {
    let indices = top_k_indices(chunk, topk);
    let xs: Vec<u32> = indices.iter().map(|&i| (i % proof.modulus as usize) as u32).collect();
    let mut claimed = vec![0u32; topk];
    field::evaluate_many(&proof.coeffs, &xs, &mut claimed);

    let mut mismatches = 0;
    let mut errs: Vec<u32> = Vec::with_capacity(topk);
    for (&i, &claim) in indices.iter().zip(&claimed) {
        let actual = u32::from(chunk[i]);
        if (claim >> 7) & 0xFF != (actual >> 7) & 0xFF {
            mismatches += 1;
        } else {
            errs.push((claim & 0x7F).abs_diff(actual & 0x7F));
        }
    }
    if errs.is_empty() {
        return Discrepancy::total(topk);
    }
    errs.sort_unstable();
    let mean = errs.iter().map(|&e| f64::from(e)).sum::<f64>() / errs.len() as f64;
    Discrepancy {
        exp_mismatches: mismatches,
        mant_err_mean: mean,
        mant_err_median: f64::from(errs[errs.len() / 2]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modulus_skips_colliding_values() {
        // 100 and 65_597 collide modulo 65_497; 65_496 is the first that separates them.
        assert_eq!(injective_modulus(&[100, 65_597]), Some(65_496));
        assert_eq!(injective_modulus(&[3, 65_496]), Some(P));
    }

    #[test]
    fn proof_round_trips_through_bytes() {
        let chunk: Vec<u16> = (0..500u32).map(|i| (i * 7919 % 65_536) as u16).collect();
        let proof = prove_chunk(&chunk, 16);
        let bytes = proof.to_bytes();
        assert_eq!(bytes.len(), 34);
        assert_eq!(Proof::parse(&bytes, 16), Ok(proof.clone()));
        let d = check_chunk(&chunk, &proof, 16);
        assert_eq!(d.exp_mismatches, 0);
        assert_eq!(d.mant_err_mean, 0.0);
    }

    #[test]
    fn parse_rejects_what_no_honest_prover_sends() {
        assert_eq!(
            Proof::parse(&[0xff, 0xd9, 0, 1], 2),
            Err(ProofFormatError::Length { got: 4, expected: 6 })
        );
        assert_eq!(Proof::parse(&[0, 0, 0, 1, 0, 2], 2), Err(ProofFormatError::Modulus(0)));
        assert_eq!(
            Proof::parse(&[0xff, 0xff, 0, 1, 0, 2], 2),
            Err(ProofFormatError::Modulus(65_535))
        );
        assert_eq!(
            Proof::parse(&[0xff, 0xd9, 0xff, 0xff, 0, 2], 2),
            Err(ProofFormatError::Coefficient(65_535))
        );
    }
}
