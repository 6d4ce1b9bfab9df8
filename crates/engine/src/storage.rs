//! Tables: columns split into fixed-size chunks at common row boundaries (table chunk = morsel).
//!
//! ```text
//!   Table (one immutable version) ── schema [ColumnDef], constraints, unique indexes
//!     ├─ dictionaries (one per text column, shared by all its chunks)
//!     └─ chunks: [Arc<TableChunk>] ── columns: [ColumnChunk] (PoolBuffer, 64-byte aligned)
//!   TableBuilder: next version = shared chunks + copies of the chunks a write changes
//! ```
//!
//! Invariants: every TableChunk has the same row count for every column; a chunk holds at most
//! `chunk_rows` rows (UPDATE and DELETE may leave chunks partly filled); a version never
//! changes once finished (readers share it through `Arc`, writers copy what they change:
//! the last chunk on append, a rewritten chunk on UPDATE/DELETE, a dictionary or unique index
//! only when a reader still holds it); every row of a version satisfies its constraints.

use std::sync::{Arc, OnceLock};

use crate::error::{EngineError, Result};
use crate::interval::Interval;
use crate::numeric::Numeric;
use crate::pool::{ChunkPool, PoolBuffer};
use crate::types::{DataType, Value};

pub use crate::catalog::Catalog;

/// Default rows per chunk (2^16, one morsel).
pub const CHUNK_ROWS_DEFAULT: usize = 1 << 16;

/// A column name and type.
#[derive(Debug, Clone, PartialEq)]
pub struct ColumnDef {
    pub name: String,
    pub data_type: DataType,
}

/// Distinct strings of one text column; codes are indexes into the string heap.
///
/// Strings live back to back in one byte heap with an end offset per code, and the index
/// holds codes only: a string costs its bytes plus about 14 bytes, where one allocation per
/// string (plus a second copy as the index key) cost about 100 (issue 19: 2.4 GiB resident at
/// SF 1, most of it TPC-H's comment columns).
#[derive(Default, Clone)]
pub struct Dictionary {
    heap: Vec<u8>,
    /// `ends[code]` is where string `code` ends in `heap`; it starts where the previous ends.
    ends: Vec<usize>,
    // hashbrown's default hasher (foldhash), not std's SipHash: interning is on the load path
    // and the hot path of text join/group keys, and the input is not adversarial.
    index: hashbrown::HashTable<u32>,
    hasher: hashbrown::DefaultHashBuilder,
}

impl std::fmt::Debug for Dictionary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dictionary").field("len", &self.len()).field("heap_bytes", &self.heap.len()).finish()
    }
}

/// The strings of a dictionary in code order.
pub struct DictionaryValues<'d>(&'d Dictionary);

impl<'d> DictionaryValues<'d> {
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &'d str> + 'd {
        let dictionary = self.0;
        (0..dictionary.ends.len()).map(move |code| dictionary.string(code))
    }
}

impl Dictionary {
    pub fn new() -> Dictionary {
        Dictionary::default()
    }

    fn string(&self, code: usize) -> &str {
        let start = if code == 0 { 0 } else { self.ends[code - 1] };
        let bytes = &self.heap[start..self.ends[code]];
        // SAFETY: the heap only ever receives whole `&str`s, appended at these boundaries.
        unsafe { std::str::from_utf8_unchecked(bytes) }
    }

    fn hash(&self, value: &str) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one(value)
    }

    /// The code of `value`, adding it when new.
    pub fn intern(&mut self, value: &str) -> u32 {
        let hash = self.hash(value);
        if let Some(&code) = self.index.find(hash, |&c| self.string(c as usize) == value) {
            return code;
        }
        let code = u32::try_from(self.ends.len()).expect("fewer than 2^32 distinct strings per column");
        self.heap.extend_from_slice(value.as_bytes());
        self.ends.push(self.heap.len());
        let Dictionary { heap, ends, index, hasher } = self;
        let rehash = |&c: &u32| {
            use std::hash::BuildHasher;
            let c = c as usize;
            let start = if c == 0 { 0 } else { ends[c - 1] };
            // SAFETY: as in `string`: whole strings at these boundaries.
            hasher.hash_one(unsafe { std::str::from_utf8_unchecked(&heap[start..ends[c]]) })
        };
        index.insert_unique(hash, code, rehash);
        code
    }

    pub fn code_of(&self, value: &str) -> Option<u32> {
        self.index.find(self.hash(value), |&c| self.string(c as usize) == value).copied()
    }

    pub fn get(&self, code: u32) -> &str {
        self.string(code as usize)
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn values(&self) -> DictionaryValues<'_> {
        DictionaryValues(self)
    }

    /// Bytes held (heap, offsets and index), for memory accounting.
    pub fn bytes(&self) -> usize {
        self.heap.capacity() + self.ends.capacity() * std::mem::size_of::<usize>() + self.index.capacity() * 5
    }
}

