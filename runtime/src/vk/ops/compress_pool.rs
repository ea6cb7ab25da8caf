//! DeepSeek V4's KV compressor closing windows on the device (`compress_pool.comp`; reference
//! `cpu::compress`): from the layer's projection mirrors (`kv` and `gate`, one row of `half`
//! floats per position), the entries of the windows a block closes, pooled, RMSNormed and
//! RoPE'd, into the entry mirror and read-back rows. The projections are ordinary products
//! into the mirrors (`exec::device::compressed` records them).
//!
//! Must not: keep state, or decide what the mirrors hold.

use super::u32_arg;
use crate::vk::error::{Result, VkError};
use crate::vk::frame::{Bind, Frame};
use crate::vk::push::CompressPoolPush;
use crate::vk::shaders::Kernel;
use crate::vk::View;

/// The widest entry the kernel takes (`MAX_D` in `compress_pool.comp`).
pub const MAX_ENTRY: usize = 512;

/// The geometry of one compressor (`CompressSpec`, or its indexer's at `index.head_dim`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoolShape {
    pub rate: usize,
    pub head_dim: usize,
    pub overlap: bool,
    pub rope_dim: usize,
    pub eps: f32,
}

impl PoolShape {
    /// The shapes of a compressor's parts the kernel runs: the compressor's, then its
    /// indexer's (entries of `index.head_dim`); `None` where the kernel does not take one.
    pub fn parts_of(spec: &coli_compiler::ir::CompressSpec) -> Option<Vec<PoolShape>> {
        let at = |head_dim| PoolShape {
            rate: spec.rate,
            head_dim,
            overlap: spec.overlap,
            rope_dim: spec.rope_dim,
            eps: spec.eps,
        };
        let parts: Vec<PoolShape> =
            std::iter::once(spec.head_dim).chain(spec.index.map(|i| i.head_dim)).map(at).collect();
        let index_ok = spec.index.is_none_or(|i| i.heads > 0 && i.topk > 0);
        (index_ok && parts.iter().all(PoolShape::supported)).then_some(parts)
    }

    /// The width of one projection row (`kv` or `gate`): two halves with overlap.
    pub fn half(&self) -> usize {
        if self.overlap {
            2 * self.head_dim
        } else {
            self.head_dim
        }
    }

    /// Whether the kernel takes it: an entry of at most `MAX_ENTRY`, an even rope part within.
    pub fn supported(&self) -> bool {
        self.rate > 0
            && self.head_dim > 0
            && self.head_dim <= MAX_ENTRY
            && self.rope_dim.is_multiple_of(2)
            && self.rope_dim <= self.head_dim
    }
}

/// What `compress_pool` reads and writes: the projection mirrors (from element 0, every
/// position of the windows it closes), `ape` (`rate x half`), the entries' norm weight, the
/// RoPE's inverse frequencies (`rope_dim / 2`) and mscale, the entry mirror (from element 0)
/// and the read-back rows (`count x head_dim`, from element 0).
#[derive(Clone, Copy)]
pub struct PoolArgs<'a> {
    pub kv: View<'a>,
    pub gate: View<'a>,
    pub ape: View<'a>,
    pub norm: View<'a>,
    pub freq: View<'a>,
    pub mscale: f32,
    pub entries: View<'a>,
    pub back: View<'a>,
}

impl<'a> Frame<'a> {
    /// Closes entries `e0 .. e0 + count` (windows whose every position the mirrors hold).
    pub fn compress_pool(&mut self, s: PoolShape, a: PoolArgs<'a>, e0: usize, count: usize) -> Result<()> {
        const OP: &str = "compress_pool";
        if !s.supported() {
            return Err(VkError::BadArgument { op: OP, msg: format!("{s:?}") });
        }
        let (d, half) = (s.head_dim, s.half());
        let end = e0 + count;
        a.kv.check(OP, "kv", end * s.rate * half)?;
        a.gate.check(OP, "gate", end * s.rate * half)?;
        a.ape.check(OP, "ape", s.rate * half)?;
        a.norm.check(OP, "norm", d)?;
        a.freq.check(OP, "frequencies", s.rope_dim / 2)?;
        a.entries.check(OP, "entries", end * d)?;
        a.back.check(OP, "back", count * d)?;
        let views = [a.kv, a.gate, a.ape, a.norm, a.freq, a.entries, a.back];
        if views.iter().any(|v| v.offset != 0) {
            return Err(VkError::BadArgument { op: OP, msg: "views must start at element 0".into() });
        }
        if count == 0 {
            return Ok(());
        }
        let push = CompressPoolPush {
            dim: d as u32,
            half_: half as u32,
            rate: u32_arg(OP, "rate", s.rate)?,
            overlap: s.overlap as u32,
            e0: u32_arg(OP, "e0", e0)?,
            count: u32_arg(OP, "count", count)?,
            rope_dim: s.rope_dim as u32,
            eps: s.eps,
            mscale: a.mscale,
            pad0: 0,
            pad1: 0,
            pad2: 0,
        };
        let binds = views.map(|v| Bind::buf(v.buf));
        self.dispatch(Kernel::CompressPool, None, &binds, &push, [push.count, 1, 1])
    }
}
