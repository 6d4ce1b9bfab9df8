//! Expression binding: sqlparser AST expressions → typed [`Expr`]s over a scope's columns.
//!
//! A scope is the concatenation of the columns of the relations in FROM (the "wide row"); a
//! column reference becomes its index in that row. Type coercion happens here: the binder
//! inserts casts so kernels see operands of one physical type.

use sqlparser::ast;

use crate::error::{EngineError, Result};
use crate::expr::{evaluate_constant, BinaryOp, DateField, Expr};
use crate::plan::{AggregateCall, AggregateFunction};
use crate::types::{add_months, parse_date, parse_decimal, DataType, Value, DECIMAL_PRECISION_MAX};

/// Prefix of the string literal that stands for parameter `$n` while a statement is described
/// (Describe comes before Bind, so values are unknown); casts record the type each one needs.
pub const PARAMETER_SENTINEL: &str = "\u{1}bypass-parameter-";

thread_local! {
    static PARAMETER_TYPES: std::cell::RefCell<Option<std::collections::BTreeMap<usize, DataType>>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `f` (a bind) and returns the types the sentinel parameters were cast to.
pub fn infer_parameter_types<R>(f: impl FnOnce() -> R) -> (R, std::collections::BTreeMap<usize, DataType>) {
    PARAMETER_TYPES.with(|types| *types.borrow_mut() = Some(Default::default()));
    let result = f();
    let types = PARAMETER_TYPES.with(|types| types.borrow_mut().take()).unwrap_or_default();
    (result, types)
}

fn record_parameter(text: &str, to: DataType) -> bool {
    let Some(number) = text.strip_prefix(PARAMETER_SENTINEL).and_then(|n| n.parse::<usize>().ok()) else {
        return false;
    };
    PARAMETER_TYPES.with(|types| {
        if let Some(map) = types.borrow_mut().as_mut() {
            map.insert(number, to);
        }
    });
    true
}

/// A relation visible in a scope.
#[derive(Debug, Clone)]
pub struct ScopeRelation {
    pub alias: String,
    pub columns: Vec<(String, DataType)>,
    pub offset: usize,
}

/// The columns a query block can reference.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    pub relations: Vec<ScopeRelation>,
    /// Relations from this index on belong to the enclosing query (correlated subqueries);
    /// names resolve in the inner relations first.
    pub outer_start: Option<usize>,
}

impl Scope {
    pub fn width(&self) -> usize {
        self.relations.last().map_or(0, |r| r.offset + r.columns.len())
    }

    pub fn add(&mut self, alias: &str, columns: Vec<(String, DataType)>) -> usize {
        let offset = self.width();
        self.relations.push(ScopeRelation { alias: alias.to_string(), columns, offset });
        self.relations.len() - 1
    }

    /// Index of the relation that owns wide column `column`.
    pub fn relation_of(&self, column: usize) -> usize {
        self.relations.iter().rposition(|r| r.offset <= column).expect("column inside the scope")
    }

    fn resolve(&self, qualifier: Option<&str>, name: &str) -> Result<(usize, DataType)> {
        let split = self.outer_start.unwrap_or(self.relations.len());
        match self.resolve_in(&self.relations[..split], qualifier, name)? {
            Some(found) => Ok(found),
            None => self.resolve_in(&self.relations[split..], qualifier, name)?.ok_or_else(|| {
                let full = qualifier.map_or(name.to_string(), |q| format!("{q}.{name}"));
                EngineError::UnknownColumn(format!("\"{full}\" does not exist"))
            }),
        }
    }

    fn resolve_in(
        &self,
        relations: &[ScopeRelation],
        qualifier: Option<&str>,
        name: &str,
    ) -> Result<Option<(usize, DataType)>> {
        let mut found = None;
        for relation in relations {
            if qualifier.is_some_and(|q| q != relation.alias) {
                continue;
            }
            if let Some(position) = relation.columns.iter().position(|(c, _)| c == name) {
                if found.is_some() {
                    return Err(EngineError::UnknownColumn(format!("reference \"{name}\" is ambiguous")));
                }
                found = Some((relation.offset + position, relation.columns[position].1));
            }
        }
        Ok(found)
    }
}

/// Aggregate context: expressions are bound over the aggregate's output (groups ++ aggregates).
pub struct AggregateContext<'g> {
    pub groups: &'g [Expr],
    pub aggregates: Vec<AggregateCall>,
}

