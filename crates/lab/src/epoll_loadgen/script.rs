//! What each transaction sends: one simple-protocol statement picked by weight, with every
//! `:key` replaced by a key drawn from a zipfian distribution over `1..=keys` with
//! P(k) ∝ 1 / k^exponent — pgbench's `random_zipfian(1, keys, exponent)`, so a mix written for
//! pgbench (the YCSB-like scripts) runs the same here.

use std::fmt::Write as _;

use bypass_wire::frontend::build;

use super::LoadError;

/// Most statements in one script.
pub const STATEMENTS_MAX: usize = 16;
/// Most keys of a zipfian distribution: its table holds one `f64` per key (80 MB at most).
pub const KEYS_MAX: u32 = 10_000_000;
/// The placeholder a statement's key replaces, as in pgbench scripts.
pub const KEY_PLACEHOLDER: &str = ":key";

/// One statement of a mix and how often it runs relative to the others.
#[derive(Debug, Clone, PartialEq)]
pub struct Statement {
    pub weight: u32,
    /// SQL sent as one simple Query; `:key` is replaced by a drawn key.
    pub sql: String,
}

/// Keys drawn with P(k) ∝ 1 / k^exponent over `1..=keys` (key 1 is the hottest).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Zipfian {
    pub keys: u32,
    pub exponent: f64,
}

/// The transactions of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Script {
    pub statements: Vec<Statement>,
    /// Needed when a statement contains `:key`.
    pub keys: Option<Zipfian>,
}

impl Script {
    /// The same statement in every transaction (e.g. `SELECT 1`).
    pub fn fixed(sql: &str) -> Script {
        Script { statements: vec![Statement { weight: 1, sql: sql.to_string() }], keys: None }
    }
}

/// A small, fast generator (SplitMix64): the mix needs uniform draws, not cryptography, and
/// each worker owns one so no draw is shared between threads.
#[derive(Debug, Clone)]
pub struct Random(u64);

