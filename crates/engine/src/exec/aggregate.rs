//! Hash aggregation: per-worker group tables with typed aggregate states, merged at the end.

use hashbrown::HashTable;

use super::keys::{hash_words, same_key, KeyCache, KeyEncoder};
use crate::error::{EngineError, Result};
use crate::expr::{evaluate, Expr};
use crate::ordered_set::OrderedSet;
use std::collections::HashMap;

use crate::numeric::Numeric;
use crate::plan::{AggregateCall, AggregateFunction};
use crate::statistics::Moments;
use crate::types::{DataType, Value, ValueKey};
use crate::vector::{Batch, Data, Vector};

/// Groups one aggregation may create (a bound, not a tuning knob).
pub const GROUPS_MAX: usize = 1 << 28;

/// Distinct keys → dense group ids.
pub struct GroupTable {
    pub width: usize,
    pub keys: Vec<u64>,
    hashes: Vec<u64>,
    table: HashTable<u32>,
}

impl GroupTable {
    pub fn new(width: usize) -> GroupTable {
        GroupTable::with_capacity(width, 0)
    }

    pub fn with_capacity(width: usize, groups: usize) -> GroupTable {
        GroupTable {
            width,
            keys: Vec::with_capacity(groups * width),
            hashes: Vec::with_capacity(groups),
            table: HashTable::with_capacity(groups),
        }
    }

    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// The group id of `words`, creating the group when new.
    pub fn group_of(&mut self, words: &[u64]) -> Result<u32> {
        self.group_of_hashed(words, hash_words(words))
    }

    /// `group_of` when the key's hash is known (merging partial tables).
    fn group_of_hashed(&mut self, words: &[u64], hash: u64) -> Result<u32> {
        let (keys, width) = (&self.keys, self.width);
        if let Some(&group) =
            self.table.find(hash, |&g| same_key(&keys[g as usize * width..(g as usize + 1) * width], words))
        {
            return Ok(group);
        }
        if self.hashes.len() >= GROUPS_MAX {
            return Err(EngineError::LimitExceeded(format!("more than {GROUPS_MAX} groups")));
        }
        let group = self.hashes.len() as u32;
        self.keys.extend_from_slice(words);
        self.hashes.push(hash);
        let hashes = &self.hashes;
        self.table.insert_unique(hash, group, |&g| hashes[g as usize]);
        Ok(group)
    }
}

/// The running state of one aggregate for every group.
#[derive(Debug, Clone)]
pub enum AggregateState {
    Count(Vec<i64>),
    /// Integer and decimal sums (exact, i128) with the count of non-null inputs.
    SumInt {
        sums: Vec<i128>,
        counts: Vec<i64>,
    },
    SumFloat {
        sums: Vec<f64>,
        counts: Vec<i64>,
    },
    /// Sums of unconstrained numerics (each value with its own scale).
    SumNumeric {
        sums: Vec<Numeric>,
        counts: Vec<i64>,
    },
    MinMax {
        values: Vec<Value>,
        is_min: bool,
    },
    /// `agg(DISTINCT x)`: the distinct non-null values per group; the aggregate runs over
    /// them at the end (partial states merge by union).
    Distinct(Vec<HashMap<ValueKey, Value>>),
    /// var_pop, regr_slope, … (`crate::statistics`).
    Statistics(Moments),
    /// Every non-null value of each group (string_agg, percentiles, mode: `ordered_set`).
    Values(Vec<Vec<Value>>),
}

impl AggregateState {
    pub fn new(call: &AggregateCall) -> AggregateState {
        if call.distinct {
            return AggregateState::Distinct(Vec::new());
        }
        let input = call.argument.as_ref().map(Expr::data_type);
        match (call.function, input) {
            (AggregateFunction::Count | AggregateFunction::CountStar, _) => AggregateState::Count(Vec::new()),
            (AggregateFunction::Min, _) => AggregateState::MinMax { values: Vec::new(), is_min: true },
            (AggregateFunction::Max, _) => AggregateState::MinMax { values: Vec::new(), is_min: false },
            (AggregateFunction::Ordered(_), _) => AggregateState::Values(Vec::new()),
            (AggregateFunction::Statistic(statistic), input) => {
                AggregateState::Statistics(Moments::new(statistic, input.unwrap_or(DataType::Float64)))
            }
            (_, Some(DataType::Float64 | DataType::Float32)) => {
                AggregateState::SumFloat { sums: Vec::new(), counts: Vec::new() }
            }
            (_, Some(DataType::Numeric)) => AggregateState::SumNumeric { sums: Vec::new(), counts: Vec::new() },
            _ => AggregateState::SumInt { sums: Vec::new(), counts: Vec::new() },
        }
    }

