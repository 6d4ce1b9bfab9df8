//! Window functions over a materialized input (the Window plan node).
//!
//! ```text
//!   input rows ─► per call: sort a row permutation by (PARTITION BY, ORDER BY)
//!     ─► partitions (equal partition keys) ─► peer groups (equal ORDER BY keys)
//!     ─► ranking / offset / frame values, aggregates over each row's frame
//!   output: the input's columns, then one column per call (rows keep the input's order)
//! ```
//!
//! Frames are position ranges of the sorted partition (`window_frame`: ROWS, RANGE, GROUPS,
//! EXCLUDE; no ORDER BY: every row is a peer). Aggregates reuse the hash aggregate's states:
//! a frame that starts at the partition's first row and excludes nothing grows row by row
//! with one state; any other frame is aggregated afresh per row.

use crate::error::{EngineError, Result};
use crate::exec::aggregate::AggregateState;
use crate::exec::sort::sort_batch;
use crate::expr::{evaluate, Expr};
use crate::plan::{AggregateCall, AggregateFunction, FrameBound, FrameExclusion, SortKey, WindowCall, WindowFunction};
use crate::types::{DataType, Value, ValueKey};
use crate::vector::{Batch, Data, Vector};
use crate::window_frame::{Current, FrameInput};

/// The input's columns followed by each call's values. When every call has the same
/// PARTITION BY and ORDER BY, the rows come in that order, as PostgreSQL's window node emits
/// them (a LIMIT or a stable final sort then keeps PostgreSQL's rows); else in input order.
pub fn evaluate_windows(batch: &Batch, calls: &[WindowCall]) -> Result<Batch> {
    let mut columns = batch.columns.clone();
    for call in calls {
        columns.push(evaluate_call(batch, call)?);
    }
    let evaluated = Batch::new(columns, batch.rows);
    let Some(first) = calls.first() else { return Ok(evaluated) };
    let one_window = calls.iter().all(|c| c.partition == first.partition && c.order == first.order);
    if !one_window || (first.partition.is_empty() && first.order.is_empty()) {
        return Ok(evaluated);
    }
    let order = sort_rows(batch, first)?.rows;
    Ok(Batch::new(evaluated.columns.iter().map(|c| c.gather(&order)).collect(), batch.rows))
}

/// The call's sorted rows, their partition and peer boundaries, and its arguments.
struct Sorted {
    rows: Vec<u32>,
    partition_keys: Vec<Vec<ValueKey>>,
    order_keys: Vec<Vec<ValueKey>>,
}

fn evaluate_call(batch: &Batch, call: &WindowCall) -> Result<Vector> {
    let sorted = sort_rows(batch, call)?;
    let args = call.args.iter().map(|e| evaluate(e, batch)).collect::<Result<Vec<_>>>()?;
    let mut results = vec![Value::Null; batch.rows];
    let mut start = 0;
    while start < sorted.rows.len() {
        crate::control::check()?;
        let key = &sorted.partition_keys[start];
        let end = start + sorted.partition_keys[start..].iter().take_while(|k| *k == key).count();
        let partition = Partition { rows: &sorted.rows[start..end], order_keys: &sorted.order_keys[start..end] };
        partition.evaluate(call, &args, &mut results)?;
        start = end;
    }
    Ok(Vector::from_values(&results, call.data_type))
}

/// Rows sorted by partition keys then ORDER BY keys (ties keep the input order), with each
/// sorted row's keys for boundary tests.
fn sort_rows(batch: &Batch, call: &WindowCall) -> Result<Sorted> {
    let mut columns = Vec::new();
    for expr in call.partition.iter().chain(call.order.iter().map(|k| &k.expr)) {
        columns.push(evaluate(expr, batch)?);
    }
    let index: Vec<Value> = (0..batch.rows).map(|r| Value::Int64(r as i64)).collect();
    columns.push(Vector::from_values(&index, DataType::Int64));
    let partitions = call.partition.len();
    let mut keys: Vec<SortKey> = call
        .partition
        .iter()
        .enumerate()
        .map(|(i, e)| SortKey {
            expr: Expr::Column { index: i, data_type: e.data_type() },
            descending: false,
            nulls_first: false,
        })
        .collect();
    keys.extend(call.order.iter().enumerate().map(|(i, k)| SortKey {
        expr: Expr::Column { index: partitions + i, data_type: k.expr.data_type() },
        ..k.clone()
    }));
    let last = columns.len() - 1;
    keys.push(SortKey {
        expr: Expr::Column { index: last, data_type: DataType::Int64 },
        descending: false,
        nulls_first: false,
    });
    let sorted = sort_batch(&Batch::new(columns, batch.rows), &keys, None)?;
    let rows: Vec<u32> = match &sorted.columns[last].data {
        Data::I64(values) => values.iter().map(|&v| v as u32).collect(),
        _ => return Err(EngineError::Runtime("window row numbers are bigint".into())),
    };
    let keys_of = |range: std::ops::Range<usize>, row: usize| -> Vec<ValueKey> {
        range.map(|c| sorted.columns[c].value(row).key()).collect()
    };
    let partition_keys = (0..sorted.rows).map(|r| keys_of(0..partitions, r)).collect();
    let order_keys = (0..sorted.rows).map(|r| keys_of(partitions..last, r)).collect();
    Ok(Sorted { rows, partition_keys, order_keys })
}

