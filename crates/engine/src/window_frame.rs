//! Window frames: ROWS, RANGE and GROUPS units, offset bounds, EXCLUDE, and where a row's
//! frame starts and ends in its sorted partition.
//!
//! ```text
//!   sorted partition:  0 1 2 │3 4│5 6 7 8│9          (│ = peer group boundaries)
//!   row 4, ROWS 1 PRECEDING AND 1 FOLLOWING    → positions 3..6
//!   row 4, GROUPS 1 PRECEDING AND CURRENT ROW  → positions 0..5
//!   row 4, RANGE 2 PRECEDING AND 2 FOLLOWING   → rows whose key is within key(4) ± 2
//!   EXCLUDE CURRENT ROW / GROUP / TIES         → the frame minus row 4 / 3..5 / 3..5 but 4
//! ```
//!
//! RANGE offsets follow PostgreSQL's `in_range` support functions (exact for integers and
//! numeric, IEEE with PostgreSQL's rules for infinities and NaN for floats); NULL keys are
//! peers of each other and never within an offset of a non-NULL key.

use crate::error::{EngineError, Result};
use crate::interval::Interval;
use crate::numeric::Numeric;
use crate::types::{Value, ValueKey};

/// What a frame offset counts: rows, peer groups, or a distance in the ORDER BY key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameUnits {
    Rows,
    Range,
    Groups,
}

/// A ROWS or GROUPS offset is a count; a RANGE offset is a value of the offset type the
/// ORDER BY key's type takes (bigint for integers, double for floats, numeric for numeric,
/// interval for dates and timestamps).
#[derive(Debug, Clone, PartialEq)]
pub enum FrameOffset {
    Count(u64),
    Distance(Value),
    /// An interval from a date key.
    Interval(Interval),
    /// An interval from a timestamp key (either kind: both are microseconds).
    TimestampInterval(Interval),
}

#[derive(Debug, Clone, PartialEq)]
pub enum FrameBound {
    UnboundedPreceding,
    Preceding(FrameOffset),
    CurrentRow,
    Following(FrameOffset),
    UnboundedFollowing,
}

/// EXCLUDE: rows of the frame left out around the current row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameExclusion {
    NoOthers,
    CurrentRow,
    Group,
    Ties,
}

#[derive(Debug, Clone, PartialEq)]
pub struct WindowFrame {
    pub units: FrameUnits,
    pub start: FrameBound,
    pub end: FrameBound,
    pub exclusion: FrameExclusion,
}

impl WindowFrame {
    /// PostgreSQL's default: RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW.
    pub const DEFAULT: WindowFrame = WindowFrame {
        units: FrameUnits::Range,
        start: FrameBound::UnboundedPreceding,
        end: FrameBound::CurrentRow,
        exclusion: FrameExclusion::NoOthers,
    };
}

/// One sorted partition as the frame sees it: its peer groups and, for RANGE offsets, the
/// single ORDER BY key of each position with its direction.
pub struct FrameInput<'a> {
    pub len: usize,
    pub groups: &'a [(usize, usize)],
    pub keys: &'a [Vec<ValueKey>],
    pub descending: bool,
    pub nulls_first: bool,
}

/// The position being framed: its index in the partition and its peer group's index.
#[derive(Clone, Copy)]
pub struct Current {
    pub position: usize,
    pub group: usize,
}