    pub fn resize(&mut self, groups: usize) {
        match self {
            AggregateState::Count(c) => c.resize(groups, 0),
            AggregateState::SumInt { sums, counts } => {
                sums.resize(groups, 0);
                counts.resize(groups, 0);
            }
            AggregateState::SumFloat { sums, counts } => {
                sums.resize(groups, 0.0);
                counts.resize(groups, 0);
            }
            AggregateState::SumNumeric { sums, counts } => {
                sums.resize(groups, Numeric::ZERO);
                counts.resize(groups, 0);
            }
            AggregateState::MinMax { values, .. } => values.resize(groups, Value::Null),
            AggregateState::Distinct(seen) => seen.resize_with(groups, HashMap::new),
            AggregateState::Statistics(moments) => moments.resize(groups),
            AggregateState::Values(lists) => lists.resize_with(groups, Vec::new),
        }
    }

    /// Adds the rows of `batch` (the aggregate's input): evaluates the call's arguments and
    /// updates group `groups[r]` with row `r`.
    pub fn update_call(&mut self, call: &AggregateCall, groups: &[u32], batch: &Batch) -> Result<()> {
        let argument = call.argument.as_ref().map(|a| evaluate(a, batch)).transpose()?;
        if let AggregateState::Statistics(moments) = self {
            let first = argument.as_ref().expect("statistical aggregates have an argument");
            let second = call.second.as_ref().map(|x| evaluate(x, batch)).transpose()?;
            return moments.update(groups, first, second.as_ref());
        }
        if let (AggregateState::SumFloat { sums, counts }, DataType::Float32) = (&mut *self, call.data_type) {
            let argument = argument.expect("sum has an argument");
            return sum_real(sums, counts, groups, &argument);
        }
        if let (AggregateState::Values(lists), AggregateFunction::Ordered(OrderedSet::Hypothetical(_))) =
            (&mut *self, call.function)
        {
            let values = argument.expect("hypothetical-set aggregates have an argument");
            crate::ordered_set::collect_all(lists, groups, &values);
            return Ok(());
        }
        self.update(groups, argument.as_ref())
    }

    /// Adds the rows of one batch: row `r` belongs to group `groups[r]`.
    pub fn update(&mut self, groups: &[u32], argument: Option<&Vector>) -> Result<()> {
        let valid = |r: usize| argument.is_none_or(|a| a.is_valid(r));
        match (self, argument.map(|a| &a.data)) {
            (AggregateState::Count(counts), _) => {
                for (r, &g) in groups.iter().enumerate() {
                    counts[g as usize] += i64::from(valid(r));
                }
            }
            (AggregateState::SumInt { sums, counts }, Some(Data::I64(values))) => {
                for (r, (&g, &v)) in groups.iter().zip(values).enumerate() {
                    if valid(r) {
                        sums[g as usize] += i128::from(v);
                        counts[g as usize] += 1;
                    }
                }
            }
            (AggregateState::SumInt { sums, counts }, Some(Data::I32(values))) => {
                for (r, (&g, &v)) in groups.iter().zip(values).enumerate() {
                    if valid(r) {
                        sums[g as usize] += i128::from(v);
                        counts[g as usize] += 1;
                    }
                }
            }
            (AggregateState::SumFloat { sums, counts }, Some(Data::F64(values))) => {
                for (r, (&g, &v)) in groups.iter().zip(values).enumerate() {
                    if valid(r) {
                        sums[g as usize] += v;
                        counts[g as usize] += 1;
                    }
                }
            }
            (AggregateState::SumNumeric { sums, counts }, Some(Data::Numeric(values))) => {
                for (r, (&g, &v)) in groups.iter().zip(values).enumerate() {
                    if valid(r) {
                        sums[g as usize] = sums[g as usize].checked_add(v)?;
                        counts[g as usize] += 1;
                    }
                }
            }
            (AggregateState::Values(lists), Some(_)) => {
                crate::ordered_set::collect(lists, groups, argument.expect("collected aggregates have an argument"));
            }
            (AggregateState::Distinct(seen), Some(_)) => {
                let argument = argument.expect("distinct aggregates have an argument");
                for (r, &g) in groups.iter().enumerate() {
                    if valid(r) {
                        let value = argument.value(r);
                        seen[g as usize].entry(value.key()).or_insert(value);
                    }
                }
            }
            (AggregateState::MinMax { values, is_min }, Some(_)) => {
                let argument = argument.expect("min/max have an argument");
                for (r, &g) in groups.iter().enumerate() {
                    if valid(r) {
                        let candidate = argument.value(r);
                        let current = &mut values[g as usize];
                        if current.is_null() || better(&candidate, current, *is_min) {
                            *current = candidate;
                        }
                    }
                }
            }
            (state, data) => panic!("aggregate state {state:?} cannot take {data:?}"),
        }
        Ok(())
    }

