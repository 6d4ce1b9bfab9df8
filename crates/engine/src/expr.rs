//! Bound expressions and their vectorized evaluation (the interpreter's kernels).
//!
//! The binder types every expression and inserts casts so that both operands of an arithmetic
//! or comparison operator have the same physical representation; kernels here therefore only
//! see (i32, i32), (i64, i64), (f64, f64), (bool, bool) or (text, text) pairs.

use std::sync::Arc;

use crate::datetime::{self, DatePart};
use crate::error::{EngineError, Result};
use crate::functions::ScalarFunction;
use crate::interval::Interval;
use crate::numeric::Numeric;
use crate::storage::Dictionary;
use crate::types::{civil_from_days, compare_values, pow10, DataType, Value};
use crate::vector::{Batch, Data, Vector};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Eq,
    NotEq,
    Lt,
    LtEq,
    Gt,
    GtEq,
    And,
    Or,
}

impl BinaryOp {
    pub fn is_comparison(self) -> bool {
        matches!(self, BinaryOp::Eq | BinaryOp::NotEq | BinaryOp::Lt | BinaryOp::LtEq | BinaryOp::Gt | BinaryOp::GtEq)
    }

    pub fn symbol(self) -> &'static str {
        match self {
            BinaryOp::Add => "+",
            BinaryOp::Sub => "-",
            BinaryOp::Mul => "*",
            BinaryOp::Div => "/",
            BinaryOp::Mod => "%",
            BinaryOp::Eq => "=",
            BinaryOp::NotEq => "<>",
            BinaryOp::Lt => "<",
            BinaryOp::LtEq => "<=",
            BinaryOp::Gt => ">",
            BinaryOp::GtEq => ">=",
            BinaryOp::And => "AND",
            BinaryOp::Or => "OR",
        }
    }

    /// The operator with its operands swapped (`a < b` ⇔ `b > a`).
    pub fn flipped(self) -> BinaryOp {
        match self {
            BinaryOp::Lt => BinaryOp::Gt,
            BinaryOp::LtEq => BinaryOp::GtEq,
            BinaryOp::Gt => BinaryOp::Lt,
            BinaryOp::GtEq => BinaryOp::LtEq,
            other => other,
        }
    }
}

/// A typed expression over the columns of its input batch.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Column {
        index: usize,
        data_type: DataType,
    },
    Literal {
        value: Value,
        data_type: DataType,
    },
    Binary {
        op: BinaryOp,
        left: Box<Expr>,
        right: Box<Expr>,
        data_type: DataType,
    },
    Not(Box<Expr>),
    Negate(Box<Expr>),
    IsNull {
        expr: Box<Expr>,
        negated: bool,
    },
    Cast {
        expr: Box<Expr>,
        to: DataType,
    },
    Case {
        branches: Vec<(Expr, Expr)>,
        otherwise: Box<Expr>,
        data_type: DataType,
    },
    InList {
        expr: Box<Expr>,
        list: Vec<Value>,
        negated: bool,
    },
    Like {
        expr: Box<Expr>,
        pattern: String,
        negated: bool,
    },
    /// EXTRACT(field FROM date, timestamp or interval): numeric, as in PostgreSQL 15.
    Extract {
        field: DatePart,
        expr: Box<Expr>,
    },
    Substring {
        expr: Box<Expr>,
        start: i64,
        length: Option<i64>,
    },
    /// `date + n months` with a constant n (intervals on columns).
    /// A value of the enclosing query's row inside a correlated subquery's plan (the
    /// subquery's `params[index]`), substituted before each execution.
    Param {
        index: usize,
        data_type: DataType,
    },
    /// A subquery used as a value: scalar, EXISTS, or `x op ANY/ALL (…)` (IN is `= ANY`).
    Subquery(Box<SubqueryExpr>),
    /// A scalar function (`functions`), its arguments already of its signature's types.
    Function {
        function: ScalarFunction,
        args: Vec<Expr>,
        data_type: DataType,
    },
}

/// How a subquery's rows become a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubqueryKind {
    /// The single value of at most one row (21000 for more), NULL for none.
    Scalar,
    /// Whether there is a row.
    Exists,
    /// `lhs op ANY (rows)`: true if it holds for some row, NULL if unknown for some and true
    /// for none, else false.
    Any(BinaryOp),
    /// `lhs op ALL (rows)`: false if it fails for some row, NULL if unknown for some, else true.
    All(BinaryOp),
}

/// A subquery as an expression. `plan` reads `Expr::Param`s that `params` (expressions over the
/// enclosing input) supply per row; uncorrelated ones (no params) run once and are cached.
#[derive(Debug, Clone)]
pub struct SubqueryExpr {
    pub kind: SubqueryKind,
    pub plan: Arc<crate::plan::Plan>,
    pub params: Vec<Expr>,
    /// The tested value of ANY/ALL, over the enclosing input.
    pub lhs: Option<Expr>,
    /// The type of the subquery's one output column.
    pub column_type: DataType,
    /// The rows of an uncorrelated subquery, once run (shared by all workers).
    pub cache: Arc<std::sync::Mutex<Option<Arc<crate::exec::subquery::Resolved>>>>,
}

impl SubqueryExpr {
    pub fn new(kind: SubqueryKind, plan: crate::plan::Plan, params: Vec<Expr>, lhs: Option<Expr>) -> SubqueryExpr {
        let column_type = plan.output_types().first().copied().unwrap_or(DataType::Bool);
        SubqueryExpr { kind, plan: Arc::new(plan), params, lhs, column_type, cache: Arc::default() }
    }

    pub fn data_type(&self) -> DataType {
        match self.kind {
            SubqueryKind::Scalar => self.column_type,
            _ => DataType::Bool,
        }
    }

    /// The same subquery over other parameter and test expressions (one plan, one cache).
    fn with_children(&self, params: Vec<Expr>, lhs: Option<Expr>) -> SubqueryExpr {
        SubqueryExpr { params, lhs, ..self.clone() }
    }
}

impl PartialEq for SubqueryExpr {
    /// One subquery of the SQL text is equal to itself only (its plan is not compared).
    fn eq(&self, other: &SubqueryExpr) -> bool {
        Arc::ptr_eq(&self.plan, &other.plan) && self.params == other.params && self.lhs == other.lhs
    }
}

