//! Join planning: pushes single-relation predicates into scans, adds the equalities implied
//! by transitivity, then picks the join tree with the least estimated intermediate rows by
//! dynamic programming over connected splits (greedily — the connected pair with the smallest
//! estimated result — beyond 10 relations or for cross joins), the smaller input as the build
//! side. Filter selectivities are measured on a sample of the table (no stale
//! statistics to keep), distinct counts come from the table (cached).

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{EngineError, Result};
use crate::expr::{conjunction, disjunction, evaluate, BinaryOp, Expr};
use crate::plan::{JoinKind, Plan, SetOperator};
use crate::storage::Table;
use crate::vector::{scan_chunk, Data};

/// Rows per sampled chunk when estimating a filter's selectivity.
const SAMPLE_ROWS_PER_CHUNK: usize = 2048;
/// Chunks sampled (evenly spaced) per table.
const SAMPLE_CHUNKS_MAX: usize = 4;
/// Relations per query block (bitsets are u64).
pub const RELATIONS_MAX: usize = 64;

/// What a relation in FROM reads from.
pub enum RelationSource {
    Table(Arc<Table>),
    /// A derived table (subquery in FROM): its plan and output width.
    Derived(Plan),
}

/// A relation to join, with its columns' place in the wide row.
pub struct JoinInput {
    pub source: RelationSource,
    /// The wide-row columns the source outputs, in its order (ascending): a range for a
    /// relation; for a LATERAL join, its left relations' columns and then its own.
    pub columns: Vec<usize>,
}

impl JoinInput {
    /// A relation whose `width` columns start at wide column `offset`.
    pub fn range(source: RelationSource, offset: usize, width: usize) -> JoinInput {
        JoinInput { source, columns: (offset..offset + width).collect() }
    }
}

/// A sub-plan with the wide-row columns it outputs (in order) and its estimated size.
pub struct Planned {
    pub plan: Plan,
    pub layout: Vec<usize>,
    pub relations: u64,
    pub rows: f64,
    distinct: HashMap<usize, DistinctValues>,
}

/// Distinct values of an output column, counted from its table only when a join estimate asks
/// (a plain scan never does: counting every column of a large table took ~0.5 s on the first
/// query of each table version), capped by the joins below the column's current plan.
#[derive(Clone)]
struct DistinctValues {
    table: Arc<Table>,
    column: usize,
    cap: f64,
}

impl DistinctValues {
    fn count(&self) -> f64 {
        (self.table.distinct_count(self.column) as f64).min(self.cap)
    }
}

impl Planned {
    pub fn with_layout(plan: Plan, layout: Vec<usize>, rows: f64) -> Planned {
        Planned { plan, layout, relations: 0, rows, distinct: HashMap::new() }
    }

    pub fn from_plan(plan: Plan, rows: f64) -> Planned {
        let width = plan.width();
        Planned::with_layout(plan, (0..width).collect(), rows)
    }

    /// Rewrites a wide-row expression over this plan's output columns.
    pub fn localize(&self, expr: &Expr) -> Expr {
        let positions: HashMap<usize, usize> = self.layout.iter().enumerate().map(|(i, &w)| (w, i)).collect();
        expr.map_columns(&|wide| *positions.get(&wide).expect("expression columns are in the layout"))
    }

    pub fn add_filter(&mut self, predicate: &Expr, selectivity: f64) {
        self.add_filters(std::slice::from_ref(predicate), selectivity);
    }

    /// Adds wide-row predicates to the scan's or the top filter's condition, one balanced
    /// conjunction (a query may have thousands of conditions); `selectivity` is per predicate.
    pub fn add_filters(&mut self, predicates: &[Expr], selectivity: f64) {
        if predicates.is_empty() {
            return;
        }
        let added: Vec<Expr> = predicates.iter().map(|p| self.localize(p)).collect();
        let combine = |existing: Option<Expr>, added: Vec<Expr>| {
            let mut conjuncts = Vec::new();
            if let Some(existing) = existing {
                split_conjuncts(existing, &mut conjuncts);
            }
            conjuncts.extend(added);
            conjunction(conjuncts).expect("at least one predicate")
        };
        let input = std::mem::replace(&mut self.plan, Plan::SingleRow);
        self.plan = match input {
            Plan::Scan { table, columns, filter } => {
                Plan::Scan { table, columns, filter: Some(combine(filter, added)) }
            }
            Plan::Filter { input, predicate } => Plan::Filter { input, predicate: combine(Some(predicate), added) },
            other => Plan::Filter { input: Box::new(other), predicate: combine(None, added) },
        };
        let exponent = i32::try_from(predicates.len()).unwrap_or(i32::MAX);
        self.rows = (self.rows * selectivity.powi(exponent)).max(1.0);
    }