    /// Folds `other`'s group `from` into our group `to`.
    pub fn merge_group(&mut self, to: usize, other: &AggregateState, from: usize) -> Result<()> {
        match (self, other) {
            (AggregateState::SumNumeric { sums, counts }, AggregateState::SumNumeric { sums: s, counts: c }) => {
                sums[to] = sums[to].checked_add(s[from])?;
                counts[to] += c[from];
            }
            (AggregateState::Count(a), AggregateState::Count(b)) => a[to] += b[from],
            (AggregateState::SumInt { sums, counts }, AggregateState::SumInt { sums: s, counts: c }) => {
                sums[to] += s[from];
                counts[to] += c[from];
            }
            (AggregateState::SumFloat { sums, counts }, AggregateState::SumFloat { sums: s, counts: c }) => {
                sums[to] += s[from];
                counts[to] += c[from];
            }
            (AggregateState::Distinct(seen), AggregateState::Distinct(other)) => {
                for (key, value) in &other[from] {
                    seen[to].entry(key.clone()).or_insert_with(|| value.clone());
                }
            }
            (AggregateState::Statistics(moments), AggregateState::Statistics(other)) => {
                moments.merge_group(to, other, from)?;
            }
            (AggregateState::Values(lists), AggregateState::Values(other)) => {
                lists[to].extend(other[from].iter().cloned());
            }
            (AggregateState::MinMax { values, is_min }, AggregateState::MinMax { values: v, .. }) => {
                if !v[from].is_null() && (values[to].is_null() || better(&v[from], &values[to], *is_min)) {
                    values[to] = v[from].clone();
                }
            }
            _ => panic!("merging different aggregate states"),
        }
        Ok(())
    }

