//! Binding window function calls (`f(args) OVER (PARTITION BY … ORDER BY … frame)`): PostgreSQL's
//! signatures, the frame, and a placeholder column for the call in the select list.
//!
//! Supported: row_number, rank, dense_rank, percent_rank, cume_dist, ntile, lag, lead,
//! first_value, last_value, nth_value, and sum/avg/count/min/max over ROWS, RANGE and GROUPS
//! frames with any bounds (RANGE offsets over integer, float and numeric keys) and EXCLUDE
//! (which reaches the binder as a marker in PARTITION BY, see `frame_syntax`); named windows
//! (WINDOW w AS …, OVER w, OVER (w ORDER BY …)). Refused (0A000): DISTINCT/FILTER/ORDER BY
//! inside the call.

use std::cell::RefCell;

use sqlparser::ast;

use crate::bind::{
    aggregate_function, aggregate_type, cast_expr, function_args, object_name, unify, AggregateContext, ExprBinder,
};
use crate::error::{EngineError, Result};
use crate::expr::{evaluate_constant, Expr};
use crate::interval::Interval;
use crate::plan::{
    AggregateFunction, FrameBound, FrameExclusion, FrameOffset, FrameUnits, SortKey, WindowCall, WindowFrame,
    WindowFunction, WINDOW_COLUMN_BASE,
};
use crate::types::{DataType, Value};

/// A select list's window calls and the block's named windows (its WINDOW clause).
pub struct WindowContext<'a> {
    pub calls: RefCell<Vec<WindowCall>>,
    pub named: &'a [ast::NamedWindowDefinition],
}

impl WindowContext<'_> {
    /// The window a call uses: its own specification, or a named one, or a named one with an
    /// ORDER BY and frame added (PostgreSQL's rules for copying a window).
    fn resolve(&self, spec: &ast::WindowSpec, depth: usize) -> Result<ast::WindowSpec> {
        let Some(base_name) = &spec.window_name else { return Ok(spec.clone()) };
        let base = self.named_window(base_name, depth)?;
        let name = &base_name.value;
        let (markers, own_partition): (Vec<ast::Expr>, Vec<ast::Expr>) =
            spec.partition_by.iter().cloned().partition(|e| exclusion_marker(e).is_some());
        if !own_partition.is_empty() {
            return Err(EngineError::Windowing(format!("cannot override PARTITION BY clause of window \"{name}\"")));
        }
        if !spec.order_by.is_empty() && !base.order_by.is_empty() {
            return Err(EngineError::Windowing(format!("cannot override ORDER BY clause of window \"{name}\"")));
        }
        if base.window_frame.is_some() {
            return Err(EngineError::Windowing(format!("cannot copy window \"{name}\" because it has a frame clause")));
        }
        let order_by = if spec.order_by.is_empty() { base.order_by } else { spec.order_by.clone() };
        Ok(ast::WindowSpec {
            window_name: None,
            partition_by: base.partition_by.into_iter().chain(markers).collect(),
            order_by,
            window_frame: spec.window_frame.clone(),
        })
    }

    fn named_window(&self, name: &ast::Ident, depth: usize) -> Result<ast::WindowSpec> {
        let wanted = crate::bind::identifier(name);
        let definition = self
            .named
            .iter()
            .find(|d| crate::bind::identifier(&d.0) == wanted)
            .ok_or_else(|| EngineError::UnknownObject(format!("window \"{wanted}\" does not exist")))?;
        if self.named.iter().filter(|d| crate::bind::identifier(&d.0) == wanted).count() > 1 {
            return Err(EngineError::Windowing(format!("window \"{wanted}\" is already defined")));
        }
        if depth > self.named.len() {
            return Err(EngineError::Windowing(format!("window \"{wanted}\" refers to itself")));
        }
        match &definition.1 {
            ast::NamedWindowExpr::WindowSpec(spec) => self.resolve(spec, depth + 1),
            ast::NamedWindowExpr::NamedWindow(other) => self.named_window(other, depth + 1),
        }
    }
}