    fn distinct(&self, expr: &Expr) -> f64 {
        match expr {
            Expr::Column { index, .. } => {
                self.distinct.get(index).map_or(self.rows, DistinctValues::count).min(self.rows)
            }
            _ => self.rows,
        }
    }
}

/// A conjunct of WHERE/ON over the wide row, with the relations it touches.
#[derive(Clone)]
pub struct Conjunct {
    pub expr: Expr,
    pub relations: u64,
}

pub fn relation_set(expr: &Expr, inputs: &[JoinInput]) -> u64 {
    expr.columns().iter().fold(0u64, |set, &column| {
        let relation =
            inputs.iter().position(|r| r.columns.binary_search(&column).is_ok()).expect("column within the scope");
        set | (1 << relation)
    })
}

/// Scans each relation with its pushed-down filters and only the `used` columns.
pub fn plan_relation(index: usize, input: JoinInput, used: &[bool], filters: &[Expr]) -> Result<Planned> {
    let JoinInput { source, columns: wide } = input;
    let mut planned = match source {
        RelationSource::Table(table) => {
            let mut columns: Vec<usize> = (0..wide.len()).filter(|&c| used[wide[c]]).collect();
            if columns.is_empty() && !wide.is_empty() {
                columns.push(0); // COUNT(*) still needs row counts
            }
            let layout = columns.iter().map(|&c| wide[c]).collect();
            let distinct = columns
                .iter()
                .map(|&c| (wide[c], DistinctValues { table: Arc::clone(&table), column: c, cap: f64::INFINITY }))
                .collect();
            let rows = table.rows() as f64;
            Planned { plan: Plan::Scan { table, columns, filter: None }, layout, relations: 1 << index, rows, distinct }
        }
        RelationSource::Derived(plan) => {
            Planned { rows: estimate_rows(&plan), plan, layout: wide, relations: 1 << index, distinct: HashMap::new() }
        }
    };
    let unfiltered_rows = planned.rows;
    planned.add_filters(filters, 1.0);
    if !filters.is_empty() {
        // The conjuncts are estimated together, not multiplied: `d >= x and d < y` on one
        // column is far from independent (TPC-H Q10's quarter of orders came out 6× too big
        // and took the build side from the smaller input).
        let selectivity = scan_selectivity(&planned).unwrap_or((1.0f64 / 3.0).powi(filters.len() as i32));
        planned.rows = (unfiltered_rows * selectivity).max(1.0);
    }
    Ok(planned)
}