    /// The final values.
    pub fn finish(&self, call: &AggregateCall) -> Result<Vector> {
        let data_type = call.data_type;
        let input_scale = call.argument.as_ref().map_or(0, |a| a.data_type().scale());
        let is_avg = call.function == AggregateFunction::Avg;
        let present = |counts: &[i64]| Some(counts.iter().map(|&c| c > 0).collect::<Vec<bool>>());
        let (data, validity) = match self {
            AggregateState::Count(counts) => (Data::I64(counts.clone()), None),
            AggregateState::SumInt { sums, counts } if data_type == DataType::Int64 => {
                let values = sums
                    .iter()
                    .map(|&s| i64::try_from(s).map_err(|_| EngineError::Overflow("bigint out of range".into())))
                    .collect::<Result<Vec<i64>>>()?;
                (Data::I64(values), present(counts))
            }
            AggregateState::SumInt { sums, counts } => {
                let sums: Vec<Numeric> = sums.iter().map(|&s| Numeric::new(s, input_scale)).collect();
                (Data::Numeric(numeric_results(&sums, counts, is_avg)?), present(counts))
            }
            AggregateState::SumNumeric { sums, counts } => {
                (Data::Numeric(numeric_results(sums, counts, is_avg)?), present(counts))
            }
            AggregateState::SumFloat { sums, counts } => {
                let values = if is_avg {
                    sums.iter().zip(counts).map(|(&s, &c)| if c == 0 { 0.0 } else { s / c as f64 }).collect()
                } else if data_type == DataType::Float32 {
                    // Partial sums of workers were merged in double precision.
                    sums.iter().map(|&s| f64::from(s as f32)).collect()
                } else {
                    sums.clone()
                };
                (Data::F64(values), present(counts))
            }
            AggregateState::MinMax { values, .. } => return Ok(Vector::from_values(values, data_type)),
            AggregateState::Distinct(seen) => return finish_distinct(seen, call),
            AggregateState::Values(lists) => {
                let AggregateFunction::Ordered(kind) = call.function else { panic!("values state for {call:?}") };
                let results = lists
                    .iter()
                    .map(|values| kind.finish(values.clone(), call.second.as_ref()))
                    .collect::<Result<Vec<_>>>()?;
                return Ok(Vector::from_values(&results, data_type));
            }
            AggregateState::Statistics(moments) => match call.function {
                AggregateFunction::Statistic(statistic) => return moments.finish(statistic),
                other => panic!("statistics state for {other:?}"),
            },
        };
        Ok(Vector { data_type, data, validity })
    }
}

/// sum(real) adds in single precision, as PostgreSQL's float4pl (22003 when finite inputs
/// overflow).
fn sum_real(sums: &mut [f64], counts: &mut [i64], groups: &[u32], argument: &Vector) -> Result<()> {
    let Data::F64(values) = &argument.data else { panic!("real values are f64 vectors") };
    for (r, (&g, &v)) in groups.iter().zip(values).enumerate() {
        if argument.is_valid(r) {
            let (sum, value) = (sums[g as usize] as f32, v as f32);
            let result = sum + value;
            if result.is_infinite() && sum.is_finite() && value.is_finite() {
                return Err(EngineError::Overflow("value out of range: overflow".into()));
            }
            sums[g as usize] = f64::from(result);
            counts[g as usize] += 1;
        }
    }
    Ok(())
}

/// A DISTINCT aggregate: the plain aggregate over each group's distinct values.
fn finish_distinct(seen: &[HashMap<ValueKey, Value>], call: &AggregateCall) -> Result<Vector> {
    let plain = AggregateCall { distinct: false, filter: None, ..call.clone() };
    let argument_type = call.argument.as_ref().map_or(DataType::Int64, Expr::data_type);
    let mut groups = Vec::new();
    let mut values = Vec::new();
    for (group, distinct) in seen.iter().enumerate() {
        for value in distinct.values() {
            groups.push(group as u32);
            values.push(value.clone());
        }
    }
    let mut state = AggregateState::new(&plain);
    state.resize(seen.len());
    state.update(&groups, Some(&Vector::from_values(&values, argument_type)))?;
    state.finish(&plain)
}

/// Sums as they are, or averages: sum / count with PostgreSQL's numeric division scale.
fn numeric_results(sums: &[Numeric], counts: &[i64], average: bool) -> Result<Vec<Numeric>> {
    if !average {
        return Ok(sums.to_vec());
    }
    sums.iter()
        .zip(counts)
        .map(|(&sum, &count)| if count == 0 { Ok(Numeric::ZERO) } else { sum.checked_div(Numeric::from_i64(count)) })
        .collect()
}

fn better(candidate: &Value, current: &Value, is_min: bool) -> bool {
    let ordering = match (candidate, current) {
        (Value::Text(a), Value::Text(b)) => a.cmp(b),
        (Value::Date(a), Value::Date(b)) => a.cmp(b),
        (Value::Bool(a), Value::Bool(b)) => a.cmp(b),
        (Value::Numeric(a), Value::Numeric(b)) => a.cmp(b),
        (Value::Timestamp(_), Value::Timestamp(_))
        | (Value::TimestampTz(_), Value::TimestampTz(_))
        | (Value::Interval(_), Value::Interval(_)) => crate::types::compare_values(candidate, current),
        _ => candidate.as_f64().partial_cmp(&current.as_f64()).unwrap_or(std::cmp::Ordering::Equal),
    };
    if is_min {
        ordering.is_lt()
    } else {
        ordering.is_gt()
    }
}

