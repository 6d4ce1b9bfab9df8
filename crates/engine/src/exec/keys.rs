//! Key normalization for hash tables: every key column becomes one `u64` word per row.
//!
//! Integers, dates and decimals are their value, floats their bits, text a code from a
//! per-operator interner shared by all workers (so equal strings from different dictionaries
//! get equal words). Aggregates add one word with a null bitmap; joins skip null keys.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::storage::Dictionary;
use crate::types::DataType;
use crate::vector::{Data, Vector};

/// fxhash's multiplier: fast and good enough for normalized integer keys.
const HASH_MULTIPLIER: u64 = 0x51_7c_c1_b7_27_22_0a_95;

pub fn hash_words(words: &[u64]) -> u64 {
    let mut hash = 0u64;
    for &word in words {
        hash = (hash.rotate_left(5) ^ word).wrapping_mul(HASH_MULTIPLIER);
    }
    // Fold high bits down: hashbrown uses both the low bits (bucket) and the top 7 (tag).
    hash ^ (hash >> 32)
}

/// Shared text interners, one per key column (None for non-text keys).
pub struct KeyEncoder {
    pub types: Vec<DataType>,
    interners: Vec<Option<Mutex<Dictionary>>>,
}

/// A dictionary (kept alive) and its codes' interned codes.
type Translation = (Arc<Dictionary>, Vec<u32>);

/// A worker's translation cache: per key column, dictionary address → translation.
#[derive(Default)]
pub struct KeyCache {
    translations: Vec<HashMap<usize, Translation>>,
}

/// Marks a code not yet translated.
const UNTRANSLATED: u32 = u32::MAX;

impl KeyEncoder {
    pub fn new(types: Vec<DataType>) -> KeyEncoder {
        let interners = types.iter().map(|t| (*t == DataType::Text).then(|| Mutex::new(Dictionary::new()))).collect();
        KeyEncoder { types, interners }
    }

    /// Appends `keys.len()` words per row (plus a null bitmap word when `null_word`) to `out`;
    /// returns per row whether any key is null.
    pub fn encode(
        &self,
        cache: &mut KeyCache,
        keys: &[Vector],
        rows: usize,
        null_word: bool,
        out: &mut Vec<u64>,
    ) -> Vec<bool> {
        let width = keys.len() + usize::from(null_word);
        let start = out.len();
        out.resize(start + rows * width, 0);
        let mut has_null = vec![false; rows];
        if cache.translations.len() < keys.len() {
            cache.translations.resize_with(keys.len(), HashMap::new);
        }
        for (k, key) in keys.iter().enumerate() {
            let slot = |row: usize| start + row * width + k;
            match &key.data {
                Data::Bool(v) => v.iter().enumerate().for_each(|(r, &x)| out[slot(r)] = u64::from(x)),
                Data::I32(v) => v.iter().enumerate().for_each(|(r, &x)| out[slot(r)] = i64::from(x) as u64),
                Data::I64(v) => v.iter().enumerate().for_each(|(r, &x)| out[slot(r)] = x as u64),
                Data::F64(v) => v.iter().enumerate().for_each(|(r, &x)| out[slot(r)] = (x + 0.0).to_bits()),
                Data::Text(codes, dictionary) => {
                    let translation = self.translation(cache, k, dictionary);
                    for (r, &code) in codes.iter().enumerate() {
                        out[slot(r)] = u64::from(self.translate(k, translation, dictionary, code));
                    }
                }
            }
            if let Some(validity) = &key.validity {
                for (row, &valid) in validity.iter().enumerate() {
                    if !valid {
                        has_null[row] = true;
                        out[slot(row)] = 0;
                        if null_word {
                            out[start + row * width + keys.len()] |= 1 << (k % 64);
                        }
                    }
                }
            }
        }
        has_null
    }

    fn translation<'c>(&self, cache: &'c mut KeyCache, key: usize, dictionary: &Arc<Dictionary>) -> &'c mut Vec<u32> {
        let address = Arc::as_ptr(dictionary) as usize;
        let entry = cache.translations[key]
            .entry(address)
            .or_insert_with(|| (Arc::clone(dictionary), vec![UNTRANSLATED; dictionary.len()]));
        if entry.1.len() < dictionary.len() {
            entry.1.resize(dictionary.len(), UNTRANSLATED);
        }
        &mut entry.1
    }

    fn translate(&self, key: usize, translation: &mut [u32], dictionary: &Dictionary, code: u32) -> u32 {
        let slot = &mut translation[code as usize];
        if *slot == UNTRANSLATED {
            let interner = self.interners[key].as_ref().expect("text keys have an interner");
            *slot = interner.lock().unwrap_or_else(|p| p.into_inner()).intern(dictionary.get(code));
        }
        *slot
    }

    /// Key column `key` of the given groups' words, as a vector (aggregate output).
    pub fn decode(&self, key: usize, width: usize, words: &[u64], null_word: bool) -> Vector {
        let data_type = self.types[key];
        let rows = words.len().checked_div(width).unwrap_or(0);
        let column = (0..rows).map(|r| words[r * width + key]);
        let data = match data_type {
            DataType::Bool => Data::Bool(column.map(|w| w != 0).collect()),
            DataType::Int32 | DataType::Date => Data::I32(column.map(|w| w as i64 as i32).collect()),
            DataType::Int64 | DataType::Decimal { .. } => Data::I64(column.map(|w| w as i64).collect()),
            DataType::Float64 => Data::F64(column.map(f64::from_bits).collect()),
            DataType::Text => {
                let interner = self.interners[key].as_ref().expect("text keys have an interner");
                let dictionary = interner.lock().unwrap_or_else(|p| p.into_inner()).clone();
                Data::Text(column.map(|w| w as u32).collect(), Arc::new(dictionary))
            }
        };
        let validity =
            null_word.then(|| (0..rows).map(|r| words[r * width + width - 1] & (1 << (key % 64)) == 0).collect());
        Vector { data_type, data, validity }
    }
}
