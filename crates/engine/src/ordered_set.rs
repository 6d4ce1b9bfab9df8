//! Aggregates over all of a group's values: string_agg, the ordered-set aggregates
//! percentile_cont, percentile_disc and mode (`WITHIN GROUP (ORDER BY x)`), and the
//! hypothetical-set aggregates rank, dense_rank, percent_rank and cume_dist (`rank(c)
//! WITHIN GROUP (ORDER BY x)`: where c would rank among the group's values), as PostgreSQL
//! computes them. A group's non-null values (all values, NULLs included, for the
//! hypothetical-set ones, whose NULLs sort last) are kept, then sorted once at the end.

use crate::error::{EngineError, Result};
use crate::expr::{evaluate_constant, Expr};
use crate::types::{compare_values, DataType, Value};
use crate::vector::Vector;

/// One aggregate of this family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderedSet {
    /// `string_agg(value, delimiter [ORDER BY value [DESC]])`: `order` is `Some(descending)`
    /// when the values are ordered (by themselves), else they come in input order.
    StringAgg {
        order: Option<bool>,
    },
    PercentileCont,
    PercentileDisc,
    Mode,
    Hypothetical(HypotheticalRank),
}

/// What a hypothetical-set aggregate computes for the hypothetical row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HypotheticalRank {
    Rank,
    DenseRank,
    PercentRank,
    CumeDist,
}

impl OrderedSet {
    pub fn named(name: &str) -> Option<OrderedSet> {
        Some(match name {
            "string_agg" => OrderedSet::StringAgg { order: None },
            "percentile_cont" => OrderedSet::PercentileCont,
            "percentile_disc" => OrderedSet::PercentileDisc,
            "mode" => OrderedSet::Mode,
            "rank" => OrderedSet::Hypothetical(HypotheticalRank::Rank),
            "dense_rank" => OrderedSet::Hypothetical(HypotheticalRank::DenseRank),
            "percent_rank" => OrderedSet::Hypothetical(HypotheticalRank::PercentRank),
            "cume_dist" => OrderedSet::Hypothetical(HypotheticalRank::CumeDist),
            _ => return None,
        })
    }

