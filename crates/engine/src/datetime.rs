//! `timestamp` and `timestamp with time zone` as PostgreSQL 15 reads, prints and computes
//! them, and the date/time functions over them and over dates: EXTRACT / date_part fields,
//! date_trunc, interval arithmetic.
//!
//! A timestamp is microseconds since 1970-01-01 00:00:00 (an i64, as PostgreSQL's, whose
//! epoch is 2000-01-01); `timestamp with time zone` holds the same count in UTC. The engine
//! knows one time zone, UTC: a session whose TimeZone is another zone is refused every
//! `timestamp with time zone` value (`check_time_zone`), never answered in UTC instead.
//! `i64::MAX` and `i64::MIN` are `infinity` and `-infinity`.

use std::cell::RefCell;

use crate::error::{EngineError, Result};
use crate::interval::{Interval, MICROS_PER_DAY};
use crate::types::{add_months, civil_from_days, days_from_civil, format_date, parse_date};

pub const MICROS_PER_SECOND: i64 = 1_000_000;
const MICROS_PER_HOUR: i64 = 3_600 * MICROS_PER_SECOND;
pub const TIMESTAMP_INFINITY: i64 = i64::MAX;
pub const TIMESTAMP_MINUS_INFINITY: i64 = i64::MIN;
/// PostgreSQL's range: 4713 BC to 294276 AD; the engine's dates start at year 1.
const TIMESTAMP_MAX_YEAR: i32 = 294_276;

thread_local! {
    /// The session's TimeZone while it binds a statement (see `check_time_zone`).
    static SESSION_TIME_ZONE: RefCell<String> = RefCell::new("UTC".into());
}

/// Records the TimeZone of the session about to bind a statement on this thread.
pub fn set_session_time_zone(zone: &str) {
    SESSION_TIME_ZONE.with(|z| {
        if *z.borrow() != zone {
            *z.borrow_mut() = zone.to_string();
        }
    });
}

/// Zone names that mean UTC.
fn is_utc(zone: &str) -> bool {
    let zone = zone.trim().trim_matches('\'');
    ["utc", "gmt", "etc/utc", "etc/gmt", "z", "zulu", "universal", "etc/universal", "+00", "+00:00", "0"]
        .iter()
        .any(|name| zone.eq_ignore_ascii_case(name))
}

/// `timestamp with time zone` is bound only in a UTC session: values are printed and
/// converted in UTC, which another zone's users would read wrongly.
pub fn check_time_zone() -> Result<()> {
    SESSION_TIME_ZONE.with(|z| {
        let zone = z.borrow();
        if is_utc(&zone) {
            Ok(())
        } else {
            Err(EngineError::unsupported(format!("timestamp with time zone in time zone {zone} (only UTC)")))
        }
    })
}

fn out_of_range() -> EngineError {
    EngineError::DatetimeOutOfRange("timestamp out of range".into())
}

/// `"2020-03-04 05:06:07.5"` (or with `T`, or a date alone). A zone suffix (`+02`, `Z`,
/// `UTC`) shifts a `timestamp with time zone` to UTC and is ignored for a `timestamp`, as in
/// PostgreSQL.
pub fn parse_timestamp(text: &str, with_zone: bool) -> Result<i64> {
    let invalid = || {
        let type_name = if with_zone { "timestamp with time zone" } else { "timestamp" };
        EngineError::InvalidDatetime(format!("invalid input syntax for type {type_name}: \"{text}\""))
    };
    let trimmed = text.trim();
    match trimmed.to_ascii_lowercase().as_str() {
        "infinity" | "+infinity" => return Ok(TIMESTAMP_INFINITY),
        "-infinity" => return Ok(TIMESTAMP_MINUS_INFINITY),
        "epoch" => return Ok(0),
        _ => {}
    }
    let (date_text, rest) = match trimmed.find([' ', 'T', 't']) {
        Some(at) => (&trimmed[..at], trimmed[at + 1..].trim()),
        None => (trimmed, ""),
    };
    let days = parse_date(date_text).map_err(|e| match e {
        EngineError::DatetimeOutOfRange(_) => {
            EngineError::DatetimeOutOfRange(format!("date/time field value out of range: \"{text}\""))
        }
        _ => invalid(),
    })?;
    let (clock, zone) = split_zone(rest);
    let time = if clock.is_empty() { 0 } else { parse_time_of_day(clock).ok_or_else(invalid)? };
    let offset = match zone {
        Some(zone) if with_zone => zone_offset_micros(zone).ok_or_else(invalid)?,
        Some(zone) => zone_offset_micros(zone).map(|_| 0).ok_or_else(invalid)?,
        None => 0,
    };
    Ok(i64::from(days) * MICROS_PER_DAY + time - offset)
}