/// One partition's rows (input row numbers, sorted) and their ORDER BY keys.
struct Partition<'a> {
    rows: &'a [u32],
    order_keys: &'a [Vec<ValueKey>],
}

impl Partition<'_> {
    fn len(&self) -> usize {
        self.rows.len()
    }

    /// Peer groups as (start, end) positions, in order.
    fn peer_groups(&self) -> Vec<(usize, usize)> {
        let mut groups = Vec::new();
        let mut start = 0;
        while start < self.len() {
            let key = &self.order_keys[start];
            let end = start + self.order_keys[start..].iter().take_while(|k| *k == key).count();
            groups.push((start, end));
            start = end;
        }
        groups
    }

    /// The frame of position `i` (in peer group `group`) as ascending position ranges.
    fn frame(
        &self,
        call: &WindowCall,
        groups: &[(usize, usize)],
        i: usize,
        group: usize,
    ) -> Result<Vec<(usize, usize)>> {
        let first_key = call.order.first();
        let input = FrameInput {
            len: self.len(),
            groups,
            keys: self.order_keys,
            descending: first_key.is_some_and(|k| k.descending),
            nulls_first: first_key.is_some_and(|k| k.nulls_first),
        };
        input.pieces(&call.frame, Current { position: i, group })
    }

    fn evaluate(&self, call: &WindowCall, args: &[Vector], results: &mut [Value]) -> Result<()> {
        let groups = self.peer_groups();
        let n = self.len();
        let mut rank = 1;
        for (dense, &(start, end)) in groups.iter().enumerate() {
            for i in start..end {
                let value = match call.function {
                    WindowFunction::RowNumber => Value::Int64(i as i64 + 1),
                    WindowFunction::Rank => Value::Int64(rank),
                    WindowFunction::DenseRank => Value::Int64(dense as i64 + 1),
                    WindowFunction::PercentRank => {
                        Value::Float64(if n > 1 { (rank - 1) as f64 / (n - 1) as f64 } else { 0.0 })
                    }
                    WindowFunction::CumeDist => Value::Float64(end as f64 / n as f64),
                    WindowFunction::Ntile => ntile(args, self.rows[i], i, n)?,
                    WindowFunction::Lag | WindowFunction::Lead => self.offset_value(call, args, i)?,
                    WindowFunction::FirstValue | WindowFunction::LastValue | WindowFunction::NthValue => {
                        self.frame_value(call, args, &self.frame(call, &groups, i, dense)?, i)?
                    }
                    WindowFunction::Aggregate(_) => continue,
                };
                results[self.rows[i] as usize] = value;
            }
            rank += (end - start) as i64;
        }
        if let WindowFunction::Aggregate(function) = call.function {
            self.aggregate(call, function, args, &groups, results)?;
        }
        Ok(())
    }

    /// lag/lead: the value `offset` rows before/after (default 1), else the default (NULL).
    fn offset_value(&self, call: &WindowCall, args: &[Vector], i: usize) -> Result<Value> {
        let row = self.rows[i] as usize;
        let offset = match args.get(1).map(|a| a.value(row)) {
            None => 1,
            Some(Value::Null) => return Ok(Value::Null),
            Some(Value::Int32(k)) => i64::from(k),
            Some(Value::Int64(k)) => k,
            Some(other) => return Err(EngineError::Type(format!("lag/lead offset {other:?}"))),
        };
        let offset = if call.function == WindowFunction::Lag { -offset } else { offset };
        let target = i as i64 + offset;
        if target >= 0 && (target as usize) < self.len() {
            return Ok(args[0].value(self.rows[target as usize] as usize));
        }
        Ok(args.get(2).map_or(Value::Null, |default| default.value(row)))
    }

    /// first_value / last_value / nth_value over the row's frame.
    fn frame_value(&self, call: &WindowCall, args: &[Vector], pieces: &[(usize, usize)], i: usize) -> Result<Value> {
        let mut positions = pieces.iter().flat_map(|&(start, end)| start..end);
        let position = match call.function {
            WindowFunction::FirstValue => positions.next(),
            WindowFunction::LastValue => pieces.last().map(|&(_, end)| end - 1),
            _ => match args[1].value(self.rows[i] as usize) {
                Value::Null => return Ok(Value::Null),
                Value::Int32(k) if k > 0 => positions.nth(k as usize - 1),
                Value::Int64(k) if k > 0 => positions.nth(usize::try_from(k - 1).unwrap_or(usize::MAX)),
                _ => return Err(EngineError::InvalidValue("argument of nth_value must be greater than zero".into())),
            },
        };
        Ok(position.map_or(Value::Null, |p| args[0].value(self.rows[p] as usize)))
    }

    /// An aggregate over each row's frame: grown row by row while frames start at the
    /// partition's first row, else computed afresh per row.
    fn aggregate(
        &self,
        call: &WindowCall,
        function: AggregateFunction,
        args: &[Vector],
        groups: &[(usize, usize)],
        results: &mut [Value],
    ) -> Result<()> {
        let column = |index: usize| args.get(index).map(|a| Expr::Column { index, data_type: a.data_type });
        let aggregate = AggregateCall {
            function,
            argument: column(0),
            data_type: call.data_type,
            distinct: false,
            filter: None,
            second: column(1),
        };
        // A frame that starts at the partition's first row and leaves nothing out only grows
        // as the row advances (its end is monotone), so one state serves every row.
        let growing =
            call.frame.start == FrameBound::UnboundedPreceding && call.frame.exclusion == FrameExclusion::NoOthers;
        let mut state = new_state(&aggregate);
        let mut added = 0;
        for (group, &(peers_start, peers_end)) in groups.iter().enumerate() {
            for i in peers_start..peers_end {
                if i % crate::exec::CHECK_EVERY_ROWS == 0 {
                    crate::control::check()?;
                }
                let pieces = self.frame(call, groups, i, group)?;
                if growing {
                    let end = pieces.last().map_or(0, |&(_, end)| end);
                    if end > added {
                        self.add_rows(&aggregate, &mut state, args, added..end)?;
                        added = end;
                    }
                } else {
                    state = new_state(&aggregate);
                    for (start, end) in pieces {
                        self.add_rows(&aggregate, &mut state, args, start..end)?;
                    }
                }
                results[self.rows[i] as usize] = state.finish(&aggregate)?.value(0);
            }
        }
        Ok(())
    }
}