/// Binds expressions against one scope.
pub struct ExprBinder<'s> {
    pub scope: &'s Scope,
}

pub fn identifier(ident: &ast::Ident) -> String {
    if ident.quote_style.is_some() {
        ident.value.clone()
    } else {
        ident.value.to_lowercase()
    }
}

pub fn object_name(name: &ast::ObjectName) -> Result<String> {
    let parts: Vec<String> = name.0.iter().filter_map(|p| p.as_ident().map(identifier)).collect();
    parts.last().cloned().ok_or_else(|| EngineError::unsupported(format!("object name {name}")))
}

impl<'s> ExprBinder<'s> {
    /// Binds a scalar expression (no aggregates allowed).
    pub fn bind(&self, expr: &ast::Expr) -> Result<Expr> {
        self.bind_in(expr, &mut None)
    }

    /// Binds an expression that may contain aggregates, over the aggregate output.
    pub fn bind_aggregated(&self, expr: &ast::Expr, context: &mut AggregateContext<'_>) -> Result<Expr> {
        self.bind_in(expr, &mut Some(context))
    }

    fn bind_in(&self, expr: &ast::Expr, context: &mut Option<&mut AggregateContext<'_>>) -> Result<Expr> {
        if let Some(aggregate) = context.as_deref_mut() {
            if !contains_aggregate(expr) {
                let bound = self.bind_in(expr, &mut None)?;
                if let Some(position) = aggregate.groups.iter().position(|g| *g == bound) {
                    return Ok(Expr::Column { index: position, data_type: bound.data_type() });
                }
                if bound.columns().is_empty() {
                    return Ok(bound);
                }
                if let ast::Expr::Identifier(_) | ast::Expr::CompoundIdentifier(_) = expr {
                    return Err(EngineError::UnknownColumn(format!(
                        "\"{expr}\" must appear in the GROUP BY clause or be used in an aggregate function"
                    )));
                }
            } else if let ast::Expr::Function(function) = expr {
                if let Some(call) = self.aggregate_call(function)? {
                    let index = match aggregate.aggregates.iter().position(|a| *a == call) {
                        Some(index) => index,
                        None => {
                            aggregate.aggregates.push(call.clone());
                            aggregate.aggregates.len() - 1
                        }
                    };
                    return Ok(Expr::Column { index: aggregate.groups.len() + index, data_type: call.data_type });
                }
            }
        }
        self.bind_node(expr, context)
    }

