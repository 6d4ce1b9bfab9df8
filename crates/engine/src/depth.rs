//! Bounds on how deep SQL text can drive the engine's recursion (PostgreSQL's
//! `check_stack_depth`: `54001 stack depth limit exceeded`).
//!
//! Three guards, so no statement can overflow a thread's stack:
//! - the parser's own recursion limit bounds nesting by parentheses, subqueries and prefix
//!   operators; only left-deep chains of infix operators (`1+1+1…`, `a AND b AND …`) grow the
//!   syntax tree without parser recursion;
//! - the binder counts its nesting ([`enter`]) and checks the thread's remaining stack, so bound
//!   expressions are at most [`EXPR_DEPTH_MAX`] deep (AND/OR chains are bound iteratively into
//!   balanced trees and do not count, as PostgreSQL flattens them); the executor's recursion
//!   follows the bound tree;
//! - a statement longer than [`INLINE_SQL_BYTES_MAX`] or that may nest deeper than
//!   [`INLINE_NESTING_MAX`] (brackets, and prefix operators such as `NOT`, which nest without
//!   them) runs on a thread of its own whose stack grows with the text
//!   ([`statement_stack_bytes`]): the syntax tree of such a text may be as deep as the text is
//!   long, dropping it recurses once per level, and the parser may nest
//!   [`PARSER_NESTING_MAX`] deep there (PostgreSQL takes 1,000 nested parentheses), against
//!   sqlparser's default of 50 on the caller's stack.

use std::cell::Cell;

use crate::error::{EngineError, Result};

/// Deepest bound expression or query nesting the engine accepts (PostgreSQL 15 with its
/// default 2 MB max_stack_depth answers a 4,000-term sum and refuses a 5,000-term one).
pub const EXPR_DEPTH_MAX: usize = 4500;
/// Statements up to this length parse and run on the caller's thread: their syntax trees are
/// at most about half as deep, which a 2 MiB stack holds.
pub const INLINE_SQL_BYTES_MAX: usize = 1024;
/// Nesting up to which a short statement parses on the caller's thread: a parser level takes
/// up to ~100 KiB of stack in a debug build (`abs(` 80 KiB, `NOT` 75 KiB, measured), and the
/// caller's thread may have only 2 MiB.
pub const INLINE_NESTING_MAX: usize = 8;
/// The parser's recursion limit on a statement thread (each level of it can take ~100 KiB of
/// stack in a debug build: [`STATEMENT_STACK_BASE_BYTES`] holds it).
pub const PARSER_NESTING_MAX: usize = 1100;
/// The parser's recursion limit on the caller's thread (sqlparser's default).
const PARSER_NESTING_INLINE: usize = 50;

/// Stack kept free below the deepest check: enough for the frames between two checks
/// (an expression level of the binder or a subquery level of the planner).
const STACK_RED_ZONE_BYTES: usize = 256 << 10;
/// Stack reserved per byte of statement text on a statement thread (a syntax-tree level takes
/// at least two bytes of text and its recursive drop well under this much stack), on top of
/// [`STATEMENT_STACK_BASE_BYTES`]. The reservation is virtual: only touched pages cost memory.
const STACK_BYTES_PER_SQL_BYTE: usize = 512;
/// Holds [`PARSER_NESTING_MAX`] parser levels of the costliest kind (~100 KiB each in a debug
/// build: 110 MiB) with room to spare; 64 MiB let `NOT` or `abs(` nested 900 deep overflow it.
const STATEMENT_STACK_BASE_BYTES: usize = 256 << 20;

