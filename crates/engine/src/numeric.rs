//! PostgreSQL's unconstrained `numeric`: an exact decimal `mantissa · 10^-scale` in an `i128`
//! (38 significant digits), where every value carries its own display scale as PostgreSQL's
//! does (`1.5 + 2.25` prints `3.75`, `1/3` prints twenty digits).
//!
//! Typed `numeric(p, s)` columns with p ≤ 18 stay scaled `i64`s (`DataType::Decimal`), the fast
//! path of the TPC-H tables; this type is what literals with a fraction, division, `avg` and
//! `sum` of exact numbers produce. Results that need more than 38 digits are an error
//! (`22003`), where PostgreSQL would keep going up to 131,072 digits.
//!
//! NaN, +Infinity and -Infinity are values too, as in PostgreSQL 15: NaN equals itself and
//! sorts above every other value, and arithmetic on them follows PostgreSQL's numeric.c
//! (`inf - inf` and `inf * 0` are NaN, `x / inf` is 0, `inf / 0` is a division by zero).

use std::cmp::Ordering;
use std::fmt;

use crate::error::{EngineError, Result};

/// Largest display scale a value may have (PostgreSQL's NUMERIC_MAX_DISPLAY_SCALE is 1000;
/// with 38 digits in all, more fractional digits than this only hold zeros).
pub const NUMERIC_SCALE_MAX: u8 = 76;
/// Significant digits PostgreSQL keeps at least in a quotient (NUMERIC_MIN_SIG_DIGITS).
const DIVISION_SIGNIFICANT_DIGITS: i32 = 16;
/// Digits per base-10000 "digit" of PostgreSQL's representation, which its scale rules use.
const BASE_DIGITS: i32 = 4;
/// The scale that marks a special value: NaN has mantissa 0, +Infinity 1, -Infinity -1.
/// A finite value's scale never exceeds `NUMERIC_SCALE_MAX`, so this one is free, and
/// negation (`-mantissa`) already maps +Infinity and -Infinity onto each other.
const SPECIAL_SCALE: u8 = u8::MAX;

/// An exact decimal number with its display scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Numeric {
    pub mantissa: i128,
    pub scale: u8,
}

pub fn overflow() -> EngineError {
    EngineError::Overflow("value overflows numeric format".into())
}

/// `10^exponent` as i128, if it fits.
pub fn pow10_wide(exponent: u32) -> Option<i128> {
    10i128.checked_pow(exponent)
}

/// `value · 10^exponent`, checked.
fn shift_up(value: i128, exponent: u32) -> Result<i128> {
    pow10_wide(exponent).and_then(|p| value.checked_mul(p)).ok_or_else(overflow)
}

/// `numerator / denominator` rounded half away from zero.
fn divide_rounded(numerator: i128, denominator: i128) -> i128 {
    let quotient = numerator / denominator;
    let remainder = numerator % denominator;
    if remainder.unsigned_abs() >= denominator.unsigned_abs() - remainder.unsigned_abs() {
        quotient + if (numerator < 0) == (denominator < 0) { 1 } else { -1 }
    } else {
        quotient
    }
}

impl Numeric {
    pub const ZERO: Numeric = Numeric { mantissa: 0, scale: 0 };
    pub const NAN: Numeric = Numeric { mantissa: 0, scale: SPECIAL_SCALE };
    pub const INFINITY: Numeric = Numeric { mantissa: 1, scale: SPECIAL_SCALE };
    pub const NEG_INFINITY: Numeric = Numeric { mantissa: -1, scale: SPECIAL_SCALE };

    /// NaN, +Infinity or -Infinity.
    pub fn is_special(self) -> bool {
        self.scale == SPECIAL_SCALE
    }

    pub fn is_nan(self) -> bool {
        self == Numeric::NAN
    }

    pub fn is_infinite(self) -> bool {
        self.is_special() && !self.is_nan()
    }

