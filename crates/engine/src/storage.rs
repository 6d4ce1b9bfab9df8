//! Tables: columns split into fixed-size chunks at common row boundaries (table chunk = morsel).
//!
//! ```text
//!   Table ── schema [ColumnDef]
//!     ├─ dictionaries (one per text column, shared by all its chunks)
//!     └─ chunks: [TableChunk] ── columns: [ColumnChunk] (PoolBuffer, 64-byte aligned)
//!                 every TableChunk has the same row count for every column; all but the last
//!                 are full (`chunk_rows`)
//! ```

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use crate::error::{EngineError, Result};
use crate::pool::{ChunkPool, PoolBuffer};
use crate::types::{DataType, Value};

/// Default rows per chunk (2^16, one morsel).
pub const CHUNK_ROWS_DEFAULT: usize = 1 << 16;

/// A column name and type.
#[derive(Debug, Clone, PartialEq)]
pub struct ColumnDef {
    pub name: String,
    pub data_type: DataType,
}

/// Distinct strings of one text column; codes are indexes into `values`.
#[derive(Debug, Default, Clone)]
pub struct Dictionary {
    values: Vec<Box<str>>,
    // hashbrown's default hasher (foldhash), not std's SipHash: interning is on the load path
    // and the hot path of text join/group keys, and the input is not adversarial.
    index: hashbrown::HashMap<Box<str>, u32>,
}

impl Dictionary {
    pub fn new() -> Dictionary {
        Dictionary::default()
    }

    /// The code of `value`, adding it when new.
    pub fn intern(&mut self, value: &str) -> u32 {
        if let Some(&code) = self.index.get(value) {
            return code;
        }
        let code = u32::try_from(self.values.len()).expect("fewer than 2^32 distinct strings per column");
        self.values.push(value.into());
        self.index.insert(value.into(), code);
        code
    }

    pub fn code_of(&self, value: &str) -> Option<u32> {
        self.index.get(value).copied()
    }

    pub fn get(&self, code: u32) -> &str {
        &self.values[code as usize]
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    pub fn values(&self) -> &[Box<str>] {
        &self.values
    }

    /// Forgets the strings interned after the first `len` (undoing a failed append).
    fn truncate(&mut self, len: usize) {
        for value in self.values.drain(len.min(self.values.len())..) {
            self.index.remove(&value);
        }
    }
}

/// The values of one column within one table chunk.
pub enum ChunkData {
    /// bool as 0/1 bytes.
    Bool(PoolBuffer<u8>),
    /// Int32 and Date.
    I32(PoolBuffer<i32>),
    /// Int64 and Decimal.
    I64(PoolBuffer<i64>),
    F64(PoolBuffer<f64>),
    /// Dictionary codes of a text column.
    Text(PoolBuffer<u32>),
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

/// One morsel: a column chunk per column, all with `rows` rows.
pub struct TableChunk {
    pub rows: usize,
    pub columns: Vec<ColumnChunk>,
}

/// An in-memory table.
pub struct Table {
    pub name: String,
    pub schema: Vec<ColumnDef>,
    pub dictionaries: Vec<Option<Arc<Dictionary>>>,
    pub chunks: Vec<TableChunk>,
    pub chunk_rows: usize,
    distinct_counts: Vec<OnceLock<usize>>,
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

    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.schema.iter().position(|c| c.name == name)
    }

    /// Number of distinct values of a column, computed once and cached (planner statistics).
    pub fn distinct_count(&self, column: usize) -> usize {
        *self.distinct_counts[column].get_or_init(|| self.count_distinct(column))
    }

