//! The compiled tier (filled in below the interpreter; see `try_new`).

use crate::error::Result;
use crate::expr::Expr;
use crate::plan::{AggregateCall, Plan};
use crate::runtime::Runtime;
use crate::vector::Batch;

/// A fused scan → filter → aggregate pipeline.
pub struct CompiledAggregate;

impl CompiledAggregate {
    pub fn try_new(_input: &Plan, _groups: &[Expr], _aggregates: &[AggregateCall]) -> Option<CompiledAggregate> {
        None
    }

    pub fn run(&self, _runtime: &Runtime) -> Result<Batch> {
        unreachable!("try_new never returns a pipeline yet")
    }
}