    /// +Infinity for a positive sign, -Infinity for a negative one, NaN for 0 (`inf * 0`).
    fn infinity_with_sign(sign: i128) -> Numeric {
        match sign.signum() {
            1 => Numeric::INFINITY,
            -1 => Numeric::NEG_INFINITY,
            _ => Numeric::NAN,
        }
    }

    /// Where the value sorts among the special ones: -Infinity, finite, +Infinity, NaN.
    fn order_class(self) -> i8 {
        match (self.is_special(), self.mantissa) {
            (false, _) => 0,
            (true, 0) => 2,
            (true, sign) => sign.signum() as i8,
        }
    }

    pub fn new(mantissa: i128, scale: u8) -> Numeric {
        Numeric { mantissa, scale }
    }

    pub fn from_i64(value: i64) -> Numeric {
        Numeric { mantissa: i128::from(value), scale: 0 }
    }

    /// A finite zero (NaN's mantissa is 0 too).
    pub fn is_zero(self) -> bool {
        self.mantissa == 0 && !self.is_special()
    }

    /// The same value with exactly `scale` fractional digits (rounding half away from zero
    /// when digits are dropped).
    pub fn rescale(self, scale: u8) -> Result<Numeric> {
        if self.is_special() {
            return Ok(self);
        }
        let mantissa = match scale.cmp(&self.scale) {
            Ordering::Equal => self.mantissa,
            Ordering::Greater => shift_up(self.mantissa, u32::from(scale - self.scale))?,
            Ordering::Less => match pow10_wide(u32::from(self.scale - scale)) {
                Some(divisor) => divide_rounded(self.mantissa, divisor),
                None => 0,
            },
        };
        Ok(Numeric { mantissa, scale })
    }

    /// Drops trailing fractional zeros: equal values get equal representations (hash keys).
    pub fn normalized(self) -> Numeric {
        if self.is_special() {
            return self;
        }
        let (mut mantissa, mut scale) = (self.mantissa, self.scale);
        while scale > 0 && mantissa % 10 == 0 {
            mantissa /= 10;
            scale -= 1;
        }
        Numeric { mantissa, scale }
    }

    fn align(a: Numeric, b: Numeric) -> Result<(i128, i128, u8)> {
        let scale = a.scale.max(b.scale);
        Ok((a.rescale(scale)?.mantissa, b.rescale(scale)?.mantissa, scale))
    }

    pub fn checked_add(self, other: Numeric) -> Result<Numeric> {
        if self.is_special() || other.is_special() {
            return Ok(special_sum(self, other));
        }
        let (a, b, scale) = Numeric::align(self, other)?;
        Ok(Numeric { mantissa: a.checked_add(b).ok_or_else(overflow)?, scale })
    }

    pub fn checked_sub(self, other: Numeric) -> Result<Numeric> {
        if self.is_special() || other.is_special() {
            return Ok(special_sum(self, other.negated()));
        }
        let (a, b, scale) = Numeric::align(self, other)?;
        Ok(Numeric { mantissa: a.checked_sub(b).ok_or_else(overflow)?, scale })
    }

    pub fn checked_mul(self, other: Numeric) -> Result<Numeric> {
        if self.is_special() || other.is_special() {
            if self.is_nan() || other.is_nan() {
                return Ok(Numeric::NAN);
            }
            return Ok(Numeric::infinity_with_sign(self.mantissa.signum() * other.mantissa.signum()));
        }
        let scale = self.scale.checked_add(other.scale).filter(|&s| s <= NUMERIC_SCALE_MAX).ok_or_else(overflow)?;
        Ok(Numeric { mantissa: self.mantissa.checked_mul(other.mantissa).ok_or_else(overflow)?, scale })
    }

    pub fn negated(self) -> Numeric {
        Numeric { mantissa: -self.mantissa, scale: self.scale }
    }

    pub fn abs(self) -> Numeric {
        Numeric { mantissa: self.mantissa.abs(), scale: self.scale }
    }