impl FrameInput<'_> {
    /// The frame of `current` as ascending position ranges, EXCLUDE applied (empty ranges
    /// left out).
    pub fn pieces(&self, frame: &WindowFrame, current: Current) -> Result<Vec<(usize, usize)>> {
        let start = self.start(frame, current)?;
        let end = self.end(frame, current)?.max(start);
        let (peers_start, peers_end) = self.groups[current.group];
        let i = current.position;
        let cut = |excluded: (usize, usize), kept: Option<usize>| {
            let mut pieces = vec![(start, end.min(excluded.0).max(start))];
            if let Some(k) = kept.filter(|k| (start..end).contains(k)) {
                pieces.push((k, k + 1));
            }
            pieces.push((excluded.1.max(start).min(end), end));
            pieces.retain(|(a, b)| a < b);
            pieces
        };
        Ok(match frame.exclusion {
            FrameExclusion::NoOthers => vec![(start, end)].into_iter().filter(|(a, b)| a < b).collect(),
            FrameExclusion::CurrentRow => cut((i, i + 1), None),
            FrameExclusion::Group => cut((peers_start, peers_end), None),
            FrameExclusion::Ties => cut((peers_start, peers_end), Some(i)),
        })
    }

    fn start(&self, frame: &WindowFrame, current: Current) -> Result<usize> {
        let (i, g) = (current.position, current.group);
        Ok(match (&frame.start, frame.units) {
            (FrameBound::UnboundedPreceding, _) => 0,
            (FrameBound::UnboundedFollowing, _) => self.len,
            (FrameBound::CurrentRow, FrameUnits::Rows) => i,
            (FrameBound::CurrentRow, _) => self.groups[g].0,
            (FrameBound::Preceding(FrameOffset::Count(k)), FrameUnits::Rows) => i.saturating_sub(count(*k)),
            (FrameBound::Following(FrameOffset::Count(k)), FrameUnits::Rows) => {
                i.saturating_add(count(*k)).min(self.len)
            }
            (FrameBound::Preceding(FrameOffset::Count(k)), _) => self.groups[g.saturating_sub(count(*k))].0,
            (FrameBound::Following(FrameOffset::Count(k)), _) => {
                self.groups.get(g.saturating_add(count(*k))).map_or(self.len, |group| group.0)
            }
            (FrameBound::Preceding(d), _) => self.range_start(i, d, true)?,
            (FrameBound::Following(d), _) => self.range_start(i, d, false)?,
        })
    }

    /// The frame's end, exclusive.
    fn end(&self, frame: &WindowFrame, current: Current) -> Result<usize> {
        let (i, g) = (current.position, current.group);
        Ok(match (&frame.end, frame.units) {
            (FrameBound::UnboundedPreceding, _) => 0,
            (FrameBound::UnboundedFollowing, _) => self.len,
            (FrameBound::CurrentRow, FrameUnits::Rows) => i + 1,
            (FrameBound::CurrentRow, _) => self.groups[g].1,
            (FrameBound::Preceding(FrameOffset::Count(k)), FrameUnits::Rows) => (i + 1).saturating_sub(count(*k)),
            (FrameBound::Following(FrameOffset::Count(k)), FrameUnits::Rows) => {
                i.saturating_add(count(*k)).saturating_add(1).min(self.len)
            }
            (FrameBound::Preceding(FrameOffset::Count(k)), _) => {
                g.checked_sub(count(*k)).map_or(0, |earlier| self.groups[earlier].1)
            }
            (FrameBound::Following(FrameOffset::Count(k)), _) => {
                self.groups[g.saturating_add(count(*k)).min(self.groups.len() - 1)].1
            }
            (FrameBound::Preceding(d), _) => self.range_end(i, d, true)?,
            (FrameBound::Following(d), _) => self.range_end(i, d, false)?,
        })
    }

    /// The first position whose key is not before `key(i) ∓ distance` in sort order
    /// (PostgreSQL's frame head search, as a binary search: the test is monotone).
    fn range_start(&self, i: usize, distance: &FrameOffset, preceding: bool) -> Result<usize> {
        let subtract = preceding != self.descending;
        let less = self.descending;
        let current = &self.keys[i][0];
        let mut failure = None;
        let start = partition_point(self.len, |p| {
            let key = &self.keys[p][0];
            let reached = match (key, current) {
                (ValueKey::Null, ValueKey::Null) => true,
                (ValueKey::Null, _) => !self.nulls_first,
                (_, ValueKey::Null) => self.nulls_first,
                _ => in_range(key, current, distance, subtract, less).unwrap_or_else(|e| {
                    failure.get_or_insert(e);
                    true
                }),
            };
            !reached
        });
        failure.map_or(Ok(start), Err)
    }

    /// One past the last position whose key is not after `key(i) ∓ distance` in sort order.
    fn range_end(&self, i: usize, distance: &FrameOffset, preceding: bool) -> Result<usize> {
        let subtract = preceding != self.descending;
        let less = !self.descending;
        let current = &self.keys[i][0];
        let mut failure = None;
        let end = partition_point(self.len, |p| {
            let key = &self.keys[p][0];
            match (key, current) {
                (ValueKey::Null, ValueKey::Null) => true,
                (ValueKey::Null, _) => self.nulls_first,
                (_, ValueKey::Null) => !self.nulls_first,
                _ => in_range(key, current, distance, subtract, less).unwrap_or_else(|e| {
                    failure.get_or_insert(e);
                    false
                }),
            }
        });
        failure.map_or(Ok(end), Err)
    }
}