impl ExprBinder<'_> {
    /// A window function call: recorded in the select list's calls, bound as their placeholder.
    pub(crate) fn window(
        &self,
        function: &ast::Function,
        context: &mut Option<&mut AggregateContext<'_>>,
    ) -> Result<Expr> {
        let name = object_name(&function.name)?;
        let Some(windows) = self.windows else {
            return Err(EngineError::Windowing(format!("window function {name} is not allowed here")));
        };
        let spec = match &function.over {
            Some(ast::WindowType::WindowSpec(spec)) => windows.resolve(spec, 0)?,
            Some(ast::WindowType::NamedWindow(name)) => windows.named_window(name, 0)?,
            None => return Err(EngineError::Syntax(format!("{name} without OVER"))),
        };
        let (partition_by, exclusion) = split_exclusion(&spec.partition_by)?;
        let spec = &spec;
        check_call_modifiers(function, &name)?;
        // Arguments and keys are bound like the select list (over the aggregate's output in an
        // aggregated query); a window call inside them is an error.
        let inner = ExprBinder { windows: None, ..*self };
        let star = matches!(&function.args, ast::FunctionArguments::List(list)
            if matches!(list.args.as_slice(), [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Wildcard)]));
        let args = if star { Vec::new() } else { function_args(function)? };
        let args = args.into_iter().map(|a| inner.nested(a, context)).collect::<Result<Vec<_>>>()?;
        let partition = partition_by.iter().map(|e| inner.nested(e, context)).collect::<Result<Vec<_>>>()?;
        let mut order = Vec::with_capacity(spec.order_by.len());
        for (expr, descending, nulls_first) in crate::query::order_items(&spec.order_by)? {
            order.push(SortKey { expr: inner.nested(expr, context)?, descending, nulls_first });
        }
        let (function, args, data_type) = signature(&name, args, star)?;
        let frame = frame(spec.window_frame.as_ref(), &order, exclusion)?;
        let call = WindowCall { function, args, partition, order, frame, data_type };
        let mut calls = windows.calls.borrow_mut();
        let index = match calls.iter().position(|c| *c == call) {
            Some(index) => index,
            None => {
                calls.push(call);
                calls.len() - 1
            }
        };
        Ok(Expr::Column { index: WINDOW_COLUMN_BASE + index, data_type })
    }

    /// An argument or key of a window call: a nested window call is PostgreSQL's 42P20.
    fn nested(&self, expr: &ast::Expr, context: &mut Option<&mut AggregateContext<'_>>) -> Result<Expr> {
        self.bind_in(expr, context).map_err(|error| match error {
            EngineError::Windowing(_) => EngineError::Windowing("window function calls cannot be nested".into()),
            other => other,
        })
    }
}

impl Clone for ExprBinder<'_> {
    fn clone(&self) -> Self {
        *self
    }
}

impl Copy for ExprBinder<'_> {}

fn check_call_modifiers(function: &ast::Function, name: &str) -> Result<()> {
    let clauses = matches!(&function.args, ast::FunctionArguments::List(list) if !list.clauses.is_empty());
    let distinct = matches!(&function.args, ast::FunctionArguments::List(list)
        if list.duplicate_treatment == Some(ast::DuplicateTreatment::Distinct));
    if distinct {
        return Err(EngineError::unsupported(format!("DISTINCT in window function {name}")));
    }
    if clauses || function.filter.is_some() || !function.within_group.is_empty() || function.null_treatment.is_some() {
        return Err(EngineError::unsupported(format!("ORDER BY, FILTER or IGNORE NULLS in window function {name}")));
    }
    Ok(())
}