    /// Decimal exponent of the leading digit (`123.4` → 2, `0.05` → -2); `None` for zero.
    fn exponent(self) -> Option<i32> {
        if self.mantissa == 0 {
            return None;
        }
        let digits = self.mantissa.unsigned_abs().ilog10() as i32 + 1;
        Some(digits - 1 - i32::from(self.scale))
    }

    /// PostgreSQL's weight and first digit in base 10000 (`select_div_scale` needs them).
    fn base_10000_lead(self) -> (i32, i128) {
        let Some(exponent) = self.exponent() else { return (0, 0) };
        let weight = exponent.div_euclid(BASE_DIGITS);
        let shift = -i32::from(self.scale) - BASE_DIGITS * weight;
        let magnitude = self.mantissa.abs();
        let lead = if shift >= 0 {
            magnitude * 10i128.pow(shift as u32)
        } else {
            pow10_wide(shift.unsigned_abs()).map_or(0, |p| magnitude / p)
        };
        (weight, lead % 10_000)
    }

    /// The display scale PostgreSQL gives `self / other` (`select_div_scale`): at least 16
    /// significant digits and no fewer fractional digits than either input.
    pub fn division_scale(self, other: Numeric) -> u8 {
        let (weight1, first1) = self.base_10000_lead();
        let (weight2, first2) = other.base_10000_lead();
        let mut quotient_weight = weight1 - weight2;
        if first1 <= first2 {
            quotient_weight -= 1;
        }
        let scale = (DIVISION_SIGNIFICANT_DIGITS - quotient_weight * BASE_DIGITS)
            .max(i32::from(self.scale))
            .max(i32::from(other.scale))
            .clamp(0, i32::from(NUMERIC_SCALE_MAX));
        scale as u8
    }

    /// `self / other` with PostgreSQL's result scale, rounded half away from zero.
    pub fn checked_div(self, other: Numeric) -> Result<Numeric> {
        if let Some(quotient) = special_quotient(self, other) {
            return quotient;
        }
        if other.is_zero() {
            return Err(EngineError::DivisionByZero);
        }
        let scale = self.division_scale(other);
        self.div_to_scale(other, scale)
    }

    /// `self / other` rounded to `scale` fractional digits.
    pub fn div_to_scale(self, other: Numeric, scale: u8) -> Result<Numeric> {
        if let Some(quotient) = special_quotient(self, other) {
            return quotient;
        }
        if other.is_zero() {
            return Err(EngineError::DivisionByZero);
        }
        // q = a·10^(scale + sb - sa) / b, the exponent is ≥ 0 when scale ≥ sa.
        let exponent = i32::from(scale) + i32::from(other.scale) - i32::from(self.scale);
        let mantissa = if exponent >= 0 {
            match shift_up(self.mantissa, exponent as u32) {
                Ok(numerator) => divide_rounded(numerator, other.mantissa),
                Err(_) => wide::scaled_quotient(self.mantissa, exponent as u32, other.mantissa)?,
            }
        } else {
            let divisor = shift_up(other.mantissa, exponent.unsigned_abs())?;
            divide_rounded(self.mantissa, divisor)
        };
        Ok(Numeric { mantissa, scale })
    }

    /// Remainder with the sign of the dividend (PostgreSQL's `%` on numeric).
    pub fn checked_rem(self, other: Numeric) -> Result<Numeric> {
        if self.is_special() || other.is_special() {
            return special_remainder(self, other);
        }
        if other.is_zero() {
            return Err(EngineError::DivisionByZero);
        }
        let (a, b, scale) = Numeric::align(self, other)?;
        Ok(Numeric { mantissa: a % b, scale })
    }

    /// Rounds to `digits` fractional digits (negative: to tens, hundreds, …); the result
    /// has display scale max(digits, 0), as `round(numeric, int)`.
    pub fn round(self, digits: i32) -> Result<Numeric> {
        self.round_with(digits, divide_rounded)
    }