    /// Binds a call: `args` are the direct arguments (string_agg's value and delimiter, a
    /// percentile's fraction), `within` the WITHIN GROUP key. Returns the aggregated value,
    /// the constant second argument and the result type.
    pub fn bind(self, name: &str, args: Vec<Expr>, within: Option<Expr>) -> Result<(Expr, Option<Expr>, DataType)> {
        let no_signature = |args: &[Expr]| {
            let types: Vec<String> = args.iter().map(|a| a.data_type().sql_name()).collect();
            EngineError::UndefinedFunction(format!("function {name}({}) does not exist", types.join(", ")))
        };
        let constant = |expr: Expr, to: DataType| -> Result<Expr> {
            let expr = crate::bind::cast_expr(expr, to)?;
            if !expr.is_constant() {
                return Err(EngineError::unsupported(format!("{name} with an argument that is not a constant")));
            }
            Ok(Expr::literal(evaluate_constant(&expr)?, to))
        };
        let text_like = |e: &Expr| e.data_type().is_text() || crate::bind::is_untyped(e);
        match (self, within) {
            (OrderedSet::StringAgg { .. }, None) => {
                let [value, delimiter]: [Expr; 2] = args.try_into().map_err(|args: Vec<Expr>| no_signature(&args))?;
                if !text_like(&value) || !text_like(&delimiter) {
                    return Err(no_signature(&[value, delimiter]));
                }
                let value = crate::bind::cast_expr(value, DataType::Text)?;
                Ok((value, Some(constant(delimiter, DataType::Text)?), DataType::Text))
            }
            (OrderedSet::PercentileCont | OrderedSet::PercentileDisc, Some(key)) => {
                let [fraction]: [Expr; 1] = args.try_into().map_err(|args: Vec<Expr>| no_signature(&args))?;
                if !fraction.data_type().is_numeric() && !crate::bind::is_untyped(&fraction) {
                    return Err(no_signature(&[fraction]));
                }
                let fraction = constant(fraction, DataType::Float64)?;
                if self == OrderedSet::PercentileDisc {
                    let data_type = key.data_type();
                    return Ok((key, Some(fraction), data_type));
                }
                if !key.data_type().is_numeric() {
                    return Err(no_signature(&[fraction, key]));
                }
                Ok((crate::bind::cast_expr(key, DataType::Float64)?, Some(fraction), DataType::Float64))
            }
            (OrderedSet::Hypothetical(rank), Some(key)) => {
                let [direct]: [Expr; 1] = args.try_into().map_err(|args: Vec<Expr>| no_signature(&args))?;
                if !direct.columns().is_empty() {
                    // PostgreSQL allows grouped columns here (42803 for others); this engine
                    // takes constants only.
                    return Err(EngineError::unsupported(format!("direct arguments of {name} that read columns")));
                }
                let (mut unified, key_type) = crate::bind::unify(vec![key, direct])?;
                let direct = unified.pop().expect("two unified expressions");
                let key = unified.pop().expect("the key");
                let result_type = match rank {
                    HypotheticalRank::Rank | HypotheticalRank::DenseRank => DataType::Int64,
                    HypotheticalRank::PercentRank | HypotheticalRank::CumeDist => DataType::Float64,
                };
                Ok((key, Some(constant(direct, key_type)?), result_type))
            }
            (OrderedSet::Mode, Some(key)) if args.is_empty() => {
                let data_type = key.data_type();
                Ok((key, None, data_type))
            }
            (OrderedSet::StringAgg { .. }, Some(_)) => Err(EngineError::Syntax(format!(
                "{name} is not an ordered-set aggregate, so it cannot have WITHIN GROUP"
            ))),
            // PostgreSQL looks for a plain function of that name and finds none.
            (_, None) => Err(no_signature(&args)),
            (_, Some(_)) => Err(no_signature(&args)),
        }
    }

    /// The result of one group from its non-null values (in input order).
    pub fn finish(self, mut values: Vec<Value>, second: Option<&Expr>) -> Result<Value> {
        let constant = match second {
            Some(Expr::Literal { value, .. }) => value.clone(),
            _ => Value::Null,
        };
        if let OrderedSet::Hypothetical(rank) = self {
            return Ok(hypothetical(rank, &values, &constant));
        }
        if values.is_empty() {
            return Ok(Value::Null);
        }
        match self {
            OrderedSet::StringAgg { order } => {
                if let Some(descending) = order {
                    values.sort_by(compare_values);
                    if descending {
                        values.reverse();
                    }
                }
                let delimiter = if let Value::Text(d) = &constant { d.as_str() } else { "" };
                let parts: Vec<String> = values.iter().map(ToString::to_string).collect();
                Ok(Value::Text(parts.join(delimiter)))
            }
            OrderedSet::PercentileCont | OrderedSet::PercentileDisc => {
                let Value::Float64(fraction) = constant else { return Ok(Value::Null) };
                if !(0.0..=1.0).contains(&fraction) {
                    return Err(EngineError::Overflow(format!("percentile value {fraction} is not between 0 and 1")));
                }
                values.sort_by(compare_values);
                Ok(percentile(self, &values, fraction))
            }
            OrderedSet::Mode => {
                values.sort_by(compare_values);
                Ok(mode(values))
            }
            OrderedSet::Hypothetical(_) => unreachable!("handled above"),
        }
    }
}

