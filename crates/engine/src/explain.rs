//! EXPLAIN: the plan as a tree, cut into pipelines, each with the tier that runs it.
//!
//! A pipeline starts at its source (a scan or a breaker's materialized output) and runs
//! through filters, projections and join probes up to its sink (the next breaker or the
//! result). Build sides of joins and inputs of breakers are separate pipelines, run first.

use std::collections::HashMap;
use std::sync::Arc;

use crate::compiled::CompiledAggregate;
use crate::exec::Tier;
use crate::plan::{JoinKind, Plan, SharedPlan};

/// Renders a plan; `tier` is the tier the session asked for.
pub fn explain_plan(plan: &Plan, tier: Tier) -> String {
    let mut lines = Lines::default();
    let mut next_pipeline = 1;
    render(plan, tier, 0, &mut next_pipeline, None, &mut lines);
    lines.lines.join("\n")
}

/// The rendered lines, and the pipeline of each materialized CTE already shown (rendered
/// once, referred to after: a chain of CTEs each reading the one before twice would print
/// 2^n subtrees).
#[derive(Default)]
struct Lines {
    lines: Vec<String>,
    shown: HashMap<*const SharedPlan, usize>,
}

impl Lines {
    fn push(&mut self, line: String) {
        self.lines.push(line);
    }
}

