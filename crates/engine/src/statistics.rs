//! Statistical aggregates as PostgreSQL computes them: variance and standard deviation of one
//! argument (float8 → float8 with the Youngs–Cramer running sums; integers and numerics →
//! exact numeric), and the SQL:2003 two-argument family `regr_*`, `covar_*`, `corr` (float8).

use crate::cast::can_cast;
use crate::error::{EngineError, Result};
use crate::expr::Expr;
use crate::numeric::Numeric;
use crate::types::DataType;
use crate::vector::{Data, Vector};

/// One statistical aggregate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Statistic {
    VarPop,
    VarSamp,
    StddevPop,
    StddevSamp,
    RegrCount,
    RegrSxx,
    RegrSyy,
    RegrSxy,
    RegrAvgX,
    RegrAvgY,
    RegrR2,
    RegrSlope,
    RegrIntercept,
    CovarPop,
    CovarSamp,
    Corr,
}

impl Statistic {
    pub fn named(name: &str) -> Option<Statistic> {
        use Statistic as S;
        Some(match name {
            "var_pop" => S::VarPop,
            "var_samp" | "variance" => S::VarSamp,
            "stddev_pop" => S::StddevPop,
            "stddev_samp" | "stddev" => S::StddevSamp,
            "regr_count" => S::RegrCount,
            "regr_sxx" => S::RegrSxx,
            "regr_syy" => S::RegrSyy,
            "regr_sxy" => S::RegrSxy,
            "regr_avgx" => S::RegrAvgX,
            "regr_avgy" => S::RegrAvgY,
            "regr_r2" => S::RegrR2,
            "regr_slope" => S::RegrSlope,
            "regr_intercept" => S::RegrIntercept,
            "covar_pop" => S::CovarPop,
            "covar_samp" => S::CovarSamp,
            "corr" => S::Corr,
            _ => return None,
        })
    }

    /// Whether it takes two arguments (`regr_slope(y, x)`).
    pub fn is_pair(self) -> bool {
        !matches!(self, Statistic::VarPop | Statistic::VarSamp | Statistic::StddevPop | Statistic::StddevSamp)
    }

    /// The arguments cast to the signature PostgreSQL picks, and the result type: float8
    /// arguments give float8, exact ones (integers, numeric) numeric; the two-argument
    /// family is float8 only (regr_count: bigint).
    pub fn bind(self, name: &str, args: Vec<Expr>) -> Result<(Vec<Expr>, DataType)> {
        let arity = if self.is_pair() { 2 } else { 1 };
        let no_signature = |args: &[Expr]| {
            let types: Vec<String> = args.iter().map(|a| a.data_type().sql_name()).collect();
            EngineError::UndefinedFunction(format!("function {name}({}) does not exist", types.join(", ")))
        };
        if args.len() != arity || args.iter().any(|a| !a.data_type().is_numeric() && !is_untyped(a)) {
            return Err(no_signature(&args));
        }
        if self.is_pair() {
            let args = args.into_iter().map(to_float8).collect::<Result<Vec<_>>>()?;
            let result = if self == Statistic::RegrCount { DataType::Int64 } else { DataType::Float64 };
            return Ok((args, result));
        }
        let argument = args.into_iter().next().expect("one argument");
        Ok(match argument.data_type() {
            DataType::Float64 | DataType::Float32 => (vec![to_float8(argument)?], DataType::Float64),
            _ if is_untyped(&argument) => (vec![to_float8(argument)?], DataType::Float64),
            _ => (vec![crate::bind::cast_expr(argument, DataType::Numeric)?], DataType::Numeric),
        })
    }
}

fn is_untyped(expr: &Expr) -> bool {
    matches!(expr, Expr::Literal { value: crate::types::Value::Null, .. })
}

fn to_float8(expr: Expr) -> Result<Expr> {
    if expr.data_type() == DataType::Float64 {
        return Ok(expr);
    }
    debug_assert!(can_cast(expr.data_type(), DataType::Float64));
    crate::bind::cast_expr(expr, DataType::Float64)
}

/// Running sums of one argument in float8 (PostgreSQL's float8_accum state): count, sum,
/// and the sum of squared differences from the running mean.
#[derive(Debug, Clone, Copy, Default)]
pub struct FloatMoments {
    n: f64,
    sx: f64,
    sxx: f64,
}

/// Running sums of two arguments in float8 (float8_regr_accum).
#[derive(Debug, Clone, Copy, Default)]
pub struct PairMoments {
    n: f64,
    sx: f64,
    sxx: f64,
    sy: f64,
    syy: f64,
    sxy: f64,
}

