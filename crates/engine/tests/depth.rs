//! Deep nesting from SQL text (issue 21 point 3): no statement may overflow a thread's stack.
//! Expectations are PostgreSQL 15's answers to the same texts (a 2,000-term sum answers, a
//! 10,000-term one is `54001 stack depth limit exceeded`, AND chains of any length answer).
//! Every statement runs on a thread with a 2 MiB stack, the stack of the server's blocking
//! pool and of std's default threads.

use std::sync::Arc;

#[cfg(not(feature = "global-mimalloc"))]
use bypass_engine::control::TrackingAllocator;
use bypass_engine::control::{self, QueryControl};
use bypass_engine::{Engine, EngineSettings, QueryResult};

// Charges allocations to the statement's control, as the `bypass` binary does (the library
// installs it itself when a workspace build turns on `global-mimalloc`).
#[cfg(not(feature = "global-mimalloc"))]
#[global_allocator]
static ALLOCATOR: TrackingAllocator<std::alloc::System> = TrackingAllocator(std::alloc::System);

const THREAD_STACK_BYTES: usize = 2 << 20;

fn on_small_stack(engine: &Engine, sql: &str) -> Result<QueryResult, String> {
    under_control(engine, sql, &QueryControl::unlimited())
}

/// `sql` on a 2 MiB thread as a statement under `control` (its memory_limit, timeout, cancel).
fn under_control(engine: &Engine, sql: &str, control: &Arc<QueryControl>) -> Result<QueryResult, String> {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .stack_size(THREAD_STACK_BYTES)
            .spawn_scoped(scope, || control::enter(control, || engine.query(sql).map_err(|e| e.sqlstate().to_string())))
            .expect("thread starts")
            .join()
            .expect("the statement does not crash its thread")
    })
}

fn single_value(result: Result<QueryResult, String>) -> String {
    let result = result.expect("the statement answers");
    result.rows()[0][0].to_string()
}

fn chain(term: &str, separator: &str, terms: usize) -> String {
    vec![term; terms].join(separator)
}

fn engine_with_table() -> Engine {
    let engine = Engine::new(EngineSettings::default()).expect("engine starts");
    engine.execute("create table t (x int, b boolean); insert into t values (1, true), (2, true)").expect("loads");
    engine
}

// Goal: long left-deep arithmetic answers up to PostgreSQL's depth and is refused with 54001
// past it, never crashing; method: sums of 2,000, 10,000 and 100,000 terms, constant and over
// a column, and one as long as the engine accepts (1 MiB).
#[test]
fn arithmetic_chains_answer_or_refuse() {
    let engine = engine_with_table();
    assert_eq!(single_value(on_small_stack(&engine, &format!("select {}", chain("1", "+", 2000)))), "2000");
    let over_column = format!("select x+{} from t order by 1", chain("1", "+", 1999));
    assert_eq!(single_value(on_small_stack(&engine, &over_column)), "2000");
    assert_eq!(single_value(on_small_stack(&engine, &format!("select {}", chain("1", "+", 4000)))), "4000");
    let deepest = format!("select x-{} from t order by 1", chain("x", "-", 3999));
    assert_eq!(single_value(on_small_stack(&engine, &deepest)), "-7996");
    for terms in [10_000, 100_000] {
        let sql = format!("select {}", chain("1", "+", terms));
        assert_eq!(on_small_stack(&engine, &sql).err().as_deref(), Some("54001"), "{terms} terms");
        let sql = format!("select x-{} from t", chain("x", "-", terms));
        assert_eq!(on_small_stack(&engine, &sql).err().as_deref(), Some("54001"), "{terms} column terms");
    }
    let longest = format!("select {}", chain("1", "+", (bypass_engine::engine::SQL_BYTES_MAX - 8) / 2));
    assert_eq!(on_small_stack(&engine, &longest).err().as_deref(), Some("54001"));
    let casts = format!("select 1{}", "::int".repeat(100_000));
    assert_eq!(on_small_stack(&engine, &casts).err().as_deref(), Some("54001"));
}

// Goal: AND/OR chains of any length answer, as in PostgreSQL (which flattens them); method:
// 10,000 and 100,000 conditions in WHERE and in the select list.
#[test]
fn logical_chains_answer() {
    let engine = engine_with_table();
    for terms in [10_000, 100_000] {
        let sql = format!("select count(*) from t where {}", chain("x > 0", " and ", terms));
        assert_eq!(single_value(on_small_stack(&engine, &sql)), "2", "{terms} ANDs");
        let sql = format!("select {} from t limit 1", chain("b", " or ", terms));
        assert_eq!(single_value(on_small_stack(&engine, &sql)), "t", "{terms} ORs");
    }
}

