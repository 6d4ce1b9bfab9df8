//! PostgreSQL's `interval` as far as the engine uses it: the offset of a RANGE frame over a
//! date column (`RANGE BETWEEN '1 year'::interval PRECEDING AND CURRENT ROW`). Interval is
//! not yet a column or expression type; elsewhere it stays refused (0A000).
//!
//! As in PostgreSQL an interval is months, days and microseconds kept apart (a month has no
//! fixed length until it is added to a date); ordering and signs compare the span with
//! 30-day months and 24-hour days (`interval_cmp_value`).

use crate::error::{EngineError, Result};
use crate::types::add_months;

pub const MICROS_PER_DAY: i64 = 86_400_000_000;
const MICROS_PER_SECOND: f64 = 1_000_000.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Interval {
    pub months: i32,
    pub days: i32,
    pub micros: i64,
}

/// What one unit word adds: months, days, or microseconds per unit.
enum Unit {
    Months(i32),
    Days(i32),
    Micros(f64),
}

fn unit(word: &str) -> Option<Unit> {
    Some(match word.to_ascii_lowercase().as_str() {
        "microsecond" | "microseconds" | "us" | "usec" | "usecs" => Unit::Micros(1.0),
        "millisecond" | "milliseconds" | "ms" | "msec" | "msecs" => Unit::Micros(1_000.0),
        "second" | "seconds" | "sec" | "secs" | "s" => Unit::Micros(MICROS_PER_SECOND),
        "minute" | "minutes" | "min" | "mins" | "m" => Unit::Micros(60.0 * MICROS_PER_SECOND),
        "hour" | "hours" | "hr" | "hrs" | "h" => Unit::Micros(3_600.0 * MICROS_PER_SECOND),
        "day" | "days" | "d" => Unit::Days(1),
        "week" | "weeks" | "w" => Unit::Days(7),
        "month" | "months" | "mon" | "mons" => Unit::Months(1),
        "year" | "years" | "yr" | "yrs" | "y" => Unit::Months(12),
        "decade" | "decades" => Unit::Months(120),
        "century" | "centuries" => Unit::Months(1_200),
        "millennium" | "millennia" => Unit::Months(12_000),
        _ => return None,
    })
}

impl Interval {
    pub const ZERO: Interval = Interval { months: 0, days: 0, micros: 0 };

    /// PostgreSQL's verbose input: `1 year 2 mons`, `-2 years`, `70 min`, `@ 1 day ago`,
    /// `1 day 04:05:06.5`, a bare number of seconds. Fractional years, months, weeks or days
    /// (which PostgreSQL spreads into smaller fields) are refused, not approximated.
    pub fn parse(text: &str) -> Result<Interval> {
        let invalid = || EngineError::InvalidDatetime(format!("invalid input syntax for type interval: \"{text}\""));
        let mut words: Vec<&str> = text.split_whitespace().collect();
        if words.first() == Some(&"@") {
            words.remove(0);
        }
        let ago = words.last().is_some_and(|w| w.eq_ignore_ascii_case("ago"));
        if ago {
            words.pop();
        }
        if words.is_empty() {
            return Err(invalid());
        }
        let mut interval = Interval { months: 0, days: 0, micros: 0 };
        let mut i = 0;
        while i < words.len() {
            let word = words[i];
            if word.contains(':') {
                interval.micros += parse_clock(word).ok_or_else(invalid)?;
                i += 1;
                continue;
            }
            let amount: f64 = word.parse().map_err(|_| invalid())?;
            let next = words.get(i + 1).and_then(|w| unit(w));
            i += if next.is_some() { 2 } else { 1 };
            match next.unwrap_or(Unit::Micros(MICROS_PER_SECOND)) {
                Unit::Micros(per) => interval.micros += (amount * per).round() as i64,
                Unit::Days(per) => interval.days += whole(amount, text)? * per,
                Unit::Months(per) => interval.months += whole(amount, text)? * per,
            }
        }
        Ok(if ago { interval.negated() } else { interval })
    }

    pub fn negated(self) -> Interval {
        Interval { months: -self.months, days: -self.days, micros: -self.micros }
    }

    /// The span with 30-day months, as PostgreSQL orders intervals.
    pub fn span_micros(self) -> i128 {
        (i128::from(self.months) * 30 + i128::from(self.days)) * i128::from(MICROS_PER_DAY) + i128::from(self.micros)
    }

    pub fn is_negative(self) -> bool {
        self.span_micros() < 0
    }

    /// Midnight of date `days` plus this interval, in microseconds since 1970-01-01
    /// (timestamp + interval: months first, the day clamped to the month's end, then days,
    /// then time).
    pub fn added_to_date(self, days: i32) -> i128 {
        let shifted = i128::from(add_months(days, self.months)) + i128::from(self.days);
        shifted * i128::from(MICROS_PER_DAY) + i128::from(self.micros)
    }
}

