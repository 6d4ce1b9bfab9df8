//! Streaming results: the last pipeline of a plan runs slice by slice and each slice's rows go
//! to the client as soon as every earlier slice has gone, so the first row leaves after one
//! slice, not after the whole result.
//!
//! ```text
//!   plan ─► breakers below the top run to completion (join builds, aggregates, sorts)
//!        ─► top pipeline source split into slices of ≤ VECTOR_ROWS rows, numbered in order
//!   workers: claim slice k (in order) ─► scan/filter/probe/project ─► sink.encode ─► ready[k]
//!   caller:  emit ready[next] in order ─► sink.emit (blocks while the client is behind)
//!   window:  a worker may claim k only while k < next + SLICE_WINDOW (bounded memory)
//! ```
//!
//! Encoding runs on the workers, in parallel and off the network thread. Order is the same as
//! the materializing executor's (slices in source order), so results do not change.
//!
//! Invariants: at most SLICE_WINDOW encoded slices wait per statement; every claimed slice is
//! deposited (as rows or as an error), so the caller never waits for a slice no one works on;
//! after an error or a stop no new slice is claimed.

use std::collections::{BTreeMap, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crate::engine::ColumnType;
use crate::error::{EngineError, Result};
use crate::exec::keys::KeyCache;
use crate::exec::{apply_filter, run_operators, Executor, Operator, Source};
use crate::pg_catalog::{Datum, PgType};
use crate::plan::{Plan, SharedPlan};
use crate::runtime::Runtime;
use crate::types::{DataType, Value};
use crate::vector::{scan_chunk, Batch, VECTOR_ROWS};

/// Encoded slices a statement may hold ahead of the client.
pub const SLICE_WINDOW: usize = 8;

/// Rows ready for the client: wire bytes (server) or the batch itself (embedded callers).
pub enum Piece {
    Encoded { bytes: Vec<u8>, rows: usize },
    Rows(Batch),
}

impl Piece {
    pub fn rows(&self) -> usize {
        match self {
            Piece::Encoded { rows, .. } => *rows,
            Piece::Rows(batch) => batch.rows,
        }
    }
}

/// What a result looks like before its rows.
pub enum ResultShape<'a> {
    /// Rows with names and types (RowDescription); `origins` names the table column each
    /// output column is, where it is one unchanged (may be shorter than `names`: the rest are
    /// computed).
    Rows { names: &'a [String], types: &'a [DataType], origins: &'a [Option<ColumnOrigin>] },
    /// COPY … TO STDOUT: one line per row in `format` (CopyOutResponse).
    CopyOut { names: &'a [String], format: &'a crate::copy::CopyFormat },
}

/// Where a statement's rows go. `encode` runs on worker threads (any order), `emit` on the
/// statement's thread in row order.
pub trait ResultSink: Sync {
    /// Announces the result's shape; called once, before any row.
    fn start(&self, shape: ResultShape<'_>) -> Result<()>;
    /// Turns rows into a piece (encoding happens here, in parallel).
    fn encode(&self, batch: Batch) -> Result<Piece>;
    /// Sends a piece; may block while the client is behind; an error stops the statement.
    /// `false`: the receiver wants no more rows (a portal closed while suspended), and the
    /// statement ends early without an error.
    fn emit(&self, piece: Piece) -> Result<bool>;
    /// Sends the whole (small) result of a catalog query: its shape and its rows.
    fn values(&self, columns: &[(String, PgType)], rows: &[Vec<Datum>]) -> Result<()>;
}

/// The table column a result column is (PostgreSQL's RowDescription sends both, and pgjdbc's
/// ResultSetMetaData looks them up in pg_class/pg_attribute: table name, nullability).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnOrigin {
    /// The table's oid (pg_class.oid).
    pub table: u32,
    /// The column's number in the table, from 1 (pg_attribute.attnum).
    pub attribute: i16,
}

/// For each output column of `plan`, the table column it passes on unchanged, if any
/// (through filters, projections, joins, sorts and group keys, as PostgreSQL reports them).
pub fn column_origins(plan: &Plan) -> Vec<Option<ColumnOrigin>> {
    origins(plan, &mut HashMap::new())
}

/// `column_origins`, each shared plan's worked out once (a chain of CTEs each reading the one
/// before twice would take 2^n walks).
fn origins(plan: &Plan, shared: &mut SharedOrigins) -> Vec<Option<ColumnOrigin>> {
    match plan {
        Plan::Scan { table, columns, .. } => columns
            .iter()
            .map(|&column| i16::try_from(column + 1).ok().map(|attribute| ColumnOrigin { table: table.oid, attribute }))
            .collect(),
        Plan::Filter { input, .. } | Plan::Sort { input, .. } | Plan::Limit { input, .. } => origins(input, shared),
        Plan::Project { input, exprs } => through(input, exprs, shared),
        Plan::HashJoin { kind, probe, build, .. } => match kind {
            crate::plan::JoinKind::Inner | crate::plan::JoinKind::Left => {
                [origins(probe, shared), origins(build, shared)].concat()
            }
            crate::plan::JoinKind::RightSemi | crate::plan::JoinKind::RightAnti => origins(build, shared),
            crate::plan::JoinKind::Semi | crate::plan::JoinKind::Anti | crate::plan::JoinKind::NullAwareAnti => {
                origins(probe, shared)
            }
        },
        Plan::Aggregate { input, groups, .. } => through(input, groups, shared),
        Plan::Window { input, .. } => origins(input, shared),
        Plan::Shared(inner) => {
            if let Some(known) = shared.get(&Arc::as_ptr(inner)) {
                return known.clone();
            }
            let known = origins(&inner.plan, shared);
            shared.insert(Arc::as_ptr(inner), known.clone());
            known
        }
        Plan::Lateral { input, right, .. } => {
            let mut known = origins(input, shared);
            known.resize(input.width(), None);
            known.extend(origins(right, shared));
            known
        }
        Plan::SingleRow | Plan::Constant { .. } | Plan::Series { .. } | Plan::SetOperation { .. } => Vec::new(),
    }
}

type SharedOrigins = HashMap<*const SharedPlan, Vec<Option<ColumnOrigin>>>;

/// The origins of `exprs` over `input`: a column reference passes its input column's on.
fn through(input: &Plan, exprs: &[crate::expr::Expr], shared: &mut SharedOrigins) -> Vec<Option<ColumnOrigin>> {
    let inner = origins(input, shared);
    exprs
        .iter()
        .map(|expr| match expr {
            crate::expr::Expr::Column { index, .. } => inner.get(*index).copied().flatten(),
            _ => None,
        })
        .collect()
}

/// The engine type closest to a catalog column's (embedded callers get engine values).
pub fn engine_type(column: ColumnType) -> DataType {
    match column {
        ColumnType::Engine(data_type) => data_type,
        ColumnType::Catalog(PgType::Bool) => DataType::Bool,
        ColumnType::Catalog(PgType::Int2 | PgType::Int4 | PgType::Int8 | PgType::Oid) => DataType::Int64,
        ColumnType::Catalog(PgType::Float4 | PgType::Float8) => DataType::Float64,
        ColumnType::Catalog(_) => DataType::Text,
    }
}

/// Catalog rows as one batch of engine vectors (see [`engine_type`]).
pub fn catalog_batch(columns: &[(String, PgType)], rows: &[Vec<Datum>]) -> Batch {
    let vectors = columns
        .iter()
        .enumerate()
        .map(|(index, (_, pg_type))| {
            let data_type = engine_type(ColumnType::Catalog(*pg_type));
            let mut vector = crate::vector::Vector::empty(data_type);
            for row in rows {
                let value = match (&row[index], data_type) {
                    (Datum::Null, _) => Value::Null,
                    (Datum::Bool(b), _) => Value::Bool(*b),
                    (datum, DataType::Int64) => datum.as_int().map_or(Value::Null, Value::Int64),
                    (Datum::Float(v), _) => Value::Float64(*v),
                    (Datum::Int(v), DataType::Float64) => Value::Float64(*v as f64),
                    (datum, _) => {
                        Value::Text(datum.to_text(*pg_type == PgType::Int2Vector || *pg_type == PgType::OidVector))
                    }
                };
                vector.append(&crate::vector::Vector::broadcast(&value, data_type, 1));
            }
            vector
        })
        .collect();
    Batch::new(vectors, rows.len())
}

/// A sink that keeps the rows (tests, `Engine::execute`, INSERT … SELECT).
#[derive(Default)]
pub struct CollectSink {
    pub batches: Mutex<Vec<Batch>>,
}

impl ResultSink for CollectSink {
    fn start(&self, _shape: ResultShape<'_>) -> Result<()> {
        Ok(())
    }

    fn values(&self, columns: &[(String, PgType)], rows: &[Vec<Datum>]) -> Result<()> {
        self.emit(Piece::Rows(catalog_batch(columns, rows))).map(|_| ())
    }

    fn encode(&self, batch: Batch) -> Result<Piece> {
        Ok(Piece::Rows(batch))
    }

    fn emit(&self, piece: Piece) -> Result<bool> {
        if let Piece::Rows(batch) = piece {
            self.batches.lock().unwrap_or_else(|p| p.into_inner()).push(batch);
        }
        Ok(true)
    }
}

impl CollectSink {
    pub fn into_batches(self) -> Vec<Batch> {
        self.batches.into_inner().unwrap_or_else(|p| p.into_inner())
    }
}

/// One unit of the top pipeline's source.
#[derive(Clone, Copy)]
struct Slice {
    part: usize,
    start: usize,
    end: usize,
}

fn slices(source: &Source) -> Vec<Slice> {
    let parts: Vec<usize> = match source {
        Source::Scan { table, .. } => table.chunks.iter().map(|c| c.rows).collect(),
        Source::Batches(batches) => batches.iter().map(|b| b.rows).collect(),
    };
    let mut slices = Vec::new();
    for (part, rows) in parts.into_iter().enumerate() {
        for start in (0..rows).step_by(VECTOR_ROWS) {
            slices.push(Slice { part, start, end: (start + VECTOR_ROWS).min(rows) });
        }
    }
    slices
}

/// The rows of one slice after the pipeline's operators.
fn run_slice(source: &Source, operators: &[Operator], caches: &mut Vec<KeyCache>, slice: Slice) -> Result<Vec<Batch>> {
    crate::control::check()?;
    let batch = match source {
        Source::Scan { table, columns, filter } => {
            let batch = scan_chunk(table, slice.part, columns, slice.start, slice.end);
            match filter {
                Some(predicate) => apply_filter(predicate, batch)?,
                None => batch,
            }
        }
        Source::Batches(batches) => {
            let whole = &batches[slice.part];
            if slice.start == 0 && slice.end == whole.rows {
                whole.clone()
            } else {
                let rows: Vec<u32> = (slice.start as u32..slice.end as u32).collect();
                whole.gather(&rows)
            }
        }
    };
    let mut out = Vec::new();
    if batch.rows > 0 {
        run_operators(operators, caches, batch, &mut |b| {
            if b.rows > 0 {
                out.push(b);
            }
            Ok(())
        })?;
    }
    Ok(out)
}

/// Runs `plan` and sends its rows to `sink` in order; returns the number of rows sent.
pub fn stream_plan(executor: &Executor<'_>, plan: &Plan, sink: &dyn ResultSink) -> Result<usize> {
    // Uncorrelated subqueries run once, on all workers, before the rows they feed.
    crate::exec::subquery::prepare(executor, plan)?;
    match plan {
        Plan::Limit { input, limit, offset } if is_streaming(input) => {
            let mut window = RowWindow { skip: *offset, take: limit.unwrap_or(usize::MAX), sent: 0 };
            let (source, operators) = executor.pipeline(input)?;
            run_in_order(executor.runtime, &source, &operators, &|batch| Ok(Piece::Rows(batch)), &mut |piece| {
                window.pass(piece, sink)
            })?;
            Ok(window.sent)
        }
        plan if is_streaming(plan) => {
            let (source, operators) = executor.pipeline(plan)?;
            let mut sent = 0;
            run_in_order(executor.runtime, &source, &operators, &|batch| sink.encode(batch), &mut |piece| {
                let rows = piece.rows();
                let more = sink.emit(piece)?;
                sent += rows;
                Ok(more)
            })?;
            Ok(sent)
        }
        breaker => {
            let source = Source::Batches(Arc::new(executor.execute(breaker)?));
            let mut sent = 0;
            run_in_order(executor.runtime, &source, &[], &|batch| sink.encode(batch), &mut |piece| {
                let rows = piece.rows();
                let more = sink.emit(piece)?;
                sent += rows;
                Ok(more)
            })?;
            Ok(sent)
        }
    }
}

/// Whether the plan's top is a pipeline that can stream (no breaker above its source).
fn is_streaming(plan: &Plan) -> bool {
    matches!(plan, Plan::Scan { .. } | Plan::Filter { .. } | Plan::Project { .. } | Plan::HashJoin { .. })
}

/// OFFSET/LIMIT applied to rows as they stream; stops the statement once enough were sent.
struct RowWindow {
    skip: usize,
    take: usize,
    sent: usize,
}

impl RowWindow {
    /// Passes the rows of `piece` inside the window to `sink`; false once the window is full.
    fn pass(&mut self, piece: Piece, sink: &dyn ResultSink) -> Result<bool> {
        let Piece::Rows(batch) = piece else { return Err(EngineError::Runtime("LIMIT expects raw rows".into())) };
        let start = self.skip.min(batch.rows);
        self.skip -= start;
        let end = start + (batch.rows - start).min(self.take - self.sent);
        if end > start {
            let rows: Vec<u32> = (start as u32..end as u32).collect();
            let kept = if start == 0 && end == batch.rows { batch } else { batch.gather(&rows) };
            self.sent += kept.rows;
            if !sink.emit(sink.encode(kept)?)? {
                return Ok(false);
            }
        }
        Ok(self.sent < self.take)
    }
}

struct Ordered {
    next: usize,
    ready: BTreeMap<usize, Result<Vec<Piece>>>,
}

/// Runs every slice of `source` through `operators`, prepares each output batch on the
/// workers and hands the pieces to `emit` in slice order. `emit` returns false to stop early.
fn run_in_order(
    runtime: &Runtime,
    source: &Source,
    operators: &[Operator],
    prepare: &(dyn Fn(Batch) -> Result<Piece> + Sync),
    emit: &mut dyn FnMut(Piece) -> Result<bool>,
) -> Result<()> {
    let slices = slices(source);
    let workers = runtime.workers().min(slices.len());
    if workers <= 1 {
        let mut caches = Vec::new();
        for &slice in &slices {
            for batch in run_slice(source, operators, &mut caches, slice)? {
                if !emit(prepare(batch)?)? {
                    return Ok(());
                }
            }
        }
        return Ok(());
    }
    let state = Mutex::new(Ordered { next: 0, ready: BTreeMap::new() });
    let changed = Condvar::new();
    let claimed = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let control = crate::control::current().unwrap_or_else(crate::control::QueryControl::unlimited);
    let pin = runtime.is_specialized();
    std::thread::scope(|scope| {
        for index in 0..workers {
            let (state, changed, claimed, stop, control, slices) =
                (&state, &changed, &claimed, &stop, &control, &slices);
            scope.spawn(move || {
                crate::control::enter(control, || {
                    if pin {
                        crate::runtime::pin_to_core(index);
                    }
                    let mut caches = Vec::new();
                    work(source, operators, prepare, slices, (state, changed, claimed, stop), &mut caches);
                })
            });
        }
        let outcome = deliver(&state, &changed, slices.len(), emit);
        stop.store(true, Ordering::Release);
        changed.notify_all();
        outcome
    })
}

type Shared<'a> = (&'a Mutex<Ordered>, &'a Condvar, &'a AtomicUsize, &'a AtomicBool);

fn work(
    source: &Source,
    operators: &[Operator],
    prepare: &(dyn Fn(Batch) -> Result<Piece> + Sync),
    slices: &[Slice],
    (state, changed, claimed, stop): Shared<'_>,
    caches: &mut Vec<KeyCache>,
) {
    loop {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let index = claimed.fetch_add(1, Ordering::AcqRel);
        if index >= slices.len() {
            return;
        }
        {
            let mut guard = state.lock().unwrap_or_else(|p| p.into_inner());
            while index >= guard.next + SLICE_WINDOW && !stop.load(Ordering::Acquire) {
                guard = changed.wait(guard).unwrap_or_else(|p| p.into_inner());
            }
        }
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            run_slice(source, operators, caches, slices[index])?.into_iter().map(prepare).collect::<Result<Vec<_>>>()
        }))
        .unwrap_or_else(|_| Err(EngineError::Runtime("a worker panicked while running the statement".into())));
        if outcome.is_err() {
            stop.store(true, Ordering::Release);
        }
        state.lock().unwrap_or_else(|p| p.into_inner()).ready.insert(index, outcome);
        changed.notify_all();
    }
}

/// The caller's side: waits for each slice in order and emits it.
fn deliver(
    state: &Mutex<Ordered>,
    changed: &Condvar,
    total: usize,
    emit: &mut dyn FnMut(Piece) -> Result<bool>,
) -> Result<()> {
    loop {
        let pieces = {
            let mut guard = state.lock().unwrap_or_else(|p| p.into_inner());
            if guard.next >= total {
                return Ok(());
            }
            loop {
                let next = guard.next;
                if let Some(outcome) = guard.ready.remove(&next) {
                    break outcome?;
                }
                guard = changed.wait(guard).unwrap_or_else(|p| p.into_inner());
            }
        };
        for piece in pieces {
            if !emit(piece)? {
                return Ok(());
            }
        }
        state.lock().unwrap_or_else(|p| p.into_inner()).next += 1;
        changed.notify_all();
    }
}