// Goal: nesting by parentheses and prefix operators never crashes; method: 1,000 levels
// answer (as in PostgreSQL), deeper nesting is refused with 54001 (the parser's limit).
#[test]
fn nested_parentheses_answer_or_refuse() {
    let engine = engine_with_table();
    let nested = |levels: usize| format!("select {}1{}", "(".repeat(levels), ")".repeat(levels));
    assert_eq!(single_value(on_small_stack(&engine, &nested(10))), "1");
    assert_eq!(single_value(on_small_stack(&engine, &nested(1000))), "1");
    assert_eq!(on_small_stack(&engine, &nested(100_000)).err().as_deref(), Some("54001"));
    // sqlparser turns its recursion limit inside NOT into a syntax error: refused, not crashed.
    let negations = format!("select {}true", "not ".repeat(100_000));
    let refused = on_small_stack(&engine, &negations).err();
    assert!(matches!(refused.as_deref(), Some("54001" | "42601")), "refused: {refused:?}");
}

// Goal: prefix operators nest without parentheses and must not overflow either (45 NOTs, 185
// bytes, overflowed the server's 2 MiB stack and aborted it; 900 overflowed a 64 MiB statement
// thread); method: NOT and CASE chains, answered as PostgreSQL answers them.
#[test]
fn prefix_operator_chains_answer() {
    let engine = engine_with_table();
    for (levels, expected) in [(45, "f"), (1000, "t")] {
        let sql = format!("select {}true", "not ".repeat(levels));
        assert_eq!(single_value(on_small_stack(&engine, &sql)), expected, "{levels} NOTs");
    }
    let cases = format!("select {}1{}", "case when true then ".repeat(1000), " end".repeat(1000));
    assert_eq!(single_value(on_small_stack(&engine, &cases)), "1");
}

// Goal: nested function calls cost time linear in their depth (abs( was bound as a CASE that
// copied its argument three times: 16 levels over a column took seconds, 30 would take hours);
// method: abs( nested 1,000 deep over a constant and 100 deep over a column answer.
#[test]
fn nested_function_calls_answer() {
    let engine = engine_with_table();
    let nested =
        |levels: usize, inner: &str| format!("select {}{inner}{} from t", "abs(".repeat(levels), ")".repeat(levels));
    assert_eq!(single_value(on_small_stack(&engine, &nested(1000, "-1"))), "1");
    let over_column = format!("{} order by 1", nested(100, "-x"));
    assert_eq!(single_value(on_small_stack(&engine, &over_column)), "1");
}

// Goal: an expression compared several times (CASE with an operand, BETWEEN, IN) is copied, and
// nested copies multiply; they stay bounded: 3 levels of a 10-branch CASE answer, 8 levels
// (10^8 copies) are refused with 54001 instead of building them.
#[test]
fn nested_case_operands_answer_or_refuse() {
    let engine = engine_with_table();
    let whens: Vec<String> = (0..10).map(|i| format!("when {i} then {i}")).collect();
    let nested = |levels: usize| {
        let close = format!(" {} end)", whens.join(" "));
        format!("select {}x{} from t order by 1", "(case ".repeat(levels), close.repeat(levels))
    };
    assert_eq!(single_value(on_small_stack(&engine, &nested(3))), "1");
    assert_eq!(on_small_stack(&engine, &nested(8)).err().as_deref(), Some("54001"));
}

// Goal: a long chain of CTEs, each reading the one before, binds in memory linear in its length
// (a reference copied the CTE's plan: 10,000 CTEs, ~400 KB of SQL, grew past 11 GB, and
// binding never looked at memory_limit); method: the chain answers under a 768 MiB
// memory_limit (parsing it takes ~150 MiB, its parse reserves the bound of ~430 MiB), and is
// refused with 53200 under 64 MiB.
#[test]
fn long_cte_chains_bind_in_bounded_memory() {
    let engine = engine_with_table();
    let links: Vec<String> = (1..10_000).map(|i| format!("c{i} as (select x + 1 as x from c{})", i - 1)).collect();
    let sql = format!("with c0 as (select x from t where x = 1), {} select x from c9999", links.join(", "));
    let answered = QueryControl::new(None, 768 << 20);
    let result = under_control(&engine, &sql, &answered);
    assert_eq!(single_value(result), "10000", "peak {} bytes", answered.memory_peak());
    let refused = QueryControl::new(None, 64 << 20);
    assert_eq!(under_control(&engine, &sql, &refused).err().as_deref(), Some("53200"));
}