impl Expr {
    pub fn data_type(&self) -> DataType {
        match self {
            Expr::Column { data_type, .. } | Expr::Literal { data_type, .. } => *data_type,
            Expr::Binary { data_type, .. } | Expr::Case { data_type, .. } => *data_type,
            Expr::Function { data_type, .. } => *data_type,
            Expr::Not(_) | Expr::IsNull { .. } | Expr::InList { .. } | Expr::Like { .. } => DataType::Bool,
            Expr::Negate(inner) => inner.data_type(),
            Expr::Cast { to, .. } => *to,
            Expr::Extract { field, expr } => {
                DataType::Decimal { precision: 18, scale: field.scale(expr.data_type() == DataType::Date) }
            }
            Expr::Substring { .. } => DataType::Text,
            Expr::Param { data_type, .. } => *data_type,
            Expr::Subquery(subquery) => subquery.data_type(),
        }
    }

    pub fn literal(value: Value, data_type: DataType) -> Expr {
        Expr::Literal { value, data_type }
    }

    pub fn binary(op: BinaryOp, left: Expr, right: Expr, data_type: DataType) -> Expr {
        Expr::Binary { op, left: Box::new(left), right: Box::new(right), data_type }
    }

    /// Children, for generic walks (a subquery's are its parameters and tested value, over
    /// the enclosing input; its plan is a world of its own).
    pub fn children(&self) -> Vec<&Expr> {
        match self {
            Expr::Column { .. } | Expr::Literal { .. } | Expr::Param { .. } => vec![],
            Expr::Subquery(subquery) => subquery.params.iter().chain(subquery.lhs.as_ref()).collect(),
            Expr::Binary { left, right, .. } => vec![left, right],
            Expr::Not(e) | Expr::Negate(e) | Expr::Cast { expr: e, .. } | Expr::IsNull { expr: e, .. } => vec![e],
            Expr::InList { expr, .. } | Expr::Like { expr, .. } | Expr::Extract { expr, .. } => vec![expr],
            Expr::Substring { expr, .. } => vec![expr],
            Expr::Case { branches, otherwise, .. } => {
                branches.iter().flat_map(|(c, r)| [c, r]).chain(std::iter::once(otherwise.as_ref())).collect()
            }
            Expr::Function { args, .. } => args.iter().collect(),
        }
    }

    /// This node with every child replaced by `f(child)` (the order of `children`).
    pub fn map_children(&self, f: &mut dyn FnMut(&Expr) -> Expr) -> Expr {
        let mut boxed = |e: &Expr| Box::new(f(e));
        match self {
            Expr::Column { .. } | Expr::Literal { .. } | Expr::Param { .. } => self.clone(),
            Expr::Binary { op, left, right, data_type } => {
                let left = boxed(left);
                Expr::Binary { op: *op, left, right: boxed(right), data_type: *data_type }
            }
            Expr::Not(e) => Expr::Not(boxed(e)),
            Expr::Negate(e) => Expr::Negate(boxed(e)),
            Expr::IsNull { expr, negated } => Expr::IsNull { expr: boxed(expr), negated: *negated },
            Expr::Cast { expr, to } => Expr::Cast { expr: boxed(expr), to: *to },
            Expr::Case { branches, otherwise, data_type } => {
                let branches = branches.iter().map(|(c, r)| (*boxed(c), *boxed(r))).collect();
                Expr::Case { branches, otherwise: boxed(otherwise), data_type: *data_type }
            }
            Expr::InList { expr, list, negated } => {
                Expr::InList { expr: boxed(expr), list: list.clone(), negated: *negated }
            }
            Expr::Like { expr, pattern, negated } => {
                Expr::Like { expr: boxed(expr), pattern: pattern.clone(), negated: *negated }
            }
            Expr::Extract { field, expr } => Expr::Extract { field: *field, expr: boxed(expr) },
            Expr::Substring { expr, start, length } => {
                Expr::Substring { expr: boxed(expr), start: *start, length: *length }
            }
            Expr::Subquery(subquery) => {
                let params = subquery.params.iter().map(|p| *boxed(p)).collect();
                let lhs = subquery.lhs.as_ref().map(|l| *boxed(l));
                Expr::Subquery(Box::new(subquery.with_children(params, lhs)))
            }
            Expr::Function { function, args, data_type } => Expr::Function {
                function: *function,
                args: args.iter().map(|a| *boxed(a)).collect(),
                data_type: *data_type,
            },
        }
    }

    /// Rewrites the tree top-down: where `f` returns a replacement the node is replaced (and
    /// not descended into), elsewhere the children are rewritten.
    pub fn transform(&self, f: &dyn Fn(&Expr) -> Option<Expr>) -> Expr {
        match f(self) {
            Some(replacement) => replacement,
            None => self.map_children(&mut |child| child.transform(f)),
        }
    }

    /// Applies `f` to every column index (re-mapping inputs after pushdown or joins).
    pub fn map_columns(&self, f: &dyn Fn(usize) -> usize) -> Expr {
        self.transform(&|e| match e {
            Expr::Column { index, data_type } => Some(Expr::Column { index: f(*index), data_type: *data_type }),
            _ => None,
        })
    }

    /// Whether a subquery occurs in the tree (outside nested subqueries' plans).
    pub fn contains_subquery(&self) -> bool {
        matches!(self, Expr::Subquery(_)) || self.children().iter().any(|c| c.contains_subquery())
    }

    /// Whether the expression reads a parameter (a value of the enclosing or LATERAL row).
    pub fn contains_param(&self) -> bool {
        matches!(self, Expr::Param { .. }) || self.children().iter().any(|c| c.contains_param())
    }

    /// Column indexes this expression reads, ascending and distinct.
    pub fn columns(&self) -> Vec<usize> {
        let mut out = Vec::new();
        self.collect_columns(&mut out);
        out.sort_unstable();
        out.dedup();
        out
    }

    fn collect_columns(&self, out: &mut Vec<usize>) {
        if let Expr::Column { index, .. } = self {
            out.push(*index);
        }
        for child in self.children() {
            child.collect_columns(out);
        }
    }

