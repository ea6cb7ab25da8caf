//! Graphviz export of a plan: one node per op, an edge from the op that last wrote a value to
//! each op that reads it, ops clustered by frame, host steps drawn as grey boxes. Built on a petgraph graph so that the edges are computed once, here.
//!
//! This module must not be read back: DOT is for looking at, the text format is the record.

use crate::ir::ValueId;
use crate::plan::Plan;
use crate::print::op_text;
use petgraph::graph::{DiGraph, NodeIndex};
use std::collections::BTreeMap;
use std::fmt::Write;

use crate::ir::op_io;

/// The op graph: nodes carry (frame label, op text, host step), in execution order; an edge
/// goes from the op that last wrote a value to each op reading it.
pub fn op_graph(plan: &Plan) -> DiGraph<(String, String, bool), ValueId> {
    let mut g = DiGraph::new();
    let mut last_writer: BTreeMap<ValueId, NodeIndex> = BTreeMap::new();
    for f in &plan.frames {
        let label = match f.beside {
            Some(b) => format!("{} {} (beside {b})", f.id, f.place),
            None => format!("{} {}", f.id, f.place),
        };
        for id in &f.ops {
            let op = crate::frames::op_of(&plan.program, *id);
            let (reads, writes) = op_io(op);
            let n = g.add_node((label.clone(), format!("{id}: {}", op_text(op)), op.kind().info().host_step));
            for r in reads {
                if let Some(&w) = last_writer.get(&r) {
                    g.add_edge(w, n, r);
                }
            }
            for w in writes {
                last_writer.insert(w, n);
            }
        }
    }
    g
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

impl Plan {
    /// The plan as a Graphviz digraph (`to_dot`).
    pub fn to_dot(&self) -> String {
        to_dot(self)
    }
}

/// The plan as a Graphviz digraph.
pub fn to_dot(plan: &Plan) -> String {
    let g = op_graph(plan);
    let mut s = String::new();
    let _ = writeln!(s, "digraph plan {{\n  rankdir=TB;\n  node [shape=ellipse, fontsize=10];");
    let mut clusters: BTreeMap<&str, Vec<NodeIndex>> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    for n in g.node_indices() {
        let c = g[n].0.as_str();
        if !clusters.contains_key(c) {
            order.push(c);
        }
        clusters.entry(c).or_default().push(n);
    }
    for (ci, c) in order.iter().enumerate() {
        let _ = writeln!(s, "  subgraph cluster_{ci} {{\n    label=\"{}\";", esc(c));
        for n in &clusters[c] {
            let (_, text, host) = &g[*n];
            let shape = if *host { ", shape=box, style=filled, fillcolor=lightgrey" } else { "" };
            let _ = writeln!(s, "    n{} [label=\"{}\"{shape}];", n.index(), esc(text));
        }
        let _ = writeln!(s, "  }}");
    }
    for e in g.edge_indices() {
        let (a, b) = g.edge_endpoints(e).expect("an edge of the graph has endpoints");
        let _ = writeln!(s, "  n{} -> n{} [label=\"{}\"];", a.index(), b.index(), g[e]);
    }
    s.push_str("}\n");
    s
}