/// Exact running sums of one argument (count, Σx, Σx²) for integer and numeric inputs.
#[derive(Debug, Clone, Copy)]
pub struct ExactMoments {
    n: i64,
    sx: Numeric,
    sxx: Numeric,
}

impl Default for ExactMoments {
    fn default() -> ExactMoments {
        ExactMoments { n: 0, sx: Numeric::ZERO, sxx: Numeric::ZERO }
    }
}

/// The per-group state of a statistical aggregate.
#[derive(Debug, Clone)]
pub enum Moments {
    Float(Vec<FloatMoments>),
    Exact(Vec<ExactMoments>),
    Pair(Vec<PairMoments>),
}

fn float_overflow() -> EngineError {
    EngineError::Overflow("value out of range: overflow".into())
}

impl FloatMoments {
    fn add(&mut self, x: f64) -> Result<()> {
        let previous = *self;
        self.n += 1.0;
        self.sx += x;
        if previous.n > 0.0 {
            let tmp = x * self.n - self.sx;
            self.sxx += tmp * tmp / (self.n * previous.n);
            if self.sx.is_infinite() || self.sxx.is_infinite() {
                if !previous.sx.is_infinite() && !x.is_infinite() {
                    return Err(float_overflow());
                }
                self.sxx = f64::NAN;
            }
        } else if !x.is_finite() {
            // A first input of Inf or NaN makes the variance NaN even if no other comes.
            self.sxx = f64::NAN;
        }
        Ok(())
    }

    fn merge(&mut self, other: FloatMoments) {
        if other.n == 0.0 {
            return;
        }
        if self.n == 0.0 {
            *self = other;
            return;
        }
        let n = self.n + other.n;
        let tmp = self.sx / self.n - other.sx / other.n;
        self.sxx = self.sxx + other.sxx + self.n * other.n * tmp * tmp / n;
        self.sx += other.sx;
        self.n = n;
    }

    fn finish(self, statistic: Statistic) -> Option<f64> {
        let (divisor, root) = match statistic {
            Statistic::VarPop => (self.n, false),
            Statistic::StddevPop => (self.n, true),
            Statistic::VarSamp => (self.n - 1.0, false),
            _ => (self.n - 1.0, true),
        };
        if divisor <= 0.0 {
            return None;
        }
        let variance = self.sxx / divisor;
        Some(if root { variance.sqrt() } else { variance })
    }
}

impl PairMoments {
    fn add(&mut self, y: f64, x: f64) -> Result<()> {
        let previous = *self;
        self.n += 1.0;
        self.sx += x;
        self.sy += y;
        if previous.n > 0.0 {
            let tmp_x = x * self.n - self.sx;
            let tmp_y = y * self.n - self.sy;
            let scale = 1.0 / (self.n * previous.n);
            self.sxx += tmp_x * tmp_x * scale;
            self.syy += tmp_y * tmp_y * scale;
            self.sxy += tmp_x * tmp_y * scale;
            if self.sx.is_infinite() || self.sxx.is_infinite() {
                if !previous.sx.is_infinite() && !x.is_infinite() {
                    return Err(float_overflow());
                }
                self.sxx = f64::NAN;
            }
            if self.sy.is_infinite() || self.syy.is_infinite() {
                if !previous.sy.is_infinite() && !y.is_infinite() {
                    return Err(float_overflow());
                }
                self.syy = f64::NAN;
            }
            if self.sxy.is_infinite() {
                let finite_inputs =
                    !previous.sx.is_infinite() && !x.is_infinite() && !previous.sy.is_infinite() && !y.is_infinite();
                if finite_inputs {
                    return Err(float_overflow());
                }
                self.sxy = f64::NAN;
            }
        } else {
            if !x.is_finite() {
                self.sxx = f64::NAN;
                self.sxy = f64::NAN;
            }
            if !y.is_finite() {
                self.syy = f64::NAN;
                self.sxy = f64::NAN;
            }
        }
        Ok(())
    }

    fn merge(&mut self, other: PairMoments) {
        if other.n == 0.0 {
            return;
        }
        if self.n == 0.0 {
            *self = other;
            return;
        }
        let n = self.n + other.n;
        let tmp_x = self.sx / self.n - other.sx / other.n;
        let tmp_y = self.sy / self.n - other.sy / other.n;
        let weight = self.n * other.n / n;
        self.sxx = self.sxx + other.sxx + weight * tmp_x * tmp_x;
        self.syy = self.syy + other.syy + weight * tmp_y * tmp_y;
        self.sxy = self.sxy + other.sxy + weight * tmp_x * tmp_y;
        self.sx += other.sx;
        self.sy += other.sy;
        self.n = n;
    }