/// The values of one column within one table chunk.
pub enum ChunkData {
    /// bool as 0/1 bytes.
    Bool(PoolBuffer<u8>),
    /// Int32 and Date.
    I32(PoolBuffer<i32>),
    /// Int64, Decimal, Timestamp and TimestampTz.
    I64(PoolBuffer<i64>),
    F64(PoolBuffer<f64>),
    /// Dictionary codes of a text column.
    Text(PoolBuffer<u32>),
    /// Unconstrained numeric values, each with its own scale.
    Numeric(PoolBuffer<Numeric>),
    Interval(PoolBuffer<Interval>),
}

/// One column chunk: values plus an optional validity mask (1 = not null).
pub struct ColumnChunk {
    pub data: ChunkData,
    pub validity: Option<PoolBuffer<u8>>,
    /// Minimum and maximum of an integer chunk (a zone map), set when the table is finished;
    /// the compiled tier uses it to skip chunks and to prove that 64-bit partial sums cannot
    /// overflow.
    pub min_max: Option<(i64, i64)>,
    /// The same integers as `value - min` in one or two bytes, when the chunk's range fits
    /// (set with `min_max`): scans are bound by memory bandwidth, so the compiled tier's range
    /// filters read these 2–8× smaller copies (frame-of-reference, after Umbra's Data Blocks).
    pub narrow: Option<NarrowCopy>,
}

/// Frame-of-reference copy of an integer chunk: `values[i] = data[i] - min_max.0`.
pub enum NarrowCopy {
    U8(PoolBuffer<u8>),
    U16(PoolBuffer<u16>),
}

impl ColumnChunk {
    /// Computes the zone map and, when the range is small, the narrow copy.
    fn compute_zone_map(&mut self, pool: &Arc<ChunkPool>) {
        fn fold<T: Copy + Into<i64>>(values: &[T]) -> Option<(i64, i64)> {
            values.iter().map(|&v| v.into()).fold(None, |acc, v| match acc {
                None => Some((v, v)),
                Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
            })
        }
        self.min_max = match &self.data {
            ChunkData::I32(v) => fold(v),
            ChunkData::I64(v) => fold(v),
            _ => None,
        };
        // The copy is an optimization: without room in the pool the filters read `data`.
        self.narrow = self.min_max.and_then(|(lo, hi)| match &self.data {
            ChunkData::I32(v) => narrow_copy(pool, v, lo, hi),
            ChunkData::I64(v) => narrow_copy(pool, v, lo, hi),
            _ => None,
        });
    }
}

fn narrow_copy<T: Copy + Into<i64>>(pool: &Arc<ChunkPool>, values: &[T], lo: i64, hi: i64) -> Option<NarrowCopy> {
    let span = i128::from(hi) - i128::from(lo);
    if span <= i128::from(u8::MAX) {
        let mut copy = pool.buffer::<u8>(values.len()).ok()?;
        copy.set_len_zeroed(values.len());
        for (out, &v) in copy.as_mut_slice().iter_mut().zip(values) {
            *out = (v.into() - lo) as u8;
        }
        Some(NarrowCopy::U8(copy))
    } else if span <= i128::from(u16::MAX) {
        let mut copy = pool.buffer::<u16>(values.len()).ok()?;
        copy.set_len_zeroed(values.len());
        for (out, &v) in copy.as_mut_slice().iter_mut().zip(values) {
            *out = (v.into() - lo) as u16;
        }
        Some(NarrowCopy::U16(copy))
    } else {
        None
    }
}

impl ChunkData {
    fn empty_like(&self, pool: &Arc<ChunkPool>, rows: usize) -> Result<ChunkData> {
        Ok(match self {
            ChunkData::Bool(_) => ChunkData::Bool(pool.buffer(rows)?),
            ChunkData::I32(_) => ChunkData::I32(pool.buffer(rows)?),
            ChunkData::I64(_) => ChunkData::I64(pool.buffer(rows)?),
            ChunkData::F64(_) => ChunkData::F64(pool.buffer(rows)?),
            ChunkData::Text(_) => ChunkData::Text(pool.buffer(rows)?),
            ChunkData::Numeric(_) => ChunkData::Numeric(pool.buffer(rows)?),
            ChunkData::Interval(_) => ChunkData::Interval(pool.buffer(rows)?),
        })
    }