/// Rough output rows of a plan: table sizes, sampled scan filters, 1/3 per other filter,
/// foreign-key joins, group counts from the tables' distinct counts.
pub fn estimate_rows(plan: &Plan) -> f64 {
    match plan {
        Plan::Scan { table, columns, filter } => {
            let rows = table.rows() as f64;
            match filter {
                Some(predicate) if !predicate.contains_subquery() => {
                    (rows * sampled_selectivity(table, columns, predicate)).max(1.0)
                }
                Some(_) => (rows / 3.0).max(1.0),
                None => rows,
            }
        }
        Plan::SingleRow => 1.0,
        Plan::Constant { batches, .. } => batches.iter().map(|b| b.rows).sum::<usize>().max(1) as f64,
        Plan::Filter { input, .. } => (estimate_rows(input) / 3.0).max(1.0),
        Plan::Project { input, .. } => estimate_rows(input),
        Plan::HashJoin { kind, probe, build, .. } => match kind {
            JoinKind::Inner | JoinKind::Left => estimate_rows(probe).max(estimate_rows(build)),
            JoinKind::RightSemi | JoinKind::RightAnti => (estimate_rows(build) / 2.0).max(1.0),
            JoinKind::Semi | JoinKind::Anti | JoinKind::NullAwareAnti => (estimate_rows(probe) / 2.0).max(1.0),
        },
        Plan::Aggregate { input, groups, .. } => {
            let rows = estimate_rows(input);
            if groups.is_empty() {
                return 1.0;
            }
            let distinct: Option<f64> = groups.iter().map(|g| distinct_values(input, g)).product();
            distinct.unwrap_or(rows / 10.0).min(rows).max(1.0)
        }
        Plan::Sort { input, limit, .. } => limit.map_or(estimate_rows(input), |l| estimate_rows(input).min(l as f64)),
        Plan::Limit { input, limit, .. } => limit.map_or(estimate_rows(input), |l| estimate_rows(input).min(l as f64)),
        Plan::Window { input, .. } => estimate_rows(input),
        // A guess: PostgreSQL's default of 1000 rows per function call is as blind.
        Plan::Series { .. } => 1000.0,
        Plan::Lateral { input, right, .. } => estimate_rows(input) * estimate_rows(right),
        Plan::Shared(inner) => *inner.estimated_rows.get_or_init(|| estimate_rows(&inner.plan)),
        Plan::SetOperation { op, left, right, .. } => match op {
            SetOperator::Union => estimate_rows(left) + estimate_rows(right),
            SetOperator::Intersect | SetOperator::Except => estimate_rows(left),
        },
    }
}

/// Groups an aggregate over `input` grouped by `groups` is expected to make, from distinct
/// counts already known (None when a key is not a table column or its count was never asked
/// for: counting a large column would cost more than a growing table).
pub fn estimate_groups(input: &Plan, groups: &[Expr]) -> Option<f64> {
    let distinct = groups.iter().map(|g| known_distinct_values(input, g)).product::<Option<f64>>()?;
    Some(distinct.min(estimate_rows(input)).max(1.0))
}

fn known_distinct_values(plan: &Plan, expr: &Expr) -> Option<f64> {
    let Expr::Column { index, .. } = expr else { return None };
    match plan {
        Plan::Scan { table, columns, .. } => table.known_distinct_count(columns[*index]).map(|d| d as f64),
        Plan::Filter { input, .. } => known_distinct_values(input, expr),
        Plan::Project { input, exprs } => known_distinct_values(input, &exprs[*index]),
        _ => None,
    }
}

/// Distinct values of a column expression, when it is a table column (through filters and
/// projections).
fn distinct_values(plan: &Plan, expr: &Expr) -> Option<f64> {
    let Expr::Column { index, .. } = expr else { return None };
    match plan {
        Plan::Scan { table, columns, .. } => Some(table.distinct_count(columns[*index]) as f64),
        Plan::Filter { input, .. } => distinct_values(input, expr),
        Plan::Project { input, exprs } => distinct_values(input, &exprs[*index]),
        Plan::Shared(inner) => distinct_values(inner, expr),
        _ => None,
    }
}

/// Fraction of sampled rows passing a table scan's whole filter (None when the input is not a
/// filtered table scan; 1/3 when the sample cannot be evaluated).
fn scan_selectivity(planned: &Planned) -> Option<f64> {
    let Plan::Scan { table, columns, filter: Some(predicate) } = &planned.plan else {
        return None;
    };
    Some(sampled_selectivity(table, columns, predicate))
}

fn sampled_selectivity(table: &Table, columns: &[usize], predicate: &Expr) -> f64 {
    let chunks = table.chunks.len();
    if chunks == 0 {
        return 1.0;
    }
    let step = (chunks / SAMPLE_CHUNKS_MAX).max(1);
    let (mut seen, mut passed) = (0usize, 0usize);
    for chunk in (0..chunks).step_by(step).take(SAMPLE_CHUNKS_MAX) {
        let rows = table.chunks[chunk].rows.min(SAMPLE_ROWS_PER_CHUNK);
        let batch = scan_chunk(table, chunk, columns, 0, rows);
        let Ok(result) = evaluate(predicate, &batch) else {
            return 1.0 / 3.0;
        };
        if let Data::Bool(values) = &result.data {
            passed += (0..rows).filter(|&r| values[r] && result.is_valid(r)).count();
        }
        seen += rows;
    }
    // Half a row of credit so a filter that matched nothing in the sample is not taken as empty.
    (passed as f64 + 0.5) / (seen as f64 + 0.5)
}