    /// PostgreSQL's final functions (NULL for too few rows, and where the spec says so for
    /// vertical or horizontal lines).
    fn finish(self, statistic: Statistic) -> Option<f64> {
        use Statistic as S;
        let PairMoments { n, sx, sxx, sy, syy, sxy } = self;
        if n < 1.0 {
            return None;
        }
        match statistic {
            S::RegrSxx => Some(sxx),
            S::RegrSyy => Some(syy),
            S::RegrSxy => Some(sxy),
            S::RegrAvgX => Some(sx / n),
            S::RegrAvgY => Some(sy / n),
            S::CovarPop => Some(sxy / n),
            S::CovarSamp => (n >= 2.0).then(|| sxy / (n - 1.0)),
            S::Corr => (sxx != 0.0 && syy != 0.0).then(|| sxy / (sxx * syy).sqrt()),
            S::RegrR2 if sxx == 0.0 => None,
            S::RegrR2 if syy == 0.0 => Some(1.0),
            S::RegrR2 => Some((sxy * sxy) / (sxx * syy)),
            S::RegrSlope => (sxx != 0.0).then(|| sxy / sxx),
            S::RegrIntercept => (sxx != 0.0).then(|| (sy - sx * sxy / sxx) / n),
            _ => unreachable!("one-argument statistics finish in FloatMoments"),
        }
    }
}

impl ExactMoments {
    fn add(&mut self, x: Numeric) -> Result<()> {
        self.n += 1;
        self.sx = self.sx.checked_add(x)?;
        self.sxx = self.sxx.checked_add(x.checked_mul(x)?)?;
        Ok(())
    }

    fn merge(&mut self, other: ExactMoments) -> Result<()> {
        self.n += other.n;
        self.sx = self.sx.checked_add(other.sx)?;
        self.sxx = self.sxx.checked_add(other.sxx)?;
        Ok(())
    }

    /// numeric_stddev_internal: (N·Σx² − (Σx)²) / (N·N) or / (N·(N−1)), at PostgreSQL's
    /// division scale, and its square root at that scale for the standard deviations.
    fn finish(self, statistic: Statistic) -> Result<Option<Numeric>> {
        let sample = matches!(statistic, Statistic::VarSamp | Statistic::StddevSamp);
        if self.n <= i64::from(sample) {
            return Ok(None);
        }
        let n = Numeric::from_i64(self.n);
        let numerator = n.checked_mul(self.sxx)?.checked_sub(self.sx.checked_mul(self.sx)?)?;
        // Any NaN or infinite input makes the numerator NaN (inf - inf); PostgreSQL answers NaN.
        if numerator.is_special() {
            return Ok(Some(Numeric::NAN));
        }
        if numerator.signum() <= 0 {
            return Ok(Some(Numeric::ZERO));
        }
        let denominator = n.checked_mul(Numeric::from_i64(if sample { self.n - 1 } else { self.n }))?;
        let scale = numerator.division_scale(denominator);
        let variance = numerator.div_to_scale(denominator, scale)?;
        Ok(Some(match statistic {
            Statistic::VarPop | Statistic::VarSamp => variance,
            _ => variance.sqrt_to_scale(scale)?,
        }))
    }
}

impl Moments {
    pub fn new(statistic: Statistic, input: DataType) -> Moments {
        match input {
            _ if statistic.is_pair() => Moments::Pair(Vec::new()),
            DataType::Float64 => Moments::Float(Vec::new()),
            _ => Moments::Exact(Vec::new()),
        }
    }

    pub fn resize(&mut self, groups: usize) {
        match self {
            Moments::Float(m) => m.resize(groups, FloatMoments::default()),
            Moments::Exact(m) => m.resize(groups, ExactMoments::default()),
            Moments::Pair(m) => m.resize(groups, PairMoments::default()),
        }
    }