    fn copy_into(&self, pool: &Arc<ChunkPool>, capacity: usize) -> Result<ChunkData> {
        fn copy<T: crate::pool::Pod>(
            pool: &Arc<ChunkPool>,
            values: &PoolBuffer<T>,
            capacity: usize,
        ) -> Result<PoolBuffer<T>> {
            let mut buffer = pool.buffer::<T>(capacity)?;
            buffer.extend_from_slice(values);
            Ok(buffer)
        }
        Ok(match self {
            ChunkData::Bool(v) => ChunkData::Bool(copy(pool, v, capacity)?),
            ChunkData::I32(v) => ChunkData::I32(copy(pool, v, capacity)?),
            ChunkData::I64(v) => ChunkData::I64(copy(pool, v, capacity)?),
            ChunkData::F64(v) => ChunkData::F64(copy(pool, v, capacity)?),
            ChunkData::Text(v) => ChunkData::Text(copy(pool, v, capacity)?),
            ChunkData::Numeric(v) => ChunkData::Numeric(copy(pool, v, capacity)?),
            ChunkData::Interval(v) => ChunkData::Interval(copy(pool, v, capacity)?),
        })
    }
}

/// One morsel: a column chunk per column, all with `rows` rows. Table versions share chunks
/// (`Arc`): a write copies only the chunks it changes.
pub struct TableChunk {
    pub rows: usize,
    pub columns: Vec<ColumnChunk>,
    /// Zone maps and narrow copies are computed (the chunk is sealed until rows are appended).
    sealed: bool,
}

impl TableChunk {
    /// A private, appendable copy with room for `capacity` rows (the last chunk of a table
    /// version that readers still see).
    fn copy_for_append(&self, pool: &Arc<ChunkPool>, capacity: usize) -> Result<TableChunk> {
        let mut columns = Vec::with_capacity(self.columns.len());
        for column in &self.columns {
            let validity = match &column.validity {
                Some(validity) => {
                    let mut copy = pool.buffer::<u8>(capacity)?;
                    copy.extend_from_slice(validity);
                    Some(copy)
                }
                None => None,
            };
            columns.push(ColumnChunk {
                data: column.data.copy_into(pool, capacity)?,
                validity,
                min_max: None,
                narrow: None,
            });
        }
        Ok(TableChunk { rows: self.rows, columns, sealed: false })
    }

    fn seal(&mut self, pool: &Arc<ChunkPool>) {
        if !self.sealed {
            self.columns.iter_mut().for_each(|c| c.compute_zone_map(pool));
            self.sealed = true;
        }
    }
}

/// Declared constraints of a table, enforced on every write.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Constraints {
    /// Per column: NULL is refused (NOT NULL, or part of the primary key).
    pub not_null: Vec<bool>,
    /// Per column: the value an INSERT that omits the column stores (a constant).
    pub defaults: Vec<Option<Value>>,
    /// PRIMARY KEY and UNIQUE constraints, and unique indexes: enforced.
    pub unique: Vec<UniqueConstraint>,
    /// Indexes that are not unique: catalog entries only (every query scans the columns; an
    /// index would not change a result, only a row store's speed).
    pub indexes: Vec<IndexDefinition>,
    /// Where the table sits in an inheritance or partitioning tree (kept here so every new
    /// version of the table keeps it).
    pub family: crate::family::Family,
}

/// A non-unique index (CREATE INDEX).
#[derive(Debug, Clone, PartialEq)]
pub struct IndexDefinition {
    pub name: String,
    pub columns: Vec<usize>,
}

impl Constraints {
    /// No constraints on `width` columns.
    pub fn none(width: usize) -> Constraints {
        Constraints {
            not_null: vec![false; width],
            defaults: vec![None; width],
            unique: Vec::new(),
            indexes: Vec::new(),
            family: crate::family::Family::default(),
        }
    }
}

/// A PRIMARY KEY or UNIQUE constraint over some columns.
#[derive(Debug, Clone, PartialEq)]
pub struct UniqueConstraint {
    /// PostgreSQL's default name, e.g. `t_pkey`, `t_a_key`.
    pub name: String,
    pub columns: Vec<usize>,
    pub primary: bool,
    /// Declared as a constraint (PRIMARY KEY, UNIQUE), not only as a unique index.
    pub constraint: bool,
}

/// The keys present under one unique constraint (rows with a NULL key part are not entered:
/// NULLs are distinct, as PostgreSQL's default).
#[derive(Debug, Clone, Default)]
pub struct UniqueIndex {
    keys: hashbrown::HashSet<Box<[u8]>>,
}

/// A float's key bytes: PostgreSQL has -0 = 0 and NaN = NaN for equality.
fn push_float_key(key: &mut Vec<u8>, v: f64) {
    let canonical = if v == 0.0 {
        0.0
    } else if v.is_nan() {
        f64::NAN
    } else {
        v
    };
    key.extend_from_slice(&canonical.to_bits().to_le_bytes());
}

impl UniqueIndex {
    /// Bytes held: the hash table's slots (a boxed key and a control byte each) and the keys.
    pub fn bytes(&self) -> usize {
        let slots = self.keys.capacity() * (std::mem::size_of::<Box<[u8]>>() + 1);
        slots + self.keys.iter().map(|key| key.len()).sum::<usize>()
    }
}