    /// Truncates toward zero to `digits` fractional digits, as `trunc(numeric, int)`.
    pub fn trunc(self, digits: i32) -> Result<Numeric> {
        self.round_with(digits, |n, d| n / d)
    }

    fn round_with(self, digits: i32, divide: fn(i128, i128) -> i128) -> Result<Numeric> {
        if self.is_special() {
            return Ok(self);
        }
        let digits = digits.min(i32::from(NUMERIC_SCALE_MAX));
        let drop = i32::from(self.scale) - digits;
        let scale = digits.max(0) as u8;
        if drop <= 0 {
            return self.rescale(scale);
        }
        let Some(divisor) = pow10_wide(drop as u32) else { return Ok(Numeric { mantissa: 0, scale }) };
        let rounded = divide(self.mantissa, divisor);
        // Back to `scale` fractional digits (digits < 0 leaves zeros in the integer part).
        let up = (scale as i32 - digits) as u32;
        Ok(Numeric { mantissa: shift_up(rounded, up)?, scale })
    }

    /// Largest integer ≤ self (scale 0).
    pub fn floor(self) -> Numeric {
        if self.is_special() {
            return self;
        }
        let divisor = pow10_wide(u32::from(self.scale)).unwrap_or(i128::MAX);
        Numeric { mantissa: self.mantissa.div_euclid(divisor), scale: 0 }
    }

    /// Smallest integer ≥ self (scale 0).
    pub fn ceil(self) -> Numeric {
        self.negated().floor().negated()
    }

    /// The square root rounded (half up) to `scale` fractional digits, as PostgreSQL's
    /// sqrt_var at a given result scale (the variance it is called on is never negative).
    pub fn sqrt_to_scale(self, scale: u8) -> Result<Numeric> {
        if self.mantissa < 0 {
            return Err(EngineError::Runtime("square root of a negative numeric".into()));
        }
        if self.is_special() {
            return Ok(self);
        }
        // sqrt(m / 10^s) · 10^(scale+1) = sqrt(m · 10^(2·scale + 2 − s)): one digit more, to round.
        let exponent = 2 * i32::from(scale) + 2 - i32::from(self.scale);
        let root = if exponent >= 0 {
            wide::sqrt_scaled(self.mantissa.unsigned_abs(), exponent as u32)?
        } else {
            let divisor = pow10_wide(exponent.unsigned_abs()).ok_or_else(overflow)?;
            (self.mantissa / divisor).unsigned_abs().isqrt()
        };
        let rounded = root / 10 + u128::from(root % 10 >= 5);
        Ok(Numeric { mantissa: i128::try_from(rounded).map_err(|_| overflow())?, scale })
    }

    /// -1, 0 or 1; the infinities have their sign, NaN 0.
    pub fn signum(self) -> i32 {
        self.mantissa.signum() as i32
    }

    /// The value rounded to an integer (half away from zero), if it is finite and fits `i64`.
    pub fn to_i64(self) -> Option<i64> {
        if self.is_special() {
            return None;
        }
        i64::try_from(self.rescale(0).ok()?.mantissa).ok()
    }

    /// The nearest double (via the decimal text, as PostgreSQL's numeric_float8).
    pub fn to_f64(self) -> f64 {
        match self.order_class() {
            0 => self.to_string().parse().unwrap_or(f64::NAN),
            1 => f64::INFINITY,
            -1 => f64::NEG_INFINITY,
            _ => f64::NAN,
        }
    }

    /// PostgreSQL's float8 → numeric: the double printed with 15 significant digits.
    pub fn from_f64(value: f64) -> Result<Numeric> {
        if value.is_nan() {
            return Ok(Numeric::NAN);
        }
        if value.is_infinite() {
            return Ok(Numeric::infinity_with_sign(if value > 0.0 { 1 } else { -1 }));
        }
        Numeric::parse(&format!("{value:.14e}")).map(Numeric::normalized)
    }