    fn count_distinct(&self, column: usize) -> usize {
        if let Some(dictionary) = &self.dictionaries[column] {
            return dictionary.len().max(1);
        }
        let mut seen = hashbrown::HashSet::new();
        for chunk in &self.chunks {
            match &chunk.columns[column].data {
                ChunkData::Bool(v) => seen.extend(v.iter().map(|&x| u64::from(x))),
                ChunkData::I32(v) => seen.extend(v.iter().map(|&x| x as u64)),
                ChunkData::I64(v) => seen.extend(v.iter().map(|&x| x as u64)),
                ChunkData::F64(v) => seen.extend(v.iter().map(|x| x.to_bits())),
                ChunkData::Text(v) => seen.extend(v.iter().map(|&x| u64::from(x))),
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
            (ChunkData::I64(v), _) => Value::Int64(v[row]),
            (ChunkData::F64(v), _) => Value::Float64(v[row]),
            (ChunkData::Text(v), _) => {
                let dictionary = self.dictionaries[column].as_ref().expect("text columns have a dictionary");
                Value::Text(dictionary.get(v[row]).to_string())
            }
        }
    }
}

/// Where a table ended before an append (INSERT, COPY), so that a failed append can be undone
/// and leaves the table as it was (PostgreSQL's statement atomicity).
#[derive(Debug, Clone)]
pub struct AppendMark {
    chunks: usize,
    last_chunk_rows: usize,
    last_chunk_validity: Vec<bool>,
    dictionary_lengths: Vec<usize>,
}

impl ChunkData {
    fn truncate(&mut self, rows: usize) {
        match self {
            ChunkData::Bool(b) => b.truncate(rows),
            ChunkData::I32(b) => b.truncate(rows),
            ChunkData::I64(b) => b.truncate(rows),
            ChunkData::F64(b) => b.truncate(rows),
            ChunkData::Text(b) => b.truncate(rows),
        }
    }
}

/// Appends rows column by column into pool chunks; `finish` yields the table.
pub struct TableBuilder {
    pool: Arc<ChunkPool>,
    name: String,
    schema: Vec<ColumnDef>,
    dictionaries: Vec<Option<Dictionary>>,
    chunks: Vec<TableChunk>,
    chunk_rows: usize,
}

impl TableBuilder {
    pub fn new(pool: Arc<ChunkPool>, name: &str, schema: Vec<ColumnDef>, chunk_rows: usize) -> TableBuilder {
        assert!(chunk_rows > 0, "chunks hold at least one row");
        let dictionaries =
            schema.iter().map(|c| (c.data_type == DataType::Text).then(Dictionary::new)).collect::<Vec<_>>();
        TableBuilder { pool, name: name.to_string(), schema, dictionaries, chunks: Vec::new(), chunk_rows }
    }

    /// Continues an existing table (INSERT, COPY): its chunks and dictionaries move in.
    pub fn from_table(pool: Arc<ChunkPool>, table: Table) -> TableBuilder {
        let dictionaries = table.dictionaries.into_iter().map(|d| d.map(Arc::unwrap_or_clone)).collect();
        let mut chunks = table.chunks;
        // Only the last chunk can grow; its zone map and narrow copy are redone by `finish`.
        if let Some(last) = chunks.last_mut() {
            for column in &mut last.columns {
                column.min_max = None;
                column.narrow = None;
            }
        }
        TableBuilder {
            pool,
            name: table.name,
            schema: table.schema,
            dictionaries,
            chunks,
            chunk_rows: table.chunk_rows,
        }
    }

    pub fn schema(&self) -> &[ColumnDef] {
        &self.schema
    }

    /// Remembers where the table ends now; see [`TableBuilder::roll_back`].
    pub fn mark(&self) -> AppendMark {
        let last = self.chunks.last();
        AppendMark {
            chunks: self.chunks.len(),
            last_chunk_rows: last.map_or(0, |c| c.rows),
            last_chunk_validity: last
                .map_or_else(Vec::new, |c| c.columns.iter().map(|c| c.validity.is_some()).collect()),
            dictionary_lengths: self.dictionaries.iter().map(|d| d.as_ref().map_or(0, Dictionary::len)).collect(),
        }
    }

    /// Undoes every row pushed since `mark`: new chunks go back to the pool, the last old chunk
    /// is cut back to its old length and strings interned since are forgotten.
    pub fn roll_back(&mut self, mark: &AppendMark) {
        assert!(mark.chunks <= self.chunks.len(), "a mark only moves forward");
        self.chunks.truncate(mark.chunks);
        if let Some(chunk) = self.chunks.last_mut() {
            chunk.rows = mark.last_chunk_rows;
            for (column, had_validity) in chunk.columns.iter_mut().zip(&mark.last_chunk_validity) {
                column.data.truncate(mark.last_chunk_rows);
                match (&mut column.validity, had_validity) {
                    (Some(validity), true) => validity.truncate(mark.last_chunk_rows),
                    (validity, _) => *validity = None,
                }
            }
        }
        for (dictionary, &len) in self.dictionaries.iter_mut().zip(&mark.dictionary_lengths) {
            if let Some(dictionary) = dictionary {
                dictionary.truncate(len);
            }
        }
    }

