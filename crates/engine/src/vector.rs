//! Execution vectors: a batch of up to `VECTOR_ROWS` rows, one typed vector per column.

use std::sync::Arc;

use crate::interval::Interval;
use crate::numeric::Numeric;
use crate::storage::{ChunkData, ColumnChunk, Dictionary, Table};
use crate::types::{DataType, Value};

/// Rows per execution vector: small enough that a pipeline's vectors stay in L2.
pub const VECTOR_ROWS: usize = 2048;

/// Typed values of one vector.
#[derive(Debug, Clone)]
pub enum Data {
    Bool(Vec<bool>),
    /// Int32 and Date.
    I32(Vec<i32>),
    /// Int64, Decimal, Timestamp and TimestampTz.
    I64(Vec<i64>),
    F64(Vec<f64>),
    /// Dictionary codes and the dictionary they index.
    Text(Vec<u32>, Arc<Dictionary>),
    /// Unconstrained numeric values, each with its own scale.
    Numeric(Vec<Numeric>),
    Interval(Vec<Interval>),
}

/// One column of a batch: values, their type, and validity (`None` = all valid).
#[derive(Debug, Clone)]
pub struct Vector {
    pub data_type: DataType,
    pub data: Data,
    pub validity: Option<Vec<bool>>,
}