    fn bind_node(&self, expr: &ast::Expr, context: &mut Option<&mut AggregateContext<'_>>) -> Result<Expr> {
        use ast::Expr as E;
        match expr {
            E::Identifier(ident) => self.column(None, ident),
            E::CompoundIdentifier(parts) => {
                let qualifier = parts.len().checked_sub(2).map(|i| identifier(&parts[i]));
                let last = parts.last().ok_or_else(|| EngineError::Syntax("empty identifier".into()))?;
                self.column(qualifier.as_deref(), last)
            }
            E::Nested(inner) => self.bind_in(inner, context),
            E::Value(value) => literal(&value.value),
            E::TypedString(typed) => typed_string(&typed.data_type, &typed.value.value),
            E::BinaryOp { left, op, right } => self.binary(left, op, right, context),
            E::UnaryOp { op, expr } => self.unary(op, expr, context),
            E::Between { expr, negated, low, high } => {
                let value = self.bind_in(expr, context)?;
                let low = self.bind_in(low, context)?;
                let high = self.bind_in(high, context)?;
                let lower = comparison(BinaryOp::GtEq, value.clone(), low)?;
                let upper = comparison(BinaryOp::LtEq, value, high)?;
                let both = Expr::binary(BinaryOp::And, lower, upper, DataType::Bool);
                Ok(if *negated { Expr::Not(Box::new(both)) } else { both })
            }
            E::InList { expr, list, negated } => self.in_list(expr, list, *negated, context),
            E::IsNull(inner) => Ok(Expr::IsNull { expr: Box::new(self.bind_in(inner, context)?), negated: false }),
            E::IsNotNull(inner) => Ok(Expr::IsNull { expr: Box::new(self.bind_in(inner, context)?), negated: true }),
            E::Like { negated, expr, pattern, escape_char: None, any: false } => {
                let value = self.bind_in(expr, context)?;
                expect_type(&value, DataType::Text, "LIKE")?;
                let ast::Expr::Value(ast::ValueWithSpan { value: ast::Value::SingleQuotedString(pattern), .. }) =
                    pattern.as_ref()
                else {
                    return Err(EngineError::unsupported("LIKE with a non-constant pattern"));
                };
                Ok(Expr::Like { expr: Box::new(value), pattern: pattern.clone(), negated: *negated })
            }
            E::Case { operand, conditions, else_result, .. } => self.case(operand, conditions, else_result, context),
            E::Cast { expr, data_type, .. } => {
                let to = sql_type(data_type)?;
                let value = self.bind_in(expr, context)?;
                cast_expr(value, to)
            }
            E::Extract { field, expr, .. } => {
                let field = match field {
                    ast::DateTimeField::Year | ast::DateTimeField::Years => DateField::Year,
                    ast::DateTimeField::Month | ast::DateTimeField::Months => DateField::Month,
                    ast::DateTimeField::Day | ast::DateTimeField::Days => DateField::Day,
                    other => return Err(EngineError::unsupported(format!("EXTRACT({other})"))),
                };
                let value = self.bind_in(expr, context)?;
                expect_type(&value, DataType::Date, "EXTRACT")?;
                Ok(Expr::Extract { field, expr: Box::new(value) })
            }
            E::Substring { expr, substring_from, substring_for, .. } => {
                let value = self.bind_in(expr, context)?;
                expect_type(&value, DataType::Text, "SUBSTRING")?;
                let start = substring_from.as_deref().map(|e| self.constant_integer(e)).transpose()?.unwrap_or(1);
                let length = substring_for.as_deref().map(|e| self.constant_integer(e)).transpose()?;
                Ok(Expr::Substring { expr: Box::new(value), start, length })
            }
            E::Function(function) => self.function(function, context),
            E::Interval(_) => Err(EngineError::unsupported("an interval outside date arithmetic")),
            E::Exists { .. } | E::InSubquery { .. } | E::Subquery(_) => {
                Err(EngineError::unsupported(format!("subquery in this position: {expr}")))
            }
            other => Err(EngineError::unsupported(format!("expression {other}"))),
        }
    }

    fn column(&self, qualifier: Option<&str>, ident: &ast::Ident) -> Result<Expr> {
        let (index, data_type) = self.scope.resolve(qualifier, &identifier(ident))?;
        Ok(Expr::Column { index, data_type })
    }

    fn constant_integer(&self, expr: &ast::Expr) -> Result<i64> {
        match evaluate_constant(&self.bind(expr)?)? {
            Value::Int32(v) => Ok(i64::from(v)),
            Value::Int64(v) => Ok(v),
            other => Err(EngineError::Type(format!("expected an integer constant, got {other:?}"))),
        }
    }

    fn binary(
        &self,
        left: &ast::Expr,
        op: &ast::BinaryOperator,
        right: &ast::Expr,
        context: &mut Option<&mut AggregateContext<'_>>,
    ) -> Result<Expr> {
        use ast::BinaryOperator as B;
        if let (B::Plus | B::Minus, ast::Expr::Interval(interval)) = (op, right) {
            let date = self.bind_in(left, context)?;
            let (months, days) = interval_value(interval)?;
            let sign = if matches!(op, B::Minus) { -1 } else { 1 };
            return date_plus_interval(date, sign * months, sign * days);
        }
        let l = self.bind_in(left, context)?;
        let r = self.bind_in(right, context)?;
        let op = match op {
            B::Plus => BinaryOp::Add,
            B::Minus => BinaryOp::Sub,
            B::Multiply => BinaryOp::Mul,
            B::Divide => BinaryOp::Div,
            B::Modulo => BinaryOp::Mod,
            B::Eq => BinaryOp::Eq,
            B::NotEq => BinaryOp::NotEq,
            B::Lt => BinaryOp::Lt,
            B::LtEq => BinaryOp::LtEq,
            B::Gt => BinaryOp::Gt,
            B::GtEq => BinaryOp::GtEq,
            B::And | B::Or => {
                expect_type(&l, DataType::Bool, "AND/OR")?;
                expect_type(&r, DataType::Bool, "AND/OR")?;
                let op = if matches!(op, B::And) { BinaryOp::And } else { BinaryOp::Or };
                return Ok(Expr::binary(op, l, r, DataType::Bool));
            }
            B::StringConcat => return Err(EngineError::unsupported("operator ||")),
            other => return Err(EngineError::unsupported(format!("operator {other}"))),
        };
        if op.is_comparison() {
            comparison(op, l, r)
        } else {
            arithmetic(op, l, r)
        }
    }