    /// Whether the value can be computed now (no columns, parameters or subqueries), so the
    /// binder folds it into a literal.
    pub fn is_constant(&self) -> bool {
        !matches!(self, Expr::Column { .. } | Expr::Param { .. } | Expr::Subquery(_))
            && self.children().iter().all(|c| c.is_constant())
    }
}

impl std::fmt::Display for Expr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Expr::Column { index, .. } => write!(f, "#{index}"),
            Expr::Literal { value: Value::Text(s), .. } => write!(f, "'{s}'"),
            Expr::Literal { value: Value::Null, .. } => write!(f, "NULL"),
            Expr::Literal { value, .. } => write!(f, "{value}"),
            Expr::Binary { op, left, right, .. } => write!(f, "({left} {} {right})", op.symbol()),
            Expr::Not(e) => write!(f, "NOT {e}"),
            Expr::Negate(e) => write!(f, "-{e}"),
            Expr::IsNull { expr, negated } => write!(f, "{expr} IS {}NULL", if *negated { "NOT " } else { "" }),
            Expr::Cast { expr, to } => write!(f, "CAST({expr} AS {})", to.sql_name()),
            Expr::Case { branches, otherwise, .. } => {
                write!(f, "CASE")?;
                for (condition, result) in branches {
                    write!(f, " WHEN {condition} THEN {result}")?;
                }
                write!(f, " ELSE {otherwise} END")
            }
            Expr::InList { expr, list, negated } => {
                let items: Vec<String> = list.iter().map(|v| format!("{v}")).collect();
                write!(f, "{expr} {}IN ({})", if *negated { "NOT " } else { "" }, items.join(", "))
            }
            Expr::Like { expr, pattern, negated } => {
                write!(f, "{expr} {}LIKE '{pattern}'", if *negated { "NOT " } else { "" })
            }
            Expr::Extract { field, expr } => write!(f, "EXTRACT({field:?} FROM {expr})"),
            Expr::Substring { expr, start, length } => write!(f, "SUBSTRING({expr}, {start}, {length:?})"),
            Expr::Param { index, .. } => write!(f, "${}", index + 1),
            Expr::Subquery(subquery) => {
                let params: Vec<String> = subquery.params.iter().map(ToString::to_string).collect();
                let lhs = subquery.lhs.as_ref().map_or(String::new(), |l| format!("{l} "));
                write!(f, "{lhs}{:?}(subquery({}))", subquery.kind, params.join(", "))
            }
            Expr::Function { function, args, .. } => {
                let args: Vec<String> = args.iter().map(ToString::to_string).collect();
                write!(f, "{}({})", function.name(), args.join(", "))
            }
        }
    }
}

/// Combines operands with AND or OR as a balanced tree (chains may have thousands of
/// operands; a balanced tree keeps every recursion over it shallow).
pub fn balanced(op: BinaryOp, mut operands: Vec<Expr>) -> Expr {
    assert!(!operands.is_empty(), "a logical chain has operands");
    while operands.len() > 1 {
        let mut next = Vec::with_capacity(operands.len().div_ceil(2));
        let mut iter = operands.into_iter();
        while let Some(a) = iter.next() {
            next.push(match iter.next() {
                Some(b) => Expr::binary(op, a, b, DataType::Bool),
                None => a,
            });
        }
        operands = next;
    }
    operands.pop().expect("one operand left")
}

/// AND of the operands (None for none).
pub fn conjunction(operands: Vec<Expr>) -> Option<Expr> {
    (!operands.is_empty()).then(|| balanced(BinaryOp::And, operands))
}

/// OR of the operands (None for none).
pub fn disjunction(operands: Vec<Expr>) -> Option<Expr> {
    (!operands.is_empty()).then(|| balanced(BinaryOp::Or, operands))
}

/// Evaluates an expression over a batch.
pub fn evaluate(expr: &Expr, batch: &Batch) -> Result<Vector> {
    match expr {
        Expr::Column { index, .. } => Ok(batch.columns[*index].clone()),
        Expr::Literal { value, data_type } => Ok(Vector::broadcast(value, *data_type, batch.rows)),
        Expr::Binary { op: BinaryOp::And, left, right, .. } => {
            logic(true, evaluate(left, batch)?, evaluate(right, batch)?)
        }
        Expr::Binary { op: BinaryOp::Or, left, right, .. } => {
            logic(false, evaluate(left, batch)?, evaluate(right, batch)?)
        }
        Expr::Binary { op, left, right, data_type } => {
            binary(*op, &evaluate(left, batch)?, &evaluate(right, batch)?, *data_type)
        }
        Expr::Not(inner) => {
            let mut vector = evaluate(inner, batch)?;
            if let Data::Bool(values) = &mut vector.data {
                values.iter_mut().for_each(|v| *v = !*v);
            }
            Ok(vector)
        }
        Expr::Negate(inner) => negate(evaluate(inner, batch)?),
        Expr::IsNull { expr, negated } => {
            let vector = evaluate(expr, batch)?;
            let values = (0..vector.len()).map(|row| vector.is_valid(row) == *negated).collect();
            Ok(Vector { data_type: DataType::Bool, data: Data::Bool(values), validity: None })
        }
        Expr::Cast { expr, to } => cast(evaluate(expr, batch)?, *to),
        Expr::Case { branches, otherwise, data_type } => case(branches, otherwise, *data_type, batch),
        Expr::InList { expr, list, negated } => in_list(&evaluate(expr, batch)?, list, *negated),
        Expr::Like { expr, pattern, negated } => {
            let matcher = LikePattern::new(pattern);
            text_predicate(&evaluate(expr, batch)?, |s| matcher.matches(s) != *negated)
        }
        Expr::Extract { field, expr } => extract(*field, evaluate(expr, batch)?),
        Expr::Substring { expr, start, length } => substring(&evaluate(expr, batch)?, *start, *length),
        Expr::Param { index, .. } => {
            Err(EngineError::Runtime(format!("parameter ${} of a subquery was not substituted", index + 1)))
        }
        Expr::Subquery(subquery) => crate::exec::subquery::evaluate(subquery, batch),
        Expr::Function { function, args, data_type } => {
            let args = args.iter().map(|a| evaluate(a, batch)).collect::<Result<Vec<_>>>()?;
            crate::functions::evaluate(*function, &args, batch.rows, *data_type)
        }
    }
}