impl Interval {
    /// `interval + interval`, field by field (22008 when a field overflows).
    pub fn plus(self, other: Interval) -> Result<Interval> {
        let overflow = || EngineError::DatetimeOutOfRange("interval out of range".into());
        Ok(Interval {
            months: self.months.checked_add(other.months).ok_or_else(overflow)?,
            days: self.days.checked_add(other.days).ok_or_else(overflow)?,
            micros: self.micros.checked_add(other.micros).ok_or_else(overflow)?,
        })
    }

    /// `interval * factor` as PostgreSQL's interval_mul: fractional months spill into days
    /// (30 to a month) and fractional days into time (24 hours to a day).
    pub fn scaled(self, factor: f64) -> Result<Interval> {
        if !factor.is_finite() {
            return Err(EngineError::DatetimeOutOfRange("interval out of range".into()));
        }
        self.spread(|x| x * factor)
    }

    /// `interval / divisor` (22012 for zero), dividing each field as PostgreSQL's interval_div.
    pub fn divided(self, divisor: f64) -> Result<Interval> {
        if divisor == 0.0 {
            return Err(EngineError::DivisionByZero);
        }
        self.spread(|x| x / divisor)
    }

    /// Applies `op` to each field, spilling fractions into the next smaller field.
    fn spread(self, op: impl Fn(f64) -> f64) -> Result<Interval> {
        const SECONDS_PER_DAY: f64 = 86_400.0;
        let round_micro = |x: f64| (x * 1e6).round_ties_even() / 1e6;
        let months_exact = op(f64::from(self.months));
        let days_exact = op(f64::from(self.days));
        let (months, mut days) = (months_exact.trunc(), days_exact.trunc());
        let month_remainder_days = round_micro((months_exact - months) * 30.0);
        let mut seconds_left = round_micro((days_exact - days + month_remainder_days.fract()) * SECONDS_PER_DAY);
        if seconds_left.abs() >= SECONDS_PER_DAY {
            let whole_days = (seconds_left / SECONDS_PER_DAY).trunc();
            days += whole_days;
            seconds_left -= whole_days * SECONDS_PER_DAY;
        }
        days += month_remainder_days.trunc();
        let micros = (op(self.micros as f64) + seconds_left * 1e6).round_ties_even();
        let fits = |x: f64, max: f64| x.abs() <= max;
        if !fits(months, f64::from(i32::MAX)) || !fits(days, f64::from(i32::MAX)) || !fits(micros, 9.2e18) {
            return Err(EngineError::DatetimeOutOfRange("interval out of range".into()));
        }
        Ok(Interval { months: months as i32, days: days as i32, micros: micros as i64 })
    }
}

/// An integer amount of a calendar unit.
fn whole(amount: f64, text: &str) -> Result<i32> {
    if amount.fract() != 0.0 || amount.abs() > f64::from(i32::MAX) {
        return Err(EngineError::unsupported(format!("interval '{text}' with a fractional year, month, week or day")));
    }
    Ok(amount as i32)
}

/// `[-]hh:mm[:ss[.ffffff]]` as microseconds.
fn parse_clock(text: &str) -> Option<i64> {
    let (negative, body) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let mut parts = body.split(':');
    let hours: i64 = parts.next()?.parse().ok()?;
    let minutes: i64 = parts.next()?.parse().ok()?;
    let seconds: f64 = parts.next().map_or(Some(0.0), |s| s.parse().ok())?;
    if parts.next().is_some() || !(0..60).contains(&minutes) || !(0.0..60.0).contains(&seconds) {
        return None;
    }
    let micros = (hours * 3_600 + minutes * 60) * 1_000_000 + (seconds * MICROS_PER_SECOND).round() as i64;
    Some(if negative { -micros } else { micros })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the verbose input forms the regression tests use; method: fixed texts.
    #[test]
    fn parses_verbose_intervals() {
        let i = |text| Interval::parse(text).expect("valid interval");
        assert_eq!(i("1 year"), Interval { months: 12, days: 0, micros: 0 });
        assert_eq!(i("-2 years"), Interval { months: -24, days: 0, micros: 0 });
        assert_eq!(i("70 min").micros, 70 * 60 * 1_000_000);
        assert_eq!(i("1 sec").micros, 1_000_000);
        assert_eq!(i("1 day 04:05:06.5"), Interval { months: 0, days: 1, micros: 14_706_500_000 });
        assert_eq!(i("@ 3 days ago"), Interval { months: 0, days: -3, micros: 0 });
        assert!(i("-2 years").is_negative());
        assert!(!i("1 mon -29 days").is_negative());
        assert!(Interval::parse("soon").is_err());
        assert!(Interval::parse("1.5 years").is_err());
    }
}