    fn unary(
        &self,
        op: &ast::UnaryOperator,
        expr: &ast::Expr,
        context: &mut Option<&mut AggregateContext<'_>>,
    ) -> Result<Expr> {
        let value = self.bind_in(expr, context)?;
        match op {
            ast::UnaryOperator::Not => {
                expect_type(&value, DataType::Bool, "NOT")?;
                Ok(Expr::Not(Box::new(value)))
            }
            ast::UnaryOperator::Minus if value.data_type().is_numeric() => fold(Expr::Negate(Box::new(value))),
            ast::UnaryOperator::Plus if value.data_type().is_numeric() => Ok(value),
            other => Err(EngineError::unsupported(format!("unary operator {other}"))),
        }
    }

    fn in_list(
        &self,
        expr: &ast::Expr,
        list: &[ast::Expr],
        negated: bool,
        context: &mut Option<&mut AggregateContext<'_>>,
    ) -> Result<Expr> {
        let value = self.bind_in(expr, context)?;
        let mut items = Vec::with_capacity(list.len());
        for item in list {
            let bound = self.bind_in(item, context)?;
            let (coerced, _) = coerce_to(&value, bound)?;
            if !coerced.is_constant() {
                return Err(EngineError::unsupported("IN list with non-constant items"));
            }
            items.push(evaluate_constant(&coerced)?);
        }
        Ok(Expr::InList { expr: Box::new(value), list: items, negated })
    }

    fn case(
        &self,
        operand: &Option<Box<ast::Expr>>,
        conditions: &[ast::CaseWhen],
        else_result: &Option<Box<ast::Expr>>,
        context: &mut Option<&mut AggregateContext<'_>>,
    ) -> Result<Expr> {
        let operand = operand.as_deref().map(|o| self.bind_in(o, context)).transpose()?;
        let mut branches = Vec::new();
        for when in conditions {
            let condition = self.bind_in(&when.condition, context)?;
            let condition = match &operand {
                Some(value) => comparison(BinaryOp::Eq, value.clone(), condition)?,
                None => condition,
            };
            expect_type(&condition, DataType::Bool, "CASE WHEN")?;
            branches.push((condition, self.bind_in(&when.result, context)?));
        }
        let otherwise = match else_result {
            Some(e) => self.bind_in(e, context)?,
            None => Expr::literal(Value::Null, branches.first().map_or(DataType::Int32, |b| b.1.data_type())),
        };
        let mut result_type = otherwise.data_type();
        for (_, result) in &branches {
            result_type = common_type(result_type, result.data_type(), BinaryOp::Add)?;
        }
        let branches =
            branches.into_iter().map(|(c, r)| Ok((c, cast_expr(r, result_type)?))).collect::<Result<Vec<_>>>()?;
        let otherwise = Box::new(cast_expr(otherwise, result_type)?);
        Ok(Expr::Case { branches, otherwise, data_type: result_type })
    }

    fn function(&self, function: &ast::Function, context: &mut Option<&mut AggregateContext<'_>>) -> Result<Expr> {
        let name = object_name(&function.name)?;
        if aggregate_function(&name).is_some() {
            return Err(EngineError::UnknownColumn(format!(
                "aggregate function {name} is not allowed here (WHERE, GROUP BY or nested)"
            )));
        }
        let args = function_args(function)?;
        match (name.as_str(), args.as_slice()) {
            ("substr" | "substring", [value, start, rest @ ..]) if rest.len() <= 1 => {
                let value = self.bind_in(value, context)?;
                expect_type(&value, DataType::Text, "SUBSTRING")?;
                let start = self.constant_integer(start)?;
                let length = rest.first().map(|l| self.constant_integer(l)).transpose()?;
                Ok(Expr::Substring { expr: Box::new(value), start, length })
            }
            ("abs", [value]) => {
                let value = self.bind_in(value, context)?;
                let zero = cast_expr(Expr::literal(Value::Int32(0), DataType::Int32), value.data_type())?;
                let negative = comparison(BinaryOp::Lt, value.clone(), zero)?;
                let data_type = value.data_type();
                let branches = vec![(negative, Expr::Negate(Box::new(value.clone())))];
                Ok(Expr::Case { branches, otherwise: Box::new(value), data_type })
            }
            _ => Err(EngineError::unsupported(format!("function {name}"))),
        }
    }