/// An equality between expressions over two disjoint relation sets.
struct Edge {
    left: Expr,
    right: Expr,
    left_set: u64,
    right_set: u64,
    /// The equivalence class of a column = column edge (edges of one class join on one value:
    /// an estimate counts its distinct values once).
    class: Option<usize>,
}

/// Adds the equalities implied by transitivity between plain columns of the same type
/// (`c = s and s = n` gives `c = n`: TPC-H Q5 may then join customer to the one region's
/// nations before orders), and numbers each class.
fn close_edges(edges: &mut Vec<Edge>, inputs: &[JoinInput]) {
    let column = |e: &Expr| match e {
        Expr::Column { index, data_type } => Some((*index, *data_type)),
        _ => None,
    };
    let mut classes: Vec<Vec<(usize, crate::types::DataType)>> = Vec::new();
    for edge in edges.iter() {
        let (Some(a), Some(b)) = (column(&edge.left), column(&edge.right)) else { continue };
        if a.1 != b.1 {
            continue;
        }
        let ia = classes.iter().position(|c| c.contains(&a));
        let ib = classes.iter().position(|c| c.contains(&b));
        match (ia, ib) {
            (None, None) => classes.push(vec![a, b]),
            (Some(i), None) => classes[i].push(b),
            (None, Some(j)) => classes[j].push(a),
            (Some(i), Some(j)) if i != j => {
                let merged = classes.swap_remove(i.max(j));
                classes[i.min(j)].extend(merged);
            }
            _ => {}
        }
    }
    for edge in edges.iter_mut() {
        edge.class = column(&edge.left).and_then(|a| classes.iter().position(|c| c.contains(&a)));
        if edge.class.is_some_and(|c| column(&edge.right).is_none_or(|b| !classes[c].contains(&b))) {
            edge.class = None;
        }
    }
    for (class, members) in classes.iter().enumerate() {
        for (i, &(a, data_type)) in members.iter().enumerate() {
            for &(b, _) in &members[i + 1..] {
                let (left, right) = (Expr::Column { index: a, data_type }, Expr::Column { index: b, data_type });
                let (left_set, right_set) = (relation_set(&left, inputs), relation_set(&right, inputs));
                let present =
                    edges.iter().any(|e| (e.left == left && e.right == right) || (e.left == right && e.right == left));
                if left_set != right_set && !present {
                    edges.push(Edge { left, right, left_set, right_set, class: Some(class) });
                }
            }
        }
    }
}

fn as_edge(conjunct: &Conjunct, inputs: &[JoinInput]) -> Option<Edge> {
    let Expr::Binary { op: BinaryOp::Eq, left, right, .. } = &conjunct.expr else {
        return None;
    };
    let (left_set, right_set) = (relation_set(left, inputs), relation_set(right, inputs));
    (left_set != 0 && right_set != 0 && left_set & right_set == 0).then(|| Edge {
        left: (**left).clone(),
        right: (**right).clone(),
        left_set,
        right_set,
        class: None,
    })
}

/// Joins all planned relations; `pending` are multi-relation conjuncts that are not equi-join
/// edges (applied as soon as their relations are joined).
pub fn join_all(items: Vec<Planned>, conjuncts: Vec<Conjunct>, inputs: &[JoinInput]) -> Result<Planned> {
    let mut edges = Vec::new();
    let mut pending = Vec::new();
    for conjunct in conjuncts {
        match as_edge(&conjunct, inputs) {
            Some(edge) => edges.push(edge),
            None => pending.push(conjunct),
        }
    }
    close_edges(&mut edges, inputs);
    let order =
        if items.len() > 2 && items.len() <= DP_RELATIONS_MAX { best_order(&items, &edges, &pending) } else { None };
    let mut result = match order {
        Some(order) => {
            let mut slots: Vec<Option<Planned>> = items.into_iter().map(Some).collect();
            join_in_order(&order, order.len() - 1, &mut slots, &edges, &mut pending)
        }
        None => join_greedily(items, &edges, &mut pending)?,
    };
    result.add_filters(&pending.into_iter().map(|c| c.expr).collect::<Vec<_>>(), 1.0 / 3.0);
    Ok(result)
}