/// Evaluates a constant expression to a scalar (constant folding).
pub fn evaluate_constant(expr: &Expr) -> Result<Value> {
    let batch = Batch::new(Vec::new(), 1);
    Ok(evaluate(expr, &batch)?.value(0))
}

fn and_validity(a: &Option<Vec<bool>>, b: &Option<Vec<bool>>) -> Option<Vec<bool>> {
    match (a, b) {
        (None, None) => None,
        (Some(v), None) | (None, Some(v)) => Some(v.clone()),
        (Some(x), Some(y)) => Some(x.iter().zip(y).map(|(a, b)| *a && *b).collect()),
    }
}

fn bools(vector: &Vector) -> &[bool] {
    match &vector.data {
        Data::Bool(values) => values,
        _ => panic!("the binder types logical operands as bool"),
    }
}

/// Three-valued AND (`is_and`) or OR.
fn logic(is_and: bool, left: Vector, right: Vector) -> Result<Vector> {
    let (a, b) = (bools(&left), bools(&right));
    if left.validity.is_none() && right.validity.is_none() {
        let values = a.iter().zip(b).map(|(x, y)| if is_and { *x & *y } else { *x | *y }).collect();
        return Ok(Vector { data_type: DataType::Bool, data: Data::Bool(values), validity: None });
    }
    let mut values = Vec::with_capacity(a.len());
    let mut validity = Vec::with_capacity(a.len());
    for row in 0..a.len() {
        let (x, y) = (left.is_valid(row).then_some(a[row]), right.is_valid(row).then_some(b[row]));
        let result = match (is_and, x, y) {
            (true, Some(false), _) | (true, _, Some(false)) => Some(false),
            (true, Some(true), Some(true)) => Some(true),
            (false, Some(true), _) | (false, _, Some(true)) => Some(true),
            (false, Some(false), Some(false)) => Some(false),
            _ => None,
        };
        values.push(result.unwrap_or(false));
        validity.push(result.is_some());
    }
    Ok(Vector { data_type: DataType::Bool, data: Data::Bool(values), validity: Some(validity) })
}

fn binary(op: BinaryOp, left: &Vector, right: &Vector, data_type: DataType) -> Result<Vector> {
    let validity = and_validity(&left.validity, &right.validity);
    let data = match (&left.data, &right.data) {
        (Data::I32(a), Data::I32(b)) if op.is_comparison() => Data::Bool(compare(op, a, b)),
        (Data::I64(a), Data::I64(b)) if op.is_comparison() => Data::Bool(compare(op, a, b)),
        (Data::F64(a), Data::F64(b)) if op.is_comparison() => Data::Bool(compare(op, a, b)),
        (Data::Bool(a), Data::Bool(b)) if op.is_comparison() => Data::Bool(compare(op, a, b)),
        (Data::Text(..), Data::Text(..)) if op.is_comparison() => Data::Bool(compare_text(op, left, right)),
        (Data::Numeric(a), Data::Numeric(b)) if op.is_comparison() => Data::Bool(compare(op, a, b)),
        (Data::Interval(a), Data::Interval(b)) if op.is_comparison() => {
            let spans = |v: &[Interval]| v.iter().map(|i| i.span_micros()).collect::<Vec<_>>();
            Data::Bool(compare(op, &spans(a), &spans(b)))
        }
        (Data::I64(a), Data::Interval(b)) => Data::I64(pairwise(a, b, &validity, |t, i| {
            datetime::add_interval(t, if op == BinaryOp::Sub { i.negated() } else { i })
        })?),
        (Data::I64(a), Data::I64(b)) if data_type == DataType::Interval => {
            Data::Interval(pairwise(a, b, &validity, datetime::difference)?)
        }
        (Data::Interval(a), Data::Interval(b)) => {
            Data::Interval(pairwise(a, b, &validity, |x, y| x.plus(if op == BinaryOp::Sub { y.negated() } else { y }))?)
        }
        (Data::Interval(a), Data::F64(b)) => {
            Data::Interval(pairwise(
                a,
                b,
                &validity,
                |i, f| {
                    if op == BinaryOp::Div {
                        i.divided(f)
                    } else {
                        i.scaled(f)
                    }
                },
            )?)
        }
        (Data::I32(a), Data::I32(b)) if data_type == DataType::Date => Data::I32(date_arithmetic(op, a, b, &validity)?),
        (Data::I32(a), Data::I32(b)) => Data::I32(narrow(arith_i32(op, a, b, &validity)?, data_type, &validity)?),
        (Data::I64(a), Data::I64(b)) => Data::I64(arith_i64(op, a, b, &validity)?),
        (Data::F64(a), Data::F64(b)) => Data::F64(narrow(arith_f64(op, a, b, &validity)?, data_type, &validity)?),
        (Data::Numeric(a), Data::Numeric(b)) => Data::Numeric(arith_numeric(op, a, b, &validity)?),
        _ => {
            return Err(EngineError::Type(format!(
                "operator {} on {:?} and {:?}",
                op.symbol(),
                left.data_type,
                right.data_type
            )))
        }
    };
    Ok(Vector { data_type, data, validity })
}

/// `f` over pairs of valid rows; a row NULL on either side gets `T::default()`.
fn pairwise<A: Copy, B: Copy, T: Default>(
    a: &[A],
    b: &[B],
    validity: &Option<Vec<bool>>,
    f: impl Fn(A, B) -> Result<T>,
) -> Result<Vec<T>> {
    let valid = |row: usize| validity.as_ref().is_none_or(|v| v[row]);
    a.iter().zip(b).enumerate().map(|(row, (&x, &y))| if valid(row) { f(x, y) } else { Ok(T::default()) }).collect()
}

fn compare<T: PartialOrd + Copy>(op: BinaryOp, a: &[T], b: &[T]) -> Vec<bool> {
    let zip = a.iter().zip(b);
    match op {
        BinaryOp::Eq => zip.map(|(x, y)| x == y).collect(),
        BinaryOp::NotEq => zip.map(|(x, y)| x != y).collect(),
        BinaryOp::Lt => zip.map(|(x, y)| x < y).collect(),
        BinaryOp::LtEq => zip.map(|(x, y)| x <= y).collect(),
        BinaryOp::Gt => zip.map(|(x, y)| x > y).collect(),
        BinaryOp::GtEq => zip.map(|(x, y)| x >= y).collect(),
        _ => unreachable!("compare is only called for comparison operators"),
    }
}