    /// Parses numeric input text: `-12.5`, `1e3`, ` .5 `. The display scale is the number of
    /// fractional digits written, less the exponent.
    pub fn parse(text: &str) -> Result<Numeric> {
        let invalid = || EngineError::InvalidValue(format!("invalid input syntax for type numeric: \"{text}\""));
        let trimmed = text.trim();
        if let Some(special) = parse_special(trimmed) {
            return Ok(special);
        }
        let (negative, rest) = match trimmed.as_bytes().first() {
            Some(b'-') => (true, &trimmed[1..]),
            Some(b'+') => (false, &trimmed[1..]),
            _ => (false, trimmed),
        };
        let (body, exponent) = match rest.find(['e', 'E']) {
            Some(at) => (&rest[..at], rest[at + 1..].parse::<i32>().map_err(|_| invalid())?),
            None => (rest, 0),
        };
        let (whole, fraction) = body.split_once('.').unwrap_or((body, ""));
        let digits_only = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if (whole.is_empty() && fraction.is_empty()) || !digits_only(whole) || !digits_only(fraction) {
            return Err(invalid());
        }
        let mut mantissa: i128 = 0;
        for byte in whole.bytes().chain(fraction.bytes()) {
            mantissa =
                mantissa.checked_mul(10).and_then(|m| m.checked_add(i128::from(byte - b'0'))).ok_or_else(overflow)?;
        }
        let scale = fraction.len() as i64 - i64::from(exponent);
        let numeric = if scale >= 0 {
            let scale = u8::try_from(scale).ok().filter(|&s| s <= NUMERIC_SCALE_MAX).ok_or_else(overflow)?;
            Numeric { mantissa, scale }
        } else {
            let up = u32::try_from(-scale).map_err(|_| overflow())?;
            Numeric { mantissa: if mantissa == 0 { 0 } else { shift_up(mantissa, up)? }, scale: 0 }
        };
        Ok(if negative { numeric.negated() } else { numeric })
    }
}

impl PartialOrd for Numeric {
    fn partial_cmp(&self, other: &Numeric) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Numeric {
    /// Numeric order (`1.5 = 1.50`); an aligned mantissa too large for i128 is larger in
    /// magnitude than any that fits, so its sign decides.
    fn cmp(&self, other: &Numeric) -> Ordering {
        if self.is_special() || other.is_special() {
            return self.order_class().cmp(&other.order_class());
        }
        let scale = self.scale.max(other.scale);
        match (self.rescale(scale), other.rescale(scale)) {
            (Ok(a), Ok(b)) => a.mantissa.cmp(&b.mantissa),
            (Err(_), _) => self.mantissa.signum().cmp(&0),
            (_, Err(_)) => 0.cmp(&other.mantissa.signum()),
        }
    }
}

impl fmt::Display for Numeric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.order_class() {
            2 => return write!(f, "NaN"),
            1 => return write!(f, "Infinity"),
            -1 => return write!(f, "-Infinity"),
            _ => {}
        }
        let digits = self.mantissa.unsigned_abs().to_string();
        let sign = if self.mantissa < 0 { "-" } else { "" };
        let scale = usize::from(self.scale);
        if scale == 0 {
            return write!(f, "{sign}{digits}");
        }
        let padded = format!("{digits:0>width$}", width = scale + 1);
        let (whole, fraction) = padded.split_at(padded.len() - scale);
        write!(f, "{sign}{whole}.{fraction}")
    }
}

/// `NaN`, `Infinity`, `inf` (any case, with a sign or not), as numeric_in accepts them.
fn parse_special(text: &str) -> Option<Numeric> {
    let (sign, word) = match text.as_bytes().first() {
        Some(b'-') => (-1, &text[1..]),
        Some(b'+') => (1, &text[1..]),
        _ => (1, text),
    };
    if word.eq_ignore_ascii_case("infinity") || word.eq_ignore_ascii_case("inf") {
        return Some(Numeric::infinity_with_sign(sign));
    }
    // A sign before NaN is invalid input, as in PostgreSQL.
    (text.eq_ignore_ascii_case("nan")).then_some(Numeric::NAN)
}