/// Relations up to which the join order is chosen by dynamic programming over all connected
/// splits (cheapest sum of intermediate results); beyond, greedily.
const DP_RELATIONS_MAX: usize = 10;

/// A join tree: leaves are item indexes, nodes join two earlier entries.
enum Step {
    Leaf(usize),
    Join(usize, usize),
}

/// Joins one entry of `order` (recursively), applying the pending conjuncts its relations
/// cover as soon as they are joined.
fn join_in_order(
    order: &[Step],
    at: usize,
    slots: &mut [Option<Planned>],
    edges: &[Edge],
    pending: &mut Vec<Conjunct>,
) -> Planned {
    match order[at] {
        Step::Leaf(item) => slots[item].take().expect("each relation joins once"),
        Step::Join(a, b) => {
            let a = join_in_order(order, a, slots, edges, pending);
            let b = join_in_order(order, b, slots, edges, pending);
            let keys = connecting(edges, a.relations, b.relations);
            let estimate = join_estimate(&a, &b, &keys, edges);
            let mut joined = hash_join(a, b, edges, estimate);
            apply_covered(&mut joined, pending);
            joined
        }
    }
}

fn apply_covered(joined: &mut Planned, pending: &mut Vec<Conjunct>) {
    let (now, later): (Vec<Conjunct>, Vec<Conjunct>) =
        std::mem::take(pending).into_iter().partition(|conjunct| conjunct.relations & !joined.relations == 0);
    joined.add_filters(&now.into_iter().map(|c| c.expr).collect::<Vec<_>>(), 1.0 / 3.0);
    *pending = later;
}

fn join_greedily(mut items: Vec<Planned>, edges: &[Edge], pending: &mut Vec<Conjunct>) -> Result<Planned> {
    while items.len() > 1 {
        let (i, j, estimate) = best_pair(&items, edges)?;
        let (first, second) =
            if i > j { (items.remove(i), items.remove(j)) } else { (items.remove(j), items.remove(i)) };
        let mut joined = hash_join(first, second, edges, estimate);
        apply_covered(&mut joined, pending);
        items.push(joined);
    }
    items.pop().ok_or_else(|| EngineError::unsupported("a query block without relations"))
}

/// The join tree with the least total of estimated intermediate rows (plus each join's build
/// rows), over every split of every connected set of relations into two connected, joined
/// halves. The greedy choice (smallest next result) can pin a relation to the wrong side:
/// in TPC-H Q5 it joins supplier to the region's nations first, after which customer can only
/// join orders (227K rows) instead of those nations (30K customers). None when the relations
/// are not all connected by equalities.
fn best_order(items: &[Planned], edges: &[Edge], pending: &[Conjunct]) -> Option<Vec<Step>> {
    let n = items.len();
    let full = (1usize << n) - 1;
    // Per subset of items: its summary (rows, distinct counts; no plan), cost and split.
    let mut best: Vec<Option<(Planned, f64, usize)>> = (0..=full).map(|_| None).collect();
    for (i, item) in items.iter().enumerate() {
        best[1 << i] = Some((summary(item.relations, item.rows, item.distinct.clone()), 0.0, 0));
    }
    let mut subsets: Vec<usize> = (1..=full).filter(|s: &usize| s.count_ones() >= 2).collect();
    subsets.sort_by_key(|s| s.count_ones());
    for set in subsets {
        let mut choice: Option<(Planned, f64, usize)> = None;
        // Each split once: the half holding the lowest item.
        let low = set & set.wrapping_neg();
        let mut half = (set - 1) & set;
        while half > 0 {
            if half & low != 0 {
                let other = set ^ half;
                if let (Some((a, cost_a, _)), Some((b, cost_b, _))) = (&best[half], &best[other]) {
                    let keys = connecting(edges, a.relations, b.relations);
                    if !keys.is_empty() {
                        let mut rows = join_estimate(a, b, &keys, edges);
                        let relations = a.relations | b.relations;
                        let covered = pending
                            .iter()
                            .filter(|c| {
                                c.relations & !relations == 0
                                    && c.relations & !a.relations != 0
                                    && c.relations & !b.relations != 0
                            })
                            .count();
                        rows = (rows * (1.0f64 / 3.0).powi(covered as i32)).max(1.0);
                        let cost = cost_a + cost_b + rows + a.rows.min(b.rows);
                        if choice.as_ref().is_none_or(|(_, c, _)| cost < *c) {
                            let distinct = joined_distinct(a, b, rows);
                            choice = Some((summary(relations, rows, distinct), cost, half));
                        }
                    }
                }
            }
            half = (half - 1) & set;
        }
        best[set] = choice;
    }
    best[full].as_ref()?;
    let mut order = Vec::new();
    push_steps(&best, full, &mut order);
    Some(order)
}

