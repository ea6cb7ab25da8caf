//! The expert tier's reports: each device's share, the per-run line (where the routed pairs
//! ran, what is resident, what moved, the batches' times), and the routing history merged at
//! the end of a run.
//!
//! Must not: change what the tier holds (these read it).

use super::history::{self, History};
use super::slots::SlotState;
use super::{ExpertTier, TierDeviceStats};
use coli_compiler::cost::human;
use std::path::PathBuf;
use std::time::Duration;

impl ExpertTier {
    /// The setup's line: each side's budget and slots, the pool and streaming, the
    /// notes of the devices that hold none, the layers left on the CPU (the warm start's clause
    /// follows it).
    pub(super) fn setup_line(
        &self,
        first_name: &str,
        pool_note: Option<&str>,
        notes: &[String],
        other: &[u32],
    ) -> String {
        let side = &self.sides[0];
        let mut line = format!(
            "expert tier on {first_name}: budget {} ({}) = {} experts of {} in {} page{}, up to {} promotions per token{}",
            human(side.budget),
            side.rule,
            side.pool_from,
            human(self.expert_bytes as u64),
            side.device_pages(),
            if side.device_pages() == 1 { "" } else { "s" },
            self.opts.promotions_per_token,
            if self.opts.deterministic { ", deterministic" } else { "" }
        );
        if side.refused {
            line.push_str("; the device refused more pages");
        }
        line.push_str(&format!("; {}", pool_note.unwrap_or(super::pool::NO_POOL)));
        for side in &self.sides[1..] {
            line.push_str(&format!(
                "; and on d{} ({}): budget {} ({}) = {} experts in {} page{}, after the primary's{}",
                side.device,
                side.ctx.caps().name,
                human(side.budget),
                side.rule,
                side.slots(),
                side.pages.len(),
                if side.pages.len() == 1 { "" } else { "s" },
                if side.refused { ", the device refused more pages" } else { "" }
            ));
        }
        for n in notes {
            line.push_str(&format!("; {n}"));
        }
        match &self.sides[0].stream {
            Some((p, _)) => {
                line.push_str(&format!("; streams big steps' cold experts through {} staging slots", p.experts))
            }
            None => line.push_str("; no streaming"),
        }
        if !other.is_empty() {
            line.push_str(&format!(
                "; experts of {} differ in shape and stay on the CPU",
                coli_compiler::print::layer_ranges(other)
            ));
        }
        line
    }

    /// Per device the tier holds slots on (the primary first): (the chain's device index,
    /// slots, experts serving, pairs served, uploads).
    pub fn devices(&self) -> Vec<TierDeviceStats> {
        self.sides
            .iter()
            .map(|d| {
                let serving = (d.first..d.first + d.slots())
                    .filter(|&s| matches!(self.slots.state(s), SlotState::Serving(..)))
                    .count();
                TierDeviceStats {
                    device: d.device,
                    slots: d.slots(),
                    resident: serving,
                    pairs: d.pairs,
                    uploads: d.uploads,
                }
            })
            .collect()
    }

    /// The per-run line: where the routed pairs ran, what is resident, what moved, and the
    /// time the batches took and the CPU waited for them.
    pub fn summary(&self) -> String {
        let s = &self.stats;
        let share = if s.routed == 0 { 0.0 } else { 100.0 * s.device as f64 / s.routed as f64 };
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let resident = self.slots.resident();
        // The device's slots' bytes against its budget; the pool's experts apart.
        let in_pool = self
            .pool_range()
            .map_or(0, |r| r.filter(|&sl| matches!(self.slots.state(sl), SlotState::Serving(..))).count());
        let mut line = format!(
            "expert tier run: device {} of {} routed pairs ({share:.1}%; {} from the host pool, {} pool experts moved up), CPU {} ({} of the pool's by the balancer) | resident {resident} of {} slots ({} of {} on the device, {in_pool} in the host pool) | uploads {} ({}, {} warm), evictions {}, skipped {} (rate or queue), failed {} | batches {:.1} ms, CPU share {:.1} ms, waited {:.1} ms, host {:.1} / {:.1} / {:.1} ms (before / after / promotions) | streamed {} experts ({} pairs)",
            s.device,
            s.routed,
            s.pool,
            s.pool_promotions,
            s.routed - s.device,
            s.balanced,
            self.slots.len(),
            human(((resident - in_pool) * self.expert_bytes) as u64),
            human(self.budget),
            s.uploads,
            human(s.upload_bytes),
            s.warm,
            s.evictions,
            s.skipped,
            s.failed,
            ms(s.batch),
            ms(s.cpu),
            ms(s.waited),
            ms(s.host[0]),
            ms(s.host[1]),
            ms(s.host[2]),
            s.streamed,
            s.streamed_pairs,
        );
        if self.sides.len() > 1 {
            let per: Vec<String> = self
                .devices()
                .iter()
                .map(|d| {
                    format!(
                        "d{}: {} pairs, resident {} of {} slots, {} uploads",
                        d.device, d.pairs, d.resident, d.slots, d.uploads
                    )
                })
                .collect();
            line.push_str(&format!(" | {}", per.join("; ")));
        }
        line
    }

    /// Merges this run's routings into the history file; `Ok(None)` without one.
    pub fn save_history(&self) -> Result<Option<PathBuf>, history::HistoryError> {
        let Some(path) = &self.opts.history else { return Ok(None) };
        let mut h = History::new(self.experts);
        for (t, l) in self.layers.iter().enumerate() {
            h.add(l.layer, &self.counts[t * self.experts..(t + 1) * self.experts]);
        }
        // `index` spans the model's layers: a line past them in the file is dropped.
        h.merge_into(path, self.index.len())?;
        Ok(Some(path.clone()))
    }
}