/// The key of `row` under `columns` as bytes; `None` when a part is NULL.
pub(crate) fn unique_key(row: &[Value], columns: &[usize]) -> Option<Box<[u8]>> {
    let mut key = Vec::with_capacity(columns.len() * 9);
    for &column in columns {
        match &row[column] {
            Value::Null => return None,
            Value::Bool(v) => key.push(u8::from(*v)),
            Value::Int32(v) | Value::Date(v) => key.extend_from_slice(&i64::from(*v).to_le_bytes()),
            Value::Int64(v) | Value::Decimal { value: v, .. } | Value::Timestamp(v) | Value::TimestampTz(v) => {
                key.extend_from_slice(&v.to_le_bytes())
            }
            Value::Interval(interval) => key.extend_from_slice(&interval.span_micros().to_le_bytes()),
            Value::Float32(v) => push_float_key(&mut key, f64::from(*v)),
            Value::Float64(v) => push_float_key(&mut key, *v),
            Value::Text(text) => {
                key.extend_from_slice(&(text.len() as u64).to_le_bytes());
                key.extend_from_slice(text.as_bytes());
            }
            Value::Numeric(number) => {
                let number = number.normalized();
                key.extend_from_slice(&number.mantissa.to_le_bytes());
                key.push(number.scale);
            }
        }
    }
    Some(key.into_boxed_slice())
}

/// An in-memory table: one immutable version of it. Writers build the next version with a
/// [`TableBuilder`]; readers keep the version they started with.
pub struct Table {
    pub name: String,
    /// Stable identifier shown in pg_catalog (pg_class.oid).
    pub oid: u32,
    pub schema: Vec<ColumnDef>,
    pub constraints: Arc<Constraints>,
    pub dictionaries: Vec<Option<Arc<Dictionary>>>,
    pub chunks: Vec<Arc<TableChunk>>,
    pub chunk_rows: usize,
    /// One per unique constraint, in the same order.
    indexes: Vec<Arc<UniqueIndex>>,
    distinct_counts: Vec<OnceLock<usize>>,
    /// A view: no rows, its query bound at each use (`view`); its schema is the query's
    /// output when it was created.
    pub view: Option<Arc<crate::view::ViewDefinition>>,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table").field("name", &self.name).field("rows", &self.rows()).finish()
    }
}

impl Table {
    pub fn rows(&self) -> usize {
        self.chunks.iter().map(|c| c.rows).sum()
    }

    /// Bytes the index of the `k`-th unique constraint holds (pg_relation_size of an index).
    pub fn unique_index_bytes(&self, k: usize) -> usize {
        self.indexes.get(k).map_or(0, |index| index.bytes())
    }

    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.schema.iter().position(|c| c.name == name)
    }

    /// Number of distinct values of a column, computed once and cached (planner statistics).
    pub fn distinct_count(&self, column: usize) -> usize {
        *self.distinct_counts[column].get_or_init(|| self.count_distinct(column))
    }

    /// The distinct count when it was already computed.
    pub fn known_distinct_count(&self, column: usize) -> Option<usize> {
        self.distinct_counts[column].get().copied()
    }

    fn count_distinct(&self, column: usize) -> usize {
        use std::hash::BuildHasher;
        if let Some(dictionary) = &self.dictionaries[column] {
            return dictionary.len().max(1);
        }
        let mut seen = hashbrown::HashSet::new();
        let numeric_hasher = hashbrown::DefaultHashBuilder::default();
        for chunk in &self.chunks {
            match &chunk.columns[column].data {
                ChunkData::Bool(v) => seen.extend(v.iter().map(|&x| u64::from(x))),
                ChunkData::I32(v) => seen.extend(v.iter().map(|&x| x as u64)),
                ChunkData::I64(v) => seen.extend(v.iter().map(|&x| x as u64)),
                ChunkData::F64(v) => seen.extend(v.iter().map(|x| x.to_bits())),
                ChunkData::Text(v) => seen.extend(v.iter().map(|&x| u64::from(x))),
                // Equal numerics (1.5, 1.50) count once: their normalized forms hash alike.
                ChunkData::Numeric(v) => seen.extend(v.iter().map(|x| numeric_hasher.hash_one(x.normalized()))),
                ChunkData::Interval(v) => seen.extend(v.iter().map(|x| numeric_hasher.hash_one(x.span_micros()))),
            }
        }
        seen.len().max(1)
    }

    /// One row as values (tests, CSV export).
    pub fn row_values(&self, chunk: usize, row: usize) -> Vec<Value> {
        let table_chunk = &self.chunks[chunk];
        (0..self.schema.len()).map(|column| self.value_at(table_chunk, column, row)).collect()
    }

    fn value_at(&self, chunk: &TableChunk, column: usize, row: usize) -> Value {
        let column_chunk = &chunk.columns[column];
        if column_chunk.validity.as_ref().is_some_and(|v| v[row] == 0) {
            return Value::Null;
        }
        match (&column_chunk.data, self.schema[column].data_type) {
            (ChunkData::Bool(v), _) => Value::Bool(v[row] != 0),
            (ChunkData::I32(v), DataType::Date) => Value::Date(v[row]),
            (ChunkData::I32(v), _) => Value::Int32(v[row]),
            (ChunkData::I64(v), DataType::Decimal { scale, .. }) => Value::Decimal { value: v[row], scale },
            (ChunkData::I64(v), DataType::Timestamp) => Value::Timestamp(v[row]),
            (ChunkData::I64(v), DataType::TimestampTz) => Value::TimestampTz(v[row]),
            (ChunkData::I64(v), _) => Value::Int64(v[row]),
            (ChunkData::F64(v), _) => Value::Float64(v[row]),
            (ChunkData::Numeric(v), _) => Value::Numeric(v[row]),
            (ChunkData::Interval(v), _) => Value::Interval(v[row]),
            (ChunkData::Text(v), _) => {
                let dictionary = self.dictionaries[column].as_ref().expect("text columns have a dictionary");
                Value::Text(dictionary.get(v[row]).to_string())
            }
        }
    }

    /// Bytes of column data, validity masks and dictionaries (pg_class statistics, memory
    /// reports); shared chunks count in every version that holds them.
    pub fn bytes(&self) -> usize {
        let chunk_bytes: usize = self
            .chunks
            .iter()
            .flat_map(|c| c.columns.iter())
            .map(|c| c.data.bytes() + c.validity.as_ref().map_or(0, |v| v.capacity()))
            .sum();
        chunk_bytes + self.dictionaries.iter().flatten().map(|d| d.bytes()).sum::<usize>()
    }
}