impl Random {
    pub fn new(seed: u64) -> Random {
        Random(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..bound` (`bound` > 0).
    pub fn below(&mut self, bound: u32) -> u32 {
        (((self.next_u64() >> 32) * u64::from(bound)) >> 32) as u32
    }
}

/// A statement split at its placeholders, with the running total of the weights before it.
#[derive(Debug)]
struct Template {
    weight_end: u32,
    /// The SQL around the keys: `parts.len() - 1` keys go between them.
    parts: Vec<String>,
}

/// A [`Script`] checked and ready to draw from.
#[derive(Debug)]
pub struct CompiledScript {
    templates: Vec<Template>,
    weight_total: u32,
    /// cdf[i] = P(key ≤ i + 1); empty without keys.
    key_cdf: Vec<f64>,
}

impl CompiledScript {
    pub fn new(script: &Script) -> Result<CompiledScript, LoadError> {
        check(script)?;
        let mut weight_total = 0u32;
        let mut templates = Vec::with_capacity(script.statements.len());
        for statement in &script.statements {
            weight_total = weight_total
                .checked_add(statement.weight)
                .ok_or_else(|| LoadError::Config("statement weights overflow".into()))?;
            let parts = statement.sql.split(KEY_PLACEHOLDER).map(str::to_string).collect();
            templates.push(Template { weight_end: weight_total, parts });
        }
        let key_cdf = script.keys.map(zipfian_cdf).unwrap_or_default();
        Ok(CompiledScript { templates, weight_total, key_cdf })
    }

    /// Appends the next transaction's Query message to `out`; `sql` is scratch space.
    pub fn append_query(&self, random: &mut Random, sql: &mut String, out: &mut Vec<u8>) {
        let pick = random.below(self.weight_total);
        let index = self.templates.partition_point(|template| template.weight_end <= pick);
        let template = &self.templates[index.min(self.templates.len() - 1)];
        sql.clear();
        for (position, part) in template.parts.iter().enumerate() {
            if position > 0 {
                let _ = write!(sql, "{}", self.draw_key(random));
            }
            sql.push_str(part);
        }
        build::query(out, sql);
    }

    /// A key by inverting the cumulative distribution: the first key whose cdf exceeds a
    /// uniform draw.
    pub fn draw_key(&self, random: &mut Random) -> u32 {
        let draw = random.unit();
        let index = self.key_cdf.partition_point(|&cumulative| cumulative <= draw);
        index.min(self.key_cdf.len().saturating_sub(1)) as u32 + 1
    }
}

fn check(script: &Script) -> Result<(), LoadError> {
    let problem = |text: String| Err(LoadError::Config(text));
    if script.statements.is_empty() || script.statements.len() > STATEMENTS_MAX {
        return problem(format!("a script needs 1 to {STATEMENTS_MAX} statements"));
    }
    if script.statements.iter().any(|statement| statement.weight == 0 || statement.sql.trim().is_empty()) {
        return problem("every statement needs a weight above 0 and some SQL".into());
    }
    let keyed = script.statements.iter().any(|statement| statement.sql.contains(KEY_PLACEHOLDER));
    match script.keys {
        None if keyed => problem(format!("a statement uses {KEY_PLACEHOLDER} but the script has no key distribution")),
        Some(Zipfian { keys, exponent })
            if keys == 0 || keys > KEYS_MAX || !(exponent > 0.0 && exponent.is_finite()) =>
        {
            problem(format!("zipfian keys must be 1..={KEYS_MAX} with a finite exponent above 0"))
        }
        _ => Ok(()),
    }
}

/// P(key ≤ k) for every k, normalised so the last entry is 1.
fn zipfian_cdf(zipfian: Zipfian) -> Vec<f64> {
    let mut cdf = Vec::with_capacity(zipfian.keys as usize);
    let mut total = 0.0;
    for key in 1..=zipfian.keys {
        total += f64::from(key).powf(-zipfian.exponent);
        cdf.push(total);
    }
    for cumulative in &mut cdf {
        *cumulative /= total;
    }
    cdf
}

#[cfg(test)]
mod tests {
    use super::*;
    use bypass_wire::FrontendMessage;

    fn query_text(compiled: &CompiledScript, random: &mut Random) -> String {
        let (mut sql, mut out) = (String::new(), Vec::new());
        compiled.append_query(random, &mut sql, &mut out);
        let FrontendMessage::Query(text) = FrontendMessage::decode(out[0], &out[5..]).expect("a query") else {
            panic!("not a query")
        };
        String::from_utf8(text.to_vec()).expect("utf-8")
    }

    // Goal: keys replace every placeholder and weights pick statements in proportion; method:
    // a 3:1 mix drawn 4,000 times with a fixed seed.
    #[test]
    fn statements_follow_their_weights_and_get_keys() {
        let script = Script {
            statements: vec![
                Statement { weight: 3, sql: "SELECT :key".into() },
                Statement { weight: 1, sql: "UPDATE t SET v = :key WHERE k = :key".into() },
            ],
            keys: Some(Zipfian { keys: 10, exponent: 1.001 }),
        };
        let compiled = CompiledScript::new(&script).expect("valid");
        let mut random = Random::new(7);
        let mut updates = 0;
        for _ in 0..4_000 {
            let text = query_text(&compiled, &mut random);
            assert!(!text.contains(':'), "{text}");
            updates += usize::from(text.starts_with("UPDATE"));
        }
        assert!((900..1_100).contains(&updates), "{updates} updates of 4,000");
        assert_eq!(
            query_text(&CompiledScript::new(&Script::fixed("SELECT 1")).expect("valid"), &mut random),
            "SELECT 1"
        );
    }

    // Goal: keys follow P(k) ∝ 1/k^s like pgbench's random_zipfian; method: 100,000 draws over
    // 100 keys at s = 1.001 against the exact probabilities of keys 1 and 2.
    #[test]
    fn keys_are_zipfian() {
        let zipfian = Zipfian { keys: 100, exponent: 1.001 };
        let compiled = CompiledScript::new(&Script {
            statements: vec![Statement { weight: 1, sql: ":key".into() }],
            keys: Some(zipfian),
        })
        .expect("valid");
        let harmonic: f64 = (1..=100).map(|k| f64::from(k).powf(-1.001)).sum();
        let mut counts = [0u32; 101];
        let mut random = Random::new(42);
        for _ in 0..100_000 {
            let key = compiled.draw_key(&mut random);
            assert!((1..=100).contains(&key), "{key}");
            counts[key as usize] += 1;
        }
        for key in [1u32, 2] {
            let expected = 100_000.0 * f64::from(key).powf(-1.001) / harmonic;
            let seen = f64::from(counts[key as usize]);
            assert!((seen - expected).abs() < expected * 0.05, "key {key}: {seen} vs {expected}");
        }
        assert!(counts[100] > 0);
    }

    // Goal: a script that cannot run is refused before any connection; method: bad scripts.
    #[test]
    fn bad_scripts_are_refused() {
        let keyed = Script { statements: vec![Statement { weight: 1, sql: "SELECT :key".into() }], keys: None };
        assert!(matches!(CompiledScript::new(&keyed), Err(LoadError::Config(_))));
        let empty = Script { statements: Vec::new(), keys: None };
        assert!(CompiledScript::new(&empty).is_err());
        let zero = Script { statements: vec![Statement { weight: 0, sql: "SELECT 1".into() }], keys: None };
        assert!(CompiledScript::new(&zero).is_err());
        let huge = Script { keys: Some(Zipfian { keys: KEYS_MAX + 1, exponent: 1.0 }), ..Script::fixed("SELECT 1") };
        assert!(CompiledScript::new(&huge).is_err());
    }
}