thread_local! {
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    static STACK_LOW: Cell<Option<usize>> = const { Cell::new(None) };
    static ON_STATEMENT_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// How deep the parser may recurse on this thread.
pub fn parser_recursion_limit() -> usize {
    if ON_STATEMENT_THREAD.with(Cell::get) {
        PARSER_NESTING_MAX
    } else {
        PARSER_NESTING_INLINE
    }
}

/// An upper bound on how deep the parser may nest for `sql`: the deepest nesting of brackets
/// plus every prefix operator and keyword that nests without one (`NOT`, `CASE`, `EXISTS`,
/// unary `-`, `+`, `~`), counted wherever it appears. Quotes and comments are not told apart:
/// an overestimate only moves a statement to a statement thread.
fn nesting_bound(sql: &str) -> usize {
    let (mut depth, mut deepest, mut prefixes) = (0usize, 0usize, 0usize);
    for byte in sql.bytes() {
        match byte {
            b'(' | b'[' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b')' | b']' => depth = depth.saturating_sub(1),
            b'-' | b'+' | b'~' => prefixes += 1,
            _ => {}
        }
    }
    let words = sql.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
    let nesting_words = ["not", "case", "exists"];
    prefixes += words.filter(|word| nesting_words.iter().any(|n| word.eq_ignore_ascii_case(n))).count();
    deepest + prefixes
}

/// The stack a statement thread gets for a text of `sql_bytes`.
pub fn statement_stack_bytes(sql_bytes: usize) -> usize {
    STATEMENT_STACK_BASE_BYTES.saturating_add(sql_bytes.saturating_mul(STACK_BYTES_PER_SQL_BYTE))
}

/// One level of nesting; leaves it when dropped.
pub struct DepthGuard(());

impl Drop for DepthGuard {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// Enters one level of expression or query nesting: an error past [`EXPR_DEPTH_MAX`] levels,
/// when the thread's stack is nearly used up, or when the statement was asked to stop (cancel,
/// statement_timeout, client gone, memory_limit): binding and planning a long text take time
/// and memory too, and every query, CTE, subquery and expression level passes here.
pub fn enter() -> Result<DepthGuard> {
    crate::control::check()?;
    let depth = DEPTH.with(|d| {
        d.set(d.get() + 1);
        d.get()
    });
    let guard = DepthGuard(());
    if depth > EXPR_DEPTH_MAX {
        return Err(too_deep(format!("expressions or subqueries nested more than {EXPR_DEPTH_MAX} deep")));
    }
    check_stack()?;
    Ok(guard)
}

/// An error when less than the red zone of this thread's stack is left.
pub fn check_stack() -> Result<()> {
    match remaining_stack_bytes() {
        Some(left) if left < STACK_RED_ZONE_BYTES => Err(too_deep(format!("{left} bytes of stack left"))),
        _ => Ok(()),
    }
}

pub fn too_deep(detail: String) -> EngineError {
    EngineError::StackDepth(detail)
}

/// Bytes between the current stack pointer and the lowest address of this thread's stack.
pub fn remaining_stack_bytes() -> Option<usize> {
    let marker = 0u8;
    let here = std::ptr::addr_of!(marker) as usize;
    let low = STACK_LOW.with(|low| {
        if low.get().is_none() {
            low.set(stack_low_address());
        }
        low.get()
    })?;
    Some(here.saturating_sub(low))
}

/// The lowest usable address of the current thread's stack (glibc's view of it).
fn stack_low_address() -> Option<usize> {
    // SAFETY: pthread_getattr_np fills a zeroed attribute object for the calling thread, which
    // is destroyed again; pthread_attr_getstack only reads it.
    unsafe {
        let mut attributes: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attributes) != 0 {
            return None;
        }
        let mut address: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let status = libc::pthread_attr_getstack(&attributes, &mut address, &mut size);
        libc::pthread_attr_destroy(&mut attributes);
        // The guard page sits at the bottom of the reported range.
        (status == 0).then(|| address as usize + page_size())
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}

/// Runs `f` on the calling thread for a short, shallow statement, else on a thread with a
/// stack sized for the text (see the module docs), under the caller's statement control if
/// it has one.
pub fn with_statement_stack<R: Send>(sql: &str, f: impl FnOnce() -> R + Send) -> Result<R> {
    if ON_STATEMENT_THREAD.with(Cell::get)
        || (sql.len() <= INLINE_SQL_BYTES_MAX && nesting_bound(sql) <= INLINE_NESTING_MAX)
    {
        return Ok(f());
    }
    let control = crate::control::current();
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("bypass-statement".into())
            .stack_size(statement_stack_bytes(sql.len()))
            .spawn_scoped(scope, || {
                ON_STATEMENT_THREAD.with(|on| on.set(true));
                match &control {
                    Some(control) => crate::control::enter(control, f),
                    None => f(),
                }
            })
            .map_err(|e| EngineError::Runtime(format!("starting a statement thread: {e}")))?
            .join()
            .map_err(|_| EngineError::Runtime("a statement thread panicked".into()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the stack probe sees this thread's stack shrink as recursion deepens; method:
    // compare the remaining bytes at two depths.
    #[test]
    fn remaining_stack_shrinks_with_depth() {
        fn deeper(levels: usize) -> usize {
            let padding = std::hint::black_box([0u8; 1024]);
            if levels == 0 {
                return remaining_stack_bytes().expect("the stack is known") + usize::from(padding[0]);
            }
            deeper(levels - 1)
        }
        let shallow = remaining_stack_bytes().expect("the stack is known");
        let deep = deeper(50);
        assert!(shallow > deep + 40 * 1024, "50 frames of 1 KiB use stack: {shallow} vs {deep}");
        assert!(shallow < 64 << 20, "a test thread's stack is megabytes, not the address space");
    }

    // Goal: nesting past the limit is refused, and leaving restores the count; method: enter
    // the maximum, one more fails, all guards dropped lets it start over.
    #[test]
    fn depth_is_bounded_and_restored() {
        let guards: Vec<DepthGuard> = (0..EXPR_DEPTH_MAX).map(|_| enter().expect("within the limit")).collect();
        assert_eq!(enter().err().map(|e| e.sqlstate()), Some("54001"));
        drop(guards);
        assert!(enter().is_ok(), "the depth counter is restored when guards drop");
    }

    // Goal: binding obeys the statement's control (every query and expression level enters
    // here); method: enter under a canceled control and one over its memory_limit.
    #[test]
    fn entering_a_level_checks_the_statement_control() {
        use crate::control::{QueryControl, StopReason};
        let canceled = QueryControl::unlimited();
        canceled.stop(StopReason::Canceled);
        let refused = crate::control::enter(&canceled, || enter().err().map(|e| e.sqlstate()));
        assert_eq!(refused, Some("57014"));
        let over_budget = QueryControl::new(None, 1);
        over_budget.stop(StopReason::OutOfMemory);
        let refused = crate::control::enter(&over_budget, || enter().err().map(|e| e.sqlstate()));
        assert_eq!(refused, Some("53200"));
        assert!(crate::control::enter(&QueryControl::unlimited(), || enter().is_ok()));
    }
}