impl ChunkData {
    fn capacity(&self) -> usize {
        match self {
            ChunkData::Bool(v) => v.capacity(),
            ChunkData::I32(v) => v.capacity(),
            ChunkData::I64(v) => v.capacity(),
            ChunkData::F64(v) => v.capacity(),
            ChunkData::Text(v) => v.capacity(),
            ChunkData::Numeric(v) => v.capacity(),
            ChunkData::Interval(v) => v.capacity(),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            ChunkData::Bool(v) => v.capacity(),
            ChunkData::I32(v) => v.capacity() * 4,
            ChunkData::I64(v) => v.capacity() * 8,
            ChunkData::F64(v) => v.capacity() * 8,
            ChunkData::Text(v) => v.capacity() * 4,
            ChunkData::Numeric(v) => v.capacity() * std::mem::size_of::<Numeric>(),
            ChunkData::Interval(v) => v.capacity() * std::mem::size_of::<Interval>(),
        }
    }
}

/// Builds the next version of a table: appends rows, rewrites chunks, enforces constraints.
/// Chunks, dictionaries and indexes of the previous version are shared until changed.
pub struct TableBuilder {
    pool: Arc<ChunkPool>,
    name: String,
    oid: u32,
    schema: Vec<ColumnDef>,
    constraints: Arc<Constraints>,
    dictionaries: Vec<Option<Arc<Dictionary>>>,
    chunks: Vec<Arc<TableChunk>>,
    indexes: Vec<Arc<UniqueIndex>>,
    chunk_rows: usize,
}

impl TableBuilder {
    pub fn new(pool: Arc<ChunkPool>, name: &str, schema: Vec<ColumnDef>, chunk_rows: usize) -> TableBuilder {
        let constraints = Constraints::none(schema.len());
        TableBuilder::with_constraints(pool, name, 0, schema, constraints, chunk_rows)
    }

    /// An empty table with declared constraints and a catalog oid.
    pub fn with_constraints(
        pool: Arc<ChunkPool>,
        name: &str,
        oid: u32,
        schema: Vec<ColumnDef>,
        constraints: Constraints,
        chunk_rows: usize,
    ) -> TableBuilder {
        assert!(chunk_rows > 0, "chunks hold at least one row");
        assert_eq!(constraints.not_null.len(), schema.len(), "one NOT NULL flag per column");
        let dictionaries = schema.iter().map(|c| c.data_type.is_text().then(|| Arc::new(Dictionary::new()))).collect();
        let indexes = constraints.unique.iter().map(|_| Arc::new(UniqueIndex::default())).collect();
        TableBuilder {
            pool,
            name: name.to_string(),
            oid,
            schema,
            constraints: Arc::new(constraints),
            dictionaries,
            chunks: Vec::new(),
            indexes,
            chunk_rows,
        }
    }