fn count(k: u64) -> usize {
    usize::try_from(k).unwrap_or(usize::MAX)
}

/// The first index in 0..len where `before` is false (`before` true then false, as sorted).
fn partition_point(len: usize, mut before: impl FnMut(usize) -> bool) -> usize {
    let (mut low, mut high) = (0, len);
    while low < high {
        let middle = low + (high - low) / 2;
        if before(middle) {
            low = middle + 1;
        } else {
            high = middle;
        }
    }
    low
}

/// PostgreSQL's `in_range(value, base, offset, subtract, less)`: whether `value` is at most
/// (`less`) or at least `base - offset` (`subtract`) or `base + offset`.
fn in_range(value: &ValueKey, base: &ValueKey, offset: &FrameOffset, subtract: bool, less: bool) -> Result<bool> {
    use std::cmp::Ordering;
    let within = |order: Ordering| if less { order != Ordering::Greater } else { order != Ordering::Less };
    let offset = match offset {
        // in_range_date_interval: the date at midnight against base ± offset as timestamps.
        FrameOffset::Interval(interval) => {
            let (ValueKey::Int(v), ValueKey::Int(b)) = (value, base) else {
                return Err(EngineError::Runtime(format!("RANGE offset {interval:?} over key {base:?}")));
            };
            let shift = if subtract { interval.negated() } else { *interval };
            let bound = shift.added_to_date(*b as i32);
            return Ok(within((i128::from(*v) * i128::from(crate::interval::MICROS_PER_DAY)).cmp(&bound)));
        }
        // in_range_timestamp_interval: base ± offset as a timestamp.
        FrameOffset::TimestampInterval(interval) => {
            let (ValueKey::Int(v), ValueKey::Int(b)) = (value, base) else {
                return Err(EngineError::Runtime(format!("RANGE offset {interval:?} over key {base:?}")));
            };
            let shift = if subtract { interval.negated() } else { *interval };
            return Ok(within(v.cmp(&crate::datetime::add_interval(*b, shift)?)));
        }
        FrameOffset::Distance(offset) => offset,
        FrameOffset::Count(_) => unreachable!("counts are ROWS and GROUPS offsets"),
    };
    match (value, base, offset) {
        (ValueKey::Int(v), ValueKey::Int(b), Value::Int64(o)) => {
            let bound = if subtract { i128::from(*b) - i128::from(*o) } else { i128::from(*b) + i128::from(*o) };
            Ok(within(i128::from(*v).cmp(&bound)))
        }
        (ValueKey::Float(v), ValueKey::Float(b), Value::Float64(o)) => {
            Ok(float_in_range(f64::from_bits(*v), f64::from_bits(*b), *o, subtract, less))
        }
        (ValueKey::Numeric(v), ValueKey::Numeric(b), Value::Numeric(o)) => {
            Ok(numeric_in_range(*v, *b, *o, subtract, less))
        }
        (ValueKey::Numeric(v), ValueKey::Numeric(b), Value::Decimal { value, scale }) => {
            Ok(numeric_in_range(*v, *b, Numeric::new(i128::from(*value), *scale), subtract, less))
        }
        _ => Err(EngineError::Runtime(format!("RANGE offset {offset:?} over key {base:?}"))),
    }
}