/// `a + b` when either is special: NaN wins, opposite infinities give NaN.
fn special_sum(a: Numeric, b: Numeric) -> Numeric {
    match (a.order_class(), b.order_class()) {
        (2, _) | (_, 2) => Numeric::NAN,
        (x, y) if x != 0 && y != 0 && x != y => Numeric::NAN,
        (0, _) => b,
        _ => a,
    }
}

/// numeric_div's rules for special operands: NaN wins, `inf / inf` is NaN, `inf / 0` is a
/// division by zero, `x / inf` is 0. None when both are finite.
fn special_quotient(a: Numeric, b: Numeric) -> Option<Result<Numeric>> {
    if !a.is_special() && !b.is_special() {
        return None;
    }
    Some(if a.is_nan() || b.is_nan() || (a.is_special() && b.is_special()) {
        Ok(Numeric::NAN)
    } else if a.is_special() {
        if b.is_zero() {
            Err(EngineError::DivisionByZero)
        } else {
            Ok(Numeric::infinity_with_sign(a.mantissa.signum() * b.mantissa.signum()))
        }
    } else {
        Ok(Numeric::ZERO)
    })
}

/// numeric_mod's rules: NaN wins, `inf % 0` is a division by zero, `inf % x` is NaN, and
/// `x % inf` is x.
fn special_remainder(a: Numeric, b: Numeric) -> Result<Numeric> {
    if a.is_nan() || b.is_nan() {
        return Ok(Numeric::NAN);
    }
    if a.is_special() {
        return if b.is_zero() { Err(EngineError::DivisionByZero) } else { Ok(Numeric::NAN) };
    }
    Ok(a)
}

/// 256-bit arithmetic for the one step that outgrows i128: a quotient whose scaled numerator
/// does not fit (`1e30 / 7` with sixteen fractional digits).
mod wide {
    use super::{overflow, Result};

    /// round(a · 10^exponent / b), if the quotient fits i128.
    pub fn scaled_quotient(a: i128, exponent: u32, b: i128) -> Result<i128> {
        let negative = (a < 0) != (b < 0);
        let (mut high, mut low) = (0u128, a.unsigned_abs());
        for _ in 0..exponent {
            (high, low) = times_ten(high, low).ok_or_else(overflow)?;
        }
        let divisor = b.unsigned_abs();
        let (quotient, remainder) = divide(high, low, divisor).ok_or_else(overflow)?;
        let rounded =
            if remainder >= divisor - remainder { quotient.checked_add(1).ok_or_else(overflow)? } else { quotient };
        let value = i128::try_from(rounded).map_err(|_| overflow())?;
        Ok(if negative { -value } else { value })
    }

    /// floor(sqrt(a · 10^exponent)), computed in 256 bits.
    pub fn sqrt_scaled(a: u128, exponent: u32) -> Result<u128> {
        let (mut high, mut low) = (0u128, a);
        for _ in 0..exponent {
            (high, low) = times_ten(high, low).ok_or_else(overflow)?;
        }
        // The largest r with r² ≤ (high, low), by binary search over r < 2^128.
        let (mut below, mut above) = (0u128, u128::MAX);
        while below < above {
            let middle = below + (above - below).div_ceil(2);
            if square_at_most(middle, high, low) {
                below = middle;
            } else {
                above = middle - 1;
            }
        }
        Ok(below)
    }

    /// Whether r² ≤ high·2^128 + low.
    fn square_at_most(r: u128, high: u128, low: u128) -> bool {
        let (r_high, r_low) = (r >> 64, r & u128::from(u64::MAX));
        let low_low = r_low * r_low;
        let cross = r_high * r_low;
        let high_high = r_high * r_high;
        // r² = high_high·2^128 + 2·cross·2^64 + low_low.
        let (cross_low, cross_high) = (cross << 65, cross >> 63);
        let (square_low, carry) = low_low.overflowing_add(cross_low);
        let square_high = high_high + cross_high + u128::from(carry);
        (square_high, square_low) <= (high, low)
    }

