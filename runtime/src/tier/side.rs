//! One device's share of the expert tier: its slot pages and the buffers a batch works in,
//! sized from that device's own budget, and the batch itself (the step's pairs whose experts
//! sit in this device's slots, recorded and submitted on this device from the worker thread the
//! tier gives it, then the promotions waiting for this device's slots).
//!
//! The tier holds one side per device it spans (the primary first); a slot's global id is the
//! side's `first` plus its place in the side's pages. The primary's side may end with the host
//! pool's pages (`add_pool`): slots in host memory the kernels read over the bus, bound like
//! any page, from local slot `pool_from` on.
//!
//! Must not: decide which expert sits in which slot or what to evict (`slots.rs` and the tier
//! do), touch another device's buffers, or let a batch outlive the step that made it (the tier
//! joins every side's worker within the step).

use super::{scratch_bytes, STREAM_ROUNDS};
use crate::bytes::{as_bytes, as_bytes_mut};
use crate::cpu::experts::ExpertMats;
use crate::cpu::Precision;
use crate::vk::{Context, DeviceBuffer, DeviceExperts, MemoryUse, MoeCall, MoePath, MoeScratch, PackedExpert, VkError};
use coli_compiler::cost::human;
use coli_compiler::ir::GluKind;
use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What every slot of the tier holds (one expert shape) and the batch's sizes.
pub(super) struct SlotShape<'a> {
    pub like: ExpertMats<'a>,
    pub hidden: usize,
    pub ffn: usize,
    pub top_k: usize,
    pub cap_rows: usize,
    /// Device bytes of one packed expert, and with its biases (what a slot costs).
    pub packed_bytes: usize,
    pub expert_bytes: usize,
}

/// One device's pages of slots and the buffers its batch works in.
pub(super) struct DeviceSide {
    pub ctx: Context,
    /// The chain's index of the device (0: the primary).
    pub device: usize,
    pub budget: u64,
    pub rule: String,
    /// Global id of this side's first slot.
    pub first: usize,
    pub pages: Vec<DeviceExperts>,
    pub per_page: usize,
    /// The local slot the host pool's pages start at (`slots()` without a pool), and the
    /// memory they are in.
    pub pool_from: usize,
    pub pool_memory: Option<MemoryUse>,
    scratch: MoeScratch,
    /// The step's rows (`cap_rows x hidden`), per page the routing in local slot ids
    /// (`cap_rows x 2 top_k`), the pairs' outputs and their read-back twin
    /// (`cap_rows x top_k x hidden`).
    xs: DeviceBuffer,
    routing: Vec<DeviceBuffer>,
    y: DeviceBuffer,
    y_back: DeviceBuffer,
    /// The staging slots of streaming and a routing buffer per round.
    pub stream: Option<(DeviceExperts, Vec<DeviceBuffer>)>,
    /// Whether the device refused pages the budget counted.
    pub refused: bool,
    /// Pairs this device served, and its uploads.
    pub pairs: u64,
    pub uploads: u64,
    hidden: usize,
    top_k: usize,
}

/// A side, or why the device holds no slot (a clause for the tier's line).
pub(super) enum SideSetup {
    Ready(Box<DeviceSide>),
    Off(String),
}

/// What one step asks of a side: its pairs `(row, rank, local slot)`, the streamed experts
/// `(expert, round, staging slot)` and their pairs `(row, rank, round, staging slot)` (the
/// primary's side only), and the promotions waiting for its slots `(global slot, local slot,
/// expert's matrices)`.
pub(super) struct SideJob<'m> {
    pub pairs: Vec<(usize, usize, usize)>,
    pub streamed: Vec<(usize, usize, usize)>,
    pub stream_pairs: Vec<(usize, usize, usize, usize)>,
    pub rounds: usize,
    pub pending: Vec<(usize, usize, ExpertMats<'m>)>,
}

impl SideJob<'_> {
    pub fn runs(&self) -> bool {
        !self.pairs.is_empty() || self.rounds > 0
    }
}

/// The step's rows and how its experts compute (the kernels' gated unit and precision).
#[derive(Clone, Copy)]
pub(super) struct Batch {
    pub n: usize,
    pub glu: GluKind,
    pub precision: Precision,
}

/// What a side's worker did: the batch's time and the streaming's (host time, submit to
/// fence), and each promotion it reached with its upload's result.
pub(super) type SideDone = (Duration, Duration, Vec<(usize, Result<(), VkError>)>);