/// Texts whose syntax trees are as large per token as we found: long chains of each operator
/// and list, nesting up to the parser's limit, long literals and names.
fn parse_heavy_texts() -> Vec<(&'static str, String)> {
    let terms = 100_000;
    let ctes: Vec<String> = (1..5_000).map(|i| format!("c{i} as (select x + 1 as x from c{})", i - 1)).collect();
    let values: Vec<String> = (0..terms / 4).map(|i| format!("({i}, 'v{i}', {i}.5, null)")).collect();
    vec![
        ("sum", format!("select {}", chain("1", "+", terms))),
        ("and", format!("select x from t where {}", chain("x = 1", " and ", terms / 4))),
        ("or", format!("select x from t where {}", chain("b", " or ", terms))),
        ("in list", format!("select 1 in ({})", chain("1", ",", terms))),
        ("select list", format!("select {} from t", chain("x", ",", terms))),
        ("aliased select list", format!("select {} from t", chain("x as y", ",", terms / 2))),
        ("casts", format!("select 1{}", "::int".repeat(terms / 2))),
        ("negations", format!("select {}1", "- ".repeat(terms / 4))),
        ("not", format!("select {}true", "not ".repeat(terms / 4))),
        ("case", format!("select case {} end", chain("when x = 1 then 2", " ", terms / 8))),
        ("function calls", format!("select {}", chain("abs(x)", "+", terms / 4))),
        ("compound names", format!("select {} from t", chain("t.x", ",", terms / 2))),
        ("arrays", format!("select array[{}]", chain("1", ",", terms))),
        ("values", format!("insert into t (x, b, c, d) values {}", values.join(","))),
        ("from list", format!("select 1 from {}", chain("t", ",", terms / 2))),
        ("order by", format!("select x from t order by {}", chain("1", ",", terms))),
        ("parentheses", format!("select {}1{}", "(".repeat(200), ")".repeat(200))),
        ("ctes", format!("with c0 as (select x from t), {} select x from c4999", ctes.join(", "))),
        ("literal", format!("select '{}'", "a".repeat(900_000))),
        ("identifier", format!("select \"{}\"", "a".repeat(900_000))),
        ("statements", chain("select 1", ";", terms / 4)),
        ("inserts", chain("insert into t values (1)", ";", terms / 8)),
        ("scalar subqueries", format!("select {}", chain("(select 1)", "+", terms / 4))),
        ("exists", format!("select 1 from t where {}", chain("exists (select 1)", " and ", terms / 6))),
        ("unions", chain("select 1", " union all ", terms / 4)),
        ("derived tables", format!("select 1 from {}", chain("(select 1) a", ",", terms / 6))),
        ("nested subqueries", format!("select {}1{}", "(select ".repeat(40), ")".repeat(40))),
        ("windows", format!("select {} from t", chain("sum(x) over (partition by x order by x)", ",", terms / 16))),
        ("joins", format!("select 1 from t{}", " join t on true".repeat(terms / 8))),
        ("create tables", chain("create table if not exists z (a int)", ";", terms / 12)),
    ]
}

// Goal: the memory parsing takes is bounded before the tree is built (issue 21: the syntax
// tree used to be built before any control existed, ~380 bytes per byte of SQL). Method:
// every heavy shape parsed under a control; the largest share of its reservation any parse
// took must stay within 100%; a text whose bound exceeds memory_limit is refused with 53200.
#[test]
fn parse_memory_stays_within_its_bound() {
    for (shape, sql) in parse_heavy_texts() {
        let control = QueryControl::unlimited();
        let parsed = bypass_engine::depth::with_statement_stack(&sql, || {
            control::enter(&control, || Engine::parse(&sql).map(|s| s.len()).map_err(|e| e.sqlstate().to_string()))
        })
        .expect("runs");
        let used = control::reservation_use_percent_max();
        println!(
            "{shape}: {} bytes of SQL, {parsed:?}, peak {} bytes, worst use so far {used}%",
            sql.len(),
            control.memory_peak()
        );
        assert!(used <= 100, "{shape}: a parse took {used}% of its reservation");
    }
    let sql = format!("select {}", chain("1", "+", 400_000));
    let refused = QueryControl::new(None, 64 << 20);
    let outcome = bypass_engine::depth::with_statement_stack(&sql, || {
        control::enter(&refused, || Engine::parse(&sql).map(|_| ()).map_err(|e| e.sqlstate().to_string()))
    })
    .expect("runs");
    assert_eq!(outcome, Err("53200".to_string()));
}