/// The function, its arguments converted to PostgreSQL's parameter types, and its result type.
fn signature(name: &str, args: Vec<Expr>, star: bool) -> Result<(WindowFunction, Vec<Expr>, DataType)> {
    use WindowFunction as W;
    let count = args.len();
    let arity = |n: std::ops::RangeInclusive<usize>| -> Result<()> {
        if n.contains(&count) {
            Ok(())
        } else {
            Err(EngineError::UndefinedFunction(format!("function {name} with {count} arguments does not exist")))
        }
    };
    let ranking = match name {
        "row_number" => Some((W::RowNumber, DataType::Int64)),
        "rank" => Some((W::Rank, DataType::Int64)),
        "dense_rank" => Some((W::DenseRank, DataType::Int64)),
        "percent_rank" => Some((W::PercentRank, DataType::Float64)),
        "cume_dist" => Some((W::CumeDist, DataType::Float64)),
        _ => None,
    };
    if let Some((function, data_type)) = ranking {
        arity(0..=0)?;
        return Ok((function, args, data_type));
    }
    let mut args = args;
    match name {
        "ntile" => {
            arity(1..=1)?;
            let buckets = cast_expr(args.remove(0), DataType::Int32)?;
            Ok((W::Ntile, vec![buckets], DataType::Int32))
        }
        "lag" | "lead" => {
            arity(1..=3)?;
            let function = if name == "lag" { W::Lag } else { W::Lead };
            if args.len() >= 2 {
                args[1] = cast_expr(args[1].clone(), DataType::Int32)?;
            }
            if args.len() == 3 {
                let default = args.pop().expect("three arguments");
                let value = args.remove(0);
                let (mut unified, data_type) = unify(vec![value, default])?;
                let default = unified.pop().expect("two");
                let value = unified.pop().expect("one");
                let offset = args.pop().expect("the offset");
                return Ok((function, vec![value, offset, default], data_type));
            }
            let data_type = args[0].data_type();
            Ok((function, args, data_type))
        }
        "first_value" | "last_value" => {
            arity(1..=1)?;
            let data_type = args[0].data_type();
            Ok((if name == "first_value" { W::FirstValue } else { W::LastValue }, args, data_type))
        }
        "nth_value" => {
            arity(2..=2)?;
            args[1] = cast_expr(args[1].clone(), DataType::Int32)?;
            let data_type = args[0].data_type();
            Ok((W::NthValue, args, data_type))
        }
        _ => {
            let Some(kind) = aggregate_function(name) else {
                return Err(EngineError::unsupported(format!("window function {name}")));
            };
            if star {
                return match kind {
                    AggregateFunction::Count => {
                        Ok((W::Aggregate(AggregateFunction::CountStar), Vec::new(), DataType::Int64))
                    }
                    _ => Err(EngineError::Syntax(format!("{name}(*) is only valid for count"))),
                };
            }
            if let AggregateFunction::Ordered(_) = kind {
                return Err(EngineError::unsupported(format!("{name} as a window function")));
            }
            if let AggregateFunction::Statistic(statistic) = kind {
                let (args, data_type) = statistic.bind(name, args)?;
                return Ok((W::Aggregate(kind), args, data_type));
            }
            arity(1..=1)?;
            crate::bind::boolean_input(name, args[0].data_type())?;
            let data_type = aggregate_type(kind, args[0].data_type())?;
            Ok((W::Aggregate(kind), args, data_type))
        }
    }
}

/// PARTITION BY without the EXCLUDE marker, and the exclusion it names.
fn split_exclusion(partition_by: &[ast::Expr]) -> Result<(Vec<&ast::Expr>, FrameExclusion)> {
    let mut exclusion = FrameExclusion::NoOthers;
    let mut rest = Vec::with_capacity(partition_by.len());
    for expr in partition_by {
        match exclusion_marker(expr) {
            Some(marked) => exclusion = marked,
            None => rest.push(expr),
        }
    }
    Ok((rest, exclusion))
}

fn exclusion_marker(expr: &ast::Expr) -> Option<FrameExclusion> {
    match expr {
        ast::Expr::Identifier(ident) if ident.quote_style == Some('"') => {
            crate::frame_syntax::exclusion_of_marker(&ident.value)
        }
        _ => None,
    }
}