fn compare_text(op: BinaryOp, left: &Vector, right: &Vector) -> Vec<bool> {
    if let (Data::Text(a, da), Data::Text(b, db)) = (&left.data, &right.data) {
        if Arc::ptr_eq(da, db) && matches!(op, BinaryOp::Eq | BinaryOp::NotEq) {
            return compare(op, a, b);
        }
    }
    (0..left.len()).map(|row| op_holds(op, left.text(row).cmp(right.text(row)))).collect()
}

pub fn op_holds(op: BinaryOp, ordering: std::cmp::Ordering) -> bool {
    use std::cmp::Ordering::*;
    match op {
        BinaryOp::Eq => ordering == Equal,
        BinaryOp::NotEq => ordering != Equal,
        BinaryOp::Lt => ordering == Less,
        BinaryOp::LtEq => ordering != Greater,
        BinaryOp::Gt => ordering == Greater,
        BinaryOp::GtEq => ordering != Less,
        _ => false,
    }
}

/// Results of a narrower type computed in its wider physical type (smallint in i32, real in
/// f64), checked and rounded as PostgreSQL's own operators on that type would.
trait Narrow: Sized {
    fn narrow(self, data_type: DataType) -> Result<Self>;
}

impl Narrow for i32 {
    fn narrow(self, data_type: DataType) -> Result<i32> {
        if data_type == DataType::Int16 && i16::try_from(self).is_err() {
            return Err(overflow(data_type));
        }
        Ok(self)
    }
}

impl Narrow for f64 {
    fn narrow(self, data_type: DataType) -> Result<f64> {
        if data_type != DataType::Float32 {
            return Ok(self);
        }
        let single = self as f32;
        if single.is_infinite() && self.is_finite() {
            return Err(overflow(data_type));
        }
        if single == 0.0 && self != 0.0 {
            return Err(EngineError::Overflow("value out of range: underflow".into()));
        }
        Ok(f64::from(single))
    }
}

fn narrow<T: Narrow + Copy>(mut values: Vec<T>, data_type: DataType, validity: &Option<Vec<bool>>) -> Result<Vec<T>> {
    if matches!(data_type, DataType::Int16 | DataType::Float32) {
        for (row, value) in values.iter_mut().enumerate() {
            if is_valid_row(validity, row) {
                *value = value.narrow(data_type)?;
            }
        }
    }
    Ok(values)
}

/// The days PostgreSQL's `date` holds: from 4714-11-24 BC (Julian day 0) up to its end.
const DATE_DAYS: std::ops::Range<i64> = -2_440_588..2_145_042_906;

/// `date ± integer`: 22008 when the result leaves the date range, as PostgreSQL.
fn date_arithmetic(op: BinaryOp, a: &[i32], b: &[i32], validity: &Option<Vec<bool>>) -> Result<Vec<i32>> {
    let mut out = Vec::with_capacity(a.len());
    for (row, (&x, &y)) in a.iter().zip(b).enumerate() {
        let result = match op {
            BinaryOp::Add => i64::from(x) + i64::from(y),
            BinaryOp::Sub => i64::from(x) - i64::from(y),
            _ => unreachable!("the binder gives dates only + and -"),
        };
        if !is_valid_row(validity, row) {
            out.push(0);
        } else if DATE_DAYS.contains(&result) {
            out.push(result as i32);
        } else {
            return Err(EngineError::DatetimeOutOfRange("date out of range".into()));
        }
    }
    Ok(out)
}

/// PostgreSQL's message for an integer result out of range (`integer out of range`).
fn overflow(data_type: DataType) -> EngineError {
    EngineError::Overflow(match data_type {
        DataType::Int16 => "smallint out of range".into(),
        DataType::Int32 => "integer out of range".into(),
        DataType::Int64 => "bigint out of range".into(),
        DataType::Date => "date out of range".into(),
        _ => "value out of range: overflow".into(),
    })
}

fn is_valid_row(validity: &Option<Vec<bool>>, row: usize) -> bool {
    validity.as_ref().is_none_or(|v| v[row])
}

/// Checked integer arithmetic over valid rows (NULL rows compute nothing and never fail).
fn arith_checked<T: Copy + Default>(
    op: BinaryOp,
    a: &[T],
    b: &[T],
    validity: &Option<Vec<bool>>,
    data_type: DataType,
    checked: impl Fn(BinaryOp, T, T) -> Option<T>,
    is_zero: impl Fn(T) -> bool,
) -> Result<Vec<T>> {
    let mut out = Vec::with_capacity(a.len());
    for (row, (&x, &y)) in a.iter().zip(b).enumerate() {
        if !is_valid_row(validity, row) {
            out.push(T::default());
            continue;
        }
        if matches!(op, BinaryOp::Div | BinaryOp::Mod) && is_zero(y) {
            return Err(EngineError::DivisionByZero);
        }
        out.push(checked(op, x, y).ok_or_else(|| overflow(data_type))?);
    }
    Ok(out)
}

macro_rules! checked_op {
    ($t:ty) => {
        |op: BinaryOp, x: $t, y: $t| match op {
            BinaryOp::Add => x.checked_add(y),
            BinaryOp::Sub => x.checked_sub(y),
            BinaryOp::Mul => x.checked_mul(y),
            BinaryOp::Div => x.checked_div(y),
            // i64::MIN % -1 is 0 in SQL (PostgreSQL special-cases it), an overflow in Rust.
            BinaryOp::Mod => Some(x.checked_rem(y).unwrap_or(0)),
            _ => unreachable!("arithmetic operators only"),
        }
    };
}

fn arith_i64(op: BinaryOp, a: &[i64], b: &[i64], validity: &Option<Vec<bool>>) -> Result<Vec<i64>> {
    arith_checked(op, a, b, validity, DataType::Int64, checked_op!(i64), |y| y == 0)
}

fn arith_i32(op: BinaryOp, a: &[i32], b: &[i32], validity: &Option<Vec<bool>>) -> Result<Vec<i32>> {
    arith_checked(op, a, b, validity, DataType::Int32, checked_op!(i32), |y| y == 0)
}