impl Vector {
    pub fn len(&self) -> usize {
        match &self.data {
            Data::Bool(v) => v.len(),
            Data::I32(v) => v.len(),
            Data::I64(v) => v.len(),
            Data::F64(v) => v.len(),
            Data::Text(v, _) => v.len(),
            Data::Numeric(v) => v.len(),
            Data::Interval(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_valid(&self, row: usize) -> bool {
        self.validity.as_ref().is_none_or(|v| v[row])
    }

    /// The value at `row` as a scalar.
    pub fn value(&self, row: usize) -> Value {
        if !self.is_valid(row) {
            return Value::Null;
        }
        match (&self.data, self.data_type) {
            (Data::Bool(v), _) => Value::Bool(v[row]),
            (Data::I32(v), DataType::Date) => Value::Date(v[row]),
            (Data::I32(v), _) => Value::Int32(v[row]),
            (Data::I64(v), DataType::Decimal { scale, .. }) => Value::Decimal { value: v[row], scale },
            (Data::I64(v), DataType::Timestamp) => Value::Timestamp(v[row]),
            (Data::I64(v), DataType::TimestampTz) => Value::TimestampTz(v[row]),
            (Data::I64(v), _) => Value::Int64(v[row]),
            (Data::F64(v), DataType::Float32) => Value::Float32(v[row] as f32),
            (Data::F64(v), _) => Value::Float64(v[row]),
            (Data::Text(codes, dictionary), _) => Value::Text(dictionary.get(codes[row]).to_string()),
            (Data::Numeric(v), _) => Value::Numeric(v[row]),
            (Data::Interval(v), _) => Value::Interval(v[row]),
        }
    }

    /// The value at `row` as a client sees it (character(n) padded to n).
    pub fn output_value(&self, row: usize) -> Value {
        match (self.value(row), self.data_type) {
            (Value::Text(text), DataType::Char(length)) => Value::Text(crate::types::pad_char(&text, length)),
            (value, _) => value,
        }
    }

    /// `n` copies of a scalar (constants in the interpreter).
    pub fn broadcast(value: &Value, data_type: DataType, n: usize) -> Vector {
        let validity = value.is_null().then(|| vec![false; n]);
        let data = match (data_type, value) {
            (DataType::Bool, Value::Bool(v)) => Data::Bool(vec![*v; n]),
            (DataType::Bool, _) => Data::Bool(vec![false; n]),
            (DataType::Int16 | DataType::Int32 | DataType::Date, Value::Int32(v) | Value::Date(v)) => {
                Data::I32(vec![*v; n])
            }
            (DataType::Int16 | DataType::Int32 | DataType::Date, _) => Data::I32(vec![0; n]),
            (
                DataType::Int64 | DataType::Decimal { .. } | DataType::Timestamp | DataType::TimestampTz,
                Value::Int64(v) | Value::Decimal { value: v, .. } | Value::Timestamp(v) | Value::TimestampTz(v),
            ) => Data::I64(vec![*v; n]),
            (DataType::Int64 | DataType::Decimal { .. } | DataType::Timestamp | DataType::TimestampTz, _) => {
                Data::I64(vec![0; n])
            }
            (DataType::Interval, Value::Interval(v)) => Data::Interval(vec![*v; n]),
            (DataType::Interval, _) => Data::Interval(vec![Interval::ZERO; n]),
            (DataType::Float64 | DataType::Float32, Value::Float64(v)) => Data::F64(vec![*v; n]),
            (DataType::Float64 | DataType::Float32, Value::Float32(v)) => Data::F64(vec![f64::from(*v); n]),
            (DataType::Float64 | DataType::Float32, _) => Data::F64(vec![0.0; n]),
            (DataType::Numeric, Value::Numeric(v)) => Data::Numeric(vec![*v; n]),
            (DataType::Numeric, _) => Data::Numeric(vec![Numeric::ZERO; n]),
            (DataType::Text | DataType::Char(_) | DataType::Varchar(_), value) => {
                let mut dictionary = Dictionary::new();
                let code = match value {
                    Value::Text(text) => dictionary.intern(text),
                    _ => dictionary.intern(""),
                };
                Data::Text(vec![code; n], Arc::new(dictionary))
            }
        };
        Vector { data_type, data, validity }
    }

    /// A vector of the given scalars (NULLs allowed); values must have `data_type`'s shape.
    pub fn from_values(values: &[Value], data_type: DataType) -> Vector {
        fn typed<T: Copy>(values: &[Value], zero: T, f: impl Fn(&Value) -> Option<T>) -> Vec<T> {
            values.iter().map(|v| f(v).unwrap_or(zero)).collect()
        }
        let data = match data_type {
            DataType::Bool => {
                Data::Bool(typed(values, false, |v| if let Value::Bool(b) = v { Some(*b) } else { None }))
            }
            DataType::Int16 | DataType::Int32 | DataType::Date => Data::I32(typed(values, 0, |v| match v {
                Value::Int32(x) | Value::Date(x) => Some(*x),
                _ => None,
            })),
            DataType::Int64 | DataType::Decimal { .. } | DataType::Timestamp | DataType::TimestampTz => {
                Data::I64(typed(values, 0, |v| match v {
                    Value::Int64(x) | Value::Decimal { value: x, .. } | Value::Timestamp(x) | Value::TimestampTz(x) => {
                        Some(*x)
                    }
                    _ => None,
                }))
            }
            DataType::Interval => Data::Interval(typed(values, Interval::ZERO, |v| match v {
                Value::Interval(x) => Some(*x),
                _ => None,
            })),
            DataType::Float64 | DataType::Float32 => Data::F64(typed(values, 0.0, |v| match v {
                Value::Float64(x) => Some(*x),
                Value::Float32(x) => Some(f64::from(*x)),
                _ => None,
            })),
            DataType::Numeric => {
                Data::Numeric(typed(values, Numeric::ZERO, |v| if let Value::Numeric(x) = v { Some(*x) } else { None }))
            }
            DataType::Text | DataType::Char(_) | DataType::Varchar(_) => {
                let mut dictionary = Dictionary::new();
                let codes = values
                    .iter()
                    .map(|v| match v {
                        Value::Text(text) => dictionary.intern(text),
                        _ => dictionary.intern(""),
                    })
                    .collect();
                Data::Text(codes, Arc::new(dictionary))
            }
        };
        let validity = values.iter().any(Value::is_null).then(|| values.iter().map(|v| !v.is_null()).collect());
        Vector { data_type, data, validity }
    }

    /// An empty vector of a type (the shape of an empty result).
    pub fn empty(data_type: DataType) -> Vector {
        Vector::broadcast(&Value::Null, data_type, 0)
    }

    /// Rows `indexes` of this vector, in that order.
    pub fn gather(&self, indexes: &[u32]) -> Vector {
        fn pick<T: Copy>(values: &[T], indexes: &[u32]) -> Vec<T> {
            indexes.iter().map(|&i| values[i as usize]).collect()
        }
        let data = match &self.data {
            Data::Bool(v) => Data::Bool(pick(v, indexes)),
            Data::I32(v) => Data::I32(pick(v, indexes)),
            Data::I64(v) => Data::I64(pick(v, indexes)),
            Data::F64(v) => Data::F64(pick(v, indexes)),
            Data::Text(v, dictionary) => Data::Text(pick(v, indexes), Arc::clone(dictionary)),
            Data::Numeric(v) => Data::Numeric(pick(v, indexes)),
            Data::Interval(v) => Data::Interval(pick(v, indexes)),
        };
        let validity = self.validity.as_ref().map(|v| pick(v, indexes));
        Vector { data_type: self.data_type, data, validity }
    }

    /// Like `gather`, but `None` entries produce NULL (unmatched rows of a left join).
    pub fn gather_optional(&self, indexes: &[Option<u32>]) -> Vector {
        let dense: Vec<u32> = indexes.iter().map(|i| i.unwrap_or(0)).collect();
        if self.is_empty() {
            let mut vector = Vector::broadcast(&Value::Null, self.data_type, indexes.len());
            if let (Data::Text(_, dictionary), Data::Text(_, _)) = (&self.data, &vector.data) {
                vector.data = Data::Text(vec![0; indexes.len()], Arc::clone(dictionary));
            }
            return vector;
        }
        let mut vector = self.gather(&dense);
        let mut validity = vector.validity.take().unwrap_or_else(|| vec![true; indexes.len()]);
        for (valid, index) in validity.iter_mut().zip(indexes) {
            *valid &= index.is_some();
        }
        vector.validity = Some(validity);
        vector
    }

    /// Appends another vector of the same type (materializing breakers).
    pub fn append(&mut self, other: &Vector) {
        let before = self.len();
        match (&mut self.data, &other.data) {
            (Data::Bool(a), Data::Bool(b)) => a.extend_from_slice(b),
            (Data::I32(a), Data::I32(b)) => a.extend_from_slice(b),
            (Data::I64(a), Data::I64(b)) => a.extend_from_slice(b),
            (Data::F64(a), Data::F64(b)) => a.extend_from_slice(b),
            (Data::Numeric(a), Data::Numeric(b)) => a.extend_from_slice(b),
            (Data::Interval(a), Data::Interval(b)) => a.extend_from_slice(b),
            (Data::Text(a, da), Data::Text(b, db)) => {
                if Arc::ptr_eq(da, db) || (a.is_empty() && before == 0) {
                    *da = Arc::clone(db);
                    a.extend_from_slice(b);
                } else {
                    let merged = Arc::make_mut(da);
                    a.extend(b.iter().map(|&code| merged.intern(db.get(code))));
                }
            }
            _ => panic!("append of vectors with different physical types"),
        }
        match (&mut self.validity, &other.validity) {
            (None, None) => {}
            (Some(a), None) => a.extend(std::iter::repeat_n(true, other.len())),
            (None, Some(b)) => {
                let mut validity = vec![true; before];
                validity.extend_from_slice(b);
                self.validity = Some(validity);
            }
            (Some(a), Some(b)) => a.extend_from_slice(b),
        }
    }

    /// The string at `row` of a text vector.
    pub fn text(&self, row: usize) -> &str {
        match &self.data {
            Data::Text(codes, dictionary) => dictionary.get(codes[row]),
            _ => panic!("text() on a non-text vector"),
        }
    }
}

/// A batch of rows: one vector per column, all of length `rows`.
#[derive(Debug, Clone)]
pub struct Batch {
    pub columns: Vec<Vector>,
    pub rows: usize,
}

impl Batch {
    pub fn new(columns: Vec<Vector>, rows: usize) -> Batch {
        debug_assert!(columns.iter().all(|c| c.len() == rows), "all vectors of a batch have its row count");
        Batch { columns, rows }
    }

    pub fn gather(&self, indexes: &[u32]) -> Batch {
        Batch::new(self.columns.iter().map(|c| c.gather(indexes)).collect(), indexes.len())
    }

    pub fn row(&self, row: usize) -> Vec<Value> {
        self.columns.iter().map(|c| c.value(row)).collect()
    }

    /// A row as a client sees it (`Vector::output_value`).
    pub fn output_row(&self, row: usize) -> Vec<Value> {
        self.columns.iter().map(|c| c.output_value(row)).collect()
    }
}

/// Copies rows `start..end` of the given columns of a table chunk into vectors (the scan).
pub fn scan_chunk(table: &Table, chunk: usize, columns: &[usize], start: usize, end: usize) -> Batch {
    let table_chunk = &table.chunks[chunk];
    let vectors = columns
        .iter()
        .map(|&column| {
            let data_type = table.schema[column].data_type;
            let ColumnChunk { data, validity, .. } = &table_chunk.columns[column];
            let data = match data {
                ChunkData::Bool(v) => Data::Bool(v[start..end].iter().map(|&b| b != 0).collect()),
                ChunkData::I32(v) => Data::I32(v[start..end].to_vec()),
                ChunkData::I64(v) => Data::I64(v[start..end].to_vec()),
                ChunkData::F64(v) => Data::F64(v[start..end].to_vec()),
                ChunkData::Numeric(v) => Data::Numeric(v[start..end].to_vec()),
                ChunkData::Interval(v) => Data::Interval(v[start..end].to_vec()),
                ChunkData::Text(v) => Data::Text(
                    v[start..end].to_vec(),
                    Arc::clone(table.dictionaries[column].as_ref().expect("text columns have a dictionary")),
                ),
            };
            let validity = validity.as_ref().map(|v| v[start..end].iter().map(|&b| b != 0).collect());
            Vector { data_type, data, validity }
        })
        .collect();
    Batch::new(vectors, end - start)
}

/// Rows `start + selection[i]` of the given columns of a table chunk (a filtered scan's
/// passing rows, copied once).
pub fn gather_chunk(table: &Table, chunk: usize, columns: &[usize], start: usize, selection: &[u32]) -> Batch {
    fn pick<T: Copy, U>(values: &[T], start: usize, selection: &[u32], convert: impl Fn(T) -> U) -> Vec<U> {
        let values = &values[start..];
        selection.iter().map(|&i| convert(values[i as usize])).collect()
    }
    let table_chunk = &table.chunks[chunk];
    let vectors = columns
        .iter()
        .map(|&column| {
            let data_type = table.schema[column].data_type;
            let ColumnChunk { data, validity, .. } = &table_chunk.columns[column];
            let data = match data {
                ChunkData::Bool(v) => Data::Bool(pick(v, start, selection, |b| b != 0)),
                ChunkData::I32(v) => Data::I32(pick(v, start, selection, |x| x)),
                ChunkData::I64(v) => Data::I64(pick(v, start, selection, |x| x)),
                ChunkData::F64(v) => Data::F64(pick(v, start, selection, |x| x)),
                ChunkData::Numeric(v) => Data::Numeric(pick(v, start, selection, |x| x)),
                ChunkData::Interval(v) => Data::Interval(pick(v, start, selection, |x| x)),
                ChunkData::Text(v) => Data::Text(
                    pick(v, start, selection, |x| x),
                    Arc::clone(table.dictionaries[column].as_ref().expect("text columns have a dictionary")),
                ),
            };
            let validity = validity.as_ref().map(|v| pick(v, start, selection, |b| b != 0));
            Vector { data_type, data, validity }
        })
        .collect();
    Batch::new(vectors, selection.len())
}