/// Splits `05:06:07+02` or `05:06:07 UTC` into the clock and the zone.
fn split_zone(rest: &str) -> (&str, Option<&str>) {
    if let Some(at) = rest.find(|c: char| c == '+' || c == '-' || c.is_ascii_alphabetic()) {
        let (clock, zone) = rest.split_at(at);
        return (clock.trim(), Some(zone.trim()));
    }
    (rest, None)
}

/// `+02`, `-05:30`, `Z`, `UTC` as microseconds east of Greenwich; other names are unknown.
fn zone_offset_micros(zone: &str) -> Option<i64> {
    if is_utc(zone) {
        return Some(0);
    }
    let (sign, body) = match zone.as_bytes().first()? {
        b'+' => (1, &zone[1..]),
        b'-' => (-1, &zone[1..]),
        _ => return None,
    };
    let (hours, minutes) = match body.split_once(':') {
        Some((h, m)) => (h.parse::<i64>().ok()?, m.parse::<i64>().ok()?),
        None if body.len() <= 2 => (body.parse::<i64>().ok()?, 0),
        None if body.len() == 4 => (body[..2].parse::<i64>().ok()?, body[2..].parse::<i64>().ok()?),
        None => return None,
    };
    (hours <= 15 && minutes < 60).then_some(sign * (hours * MICROS_PER_HOUR + minutes * 60 * MICROS_PER_SECOND))
}

/// `hh:mm[:ss[.ffffff]]` within a day (24:00:00 allowed, as PostgreSQL).
fn parse_time_of_day(text: &str) -> Option<i64> {
    let mut parts = text.split(':');
    let hours: i64 = parts.next()?.parse().ok()?;
    let minutes: i64 = parts.next()?.parse().ok()?;
    let (seconds, fraction) = match parts.next() {
        Some(s) => s.split_once('.').unwrap_or((s, "")),
        None => ("0", ""),
    };
    let seconds: i64 = seconds.parse().ok()?;
    if parts.next().is_some() || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut micros: i64 = 0;
    for (i, digit) in fraction.bytes().chain(std::iter::repeat(b'0')).take(7).enumerate() {
        let digit = i64::from(digit - b'0');
        if i < 6 {
            micros = micros * 10 + digit;
        } else if digit >= 5 {
            micros += 1;
        }
    }
    let total = ((hours * 60 + minutes) * 60 + seconds) * MICROS_PER_SECOND + micros;
    let valid = (0..=24).contains(&hours) && (0..60).contains(&minutes) && (0..60).contains(&seconds);
    (valid && total <= MICROS_PER_DAY).then_some(total)
}

/// PostgreSQL's ISO output: `2020-03-04 05:06:07.5`, `+00` after a `timestamp with time zone`.
pub fn format_timestamp(micros: i64, with_zone: bool) -> String {
    match micros {
        TIMESTAMP_INFINITY => return "infinity".into(),
        TIMESTAMP_MINUS_INFINITY => return "-infinity".into(),
        _ => {}
    }
    let days = micros.div_euclid(MICROS_PER_DAY);
    let time = micros.rem_euclid(MICROS_PER_DAY);
    let mut out = format!("{} {}", format_date(days as i32), format_clock(time));
    if with_zone {
        out.push_str("+00");
    }
    out
}

