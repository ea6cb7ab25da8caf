//! `VkOps`: the Vulkan op library's answers to the executor (`OpLib`): its name and which
//! ops and weight formats it runs. The answers follow the kernels' limits (attention heads of
//! at most 256 columns, routers of at most 1024 experts and 64 ranks, routed experts of at most
//! 1024 experts a layer, Gated DeltaNet and Kimi Delta Attention heads of at most 256 columns
//! and kernels of at most 8, short convolutions of kernels of at most 8, MLA latents of at most
//! 1024 columns and rope parts of at most 128, hyper-connections of at most 6 streams,
//! attention over compressed entries of one KV head of at most 512 columns, KV compressors of
//! entries of at most 512).
//!
//! Must not: run anything (frames do), or claim an op without a tested kernel.

use super::context::Context;
use crate::format::WeightFormat;
use crate::oplib::OpLib;
use coli_compiler::ir::Op;

/// The Vulkan backend as the executor sees it.
#[derive(Clone, Debug)]
pub struct VkOps {
    pub ctx: Context,
}

impl VkOps {
    pub fn new(ctx: Context) -> VkOps {
        VkOps { ctx }
    }
}

impl OpLib for VkOps {
    fn name(&self) -> String {
        format!("vulkan: {}", self.ctx.caps().name)
    }

    fn supports(&self, op: &Op, _format: Option<WeightFormat>) -> bool {
        // Every weight format has a GEMV, GEMM and gather variant (shaders/wformat.glsl).
        match op {
            // A weight selecting rows of a fused tensor (Qwen3-Next's query and gate) goes up
            // as the tensor of its rows the weight store made at load (`name_row_selections`).
            Op::Linear { .. } => true,
            Op::Embed { .. } => true,
            // Unweighted too (DeepSeek V4's query norm: `rms_norm.comp`'s weight of ones), and
            // RoPE on the heads' last columns and inverted (V4's: `rope.comp`'s skip and inverse).
            Op::RmsNorm { .. } => true,
            Op::Rope { .. } => true,
            // DeepSeek V4's limited SwiGLU too (`glu.comp`'s kind 3, as the fused inputs).
            Op::Glu { .. } => true,
            Op::Act { .. } | Op::Add { .. } | Op::Mul { .. } => true,
            // With relative logits too (Inkling: the f32 kernels; placement never splits such a
            // layer's KV mirror, whose split parts do not add them). Over a KV compressor's
            // entries too (DeepSeek V4: `ops/compressed.rs`, one KV head of at most 512 columns;
            // the entries the host's compressor closed, mirrored by `exec::device::compressed`).
            Op::Attention { spec, .. } if spec.compressed.is_some() => super::ops::CompressedShape::supported(spec),
            Op::Attention { spec, .. } => {
                spec.head_dim <= 256 && spec.v_head_dim <= 256 && spec.kv_heads > 0 && spec.heads % spec.kv_heads == 0
            }
            // Sqrt-softplus scores and hash routing too (DeepSeek V4: `route.comp`'s modes);
            // not a router with shared experts or a weight-held scale.
            Op::Route { top_k, groups, hash, shared, scale_by, .. } => {
                *top_k <= 64
                    && groups.is_none_or(|(g, _)| g <= 64)
                    && (hash.is_none() || groups.is_none())
                    && *shared <= 64
                    && (hash.is_none() || (*shared == 0 && scale_by.is_none()))
            }
            // Routed experts in a frame (`ops/moe.rs`): the layer's experts stacked on the device
            // (with DeepSeek V4's limited SwiGLU too).
            Op::RoutedExperts { experts, weights, .. } => {
                experts + weights.shared.as_ref().map_or(0, |s| s.count) <= super::ops::moe::MAX_EXPERTS
            }
            // Gated DeltaNet (`ops/deltanet.rs`) and Kimi Delta Attention (`ops/kda.rs`) within
            // the kernels' head widths and kernel length.
            // Inkling's short convolutions too (`ops/short_conv.rs`: the same convolution kernel
            // in its row mode).
            Op::LinearAttention { spec, .. } => {
                super::ops::DeltaNetShape::supported(spec)
                    || super::ops::KdaShape::supported(spec)
                    || super::ops::short_conv::supported(spec)
            }
            // Multi-head latent attention (`ops/mla.rs`) within the kernels' latent and rope widths.
            // Over an indexer's selection too (`mla_attn_sparse.comp`).
            Op::Mla { spec, .. } => super::ops::MlaShape::supported(spec),
            // DeepSeek Sparse Attention's indexer (`exec::device::indexer`): its RoPE on pairs
            // within each head, heads of at most 128 columns (`dsa_score.comp`'s key tile).
            Op::Indexer { spec, .. } => {
                spec.heads > 0
                    && spec.head_dim > 0
                    && spec.head_dim <= super::ops::dsa::DSA_MAX_DIM
                    && spec.rope_dim.is_multiple_of(2)
                    && spec.rope_dim <= spec.head_dim
            }
            // DeepSeek V4's hyper-connections (`ops/hyper.rs`) within the kernels' streams, and its
            // grouped output projection (a product per group on the matrix kernels).
            Op::HyperPre { spec, .. } => (1..=super::ops::hyper::MAX_STREAMS).contains(&spec.streams),
            Op::HyperPost { streams, .. } => (1..=super::ops::hyper::MAX_STREAMS).contains(streams),
            Op::GroupedLinear { groups, .. } => *groups > 0,
            // DeepSeek V4's KV compressor (`exec::device::compressor`: its products and
            // `compress_pool.comp`; its lightning indexer's scores and top-k `dsa_select` over
            // the indexer's entries).
            Op::KvCompress { spec, .. } => super::ops::PoolShape::parts_of(spec).is_some(),
            Op::LayerNorm { .. } | Op::Input { .. } => false,
            // Row by row copies (`Frame::concat`).
            Op::Concat { .. } => true,
        }
    }
}
