//! The buffers a routed-experts call works in (`MoeScratch`), sized once for the largest chunk
//! and reused by every layer; `Context::moe_scratch` makes them.

use crate::vk::context::{Context, DeviceBuffer};
use crate::vk::error::Result;
use crate::vk::memory::MemoryUse;

/// Buffers `Frame::moe` works in, for chunks of up to `rows` rows.
#[derive(Debug)]
pub struct MoeScratch {
    pub(super) rows: usize,
    pub(super) top_k: usize,
    pub(super) hidden: usize,
    pub(super) ffn: usize,
    pub(super) experts: usize,
    pub(super) xq: DeviceBuffer,
    pub(super) xd: DeviceBuffer,
    pub(super) h: DeviceBuffer,
    pub(super) hq: DeviceBuffer,
    pub(super) hd: DeviceBuffer,
    /// The pairs' outputs (`pairs x hidden`) before their sum.
    pub(super) y: DeviceBuffer,
    /// The cooperative gate/up's raw sums (`pairs x 2 ffn`) before `moe_glu_q8.comp` (one
    /// float on a device without int8 cooperative matrices). Not `y`: paged experts keep the
    /// pairs' outputs of earlier pages there.
    pub(super) gu: DeviceBuffer,
    pub(super) groups: DeviceBuffer,
    /// The routing as one page of paged experts sees it (`pairs x 2`, `moe_pages`).
    pub(super) page_routing: DeviceBuffer,
    /// A count per block of h that the per-pair gate/up GEMV bumps as it writes the block's
    /// values (zeros at the start; each dispatch adds 32 a block, so they wrap to the start).
    pub(super) h_counts: DeviceBuffer,
}

impl MoeScratch {
    /// Device bytes the scratch takes.
    pub fn device_bytes(&self) -> usize {
        [
            &self.xq,
            &self.xd,
            &self.h,
            &self.hq,
            &self.hd,
            &self.y,
            &self.gu,
            &self.groups,
            &self.page_routing,
            &self.h_counts,
        ]
        .iter()
        .map(|b| b.len_bytes())
        .sum()
    }
}

/// Bytes of q8 activations (values, then (d, sum) per block) for `elems` elements.
fn q8_bytes(elems: usize) -> (usize, usize) {
    let blocks = elems.div_ceil(32).max(1);
    (blocks * 32, blocks * 8)
}

impl Context {
    /// Scratch for `Frame::moe` over chunks of up to `rows` rows, for layers of at most
    /// `experts` experts of `hidden` x `ffn`, `top_k` ranks.
    pub fn moe_scratch(
        &self,
        rows: usize,
        top_k: usize,
        hidden: usize,
        ffn: usize,
        experts: usize,
    ) -> Result<MoeScratch> {
        let pairs = rows.max(1) * top_k.max(1);
        let (xq, xd) = q8_bytes(rows.max(1) * hidden);
        let (hq, hd) = q8_bytes(pairs * ffn);
        Ok(MoeScratch {
            rows,
            top_k,
            hidden,
            ffn,
            experts,
            xq: self.buffer(MemoryUse::Device, xq)?,
            xd: self.buffer(MemoryUse::Device, xd)?,
            h: self.f32_buffer((pairs * ffn).max(1))?,
            hq: self.buffer(MemoryUse::Device, hq)?,
            hd: self.buffer(MemoryUse::Device, hd)?,
            y: self.f32_buffer((pairs * hidden).max(1))?,
            gu: self.f32_buffer(if self.caps().coopmat_i8.is_some() { pairs * 2 * ffn } else { 1 })?,
            groups: self.f32_buffer(experts + 1 + pairs)?,
            page_routing: self.f32_buffer(pairs * 2)?,
            h_counts: self.upload_u32(&vec![0; (pairs * ffn).div_ceil(32).max(1)])?,
        })
    }
}
