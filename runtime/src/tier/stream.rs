//! Which cold experts a big step streams through the primary's staging slots
//! (`ExpertTier::stream_plan`): the rule that moves an expert's pairs from the CPU to the
//! device while that shortens the step.

use super::{ExpertTier, STREAM_ROUNDS};
use crate::cpu::experts::pair_expert;

impl ExpertTier {
    /// The experts a step streams: (expert, round, staging slot). Only steps of at least
    /// `stream_min_rows` rows, only experts the CPU would compute, most rows first. The rule:
    /// an expert moves to the device while that shortens the step, the device's side costing
    /// the expert's bytes at the measured staging rate (its compute hides behind the next
    /// upload), the CPU's its rows at the measured time per pair; no measurement yet, no
    /// streaming. In deterministic mode the routing alone decides: every expert of two rows
    /// or more, while slots last.
    pub(super) fn stream_plan(
        &self,
        routing: &[f32],
        top_k: usize,
        n: usize,
        cpu_pairs: &[(usize, usize)],
    ) -> Vec<(usize, usize, usize)> {
        let Some((page, _)) = self.sides.first().and_then(|d| d.stream.as_ref()) else { return Vec::new() };
        if n < self.opts.stream_min_rows || cpu_pairs.is_empty() {
            return Vec::new();
        }
        let mut rows: std::collections::BTreeMap<usize, usize> = Default::default();
        for &(r, k) in cpu_pairs {
            *rows.entry(pair_expert(routing, top_k, r, k)).or_default() += 1;
        }
        let mut cands: Vec<(usize, usize)> = rows.into_iter().collect();
        cands.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let cap = page.experts * STREAM_ROUNDS;
        let mut out = Vec::new();
        if self.opts.deterministic {
            for &(e, r) in cands.iter().filter(|c| c.1 >= 2).take(cap) {
                let _ = r;
                out.push(e);
            }
        } else {
            let Some(c) = self.cpu_pair_s else { return Vec::new() };
            let per = self.expert_bytes as f64 * self.upload_byte_s;
            let (mut dev_t, mut cpu_t) = (0.0f64, cpu_pairs.len() as f64 * c);
            for &(e, r) in cands.iter().take(cap) {
                let (d2, c2) = (dev_t + per, cpu_t - r as f64 * c);
                if d2.max(c2) >= dev_t.max(cpu_t) {
                    break;
                }
                (dev_t, cpu_t) = (d2, c2);
                out.push(e);
            }
        }
        out.into_iter().enumerate().map(|(i, e)| (e, i / page.experts, i % page.experts)).collect()
    }
}