impl DeviceSide {
    /// Sizes a side within `budget` bytes for at most `max_slots` experts: the batch's buffers
    /// first, then `stream_slots` staging slots when they take at most a quarter of the room,
    /// then pages of slots. A device that refuses what the budget counted gets smaller pages,
    /// or fewer, or no side. `pool_room` is how many experts a host pool may hold after these
    /// slots (0: none asked): with it, a side of no device slots is still a side (its batch's
    /// buffers serve the pool's pages, sized like them).
    #[allow(clippy::too_many_arguments)]
    pub fn size(
        ctx: &Context,
        device: usize,
        budget: u64,
        rule: &str,
        shape: &SlotShape,
        max_slots: usize,
        stream_slots: usize,
        pool_room: usize,
    ) -> Result<SideSetup, VkError> {
        let SlotShape { like, hidden, ffn, top_k, cap_rows, packed_bytes, expert_bytes } = shape;
        let (hidden, ffn, top_k, cap_rows, expert_bytes) = (*hidden, *ffn, *top_k, *cap_rows, *expert_bytes);
        let pairs = cap_rows * top_k;
        let buffers = (cap_rows * hidden + 2 * pairs * hidden) as u64 * 4;
        let caps = ctx.caps();
        let max_buf = caps.max_storage_buffer_range.min(caps.max_allocation_size.max(1 << 20)).min(1 << 30) as usize;
        let gate_up_each = (packed_bytes * 2 / 3).max(1);
        let per_page_max = (max_buf / gate_up_each).clamp(1, crate::vk::MOE_MAX_EXPERTS);
        let stream_slots = stream_slots.min(crate::vk::MOE_MAX_EXPERTS);
        // The batch's scratch serves a page of slots (the pool's where the device holds none)
        // and the staging page alike.
        let page_of = if max_slots > 0 { max_slots } else { pool_room };
        let scratch_experts = per_page_max.min(page_of.max(1)).max(stream_slots);
        let fixed = buffers + scratch_bytes(cap_rows, top_k, hidden, ffn, scratch_experts);
        let room = budget.saturating_sub(fixed);
        let stream_bytes = (stream_slots * expert_bytes) as u64;
        let stream_slots = if stream_slots > 0 && room >= 4 * stream_bytes { stream_slots } else { 0 };
        let room = room - (stream_slots * expert_bytes) as u64;
        let want = ((room / expert_bytes.max(1) as u64) as usize).min(max_slots);
        let pool_only = want == 0 && pool_room > 0 && budget >= fixed;
        if want == 0 && !pool_only {
            return Ok(SideSetup::Off(format!(
                "its budget of {} ({rule}) holds no expert of {} beside the batch's buffers",
                human(budget),
                human(expert_bytes as u64)
            )));
        }
        let mut per_page = per_page_max.min(if pool_only { pool_room } else { want });
        let oom = |e: &VkError| matches!(e, VkError::OutOfMemory { .. });
        let off = |e: VkError| -> Result<SideSetup, VkError> {
            if oom(&e) {
                Ok(SideSetup::Off(format!("the device refused its buffers ({e})")))
            } else {
                Err(e)
            }
        };
        let bufs = (|| -> Result<_, VkError> {
            Ok((
                ctx.moe_scratch(cap_rows, top_k, hidden, ffn, per_page.max(stream_slots))?,
                ctx.f32_buffer(cap_rows * hidden)?,
                ctx.f32_buffer(pairs * hidden)?,
                ctx.buffer(MemoryUse::Readback, pairs * hidden * 4)?,
            ))
        })();
        let (scratch, xs, y, y_back) = match bufs {
            Ok(b) => b,
            Err(e) => return off(e),
        };
        let mut pages = Vec::new();
        let mut routing = Vec::new();
        let mut refused = false;
        while pages.len() * per_page < want {
            let slots = per_page.min(want - pages.len() * per_page);
            let page = ctx.expert_slots(slots, like).and_then(|p| Ok((p, ctx.f32_buffer(cap_rows * 2 * top_k)?)));
            match page {
                Ok((p, r)) => {
                    pages.push(p);
                    routing.push(r);
                }
                Err(e) if oom(&e) && pages.is_empty() && per_page > 1 => per_page /= 2,
                Err(e) if oom(&e) && !pages.is_empty() => {
                    refused = true;
                    break;
                }
                Err(e) => return off(e),
            }
        }
        // Staging slots for streaming (reserved above); refused: no streaming.
        let stream = if stream_slots > 0 {
            let page = ctx.expert_slots(stream_slots, like).and_then(|p| {
                let r =
                    (0..STREAM_ROUNDS).map(|_| ctx.f32_buffer(cap_rows * 2 * top_k)).collect::<Result<Vec<_>, _>>()?;
                Ok((p, r))
            });
            match page {
                Ok(p) => Some(p),
                Err(e) if oom(&e) => None,
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        Ok(SideSetup::Ready(Box::new(DeviceSide {
            ctx: ctx.clone(),
            device,
            budget,
            rule: rule.to_string(),
            first: 0,
            pool_from: pages.iter().map(|p| p.experts).sum(),
            pool_memory: None,
            pages,
            per_page,
            scratch,
            xs,
            routing,
            y,
            y_back,
            stream,
            refused,
            pairs: 0,
            uploads: 0,
            hidden,
            top_k,
        })))
    }

    /// Slots in all.
    pub fn slots(&self) -> usize {
        self.pages.iter().map(|p| p.experts).sum()
    }

    /// Whether global slot `s` is one of this side's.
    pub fn owns(&self, s: usize) -> bool {
        (self.first..self.first + self.slots()).contains(&s)
    }

    pub fn has_bias(&self) -> bool {
        self.pages.first().is_some_and(DeviceExperts::has_bias)
    }

    /// Pages of device memory (those before the host pool's).
    pub fn device_pages(&self) -> usize {
        let mut at = 0;
        self.pages
            .iter()
            .take_while(|p| {
                at += p.experts;
                at <= self.pool_from
            })
            .count()
    }

    /// Host pool slots (the pages from `pool_from` on).
    pub fn pool_slots(&self) -> usize {
        self.slots() - self.pool_from
    }

    /// Whether global slot `s` is one of this side's host pool slots.
    pub fn in_pool(&self, s: usize) -> bool {
        self.owns(s) && s - self.first >= self.pool_from
    }

    /// The page and place of local slot `local`.
    fn locate(&self, local: usize) -> (usize, usize) {
        let mut at = local;
        for (i, p) in self.pages.iter().enumerate() {
            if at < p.experts {
                return (i, at);
            }
            at -= p.experts;
        }
        (self.pages.len(), at)
    }

    /// Adds the host pool's pages after the device's: up to `max_slots` experts within `budget`
    /// bytes, in `memory` (`Pool` or `PoolImport`). Returns the slots added; an allocation the
    /// driver refuses ends the pool there (at none: `Ok(0)`).
    pub fn add_pool(
        &mut self,
        budget: u64,
        shape: &SlotShape,
        max_slots: usize,
        memory: MemoryUse,
    ) -> Result<usize, VkError> {
        let want = ((budget / shape.expert_bytes.max(1) as u64) as usize).min(max_slots);
        let mut added = 0;
        while added < want {
            let n = self.per_page.min(want - added);
            let page = self
                .ctx
                .expert_slots_in(n, &shape.like, memory)
                .and_then(|p| Ok((p, self.ctx.f32_buffer(shape.cap_rows * 2 * shape.top_k)?)));
            match page {
                Ok((p, r)) => {
                    self.pages.push(p);
                    self.routing.push(r);
                    added += n;
                }
                Err(VkError::OutOfMemory { .. } | VkError::NoMemoryType(_)) => break,
                Err(e) => return Err(e),
            }
        }
        if added > 0 {
            self.pool_memory = Some(memory);
        }
        Ok(added)
    }

    /// Writes a packed expert into local slot `local`.
    pub fn write(&self, local: usize, p: &PackedExpert) -> Result<(), VkError> {
        let (page, at) = self.locate(local);
        let d = self.pages.get(page).ok_or_else(|| VkError::BadArgument {
            op: "tier",
            msg: format!("local slot {local} of {}", self.slots()),
        })?;
        self.ctx.write_expert(d, at, p)
    }

    /// Writes the step's inputs: the rows, and per page touched (and per streamed round) the
    /// routing in local slot ids, `-1` for the pairs another side or the CPU computes. Returns
    /// the pages touched.
    pub fn write_inputs(
        &self,
        x: &[f32],
        routing: &[f32],
        n: usize,
        top_k: usize,
        job: &SideJob,
    ) -> Result<Vec<bool>, VkError> {
        let mut touched = vec![false; self.pages.len()];
        if !job.runs() {
            return Ok(touched);
        }
        self.ctx.write(&self.xs, 0, as_bytes(x))?;
        let located: Vec<(usize, usize)> = job.pairs.iter().map(|p| self.locate(p.2)).collect();
        for &(page, _) in &located {
            if page >= touched.len() {
                return Err(VkError::BadArgument { op: "tier", msg: format!("page {page} of {}", touched.len()) });
            }
            touched[page] = true;
        }
        for (p, _) in touched.iter().enumerate().filter(|t| *t.1) {
            let mut local = vec![-1.0f32; n * 2 * top_k];
            for (&(r, k, _), &(page, at_page)) in job.pairs.iter().zip(&located) {
                let at = r * 2 * top_k + 2 * k;
                local[at + 1] = routing[at + 1];
                if page == p {
                    local[at] = at_page as f32;
                }
            }
            self.ctx.write(&self.routing[p], 0, as_bytes(&local))?;
        }
        if let Some((_, bufs)) = &self.stream {
            for (round, buf) in bufs.iter().enumerate().take(job.rounds) {
                let mut local = vec![-1.0f32; n * 2 * top_k];
                for &(r, k, rd, slot) in &job.stream_pairs {
                    let at = r * 2 * top_k + 2 * k;
                    local[at + 1] = routing[at + 1];
                    if rd == round {
                        local[at] = slot as f32;
                    }
                }
                self.ctx.write(buf, 0, as_bytes(&local))?;
            }
        }
        Ok(touched)
    }

    /// The worker's part of a step: the batch over the touched pages, then each round of
    /// streamed experts (written into the staging slots, then run; the last submission copies
    /// the outputs down), then the promotions waiting for this side's slots while the CPU still
    /// computes (at least one a step, so they drain).
    pub fn work<'m>(
        &self,
        job: &SideJob<'m>,
        touched: &[bool],
        expert: &(dyn Fn(usize) -> ExpertMats<'m> + Sync),
        batch: Batch,
        cpu_done: &AtomicBool,
    ) -> Result<SideDone, VkError> {
        let Batch { n, glu, precision } = batch;
        let (top_k, hidden) = (self.top_k, self.hidden);
        let with_bias = self.has_bias();
        let tb = Instant::now();
        let mut stream_time = Duration::ZERO;
        let batch = !job.pairs.is_empty();
        let jobs = usize::from(batch) + job.rounds;
        let (xv, yv) = (self.xs.view(0, n * hidden), self.y.view(0, n * top_k * hidden));
        for j in 0..jobs {
            let round = if batch { j.checked_sub(1) } else { Some(j) };
            if let (Some(round), Some((page, _))) = (round, &self.stream) {
                let tu = Instant::now();
                for &(e, _, slot) in job.streamed.iter().filter(|s| s.1 == round) {
                    let p = Context::pack_expert(&expert(e), with_bias)?;
                    self.ctx.write_expert(page, slot, &p)?;
                }
                stream_time += tu.elapsed();
            }
            let mut f = self.ctx.frame()?;
            match (round, &self.stream) {
                (None, _) => {
                    for (p, _) in touched.iter().enumerate().filter(|t| *t.1) {
                        let experts = &self.pages[p];
                        let call =
                            MoeCall { experts, scratch: &self.scratch, n, top_k, glu, precision, path: MoePath::Auto };
                        f.moe_pairs(call, xv, self.routing[p].view(0, n * 2 * top_k), yv)?;
                    }
                }
                (Some(round), Some((page, bufs))) => {
                    let call = MoeCall {
                        experts: page,
                        scratch: &self.scratch,
                        n,
                        top_k,
                        glu,
                        precision,
                        path: MoePath::Auto,
                    };
                    f.moe_pairs(call, xv, bufs[round].view(0, n * 2 * top_k), yv)?;
                }
                (Some(_), None) => {}
            }
            if j + 1 == jobs {
                f.copy(yv, self.y_back.view(0, n * top_k * hidden))?;
            }
            f.run()?;
        }
        let batch_time = tb.elapsed().saturating_sub(stream_time);
        let mut done = Vec::new();
        for (i, (s, local, m)) in job.pending.iter().enumerate() {
            if i > 0 && cpu_done.load(Ordering::Acquire) {
                break;
            }
            let r = Context::pack_expert(m, with_bias).and_then(|p| self.write(*local, &p));
            done.push((*s, r));
        }
        Ok((batch_time, stream_time, done))
    }

    /// Copies the batch's outputs of `pairs` (row, rank) down into their rows of `table`
    /// (`n x top_k x hidden`, laid out as the batch's), straight from the read-back mapping,
    /// the rows in parallel. Returns how many pairs.
    pub fn read_pairs(
        &self,
        n: usize,
        top_k: usize,
        hidden: usize,
        pairs: impl Iterator<Item = (usize, usize)>,
        table: &mut [f32],
    ) -> Result<u64, VkError> {
        let mut want = vec![false; n * top_k];
        let mut count = 0;
        for (r, k) in pairs {
            if let Some(w) = want.get_mut(r * top_k + k) {
                *w = true;
                count += 1;
            }
        }
        let (rows, row_bytes) = (n * top_k, hidden * 4);
        self.ctx.read_with(&self.y_back, 0, rows * row_bytes, |ys| {
            let table = &mut table[..rows * hidden];
            let copy = |(i, row): (usize, &mut [f32])| {
                if want[i] {
                    as_bytes_mut(row).copy_from_slice(&ys[i * row_bytes..(i + 1) * row_bytes]);
                }
            };
            if rows >= 64 {
                table.par_chunks_mut(hidden).enumerate().for_each(copy);
            } else {
                table.chunks_mut(hidden).enumerate().for_each(copy);
            }
        })?;
        Ok(count)
    }
}