fn summary(relations: u64, rows: f64, distinct: HashMap<usize, DistinctValues>) -> Planned {
    Planned { plan: Plan::SingleRow, layout: Vec::new(), relations, rows, distinct }
}

/// Appends the steps that build `set` (children first); returns the index of its step.
fn push_steps(best: &[Option<(Planned, f64, usize)>], set: usize, order: &mut Vec<Step>) -> usize {
    if set.count_ones() == 1 {
        order.push(Step::Leaf(set.trailing_zeros() as usize));
    } else {
        let half = best[set].as_ref().expect("a planned subset").2;
        let a = push_steps(best, half, order);
        let b = push_steps(best, set ^ half, order);
        order.push(Step::Join(a, b));
    }
    order.len() - 1
}

fn connecting(edges: &[Edge], a: u64, b: u64) -> Vec<(&Expr, &Expr)> {
    let inside = |set: u64, side: u64| set & !side == 0;
    edges
        .iter()
        .filter_map(|e| {
            if inside(e.left_set, a) && inside(e.right_set, b) {
                Some((&e.left, &e.right))
            } else if inside(e.left_set, b) && inside(e.right_set, a) {
                Some((&e.right, &e.left))
            } else {
                None
            }
        })
        .collect()
}

fn best_pair(items: &[Planned], edges: &[Edge]) -> Result<(usize, usize, f64)> {
    let mut best: Option<(usize, usize, f64)> = None;
    for i in 0..items.len() {
        for j in i + 1..items.len() {
            let keys = connecting(edges, items[i].relations, items[j].relations);
            if keys.is_empty() {
                continue;
            }
            let estimate = join_estimate(&items[i], &items[j], &keys, edges);
            if best.is_none_or(|(_, _, b)| estimate < b) {
                best = Some((i, j, estimate));
            }
        }
    }
    // No equality connects any two items: a cross join (hash join without keys) of the
    // smallest pair; conditions over both wait above it as filters.
    Ok(best.unwrap_or_else(|| {
        let product = |(i, j): (usize, usize)| items[i].rows * items[j].rows;
        let (i, j) = (0..items.len())
            .flat_map(|i| (i + 1..items.len()).map(move |j| (i, j)))
            .min_by(|&a, &b| product(a).total_cmp(&product(b)))
            .unwrap_or((0, 1));
        (i, j, product((i, j)))
    }))
}

/// |A ⋈ B| ≈ |A|·|B| / Π max(ndv_A(k), ndv_B(k)), the denominator capped by the larger input;
/// keys of one equivalence class (`c = s and c = n`) join on one value and count once.
fn join_estimate(a: &Planned, b: &Planned, keys: &[(&Expr, &Expr)], edges: &[Edge]) -> f64 {
    let class_of = |key: &Expr| edges.iter().find(|e| &e.left == key || &e.right == key).and_then(|e| e.class);
    let mut per_class: Vec<(Option<usize>, f64)> = Vec::new();
    for (ka, kb) in keys {
        let ndv = a.distinct(ka).max(b.distinct(kb));
        match class_of(ka) {
            Some(class) => match per_class.iter_mut().find(|(c, _)| *c == Some(class)) {
                Some((_, seen)) => *seen = seen.max(ndv),
                None => per_class.push((Some(class), ndv)),
            },
            None => per_class.push((None, ndv)),
        }
    }
    let denominator = per_class.iter().map(|(_, ndv)| ndv).product::<f64>().min(a.rows.max(b.rows)).max(1.0);
    (a.rows * b.rows / denominator).max(1.0)
}