/// The frame clause (PostgreSQL's default when absent), checked against the ORDER BY keys.
fn frame(frame: Option<&ast::WindowFrame>, order: &[SortKey], exclusion: FrameExclusion) -> Result<WindowFrame> {
    let Some(frame) = frame else { return Ok(WindowFrame { exclusion, ..WindowFrame::DEFAULT }) };
    let units = match frame.units {
        ast::WindowFrameUnits::Rows => FrameUnits::Rows,
        ast::WindowFrameUnits::Range => FrameUnits::Range,
        ast::WindowFrameUnits::Groups => FrameUnits::Groups,
    };
    if units == FrameUnits::Groups && order.is_empty() {
        return Err(EngineError::Windowing("GROUPS mode requires an ORDER BY clause".into()));
    }
    let start = bound(&frame.start_bound, units, order, "starting")?;
    let end = match &frame.end_bound {
        Some(end) => bound(end, units, order, "ending")?,
        None => FrameBound::CurrentRow,
    };
    if start == FrameBound::UnboundedFollowing {
        return Err(EngineError::Windowing("frame start cannot be UNBOUNDED FOLLOWING".into()));
    }
    if end == FrameBound::UnboundedPreceding {
        return Err(EngineError::Windowing("frame end cannot be UNBOUNDED PRECEDING".into()));
    }
    let following_start = matches!(start, FrameBound::Following(_));
    if following_start && matches!(end, FrameBound::CurrentRow | FrameBound::Preceding(_)) {
        return Err(EngineError::Windowing("frame starting from following row cannot end with current row".into()));
    }
    if start == FrameBound::CurrentRow && matches!(end, FrameBound::Preceding(_)) {
        return Err(EngineError::Windowing("frame starting from current row cannot have preceding rows".into()));
    }
    Ok(WindowFrame { units, start, end, exclusion })
}

fn bound(bound: &ast::WindowFrameBound, units: FrameUnits, order: &[SortKey], which: &str) -> Result<FrameBound> {
    let offset = |expr: &ast::Expr| -> Result<FrameOffset> {
        match units {
            FrameUnits::Range => range_distance(expr, order, which),
            FrameUnits::Rows | FrameUnits::Groups => frame_count(expr, which),
        }
    };
    Ok(match bound {
        ast::WindowFrameBound::CurrentRow => FrameBound::CurrentRow,
        ast::WindowFrameBound::Preceding(None) => FrameBound::UnboundedPreceding,
        ast::WindowFrameBound::Following(None) => FrameBound::UnboundedFollowing,
        ast::WindowFrameBound::Preceding(Some(n)) => FrameBound::Preceding(offset(n)?),
        ast::WindowFrameBound::Following(Some(n)) => FrameBound::Following(offset(n)?),
    })
}

/// A frame offset is a constant: bound without columns and evaluated once.
fn constant_offset(expr: &ast::Expr) -> Result<Expr> {
    let scope = crate::bind::Scope::default();
    ExprBinder::new(&scope).bind(expr)
}

/// A ROWS or GROUPS offset: a bigint that is neither NULL nor negative.
fn frame_count(expr: &ast::Expr, which: &str) -> Result<FrameOffset> {
    match evaluate_constant(&cast_expr(constant_offset(expr)?, DataType::Int64)?)? {
        Value::Int64(n) if n >= 0 => Ok(FrameOffset::Count(n as u64)),
        Value::Null => {
            Err(EngineError::FrameOffset { message: format!("frame {which} offset must not be null"), null: true })
        }
        _ => {
            Err(EngineError::FrameOffset { message: format!("frame {which} offset must not be negative"), null: false })
        }
    }
}