/// One worker's partial aggregation.
pub struct PartialAggregate {
    pub table: GroupTable,
    pub states: Vec<AggregateState>,
    cache: KeyCache,
    words: Vec<u64>,
}

impl PartialAggregate {
    pub fn new(groups: usize, aggregates: &[AggregateCall]) -> PartialAggregate {
        PartialAggregate::with_capacity(groups, aggregates, 0)
    }

    /// A partial aggregate whose group table holds `capacity` groups before it grows.
    pub fn with_capacity(groups: usize, aggregates: &[AggregateCall], capacity: usize) -> PartialAggregate {
        PartialAggregate {
            table: GroupTable::with_capacity(groups + 1, capacity),
            states: aggregates.iter().map(AggregateState::new).collect(),
            cache: KeyCache::default(),
            words: Vec::new(),
        }
    }

    /// Group ids of a batch's rows (creating groups), with states resized to match.
    pub fn assign_groups(&mut self, encoder: &KeyEncoder, keys: &[Vector], rows: usize) -> Result<Vec<u32>> {
        self.words.clear();
        encoder.encode(&mut self.cache, keys, rows, true, &mut self.words);
        let width = self.table.width;
        let mut groups = Vec::with_capacity(rows);
        // Equal keys often come in runs (a join's matches of one probe row, a table stored in
        // key order): a row with its predecessor's key takes its group without a lookup.
        let mut previous: Option<(&[u64], u32)> = None;
        for key in self.words.chunks_exact(width).take(rows) {
            let group = match previous {
                Some((words, group)) if same_key(words, key) => group,
                _ => self.table.group_of(key)?,
            };
            previous = Some((key, group));
            groups.push(group);
        }
        let count = self.table.len();
        self.states.iter_mut().for_each(|s| s.resize(count));
        Ok(groups)
    }

    pub fn consume(
        &mut self,
        encoder: &KeyEncoder,
        group_exprs: &[Expr],
        aggregates: &[AggregateCall],
        batch: &Batch,
    ) -> Result<()> {
        let keys = group_exprs.iter().map(|g| evaluate(g, batch)).collect::<Result<Vec<_>>>()?;
        let groups = self.assign_groups(encoder, &keys, batch.rows)?;
        for (state, call) in self.states.iter_mut().zip(aggregates) {
            match &call.filter {
                None => state.update_call(call, &groups, batch)?,
                Some(filter) => {
                    // Arguments only for the rows FILTER keeps (`sum(1/x) filter (where x > 0)`).
                    let rows = crate::exec::selected_rows(&evaluate(filter, batch)?)?;
                    let groups: Vec<u32> = rows.iter().map(|&r| groups[r as usize]).collect();
                    state.update_call(call, &groups, &batch.gather(&rows))?;
                }
            }
        }
        Ok(())
    }

    /// Folds another worker's partial result into this one.
    pub fn merge(&mut self, other: PartialAggregate) -> Result<()> {
        let width = other.table.width;
        for from in 0..other.table.len() {
            if from % super::CHECK_EVERY_ROWS == 0 {
                crate::control::check()?;
            }
            let to = self.table.group_of(&other.table.keys[from * width..(from + 1) * width])? as usize;
            let count = self.table.len();
            for (state, other_state) in self.states.iter_mut().zip(&other.states) {
                state.resize(count);
                state.merge_group(to, other_state, from)?;
            }
        }
        Ok(())
    }

    /// The output batch: group keys then aggregate values. A global aggregate (no group keys)
    /// always has one row, even over empty input.
    pub fn finish(mut self, encoder: &KeyEncoder, aggregates: &[AggregateCall]) -> Result<Batch> {
        let key_count = self.table.width - 1;
        if key_count == 0 && self.table.is_empty() {
            self.table.group_of(&[0])?;
            self.states.iter_mut().for_each(|s| s.resize(1));
        }
        let mut columns: Vec<Vector> =
            (0..key_count).map(|k| encoder.decode(k, self.table.width, &self.table.keys, true)).collect();
        for (state, call) in self.states.iter().zip(aggregates) {
            crate::control::check()?;
            columns.push(state.finish(call)?);
        }
        Ok(Batch::new(columns, self.table.len()))
    }
}