/// `hh:mm:ss[.ffffff]`, trailing zeros of the fraction dropped.
pub fn format_clock(micros: i64) -> String {
    let seconds = micros / MICROS_PER_SECOND;
    let mut out = format!("{:02}:{:02}:{:02}", seconds / 3_600, seconds / 60 % 60, seconds % 60);
    append_fraction(&mut out, micros % MICROS_PER_SECOND);
    out
}

fn append_fraction(out: &mut String, micros: i64) {
    if micros != 0 {
        let fraction = format!("{:06}", micros.abs());
        out.push('.');
        out.push_str(fraction.trim_end_matches('0'));
    }
}

/// Midnight of a date.
pub fn timestamp_of_date(days: i32) -> i64 {
    i64::from(days) * MICROS_PER_DAY
}

/// The date a timestamp falls on (`timestamp::date`).
pub fn date_of_timestamp(micros: i64) -> Result<i32> {
    if micros == TIMESTAMP_INFINITY || micros == TIMESTAMP_MINUS_INFINITY {
        return Err(EngineError::unsupported("infinite timestamp as a date"));
    }
    i32::try_from(micros.div_euclid(MICROS_PER_DAY))
        .map_err(|_| EngineError::DatetimeOutOfRange("date out of range".into()))
}

fn is_finite(micros: i64) -> bool {
    micros != TIMESTAMP_INFINITY && micros != TIMESTAMP_MINUS_INFINITY
}

fn checked(micros: i128) -> Result<i64> {
    let value = i64::try_from(micros).map_err(|_| out_of_range())?;
    let year = civil_from_days(i32::try_from(value.div_euclid(MICROS_PER_DAY)).map_err(|_| out_of_range())?).0;
    if !(1..=TIMESTAMP_MAX_YEAR).contains(&year) {
        return Err(out_of_range());
    }
    Ok(value)
}

/// `timestamp + interval`: months first (the day clamped to the month's end), then days,
/// then time, as PostgreSQL. Infinite timestamps stay infinite.
pub fn add_interval(micros: i64, interval: Interval) -> Result<i64> {
    if !is_finite(micros) {
        return Ok(micros);
    }
    let days = date_of_timestamp(micros)?;
    let time = micros.rem_euclid(MICROS_PER_DAY);
    let shifted = i128::from(add_months(days, interval.months)) + i128::from(interval.days);
    checked(shifted * i128::from(MICROS_PER_DAY) + i128::from(time) + i128::from(interval.micros))
}

/// `timestamp - timestamp`: whole days and the time left over (no months), as PostgreSQL's
/// `timestamp_mi` followed by its `justify_hours`.
pub fn difference(a: i64, b: i64) -> Result<Interval> {
    if !is_finite(a) || !is_finite(b) {
        return Err(EngineError::DatetimeOutOfRange("cannot subtract infinite timestamps".into()));
    }
    let micros = a.checked_sub(b).ok_or_else(|| EngineError::Overflow("interval out of range".into()))?;
    let days = micros / MICROS_PER_DAY;
    Ok(Interval { months: 0, days: i32::try_from(days).map_err(|_| out_of_range())?, micros: micros % MICROS_PER_DAY })
}

/// A unit of `date_trunc` and EXTRACT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatePart {
    Microseconds,
    Milliseconds,
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Quarter,
    Year,
    Decade,
    Century,
    Millennium,
    DayOfWeek,
    IsoDayOfWeek,
    DayOfYear,
    IsoYear,
    Epoch,
    Julian,
    Timezone,
    TimezoneHour,
    TimezoneMinute,
}