    /// The chunk rows are appended to, opening a new one when the last is full.
    fn open_chunk(&mut self) -> Result<&mut TableChunk> {
        if self.chunks.last().is_none_or(|c| c.rows == self.chunk_rows) {
            let mut columns = Vec::with_capacity(self.schema.len());
            for column in &self.schema {
                columns.push(ColumnChunk {
                    data: new_chunk_data(&self.pool, column.data_type, self.chunk_rows)?,
                    validity: None,
                    min_max: None,
                    narrow: None,
                });
            }
            self.chunks.push(TableChunk { rows: 0, columns });
        }
        Ok(self.chunks.last_mut().expect("a chunk was just ensured"))
    }

    /// Appends one row; values must already have the column types (see `coerce_value`).
    pub fn push_row(&mut self, row: &[Value]) -> Result<()> {
        assert_eq!(row.len(), self.schema.len(), "row width equals schema width");
        let pool = Arc::clone(&self.pool);
        let chunk_rows = self.chunk_rows;
        let codes: Vec<u32> = row
            .iter()
            .zip(&mut self.dictionaries)
            .map(|(value, dictionary)| match (value, dictionary) {
                (Value::Text(text), Some(dictionary)) => dictionary.intern(text),
                _ => 0,
            })
            .collect();
        let chunk = self.open_chunk()?;
        let position = chunk.rows;
        for ((value, column), code) in row.iter().zip(&mut chunk.columns).zip(codes) {
            if value.is_null() && column.validity.is_none() {
                let mut validity = pool.buffer::<u8>(chunk_rows)?;
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

    /// Freezes the dictionaries, computes the zone maps of new chunks and yields the table.
    pub fn finish(mut self) -> Table {
        for chunk in &mut self.chunks {
            for column in &mut chunk.columns {
                if column.min_max.is_none() {
                    column.compute_zone_map(&self.pool);
                }
            }
        }
        let distinct_counts = self.schema.iter().map(|_| OnceLock::new()).collect();
        Table {
            name: self.name,
            dictionaries: self.dictionaries.into_iter().map(|d| d.map(Arc::new)).collect(),
            schema: self.schema,
            chunks: self.chunks,
            chunk_rows: self.chunk_rows,
            distinct_counts,
        }
    }
}

fn new_chunk_data(pool: &Arc<ChunkPool>, data_type: DataType, rows: usize) -> Result<ChunkData> {
    Ok(match data_type {
        DataType::Bool => ChunkData::Bool(pool.buffer(rows)?),
        DataType::Int32 | DataType::Date => ChunkData::I32(pool.buffer(rows)?),
        DataType::Int64 | DataType::Decimal { .. } => ChunkData::I64(pool.buffer(rows)?),
        DataType::Float64 => ChunkData::F64(pool.buffer(rows)?),
        DataType::Text => ChunkData::Text(pool.buffer(rows)?),
        DataType::Numeric => return Err(EngineError::unsupported("columns of unconstrained numeric")),
    })
}

fn push_value(data: &mut ChunkData, value: &Value, code: u32) -> Result<()> {
    match (data, value) {
        (ChunkData::Bool(b), Value::Null) => b.push(0),
        (ChunkData::I32(b), Value::Null) => b.push(0),
        (ChunkData::I64(b), Value::Null) => b.push(0),
        (ChunkData::F64(b), Value::Null) => b.push(0.0),
        (ChunkData::Text(b), Value::Null) => b.push(0),
        (ChunkData::Bool(b), Value::Bool(v)) => b.push(u8::from(*v)),
        (ChunkData::I32(b), Value::Int32(v) | Value::Date(v)) => b.push(*v),
        (ChunkData::I64(b), Value::Int64(v) | Value::Decimal { value: v, .. }) => b.push(*v),
        (ChunkData::F64(b), Value::Float64(v)) => b.push(*v),
        (ChunkData::Text(b), Value::Text(_)) => b.push(code),
        (_, other) => return Err(EngineError::Type(format!("value {other:?} does not match the column type"))),
    }
    Ok(())
}

/// All tables by name.
#[derive(Default)]
pub struct Catalog {
    tables: HashMap<String, Arc<Table>>,
}

impl Catalog {
    pub fn get(&self, name: &str) -> Result<Arc<Table>> {
        self.tables.get(name).cloned().ok_or_else(|| EngineError::UnknownTable(name.to_string()))
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tables.contains_key(name)
    }

    pub fn insert(&mut self, table: Table) {
        self.tables.insert(table.name.clone(), Arc::new(table));
    }

    pub fn insert_shared(&mut self, table: Arc<Table>) {
        self.tables.insert(table.name.clone(), table);
    }

    pub fn remove(&mut self, name: &str) -> Option<Arc<Table>> {
        self.tables.remove(name)
    }

    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.tables.keys().cloned().collect();
        names.sort();
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::PoolMode;

    // Goal: rows land in fixed chunks at common boundaries, text is dictionary-coded and NULLs
    // are tracked; method: build a small table with chunk_rows 3 and read it back.
    #[test]
    fn builder_chunks_rows_and_reads_them_back() {
        let pool = ChunkPool::new(PoolMode::Specialized, 1 << 30);
        let schema = vec![
            ColumnDef { name: "id".into(), data_type: DataType::Int64 },
            ColumnDef { name: "name".into(), data_type: DataType::Text },
        ];
        let mut builder = TableBuilder::new(pool, "t", schema, 3);
        for i in 0..7 {
            let name = if i == 4 { Value::Null } else { Value::Text(format!("n{}", i % 2)) };
            builder.push_row(&[Value::Int64(i), name]).expect("types match");
        }
        let table = builder.finish();
        assert_eq!(table.chunks.iter().map(|c| c.rows).collect::<Vec<_>>(), vec![3, 3, 1]);
        assert_eq!(table.rows(), 7);
        assert_eq!(table.dictionaries[1].as_ref().expect("text").len(), 2);
        assert_eq!(table.row_values(1, 1), vec![Value::Int64(4), Value::Null]);
        assert_eq!(table.row_values(2, 0), vec![Value::Int64(6), Value::Text("n0".into())]);
        assert_eq!(table.distinct_count(0), 7);
    }

    // Goal: roll_back undoes an append exactly (chunks, row counts, validity masks, interned
    // strings), so a failed COPY leaves no trace; method: append across two chunk boundaries
    // with NULLs and new strings, roll back, then append again and read everything back.
    #[test]
    fn roll_back_restores_chunks_validity_and_dictionaries() {
        let pool = ChunkPool::new(PoolMode::Specialized, 1 << 30);
        let schema = vec![
            ColumnDef { name: "id".into(), data_type: DataType::Int32 },
            ColumnDef { name: "name".into(), data_type: DataType::Text },
        ];
        let mut builder = TableBuilder::new(pool, "t", schema, 3);
        for i in 0..4 {
            builder.push_row(&[Value::Int32(i), Value::Text("old".into())]).expect("types match");
        }
        let mark = builder.mark();
        for i in 4..10 {
            let name = if i % 2 == 0 { Value::Null } else { Value::Text(format!("new{i}")) };
            builder.push_row(&[Value::Null, name]).expect("types match");
        }
        builder.roll_back(&mark);
        builder.push_row(&[Value::Int32(40), Value::Text("new5".into())]).expect("types match");
        let table = builder.finish();
        assert_eq!(table.chunks.iter().map(|c| c.rows).collect::<Vec<_>>(), vec![3, 2]);
        assert!(table.chunks[1].columns.iter().all(|c| c.validity.is_none()), "masks made by the undone rows are gone");
        let names = table.dictionaries[1].as_ref().expect("text");
        assert_eq!(names.values(), &["old".into(), "new5".into()] as &[Box<str>], "undone strings are forgotten");
        assert_eq!(table.row_values(1, 1), vec![Value::Int32(40), Value::Text("new5".into())]);
        assert_eq!(table.chunks[1].columns[0].min_max, Some((3, 40)));
    }
}
