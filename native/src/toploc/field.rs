//! Arithmetic in GF(65497), the field TOPLOC interpolates over.
//!
//! Every element is below 2^16, so `a * b + c` of three elements still fits in
//! a `u32` and needs one reduction. Reductions are Barrett (a multiply and a
//! shift, no division) and the loops run over slices without dependencies
//! between elements, so the compiler vectorises them; [`crate::toploc`]
//! compiles them a second time for AVX2 and picks one at run time.

use std::sync::OnceLock;

/// The prime toploc chose: the field is GF(65497).
pub const P: u32 = 65_497;

/// floor(2^47 / P): below 2^32, so `v * M` is one 32x32->64 multiply.
const BARRETT_M: u64 = (1 << 47) / P as u64;

/// `v mod P` for any `v: u32`. The quotient estimate is at most one short,
/// so one conditional subtraction finishes it (written as a `min` of the two
/// candidates: the wrong one wraps around to a huge value).
#[inline(always)]
pub fn reduce(v: u32) -> u32 {
    let q = ((u64::from(v) * BARRETT_M) >> 47) as u32;
    let r = v.wrapping_sub(q.wrapping_mul(P));
    r.min(r.wrapping_sub(P))
}

/// `a - b mod P` for `a, b < P`.
#[inline(always)]
pub fn sub(a: u32, b: u32) -> u32 {
    let d = a.wrapping_sub(b);
    d.min(d.wrapping_add(P))
}

/// `a * b + c mod P` for `a, b, c < P` (the sum stays below 2^32).
#[inline(always)]
pub fn mul_add(a: u32, b: u32, c: u32) -> u32 {
    reduce(a * b + c)
}

/// `inv(a)` for every `a` in 1..P (index 0 holds 0, which has no inverse).
///
/// Built with the recurrence inv(i) = -(P / i) * inv(P mod i): 65k steps once
/// per process, after which each of the ~8k inversions that a 128-point
/// interpolation needs is a table load.
/// Stored as `u16` to halve its cache footprint (128 KiB).
pub fn inverses() -> &'static [u16] {
    static TABLE: OnceLock<Vec<u16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut inv = vec![0u16; P as usize];
        inv[1] = 1;
        for i in 2..P {
            let v = sub(0, mul_add(P / i, u32::from(inv[(P % i) as usize]), 0));
            inv[i as usize] = v as u16;
        }
        inv
    })
}

/// Coefficients (lowest power first) of the unique polynomial of degree < n
/// through the n points `(xs[i], ys[i] mod P)`; `xs` must be distinct and
/// below `P`.
///
/// Newton's divided differences, then the Newton form expanded into monomials
/// by multiplying out `(x - xs[i])` from the innermost term: n²/2
/// multiply-adds in each pass. Each pass writes a fresh buffer from the
/// previous one, which keeps its inner loop free of dependencies.
#[inline(always)]
pub fn interpolate(xs: &[u32], ys: &[u32]) -> Vec<u32> {
    let n = xs.len();
    assert_eq!(n, ys.len());
    if n == 0 {
        return Vec::new();
    }
    let inv = inverses();
    let mut dd: Vec<u32> = ys.iter().map(|&y| reduce(y)).collect();
    let mut next = dd.clone();
    let mut den = vec![0u32; n];
    for k in 1..n {
        for i in k..n {
            den[i] = u32::from(inv[sub(xs[i], xs[i - k]) as usize]);
        }
        for i in k..n {
            next[i] = mul_add(sub(dd[i], dd[i - 1]), den[i], 0);
        }
        dd[k..].copy_from_slice(&next[k..]);
    }

    let mut coeffs = vec![0u32; n];
    let mut prev = vec![0u32; n];
    coeffs[0] = dd[n - 1];
    for i in (0..n - 1).rev() {
        let neg_x = sub(0, xs[i]);
        let deg = n - 1 - i;
        prev[..deg].copy_from_slice(&coeffs[..deg]);
        // coeffs <- coeffs * (x - xs[i]) + dd[i]
        coeffs[deg] = prev[deg - 1];
        for j in 1..deg {
            coeffs[j] = mul_add(neg_x, prev[j], prev[j - 1]);
        }
        coeffs[0] = mul_add(neg_x, prev[0], dd[i]);
    }
    coeffs
}

/// Evaluates the polynomial (lowest power first) at every `xs[i]` (each below
/// `P`) into `out[i]`: Horner's rule, run for all points in step.
#[inline(always)]
pub fn evaluate_many(coeffs: &[u32], xs: &[u32], out: &mut [u32]) {
    assert_eq!(xs.len(), out.len());
    out.fill(0);
    for &c in coeffs.iter().rev() {
        for (acc, &x) in out.iter_mut().zip(xs) {
            *acc = mul_add(*acc, x, c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn inverse_table_is_correct() {
        let inv = inverses();
        for a in 1..P {
            assert_eq!(
                u64::from(a) * u64::from(inv[a as usize]) % u64::from(P),
                1,
                "inverse of {a}"
            );
        }
    }

    #[test]
    fn interpolation_passes_through_its_points() {
        let xs = [0, 5, 65_496, 17, 1000];
        let ys = [1, 65_496, 3, 0, 42];
        let c = interpolate(&xs, &ys);
        let mut out = [0; 5];
        evaluate_many(&c, &xs, &mut out);
        assert_eq!(out, ys);
        assert_eq!(interpolate(&[7], &[9]), vec![9]);
    }

    proptest! {
        #[test]
        fn reduce_is_remainder(v in any::<u32>()) {
            prop_assert_eq!(reduce(v), v % P);
        }

        #[test]
        fn sub_and_mul_add_match_wide_arithmetic(a in 0..P, b in 0..P, c in 0..P) {
            prop_assert_eq!(sub(a, b), ((u64::from(a) + u64::from(P) - u64::from(b)) % u64::from(P)) as u32);
            let wide = (u64::from(a) * u64::from(b) + u64::from(c)) % u64::from(P);
            prop_assert_eq!(mul_add(a, b, c), wide as u32);
        }
    }
}