    /// `Some(call)` when `function` is an aggregate; binds its argument over the input scope.
    pub fn aggregate_call(&self, function: &ast::Function) -> Result<Option<AggregateCall>> {
        let name = object_name(&function.name)?;
        let Some(kind) = aggregate_function(&name) else {
            return Ok(None);
        };
        if let ast::FunctionArguments::List(list) = &function.args {
            if list.duplicate_treatment == Some(ast::DuplicateTreatment::Distinct) {
                return Err(EngineError::unsupported(format!("{name}(DISTINCT ...)")));
            }
        }
        if function.filter.is_some() || function.over.is_some() {
            return Err(EngineError::unsupported("aggregate FILTER or window functions (OVER)"));
        }
        let star = matches!(&function.args, ast::FunctionArguments::List(list)
            if matches!(list.args.as_slice(), [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Wildcard)]));
        if star {
            return match kind {
                AggregateFunction::Count => Ok(Some(AggregateCall {
                    function: AggregateFunction::CountStar,
                    argument: None,
                    data_type: DataType::Int64,
                })),
                _ => Err(EngineError::Syntax(format!("{name}(*) is only valid for count"))),
            };
        }
        let args = function_args(function)?;
        let [argument] = args.as_slice() else {
            return Err(EngineError::unsupported(format!("{name} with {} arguments", args.len())));
        };
        let argument = self.bind(argument)?;
        let data_type = aggregate_type(kind, argument.data_type())?;
        Ok(Some(AggregateCall { function: kind, argument: Some(argument), data_type }))
    }
}

fn aggregate_function(name: &str) -> Option<AggregateFunction> {
    Some(match name {
        "sum" => AggregateFunction::Sum,
        "avg" => AggregateFunction::Avg,
        "count" => AggregateFunction::Count,
        "min" => AggregateFunction::Min,
        "max" => AggregateFunction::Max,
        _ => return None,
    })
}

/// Result types: sum of integers is bigint, of decimals the same decimal; avg is double
/// (PostgreSQL returns numeric: compared with a tolerance in tests).
fn aggregate_type(function: AggregateFunction, input: DataType) -> Result<DataType> {
    Ok(match (function, input) {
        (AggregateFunction::Count | AggregateFunction::CountStar, _) => DataType::Int64,
        (AggregateFunction::Min | AggregateFunction::Max, t) => t,
        (AggregateFunction::Sum, DataType::Int32 | DataType::Int64) => DataType::Int64,
        (AggregateFunction::Sum, DataType::Decimal { scale, .. }) => {
            DataType::Decimal { precision: DECIMAL_PRECISION_MAX, scale }
        }
        (AggregateFunction::Sum | AggregateFunction::Avg, DataType::Float64) => DataType::Float64,
        (AggregateFunction::Avg, t) if t.is_numeric() => DataType::Float64,
        (f, t) => return Err(EngineError::Type(format!("{f:?} of {}", t.sql_name()))),
    })
}

fn function_args(function: &ast::Function) -> Result<Vec<&ast::Expr>> {
    match &function.args {
        ast::FunctionArguments::None => Ok(Vec::new()),
        ast::FunctionArguments::List(list) => list
            .args
            .iter()
            .map(|arg| match arg {
                ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e)) => Ok(e),
                other => Err(EngineError::unsupported(format!("function argument {other}"))),
            })
            .collect(),
        ast::FunctionArguments::Subquery(_) => Err(EngineError::unsupported("subquery as a function argument")),
    }
}

