//! Top-k selection of bf16 values by magnitude.
//!
//! Clearing a bf16's sign bit leaves a 15-bit integer that orders the values by
//! absolute value (NaNs above infinities, as torch orders them), so the whole
//! selection runs on integers. Ties are broken towards the lower index, which
//! makes the selected set a pure function of the input.

/// Pass one splits the values into this many interleaved groups (value `i`
/// belongs to group `i mod GROUPS`) and takes each group's largest magnitude:
/// a vertical maximum over rows of `GROUPS` values, which the compiler turns
/// into plain SIMD with no horizontal reductions.
const GROUPS: usize = 2048;

/// Pass two tests blocks of this many values at once for any candidate.
const BLOCK: usize = 16;

/// Group maxima are bucketed by their top 12 bits (of 15) to find a threshold.
const BUCKET_SHIFT: u32 = 3;

#[inline(always)]
fn magnitude(bits: u16) -> u16 {
    bits & 0x7FFF
}

/// A candidate packed so that the natural `u64` order is (magnitude desc,
/// index asc) when sorted descending: magnitude in the high half, inverted
/// index in the low half.
#[inline(always)]
fn pack(mag: u16, index: usize) -> u64 {
    ((mag as u64) << 32) | (u32::MAX - index as u32) as u64
}

#[inline(always)]
fn unpack_index(packed: u64) -> usize {
    (u32::MAX - packed as u32) as usize
}

/// A magnitude that the k-th largest value is sure to reach.
///
/// The k largest group maxima are k distinct values, so the k-th largest value
/// is at least the k-th largest group maximum, and so at least the lower edge
/// of the bucket that maximum falls in. With fewer than k groups there is no
/// such bound and every value is a candidate.
#[inline(always)]
fn kth_lower_bound(values: &[u16], k: usize) -> u16 {
    let groups = GROUPS.min(values.len() / 4);
    if groups < k {
        return 0;
    }
    let mut maxima = vec![0u16; groups];
    for row in values.chunks(groups) {
        for (m, &v) in maxima.iter_mut().zip(row) {
            *m = (*m).max(magnitude(v));
        }
    }
    let mut counts = [0u32; 1 << (15 - BUCKET_SHIFT)];
    for &m in &maxima {
        counts[usize::from(m >> BUCKET_SHIFT)] += 1;
    }
    let mut seen = 0;
    for bucket in (0..counts.len()).rev() {
        seen += counts[bucket] as usize;
        if seen >= k {
            return (bucket as u16) << BUCKET_SHIFT;
        }
    }
    0
}

/// Appends every value whose magnitude reaches `threshold`, packed.
#[inline(always)]
fn collect_run(base: usize, run: &[u16], threshold: u16, out: &mut Vec<u64>) {
    for (i, &v) in run.iter().enumerate() {
        if magnitude(v) >= threshold {
            out.push(pack(magnitude(v), base + i));
        }
    }
}

#[inline(always)]
fn collect_portable(values: &[u16], threshold: u16, out: &mut Vec<u64>) {
    let mut blocks = values.chunks_exact(BLOCK);
    for (b, block) in blocks.by_ref().enumerate() {
        if block.iter().fold(false, |hit, &v| hit | (magnitude(v) >= threshold)) {
            collect_run(b * BLOCK, block, threshold, out);
        }
    }
    collect_run(values.len() - blocks.remainder().len(), blocks.remainder(), threshold, out);
}

/// The same scan with explicit AVX2: 64 values per step are compared at once
/// and only steps holding a candidate look at single values, through the
/// comparison's bit mask.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn collect_avx2(values: &[u16], threshold: u16, out: &mut Vec<u64>) {
    use std::arch::x86_64::*;
    const STEP: usize = 64;
    // Magnitudes fit in i16, so a signed compare against threshold - 1 is >=.
    let below = _mm256_set1_epi16(threshold as i16 - 1);
    let mask = _mm256_set1_epi16(0x7FFF);
    let mut steps = values.chunks_exact(STEP);
    for (s, step) in steps.by_ref().enumerate() {
        let ptr = step.as_ptr() as *const __m256i;
        // SAFETY: `step` holds exactly 64 u16 = four unaligned 256-bit loads.
        let hits: [__m256i; 4] = std::array::from_fn(|j| unsafe {
            _mm256_cmpgt_epi16(_mm256_and_si256(_mm256_loadu_si256(ptr.add(j)), mask), below)
        });
        let any =
            _mm256_or_si256(_mm256_or_si256(hits[0], hits[1]), _mm256_or_si256(hits[2], hits[3]));
        if _mm256_testz_si256(any, any) == 1 {
            continue;
        }
        for (j, hit) in hits.iter().enumerate() {
            // Two mask bits per 16-bit lane; keep the low one of each pair.
            let mut bits = (_mm256_movemask_epi8(*hit) as u32) & 0x5555_5555;
            while bits != 0 {
                let lane = bits.trailing_zeros() as usize / 2;
                let index = s * STEP + j * 16 + lane;
                out.push(pack(magnitude(values[index]), index));
                bits &= bits - 1;
            }
        }
    }
    collect_run(values.len() - steps.remainder().len(), steps.remainder(), threshold, out);
}