    /// Continues a table version (INSERT, COPY, UPDATE, DELETE). Takes its parts over when no
    /// one else holds the version, shares them otherwise.
    pub fn from_version(pool: Arc<ChunkPool>, table: Arc<Table>) -> TableBuilder {
        let table = Arc::try_unwrap(table).unwrap_or_else(|shared| Table {
            name: shared.name.clone(),
            oid: shared.oid,
            schema: shared.schema.clone(),
            constraints: Arc::clone(&shared.constraints),
            dictionaries: shared.dictionaries.clone(),
            chunks: shared.chunks.clone(),
            chunk_rows: shared.chunk_rows,
            indexes: shared.indexes.clone(),
            distinct_counts: Vec::new(),
            view: None,
        });
        TableBuilder {
            pool,
            name: table.name,
            oid: table.oid,
            schema: table.schema,
            constraints: table.constraints,
            dictionaries: table.dictionaries,
            chunks: table.chunks,
            indexes: table.indexes,
            chunk_rows: table.chunk_rows,
        }
    }

    pub fn schema(&self) -> &[ColumnDef] {
        &self.schema
    }

    pub fn constraints(&self) -> &Constraints {
        &self.constraints
    }

    /// The chunk rows are appended to: the last one if it has room (copied first when a
    /// reader still shares it), else a new one.
    fn open_chunk(&mut self) -> Result<&mut TableChunk> {
        let full = self.chunks.last().is_none_or(|c| c.rows >= self.chunk_rows);
        if full {
            let mut columns = Vec::with_capacity(self.schema.len());
            for column in &self.schema {
                columns.push(ColumnChunk {
                    data: new_chunk_data(&self.pool, column.data_type, self.chunk_rows)?,
                    validity: None,
                    min_max: None,
                    narrow: None,
                });
            }
            self.chunks.push(Arc::new(TableChunk { rows: 0, columns, sealed: false }));
        }
        let last = self.chunks.last_mut().expect("a chunk was just ensured");
        let appendable =
            Arc::get_mut(last).is_some_and(|c| c.columns.iter().all(|c| c.data.capacity() >= self.chunk_rows));
        if !appendable {
            *last = Arc::new(last.copy_for_append(&self.pool, self.chunk_rows)?);
        }
        let chunk = Arc::get_mut(last).expect("the last chunk is private now");
        if chunk.sealed {
            // Rows are about to change the chunk's range: drop its zone map and narrow copy.
            chunk.sealed = false;
            for column in &mut chunk.columns {
                column.min_max = None;
                column.narrow = None;
            }
        }
        Ok(chunk)
    }

    /// Checks NOT NULL and the unique constraints for a new row and enters its keys.
    fn admit(&mut self, row: &[Value]) -> Result<()> {
        for (column, value) in row.iter().enumerate() {
            if value.is_null() && self.constraints.not_null[column] {
                return Err(EngineError::NotNullViolation {
                    table: self.name.clone(),
                    column: self.schema[column].name.clone(),
                });
            }
        }
        let keys: Vec<Option<Box<[u8]>>> =
            self.constraints.unique.iter().map(|constraint| unique_key(row, &constraint.columns)).collect();
        for ((key, index), constraint) in keys.iter().zip(&self.indexes).zip(&self.constraints.unique) {
            if key.as_ref().is_some_and(|key| index.keys.contains(key)) {
                return Err(EngineError::UniqueViolation { constraint: constraint.name.clone() });
            }
        }
        for (key, index) in keys.into_iter().zip(&mut self.indexes) {
            if let Some(key) = key {
                // Two keys of one row cannot collide with each other: they are in different indexes.
                Arc::make_mut(index).keys.insert(key);
            }
        }
        Ok(())
    }

    /// Appends one row after checking the table's constraints; values must already have the
    /// column types (see `coerce_value`).
    pub fn push_row(&mut self, row: &[Value]) -> Result<()> {
        assert_eq!(row.len(), self.schema.len(), "row width equals schema width");
        self.admit(row)?;
        self.append_unchecked(row)
    }

    fn append_unchecked(&mut self, row: &[Value]) -> Result<()> {
        let codes = intern_row(&mut self.dictionaries, row);
        let (pool, capacity) = (Arc::clone(&self.pool), self.chunk_rows);
        write_row(&pool, capacity, self.open_chunk()?, row, &codes)
    }

    /// Number of chunks (UPDATE and DELETE visit them one by one).
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// Rows of chunk `index` as values.
    pub fn chunk_values(&self, index: usize) -> Vec<Vec<Value>> {
        let table = self.peek();
        (0..self.chunks[index].rows).map(|row| table.row_values(index, row)).collect()
    }