    fn times_ten(high: u128, low: u128) -> Option<(u128, u128)> {
        let (low8, carry8) = (low << 3, low >> 125);
        let (low2, carry2) = (low << 1, low >> 127);
        let (new_low, carry) = low8.overflowing_add(low2);
        let high = high.checked_mul(10)?.checked_add(carry8)?.checked_add(carry2)?.checked_add(u128::from(carry))?;
        Some((high, new_low))
    }

    /// (high·2^128 + low) / divisor by shift-and-subtract; None if the quotient needs more
    /// than 128 bits.
    fn divide(high: u128, low: u128, divisor: u128) -> Option<(u128, u128)> {
        if high >= divisor {
            return None;
        }
        let mut remainder = high;
        let mut quotient = 0u128;
        for bit in (0..128).rev() {
            let carry = remainder >> 127;
            remainder = (remainder << 1) | ((low >> bit) & 1);
            quotient <<= 1;
            if carry == 1 || remainder >= divisor {
                remainder = remainder.wrapping_sub(divisor);
                quotient |= 1;
            }
        }
        Some((quotient, remainder))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(text: &str) -> Numeric {
        Numeric::parse(text).expect("valid numeric")
    }

    // Goal: division follows PostgreSQL's select_div_scale; method: quotients whose text is
    // known from PostgreSQL 15.
    #[test]
    fn division_matches_postgres_scale() {
        assert_eq!(n("1").checked_div(n("3")).expect("divides").to_string(), "0.33333333333333333333");
        assert_eq!(n("3").checked_div(n("2")).expect("divides").to_string(), "1.5000000000000000");
        assert_eq!(n("10").checked_div(n("4")).expect("divides").to_string(), "2.5000000000000000");
        assert_eq!(n("1.0").checked_div(n("3")).expect("divides").to_string(), "0.33333333333333333333");
        assert_eq!(n("100000").checked_div(n("3")).expect("divides").to_string(), "33333.333333333333");
        assert_eq!(n("2").checked_div(n("3")).expect("divides").to_string(), "0.66666666666666666667");
        assert_eq!(n("-2").checked_div(n("3")).expect("divides").to_string(), "-0.66666666666666666667");
        assert_eq!(n("0").checked_div(n("5")).expect("divides").to_string(), "0.00000000000000000000");
        assert_eq!(n("7.50").checked_div(n("2.5")).expect("divides").to_string(), "3.0000000000000000");
        assert!(matches!(n("1").checked_div(n("0")), Err(EngineError::DivisionByZero)));
        let big = n("100000000000000000000000000000");
        assert_eq!(big.checked_div(n("7")).expect("divides").to_string(), "14285714285714285714285714286");
        // 10^30 · 10^10 outgrows i128: the 256-bit path.
        let one = n("1.000000000000000000000000000000");
        assert_eq!(one.checked_div(n("3.0000000000")).expect("wide").to_string(), "0.333333333333333333333333333333");
        let two = n("-2.000000000000000000000000000000");
        assert_eq!(two.checked_div(n("3.0000000000")).expect("wide").to_string(), "-0.666666666666666666666666666667");
    }

    // Goal: NaN and the infinities behave as PostgreSQL 15's numeric; method: the cases of
    // numeric.c's special-value branches, answers taken from PostgreSQL.
    #[test]
    fn special_values_follow_postgres() {
        let (nan, inf, ninf) = (Numeric::NAN, Numeric::INFINITY, Numeric::NEG_INFINITY);
        assert_eq!(n("NaN"), nan);
        assert_eq!(n(" -Infinity "), ninf);
        assert_eq!(n("inf"), inf);
        assert!(Numeric::parse("+nan").is_err());
        assert_eq!([nan.to_string(), inf.to_string(), ninf.to_string()], ["NaN", "Infinity", "-Infinity"]);
        assert!(nan > inf && inf > n("1e30") && ninf < n("-1e30"));
        assert_eq!(nan.cmp(&nan), Ordering::Equal);
        assert_eq!(inf.checked_sub(inf).expect("NaN"), nan);
        assert_eq!(inf.checked_mul(Numeric::ZERO).expect("NaN"), nan);
        assert_eq!(inf.checked_mul(n("-2")).expect("-inf"), ninf);
        assert_eq!(n("1").checked_div(inf).expect("zero"), Numeric::ZERO);
        assert_eq!(nan.checked_div(Numeric::ZERO).expect("NaN"), nan);
        assert!(matches!(inf.checked_div(Numeric::ZERO), Err(EngineError::DivisionByZero)));
        assert_eq!(n("5").checked_rem(inf).expect("5"), n("5"));
        assert_eq!(inf.checked_rem(n("2")).expect("NaN"), nan);
        assert_eq!(ninf.negated(), inf);
        assert_eq!(nan.normalized(), nan);
        assert_eq!(inf.round(2).expect("inf"), inf);
        assert_eq!(Numeric::from_f64(f64::NEG_INFINITY).expect("special"), ninf);
        assert!(inf.to_f64().is_infinite() && nan.to_f64().is_nan());
        assert_eq!(nan.to_i64(), None);
    }

    // Goal: parse, print, compare and round like PostgreSQL's numeric; method: fixed cases.
    #[test]
    fn parse_print_compare_round() {
        assert_eq!(n("1.50").to_string(), "1.50");
        assert_eq!(n("-0.05").to_string(), "-0.05");
        assert_eq!(n("1e3").to_string(), "1000");
        assert_eq!(n("1.5e-3").to_string(), "0.0015");
        assert_eq!(n(" .5 ").to_string(), "0.5");
        assert_eq!(n("-9223372036854775809").to_string(), "-9223372036854775809");
        assert!(Numeric::parse("1.2.3").is_err());
        assert_eq!(n("1.5"), n("1.5"));
        assert_eq!(n("1.5").cmp(&n("1.50")), Ordering::Equal);
        assert!(n("-2") < n("1.5"));
        assert_eq!(n("2.5").round(0).expect("rounds").to_string(), "3");
        assert_eq!(n("-2.5").round(0).expect("rounds").to_string(), "-3");
        assert_eq!(n("1234.5678").round(2).expect("rounds").to_string(), "1234.57");
        assert_eq!(n("1234.5678").round(-2).expect("rounds").to_string(), "1200");
        assert_eq!(n("1234.5678").trunc(1).expect("truncates").to_string(), "1234.5");
        assert_eq!(n("-1.5").floor().to_string(), "-2");
        assert_eq!(n("-1.5").ceil().to_string(), "-1");
        assert_eq!(n("1.5").checked_add(n("2.25")).expect("adds").to_string(), "3.75");
        assert_eq!(n("1.5").checked_mul(n("2.25")).expect("multiplies").to_string(), "3.375");
        assert_eq!(n("7.5").checked_rem(n("2")).expect("remainder").to_string(), "1.5");
        assert_eq!(Numeric::from_f64(0.1).expect("finite").to_string(), "0.1");
        assert_eq!(Numeric::from_f64(1.0 / 3.0).expect("finite").to_string(), "0.333333333333333");
        assert_eq!(n("2.5").to_i64(), Some(3));
        assert_eq!(n("2").sqrt_to_scale(16).expect("root").to_string(), "1.4142135623730950");
        assert_eq!(n("1.6666666666666667").sqrt_to_scale(16).expect("root").to_string(), "1.2909944487358056");
        assert_eq!(
            n("123456789012345678901234").sqrt_to_scale(20).expect("wide").to_string(),
            "351364182882.01442531112143004817"
        );
        assert!(n("-1").sqrt_to_scale(2).is_err());
        assert_eq!(n("99999999999999999999").to_i64(), None);
    }
}