/// Whether an AST expression contains an aggregate call (outside subqueries).
pub fn contains_aggregate(expr: &ast::Expr) -> bool {
    use ast::Expr as E;
    match expr {
        E::Function(f) => {
            let name = object_name(&f.name).unwrap_or_default();
            aggregate_function(&name).is_some()
                || function_args(f).map(|args| args.iter().any(|a| contains_aggregate(a))).unwrap_or(false)
        }
        E::BinaryOp { left, right, .. } => contains_aggregate(left) || contains_aggregate(right),
        E::UnaryOp { expr, .. } | E::Nested(expr) | E::Cast { expr, .. } => contains_aggregate(expr),
        E::IsNull(e) | E::IsNotNull(e) => contains_aggregate(e),
        E::Between { expr, low, high, .. } => [expr, low, high].iter().any(|e| contains_aggregate(e)),
        E::InList { expr, list, .. } => contains_aggregate(expr) || list.iter().any(contains_aggregate),
        E::Case { operand, conditions, else_result, .. } => {
            operand.as_deref().is_some_and(contains_aggregate)
                || conditions.iter().any(|w| contains_aggregate(&w.condition) || contains_aggregate(&w.result))
                || else_result.as_deref().is_some_and(contains_aggregate)
        }
        _ => false,
    }
}

fn expect_type(expr: &Expr, expected: DataType, what: &str) -> Result<()> {
    if expr.data_type() == expected || (expected == DataType::Bool && is_null_literal(expr)) {
        Ok(())
    } else {
        Err(EngineError::Type(format!("{what} expects {}, got {}", expected.sql_name(), expr.data_type().sql_name())))
    }
}

fn is_null_literal(expr: &Expr) -> bool {
    matches!(expr, Expr::Literal { value: Value::Null, .. })
}

pub fn literal(value: &ast::Value) -> Result<Expr> {
    Ok(match value {
        ast::Value::Number(text, _) => number_literal(text)?,
        ast::Value::SingleQuotedString(s) | ast::Value::EscapedStringLiteral(s) => {
            Expr::literal(Value::Text(s.clone()), DataType::Text)
        }
        ast::Value::Boolean(b) => Expr::literal(Value::Bool(*b), DataType::Bool),
        ast::Value::Null => Expr::literal(Value::Null, DataType::Int32),
        other => return Err(EngineError::unsupported(format!("literal {other}"))),
    })
}

fn number_literal(text: &str) -> Result<Expr> {
    if let Some((_, fraction)) = text.split_once('.') {
        let scale = u8::try_from(fraction.len()).unwrap_or(u8::MAX);
        if scale > DECIMAL_PRECISION_MAX || text.contains(['e', 'E']) {
            let value: f64 = text.parse().map_err(|_| EngineError::InvalidValue(text.to_string()))?;
            return Ok(Expr::literal(Value::Float64(value), DataType::Float64));
        }
        let value = parse_decimal(text, scale)?;
        return Ok(Expr::literal(
            Value::Decimal { value, scale },
            DataType::Decimal { precision: DECIMAL_PRECISION_MAX, scale },
        ));
    }
    if let Ok(v) = text.parse::<i32>() {
        return Ok(Expr::literal(Value::Int32(v), DataType::Int32));
    }
    if let Ok(v) = text.parse::<i64>() {
        return Ok(Expr::literal(Value::Int64(v), DataType::Int64));
    }
    let value: f64 = text.parse().map_err(|_| EngineError::InvalidValue(text.to_string()))?;
    Ok(Expr::literal(Value::Float64(value), DataType::Float64))
}

fn typed_string(data_type: &ast::DataType, value: &ast::Value) -> Result<Expr> {
    let ast::Value::SingleQuotedString(text) = value else {
        return Err(EngineError::unsupported(format!("typed literal {value}")));
    };
    let to = sql_type(data_type)?;
    cast_expr(Expr::literal(Value::Text(text.clone()), DataType::Text), to)
}

