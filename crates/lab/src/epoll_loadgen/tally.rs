//! What one worker counted, and the merge of all workers' counts into the report's figures.

use std::time::Duration;

use hdrhistogram::Histogram;

use super::{LoadError, Phase};

/// The longest latency the histogram records; a slower transaction is recorded as this.
pub const LATENCY_NS_MAX: u64 = 60_000_000_000;
/// Error texts kept per worker and per run; more are only counted.
pub const ERROR_SAMPLES_MAX: usize = 16;

/// One worker's counts.
#[derive(Debug, Clone)]
pub struct Tally {
    /// Latencies of the successful transactions completed in the measured window.
    pub latency_ns: Histogram<u64>,
    pub latency_sum_ns: u128,
    /// The slowest successful transaction of any phase: one that waited through the whole
    /// window (a starved client) shows here, not in the window's histogram.
    pub slowest_ns: u64,
    /// Completed in the measured window: successful, and answered with an error.
    pub window_transactions: u64,
    pub window_failed: u64,
    /// Completed in any phase.
    pub total_transactions: u64,
    pub total_failed: u64,
    /// Clients that logged in.
    pub connected: usize,
    /// Clients whose query was still unanswered at the drain deadline.
    pub unfinished: usize,
    /// Clients lost to an error (connect, login, protocol, I/O).
    pub errors: u64,
    pub error_samples: Vec<String>,
    /// The worker thread's CPU time over its whole life.
    pub cpu_total_ns: u64,
}

impl Tally {
    pub fn new() -> Tally {
        Tally {
            latency_ns: Histogram::new_with_max(LATENCY_NS_MAX, 3).expect("3 significant digits are valid"),
            latency_sum_ns: 0,
            slowest_ns: 0,
            window_transactions: 0,
            window_failed: 0,
            total_transactions: 0,
            total_failed: 0,
            connected: 0,
            unfinished: 0,
            errors: 0,
            error_samples: Vec::new(),
            cpu_total_ns: 0,
        }
    }

    /// Counts a transaction that ended with ReadyForQuery after `latency`.
    pub fn complete(&mut self, latency: Duration, failed: bool, phase: Phase) {
        let measured = phase == Phase::Measure;
        if failed {
            self.total_failed += 1;
            self.window_failed += u64::from(measured);
            return;
        }
        self.total_transactions += 1;
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX).min(LATENCY_NS_MAX);
        self.slowest_ns = self.slowest_ns.max(nanos);
        if measured {
            self.window_transactions += 1;
            self.latency_sum_ns += u128::from(nanos);
            self.latency_ns.saturating_record(nanos);
        }
    }

    /// Keeps the text of a transaction's ErrorResponse (the transaction counts as failed when
    /// its ReadyForQuery arrives).
    pub fn failure(&mut self, error: LoadError) {
        self.sample(format!("failed transaction: {error}"));
    }

    /// Counts a client lost to `text`.
    pub fn error(&mut self, text: String) {
        self.errors += 1;
        self.sample(text);
    }

    fn sample(&mut self, text: String) {
        if self.error_samples.len() < ERROR_SAMPLES_MAX {
            self.error_samples.push(text);
        }
    }

    /// Adds another worker's counts.
    pub fn merge(&mut self, other: Tally) {
        self.latency_ns.add(&other.latency_ns).expect("histograms share their bounds");
        self.latency_sum_ns += other.latency_sum_ns;
        self.slowest_ns = self.slowest_ns.max(other.slowest_ns);
        self.window_transactions += other.window_transactions;
        self.window_failed += other.window_failed;
        self.total_transactions += other.total_transactions;
        self.total_failed += other.total_failed;
        self.connected += other.connected;
        self.unfinished += other.unfinished;
        self.errors += other.errors;
        self.cpu_total_ns += other.cpu_total_ns;
        for text in other.error_samples {
            self.sample(text);
        }
    }

    /// Mean latency of the window's successful transactions, in µs (0 without any).
    pub fn mean_us(&self) -> f64 {
        match self.window_transactions {
            0 => 0.0,
            count => self.latency_sum_ns as f64 / count as f64 / 1_000.0,
        }
    }

    /// A latency percentile (0 < quantile ≤ 1) of the window, in µs.
    pub fn quantile_us(&self, quantile: f64) -> f64 {
        self.latency_ns.value_at_quantile(quantile) as f64 / 1_000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: only the measured window's successful transactions carry latencies, failures are
    // counted apart, and a merge adds everything; method: transactions in each phase.
    #[test]
    fn counts_by_phase_and_merges() {
        let mut first = Tally::new();
        first.complete(Duration::from_millis(900), false, Phase::Warmup);
        first.complete(Duration::from_micros(100), false, Phase::Measure);
        first.complete(Duration::from_micros(300), false, Phase::Measure);
        first.complete(Duration::from_micros(5), true, Phase::Measure);
        first.complete(Duration::from_micros(5), false, Phase::Stop);
        let mut second = Tally::new();
        second.complete(Duration::from_secs(3_600), false, Phase::Measure);
        second.error("client 3: closed".into());
        first.merge(second);
        assert_eq!((first.window_transactions, first.window_failed), (3, 1));
        assert_eq!((first.total_transactions, first.total_failed), (5, 1));
        assert_eq!((first.errors, first.error_samples.len()), (1, 1));
        assert_eq!(first.latency_ns.len(), 3);
        assert_eq!(first.slowest_ns, LATENCY_NS_MAX, "the clamped hour, from any phase");
        let mut warm = Tally::new();
        warm.complete(Duration::from_millis(900), false, Phase::Cooldown);
        assert_eq!((warm.slowest_ns, warm.latency_ns.len()), (900_000_000, 0));
        assert!((first.quantile_us(1.0) - 60_000_000.0).abs() < 60_000.0, "clamped to the maximum");
        let mean = (100.0 + 300.0 + 60_000_000.0) / 3.0;
        assert!((first.mean_us() - mean).abs() < 1e-6, "{}", first.mean_us());
        for index in 0..40 {
            first.failure(LoadError::Protocol(format!("{index}")));
        }
        assert_eq!(first.error_samples.len(), ERROR_SAMPLES_MAX);
    }
}