/// float8 arithmetic: division by zero and results that leave the finite range are errors,
/// as in PostgreSQL (`1e308 * 10` is `22003`, not Infinity).
fn arith_f64(op: BinaryOp, a: &[f64], b: &[f64], validity: &Option<Vec<bool>>) -> Result<Vec<f64>> {
    let mut out = Vec::with_capacity(a.len());
    for (row, (&x, &y)) in a.iter().zip(b).enumerate() {
        let result = match op {
            BinaryOp::Add => x + y,
            BinaryOp::Sub => x - y,
            BinaryOp::Mul => x * y,
            BinaryOp::Div | BinaryOp::Mod if y == 0.0 && is_valid_row(validity, row) => {
                return Err(EngineError::DivisionByZero)
            }
            BinaryOp::Div => x / y,
            BinaryOp::Mod => x % y,
            _ => unreachable!("arithmetic operators only"),
        };
        if result.is_infinite() && x.is_finite() && y.is_finite() && is_valid_row(validity, row) {
            return Err(overflow(DataType::Float64));
        }
        out.push(result);
    }
    Ok(out)
}

fn arith_numeric(op: BinaryOp, a: &[Numeric], b: &[Numeric], validity: &Option<Vec<bool>>) -> Result<Vec<Numeric>> {
    let mut out = Vec::with_capacity(a.len());
    for (row, (&x, &y)) in a.iter().zip(b).enumerate() {
        if !is_valid_row(validity, row) {
            out.push(Numeric::ZERO);
            continue;
        }
        out.push(match op {
            BinaryOp::Add => x.checked_add(y)?,
            BinaryOp::Sub => x.checked_sub(y)?,
            BinaryOp::Mul => x.checked_mul(y)?,
            BinaryOp::Div => x.checked_div(y)?,
            BinaryOp::Mod => x.checked_rem(y)?,
            _ => unreachable!("arithmetic operators only"),
        });
    }
    Ok(out)
}

fn negate(mut vector: Vector) -> Result<Vector> {
    let data_type = vector.data_type;
    let validity = vector.validity.clone();
    let check = |row: usize, result: Option<()>| -> Result<()> {
        if result.is_none() && is_valid_row(&validity, row) {
            return Err(overflow(data_type));
        }
        Ok(())
    };
    match &mut vector.data {
        Data::I32(v) => {
            for (row, x) in v.iter_mut().enumerate() {
                let negated = x.checked_neg().filter(|n| data_type != DataType::Int16 || i16::try_from(*n).is_ok());
                check(row, negated.map(|n| *x = n))?;
            }
        }
        Data::I64(v) => {
            for (row, x) in v.iter_mut().enumerate() {
                check(row, x.checked_neg().map(|n| *x = n))?;
            }
        }
        Data::F64(v) => v.iter_mut().for_each(|x| *x = -*x),
        Data::Numeric(v) => v.iter_mut().for_each(|x| *x = x.negated()),
        Data::Interval(v) => v.iter_mut().for_each(|x| *x = x.negated()),
        _ => return Err(EngineError::Type(format!("cannot negate {}", data_type.sql_name()))),
    }
    Ok(vector)
}

pub use crate::cast::cast;

/// CASE as PostgreSQL runs it: each condition sees only the rows no earlier branch took, and
/// each result only the rows that take it (`1/0` in a branch no row reaches raises nothing).
fn case(branches: &[(Expr, Expr)], otherwise: &Expr, data_type: DataType, batch: &Batch) -> Result<Vector> {
    let mut pending: Vec<u32> = (0..batch.rows as u32).collect();
    let mut results = CaseResults::new(batch.rows);
    for (condition, value) in branches {
        if pending.is_empty() {
            break;
        }
        let reaching = rows_of(batch, &pending);
        let condition = evaluate(condition, &reaching)?;
        let holds = bools(&condition);
        let (mut taken, mut taken_here, mut rest) = (Vec::new(), Vec::new(), Vec::new());
        for (here, &row) in pending.iter().enumerate() {
            if holds[here] && condition.is_valid(here) {
                taken.push(row);
                taken_here.push(here as u32);
            } else {
                rest.push(row);
            }
        }
        if !taken.is_empty() {
            results.add(&taken, evaluate(value, &rows_of(&reaching, &taken_here))?);
        }
        pending = rest;
    }
    if !pending.is_empty() {
        results.add(&pending, evaluate(otherwise, &rows_of(batch, &pending))?);
    }
    let mut result = results.finish(data_type);
    result.data_type = data_type;
    Ok(result)
}

/// The rows `rows` of a batch (the batch itself when that is all of them).
fn rows_of<'a>(batch: &'a Batch, rows: &[u32]) -> std::borrow::Cow<'a, Batch> {
    if rows.len() == batch.rows {
        std::borrow::Cow::Borrowed(batch)
    } else {
        std::borrow::Cow::Owned(batch.gather(rows))
    }
}

/// CASE results computed per branch, then put back in row order.
struct CaseResults {
    values: Option<Vector>,
    /// Row → its position in `values`.
    positions: Vec<u32>,
}

impl CaseResults {
    fn new(rows: usize) -> CaseResults {
        CaseResults { values: None, positions: vec![0; rows] }
    }

    fn add(&mut self, rows: &[u32], values: Vector) {
        let start = self.values.as_ref().map_or(0, Vector::len);
        for (offset, &row) in rows.iter().enumerate() {
            self.positions[row as usize] = (start + offset) as u32;
        }
        match &mut self.values {
            None => self.values = Some(values),
            Some(all) => all.append(&values),
        }
    }

    fn finish(self, data_type: DataType) -> Vector {
        let Some(values) = self.values else { return Vector::empty(data_type) };
        // Every row took exactly one result; one branch taking all of them needs no gather.
        let in_order = self.positions.iter().enumerate().all(|(i, &p)| p as usize == i);
        if in_order {
            values
        } else {
            values.gather(&self.positions)
        }
    }
}