    /// Replaces chunk `index` with `rows` (UPDATE, DELETE); an empty list removes it. Checks
    /// NOT NULL; unique indexes are rebuilt by [`TableBuilder::rebuild_indexes`] once all
    /// chunks are rewritten.
    pub fn rewrite_chunk(&mut self, index: usize, rows: &[Vec<Value>]) -> Result<()> {
        if rows.is_empty() {
            self.chunks.remove(index);
            return Ok(());
        }
        let capacity = rows.len();
        let mut columns = Vec::with_capacity(self.schema.len());
        for column in &self.chunks[index].columns {
            columns.push(ColumnChunk {
                data: column.data.empty_like(&self.pool, capacity)?,
                validity: None,
                min_max: None,
                narrow: None,
            });
        }
        let mut chunk = TableChunk { rows: 0, columns, sealed: false };
        for row in rows {
            if let Some(column) = (0..row.len()).find(|&c| row[c].is_null() && self.constraints.not_null[c]) {
                return Err(EngineError::NotNullViolation {
                    table: self.name.clone(),
                    column: self.schema[column].name.clone(),
                });
            }
            let codes = intern_row(&mut self.dictionaries, row);
            write_row(&self.pool, capacity, &mut chunk, row, &codes)?;
        }
        self.chunks[index] = Arc::new(chunk);
        Ok(())
    }

    /// Adds a unique constraint or index, checking the rows already there (23505).
    pub fn add_unique(&mut self, unique: UniqueConstraint) -> Result<()> {
        Arc::make_mut(&mut self.constraints).unique.push(unique);
        self.indexes.push(Arc::new(UniqueIndex::default()));
        self.rebuild_indexes()
    }

    /// Makes the table a child of the table stored under `parent_key` (ALTER TABLE … INHERIT).
    pub fn add_parent(&mut self, parent_key: String) {
        Arc::make_mut(&mut self.constraints).family.parents.push(parent_key);
    }

    /// Adds a non-unique index (a catalog entry).
    pub fn add_index(&mut self, index: IndexDefinition) {
        Arc::make_mut(&mut self.constraints).indexes.push(index);
    }

    /// Drops the index called `name` (unique or not); false when there is none.
    pub fn drop_index(&mut self, name: &str) -> bool {
        let constraints = Arc::make_mut(&mut self.constraints);
        if let Some(position) = constraints.indexes.iter().position(|i| i.name == name) {
            constraints.indexes.remove(position);
            return true;
        }
        match constraints.unique.iter().position(|u| u.name == name) {
            Some(position) => {
                constraints.unique.remove(position);
                self.indexes.remove(position);
                true
            }
            None => false,
        }
    }

    /// Recomputes every unique index from the rows (after UPDATE or DELETE); fails on a
    /// duplicate key.
    pub fn rebuild_indexes(&mut self) -> Result<()> {
        if self.constraints.unique.is_empty() {
            return Ok(());
        }
        let table = self.peek();
        let mut indexes: Vec<UniqueIndex> = self.constraints.unique.iter().map(|_| UniqueIndex::default()).collect();
        for chunk in 0..table.chunks.len() {
            crate::control::check()?;
            for row in 0..table.chunks[chunk].rows {
                let values = table.row_values(chunk, row);
                for (index, constraint) in indexes.iter_mut().zip(&self.constraints.unique) {
                    if let Some(key) = unique_key(&values, &constraint.columns) {
                        if !index.keys.insert(key) {
                            return Err(EngineError::UniqueViolation { constraint: constraint.name.clone() });
                        }
                    }
                }
            }
        }
        self.indexes = indexes.into_iter().map(Arc::new).collect();
        Ok(())
    }

    /// A read-only view of the rows so far (shares everything; no zone maps needed).
    fn peek(&self) -> Table {
        Table {
            name: self.name.clone(),
            oid: self.oid,
            schema: self.schema.clone(),
            constraints: Arc::clone(&self.constraints),
            dictionaries: self.dictionaries.clone(),
            chunks: self.chunks.clone(),
            chunk_rows: self.chunk_rows,
            indexes: Vec::new(),
            distinct_counts: self.schema.iter().map(|_| OnceLock::new()).collect(),
            view: None,
        }
    }

    /// Computes the zone maps of changed chunks and yields the table version.
    pub fn finish(mut self) -> Table {
        for chunk in &mut self.chunks {
            if let Some(chunk) = Arc::get_mut(chunk) {
                chunk.seal(&self.pool);
            }
        }
        let distinct_counts = self.schema.iter().map(|_| OnceLock::new()).collect();
        Table {
            name: self.name,
            oid: self.oid,
            schema: self.schema,
            constraints: self.constraints,
            dictionaries: self.dictionaries,
            chunks: self.chunks,
            chunk_rows: self.chunk_rows,
            indexes: self.indexes,
            distinct_counts,
            view: None,
        }
    }
}