/// Where `candidate` ranks among `values` (ascending, NULLs last and peers of each other):
/// rank and dense_rank count the values before it, percent_rank and cume_dist are the
/// window functions' fractions over the values with the hypothetical row added.
fn hypothetical(rank: HypotheticalRank, values: &[Value], candidate: &Value) -> Value {
    use std::cmp::Ordering;
    let order = |value: &Value| match (value.is_null(), candidate.is_null()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => compare_values(value, candidate),
    };
    let before = values.iter().filter(|v| order(v) == Ordering::Less).count();
    let peers = values.iter().filter(|v| order(v) == Ordering::Equal).count();
    let n = values.len();
    match rank {
        HypotheticalRank::Rank => Value::Int64(before as i64 + 1),
        HypotheticalRank::DenseRank => {
            let mut distinct: Vec<&Value> = values.iter().filter(|v| order(v) == Ordering::Less).collect();
            distinct.sort_by(|a, b| compare_values(a, b));
            distinct.dedup_by(|a, b| compare_values(a, b).is_eq());
            Value::Int64(distinct.len() as i64 + 1)
        }
        HypotheticalRank::PercentRank if n == 0 => Value::Float64(0.0),
        HypotheticalRank::PercentRank => Value::Float64(before as f64 / n as f64),
        HypotheticalRank::CumeDist => Value::Float64((before + peers + 1) as f64 / (n + 1) as f64),
    }
}

/// PostgreSQL's percentile_disc (the first value whose position reaches fraction · n) and
/// percentile_cont (linear interpolation between the two values around fraction · (n − 1)).
fn percentile(kind: OrderedSet, sorted: &[Value], fraction: f64) -> Value {
    let n = sorted.len();
    if kind == OrderedSet::PercentileDisc {
        let position = ((fraction * n as f64).ceil() as usize).clamp(1, n);
        return sorted[position - 1].clone();
    }
    let at = fraction * (n - 1) as f64;
    let (first, second) = (at.floor() as usize, at.ceil() as usize);
    let low = sorted[first].as_f64().unwrap_or(f64::NAN);
    let high = sorted[second].as_f64().unwrap_or(f64::NAN);
    if first == second {
        return Value::Float64(low);
    }
    Value::Float64(low + (high - low) * (at - first as f64))
}

/// The most frequent value; among equally frequent ones, the first in sort order.
fn mode(sorted: Vec<Value>) -> Value {
    let (mut best, mut best_count) = (Value::Null, 0usize);
    let mut index = 0;
    while index < sorted.len() {
        let run = sorted[index..].iter().take_while(|v| compare_values(v, &sorted[index]).is_eq()).count();
        if run > best_count {
            (best, best_count) = (sorted[index].clone(), run);
        }
        index += run;
    }
    best
}

/// Adds all of a batch's values, NULLs too, to their groups' lists (hypothetical-set).
pub fn collect_all(lists: &mut [Vec<Value>], groups: &[u32], values: &Vector) {
    for (row, &group) in groups.iter().enumerate() {
        lists[group as usize].push(values.value(row));
    }
}

/// Adds a batch's non-null values to their groups' lists.
pub fn collect(lists: &mut [Vec<Value>], groups: &[u32], values: &Vector) {
    for (row, &group) in groups.iter().enumerate() {
        if values.is_valid(row) {
            lists[group as usize].push(values.value(row));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: percentiles and mode as PostgreSQL defines them; method: 1, 3, 5, 7 and a
    // small multiset (percentile_cont(0.25) of 1,3,5,7 is 2.5, percentile_disc(0.5) is 3).
    #[test]
    fn percentiles_and_mode() {
        let values: Vec<Value> = [1.0, 3.0, 5.0, 7.0].into_iter().map(Value::Float64).collect();
        assert_eq!(percentile(OrderedSet::PercentileCont, &values, 0.25), Value::Float64(2.5));
        assert_eq!(percentile(OrderedSet::PercentileCont, &values, 0.5), Value::Float64(4.0));
        assert_eq!(percentile(OrderedSet::PercentileDisc, &values, 0.5), Value::Float64(3.0));
        assert_eq!(percentile(OrderedSet::PercentileDisc, &values, 0.0), Value::Float64(1.0));
        let words: Vec<Value> = ["a", "b", "b", "c", "c"].into_iter().map(|w| Value::Text(w.into())).collect();
        assert_eq!(mode(words), Value::Text("b".into()));
    }
}