impl DatePart {
    /// PostgreSQL's spellings of a unit (case-insensitive, plurals and abbreviations).
    pub fn named(name: &str) -> Option<DatePart> {
        use DatePart as P;
        Some(match name.trim().to_ascii_lowercase().as_str() {
            "microsecond" | "microseconds" | "us" | "usec" | "usecs" | "useconds" => P::Microseconds,
            "millisecond" | "milliseconds" | "ms" | "msec" | "msecs" | "mseconds" => P::Milliseconds,
            "second" | "seconds" | "s" | "sec" | "secs" => P::Second,
            "minute" | "minutes" | "m" | "min" | "mins" => P::Minute,
            "hour" | "hours" | "h" | "hr" | "hrs" => P::Hour,
            "day" | "days" | "d" => P::Day,
            "week" | "weeks" | "w" => P::Week,
            "month" | "months" | "mon" | "mons" => P::Month,
            "quarter" | "qtr" => P::Quarter,
            "year" | "years" | "y" | "yr" | "yrs" => P::Year,
            "decade" | "decades" | "dec" | "decs" => P::Decade,
            "century" | "centuries" | "c" | "cent" => P::Century,
            "millennium" | "millennia" | "millenium" | "mil" | "mils" | "millenniums" => P::Millennium,
            "dow" => P::DayOfWeek,
            "isodow" => P::IsoDayOfWeek,
            "doy" => P::DayOfYear,
            "isoyear" => P::IsoYear,
            "epoch" => P::Epoch,
            "julian" | "j" => P::Julian,
            "timezone" => P::Timezone,
            "timezone_h" | "timezone_hour" => P::TimezoneHour,
            "timezone_m" | "timezone_minute" => P::TimezoneMinute,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        use DatePart as P;
        match self {
            P::Microseconds => "microseconds",
            P::Milliseconds => "milliseconds",
            P::Second => "second",
            P::Minute => "minute",
            P::Hour => "hour",
            P::Day => "day",
            P::Week => "week",
            P::Month => "month",
            P::Quarter => "quarter",
            P::Year => "year",
            P::Decade => "decade",
            P::Century => "century",
            P::Millennium => "millennium",
            P::DayOfWeek => "dow",
            P::IsoDayOfWeek => "isodow",
            P::DayOfYear => "doy",
            P::IsoYear => "isoyear",
            P::Epoch => "epoch",
            P::Julian => "julian",
            P::Timezone => "timezone",
            P::TimezoneHour => "timezone_hour",
            P::TimezoneMinute => "timezone_minute",
        }
    }

    /// Digits after the point in EXTRACT's numeric result (PostgreSQL 15).
    pub fn scale(self, of_date: bool) -> u8 {
        match self {
            DatePart::Second | DatePart::Epoch if !of_date => 6,
            DatePart::Milliseconds => 3,
            _ => 0,
        }
    }

    /// Whether EXTRACT from a value of this kind has the field (PostgreSQL: 0A000 otherwise).
    pub fn applies(self, of_date: bool, with_zone: bool) -> bool {
        use DatePart as P;
        let time_field = matches!(self, P::Microseconds | P::Milliseconds | P::Second | P::Minute | P::Hour);
        let zone_field = matches!(self, P::Timezone | P::TimezoneHour | P::TimezoneMinute);
        let lacking = (of_date && time_field) || (zone_field && !with_zone) || (self == P::Julian && !of_date);
        !lacking
    }
}

impl DatePart {
    /// Whether EXTRACT from an interval has the field (PostgreSQL: 0A000 otherwise).
    pub fn applies_to_interval(self) -> bool {
        use DatePart as P;
        matches!(
            self,
            P::Microseconds
                | P::Milliseconds
                | P::Second
                | P::Minute
                | P::Hour
                | P::Day
                | P::Month
                | P::Quarter
                | P::Year
                | P::Decade
                | P::Century
                | P::Millennium
                | P::Epoch
        )
    }
}

/// The ISO 8601 year and week of a date (weeks start on Monday; week 1 holds January 4th).
fn iso_week(days: i32) -> (i32, i32) {
    let iso_dow = (days + 3).rem_euclid(7) + 1; // 1970-01-01 was a Thursday
    let thursday = days - iso_dow + 4;
    let year = civil_from_days(thursday).0;
    let week = (thursday - days_from_civil(year, 1, 1)) / 7 + 1;
    (year, week)
}

/// EXTRACT(part FROM timestamp) scaled by 10^`part.scale(false)`; a date is midnight with
/// `of_date` (its epoch and julian are whole days).
pub fn extract(part: DatePart, micros: i64, of_date: bool) -> Result<i64> {
    use DatePart as P;
    if !is_finite(micros) {
        return Err(EngineError::unsupported("EXTRACT from an infinite timestamp"));
    }
    let days = date_of_timestamp(micros)?;
    let time = micros.rem_euclid(MICROS_PER_DAY);
    let (year, month, day) = civil_from_days(days);
    let second_micros = time % (60 * MICROS_PER_SECOND);
    Ok(match part {
        P::Microseconds => second_micros,
        P::Milliseconds => second_micros,
        P::Second => second_micros,
        P::Minute => time / (60 * MICROS_PER_SECOND) % 60,
        P::Hour => time / MICROS_PER_HOUR,
        P::Day => i64::from(day),
        P::Week => i64::from(iso_week(days).1),
        P::Month => i64::from(month),
        P::Quarter => i64::from((month - 1) / 3 + 1),
        P::Year => i64::from(year),
        P::Decade => i64::from(year.div_euclid(10)),
        P::Century => i64::from((year + 99) / 100),
        P::Millennium => i64::from((year + 999) / 1000),
        P::DayOfWeek => i64::from((days + 4).rem_euclid(7)),
        P::IsoDayOfWeek => i64::from((days + 3).rem_euclid(7) + 1),
        P::DayOfYear => i64::from(days - days_from_civil(year, 1, 1) + 1),
        P::IsoYear => i64::from(iso_week(days).0),
        P::Epoch if of_date => micros / MICROS_PER_DAY * 86_400,
        P::Epoch => micros,
        // Julian day number: 2440588 was 1970-01-01.
        P::Julian => i64::from(days) + 2_440_588,
        P::Timezone | P::TimezoneHour | P::TimezoneMinute => 0,
    })
}

/// `date_trunc(unit, timestamp)`: the start of the unit the timestamp falls in (weeks begin
/// on Monday; centuries and millennia on their year 1).
pub fn truncate(part: DatePart, micros: i64) -> Result<i64> {
    use DatePart as P;
    if !is_finite(micros) {
        return Ok(micros);
    }
    let days = date_of_timestamp(micros)?;
    let time = micros.rem_euclid(MICROS_PER_DAY);
    let (year, month, _) = civil_from_days(days);
    let midnight = |d: i32| timestamp_of_date(d);
    let first_of = |y: i32, m: u32| midnight(days_from_civil(y, m, 1));
    Ok(match part {
        P::Microseconds => micros,
        P::Milliseconds => micros - micros.rem_euclid(1_000),
        P::Second => micros - micros.rem_euclid(MICROS_PER_SECOND),
        P::Minute => micros - micros.rem_euclid(60 * MICROS_PER_SECOND),
        P::Hour => micros - micros.rem_euclid(MICROS_PER_HOUR),
        P::Day => micros - time,
        P::Week => midnight(days - (days + 3).rem_euclid(7)),
        P::Month => first_of(year, month),
        P::Quarter => first_of(year, (month - 1) / 3 * 3 + 1),
        P::Year => first_of(year, 1),
        P::Decade => first_of(year.div_euclid(10) * 10, 1),
        P::Century => first_of((year - 1).div_euclid(100) * 100 + 1, 1),
        P::Millennium => first_of((year - 1).div_euclid(1000) * 1000 + 1, 1),
        other => return Err(unit_not_supported(other, false)),
    })
}

pub fn unit_not_supported(part: DatePart, with_zone: bool) -> EngineError {
    let type_name = if with_zone { "timestamp with time zone" } else { "timestamp without time zone" };
    EngineError::unsupported(format!("unit \"{}\" for type {type_name}", part.name()))
}

/// PostgreSQL's `postgres` IntervalStyle: `1 year 2 mons -3 days +04:05:06.5`.
pub fn format_interval(interval: Interval) -> String {
    let mut out = String::new();
    let mut is_zero = true;
    let mut is_before = false;
    let (years, months) = (interval.months / 12, interval.months % 12);
    for (value, unit) in [(years, "year"), (months, "mon"), (interval.days, "day")] {
        if value == 0 {
            continue;
        }
        let space = if is_zero { "" } else { " " };
        let plus = if is_before && value > 0 { "+" } else { "" };
        let plural = if value != 1 { "s" } else { "" };
        out.push_str(&format!("{space}{plus}{value} {unit}{plural}"));
        is_before = value < 0;
        is_zero = false;
    }
    if is_zero || interval.micros != 0 {
        let sign = if interval.micros < 0 {
            "-"
        } else if is_before {
            "+"
        } else {
            ""
        };
        let space = if is_zero { "" } else { " " };
        let magnitude = interval.micros.unsigned_abs() as i64;
        let seconds = magnitude / MICROS_PER_SECOND;
        out.push_str(&format!("{space}{sign}{:02}:{:02}:{:02}", seconds / 3_600, seconds / 60 % 60, seconds % 60));
        append_fraction(&mut out, magnitude % MICROS_PER_SECOND);
    }
    out
}

/// EXTRACT(part FROM interval), scaled as for timestamps.
pub fn extract_interval(part: DatePart, interval: Interval) -> Result<i64> {
    use DatePart as P;
    let time = interval.micros;
    Ok(match part {
        P::Microseconds | P::Milliseconds | P::Second => time % (60 * MICROS_PER_SECOND),
        P::Minute => time / (60 * MICROS_PER_SECOND) % 60,
        P::Hour => time / MICROS_PER_HOUR,
        P::Day => i64::from(interval.days),
        P::Month => i64::from(interval.months % 12),
        P::Quarter => i64::from(interval.months % 12 / 3 + 1),
        P::Year => i64::from(interval.months / 12),
        P::Decade => i64::from(interval.months / 120),
        P::Century => i64::from(interval.months / 1_200),
        P::Millennium => i64::from(interval.months / 12_000),
        // PostgreSQL counts a year as 365.25 days and a month as 30 in an interval's epoch.
        P::Epoch => {
            let years = i128::from(interval.months / 12) * 36_525 * i128::from(MICROS_PER_DAY) / 100;
            let months = i128::from(interval.months % 12) * 30 * i128::from(MICROS_PER_DAY);
            let days = i128::from(interval.days) * i128::from(MICROS_PER_DAY);
            i64::try_from(years + months + days + i128::from(time)).map_err(|_| out_of_range())?
        }
        other => return Err(EngineError::unsupported(format!("unit \"{}\" for type interval", other.name()))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(text: &str) -> i64 {
        parse_timestamp(text, false).expect("valid timestamp")
    }

    // Goal: timestamps read and print as PostgreSQL's ISO style; method: fixed texts.
    #[test]
    fn timestamps_round_trip() {
        assert_eq!(ts("1970-01-01 00:00:00"), 0);
        assert_eq!(format_timestamp(ts("2020-03-04 05:06:07.5"), false), "2020-03-04 05:06:07.5");
        assert_eq!(format_timestamp(ts("2020-03-04"), false), "2020-03-04 00:00:00");
        assert_eq!(format_timestamp(ts("2020-03-04T23:59:59.123456"), false), "2020-03-04 23:59:59.123456");
        assert_eq!(ts("2020-03-04 05:06:07+02"), ts("2020-03-04 05:06:07"));
        let zoned = parse_timestamp("2020-03-04 05:06:07+02", true).expect("valid");
        assert_eq!(format_timestamp(zoned, true), "2020-03-04 03:06:07+00");
        assert_eq!(format_timestamp(ts("1969-12-31 23:00:00"), false), "1969-12-31 23:00:00");
        assert_eq!(format_timestamp(ts("infinity"), false), "infinity");
        assert!(parse_timestamp("2020-03-04 25:00", false).is_err());
        assert!(parse_timestamp("yesterday-ish", false).is_err());
    }

    // Goal: fields and truncation agree with PostgreSQL 15 on known dates; method: fixed cases.
    #[test]
    fn extracts_and_truncates() {
        let t = ts("2020-03-04 05:06:07.5");
        assert_eq!(extract(DatePart::Quarter, t, false).expect("ok"), 1);
        assert_eq!(extract(DatePart::DayOfWeek, t, false).expect("ok"), 3);
        assert_eq!(extract(DatePart::DayOfYear, t, false).expect("ok"), 64);
        assert_eq!(extract(DatePart::Week, t, false).expect("ok"), 10);
        assert_eq!(extract(DatePart::Second, t, false).expect("ok"), 7_500_000);
        assert_eq!(extract(DatePart::Century, t, false).expect("ok"), 21);
        assert_eq!(extract(DatePart::IsoYear, ts("2021-01-01"), false).expect("ok"), 2020);
        let trunc = |p, t| format_timestamp(truncate(p, t).expect("ok"), false);
        assert_eq!(trunc(DatePart::Month, t), "2020-03-01 00:00:00");
        assert_eq!(trunc(DatePart::Week, t), "2020-03-02 00:00:00");
        assert_eq!(trunc(DatePart::Quarter, t), "2020-01-01 00:00:00");
        assert_eq!(trunc(DatePart::Century, t), "2001-01-01 00:00:00");
        assert_eq!(trunc(DatePart::Hour, t), "2020-03-04 05:00:00");
    }

    // Goal: a session in another time zone is refused `timestamp with time zone` (never shown
    // in UTC) and gets it back in UTC; method: SET TimeZone in one session, then statements.
    #[test]
    fn another_time_zone_refuses_timestamptz() {
        let engine = crate::Engine::new(crate::EngineSettings::default()).expect("engine");
        let mut session = crate::session::Session::new(1 << 30);
        let mut run = |sql: &str| {
            let statements = session.parse(sql).expect("parses");
            session.execute_collect(&engine, &statements[0]).map(|_| ()).map_err(|e| e.sqlstate().to_string())
        };
        assert_eq!(run("set timezone = 'Europe/Berlin'"), Ok(()));
        assert_eq!(run("select '2020-01-01'::timestamptz"), Err("0A000".into()));
        assert_eq!(run("select date_trunc('month', date '2020-03-04')"), Err("0A000".into()));
        assert_eq!(run("select timestamp '2020-01-01'"), Ok(()));
        assert_eq!(run("set timezone = 'UTC'"), Ok(()));
        assert_eq!(run("select '2020-01-01'::timestamptz"), Ok(()));
    }

    // Goal: interval arithmetic and printing as PostgreSQL's; method: fixed cases.
    #[test]
    fn intervals_add_subtract_and_print() {
        let i = |text| Interval::parse(text).expect("valid interval");
        assert_eq!(
            format_timestamp(add_interval(ts("2020-01-31"), i("1 month")).expect("ok"), false),
            "2020-02-29 00:00:00"
        );
        assert_eq!(
            format_interval(difference(ts("2020-03-04 06:00"), ts("2020-03-01 05:00")).expect("ok")),
            "3 days 01:00:00"
        );
        assert_eq!(format_interval(i("1 year 2 mons")), "1 year 2 mons");
        assert_eq!(format_interval(i("-1 mons 2 days")), "-1 mons +2 days");
        assert_eq!(format_interval(i("0 days")), "00:00:00");
        assert_eq!(format_interval(i("1 day -01:00:00")), "1 day -01:00:00");
        assert_eq!(format_interval(i("90 min")), "01:30:00");
        assert_eq!(format_interval(i("1.5 sec")), "00:00:01.5");
    }
}