/// Maps a SQL type name to ours.
pub fn sql_type(data_type: &ast::DataType) -> Result<DataType> {
    use ast::DataType as T;
    Ok(match data_type {
        T::Boolean | T::Bool => DataType::Bool,
        T::Int(_) | T::Integer(_) | T::Int4(_) | T::SmallInt(_) | T::Int2(_) => DataType::Int32,
        T::BigInt(_) | T::Int8(_) => DataType::Int64,
        T::Double(_) | T::DoublePrecision | T::Float8 | T::Real | T::Float4 | T::Float(_) => DataType::Float64,
        T::Date => DataType::Date,
        T::Text | T::Varchar(_) | T::Char(_) | T::Character(_) | T::CharacterVarying(_) | T::String(_) => {
            DataType::Text
        }
        T::Numeric(info) | T::Decimal(info) => match info {
            ast::ExactNumberInfo::PrecisionAndScale(p, s) if *p <= 18 && *s >= 0 && *s as u64 <= *p => {
                DataType::Decimal { precision: *p as u8, scale: *s as u8 }
            }
            ast::ExactNumberInfo::Precision(p) if *p <= 18 => DataType::Decimal { precision: *p as u8, scale: 0 },
            _ => {
                return Err(EngineError::unsupported(format!("{data_type}: decimals need precision ≤ 18 and a scale")))
            }
        },
        other => return Err(EngineError::unsupported(format!("type {other}"))),
    })
}

fn interval_value(interval: &ast::Interval) -> Result<(i32, i32)> {
    let text = match interval.value.as_ref() {
        ast::Expr::Value(ast::ValueWithSpan { value: ast::Value::SingleQuotedString(s), .. }) => s.clone(),
        ast::Expr::Value(ast::ValueWithSpan { value: ast::Value::Number(n, _), .. }) => n.clone(),
        other => return Err(EngineError::unsupported(format!("interval value {other}"))),
    };
    let mut words = text.split_whitespace();
    let amount: i32 = words
        .next()
        .and_then(|w| w.parse().ok())
        .ok_or_else(|| EngineError::InvalidValue(format!("interval '{text}'")))?;
    let unit = match (words.next(), &interval.leading_field) {
        (Some(word), _) => word.to_lowercase(),
        (None, Some(field)) => field.to_string().to_lowercase(),
        (None, None) => return Err(EngineError::unsupported(format!("interval '{text}' without a unit"))),
    };
    match unit.trim_end_matches('s') {
        "day" => Ok((0, amount)),
        "month" => Ok((amount, 0)),
        "year" => Ok((amount * 12, 0)),
        other => Err(EngineError::unsupported(format!("interval unit {other}"))),
    }
}

fn date_plus_interval(date: Expr, months: i32, days: i32) -> Result<Expr> {
    let date = if date.data_type() == DataType::Text { cast_expr(date, DataType::Date)? } else { date };
    expect_type(&date, DataType::Date, "interval arithmetic")?;
    let mut result = date;
    if months != 0 {
        result = match result {
            Expr::Literal { value: Value::Date(d), .. } => {
                Expr::literal(Value::Date(add_months(d, months)), DataType::Date)
            }
            other => Expr::AddMonths { expr: Box::new(other), months },
        };
    }
    if days != 0 {
        let offset = Expr::literal(Value::Int32(days), DataType::Int32);
        result = fold(Expr::binary(BinaryOp::Add, result, offset, DataType::Date))?;
    }
    Ok(result)
}

/// Folds an expression to a literal when it has no column references.
pub fn fold(expr: Expr) -> Result<Expr> {
    if expr.is_constant() && !matches!(expr, Expr::Literal { .. }) {
        let data_type = expr.data_type();
        return Ok(Expr::literal(evaluate_constant(&expr)?, data_type));
    }
    Ok(expr)
}

/// The type both operands are converted to.
pub fn common_type(a: DataType, b: DataType, op: BinaryOp) -> Result<DataType> {
    use DataType as T;
    Ok(match (a, b) {
        // Decimal division is done in float64 (PostgreSQL: numeric with more digits).
        (T::Decimal { .. }, t) | (t, T::Decimal { .. }) if op == BinaryOp::Div && t.is_numeric() => T::Float64,
        _ if a == b => a,
        (T::Float64, t) | (t, T::Float64) if t.is_numeric() => T::Float64,
        (T::Decimal { .. }, t) | (t, T::Decimal { .. }) if t.is_numeric() => {
            if op == BinaryOp::Div {
                T::Float64
            } else {
                T::Decimal { precision: DECIMAL_PRECISION_MAX, scale: a.scale().max(b.scale()) }
            }
        }
        (T::Int32, T::Int64) | (T::Int64, T::Int32) => T::Int64,
        (T::Text, other) | (other, T::Text) => other,
        _ => return Err(EngineError::Type(format!("{} and {} are not compatible", a.sql_name(), b.sql_name()))),
    })
}