impl Partition<'_> {
    /// Adds the rows at `positions` to the aggregate's one state.
    fn add_rows(
        &self,
        aggregate: &AggregateCall,
        state: &mut AggregateState,
        args: &[Vector],
        positions: std::ops::Range<usize>,
    ) -> Result<()> {
        let rows: Vec<u32> = self.rows[positions].to_vec();
        let zeros = vec![0u32; rows.len()];
        let gathered = Batch::new(args.iter().map(|a| a.gather(&rows)).collect(), rows.len());
        state.update_call(aggregate, &zeros, &gathered)
    }
}

fn new_state(call: &AggregateCall) -> AggregateState {
    let mut state = AggregateState::new(call);
    state.resize(1);
    state
}

/// ntile(k): PostgreSQL's buckets (the first n % k buckets one row larger).
fn ntile(args: &[Vector], row: u32, i: usize, n: usize) -> Result<Value> {
    let buckets = match args[0].value(row as usize) {
        Value::Null => return Ok(Value::Null),
        Value::Int32(k) if k > 0 => k as usize,
        Value::Int64(k) if k > 0 => k as usize,
        _ => return Err(EngineError::InvalidValue("argument of ntile must be greater than zero".into())),
    };
    let size = n / buckets;
    let larger = n % buckets;
    let bucket = if size == 0 {
        i
    } else if i < larger * (size + 1) {
        i / (size + 1)
    } else {
        larger + (i - larger * (size + 1)) / size
    };
    Ok(Value::Int32(bucket as i32 + 1))
}