fn render(plan: &Plan, tier: Tier, depth: usize, next: &mut usize, pipeline: Option<(usize, &str)>, lines: &mut Lines) {
    let indent = "  ".repeat(depth);
    let (pipeline_id, pipeline_tier) = match pipeline {
        Some(p) => p,
        None => {
            let id = *next;
            *next += 1;
            (id, "interpreted")
        }
    };
    let tag = |name: String| format!("{indent}{name}  [pipeline {pipeline_id}, {pipeline_tier}]");
    match plan {
        Plan::Scan { table, columns, filter } => {
            let names: Vec<&str> = columns.iter().map(|&c| table.schema[c].name.as_str()).collect();
            let filter = filter.as_ref().map_or(String::new(), |f| format!(" filter={f}"));
            lines.push(tag(format!("Scan {} columns=[{}]{filter}", table.name, names.join(", "))));
        }
        Plan::SingleRow => lines.push(tag("SingleRow".into())),
        Plan::Constant { batches, .. } => {
            lines.push(tag(format!("Constant rows={}", batches.iter().map(|b| b.rows).sum::<usize>())))
        }
        Plan::Filter { input, predicate } => {
            lines.push(tag(format!("Filter {predicate}")));
            render(input, tier, depth + 1, next, Some((pipeline_id, pipeline_tier)), lines);
        }
        Plan::Project { input, exprs } => {
            let items: Vec<String> = exprs.iter().map(|e| e.to_string()).collect();
            lines.push(tag(format!("Project [{}]", items.join(", "))));
            render(input, tier, depth + 1, next, Some((pipeline_id, pipeline_tier)), lines);
        }
        Plan::HashJoin { kind, probe, build, probe_keys, build_keys, residual } => {
            let keys: Vec<String> = probe_keys.iter().zip(build_keys).map(|(p, b)| format!("{p}={b}")).collect();
            let residual = residual.as_ref().map_or(String::new(), |r| format!(" residual={r}"));
            let plan_kind = *kind;
            let kind = match kind {
                JoinKind::Inner => "Inner",
                JoinKind::Left => "Left",
                JoinKind::Semi => "Semi",
                JoinKind::Anti => "Anti",
                JoinKind::NullAwareAnti => "NullAwareAnti",
                JoinKind::RightSemi => "RightSemi",
                JoinKind::RightAnti => "RightAnti",
            };
            lines.push(tag(format!("HashJoin {kind} probe [{}]{residual}", keys.join(", "))));
            if plan_kind.emits_build_rows() {
                // A breaker: the build side is hashed, the probe side streams to mark its rows.
                lines.push(format!("{indent}  build side (breaker):"));
                render(build, tier, depth + 2, next, None, lines);
                lines.push(format!("{indent}  probe side (marks build rows):"));
                render(probe, tier, depth + 2, next, None, lines);
                return;
            }
            render(probe, tier, depth + 1, next, Some((pipeline_id, pipeline_tier)), lines);
            lines.push(format!("{indent}  build side (breaker):"));
            render(build, tier, depth + 2, next, None, lines);
        }
        Plan::Aggregate { input, groups, aggregates } => {
            let compiled = tier == Tier::Compiled && CompiledAggregate::try_new(input, groups, aggregates).is_some();
            let items: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
            let calls: Vec<String> = aggregates
                .iter()
                .map(|a| {
                    let distinct = if a.distinct { "DISTINCT " } else { "" };
                    let argument = a.argument.as_ref().map_or("*".into(), |e| e.to_string());
                    let argument = a.second.as_ref().map_or(argument.clone(), |x| format!("{argument}, {x}"));
                    let filter = a.filter.as_ref().map_or(String::new(), |f| format!(" FILTER (WHERE {f})"));
                    format!("{:?}({distinct}{argument}){filter}", a.function)
                })
                .collect();
            lines.push(tag(format!("HashAggregate groups=[{}] aggregates=[{}]", items.join(", "), calls.join(", "))));
            let id = *next;
            *next += 1;
            let input_tier = if compiled { "compiled" } else { "interpreted" };
            render(input, tier, depth + 1, next, Some((id, input_tier)), lines);
        }
        Plan::Sort { input, keys, limit } => {
            let items: Vec<String> =
                keys.iter().map(|k| format!("{}{}", k.expr, if k.descending { " DESC" } else { "" })).collect();
            let name = if limit.is_some() { "TopK" } else { "Sort" };
            let limit = limit.map_or(String::new(), |l| format!(" limit={l}"));
            lines.push(tag(format!("{name} [{}]{limit}", items.join(", "))));
            render(input, tier, depth + 1, next, None, lines);
        }
        Plan::Limit { input, limit, offset } => {
            lines.push(tag(format!("Limit {limit:?} offset={offset}")));
            render(input, tier, depth + 1, next, None, lines);
        }
        Plan::Window { input, calls } => {
            let names: Vec<String> = calls.iter().map(|c| format!("{:?}", c.function)).collect();
            lines.push(tag(format!("Window [{}]", names.join(", "))));
            render(input, tier, depth + 1, next, None, lines);
        }
        Plan::Lateral { input, right, outer, condition, .. } => {
            let kind = if *outer { "Left" } else { "Inner" };
            let condition = condition.as_ref().map_or(String::new(), |c| format!(" on={c}"));
            lines.push(tag(format!("Lateral {kind}{condition} (right side runs per distinct parameter row)")));
            render(input, tier, depth + 1, next, None, lines);
            render(right, tier, depth + 1, next, None, lines);
        }
        Plan::Series { args, with_ordinality, .. } => {
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            let ordinality = if *with_ordinality { " WITH ORDINALITY" } else { "" };
            lines.push(tag(format!("Series generate_series({}){ordinality}", args.join(", "))));
        }
        Plan::SetOperation { op, all, left, right } => {
            lines.push(tag(format!("{}{}", op.sql_name(), if *all { " ALL" } else { "" })));
            render(left, tier, depth + 1, next, None, lines);
            render(right, tier, depth + 1, next, None, lines);
        }
        Plan::Shared(inner) if inner.materialized() => match lines.shown.get(&Arc::as_ptr(inner)) {
            Some(&shown) => lines.push(tag(format!("CTE Scan (the rows of pipeline {shown})"))),
            None => {
                lines.push(tag("CTE Scan (materialized: runs once)".into()));
                lines.shown.insert(Arc::as_ptr(inner), *next);
                render(inner, tier, depth + 1, next, None, lines);
            }
        },
        Plan::Shared(inner) => render(inner, tier, depth, next, Some((pipeline_id, pipeline_tier)), lines),
    }
}