/// Indices of the `k` values of largest magnitude in `values` (in no
/// particular order). Requires `1 <= k <= values.len()` and fewer than 2^32
/// values. Inlined so that it is compiled along with its AVX2 callers.
///
/// Two passes: one bounds the k-th largest magnitude from below (see
/// [`kth_lower_bound`]); the other collects the values that reach the bound,
/// typically a few hundred of the 131072 in a 32 x 4096 chunk, and the best k
/// of those are selected.
#[inline(always)]
pub fn top_k_indices(values: &[u16], k: usize) -> Vec<usize> {
    assert!(k >= 1 && k <= values.len() && values.len() < u32::MAX as usize);
    let threshold = kth_lower_bound(values, k);

    let mut candidates: Vec<u64> = Vec::with_capacity(4 * k);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        unsafe { collect_avx2(values, threshold, &mut candidates) };
    } else {
        collect_portable(values, threshold, &mut candidates);
    }
    #[cfg(not(target_arch = "x86_64"))]
    collect_portable(values, threshold, &mut candidates);

    if candidates.len() > k {
        candidates.select_nth_unstable_by(k - 1, |a, b| b.cmp(a));
        candidates.truncate(k);
    }
    candidates.into_iter().map(unpack_index).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The obviously correct version: sort everything.
    fn naive(values: &[u16], k: usize) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..values.len()).collect();
        idx.sort_by_key(|&i| (std::cmp::Reverse(magnitude(values[i])), i));
        idx.truncate(k);
        idx.sort_unstable();
        idx
    }

    fn sorted(mut v: Vec<usize>) -> Vec<usize> {
        v.sort_unstable();
        v
    }

    #[test]
    fn sign_is_ignored_and_ties_go_to_lower_index() {
        // -2.0 (0xC000) beats 1.5 (0x3FC0); the two 1.0s (0x3F80) tie.
        let v = [0x3F80, 0xC000, 0x3FC0, 0xBF80, 0x0000];
        assert_eq!(sorted(top_k_indices(&v, 3)), vec![0, 1, 2]);
        assert_eq!(sorted(top_k_indices(&v, 4)), vec![0, 1, 2, 3]);
    }

    #[test]
    fn all_zeros_pick_the_first_k() {
        let v = vec![0u16; 1000];
        assert_eq!(sorted(top_k_indices(&v, 7)), (0..7).collect::<Vec<_>>());
    }

    proptest! {
        #[test]
        fn matches_a_full_sort(values in prop::collection::vec(any::<u16>(), 1..3000), k in 1usize..300) {
            let k = k.min(values.len());
            prop_assert_eq!(sorted(top_k_indices(&values, k)), naive(&values, k));
        }

        #[test]
        fn portable_and_simd_scans_agree(values in prop::collection::vec(any::<u16>(), 0..700), threshold in any::<u16>()) {
            let threshold = threshold & 0x7FFF;
            let mut portable = Vec::new();
            collect_portable(&values, threshold, &mut portable);
            prop_assert!(portable.iter().all(|&p| (p >> 32) as u16 >= threshold));
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                let mut simd = Vec::new();
                // SAFETY: the CPU has AVX2, checked just above.
                unsafe { collect_avx2(&values, threshold, &mut simd) };
                prop_assert_eq!(simd, portable);
            }
        }

        #[test]
        fn matches_a_full_sort_with_many_ties(values in prop::collection::vec(0u16..4, 1..3000), k in 1usize..300) {
            let k = k.min(values.len());
            prop_assert_eq!(sorted(top_k_indices(&values, k)), naive(&values, k));
        }
    }
}
