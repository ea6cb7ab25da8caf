//! The op layer: safe functions that check their operands and record kernels into a `Frame`.
//! Each op states its CPU reference (the function in `runtime/src/cpu/` or `format::matmul`
//! it must agree with) and the arithmetic it shares with it.
//!
//! Must not: call Vulkan directly (only through `Frame::dispatch`), or submit.

pub mod attention;
pub mod attn_part;
pub mod attn_seqs;
pub mod compress_pool;
pub mod compressed;
pub mod deltanet;
pub mod dsa;
pub mod elementwise;
pub mod hyper;
pub mod kda;
pub mod kv_append;
pub mod matmul;
pub mod mla;
pub mod moe;
pub mod moe_glu;
pub mod moe_pages;
pub mod moe_scratch;
pub mod norm;
pub mod route;
pub mod short_conv;

pub use attention::{
    AttnArgs, AttnPath, AttnShape, DecodeArgs, KvMirror, KvShape, KvType, Pos, QkNorm, RelArgs, RopeArgs, RopeKvArgs,
    COOP_ATTN_ROWS, COOP_MIN_WINDOW,
};
pub use attn_seqs::MAX_SEQS as MAX_ATTN_SEQS;
pub use compress_pool::{PoolArgs, PoolShape};
pub use compressed::{CompressedArgs, CompressedShape};
pub use deltanet::{DeltaNetCall, DeltaNetIn, DeltaNetMats, DeltaNetScratch, DeltaNetShape, RuleViews};
pub use dsa::{DsaSelectArgs, DsaShape};
pub use hyper::{HyperMix, HyperShape};
pub use kda::{KdaCall, KdaMats, KdaRuleViews, KdaScratch, KdaShape};
pub use matmul::{MatIn, MatmulPath, QuantizedActs};
pub use mla::{MlaAttnArgs, MlaCache, MlaCall, MlaKvArgs, MlaMats, MlaQuery, MlaScratch, MlaSeq, MlaShape};
pub use moe::{DeviceExperts, MoeCall, MoePath, MoeRoute, PackedExpert, MAX_EXPERTS as MOE_MAX_EXPERTS};
pub use moe_glu::MoeGluQ8;
pub use moe_pages::ExpertPages;
pub use moe_scratch::MoeScratch;
pub use route::{RouteHash, RouteParams, RouteSink};
pub use short_conv::RowConv;

use super::context::View;
use super::error::{Result, VkError};
use super::frame::Frame;
use super::shaders::{spirv, FormatVariant, Kernel};

/// Activation rows (a dense product's rows, a grouped product's chunk rows) from which the
/// GEMMs with q8 activations take the cooperative-matrix kernels (`matmul_coop.comp`,
/// `moe_matmul_coop.comp`) where the device has them; below, a 64 x 64 tile is mostly empty.
pub const COOP_MIN_ROWS: usize = 32;

impl Frame<'_> {
    /// Whether a GEMM of `variant` over `rows` activation rows takes the cooperative-matrix
    /// kernel: a format with q8 activations whose blocks the kernels decode (a blob compiled
    /// for it: `COOP_FORMATS` in shaders/variants.rs), at least `COOP_MIN_ROWS` rows, and an
    /// int8 shape on the device (`DeviceCaps::coopmat_i8`, absent with `CoopMatUse::Off`).
    pub(crate) fn coop_i8(&self, variant: FormatVariant, rows: usize) -> bool {
        variant.q8_acts()
            && rows >= COOP_MIN_ROWS
            && self.ctx.caps().coopmat_i8.is_some()
            && spirv(Kernel::MatmulCoop, Some(variant)).is_some()
    }
}

/// Workgroups of `size` covering `count` invocations.
pub(crate) fn groups_for(count: usize, size: usize) -> u32 {
    count.div_ceil(size) as u32
}

/// Checks that a ring of `ring` rows holds every row `n` query rows see (their window and the
/// block's rows before the last: `window + n - 1`); a ring needs a window. Returns the ring.
pub(crate) fn check_ring(op: &'static str, ring: usize, window: Option<usize>, n: usize) -> Result<usize> {
    if window.is_none_or(|w| ring + 1 < w + n) {
        return Err(VkError::BadArgument {
            op,
            msg: format!("a ring of {ring} rows for a window of {window:?} and {n} rows"),
        });
    }
    Ok(ring)
}

/// Values pushed as u32 must fit.
/// Refuses any of `views` (named) that does not start at element 0 (a kernel that indexes the
/// buffer from its start).
pub(crate) fn at_element_0(op: &'static str, views: &[(View, &str)]) -> Result<()> {
    match views.iter().find(|(v, _)| v.offset != 0) {
        Some((_, what)) => Err(VkError::BadArgument { op, msg: format!("{what} views must start at element 0") }),
        None => Ok(()),
    }
}

pub(crate) fn u32_arg(op: &'static str, what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| VkError::BadArgument { op, msg: format!("{what} = {v} does not fit 32 bits") })
}