/// `x [NOT] IN (constants)` with SQL's three-valued logic: true when some item equals x;
/// otherwise NULL when x or some item is NULL; otherwise false. NOT IN negates that.
fn in_list(vector: &Vector, list: &[Value], negated: bool) -> Result<Vector> {
    let list_has_null = list.iter().any(Value::is_null);
    let items: Vec<&Value> = list.iter().filter(|v| !v.is_null()).collect();
    let found: Vec<bool> = if let Data::Text(..) = vector.data {
        let texts: Vec<&str> =
            items.iter().filter_map(|v| if let Value::Text(s) = v { Some(s.as_str()) } else { None }).collect();
        let found = text_predicate(vector, |s| texts.contains(&s))?;
        bools(&found).iter().enumerate().map(|(row, &f)| f && vector.is_valid(row)).collect()
    } else {
        (0..vector.len())
            .map(|row| vector.is_valid(row) && items.iter().any(|item| values_equal(&vector.value(row), item)))
            .collect()
    };
    let validity: Option<Vec<bool>> = (list_has_null || vector.validity.is_some())
        .then(|| (0..vector.len()).map(|row| found[row] || (vector.is_valid(row) && !list_has_null)).collect());
    let values = found.into_iter().map(|f| f != negated).collect();
    Ok(Vector { data_type: DataType::Bool, data: Data::Bool(values), validity })
}

/// Equality of two non-null scalars of compatible numeric types.
pub fn values_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Text(x), Value::Text(y)) => x == y,
        (Value::Bool(x), Value::Bool(y)) => x == y,
        (Value::Date(x), Value::Date(y)) => x == y,
        (Value::Decimal { value: x, scale: sx }, Value::Decimal { value: y, scale: sy }) => {
            i128::from(*x) * i128::from(pow10(*sy)) == i128::from(*y) * i128::from(pow10(*sx))
        }
        (Value::Numeric(x), Value::Numeric(y)) => x.cmp(y).is_eq(),
        (Value::Timestamp(_), Value::Timestamp(_))
        | (Value::TimestampTz(_), Value::TimestampTz(_))
        | (Value::Interval(_), Value::Interval(_)) => compare_values(a, b).is_eq(),
        _ => match (a.as_f64(), b.as_f64()) {
            (Some(x), Some(y)) => x == y,
            _ => false,
        },
    }
}

/// Evaluates a string predicate once per dictionary entry when that is cheaper than per row.
fn text_predicate(vector: &Vector, predicate: impl Fn(&str) -> bool) -> Result<Vector> {
    let Data::Text(codes, dictionary) = &vector.data else {
        return Err(EngineError::Type(format!("string predicate on {}", vector.data_type.sql_name())));
    };
    let values = if dictionary.len() <= codes.len() {
        let per_code: Vec<bool> = dictionary.values().iter().map(&predicate).collect();
        codes.iter().map(|&c| per_code[c as usize]).collect()
    } else {
        codes.iter().map(|&c| predicate(dictionary.get(c))).collect()
    };
    Ok(Vector { data_type: DataType::Bool, data: Data::Bool(values), validity: vector.validity.clone() })
}

fn extract(field: DatePart, vector: Vector) -> Result<Vector> {
    let of_date = vector.data_type == DataType::Date;
    let data_type = DataType::Decimal { precision: 18, scale: field.scale(of_date) };
    let valid = |row: usize| vector.is_valid(row);
    let values = match &vector.data {
        Data::I32(days) => extract_days(field, days, valid)?,
        Data::I64(micros) => convert_valid(micros, valid, |m| datetime::extract(field, m, false))?,
        Data::Interval(intervals) => convert_valid(intervals, valid, |i| datetime::extract_interval(field, i))?,
        _ => return Err(EngineError::Type("EXTRACT needs a date, timestamp or interval".into())),
    };
    Ok(Vector { data_type, data: Data::I64(values), validity: vector.validity })
}

/// EXTRACT from dates; year, month and day without going through a timestamp (TPC-H's
/// `extract(year from o_orderdate)` runs over every order).
fn extract_days(field: DatePart, days: &[i32], valid: impl Fn(usize) -> bool) -> Result<Vec<i64>> {
    let civil = |d: i32, pick: fn((i32, u32, u32)) -> i64| Ok(pick(civil_from_days(d)));
    match field {
        DatePart::Year => convert_valid(days, valid, |d| civil(d, |(y, _, _)| i64::from(y))),
        DatePart::Month => convert_valid(days, valid, |d| civil(d, |(_, m, _)| i64::from(m))),
        DatePart::Day => convert_valid(days, valid, |d| civil(d, |(_, _, day)| i64::from(day))),
        _ => convert_valid(days, valid, |d| datetime::extract(field, datetime::timestamp_of_date(d), true)),
    }
}

/// `f` over the valid rows; NULL rows get 0 and are never passed to `f`.
fn convert_valid<T: Copy, U: Copy + Default>(
    values: &[T],
    valid: impl Fn(usize) -> bool,
    f: impl Fn(T) -> Result<U>,
) -> Result<Vec<U>> {
    values.iter().enumerate().map(|(row, &x)| if valid(row) { f(x) } else { Ok(U::default()) }).collect()
}

/// SQL `SUBSTRING(s FROM start FOR length)`, 1-based, in characters.
pub fn substring_of(s: &str, start: i64, length: Option<i64>) -> String {
    let end = length.map(|l| start.saturating_add(l));
    let first = start.max(1);
    s.chars()
        .enumerate()
        .map(|(i, c)| (i as i64 + 1, c))
        .filter(|(position, _)| *position >= first && end.is_none_or(|e| *position < e))
        .map(|(_, c)| c)
        .collect()
}

fn substring(vector: &Vector, start: i64, length: Option<i64>) -> Result<Vector> {
    let Data::Text(codes, dictionary) = &vector.data else {
        return Err(EngineError::Type("SUBSTRING needs text".into()));
    };
    let mut out = Dictionary::new();
    let mapped: Vec<u32> = if dictionary.len() <= codes.len() {
        let per_code: Vec<u32> =
            dictionary.values().iter().map(|s| out.intern(&substring_of(s, start, length))).collect();
        codes.iter().map(|&c| per_code[c as usize]).collect()
    } else {
        codes.iter().map(|&c| out.intern(&substring_of(dictionary.get(c), start, length))).collect()
    };
    Ok(Vector { data_type: DataType::Text, data: Data::Text(mapped, Arc::new(out)), validity: vector.validity.clone() })
}

