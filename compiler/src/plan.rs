//! The plan: the compiler's output, plain data. The program the runtime executes, and where
//! each part of it runs.
//!
//! `Plan`'s `Display` is its readable text format (the snapshots are made of it). This module
//! must not compute placement; it only holds and prints it.

use crate::ir::Program;
use crate::profile::{DeviceProfile, Options};

/// What `compile` produces.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The forward pass, op by op: the runtime's contract.
    pub program: Program,
    /// The profile the plan was made for.
    pub profile: DeviceProfile,
    pub options: Options,
}

impl Plan {
    /// Every op in execution order with the name of the part it belongs to
    /// (`prologue`, `l3`, `epilogue`).
    pub fn ops_in_order(&self) -> Vec<(String, &crate::ir::Op)> {
        let p = &self.program;
        let mut out: Vec<(String, &crate::ir::Op)> = p.prologue.iter().map(|op| ("prologue".to_string(), op)).collect();
        for l in &p.layers {
            out.extend(l.ops.iter().map(|op| (l.id.to_string(), op)));
        }
        out.extend(p.epilogue.iter().map(|op| ("epilogue".to_string(), op)));
        out
    }

    /// The plan as a Graphviz digraph.
    pub fn to_dot(&self) -> String {
        crate::dot::to_dot(self)
    }
}

impl std::fmt::Display for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "plan for profile {}", self.profile.name)?;
        write!(f, "{}", self.program)
    }
}