    /// Adds the rows of a batch (`second`: x of the two-argument family); rows with a NULL
    /// argument are skipped.
    pub fn update(&mut self, groups: &[u32], first: &Vector, second: Option<&Vector>) -> Result<()> {
        let valid = |r: usize| first.is_valid(r) && second.is_none_or(|s| s.is_valid(r));
        match (self, &first.data, second.map(|s| &s.data)) {
            (Moments::Float(m), Data::F64(values), None) => {
                for (r, (&g, &x)) in groups.iter().zip(values).enumerate() {
                    if valid(r) {
                        m[g as usize].add(x)?;
                    }
                }
            }
            (Moments::Exact(m), Data::Numeric(values), None) => {
                for (r, (&g, &x)) in groups.iter().zip(values).enumerate() {
                    if valid(r) {
                        m[g as usize].add(x)?;
                    }
                }
            }
            (Moments::Pair(m), Data::F64(ys), Some(Data::F64(xs))) => {
                for (r, ((&g, &y), &x)) in groups.iter().zip(ys).zip(xs).enumerate() {
                    if valid(r) {
                        m[g as usize].add(y, x)?;
                    }
                }
            }
            (state, data, _) => panic!("statistics state {state:?} cannot take {data:?}"),
        }
        Ok(())
    }

    pub fn merge_group(&mut self, to: usize, other: &Moments, from: usize) -> Result<()> {
        match (self, other) {
            (Moments::Float(a), Moments::Float(b)) => a[to].merge(b[from]),
            (Moments::Pair(a), Moments::Pair(b)) => a[to].merge(b[from]),
            (Moments::Exact(a), Moments::Exact(b)) => a[to].merge(b[from])?,
            _ => panic!("merging different statistics states"),
        }
        Ok(())
    }

    pub fn finish(&self, statistic: Statistic) -> Result<Vector> {
        let floats = |values: Vec<Option<f64>>| {
            let validity = values.iter().map(Option::is_some).collect();
            let data = Data::F64(values.into_iter().map(|v| v.unwrap_or(0.0)).collect());
            Vector { data_type: DataType::Float64, data, validity: Some(validity) }
        };
        Ok(match self {
            Moments::Pair(m) if statistic == Statistic::RegrCount => Vector {
                data_type: DataType::Int64,
                data: Data::I64(m.iter().map(|s| s.n as i64).collect()),
                validity: None,
            },
            Moments::Pair(m) => floats(m.iter().map(|s| s.finish(statistic)).collect()),
            Moments::Float(m) => floats(m.iter().map(|s| s.finish(statistic)).collect()),
            Moments::Exact(m) => {
                let values = m.iter().map(|s| s.finish(statistic)).collect::<Result<Vec<_>>>()?;
                let validity = values.iter().map(Option::is_some).collect();
                let data = Data::Numeric(values.into_iter().map(|v| v.unwrap_or(Numeric::ZERO)).collect());
                Vector { data_type: DataType::Numeric, data, validity: Some(validity) }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the float8 running sums give PostgreSQL's variance, also after merging partial
    // states; method: a small known sample split in two.
    #[test]
    fn float_variance_matches_the_textbook_and_merges() {
        let mut whole = FloatMoments::default();
        let (mut left, mut right) = (FloatMoments::default(), FloatMoments::default());
        for (i, x) in [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0].into_iter().enumerate() {
            whole.add(x).expect("finite");
            if i < 3 { left.add(x) } else { right.add(x) }.expect("finite");
        }
        left.merge(right);
        assert_eq!(whole.finish(Statistic::VarPop), Some(4.0));
        assert_eq!(whole.finish(Statistic::StddevPop), Some(2.0));
        assert!((left.finish(Statistic::VarSamp).expect("n > 1") - 32.0 / 7.0).abs() < 1e-12);
        let mut one = FloatMoments::default();
        one.add(1.0).expect("finite");
        assert_eq!(one.finish(Statistic::VarSamp), None);
        assert_eq!(one.finish(Statistic::VarPop), Some(0.0));
    }

    // Goal: the exact path uses PostgreSQL's scales (var_samp of 1, 2, 3, 4 is
    // 1.6666666666666667, its square root 1.2909944487358056); method: fixed values.
    #[test]
    fn exact_variance_has_postgres_scale() {
        let mut m = ExactMoments::default();
        for x in 1..=4 {
            m.add(Numeric::from_i64(x)).expect("small");
        }
        assert_eq!(m.finish(Statistic::VarSamp).expect("ok").expect("n > 1").to_string(), "1.6666666666666667");
        assert_eq!(m.finish(Statistic::StddevSamp).expect("ok").expect("n > 1").to_string(), "1.2909944487358056");
        assert_eq!(m.finish(Statistic::VarPop).expect("ok").expect("n > 0").to_string(), "1.2500000000000000");
    }
}
