//! Expression binding: sqlparser AST expressions → typed [`Expr`]s over a scope's columns.
//!
//! A scope is the concatenation of the columns of the relations in FROM (the "wide row"); a
//! column reference becomes its index in that row. Type coercion happens here: the binder
//! inserts casts so kernels see operands of one physical type.

use sqlparser::ast;

use crate::datetime::DatePart;
use crate::error::{EngineError, Result};
use crate::expr::{disjunction, evaluate_constant, BinaryOp, Expr};
use crate::expr::{SubqueryExpr, SubqueryKind};
use crate::functions::{self, ScalarFunction, TrimSide};
use crate::interval::Interval;
use crate::numeric::Numeric;
use crate::plan::{AggregateCall, AggregateFunction, Plan};
use crate::query::QueryBinder;
use crate::types::{DataType, Value, DECIMAL_PRECISION_MAX};

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
    /// Where the enclosing query's own enclosing queries start, nearest first: a name
    /// resolves in the nearest level that has it, as in PostgreSQL.
    pub further_starts: Vec<usize>,
    /// Wide columns unqualified names do not find: the second copy of a JOIN USING column.
    pub hidden: Vec<usize>,
    /// What an unqualified `*` lists (relation alias, column), when FROM decided it; an empty
    /// alias names a computed column.
    pub star: Option<Vec<(String, String)>>,
    /// Unqualified names that stand for an expression: FULL JOIN USING's merged columns
    /// (`COALESCE(left.c, right.c)`).
    pub computed: Vec<(String, ast::Expr)>,
    /// `JOIN … USING (…) AS alias`: the alias and what `alias.column` stands for, for each
    /// merged column (the alias names nothing else).
    pub join_aliases: Vec<(String, Vec<(String, ast::Expr)>)>,
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

    /// The first wide column of the enclosing query's relations (None when not correlated).
    pub fn outer_offset(&self) -> Option<usize> {
        self.outer_start.map(|start| self.relations.get(start).map_or(self.width(), |r| r.offset))
    }

    /// The merged columns a `JOIN … USING (…) AS alias` names, when `alias` is one.
    pub fn join_alias(&self, alias: &str) -> Option<&[(String, ast::Expr)]> {
        self.join_aliases.iter().find(|(name, _)| name == alias).map(|(_, columns)| columns.as_slice())
    }

    /// Index of the relation that owns wide column `column`.
    pub fn relation_of(&self, column: usize) -> usize {
        self.relations.iter().rposition(|r| r.offset <= column).expect("column inside the scope")
    }

    fn resolve(&self, qualifier: Option<&str>, name: &str) -> Result<(usize, DataType)> {
        let mut bounds = vec![0];
        bounds.extend(self.outer_start);
        bounds.extend(&self.further_starts);
        bounds.push(self.relations.len());
        for level in bounds.windows(2) {
            if let Some(found) = self.resolve_in(&self.relations[level[0]..level[1]], qualifier, name)? {
                return Ok(found);
            }
        }
        if let Some(table) = qualifier.filter(|q| !self.relations.iter().any(|r| r.alias == *q)) {
            return Err(EngineError::MissingFromEntry(table.to_string()));
        }
        if qualifier.is_none() && self.relations.iter().any(|r| r.alias == name) {
            // PostgreSQL reads a bare relation name as its whole row (a composite).
            return Err(EngineError::unsupported(format!("whole-row reference {name}")));
        }
        let full = qualifier.map_or(name.to_string(), |q| format!("{q}.{name}"));
        Err(EngineError::UnknownColumn(format!("\"{full}\" does not exist")))
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
            let visible = |&(position, (column, _)): &(usize, &(String, DataType))| {
                column == name && (qualifier.is_some() || !self.hidden.contains(&(relation.offset + position)))
            };
            if let Some((position, _)) = relation.columns.iter().enumerate().find(visible) {
                if found.is_some() {
                    return Err(EngineError::AmbiguousColumn(name.to_string()));
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
    /// Binds subqueries (None: subqueries are refused, as in DDL defaults).
    pub queries: Option<&'s QueryBinder<'s>>,
    /// Where references to the enclosing query's columns (the scope's outer part) go: they
    /// become parameters of this query block.
    pub correlation: Option<&'s Correlation>,
    /// Where window function calls of a select list go (None: they are not allowed here).
    pub windows: Option<&'s crate::window_bind::WindowContext<'s>>,
}

/// The enclosing query's columns a correlated query block reads: `Expr::Param { index }` is
/// the block's parameter `index`, the enclosing row's column `captured[index]`.
#[derive(Debug, Default)]
pub struct Correlation {
    captured: std::cell::RefCell<Vec<(usize, DataType)>>,
}

impl Correlation {
    /// The parameter for the enclosing row's column `outer_column`.
    pub fn param(&self, outer_column: usize, data_type: DataType) -> Expr {
        let mut captured = self.captured.borrow_mut();
        let index = match captured.iter().position(|(c, _)| *c == outer_column) {
            Some(index) => index,
            None => {
                captured.push((outer_column, data_type));
                captured.len() - 1
            }
        };
        Expr::Param { index, data_type }
    }

    /// The parameters' values: columns of the enclosing query's row.
    pub fn params(&self) -> Vec<Expr> {
        self.captured.borrow().iter().map(|&(index, data_type)| Expr::Column { index, data_type }).collect()
    }
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
    /// A binder of plain expressions over `scope` (no subqueries, no enclosing query).
    pub fn new(scope: &'s Scope) -> ExprBinder<'s> {
        ExprBinder { scope, queries: None, correlation: None, windows: None }
    }

    /// Binds a scalar expression (no aggregates allowed).
    pub fn bind(&self, expr: &ast::Expr) -> Result<Expr> {
        self.bind_in(expr, &mut None)
    }

    /// Binds an expression that may contain aggregates, over the aggregate output.
    pub fn bind_aggregated(&self, expr: &ast::Expr, context: &mut AggregateContext<'_>) -> Result<Expr> {
        self.bind_in(expr, &mut Some(context))
    }

    pub(crate) fn bind_in(&self, expr: &ast::Expr, context: &mut Option<&mut AggregateContext<'_>>) -> Result<Expr> {
        let _depth = crate::depth::enter()?;
        if let ast::Expr::Function(function) = expr {
            if function.over.is_some() {
                return self.window(function, context);
            }
        }
        if let Some(aggregate) = context.as_deref_mut() {
            // (A window call's arguments are over the aggregate's output: bound below.)
            if !contains_aggregate(expr) && !contains_window(expr) {
                let bound = self.bind_in(expr, &mut None)?;
                if let Some(position) = aggregate.groups.iter().position(|g| *g == bound) {
                    return Ok(Expr::Column { index: position, data_type: bound.data_type() });
                }
                if bound.columns().is_empty() {
                    return Ok(bound);
                }
                if let ast::Expr::Identifier(_) | ast::Expr::CompoundIdentifier(_) = expr {
                    return Err(EngineError::Grouping(format!(
                        "column \"{expr}\" must appear in the GROUP BY clause or be used in an aggregate function"
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
            E::Identifier(ident) => match self.scope.computed.iter().find(|(name, _)| *name == identifier(ident)) {
                Some((_, merged)) => self.bind_in(merged, context),
                None => self.column(None, ident),
            },
            E::CompoundIdentifier(parts) => {
                let qualifier = parts.len().checked_sub(2).map(|i| identifier(&parts[i]));
                let last = parts.last().ok_or_else(|| EngineError::Syntax("empty identifier".into()))?;
                match qualifier.as_deref().and_then(|q| self.scope.join_alias(q)) {
                    Some(columns) => {
                        let name = identifier(last);
                        let (_, merged) = columns.iter().find(|(column, _)| *column == name).ok_or_else(|| {
                            EngineError::UnknownColumn(format!(
                                "{}.{name} does not exist",
                                qualifier.unwrap_or_default()
                            ))
                        })?;
                        self.bind_in(merged, context)
                    }
                    None => self.column(qualifier.as_deref(), last),
                }
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
                let lower = comparison(BinaryOp::GtEq, copy_bounded(&value)?, low)?;
                let upper = comparison(BinaryOp::LtEq, value, high)?;
                let both = Expr::binary(BinaryOp::And, lower, upper, DataType::Bool);
                Ok(if *negated { Expr::Not(Box::new(both)) } else { both })
            }
            E::InList { expr, list, negated } => self.in_list(expr, list, *negated, context),
            E::IsNull(inner) => Ok(Expr::IsNull { expr: Box::new(self.bind_in(inner, context)?), negated: false }),
            E::IsNotNull(inner) => Ok(Expr::IsNull { expr: Box::new(self.bind_in(inner, context)?), negated: true }),
            E::Like { negated, expr, pattern, escape_char: None, any: false } => {
                self.like(expr, pattern, *negated, false, context)
            }
            E::ILike { negated, expr, pattern, escape_char: None, any: false } => {
                self.like(expr, pattern, *negated, true, context)
            }
            E::Case { operand, conditions, else_result, .. } => self.case(operand, conditions, else_result, context),
            E::Cast { expr, data_type, .. } => {
                let to = sql_type(data_type)?;
                let value = self.bind_in(expr, context)?;
                // An explicit cast to character(n) / varchar(n) cuts the value to n characters
                // (assignment, which casts do elsewhere, refuses longer values with 22001).
                let value = match to {
                    DataType::Char(n) | DataType::Varchar(n) => {
                        let text = cast_expr(value, DataType::Text)?;
                        fold(Expr::Substring { expr: Box::new(text), start: 1, length: Some(i64::from(n)) })?
                    }
                    _ => value,
                };
                cast_expr(value, to)
            }
            E::Extract { field, expr, .. } => {
                let value = self.bind_in(expr, context)?;
                let name = field.to_string().to_lowercase();
                let part = DatePart::named(&name).ok_or_else(|| {
                    let type_name = value.data_type().sql_name();
                    EngineError::InvalidParameterValue(format!("unit \"{name}\" not recognized for type {type_name}"))
                })?;
                extract(part, value)
            }
            E::Substring { expr, substring_from, substring_for, .. } => {
                let value = self.bind_in(expr, context)?;
                expect_type(&value, DataType::Text, "SUBSTRING")?;
                let start = substring_from.as_deref().map(|e| self.constant_integer(e)).transpose()?.unwrap_or(1);
                let length = substring_for.as_deref().map(|e| self.constant_integer(e)).transpose()?;
                Ok(Expr::Substring { expr: Box::new(value), start, length })
            }
            E::Function(function) => self.function(function, context),
            E::Floor { expr: value, field: ast::CeilFloorKind::DateTimeField(ast::DateTimeField::NoDateTime) } => {
                functions::call(ScalarFunction::Floor, vec![self.bind_in(value, context)?])
            }
            E::Ceil { expr: value, field: ast::CeilFloorKind::DateTimeField(ast::DateTimeField::NoDateTime) } => {
                functions::call(ScalarFunction::Ceil, vec![self.bind_in(value, context)?])
            }
            E::Position { expr: sub, r#in } => {
                let args = vec![self.bind_in(r#in, context)?, self.bind_in(sub, context)?];
                functions::call(ScalarFunction::Position, args)
            }
            E::Trim { trim_where, trim_what, expr: value, trim_characters: None } => {
                let side = match trim_where {
                    None | Some(ast::TrimWhereField::Both) => TrimSide::Both,
                    Some(ast::TrimWhereField::Leading) => TrimSide::Leading,
                    Some(ast::TrimWhereField::Trailing) => TrimSide::Trailing,
                };
                let mut args = vec![self.bind_in(value, context)?];
                if let Some(characters) = trim_what {
                    args.push(self.bind_in(characters, context)?);
                }
                functions::call(ScalarFunction::Trim(side), args)
            }
            E::Interval(interval) => interval_literal(interval),
            E::Subquery(query) => self.subquery(query, SubqueryKind::Scalar, None, context),
            E::Exists { subquery, negated } => {
                let exists = self.subquery(subquery, SubqueryKind::Exists, None, context)?;
                Ok(if *negated { Expr::Not(Box::new(exists)) } else { exists })
            }
            E::InSubquery { expr, subquery, negated } => {
                let any = self.subquery(subquery, SubqueryKind::Any(BinaryOp::Eq), Some(expr), context)?;
                Ok(if *negated { Expr::Not(Box::new(any)) } else { any })
            }
            E::AnyOp { left, compare_op, right, .. } | E::AllOp { left, compare_op, right } => {
                let ast::Expr::Subquery(query) = right.as_ref() else {
                    return Err(EngineError::unsupported("ANY/ALL over an array"));
                };
                let op = comparison_operator(compare_op)?;
                let kind = if matches!(expr, E::AnyOp { .. }) { SubqueryKind::Any(op) } else { SubqueryKind::All(op) };
                self.subquery(query, kind, Some(left), context)
            }
            other => Err(EngineError::unsupported(format!("expression {other}"))),
        }
    }

    /// `value [NOT] LIKE 'pattern'`; ILIKE compares lower-cased value and pattern (ASCII
    /// letters, the engine's C collation).
    fn like(
        &self,
        value: &ast::Expr,
        pattern: &ast::Expr,
        negated: bool,
        case_insensitive: bool,
        context: &mut Option<&mut AggregateContext<'_>>,
    ) -> Result<Expr> {
        let mut value = self.bind_in(value, context)?;
        if let DataType::Char(_) = value.data_type() {
            // PostgreSQL matches the blank-padded value; the engine holds it without blanks.
            return Err(EngineError::unsupported("LIKE on character(n)"));
        }
        expect_type(&value, DataType::Text, "LIKE")?;
        let ast::Expr::Value(ast::ValueWithSpan { value: ast::Value::SingleQuotedString(pattern), .. }) = pattern
        else {
            return Err(EngineError::unsupported("LIKE with a non-constant pattern"));
        };
        let mut pattern = pattern.clone();
        if case_insensitive {
            value = functions::call(ScalarFunction::Lower, vec![value])?;
            pattern.make_ascii_lowercase();
        }
        Ok(Expr::Like { expr: Box::new(value), pattern, negated })
    }

    fn column(&self, qualifier: Option<&str>, ident: &ast::Ident) -> Result<Expr> {
        let (index, data_type) = self.scope.resolve(qualifier, &identifier(ident))?;
        if data_type == DataType::TimestampTz {
            crate::datetime::check_time_zone()?;
        }
        Ok(self.capture(Expr::Column { index, data_type }))
    }

    /// A column of the enclosing query becomes this block's parameter (when correlated).
    fn capture(&self, expr: Expr) -> Expr {
        let (Some(correlation), Some(outer_offset)) = (self.correlation, self.scope.outer_offset()) else {
            return expr;
        };
        expr.transform(&|node| match node {
            Expr::Column { index, data_type } if *index >= outer_offset => {
                Some(correlation.param(index - outer_offset, *data_type))
            }
            _ => None,
        })
    }

    /// A subquery used as a value. Its parameters are columns of this scope (enclosing
    /// columns among them become this block's parameters); under GROUP BY they must be groups.
    fn subquery(
        &self,
        query: &ast::Query,
        kind: SubqueryKind,
        lhs: Option<&ast::Expr>,
        context: &mut Option<&mut AggregateContext<'_>>,
    ) -> Result<Expr> {
        let queries = self.queries.ok_or_else(|| EngineError::unsupported("a subquery in this position"))?;
        let bound = queries.bind_query_in(query, Some(self.scope))?;
        let mut plan = bound.plan;
        let column_type = plan.output_types().first().copied().unwrap_or(DataType::Bool);
        if kind != SubqueryKind::Exists && plan.width() != 1 {
            return Err(EngineError::Syntax("subquery must return only one column".into()));
        }
        let lhs = match lhs {
            Some(lhs) => {
                let value = self.bind_in(lhs, context)?;
                let probe = Expr::Column { index: 0, data_type: column_type };
                let (mut both, target) = unify(vec![value, probe])?;
                if target != column_type {
                    let exprs = vec![both.pop().expect("the subquery column")];
                    plan = Plan::Project { input: Box::new(plan), exprs };
                }
                Some(both.swap_remove(0))
            }
            None => None,
        };
        let rows_needed = match kind {
            SubqueryKind::Exists => Some(1),
            SubqueryKind::Scalar => Some(2),
            _ => None,
        };
        if let Some(limit) = rows_needed {
            plan = Plan::Limit { input: Box::new(plan), limit: Some(limit), offset: 0 };
        }
        let mut params = Vec::new();
        for param in bound.params {
            let param = self.capture(param);
            params.push(match context.as_deref() {
                Some(aggregate) => group_reference(aggregate, param)?,
                None => param,
            });
        }
        Ok(Expr::Subquery(Box::new(SubqueryExpr::new(kind, plan, params, lhs))))
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
        if matches!(op, B::And | B::Or) {
            return self.logical_chain(left, op, right, context);
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
            B::StringConcat => return functions::call(ScalarFunction::Concat, vec![l, r]),
            other => return Err(EngineError::unsupported(format!("operator {other}"))),
        };
        if op.is_comparison() {
            comparison(op, l, r)
        } else {
            arithmetic(op, l, r)
        }
    }

    /// `a AND b AND c …` (or OR): the operands of the whole chain are bound one by one and
    /// combined into a balanced tree, so a chain of n conditions nests log2(n) deep (PostgreSQL
    /// flattens such chains too).
    fn logical_chain(
        &self,
        left: &ast::Expr,
        op: &ast::BinaryOperator,
        right: &ast::Expr,
        context: &mut Option<&mut AggregateContext<'_>>,
    ) -> Result<Expr> {
        let mut operands = vec![right];
        let mut spine = left;
        loop {
            match spine {
                ast::Expr::BinaryOp { left, op: inner, right } if inner == op => {
                    operands.push(right);
                    spine = left;
                }
                other => {
                    operands.push(other);
                    break;
                }
            }
        }
        operands.reverse();
        let mut bound = Vec::with_capacity(operands.len());
        for operand in operands {
            let value = self.bind_in(operand, context)?;
            let value = if is_untyped(&value) { cast_expr(value, DataType::Bool)? } else { value };
            expect_type(&value, DataType::Bool, if matches!(op, ast::BinaryOperator::And) { "AND" } else { "OR" })?;
            bound.push(value);
        }
        let op = if matches!(op, ast::BinaryOperator::And) { BinaryOp::And } else { BinaryOp::Or };
        Ok(crate::expr::balanced(op, bound))
    }

    fn unary(
        &self,
        op: &ast::UnaryOperator,
        expr: &ast::Expr,
        context: &mut Option<&mut AggregateContext<'_>>,
    ) -> Result<Expr> {
        if let (ast::UnaryOperator::Minus, ast::Expr::Value(v)) = (op, expr) {
            if let ast::Value::Number(text, _) = &v.value {
                // `-9223372036854775808` is a bigint, as PostgreSQL negates the literal's text.
                return number_literal(&format!("-{text}"));
            }
        }
        let value = self.bind_in(expr, context)?;
        match op {
            ast::UnaryOperator::Not => {
                expect_type(&value, DataType::Bool, "NOT")?;
                Ok(Expr::Not(Box::new(value)))
            }
            ast::UnaryOperator::Minus if value.data_type().is_numeric() || value.data_type() == DataType::Interval => {
                fold(Expr::Negate(Box::new(value)))
            }
            ast::UnaryOperator::Plus if value.data_type().is_numeric() => Ok(value),
            other => Err(EngineError::unsupported(format!("unary operator {other}"))),
        }
    }

    /// `x IN (a, b, …)`: one InList over constants (three-valued: see `expr::in_list`), else
    /// the equivalent `x = a OR x = b …`.
    fn in_list(
        &self,
        expr: &ast::Expr,
        list: &[ast::Expr],
        negated: bool,
        context: &mut Option<&mut AggregateContext<'_>>,
    ) -> Result<Expr> {
        let mut all = vec![self.bind_in(expr, context)?];
        for item in list {
            all.push(self.bind_in(item, context)?);
        }
        if matches!(all[0].data_type(), DataType::Char(_) | DataType::Varchar(_)) {
            // Each item compares with the value as `=` would (character: blanks insignificant).
            let probe = all[0].clone();
            for item in all.iter_mut().skip(1) {
                let taken = std::mem::replace(item, Expr::literal(Value::Null, DataType::Text));
                *item = text_comparands(probe.clone(), taken)?.1;
            }
            all[0] = text_comparands(probe, Expr::literal(Value::Null, DataType::Text))?.0;
        }
        let (mut all, _) = unify(all)?;
        let items = all.split_off(1);
        let value = all.pop().expect("the probed value");
        if items.iter().all(Expr::is_constant) {
            let list = items.iter().map(evaluate_constant).collect::<Result<Vec<_>>>()?;
            return fold(Expr::InList { expr: Box::new(value), list, negated });
        }
        let comparisons = items
            .into_iter()
            .map(|item| comparison(BinaryOp::Eq, copy_bounded(&value)?, item))
            .collect::<Result<Vec<_>>>()?;
        let any = disjunction(comparisons).ok_or_else(|| EngineError::Syntax("empty IN list".into()))?;
        Ok(if negated { Expr::Not(Box::new(any)) } else { any })
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
        // Like PostgreSQL's constant folding: a result no row can reach (its condition is a
        // constant false or NULL, or an earlier one a constant true) is bound without raising
        // the errors of folding it (`WHEN 1=0 THEN 1/0`); any other result folds as usual.
        let mut decided = false;
        for when in conditions {
            let condition = self.bind_in(&when.condition, context)?;
            let condition = match &operand {
                Some(value) => comparison(BinaryOp::Eq, copy_bounded(value)?, condition)?,
                None => condition,
            };
            expect_type(&condition, DataType::Bool, "CASE WHEN")?;
            let constant = match &condition {
                Expr::Literal { value: Value::Bool(b), .. } => Some(*b),
                Expr::Literal { value: Value::Null, .. } => Some(false),
                _ => None,
            };
            let unreachable = decided || constant == Some(false);
            decided |= constant == Some(true);
            branches.push((condition, folding_errors_deferred(unreachable, || self.bind_in(&when.result, context))?));
        }
        let otherwise = match else_result {
            Some(e) => folding_errors_deferred(decided, || self.bind_in(e, context))?,
            None => Expr::literal(Value::Null, DataType::Int32),
        };
        let (conditions, results): (Vec<Expr>, Vec<Expr>) = branches.into_iter().unzip();
        let (mut results, result_type) = unify(results.into_iter().chain(std::iter::once(otherwise)).collect())?;
        let otherwise = Box::new(results.pop().expect("the ELSE result"));
        let branches = conditions.into_iter().zip(results).collect();
        Ok(Expr::Case { branches, otherwise, data_type: result_type })
    }

    fn function(&self, function: &ast::Function, context: &mut Option<&mut AggregateContext<'_>>) -> Result<Expr> {
        let name = object_name(&function.name)?;
        if aggregate_function(&name).is_some() {
            return Err(EngineError::Grouping(format!(
                "aggregate function {name} is not allowed here (WHERE, GROUP BY or nested)"
            )));
        }
        if function.over.is_some() {
            return Err(EngineError::unsupported("window functions (OVER)"));
        }
        let modified = match &function.args {
            ast::FunctionArguments::List(list) => !list.clauses.is_empty() || list.duplicate_treatment.is_some(),
            _ => false,
        };
        if modified || function.filter.is_some() || !function.within_group.is_empty() {
            return Err(EngineError::unsupported(format!(
                "DISTINCT, ORDER BY, FILTER or WITHIN GROUP in a call of {name}"
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
            ("date_part", [unit, value]) => {
                let value = self.bind_in(value, context)?;
                let part = self.date_unit(unit, value.data_type())?;
                // date_part over a date is over its midnight (PostgreSQL's SQL wrapper).
                let value =
                    if value.data_type() == DataType::Date { cast_expr(value, DataType::Timestamp)? } else { value };
                cast_expr(extract(part, value)?, DataType::Float64)
            }
            ("date_trunc", [unit, value]) => {
                let value = self.bind_in(value, context)?;
                let part = self.date_unit(unit, value.data_type())?;
                functions::call(ScalarFunction::DateTrunc(part), vec![value])
            }
            (name, args) => match ScalarFunction::named(name) {
                Some(function) => {
                    let args = args.iter().map(|a| self.bind_in(a, context)).collect::<Result<Vec<_>>>()?;
                    functions::call(function, args)
                }
                None => Err(EngineError::unsupported(format!("function {name}"))),
            },
        }
    }

    /// The unit named by date_trunc's or date_part's first argument, a constant string.
    fn date_unit(&self, unit: &ast::Expr, of: DataType) -> Result<DatePart> {
        let Expr::Literal { value: Value::Text(name), .. } = self.bind(unit)? else {
            return Err(EngineError::unsupported("a date/time unit that is not a constant string"));
        };
        DatePart::named(&name).ok_or_else(|| {
            EngineError::InvalidParameterValue(format!("unit \"{name}\" not recognized for type {}", of.sql_name()))
        })
    }

    /// `Some(call)` when `function` is an aggregate; binds its argument over the input scope.
    pub fn aggregate_call(&self, function: &ast::Function) -> Result<Option<AggregateCall>> {
        let name = object_name(&function.name)?;
        let Some(kind) = aggregate_function(&name) else {
            return Ok(None);
        };
        let distinct = matches!(&function.args, ast::FunctionArguments::List(list)
            if list.duplicate_treatment == Some(ast::DuplicateTreatment::Distinct));
        if function.over.is_some() {
            return Err(EngineError::unsupported("window functions (OVER)"));
        }
        if let AggregateFunction::Ordered(kind) = kind {
            let filter = function.filter.as_deref().map(|c| self.bind(c)).transpose()?;
            if let Some(filter) = &filter {
                expect_type(filter, DataType::Bool, "FILTER")?;
            }
            return self.ordered_set_call(&name, kind, function, distinct, filter).map(Some);
        }
        if !function.within_group.is_empty() {
            return Err(EngineError::WrongObjectType(format!(
                "{name} is not an ordered-set aggregate, so it cannot have WITHIN GROUP"
            )));
        }
        if let ast::FunctionArguments::List(list) = &function.args {
            // The order of the input changes nothing for count, min and max (bool_and, bool_or
            // and every among them).
            let order_blind =
                matches!(kind, AggregateFunction::Count | AggregateFunction::Min | AggregateFunction::Max);
            let only_order = list.clauses.iter().all(|c| matches!(c, ast::FunctionArgumentClause::OrderBy(_)));
            let ignorable = list.clauses.is_empty() || order_blind && only_order;
            if !ignorable {
                return Err(EngineError::unsupported(format!("ORDER BY or other clauses inside {name}(…)")));
            }
        }
        let filter = function
            .filter
            .as_deref()
            .map(|condition| {
                let bound = self.bind(condition)?;
                let bound = if is_untyped(&bound) { cast_expr(bound, DataType::Bool)? } else { bound };
                expect_type(&bound, DataType::Bool, "FILTER")?;
                Ok(bound)
            })
            .transpose()?;
        let star = matches!(&function.args, ast::FunctionArguments::List(list)
            if matches!(list.args.as_slice(), [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Wildcard)]));
        let args = if star { Vec::new() } else { function_args(function)? };
        let bound_args = args.iter().map(|a| self.bind(a)).collect::<Result<Vec<_>>>()?;
        if reads_only_enclosing_query(bound_args.iter().chain(&filter)) {
            // PostgreSQL computes such an aggregate in the enclosing query (which becomes an
            // aggregate query); computing it here, per inner row, would answer differently.
            return Err(EngineError::unsupported(format!("{name}(…) over only the enclosing query's columns")));
        }
        if star {
            return match kind {
                AggregateFunction::Count if !distinct => Ok(Some(AggregateCall {
                    function: AggregateFunction::CountStar,
                    argument: None,
                    data_type: DataType::Int64,
                    distinct,
                    filter,
                    second: None,
                })),
                _ => Err(EngineError::Syntax(format!("{name}(*) is only valid for count"))),
            };
        }
        if let AggregateFunction::Statistic(statistic) = kind {
            if distinct {
                return Err(EngineError::unsupported(format!("DISTINCT in a call of {name}")));
            }
            let (mut args, data_type) = statistic.bind(&name, bound_args)?;
            let second = (args.len() == 2).then(|| args.pop().expect("two arguments"));
            let argument = args.pop();
            return Ok(Some(AggregateCall { function: kind, argument, data_type, distinct, filter, second }));
        }
        let Ok([argument]) = <[Expr; 1]>::try_from(bound_args) else {
            return Err(EngineError::unsupported(format!("{name} with {} arguments", args.len())));
        };
        boolean_input(&name, argument.data_type())?;
        let data_type = aggregate_type(kind, argument.data_type())?;
        Ok(Some(AggregateCall { function: kind, argument: Some(argument), data_type, distinct, filter, second: None }))
    }
}

impl ExprBinder<'_> {
    /// string_agg / percentile_* / mode: direct arguments, the WITHIN GROUP key, and ORDER BY
    /// inside string_agg when it orders by the aggregated value itself.
    fn ordered_set_call(
        &self,
        name: &str,
        mut kind: crate::ordered_set::OrderedSet,
        function: &ast::Function,
        distinct: bool,
        filter: Option<Expr>,
    ) -> Result<AggregateCall> {
        use crate::ordered_set::OrderedSet;
        let ordered_inside = matches!(&function.args, ast::FunctionArguments::List(list)
            if list.clauses.iter().any(|c| matches!(c, ast::FunctionArgumentClause::OrderBy(_))));
        if ordered_inside && !function.within_group.is_empty() {
            return Err(EngineError::Syntax("cannot use multiple ORDER BY clauses with WITHIN GROUP".into()));
        }
        let args = function_args(function)?.into_iter().map(|a| self.bind(a)).collect::<Result<Vec<_>>>()?;
        let ascending_key = |key: &ast::OrderByExpr| -> Result<Expr> {
            let plain =
                matches!(key.options.sort, None | Some(ast::OrderBySort::Asc)) && key.options.nulls_first.is_none();
            if !plain {
                return Err(EngineError::unsupported(format!("DESC, USING or NULLS in WITHIN GROUP of {name}")));
            }
            self.bind(&key.expr)
        };
        let within = match function.within_group.as_slice() {
            [] => None,
            [key] => Some(ascending_key(key)?),
            _ => return Err(EngineError::unsupported(format!("{name} with several WITHIN GROUP keys"))),
        };
        let mut order_keys = Vec::new();
        if let ast::FunctionArguments::List(list) = &function.args {
            for clause in &list.clauses {
                match clause {
                    ast::FunctionArgumentClause::OrderBy(keys) => order_keys.extend(keys),
                    other => return Err(EngineError::unsupported(format!("{other} inside {name}(…)"))),
                }
            }
        }
        // With DISTINCT, PostgreSQL wants each ORDER BY expression to be an argument as written
        // (`distinct f1::text … order by f1` is 42P10), not merely equal after the text cast.
        let written_argument = args.first().cloned();
        let (argument, second, data_type) = kind.bind(name, args, within)?;
        match (order_keys.as_slice(), &mut kind) {
            ([], _) => {}
            ([key], OrderedSet::StringAgg { order }) if key.options.nulls_first.is_none() => {
                let descending = match key.options.sort {
                    None | Some(ast::OrderBySort::Asc) => false,
                    Some(ast::OrderBySort::Desc) => true,
                    Some(ast::OrderBySort::Using(_)) => return Err(EngineError::unsupported("ORDER BY … USING")),
                };
                let key_expr = self.bind(&key.expr)?;
                if distinct && Some(&key_expr) != written_argument.as_ref() {
                    return Err(EngineError::InvalidColumnReference(
                        "in an aggregate with DISTINCT, ORDER BY expressions must appear in argument list".into(),
                    ));
                }
                if cast_expr(key_expr, DataType::Text)? != argument {
                    return Err(EngineError::unsupported(format!("ORDER BY inside {name} by other than its value")));
                }
                *order = Some(descending);
            }
            _ => return Err(EngineError::unsupported(format!("ORDER BY inside {name}(…)"))),
        }
        if distinct && !matches!(kind, OrderedSet::StringAgg { order: Some(_) }) {
            return Err(EngineError::unsupported(format!("DISTINCT in {name} without ORDER BY its value")));
        }
        let function = AggregateFunction::Ordered(kind);
        Ok(AggregateCall { function, argument: Some(argument), data_type, distinct, filter, second })
    }
}

/// Whether an aggregate's arguments and FILTER read the enclosing query's row (parameters) and
/// none of this query block's columns: PostgreSQL's rule makes it the enclosing query's.
fn reads_only_enclosing_query<'e>(exprs: impl Iterator<Item = &'e Expr> + Clone) -> bool {
    fn has_param(expr: &Expr) -> bool {
        matches!(expr, Expr::Param { .. }) || expr.children().into_iter().any(has_param)
    }
    exprs.clone().any(has_param) && exprs.clone().all(|e| e.columns().is_empty())
}

/// A comparison operator of the AST.
fn comparison_operator(op: &ast::BinaryOperator) -> Result<BinaryOp> {
    use ast::BinaryOperator as B;
    Ok(match op {
        B::Eq => BinaryOp::Eq,
        B::NotEq => BinaryOp::NotEq,
        B::Lt => BinaryOp::Lt,
        B::LtEq => BinaryOp::LtEq,
        B::Gt => BinaryOp::Gt,
        B::GtEq => BinaryOp::GtEq,
        other => return Err(EngineError::unsupported(format!("operator {other} with ANY/ALL"))),
    })
}

/// An expression over the input of an aggregate as one of its group keys (over its output).
fn group_reference(aggregate: &AggregateContext<'_>, expr: Expr) -> Result<Expr> {
    if expr.columns().is_empty() {
        return Ok(expr);
    }
    match aggregate.groups.iter().position(|g| *g == expr) {
        Some(position) => Ok(Expr::Column { index: position, data_type: expr.data_type() }),
        None => Err(EngineError::Grouping(format!("subquery uses ungrouped column {expr} from outer query"))),
    }
}

pub(crate) fn aggregate_function(name: &str) -> Option<AggregateFunction> {
    Some(match name {
        "sum" => AggregateFunction::Sum,
        "avg" => AggregateFunction::Avg,
        "count" => AggregateFunction::Count,
        "min" => AggregateFunction::Min,
        "max" => AggregateFunction::Max,
        // Over booleans (false < true) these are min and max; `boolean_input` checks the type.
        "bool_and" | "every" => AggregateFunction::Min,
        "bool_or" => AggregateFunction::Max,
        _ => match crate::ordered_set::OrderedSet::named(name) {
            Some(kind) => AggregateFunction::Ordered(kind),
            None => AggregateFunction::Statistic(crate::statistics::Statistic::named(name)?),
        },
    })
}

/// bool_and, bool_or and every take booleans only, and min and max take no booleans (as in
/// PostgreSQL, whose min and max have no boolean signature).
pub(crate) fn boolean_input(name: &str, input: DataType) -> Result<()> {
    let boolean_aggregate = matches!(name, "bool_and" | "bool_or" | "every");
    let ordering_aggregate = matches!(name, "min" | "max");
    if (boolean_aggregate && input != DataType::Bool) || (ordering_aggregate && input == DataType::Bool) {
        return Err(EngineError::UndefinedFunction(format!("function {name}({}) does not exist", input.sql_name())));
    }
    Ok(())
}

/// PostgreSQL's result types: sum of int4 is bigint, of bigint and numerics numeric; avg of
/// exact numbers numeric, of floats double.
pub(crate) fn aggregate_type(function: AggregateFunction, input: DataType) -> Result<DataType> {
    Ok(match (function, input) {
        (AggregateFunction::Count | AggregateFunction::CountStar, _) => DataType::Int64,
        (AggregateFunction::Min | AggregateFunction::Max, t) => t,
        (AggregateFunction::Sum, DataType::Int32 | DataType::Int16) => DataType::Int64,
        (AggregateFunction::Sum, DataType::Float32) => DataType::Float32,
        (AggregateFunction::Sum | AggregateFunction::Avg, DataType::Float64 | DataType::Float32) => DataType::Float64,
        (AggregateFunction::Sum | AggregateFunction::Avg, t) if t.is_numeric() => DataType::Numeric,
        (AggregateFunction::Sum | AggregateFunction::Avg, DataType::Interval) => {
            return Err(EngineError::unsupported(format!("{function:?} of interval")))
        }
        (f, t) => return Err(EngineError::Type(format!("{f:?} of {}", t.sql_name()))),
    })
}

pub(crate) fn function_args(function: &ast::Function) -> Result<Vec<&ast::Expr>> {
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

/// Whether an AST expression contains a subquery (iterative, as `contains_aggregate`).
pub fn contains_subquery_ast(expr: &ast::Expr) -> bool {
    use ast::Expr as E;
    let mut pending = vec![expr];
    while let Some(expr) = pending.pop() {
        match expr {
            E::Subquery(_) | E::Exists { .. } | E::InSubquery { .. } => return true,
            E::AnyOp { right, .. } | E::AllOp { right, .. } => pending.push(right),
            E::Function(f) => pending.extend(function_args(f).unwrap_or_default()),
            E::BinaryOp { left, right, .. } => pending.extend([left.as_ref(), right.as_ref()]),
            E::UnaryOp { expr, .. } | E::Nested(expr) | E::Cast { expr, .. } => pending.push(expr),
            E::IsNull(e) | E::IsNotNull(e) => pending.push(e),
            E::Between { expr, low, high, .. } => pending.extend([expr.as_ref(), low.as_ref(), high.as_ref()]),
            E::InList { expr, list, .. } => {
                pending.push(expr);
                pending.extend(list);
            }
            E::Case { operand, conditions, else_result, .. } => {
                pending.extend(operand.as_deref());
                pending.extend(conditions.iter().flat_map(|w| [&w.condition, &w.result]));
                pending.extend(else_result.as_deref());
            }
            _ => {}
        }
    }
    false
}

/// Whether an AST expression contains an aggregate call (outside subqueries). Iterative: the
/// expression may be a left-deep chain as long as the statement.
pub fn contains_aggregate(expr: &ast::Expr) -> bool {
    contains_call(expr, &|f| {
        f.over.is_none() && aggregate_function(&object_name(&f.name).unwrap_or_default()).is_some()
    })
}

/// Whether an AST expression contains a window function call (outside subqueries).
pub fn contains_window(expr: &ast::Expr) -> bool {
    contains_call(expr, &|f| f.over.is_some())
}

/// Whether a call `is_wanted` accepts occurs in the expression (outside subqueries).
fn contains_call(expr: &ast::Expr, is_wanted: &dyn Fn(&ast::Function) -> bool) -> bool {
    use ast::Expr as E;
    let mut pending = vec![expr];
    while let Some(expr) = pending.pop() {
        match expr {
            E::Function(f) => {
                if is_wanted(f) {
                    return true;
                }
                pending.extend(function_args(f).unwrap_or_default());
                if let Some(ast::WindowType::WindowSpec(spec)) = &f.over {
                    pending.extend(&spec.partition_by);
                    pending.extend(spec.order_by.iter().map(|o| &o.expr));
                }
            }
            E::BinaryOp { left, right, .. } => pending.extend([left.as_ref(), right.as_ref()]),
            E::UnaryOp { expr, .. } | E::Nested(expr) | E::Cast { expr, .. } => pending.push(expr),
            E::IsNull(e) | E::IsNotNull(e) => pending.push(e),
            E::Between { expr, low, high, .. } => pending.extend([expr.as_ref(), low.as_ref(), high.as_ref()]),
            E::InList { expr, list, .. } => {
                pending.push(expr);
                pending.extend(list);
            }
            E::Case { operand, conditions, else_result, .. } => {
                pending.extend(operand.as_deref());
                pending.extend(conditions.iter().flat_map(|w| [&w.condition, &w.result]));
                pending.extend(else_result.as_deref());
            }
            _ => {}
        }
    }
    false
}

fn expect_type(expr: &Expr, expected: DataType, what: &str) -> Result<()> {
    let text_like = expected == DataType::Text && expr.data_type().is_text();
    if expr.data_type() == expected || text_like || (expected == DataType::Bool && is_null_literal(expr)) {
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

/// A numeric constant typed as PostgreSQL types it: integer if it fits int4, bigint if it fits
/// int8, else (and whenever it has a fraction or an exponent) numeric.
pub fn number_literal(text: &str) -> Result<Expr> {
    if !text.contains(['.', 'e', 'E']) {
        if let Ok(v) = text.parse::<i32>() {
            return Ok(Expr::literal(Value::Int32(v), DataType::Int32));
        }
        if let Ok(v) = text.parse::<i64>() {
            return Ok(Expr::literal(Value::Int64(v), DataType::Int64));
        }
    }
    Ok(Expr::literal(Value::Numeric(Numeric::parse(text)?), DataType::Numeric))
}

/// Most nodes an expression the binder copies may have (BETWEEN, IN lists and CASE with an
/// operand compare one value several times): nested, the copies multiply, so without a bound a
/// few hundred bytes of SQL would build billions of nodes.
const COPIED_EXPR_NODES_MAX: usize = 100_000;

/// A copy of `expr`, refused with 54001 when it is larger than [`COPIED_EXPR_NODES_MAX`].
fn copy_bounded(expr: &Expr) -> Result<Expr> {
    let (mut pending, mut nodes) = (vec![expr], 0usize);
    while let Some(next) = pending.pop() {
        nodes += 1;
        if nodes > COPIED_EXPR_NODES_MAX {
            return Err(crate::depth::too_deep(format!(
                "an expression compared several times has more than {COPIED_EXPR_NODES_MAX} nodes"
            )));
        }
        pending.extend(next.children());
    }
    Ok(expr.clone())
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
        T::Int(_) | T::Integer(_) | T::Int4(_) => DataType::Int32,
        T::SmallInt(_) | T::Int2(_) => DataType::Int16,
        T::BigInt(_) | T::Int8(_) => DataType::Int64,
        T::Real | T::Float4 => DataType::Float32,
        // float(p): real for p ≤ 24, double precision up to 53 (PostgreSQL's rule).
        T::Float(ast::ExactNumberInfo::Precision(p)) if (1..=24).contains(p) => DataType::Float32,
        T::Float(ast::ExactNumberInfo::Precision(p)) if (25..=53).contains(p) => DataType::Float64,
        T::Float(ast::ExactNumberInfo::None) => DataType::Float64,
        T::Double(_) | T::DoublePrecision | T::Float8 => DataType::Float64,
        T::Date => DataType::Date,
        T::Timestamp(None | Some(6), ast::TimezoneInfo::None | ast::TimezoneInfo::WithoutTimeZone) => {
            DataType::Timestamp
        }
        T::Timestamp(None | Some(6), ast::TimezoneInfo::WithTimeZone | ast::TimezoneInfo::Tz) => {
            crate::datetime::check_time_zone()?;
            DataType::TimestampTz
        }
        T::Interval { fields: None, precision: None } => DataType::Interval,
        T::Text | T::String(None) => DataType::Text,
        T::Varchar(length) | T::CharacterVarying(length) => match character_length(length)? {
            Some(n) => DataType::Varchar(n),
            None => DataType::Text,
        },
        // character without a length is character(1).
        T::Char(length) | T::Character(length) => DataType::Char(character_length(length)?.unwrap_or(1)),
        // PostgreSQL's `name` (identifiers, and columns of its regression tables) compares as
        // text in the C collation, which is the engine's byte order.
        T::Custom(name, modifiers) if modifiers.is_empty() && name.to_string().eq_ignore_ascii_case("name") => {
            DataType::Text
        }
        T::Numeric(info) | T::Decimal(info) => match info {
            ast::ExactNumberInfo::PrecisionAndScale(p, s) if *p <= 18 && *s >= 0 && *s as u64 <= *p => {
                DataType::Decimal { precision: *p as u8, scale: *s as u8 }
            }
            ast::ExactNumberInfo::Precision(p) if *p <= 18 => DataType::Decimal { precision: *p as u8, scale: 0 },
            ast::ExactNumberInfo::None => DataType::Numeric,
            _ => return Err(EngineError::unsupported(format!("{data_type}: numeric with a precision above 18"))),
        },
        other => return Err(EngineError::unsupported(format!("type {other}"))),
    })
}

/// The n of character(n) / character varying(n) (PostgreSQL: 1 ..= 10,485,760).
fn character_length(length: &Option<ast::CharacterLength>) -> Result<Option<u32>> {
    match length {
        None => Ok(None),
        Some(ast::CharacterLength::IntegerLength { length, unit: None }) if (1..=10_485_760).contains(length) => {
            Ok(Some(*length as u32))
        }
        Some(ast::CharacterLength::IntegerLength { length: 0, .. }) => {
            Err(EngineError::Syntax("length for type character must be at least 1".into()))
        }
        Some(other) => Err(EngineError::unsupported(format!("character length {other}"))),
    }
}

/// `interval '1 year 2 mons'`, `interval '3' day`: a constant interval.
fn interval_literal(interval: &ast::Interval) -> Result<Expr> {
    let mut value = interval.value.as_ref();
    // The frame rewriting (frame_syntax) leaves offsets in parentheses.
    while let ast::Expr::Nested(inner) = value {
        value = inner;
    }
    let text = match value {
        ast::Expr::Value(ast::ValueWithSpan { value: ast::Value::SingleQuotedString(s), .. }) => s.clone(),
        ast::Expr::Value(ast::ValueWithSpan { value: ast::Value::Number(n, _), .. }) => n.clone(),
        other => return Err(EngineError::unsupported(format!("interval value {other}"))),
    };
    if interval.last_field.is_some()
        || interval.leading_precision.is_some()
        || interval.fractional_seconds_precision.is_some()
    {
        return Err(EngineError::unsupported(format!("interval qualifier in {interval}")));
    }
    let parsed = match &interval.leading_field {
        // A bare number takes the qualifier's unit: interval '3' day.
        Some(field) if text.trim().parse::<f64>().is_ok() => Interval::parse(&format!("{text} {field}"))?,
        Some(field) => return Err(EngineError::unsupported(format!("interval '{text}' {field}"))),
        None => Interval::parse(&text)?,
    };
    Ok(Expr::literal(Value::Interval(parsed), DataType::Interval))
}

/// EXTRACT(part FROM value) for the kinds of value that have the field (PostgreSQL 15: 0A000
/// for a unit the type lacks, such as hours of a date).
fn extract(part: DatePart, value: Expr) -> Result<Expr> {
    let data_type = value.data_type();
    let applies = match data_type {
        DataType::Date => part.applies(true, false),
        DataType::Timestamp => part.applies(false, false),
        DataType::TimestampTz => part.applies(false, true),
        DataType::Interval => part.applies_to_interval(),
        other => {
            return Err(EngineError::UndefinedFunction(format!(
                "function extract(unknown, {}) does not exist",
                other.sql_name()
            )))
        }
    };
    if !applies {
        return Err(EngineError::unsupported(format!("unit \"{}\" for type {}", part.name(), data_type.sql_name())));
    }
    fold(Expr::Extract { field: part, expr: Box::new(value) })
}

thread_local! {
    /// Nonzero while binding a CASE result that no row can reach (see `Binder::case`).
    static FOLDING_ERRORS_DEFERRED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Runs `bind` with folding errors deferred to execution when `deferred` (a CASE result that
/// is never evaluated then never raises them).
fn folding_errors_deferred<T>(deferred: bool, bind: impl FnOnce() -> Result<T>) -> Result<T> {
    if !deferred {
        return bind();
    }
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            FOLDING_ERRORS_DEFERRED.with(|d| d.set(d.get() - 1));
        }
    }
    FOLDING_ERRORS_DEFERRED.with(|d| d.set(d.get() + 1));
    let _restore = Restore;
    bind()
}

/// Folds an expression to a literal when it has no column references.
pub fn fold(expr: Expr) -> Result<Expr> {
    if expr.is_constant() && !matches!(expr, Expr::Literal { .. }) {
        let data_type = expr.data_type();
        return match evaluate_constant(&expr) {
            Ok(value) => Ok(Expr::literal(value, data_type)),
            Err(_) if FOLDING_ERRORS_DEFERRED.with(|d| d.get() > 0) => Ok(expr),
            Err(error) => Err(error),
        };
    }
    Ok(expr)
}

/// The type both operands of a comparison, a set operation or CASE branches are converted to
/// (PostgreSQL's numeric type promotion: int4 < int8 < numeric < float8).
pub fn common_type(a: DataType, b: DataType, _op: BinaryOp) -> Result<DataType> {
    use DataType as T;
    Ok(match (a, b) {
        (T::Decimal { .. }, T::Decimal { .. }) => {
            T::Decimal { precision: DECIMAL_PRECISION_MAX, scale: a.scale().max(b.scale()) }
        }
        _ if a == b => a,
        (T::Char(_), T::Char(_)) => T::Char(0),
        _ if a.is_text() && b.is_text() => T::Text,
        (T::Float64, t) | (t, T::Float64) if t.is_numeric() => T::Float64,
        // real with any other number: PostgreSQL picks the float4/float8 operators.
        (T::Float32, t) | (t, T::Float32) if t.is_numeric() => T::Float64,
        (T::Numeric, t) | (t, T::Numeric) if t.is_numeric() => T::Numeric,
        (T::Decimal { .. }, t) | (t, T::Decimal { .. }) if t.is_numeric() => {
            T::Decimal { precision: DECIMAL_PRECISION_MAX, scale: a.scale().max(b.scale()) }
        }
        (T::Int32 | T::Int16, T::Int64) | (T::Int64, T::Int32 | T::Int16) => T::Int64,
        (T::Int16, T::Int32) | (T::Int32, T::Int16) => T::Int32,
        (T::Date, T::Timestamp) | (T::Timestamp, T::Date) => T::Timestamp,
        (T::Date | T::Timestamp, T::TimestampTz) | (T::TimestampTz, T::Date | T::Timestamp) => T::TimestampTz,
        _ => return Err(EngineError::Type(format!("types {} and {} cannot be matched", a.sql_name(), b.sql_name()))),
    })
}

/// Converts expressions to their common type (PostgreSQL's select_common_type for CASE,
/// UNION, VALUES, IN): untyped literals take the others' type; all untyped ones are text.
pub fn unify(exprs: Vec<Expr>) -> Result<(Vec<Expr>, DataType)> {
    let mut target: Option<DataType> = None;
    for expr in exprs.iter().filter(|e| !is_untyped(e)) {
        target = Some(match target {
            None => expr.data_type(),
            Some(t) => common_type(t, expr.data_type(), BinaryOp::Eq)?,
        });
    }
    let mut target = target.unwrap_or(DataType::Text);
    // character(n) beside a string literal: PostgreSQL's bpchar without a length, where each
    // value keeps its own padding (the column's values padded to n, the literal as written).
    let literal = |e: &Expr| matches!(e, Expr::Literal { value: Value::Text(_), .. });
    if matches!(target, DataType::Char(_)) && exprs.iter().any(literal) {
        target = DataType::Char(0);
    }
    let exprs = exprs.into_iter().map(|e| cast_expr(e, target)).collect::<Result<Vec<_>>>()?;
    Ok((exprs, target))
}

/// An expression whose type PostgreSQL leaves open until context fixes it: a quoted string
/// literal (type `unknown`) or a bare NULL.
pub fn is_untyped(expr: &Expr) -> bool {
    matches!(expr, Expr::Literal { value: Value::Text(_) | Value::Null, .. })
}

/// Casts `expr` to `to`, folding constants (so `'1995-01-01'` next to a date is a date literal).
pub fn cast_expr(expr: Expr, to: DataType) -> Result<Expr> {
    let from = expr.data_type();
    if from == to {
        return Ok(expr);
    }
    // Internal coercions between decimals of one scale: precision is metadata only.
    if let (DataType::Decimal { scale: a, .. }, DataType::Decimal { scale: b, precision }) = (from, to) {
        if a == b && precision == DECIMAL_PRECISION_MAX {
            return Ok(expr);
        }
    }
    if is_null_literal(&expr) {
        return Ok(Expr::literal(Value::Null, to));
    }
    if let Expr::Literal { value: Value::Text(text), .. } = &expr {
        if record_parameter(text, to) {
            return Ok(Expr::literal(Value::Null, to));
        }
    }
    if !crate::cast::can_cast(from, to) {
        return Err(crate::cast::cannot_cast(from, to));
    }
    fold(Expr::Cast { expr: Box::new(expr), to })
}

/// A numeric constant that a scaled i64 holds exactly, as such a decimal (so `l_discount <
/// 0.07` and `price * 1.1` stay on the decimal fast path; the scale, and so the printed
/// result, is the literal's own, as in PostgreSQL).
fn as_decimal_constant(expr: &Expr) -> Option<Expr> {
    let Expr::Literal { value: Value::Numeric(n), .. } = expr else { return None };
    if n.scale > DECIMAL_PRECISION_MAX {
        return None;
    }
    let value = i64::try_from(n.mantissa).ok().filter(|v| v.unsigned_abs() < 10u64.pow(18))?;
    let data_type = DataType::Decimal { precision: DECIMAL_PRECISION_MAX, scale: n.scale };
    Some(Expr::literal(Value::Decimal { value, scale: n.scale }, data_type))
}

/// Fixes untyped operands from the other side and moves numeric constants next to decimal
/// or integer columns onto the decimal fast path.
/// character(n) and varchar(n) compare as text: character(n) values are held without their
/// insignificant trailing blanks, and an untyped literal compared with one loses its own (it
/// becomes character, as in PostgreSQL).
fn text_comparands(left: Expr, right: Expr) -> Result<(Expr, Expr)> {
    let (lt, rt) = (left.data_type(), right.data_type());
    let sized = |t: DataType| matches!(t, DataType::Char(_) | DataType::Varchar(_));
    if !sized(lt) && !sized(rt) {
        return Ok((left, right));
    }
    let as_text = |expr: Expr, other: DataType| -> Result<Expr> {
        if is_untyped(&expr) {
            let text = cast_expr(expr, DataType::Text)?;
            return match other {
                DataType::Char(_) => functions::call(ScalarFunction::Trim(TrimSide::Trailing), vec![text]),
                _ => Ok(text),
            };
        }
        let data_type = expr.data_type();
        if data_type.is_text() {
            let text = cast_expr(expr, DataType::Text)?;
            // varchar against character is compared as character (PostgreSQL casts it).
            return match (data_type, other) {
                (DataType::Varchar(_), DataType::Char(_)) => {
                    functions::call(ScalarFunction::Trim(TrimSide::Trailing), vec![text])
                }
                _ => Ok(text),
            };
        }
        Ok(expr)
    };
    Ok((as_text(left, rt)?, as_text(right, lt)?))
}

fn settle_operands(left: Expr, right: Expr) -> Result<(Expr, Expr)> {
    let (lt, rt) = (left.data_type(), right.data_type());
    if is_untyped(&left) && !is_untyped(&right) {
        return Ok((cast_expr(left, rt)?, right));
    }
    if is_untyped(&right) && !is_untyped(&left) {
        return Ok((left, cast_expr(right, lt)?));
    }
    let exact =
        |t: DataType| matches!(t, DataType::Decimal { .. } | DataType::Int16 | DataType::Int32 | DataType::Int64);
    if exact(lt) {
        if let Some(constant) = as_decimal_constant(&right) {
            return Ok((left, constant));
        }
    }
    if exact(rt) {
        if let Some(constant) = as_decimal_constant(&left) {
            return Ok((constant, right));
        }
    }
    Ok((left, right))
}

/// An untyped literal read as an interval where PostgreSQL's only candidate takes one:
/// `timestamp + '1 day'`, `interval ± '1 hour'` (`timestamp - '…'` reads a timestamp).
fn untyped_as_interval(op: BinaryOp, left: Expr, right: Expr) -> Result<(Expr, Expr)> {
    let takes_interval = |other: DataType| match other {
        DataType::Timestamp | DataType::TimestampTz => op == BinaryOp::Add,
        DataType::Interval => matches!(op, BinaryOp::Add | BinaryOp::Sub),
        _ => false,
    };
    if is_untyped(&right) && !is_untyped(&left) && takes_interval(left.data_type()) {
        return Ok((left, cast_expr(right, DataType::Interval)?));
    }
    if is_untyped(&left) && !is_untyped(&right) && takes_interval(right.data_type()) && op == BinaryOp::Add {
        return Ok((cast_expr(left, DataType::Interval)?, right));
    }
    Ok((left, right))
}

fn is_datetime_operand(t: DataType) -> bool {
    matches!(t, DataType::Date | DataType::Timestamp | DataType::TimestampTz | DataType::Interval)
}

/// PostgreSQL's operators over dates, timestamps and intervals: a date with an interval is
/// a timestamp, the difference of two timestamps an interval, intervals scale by numbers.
fn datetime_arithmetic(op: BinaryOp, left: Expr, right: Expr) -> Result<Expr> {
    use DataType as T;
    let (lt, rt) = (left.data_type(), right.data_type());
    let additive = matches!(op, BinaryOp::Add | BinaryOp::Sub);
    let as_timestamp = |e: Expr| if e.data_type() == T::Date { cast_expr(e, T::Timestamp) } else { Ok(e) };
    let expr = match (lt, rt) {
        (T::Date | T::Timestamp | T::TimestampTz, T::Interval) if additive => {
            let left = as_timestamp(left)?;
            let data_type = left.data_type();
            Expr::binary(op, left, right, data_type)
        }
        (T::Interval, T::Date | T::Timestamp | T::TimestampTz) if op == BinaryOp::Add => {
            let right = as_timestamp(right)?;
            let data_type = right.data_type();
            Expr::binary(op, right, left, data_type)
        }
        (T::Date | T::Timestamp | T::TimestampTz, T::Date | T::Timestamp | T::TimestampTz) if op == BinaryOp::Sub => {
            let target = common_type(lt, rt, op)?;
            Expr::binary(op, cast_expr(left, target)?, cast_expr(right, target)?, T::Interval)
        }
        (T::Interval, T::Interval) if additive => Expr::binary(op, left, right, T::Interval),
        (T::Interval, t) if t.is_numeric() && matches!(op, BinaryOp::Mul | BinaryOp::Div) => {
            Expr::binary(op, left, cast_expr(right, T::Float64)?, T::Interval)
        }
        (t, T::Interval) if t.is_numeric() && op == BinaryOp::Mul => {
            Expr::binary(op, right, cast_expr(left, T::Float64)?, T::Interval)
        }
        _ => return Err(undefined_operator(op, lt, rt)),
    };
    fold(expr)
}

fn undefined_operator(op: BinaryOp, left: DataType, right: DataType) -> EngineError {
    EngineError::UndefinedFunction(format!(
        "operator does not exist: {} {} {}",
        left.sql_name(),
        op.symbol(),
        right.sql_name()
    ))
}

pub fn comparison(op: BinaryOp, left: Expr, right: Expr) -> Result<Expr> {
    let (left, right) = text_comparands(left, right)?;
    let (left, right) = settle_operands(left, right)?;
    let (lt, rt) = (left.data_type(), right.data_type());
    if let Some(on_dates) = date_against_timestamp_constant(op, &left, &right) {
        return Ok(on_dates);
    }
    let target = common_type(lt, rt, op).map_err(|_| undefined_operator(op, lt, rt))?;
    let (left, right) = (cast_expr(left, target)?, cast_expr(right, target)?);
    fold(Expr::binary(op, left, right, DataType::Bool))
}

/// `date_column < timestamp '…'` compared as dates, so the column is not cast row by row
/// (TPC-H's `l_shipdate < date '1994-01-01' + interval '1' year` is such a bound): a date d
/// is below t exactly when d is below t's day rounded up, at most t when at most its day.
fn date_against_timestamp_constant(op: BinaryOp, left: &Expr, right: &Expr) -> Option<Expr> {
    let timestamp_constant = |e: &Expr| match e {
        Expr::Literal { value: Value::Timestamp(t), .. } => Some(*t),
        _ => None,
    };
    let (date, bound, op) = match (left.data_type(), right.data_type()) {
        (DataType::Date, DataType::Timestamp) => (left, timestamp_constant(right)?, op),
        (DataType::Timestamp, DataType::Date) => (right, timestamp_constant(left)?, op.flipped()),
        _ => return None,
    };
    let micros_per_day = crate::interval::MICROS_PER_DAY;
    let floor = i32::try_from(bound.div_euclid(micros_per_day)).ok()?;
    let on_midnight = bound.rem_euclid(micros_per_day) == 0;
    let ceiling = if on_midnight { floor } else { floor.checked_add(1)? };
    let day = match op {
        BinaryOp::Lt | BinaryOp::GtEq => ceiling,
        BinaryOp::LtEq | BinaryOp::Gt => floor,
        BinaryOp::Eq | BinaryOp::NotEq if on_midnight => floor,
        _ => return None,
    };
    let literal = Expr::literal(Value::Date(day), DataType::Date);
    fold(Expr::binary(op, date.clone(), literal, DataType::Bool)).ok()
}

pub fn arithmetic(op: BinaryOp, left: Expr, right: Expr) -> Result<Expr> {
    use DataType as T;
    let (left, right) = untyped_as_interval(op, left, right)?;
    let (left, right) = settle_operands(left, right)?;
    let (lt, rt) = (left.data_type(), right.data_type());
    let inexact = matches!(lt, T::Float64 | T::Float32) || matches!(rt, T::Float64 | T::Float32);
    let expr = match (lt, rt) {
        (T::Date, T::Int32) if matches!(op, BinaryOp::Add | BinaryOp::Sub) => Expr::binary(op, left, right, T::Date),
        (T::Int32, T::Date) if op == BinaryOp::Add => Expr::binary(op, right, left, T::Date),
        // Dates are day numbers: their difference is an integer of days.
        (T::Date, T::Date) if op == BinaryOp::Sub => Expr::binary(op, left, right, T::Int32),
        _ if is_datetime_operand(lt) || is_datetime_operand(rt) => return datetime_arithmetic(op, left, right),
        _ if !lt.is_numeric() || !rt.is_numeric() => return Err(undefined_operator(op, lt, rt)),
        // PostgreSQL divides numerics with at least 16 significant digits (`numeric` module).
        (T::Decimal { .. } | T::Numeric, _) | (_, T::Decimal { .. } | T::Numeric)
            if op == BinaryOp::Div && !inexact =>
        {
            Expr::binary(op, cast_expr(left, T::Numeric)?, cast_expr(right, T::Numeric)?, T::Numeric)
        }
        (T::Decimal { .. }, T::Decimal { .. } | T::Int16 | T::Int32 | T::Int64)
        | (T::Int16 | T::Int32 | T::Int64, T::Decimal { .. })
            if op == BinaryOp::Mul =>
        {
            let scale = lt.scale() + rt.scale();
            if scale > DECIMAL_PRECISION_MAX {
                let (l, r) = (cast_expr(left, T::Numeric)?, cast_expr(right, T::Numeric)?);
                return fold(Expr::binary(op, l, r, T::Numeric));
            }
            let as_decimal = |e: Expr| {
                let scale = e.data_type().scale();
                cast_expr(e, T::Decimal { precision: DECIMAL_PRECISION_MAX, scale })
            };
            Expr::binary(
                op,
                as_decimal(left)?,
                as_decimal(right)?,
                T::Decimal { precision: DECIMAL_PRECISION_MAX, scale },
            )
        }
        _ => {
            let target = common_type(lt, rt, op)?;
            Expr::binary(op, cast_expr(left, target)?, cast_expr(right, target)?, target)
        }
    };
    fold(expr)
}
