//! Small deterministic generators: SplitMix64, YCSB's zipfian (Gray et al., SIGMOD '94) and
//! TPC-C's NURand. Deterministic from a seed so loads and runs can be replayed.

/// SplitMix64 (Steele, Lea, Flood 2014): fast, full-period, good enough for workloads.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed ^ 0x9E37_79B9_7F4A_7C15 }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)` (Lemire's multiply-shift; the tiny bias is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `[low, high]`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        assert!(low <= high);
        low + self.below(high - low + 1)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `percent / 100`.
    pub fn percent(&mut self, percent: u32) -> bool {
        self.below(100) < u64::from(percent)
    }
}

/// Zipfian over `[0, n)` with skew `theta` (0 < theta < 1), item 0 the most popular.
#[derive(Debug, Clone)]
pub struct Zipf {
    n: u64,
    theta: f64,
    alpha: f64,
    zeta_n: f64,
    eta: f64,
}

impl Zipf {
    pub fn new(n: u64, theta: f64) -> Zipf {
        assert!(n >= 2 && theta > 0.0 && theta < 1.0, "zipf needs n ≥ 2 and 0 < θ < 1");
        let zeta = |count: u64| (1..=count).map(|i| 1.0 / (i as f64).powf(theta)).sum::<f64>();
        let zeta_n = zeta(n);
        let zeta_2 = zeta(2);
        let alpha = 1.0 / (1.0 - theta);
        let eta = (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta_2 / zeta_n);
        Zipf { n, theta, alpha, zeta_n, eta }
    }

    pub fn sample(&self, rng: &mut SplitMix64) -> u64 {
        let u = rng.unit();
        let uz = u * self.zeta_n;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1;
        }
        let value = (self.n as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        value.min(self.n - 1)
    }
}

/// TPC-C non-uniform random NURand(A, x, y) with run constant `c`.
pub fn nurand(rng: &mut SplitMix64, a: u64, c: u64, x: u64, y: u64) -> u64 {
    (((rng.between(0, a) | rng.between(x, y)) + c) % (y - x + 1)) + x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_is_skewed_and_in_range() {
        // Goal: the zipfian favours low items and never leaves the range. Method: 100k samples, θ = 0.99.
        let zipf = Zipf::new(1000, 0.99);
        let mut rng = SplitMix64::new(7);
        let mut counts = vec![0u32; 1000];
        for _ in 0..100_000 {
            counts[zipf.sample(&mut rng) as usize] += 1;
        }
        assert!(counts[0] > 10 * counts[500].max(1), "head {} vs middle {}", counts[0], counts[500]);
        assert!(counts[0] > counts[10]);
    }

    #[test]
    fn below_is_uniform_enough() {
        // Goal: `below` covers its range evenly. Method: 60k draws into 6 buckets, each within 10%.
        let mut rng = SplitMix64::new(1);
        let mut counts = [0u32; 6];
        for _ in 0..60_000 {
            counts[rng.below(6) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| (9_000..11_000).contains(&c)), "{counts:?}");
    }

    #[test]
    fn nurand_stays_in_bounds() {
        // Goal: NURand respects [x, y]. Method: many draws with TPC-C's customer parameters.
        let mut rng = SplitMix64::new(3);
        for _ in 0..10_000 {
            let c = nurand(&mut rng, 1023, 259, 1, 3000);
            assert!((1..=3000).contains(&c));
        }
    }
}