/// Distinct counts of a join's output columns: both sides', capped by the join's rows.
fn joined_distinct(a: &Planned, b: &Planned, estimate: f64) -> HashMap<usize, DistinctValues> {
    let mut distinct = a.distinct.clone();
    for (column, count) in &b.distinct {
        distinct.insert(*column, count.clone());
    }
    for count in distinct.values_mut() {
        count.cap = count.cap.min(estimate);
    }
    distinct
}

fn hash_join(a: Planned, b: Planned, edges: &[Edge], estimate: f64) -> Planned {
    let (probe, build) = if a.rows >= b.rows { (a, b) } else { (b, a) };
    let keys = connecting(edges, probe.relations, build.relations);
    let probe_keys = keys.iter().map(|(p, _)| probe.localize(p)).collect();
    let build_keys = keys.iter().map(|(_, b)| build.localize(b)).collect();
    let mut layout = probe.layout.clone();
    layout.extend(&build.layout);
    let distinct = joined_distinct(&probe, &build, estimate);
    let plan = Plan::HashJoin {
        kind: JoinKind::Inner,
        probe: Box::new(probe.plan),
        build: Box::new(build.plan),
        probe_keys,
        build_keys,
        residual: None,
    };
    Planned { plan, layout, relations: probe.relations | build.relations, rows: estimate, distinct }
}

/// Splits an AND tree into conjuncts.
pub fn split_conjuncts(expr: Expr, out: &mut Vec<Expr>) {
    match expr {
        Expr::Binary { op: BinaryOp::And, left, right, .. } => {
            split_conjuncts(*left, out);
            split_conjuncts(*right, out);
        }
        other => out.push(other),
    }
}

/// `(A and B) or (A and C)` → `A and (B or C)`: pulls conjuncts common to every OR branch out
/// (TPC-H Q19 repeats its join condition in each branch).
pub fn factor_or(expr: Expr) -> Vec<Expr> {
    let mut branches = Vec::new();
    split_disjuncts(expr.clone(), &mut branches);
    if branches.len() < 2 {
        return vec![expr];
    }
    let branch_conjuncts: Vec<Vec<Expr>> = branches
        .into_iter()
        .map(|b| {
            let mut out = Vec::new();
            split_conjuncts(b, &mut out);
            out
        })
        .collect();
    let common: Vec<Expr> =
        branch_conjuncts[0].iter().filter(|c| branch_conjuncts.iter().all(|b| b.contains(c))).cloned().collect();
    if common.is_empty() {
        return vec![expr];
    }
    let rest = branch_conjuncts
        .into_iter()
        .map(|b| conjunction(b.into_iter().filter(|c| !common.contains(c)).collect()))
        .collect::<Option<Vec<_>>>();
    let mut out = common;
    // When some branch is fully common, the OR is implied by the common part.
    if let Some(rest) = rest {
        out.push(disjunction(rest).expect("≥ 2 branches"));
    }
    out
}

fn split_disjuncts(expr: Expr, out: &mut Vec<Expr>) {
    match expr {
        Expr::Binary { op: BinaryOp::Or, left, right, .. } => {
            split_disjuncts(*left, out);
            split_disjuncts(*right, out);
        }
        other => out.push(other),
    }
}

/// For an OR over several relations, a weaker single-relation OR per relation that every
/// branch constrains (e.g. Q19's part filters), so they can be pushed into that scan.
pub fn derive_single_relation_filters(expr: &Expr, inputs: &[JoinInput]) -> Vec<Expr> {
    let mut branches = Vec::new();
    split_disjuncts(expr.clone(), &mut branches);
    if branches.len() < 2 {
        return Vec::new();
    }
    let mut derived = Vec::new();
    for relation in 0..inputs.len() {
        let bit = 1u64 << relation;
        let per_branch: Option<Vec<Expr>> = branches
            .iter()
            .map(|branch| {
                let mut conjuncts = Vec::new();
                split_conjuncts(branch.clone(), &mut conjuncts);
                conjunction(conjuncts.into_iter().filter(|c| relation_set(c, inputs) == bit).collect())
            })
            .collect();
        if let Some(per_branch) = per_branch {
            derived.push(disjunction(per_branch).expect("≥ 2 branches"));
        }
    }
    derived
}