/// Casts `expr` to `to`, folding constants (so `'1995-01-01'` next to a date is a date literal).
pub fn cast_expr(expr: Expr, to: DataType) -> Result<Expr> {
    if expr.data_type() == to {
        return Ok(expr);
    }
    // Decimals of equal scale share a representation: precision is metadata only.
    if let (DataType::Decimal { scale: from, .. }, DataType::Decimal { scale: target, .. }) = (expr.data_type(), to) {
        if from == target {
            return Ok(expr);
        }
    }
    if is_null_literal(&expr) {
        return Ok(Expr::literal(Value::Null, to));
    }
    if let (Expr::Literal { value: Value::Text(text), .. }, true) = (&expr, to != DataType::Text) {
        if record_parameter(text, to) {
            return Ok(Expr::literal(Value::Null, to));
        }
        let value = match to {
            DataType::Date => Value::Date(parse_date(text)?),
            DataType::Decimal { scale, .. } => Value::Decimal { value: parse_decimal(text, scale)?, scale },
            DataType::Int32 => Value::Int32(text.trim().parse().map_err(|_| EngineError::InvalidValue(text.clone()))?),
            DataType::Int64 => Value::Int64(text.trim().parse().map_err(|_| EngineError::InvalidValue(text.clone()))?),
            DataType::Float64 => {
                Value::Float64(text.trim().parse().map_err(|_| EngineError::InvalidValue(text.clone()))?)
            }
            DataType::Bool => Value::Bool(matches!(text.trim(), "t" | "true" | "1" | "yes" | "on")),
            DataType::Text => unreachable!("excluded above"),
        };
        return Ok(Expr::literal(value, to));
    }
    fold(Expr::Cast { expr: Box::new(expr), to })
}

/// Coerces `other` to the type of `reference` (IN lists), or both to a common type.
fn coerce_to(reference: &Expr, other: Expr) -> Result<(Expr, DataType)> {
    let target = common_type(reference.data_type(), other.data_type(), BinaryOp::Eq)?;
    Ok((cast_expr(other, target)?, target))
}

pub fn comparison(op: BinaryOp, left: Expr, right: Expr) -> Result<Expr> {
    let target = common_type(left.data_type(), right.data_type(), op)?;
    let (left, right) = (cast_expr(left, target)?, cast_expr(right, target)?);
    fold(Expr::binary(op, left, right, DataType::Bool))
}

pub fn arithmetic(op: BinaryOp, left: Expr, right: Expr) -> Result<Expr> {
    use DataType as T;
    let (lt, rt) = (left.data_type(), right.data_type());
    let expr = match (lt, rt) {
        (T::Date, T::Int32) if matches!(op, BinaryOp::Add | BinaryOp::Sub) => Expr::binary(op, left, right, T::Date),
        (T::Int32, T::Date) if op == BinaryOp::Add => Expr::binary(op, right, left, T::Date),
        (T::Date, T::Date) if op == BinaryOp::Sub => {
            Expr::binary(op, cast_expr(left, T::Int32)?, cast_expr(right, T::Int32)?, T::Int32)
        }
        (T::Decimal { .. }, _) | (_, T::Decimal { .. })
            if op == BinaryOp::Mul && lt.is_numeric() && rt.is_numeric() && lt != T::Float64 && rt != T::Float64 =>
        {
            let as_decimal = |e: Expr| {
                let scale = e.data_type().scale();
                cast_expr(e, T::Decimal { precision: DECIMAL_PRECISION_MAX, scale })
            };
            let scale = lt.scale() + rt.scale();
            if scale > DECIMAL_PRECISION_MAX {
                return Err(EngineError::Overflow(format!("decimal product with scale {scale}")));
            }
            Expr::binary(
                op,
                as_decimal(left)?,
                as_decimal(right)?,
                T::Decimal { precision: DECIMAL_PRECISION_MAX, scale },
            )
        }
        _ if lt.is_numeric() && rt.is_numeric() => {
            let target = common_type(lt, rt, op)?;
            Expr::binary(op, cast_expr(left, target)?, cast_expr(right, target)?, target)
        }
        _ => {
            return Err(EngineError::Type(format!(
                "operator {} on {} and {}",
                op.symbol(),
                lt.sql_name(),
                rt.sql_name()
            )))
        }
    };
    fold(expr)
}