/// Dictionary codes of a row's text values (0 elsewhere), interning new strings.
fn intern_row(dictionaries: &mut [Option<Arc<Dictionary>>], row: &[Value]) -> Vec<u32> {
    row.iter()
        .zip(dictionaries)
        .map(|(value, dictionary)| match (value, dictionary) {
            (Value::Text(text), Some(dictionary)) => match dictionary.code_of(text) {
                Some(code) => code,
                // Copies the dictionary only when a reader shares it and the string is new.
                None => Arc::make_mut(dictionary).intern(text),
            },
            _ => 0,
        })
        .collect()
}

/// Appends one row to a chunk with room for it (`capacity` rows in all).
fn write_row(
    pool: &Arc<ChunkPool>,
    capacity: usize,
    chunk: &mut TableChunk,
    row: &[Value],
    codes: &[u32],
) -> Result<()> {
    let position = chunk.rows;
    for ((value, column), &code) in row.iter().zip(&mut chunk.columns).zip(codes) {
        if value.is_null() && column.validity.is_none() {
            let mut validity = pool.buffer::<u8>(capacity)?;
            validity.set_len_zeroed(position);
            validity.as_mut_slice().fill(1);
            column.validity = Some(validity);
        }
        if let Some(validity) = &mut column.validity {
            validity.push(u8::from(!value.is_null()));
        }
        push_value(&mut column.data, value, code)?;
    }
    chunk.rows += 1;
    Ok(())
}

fn new_chunk_data(pool: &Arc<ChunkPool>, data_type: DataType, rows: usize) -> Result<ChunkData> {
    Ok(match data_type {
        DataType::Bool => ChunkData::Bool(pool.buffer(rows)?),
        DataType::Int16 | DataType::Int32 | DataType::Date => ChunkData::I32(pool.buffer(rows)?),
        DataType::Int64 | DataType::Decimal { .. } | DataType::Timestamp | DataType::TimestampTz => {
            ChunkData::I64(pool.buffer(rows)?)
        }
        DataType::Interval => ChunkData::Interval(pool.buffer(rows)?),
        DataType::Float64 | DataType::Float32 => ChunkData::F64(pool.buffer(rows)?),
        DataType::Text | DataType::Char(_) | DataType::Varchar(_) => ChunkData::Text(pool.buffer(rows)?),
        DataType::Numeric => ChunkData::Numeric(pool.buffer(rows)?),
    })
}

fn push_value(data: &mut ChunkData, value: &Value, code: u32) -> Result<()> {
    match (data, value) {
        (ChunkData::Bool(b), Value::Null) => b.push(0),
        (ChunkData::I32(b), Value::Null) => b.push(0),
        (ChunkData::I64(b), Value::Null) => b.push(0),
        (ChunkData::F64(b), Value::Null) => b.push(0.0),
        (ChunkData::Text(b), Value::Null) => b.push(0),
        (ChunkData::Numeric(b), Value::Null) => b.push(Numeric::ZERO),
        (ChunkData::Numeric(b), Value::Numeric(v)) => b.push(*v),
        (ChunkData::Interval(b), Value::Null) => b.push(Interval::ZERO),
        (ChunkData::Interval(b), Value::Interval(v)) => b.push(*v),
        (ChunkData::Bool(b), Value::Bool(v)) => b.push(u8::from(*v)),
        (ChunkData::I32(b), Value::Int32(v) | Value::Date(v)) => b.push(*v),
        (
            ChunkData::I64(b),
            Value::Int64(v) | Value::Decimal { value: v, .. } | Value::Timestamp(v) | Value::TimestampTz(v),
        ) => b.push(*v),
        (ChunkData::F64(b), Value::Float64(v)) => b.push(*v),
        (ChunkData::F64(b), Value::Float32(v)) => b.push(f64::from(*v)),
        (ChunkData::Text(b), Value::Text(_)) => b.push(code),
        (_, other) => return Err(EngineError::Type(format!("value {other:?} does not match the column type"))),
    }
    Ok(())
}

/// Gives heap memory freed so far back to the kernel now. Dropped tables free their
/// dictionaries (and COPY its buffers) to the allocator; mimalloc keeps freed pages for reuse,
/// so without this a server's resident memory stays near its peak after DROP TABLE. Costs a
/// walk of the heap: call it after large frees, not per statement.
pub fn release_free_heap() {
    #[cfg(feature = "global-mimalloc")]
    {
        extern "C" {
            // mimalloc's C API (linked through the `mimalloc` crate): collect this thread's heap
            // and, with `force`, purge freed segments and abandoned pages of every thread.
            fn mi_collect(force: bool);
        }
        // SAFETY: a documented mimalloc entry point without preconditions; mimalloc is the
        // global allocator whenever this feature is on.
        unsafe { mi_collect(true) };
    }
}
