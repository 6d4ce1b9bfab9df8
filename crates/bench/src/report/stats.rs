//! Order statistics behind every published figure: one median, one percentile.
//!
//! Definitions (the only ones in the benchmarks):
//! - **median**: the middle value of the finite samples, the mean of the two middle values for
//!   an even count ([`median`]); NaNs and infinities (failed runs) are left out.
//! - **percentile**: nearest rank over sorted samples ([`percentile_sorted`]), so a p99 is a
//!   latency that was really observed.
//! - **median run**: where a report keeps a whole run (every figure of a point from one run),
//!   the run the median is taken from ([`median_run`]): the middle run, or for an even count
//!   the lower of the two middles.

/// The `percent`-th percentile of an ascending slice by the nearest-rank method: the smallest
/// value such that at least `percent`% of the samples are ≤ it. `None` for an empty slice.
///
/// Nearest rank (rather than interpolation) always returns a latency that was really observed,
/// which is what a p99 in a pooler comparison should mean.
pub fn percentile_sorted(sorted: &[u64], percent: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    debug_assert!(sorted.windows(2).all(|pair| pair[0] <= pair[1]), "percentile input must be sorted");
    let percent = percent.clamp(0.0, 100.0);
    // The small slack keeps binary rounding (99.9 / 100 * 1000 = 999.0000000000001) from
    // bumping an exact rank to the next sample.
    let rank = (percent / 100.0 * sorted.len() as f64 - 1e-9).ceil() as usize;
    let index = rank.saturating_sub(1).min(sorted.len() - 1);
    Some(sorted[index])
}

/// The median of `values` (mean of the two middle values for an even count); `None` when empty.
/// NaNs are ignored, so one broken run cannot poison a cell.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut finite: Vec<f64> = values.iter().copied().filter(|value| value.is_finite()).collect();
    if finite.is_empty() {
        return None;
    }
    finite.sort_by(f64::total_cmp);
    let middle = finite.len() / 2;
    if finite.len() % 2 == 1 {
        Some(finite[middle])
    } else {
        Some((finite[middle - 1] + finite[middle]) / 2.0)
    }
}

/// The index into `items` of the median run by `key`: the middle of the finite keys, or for an
/// even count the lower of the two middles [`median`] averages (equal keys keep input order);
/// `None` when no key is finite. A report that keeps whole runs shows this one.
pub fn median_run<T>(items: &[T], key: impl Fn(&T) -> f64) -> Option<usize> {
    let mut finite: Vec<usize> = (0..items.len()).filter(|&index| key(&items[index]).is_finite()).collect();
    finite.sort_by(|&a, &b| key(&items[a]).total_cmp(&key(&items[b])));
    finite.get(finite.len().checked_sub(1)? / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: nearest-rank percentiles match the textbook definition; method: 1..=100 and edges.
    #[test]
    fn percentile_nearest_rank() {
        let values: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile_sorted(&values, 50.0), Some(50));
        assert_eq!(percentile_sorted(&values, 99.0), Some(99));
        assert_eq!(percentile_sorted(&values, 99.9), Some(100));
        let thousand: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile_sorted(&thousand, 99.9), Some(999));
        assert_eq!(percentile_sorted(&values, 100.0), Some(100));
        assert_eq!(percentile_sorted(&values, 0.0), Some(1));
        assert_eq!(percentile_sorted(&[7], 99.0), Some(7));
        assert_eq!(percentile_sorted(&[], 50.0), None);
        // Four samples: p50 is the 2nd, p51 the 3rd.
        assert_eq!(percentile_sorted(&[10, 20, 30, 40], 50.0), Some(20));
        assert_eq!(percentile_sorted(&[10, 20, 30, 40], 51.0), Some(30));
    }

    // Goal: medians of odd and even counts, NaN skipped; method: literal inputs.
    #[test]
    fn median_odd_even_and_nan() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 5.0]), Some(5.0));
        assert_eq!(median(&[]), None);
    }

    // Goal: the median run is the middle one for odd counts and the lower middle for even
    // counts, whatever the input order; method: literal keys.
    #[test]
    fn median_run_is_the_middle_or_lower_middle() {
        assert_eq!(median_run(&[5.0, 1.0, 3.0], |v| *v), Some(2));
        assert_eq!(median_run(&[4.0, 1.0, 3.0, 2.0], |v| *v), Some(3), "lower middle of 1 2 3 4 is 2");
        assert_eq!(median_run(&[1.0, 1.0, 9.0, 10.0], |v| *v), Some(1), "equal keys keep input order");
        assert_eq!(median_run(&[f64::NAN, 7.0], |v| *v), Some(1));
        assert_eq!(median_run::<f64>(&[], |v| *v), None);
    }
}