/// A compiled LIKE pattern (`%` any run, `_` one character, `\` escapes).
#[derive(Debug, Clone)]
pub struct LikePattern {
    tokens: Vec<LikeToken>,
    /// Patterns without `_`: the literal runs between `%`s, matched by substring search on
    /// the bytes (no per-value copy into characters; TPC-H Q13 tests 1.5M comments).
    runs: Option<LiteralRuns>,
}

/// `%`-separated literal runs, and whether the pattern starts / ends with a literal.
#[derive(Debug, Clone)]
struct LiteralRuns {
    runs: Vec<String>,
    /// A substring searcher per run, built once per pattern (`str::find` builds one per value).
    finders: Vec<memchr::memmem::Finder<'static>>,
    anchored_start: bool,
    anchored_end: bool,
}

impl LiteralRuns {
    fn of(tokens: &[LikeToken]) -> Option<LiteralRuns> {
        let mut runs = vec![String::new()];
        for token in tokens {
            match token {
                LikeToken::Literal(c) => runs.last_mut().expect("one run at least").push(*c),
                LikeToken::Any => runs.push(String::new()),
                LikeToken::One => return None,
            }
        }
        // An empty pattern is anchored at both ends (it matches only the empty string).
        let anchored_start = tokens.first() != Some(&LikeToken::Any);
        let anchored_end = tokens.last() != Some(&LikeToken::Any);
        runs.retain(|run| !run.is_empty());
        let finders = runs.iter().map(|run| memchr::memmem::Finder::new(run.as_bytes()).into_owned()).collect();
        Some(LiteralRuns { runs, finders, anchored_start, anchored_end })
    }

    fn matches(&self, text: &str) -> bool {
        let mut runs = self.runs.as_slice();
        let mut finders = self.finders.as_slice();
        let (mut start, mut end) = (0, text.len());
        if self.anchored_start {
            let Some((first, rest)) = runs.split_first() else { return text.is_empty() };
            if !text.starts_with(first.as_str()) {
                return false;
            }
            start = first.len();
            runs = rest;
            finders = &finders[1..];
            if runs.is_empty() {
                // The whole pattern is one literal (`abc`) or a prefix (`abc%`).
                return !self.anchored_end || text.len() == start;
            }
        }
        if self.anchored_end {
            let Some((last, rest)) = runs.split_last() else { return true };
            if end - start < last.len() || !text.ends_with(last.as_str()) {
                return false;
            }
            end -= last.len();
            runs = rest;
            finders = &finders[..finders.len() - 1];
        }
        for (run, finder) in runs.iter().zip(finders) {
            match finder.find(&text.as_bytes()[start..end]) {
                Some(at) => start += at + run.len(),
                None => return false,
            }
        }
        true
    }
}

#[derive(Debug, Clone, PartialEq)]
enum LikeToken {
    Literal(char),
    One,
    Any,
}

impl LikePattern {
    pub fn new(pattern: &str) -> LikePattern {
        let mut tokens = Vec::new();
        let mut chars = pattern.chars();
        while let Some(c) = chars.next() {
            tokens.push(match c {
                '%' => LikeToken::Any,
                '_' => LikeToken::One,
                '\\' => LikeToken::Literal(chars.next().unwrap_or('\\')),
                other => LikeToken::Literal(other),
            });
        }
        let runs = LiteralRuns::of(&tokens);
        LikePattern { tokens, runs }
    }

    /// Substring search for patterns without `_`; otherwise an iterative matcher with
    /// backtracking to the last `%` (linear for typical patterns).
    pub fn matches(&self, text: &str) -> bool {
        if let Some(runs) = &self.runs {
            return runs.matches(text);
        }
        let text: Vec<char> = text.chars().collect();
        let (mut t, mut p) = (0usize, 0usize);
        let mut star: Option<(usize, usize)> = None;
        while t < text.len() {
            match self.tokens.get(p) {
                Some(LikeToken::Any) => {
                    star = Some((p, t));
                    p += 1;
                }
                Some(LikeToken::One) => {
                    t += 1;
                    p += 1;
                }
                Some(LikeToken::Literal(c)) if *c == text[t] => {
                    t += 1;
                    p += 1;
                }
                _ => match star {
                    Some((star_p, star_t)) => {
                        p = star_p + 1;
                        t = star_t + 1;
                        star = Some((star_p, star_t + 1));
                    }
                    None => return false,
                },
            }
        }
        self.tokens[p..].iter().all(|token| *token == LikeToken::Any)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: LIKE matches PostgreSQL semantics for %, _ and literals; method: fixed cases.
    #[test]
    fn like_patterns() {
        assert!(LikePattern::new("PROMO%").matches("PROMO BRUSHED TIN"));
        assert!(!LikePattern::new("PROMO%").matches("STANDARD PROMO"));
        assert!(LikePattern::new("%green%").matches("dark green olive"));
        assert!(LikePattern::new("a_c").matches("abc"));
        assert!(!LikePattern::new("a_c").matches("abbc"));
        assert!(LikePattern::new("%").matches(""));
        assert!(LikePattern::new("%Customer%Complaints%").matches("xx Customer yy Complaints"));
        assert!(!LikePattern::new("%Customer%Complaints%").matches("xx Complaints yy Customer"));
        assert!(LikePattern::new("").matches(""));
        assert!(!LikePattern::new("").matches("a"));
        assert!(LikePattern::new("abc").matches("abc"));
        assert!(!LikePattern::new("abc").matches("abcd"));
        assert!(LikePattern::new("a%b").matches("ab"));
        assert!(!LikePattern::new("a%b").matches("a"));
        assert!(!LikePattern::new("ab%bc").matches("abc"));
        assert!(LikePattern::new("%a%b").matches("xaxb"));
        assert!(!LikePattern::new("%a%b").matches("xbxa"));
        assert!(LikePattern::new("%%").matches(""));
        assert!(LikePattern::new("%é%").matches("café au lait"));
    }

    // Goal: SUBSTRING is 1-based and clamps like PostgreSQL; method: fixed cases.
    #[test]
    fn substring_semantics() {
        assert_eq!(substring_of("13-555", 1, Some(2)), "13");
        assert_eq!(substring_of("hello", 0, Some(2)), "h");
        assert_eq!(substring_of("hello", 4, None), "lo");
    }
}