/// in_range_numeric_numeric: NaN is above everything and equal to itself; an infinite
/// offset reaches every value on its side (and, from the infinity it would cancel, every
/// value); an infinite value or base compares as it is, whatever the finite offset.
fn numeric_in_range(value: Numeric, base: Numeric, offset: Numeric, subtract: bool, less: bool) -> bool {
    use std::cmp::Ordering;
    let within = |order: Ordering| if less { order != Ordering::Greater } else { order != Ordering::Less };
    if value.is_nan() {
        return base.is_nan() || !less;
    }
    if base.is_nan() {
        return less;
    }
    if offset.is_infinite() {
        let cancels = if subtract { base == Numeric::INFINITY } else { base == Numeric::NEG_INFINITY };
        return cancels
            || match (subtract, less) {
                (true, true) => value == Numeric::NEG_INFINITY,
                (false, false) => value == Numeric::INFINITY,
                _ => true,
            };
    }
    if value.is_special() || base.is_special() {
        return within(value.cmp(&base));
    }
    let bound = if subtract { base.checked_sub(offset) } else { base.checked_add(offset) };
    match bound {
        Ok(bound) => within(value.cmp(&bound)),
        // Beyond 38 digits the bound is further from base than any value that fits.
        Err(_) => subtract != less,
    }
}

/// in_range_float8_float8: NaN is above everything and equal to itself; a frame bound an
/// infinite distance before +infinity (or after -infinity) holds every row.
fn float_in_range(value: f64, base: f64, offset: f64, subtract: bool, less: bool) -> bool {
    if value.is_nan() {
        return base.is_nan() || !less;
    }
    if base.is_nan() {
        return less;
    }
    if offset.is_infinite() && base.is_infinite() && (if subtract { base > 0.0 } else { base < 0.0 }) {
        return true;
    }
    let bound = if subtract { base - offset } else { base + offset };
    if less {
        value <= bound
    } else {
        value >= bound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(values: &[i64]) -> Vec<Vec<ValueKey>> {
        values.iter().map(|v| vec![ValueKey::Int(*v)]).collect()
    }

    /// Goal: RANGE offsets, GROUPS counts and EXCLUDE pick PostgreSQL's rows; method: one
    /// partition with ties, frames checked by hand.
    #[test]
    fn frames_over_a_partition_with_ties() {
        let keys = keys(&[1, 1, 2, 4, 4, 5]);
        let groups = [(0, 2), (2, 3), (3, 5), (5, 6)];
        let input = FrameInput { len: 6, groups: &groups, keys: &keys, descending: false, nulls_first: false };
        let frame = |units, start, end, exclusion| WindowFrame { units, start, end, exclusion };
        let distance = |d: i64| FrameOffset::Distance(Value::Int64(d));
        let range = frame(
            FrameUnits::Range,
            FrameBound::Preceding(distance(1)),
            FrameBound::Following(distance(1)),
            FrameExclusion::NoOthers,
        );
        assert_eq!(input.pieces(&range, Current { position: 2, group: 1 }).expect("a frame"), vec![(0, 3)]);
        assert_eq!(input.pieces(&range, Current { position: 3, group: 2 }).expect("a frame"), vec![(3, 6)]);
        let groups_frame = frame(
            FrameUnits::Groups,
            FrameBound::Preceding(FrameOffset::Count(1)),
            FrameBound::CurrentRow,
            FrameExclusion::Ties,
        );
        assert_eq!(
            input.pieces(&groups_frame, Current { position: 4, group: 2 }).expect("a frame"),
            vec![(2, 3), (4, 5)]
        );
    }
}