/// The RANGE offset of a date or timestamp key: an interval constant (`'1 year'::interval`, `interval
/// '1 year'`, or an untyped string, which PostgreSQL reads as the interval in_range takes),
/// neither NULL nor negative.
fn interval_distance(expr: &ast::Expr) -> Result<Interval> {
    // The frame rewriting (frame_syntax) leaves offsets in parentheses.
    fn unnested(mut expr: &ast::Expr) -> &ast::Expr {
        while let ast::Expr::Nested(inner) = expr {
            expr = inner;
        }
        expr
    }
    let string = |e: &ast::Expr| match unnested(e) {
        ast::Expr::Value(ast::ValueWithSpan { value: ast::Value::SingleQuotedString(s), .. }) => Some(s.clone()),
        _ => None,
    };
    let text = match unnested(expr) {
        ast::Expr::Cast { expr, data_type: ast::DataType::Interval { fields: None, precision: None }, .. } => {
            string(expr)
        }
        ast::Expr::Interval(ast::Interval {
            value,
            leading_field: None,
            leading_precision: None,
            last_field: None,
            fractional_seconds_precision: None,
        }) => string(value),
        other => string(other),
    };
    let Some(text) = text else {
        return Err(EngineError::unsupported(format!(
            "RANGE offset {expr} over a date or timestamp (only interval constants are supported)"
        )));
    };
    let interval = Interval::parse(&text)?;
    if interval.is_negative() {
        return Err(EngineError::FrameOffset {
            message: "invalid preceding or following size in window function".into(),
            null: false,
        });
    }
    Ok(interval)
}

/// A RANGE offset: a distance in the one ORDER BY key's type (PostgreSQL's in_range
/// signatures: integers by a bigint, floats by a double, numeric by a numeric).
fn range_distance(expr: &ast::Expr, order: &[SortKey], which: &str) -> Result<FrameOffset> {
    let [key] = order else {
        return Err(EngineError::Windowing(
            "RANGE with offset PRECEDING/FOLLOWING requires exactly one ORDER BY column".into(),
        ));
    };
    match key.expr.data_type() {
        DataType::Date => return interval_distance(expr).map(FrameOffset::Interval),
        DataType::Timestamp | DataType::TimestampTz => {
            return interval_distance(expr).map(FrameOffset::TimestampInterval)
        }
        _ => {}
    }
    let offset = constant_offset(expr)?;
    let (key_type, offset_type) = (key.expr.data_type(), offset.data_type());
    let integer = |t: DataType| matches!(t, DataType::Int16 | DataType::Int32 | DataType::Int64);
    let exact = |t: DataType| integer(t) || matches!(t, DataType::Decimal { .. } | DataType::Numeric);
    let unknown = offset_type.is_text();
    let target = match key_type {
        t if integer(t) && (integer(offset_type) || unknown) => Some(DataType::Int64),
        DataType::Float32 | DataType::Float64 if offset_type.is_numeric() || unknown => Some(DataType::Float64),
        DataType::Decimal { .. } | DataType::Numeric if exact(offset_type) || unknown => Some(DataType::Numeric),
        _ => None,
    };
    let Some(target) = target else {
        return Err(EngineError::unsupported(format!(
            "RANGE with offset PRECEDING/FOLLOWING for column type {} and offset type {}",
            key_type.sql_name(),
            offset_type.sql_name()
        )));
    };
    let value = evaluate_constant(&cast_expr(offset, target)?)?;
    let negative = match &value {
        Value::Null => {
            return Err(EngineError::FrameOffset {
                message: format!("frame {which} offset must not be null"),
                null: true,
            })
        }
        Value::Int64(n) => *n < 0,
        Value::Float64(f) => f.is_nan() || *f < 0.0,
        // in_range_numeric_numeric rejects NaN too (-Infinity is negative).
        Value::Numeric(n) => n.signum() < 0 || n.is_nan(),
        other => return Err(EngineError::Runtime(format!("RANGE offset {other:?}"))),
    };
    if negative {
        return Err(EngineError::FrameOffset {
            message: "invalid preceding or following size in window function".into(),
            null: false,
        });
    }
    Ok(FrameOffset::Distance(value))
}
