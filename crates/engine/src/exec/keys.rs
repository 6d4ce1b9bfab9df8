//! Key normalization for hash tables: every key column becomes one `u64` word per row.
//!
//! Integers, dates and decimals are their value, floats their bits. Text is a code: the first
//! dictionary a key column meets is *adopted* and its codes are used as they are (every chunk
//! of a table column shares one dictionary, so the common case costs nothing); strings from
//! any other dictionary are looked up in the adopted one, and strings it lacks get codes after
//! its last, from a per-operator interner shared by all workers, so equal strings always get
//! equal words. Aggregates add one word with a null bitmap; joins skip null keys.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::interval::Interval;
use crate::numeric::Numeric;
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

/// Whether two keys' words are equal: an inline loop (keys are one to a few words; slice `==`
/// calls libc's memcmp, which showed as 5–8% of TPC-H Q13 and Q18).
#[inline]
pub fn same_key(a: &[u64], b: &[u64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

/// Per key column: the adopted dictionary and the interner of strings it lacks (None for
/// non-text keys).
pub struct KeyEncoder {
    pub types: Vec<DataType>,
    adopted: Vec<OnceLock<Arc<Dictionary>>>,
    interners: Vec<Option<Mutex<Dictionary>>>,
    /// Numeric keys: one code per numeric value (1.5 and 1.50 share one), and the first value
    /// seen with each code, which decoding gives back (PostgreSQL keeps a group's first value).
    numerics: Vec<Option<Mutex<FirstSeenCodes<Numeric, Numeric>>>>,
    /// Interval keys, likewise: equal spans ('1 mon', '30 days') share a code.
    intervals: Vec<Option<Mutex<FirstSeenCodes<Interval, i128>>>>,
}

/// One code per equal value (its normalized form `K`) and the first value seen with each.
struct FirstSeenCodes<T, K> {
    codes: HashMap<K, u32>,
    first: Vec<T>,
}

impl<T, K> Default for FirstSeenCodes<T, K> {
    fn default() -> Self {
        FirstSeenCodes { codes: HashMap::new(), first: Vec::new() }
    }
}

impl<T: Copy, K: Eq + std::hash::Hash> FirstSeenCodes<T, K> {
    fn code(&mut self, value: T, normalized: K) -> u32 {
        let first = &mut self.first;
        *self.codes.entry(normalized).or_insert_with(|| {
            first.push(value);
            u32::try_from(first.len() - 1).expect("fewer than 2^32 distinct keys")
        })
    }
}

/// The codes of a numeric or interval key column, locked (a worker that panicked holding them
/// left them whole: each change is one insert and one push).
fn locked<'a, T, K>(
    codes: &'a Option<Mutex<FirstSeenCodes<T, K>>>,
    kind: &str,
) -> std::sync::MutexGuard<'a, FirstSeenCodes<T, K>> {
    let codes = codes.as_ref().unwrap_or_else(|| panic!("{kind} keys have codes"));
    codes.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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
        let interners = types.iter().map(|t| t.is_text().then(|| Mutex::new(Dictionary::new()))).collect();
        let adopted = types.iter().map(|_| OnceLock::new()).collect();
        let numerics = types.iter().map(|t| (*t == DataType::Numeric).then(Mutex::default)).collect();
        let intervals = types.iter().map(|t| (*t == DataType::Interval).then(Mutex::default)).collect();
        KeyEncoder { types, adopted, interners, numerics, intervals }
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
                Data::Numeric(v) => {
                    let mut codes = locked(&self.numerics[k], "numeric");
                    v.iter().enumerate().for_each(|(r, &x)| out[slot(r)] = u64::from(codes.code(x, x.normalized())));
                }
                Data::Interval(v) => {
                    let mut codes = locked(&self.intervals[k], "interval");
                    v.iter().enumerate().for_each(|(r, &x)| out[slot(r)] = u64::from(codes.code(x, x.span_micros())));
                }
                Data::Text(codes, dictionary) => {
                    let adopted = self.adopted[k].get_or_init(|| Arc::clone(dictionary));
                    if Arc::ptr_eq(adopted, dictionary) {
                        codes.iter().enumerate().for_each(|(r, &code)| out[slot(r)] = u64::from(code));
                    } else {
                        let translation = self.translation(cache, k, dictionary);
                        for (r, &code) in codes.iter().enumerate() {
                            out[slot(r)] = u64::from(self.translate(k, adopted, translation, dictionary, code));
                        }
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

    /// The word of `dictionary`'s `code`: its code in the adopted dictionary, else one past
    /// the adopted codes from the interner.
    fn translate(
        &self,
        key: usize,
        adopted: &Dictionary,
        translation: &mut [u32],
        dictionary: &Dictionary,
        code: u32,
    ) -> u32 {
        let slot = &mut translation[code as usize];
        if *slot == UNTRANSLATED {
            let text = dictionary.get(code);
            *slot = adopted.code_of(text).unwrap_or_else(|| {
                let interner = self.interners[key].as_ref().expect("text keys have an interner");
                let extra = interner.lock().unwrap_or_else(|p| p.into_inner()).intern(text);
                u32::try_from(adopted.len()).expect("dictionary sizes fit u32") + extra
            });
        }
        *slot
    }

    /// The dictionary that decodes key column `key`'s words: the adopted one (shared, no
    /// copy) when no other strings were met, else a copy extended by the interned strings.
    fn output_dictionary(&self, key: usize) -> Arc<Dictionary> {
        let interner = self.interners[key].as_ref().expect("text keys have an interner");
        let extra = interner.lock().unwrap_or_else(|p| p.into_inner());
        match self.adopted[key].get() {
            Some(adopted) if extra.is_empty() => Arc::clone(adopted),
            Some(adopted) => {
                let mut combined = Dictionary::clone(adopted);
                extra.values().iter().for_each(|text| {
                    combined.intern(text);
                });
                Arc::new(combined)
            }
            None => Arc::new(extra.clone()),
        }
    }

    /// Key column `key` of the given groups' words, as a vector (aggregate output).
    pub fn decode(&self, key: usize, width: usize, words: &[u64], null_word: bool) -> Vector {
        let data_type = self.types[key];
        let rows = words.len().checked_div(width).unwrap_or(0);
        let column = (0..rows).map(|r| words[r * width + key]);
        let data = match data_type {
            DataType::Bool => Data::Bool(column.map(|w| w != 0).collect()),
            DataType::Int16 | DataType::Int32 | DataType::Date => Data::I32(column.map(|w| w as i64 as i32).collect()),
            DataType::Int64 | DataType::Decimal { .. } | DataType::Timestamp | DataType::TimestampTz => {
                Data::I64(column.map(|w| w as i64).collect())
            }
            DataType::Float64 | DataType::Float32 => Data::F64(column.map(f64::from_bits).collect()),
            DataType::Text | DataType::Char(_) | DataType::Varchar(_) => {
                Data::Text(column.map(|w| w as u32).collect(), self.output_dictionary(key))
            }
            DataType::Numeric => {
                let codes = locked(&self.numerics[key], "numeric");
                Data::Numeric(column.map(|w| codes.first.get(w as usize).copied().unwrap_or(Numeric::ZERO)).collect())
            }
            DataType::Interval => {
                let codes = locked(&self.intervals[key], "interval");
                Data::Interval(column.map(|w| codes.first.get(w as usize).copied().unwrap_or(Interval::ZERO)).collect())
            }
        };
        let validity =
            null_word.then(|| (0..rows).map(|r| words[r * width + width - 1] & (1 << (key % 64)) == 0).collect());
        Vector { data_type, data, validity }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_vector(dictionary: &Arc<Dictionary>, codes: Vec<u32>) -> Vector {
        Vector { data_type: DataType::Text, data: Data::Text(codes, Arc::clone(dictionary)), validity: None }
    }

    // Goal: equal strings get equal key words whichever dictionary they come from, and words
    // decode back to the right strings. Method: an adopted dictionary and a foreign one that
    // shares one string and adds another; encode both, compare words, decode.
    #[test]
    fn text_keys_from_different_dictionaries_agree() {
        let mut first = Dictionary::new();
        let (apple, pear) = (first.intern("apple"), first.intern("pear"));
        let mut second = Dictionary::new();
        let (kiwi, pear_again) = (second.intern("kiwi"), second.intern("pear"));
        let (first, second) = (Arc::new(first), Arc::new(second));
        let encoder = KeyEncoder::new(vec![DataType::Text]);
        let mut cache = KeyCache::default();
        let mut words = Vec::new();
        encoder.encode(&mut cache, &[text_vector(&first, vec![apple, pear])], 2, false, &mut words);
        encoder.encode(&mut cache, &[text_vector(&second, vec![pear_again, kiwi])], 2, false, &mut words);
        assert_eq!(words[1], words[2], "pear has one word");
        assert_ne!(words[3], words[0], "kiwi is not apple");
        assert_ne!(words[3], words[1], "kiwi is not pear");
        let decoded = encoder.decode(0, 1, &words, false);
        let Data::Text(codes, dictionary) = &decoded.data else { panic!("text decodes to text") };
        let strings: Vec<&str> = codes.iter().map(|&c| dictionary.get(c)).collect();
        assert_eq!(strings, ["apple", "pear", "pear", "kiwi"]);
    }
}