/// Groups below which partial aggregates are merged on one thread (a partitioned merge's
/// setup would cost more).
const PARTITIONED_MERGE_GROUPS_MIN: usize = 1 << 15;
/// Groups per partition of a partitioned merge (its table stays in cache while it is built).
const MERGE_PARTITION_GROUPS: usize = 1 << 14;
/// Most partitions of a partitioned merge.
const MERGE_PARTITIONS_MAX: usize = 1 << 8;
/// Hash bits that pick a group's merge partition (above hashbrown's bucket bits, below its tag).
const MERGE_PARTITION_SHIFT: u32 = 40;

/// Merges the workers' partial aggregates and finishes them. Many groups (TPC-H Q18's IN
/// subquery: 1.5M orders, Q13: 150K customers) are split into partitions by hash, and each
/// partition is merged into a table sized for it and finished on its own, on all workers:
/// merging ~750K groups per worker into one growing table on one thread was a third of Q18.
/// Batches come one per partition.
pub fn merge_and_finish(
    runtime: &crate::runtime::Runtime,
    partials: Vec<PartialAggregate>,
    encoder: &KeyEncoder,
    aggregates: &[AggregateCall],
) -> Result<Vec<Batch>> {
    let groups: usize = partials.iter().map(|p| p.table.len()).sum();
    let text_keys = encoder.types.contains(&DataType::Text);
    if partials.len() == 1 || groups < PARTITIONED_MERGE_GROUPS_MIN || text_keys {
        let mut partials = partials.into_iter();
        let mut total = partials.next().expect("at least one worker");
        for partial in partials {
            total.merge(partial)?;
        }
        return Ok(vec![total.finish(encoder, aggregates)?]);
    }
    let partitions = (groups / MERGE_PARTITION_GROUPS).next_power_of_two().min(MERGE_PARTITIONS_MAX);
    let mask = partitions as u64 - 1;
    // Per partial, per partition: its group ids there.
    let members: Vec<Vec<Vec<u32>>> = partials
        .iter()
        .map(|partial| {
            let mut lists = vec![Vec::new(); partitions];
            for (group, hash) in partial.table.hashes.iter().enumerate() {
                lists[(hash >> MERGE_PARTITION_SHIFT & mask) as usize].push(group as u32);
            }
            lists
        })
        .collect();
    let slots: Vec<std::sync::Mutex<Option<Batch>>> = (0..partitions).map(|_| std::sync::Mutex::new(None)).collect();
    runtime.run_morsels(partitions, |_, p| {
        let capacity = members.iter().map(|m| m[p].len()).sum();
        let width = partials[0].table.width;
        let mut merged = PartialAggregate {
            table: GroupTable::with_capacity(width, capacity),
            states: aggregates.iter().map(AggregateState::new).collect(),
            cache: KeyCache::default(),
            words: Vec::new(),
        };
        merged.states.iter_mut().for_each(|s| s.resize(capacity));
        for (partial, lists) in partials.iter().zip(&members) {
            for (i, &from) in lists[p].iter().enumerate() {
                if i % super::CHECK_EVERY_ROWS == 0 {
                    crate::control::check()?;
                }
                let from = from as usize;
                let key = &partial.table.keys[from * width..(from + 1) * width];
                let to = merged.table.group_of_hashed(key, partial.table.hashes[from])? as usize;
                for (state, other) in merged.states.iter_mut().zip(&partial.states) {
                    state.merge_group(to, other, from)?;
                }
            }
        }
        let count = merged.table.len();
        merged.states.iter_mut().for_each(|s| s.resize(count));
        let batch = merged.finish(encoder, aggregates)?;
        *slots[p].lock().unwrap_or_else(|e| e.into_inner()) = Some(batch);
        Ok(())
    })?;
    Ok(slots
        .into_iter()
        .filter_map(|s| s.into_inner().unwrap_or_else(|e| e.into_inner()))
        .filter(|b| b.rows > 0)
        .collect())
}
