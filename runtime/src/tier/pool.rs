//! The tier's host pool (the module doc of `tier`): its slots after the primary's device
//! slots, the clause of the tier's line that sizes it, and the step that moves its experts up
//! into device slots.
//!
//! Must not: allocate device memory (the pool's pages are host memory, `side.rs`), or let an
//! expert hold two slots at once.

use super::side::{DeviceSide, SlotShape};
use super::{ExpertTier, MAX_PENDING};
use crate::cpu::experts::pair_expert;
use crate::heat::beats;
use crate::vk::{MemoryUse, VkError};
use coli_compiler::cost::human;

/// The tier line's clause without a pool: the default, and why.
pub(super) const NO_POOL: &str = "no host pool (off unless --host-pool-mib: its RAM stays the RAM cache's)";

impl ExpertTier {
    /// Slots of the host pool (0: no pool), and the memory they are in.
    pub fn pool_slots(&self) -> usize {
        self.sides.first().map_or(0, DeviceSide::pool_slots)
    }

    pub fn pool_memory(&self) -> Option<MemoryUse> {
        self.sides.first().and_then(|s| s.pool_memory)
    }

    /// Bytes one expert takes in a slot.
    pub fn expert_bytes(&self) -> usize {
        self.expert_bytes
    }

    /// Whether expert `e` of layer `layer` serves from the host pool now.
    pub fn in_host_pool(&self, layer: usize, e: usize) -> bool {
        let Some(t) = self.index.get(layer).copied().flatten() else { return false };
        self.slots.serving(t, e).is_some_and(|s| self.in_pool(s))
    }

    /// The host pool's global slots, when there is a pool (the primary's last pages).
    pub(super) fn pool_range(&self) -> Option<std::ops::Range<usize>> {
        let p = self.sides.first()?;
        (p.pool_slots() > 0).then(|| p.first + p.pool_from..p.first + p.slots())
    }

    /// Whether global slot `s` is a host pool slot.
    pub(super) fn in_pool(&self, s: usize) -> bool {
        self.sides.first().is_some_and(|p| p.in_pool(s))
    }

    /// Step 6 of `run`: each pool expert the step's `dev_pairs` read, hottest first, takes the
    /// coldest device slot it beats; that slot's expert takes the pool slot it left. Each move
    /// is two promotions of the rate.
    pub(super) fn promote_from_pool(
        &mut self,
        t: usize,
        routing: &[f32],
        top_k: usize,
        dev_pairs: &[(usize, usize, usize)],
    ) {
        let Some(pool) = self.pool_range() else { return };
        let mut up: Vec<(usize, usize)> = dev_pairs
            .iter()
            .filter(|p| pool.contains(&p.2))
            .map(|&(r, k, s)| (pair_expert(routing, top_k, r, k), s))
            .collect();
        up.sort_unstable();
        up.dedup();
        up.sort_by(|a, b| self.heat.get(t, b.0).total_cmp(&self.heat.get(t, a.0)).then(a.cmp(b)));
        let device = self.sides[0].first..pool.start;
        for (i, &(e, ps)) in up.iter().enumerate() {
            if self.rate_left < 2 || self.pending.len() + 2 > MAX_PENDING {
                self.stats.skipped += (up.len() - i) as u64;
                return;
            }
            let heat = &self.heat;
            let Some((d, h)) = self.slots.coldest_in(device.clone(), |l, x| heat.get(l, x)) else { return };
            if !beats(self.heat.get(t, e), h) {
                continue;
            }
            self.slots.abandon(ps);
            if let Some((ol, oe)) = self.slots.replace(d, t, e) {
                self.slots.replace(ps, ol, oe);
                self.pending.push(ps);
            }
            self.pending.push(d);
            self.rate_left -= 2;
            self.stats.pool_promotions += 1;
        }
    }
}

/// Adds the host pool to the primary's side within `budget` bytes, for at most `left` experts
/// (those the device's slots leave): imported pages when `import` and the device has
/// `VK_EXT_external_memory_host`, else the driver's host-visible memory. Returns the clause of
/// the tier's line: the budget, experts of which size, the memory and the rule, or why none.
pub(super) fn host_pool(
    side: &mut DeviceSide,
    budget: u64,
    shape: &SlotShape,
    left: usize,
    import: bool,
) -> Result<String, VkError> {
    let one = shape.expert_bytes as u64;
    if budget < one {
        return Ok(format!(
            "host pool off: its budget of {} (as asked, --host-pool-mib) holds no expert of {}",
            human(budget),
            human(one)
        ));
    }
    if left == 0 {
        return Ok("host pool off: every expert fits the device".into());
    }
    let (memory, how) = match (import, side.ctx.imports_host_memory()) {
        (true, true) => (MemoryUse::PoolImport, "the process's pages imported with VK_EXT_external_memory_host"),
        (true, false) => {
            (MemoryUse::Pool, "the driver's host-visible memory (the device lacks VK_EXT_external_memory_host)")
        }
        (false, _) => (MemoryUse::Pool, "the driver's host-visible memory (import off)"),
    };
    let mut added = side.add_pool(budget, shape, left, memory)?;
    let mut how = how;
    if added == 0 && memory == MemoryUse::PoolImport {
        // The driver refused the import: its own host-visible memory instead.
        added = side.add_pool(budget, shape, left, MemoryUse::Pool)?;
        how = "the driver's host-visible memory (the import was refused)";
    }
    if added == 0 {
        return Ok(format!("host pool off: the driver refused its memory ({how})"));
    }
    Ok(format!(
        "host pool: budget {} (as asked, --host-pool-mib) = {added} experts of {} in {how}, read by the device over the bus",
        human(budget),
        human(one)
    ))
}
