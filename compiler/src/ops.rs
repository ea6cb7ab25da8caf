//! The op kinds of the program and their metadata, in one table: the name printed in plans and
//! profiles, whether the op is a host step (it cuts a device frame), and whether a profile that
//! lists no kinds runs it.
//!
//! `OpKind` is what a device profile lists as runnable and what placement asks about. This
//! module must not hold per-model knowledge.

use crate::ir::{GluKind, LinearAttentionKind, Op, RouterScoring};
use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum OpKind {
    Embed,
    RmsNorm,
    LayerNorm,
    Linear,
    Rope,
    Attention,
    Act,
    Glu,
    Add,
    Mul,
    Route,
    RoutedExperts,
    Mla,
    LinearAttention,
    /// A Gated DeltaNet whose input projections are apart (`LinearAttentionSpec::
    /// projections_apart`, Qwen3.5): a kind of its own, so that a device whose kernels read
    /// only the grouped layout does not claim it by listing `linear_attention` (coli's Vulkan
    /// library reads both).
    LinearAttentionApart,
    /// Kimi Delta Attention (`LinearAttentionKind::Kda`): a kind of its own, so that a device
    /// runs it only where its profile lists `kda` (a probed Vulkan profile does).
    Kda,
    /// Attention with relative-position logits (`AttentionSpec::rel`, Inkling): a kind of its
    /// own, so a profile that lists `attention` alone does not claim it (coli's Vulkan library
    /// runs it; placement never splits such a layer's KV mirror).
    AttentionRel,
    /// A short convolution on a row stream (`LinearAttentionKind::ShortConv`): a kind of its
    /// own, so a profile that lists `linear_attention` alone does not claim it (coli's Vulkan
    /// library runs it).
    ShortConv,
    /// An RMSNorm whose output is scaled (`Op::RmsNorm::scale != 1`): a kind of its own, so a
    /// profile that lists `rms_norm` alone does not claim it (coli's Vulkan library runs it).
    RmsNormScaled,
    /// A router with shared experts in its normalisation or a weight-held scale
    /// (`Op::Route::shared`, `scale_by`).
    RouteShared,
    /// Routed experts with shared experts beside them (`ExpertWeights::shared`): the shared ones
    /// held as the routing names them, past the routed, in the expert tier's slots and in a
    /// device's resident experts.
    RoutedExpertsShared,
    /// DeepSeek Sparse Attention's indexer (`Op::Indexer`): its key cache beside the MLA
    /// latents (a kind of its own, so a profile that lists `mla` alone does not claim it).
    Indexer,
    /// MLA over an indexer's selection (`MlaSpec::select`): the CPU and the Vulkan library run
    /// it (a kind of its own, so a profile that lists `mla` alone does not claim it).
    MlaSparse,
    /// A block-diagonal linear (`Op::GroupedLinear`, DeepSeek V4's `o_a_proj`): the CPU and
    /// coli's Vulkan library run it.
    GroupedLinear,
    /// Hyper-connections' mix into a sublayer and out of it (`Op::HyperPre`, `Op::HyperPost`):
    /// the CPU and coli's Vulkan library run them.
    HyperPre,
    HyperPost,
    /// An RMSNorm without a weight (`Op::RmsNorm::weight` none): a kind of its own, so a
    /// profile that lists `rms_norm` alone does not claim it (coli's Vulkan library runs it).
    RmsNormUnweighted,
    /// RoPE on the last columns of each head or by the opposite angles (`Op::Rope::tail`,
    /// `inverse`): a kind of its own, so a profile that lists `rope` alone does not claim it
    /// (coli's Vulkan library runs it).
    RopeTail,
    /// DeepSeek V4's clamped SwiGLU (`GluKind::LimitedSwiGlu`) as a `Glu` and in routed experts:
    /// kinds of their own, so a profile that lists `glu` or `routed_experts` alone does not
    /// claim them (coli's Vulkan library, its expert tier and resident experts run them).
    GluLimited,
    RoutedExpertsLimited,
    /// A router scoring by `sqrt(softplus)` (`RouterScoring::SqrtSoftplus`), or routing by a
    /// token's row of a hash table (`Op::Route::hash`): kinds of their own, so a profile that
    /// lists `route` alone does not claim them (coli's Vulkan library runs them in a frame where
    /// the layer's experts are resident).
    RouteSqrtSoftplus,
    RouteHash,
    /// DeepSeek V4's KV compressor (`Op::KvCompress`), and with the lightning indexer
    /// (compressed sparse attention) a kind of its own, so a profile that lists `kv_compress`
    /// alone does not claim it (coli's Vulkan library runs both, their state following the
    /// host's).
    KvCompress,
    KvCompressIndexed,
    /// Attention over a compressor's entries beside the cached rows (`AttentionSpec::compressed`):
    /// a kind of its own, so a profile that lists `attention` alone does not claim it (coli's
    /// Vulkan library runs it, the entries mirrored from the host's compressor).
    AttentionCompressed,
    /// A draft model's input rows (`Op::Input`): written by the host, always.
    Input,
    /// Two row buffers side by side (`Op::Concat`).
    Concat,
}

/// What placement and printing need to know of an op kind.
#[derive(Clone, Copy, Debug)]
pub struct OpInfo {
    pub kind: OpKind,
    pub name: &'static str,
    /// Runs on the host, always: a device frame ends before it.
    pub host_step: bool,
    /// A device whose profile lists no op kinds runs it (a hand-written profile means the
    /// kinds coli's Vulkan library runs; a kind only the CPU runs is false, and a device runs it
    /// only where its profile lists it).
    pub by_default: bool,
}

/// The table: one row per kind.
pub const OPS: &[OpInfo] = &[
    OpInfo { kind: OpKind::Embed, name: "embed", host_step: false, by_default: true },
    OpInfo { kind: OpKind::RmsNorm, name: "rms_norm", host_step: false, by_default: true },
    OpInfo { kind: OpKind::LayerNorm, name: "layer_norm", host_step: false, by_default: true },
    OpInfo { kind: OpKind::Linear, name: "linear", host_step: false, by_default: true },
    OpInfo { kind: OpKind::Rope, name: "rope", host_step: false, by_default: true },
    OpInfo { kind: OpKind::Attention, name: "attention", host_step: false, by_default: true },
    OpInfo { kind: OpKind::Act, name: "act", host_step: false, by_default: true },
    OpInfo { kind: OpKind::Glu, name: "glu", host_step: false, by_default: true },
    OpInfo { kind: OpKind::Add, name: "add", host_step: false, by_default: true },
    OpInfo { kind: OpKind::Mul, name: "mul", host_step: false, by_default: true },
    OpInfo { kind: OpKind::Route, name: "route", host_step: true, by_default: true },
    OpInfo { kind: OpKind::RoutedExperts, name: "routed_experts", host_step: true, by_default: true },
    OpInfo { kind: OpKind::Mla, name: "mla", host_step: false, by_default: true },
    OpInfo { kind: OpKind::LinearAttention, name: "linear_attention", host_step: false, by_default: true },
    OpInfo { kind: OpKind::LinearAttentionApart, name: "linear_attention_apart", host_step: false, by_default: true },
    OpInfo { kind: OpKind::Kda, name: "kda", host_step: false, by_default: true },
    OpInfo { kind: OpKind::AttentionRel, name: "attention_rel", host_step: false, by_default: true },
    OpInfo { kind: OpKind::ShortConv, name: "short_conv", host_step: false, by_default: true },
    OpInfo { kind: OpKind::RmsNormScaled, name: "rms_norm_scaled", host_step: false, by_default: true },
    OpInfo { kind: OpKind::RouteShared, name: "route_shared", host_step: true, by_default: true },
    OpInfo { kind: OpKind::RoutedExpertsShared, name: "routed_experts_shared", host_step: true, by_default: true },
    OpInfo { kind: OpKind::Indexer, name: "indexer", host_step: false, by_default: true },
    OpInfo { kind: OpKind::MlaSparse, name: "mla_sparse", host_step: false, by_default: true },
    OpInfo { kind: OpKind::GroupedLinear, name: "grouped_linear", host_step: false, by_default: true },
    OpInfo { kind: OpKind::HyperPre, name: "hyper_pre", host_step: false, by_default: true },
    OpInfo { kind: OpKind::HyperPost, name: "hyper_post", host_step: false, by_default: true },
    OpInfo { kind: OpKind::RmsNormUnweighted, name: "rms_norm_unweighted", host_step: false, by_default: true },
    OpInfo { kind: OpKind::RopeTail, name: "rope_tail", host_step: false, by_default: true },
    OpInfo { kind: OpKind::GluLimited, name: "glu_limited", host_step: false, by_default: true },
    OpInfo { kind: OpKind::RoutedExpertsLimited, name: "routed_experts_limited", host_step: true, by_default: true },
    OpInfo { kind: OpKind::RouteSqrtSoftplus, name: "route_sqrt_softplus", host_step: true, by_default: true },
    OpInfo { kind: OpKind::RouteHash, name: "route_hash", host_step: true, by_default: true },
    OpInfo { kind: OpKind::KvCompress, name: "kv_compress", host_step: false, by_default: true },
    OpInfo { kind: OpKind::KvCompressIndexed, name: "kv_compress_indexed", host_step: false, by_default: true },
    OpInfo { kind: OpKind::AttentionCompressed, name: "attention_compressed", host_step: false, by_default: true },
    OpInfo { kind: OpKind::Input, name: "input", host_step: true, by_default: false },
    OpInfo { kind: OpKind::Concat, name: "concat", host_step: false, by_default: true },
];

impl OpKind {
    pub fn info(self) -> &'static OpInfo {
        // The table is indexed by declaration order; a test checks that it stays so.
        &OPS[self as usize]
    }
    pub fn all() -> impl Iterator<Item = OpKind> {
        OPS.iter().map(|i| i.kind)
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.info().name)
    }
}

impl Op {
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Embed { .. } => OpKind::Embed,
            Op::RmsNorm { weight: None, .. } => OpKind::RmsNormUnweighted,
            Op::RmsNorm { scale, .. } if *scale != 1.0 => OpKind::RmsNormScaled,
            Op::RmsNorm { .. } => OpKind::RmsNorm,
            Op::LayerNorm { .. } => OpKind::LayerNorm,
            Op::Linear { .. } => OpKind::Linear,
            Op::Rope { tail, inverse, .. } if *tail || *inverse => OpKind::RopeTail,
            Op::Rope { .. } => OpKind::Rope,
            Op::GroupedLinear { .. } => OpKind::GroupedLinear,
            Op::HyperPre { .. } => OpKind::HyperPre,
            Op::HyperPost { .. } => OpKind::HyperPost,
            Op::Attention { spec, .. } if spec.rel.is_some() => OpKind::AttentionRel,
            Op::Attention { spec, .. } if spec.compressed.is_some() => OpKind::AttentionCompressed,
            Op::Attention { .. } => OpKind::Attention,
            Op::Act { .. } => OpKind::Act,
            Op::Glu { kind: GluKind::LimitedSwiGlu { .. }, .. } => OpKind::GluLimited,
            Op::Glu { .. } => OpKind::Glu,
            Op::Add { .. } => OpKind::Add,
            Op::Input { .. } => OpKind::Input,
            Op::Concat { .. } => OpKind::Concat,
            Op::Mul { .. } => OpKind::Mul,
            Op::Route { hash: Some(_), .. } => OpKind::RouteHash,
            Op::Route { scoring: RouterScoring::SqrtSoftplus, .. } => OpKind::RouteSqrtSoftplus,
            Op::Route { shared, scale_by, .. } if *shared > 0 || scale_by.is_some() => OpKind::RouteShared,
            Op::Route { .. } => OpKind::Route,
            Op::RoutedExperts { weights, .. } if weights.shared.is_some() => OpKind::RoutedExpertsShared,
            Op::RoutedExperts { glu: GluKind::LimitedSwiGlu { .. }, .. } => OpKind::RoutedExpertsLimited,
            Op::RoutedExperts { .. } => OpKind::RoutedExperts,
            Op::Mla { spec, .. } if spec.select.is_some() => OpKind::MlaSparse,
            Op::Mla { .. } => OpKind::Mla,
            Op::Indexer { .. } => OpKind::Indexer,
            Op::KvCompress { spec, .. } if spec.index.is_some() => OpKind::KvCompressIndexed,
            Op::KvCompress { .. } => OpKind::KvCompress,
            Op::LinearAttention { spec, .. } if spec.kind == LinearAttentionKind::Kda => OpKind::Kda,
            Op::LinearAttention { spec, .. } if spec.kind == LinearAttentionKind::ShortConv => OpKind::ShortConv,
            Op::LinearAttention { spec, .. } if spec.projections_apart() => OpKind::LinearAttentionApart,
            Op::LinearAttention { .. } => OpKind::LinearAttention,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_in_declaration_order() {
        for (i, row) in OPS.iter().enumerate() {
            assert_eq!(row.kind as usize, i, "{}", row.name);
        }
    }

    /// A profile that lists no kinds runs what coli's Vulkan library runs (every kind of op it
    /// has a kernel for); host steps never.
    #[test]
    fn a_profile_without_a_list_runs_the_default_kinds() {
        use crate::profile::Features;
        let none = Features::default();
        for k in [
            OpKind::Linear,
            OpKind::Attention,
            OpKind::Mla,
            OpKind::MlaSparse,
            OpKind::LinearAttention,
            OpKind::LinearAttentionApart,
            OpKind::Kda,
            OpKind::RmsNormScaled,
            OpKind::ShortConv,
            OpKind::AttentionRel,
            OpKind::Indexer,
            OpKind::RmsNormUnweighted,
            OpKind::RopeTail,
            OpKind::GluLimited,
            OpKind::GroupedLinear,
            OpKind::HyperPre,
            OpKind::HyperPost,
            OpKind::AttentionCompressed,
            OpKind::KvCompress,
            OpKind::KvCompressIndexed,
        ] {
            assert!(none.runs(k), "{k}");
        }
        assert!(!none.runs(OpKind::Route) && none.lists(OpKind::Route), "a host step is listed, not run in a frame");
        for k in [
            OpKind::RoutedExpertsLimited,
            OpKind::RouteSqrtSoftplus,
            OpKind::RouteHash,
            OpKind::RouteShared,
            OpKind::RoutedExpertsShared,
        ] {
            assert!(none.lists(k) && !none.runs(k), "{k}: listed, a host step");
        }
        let named = Features { ops: Some(vec![OpKind::ShortConv]), ..Features::default() };
        assert!(named.runs(OpKind::ShortConv) && !named.runs(OpKind::Linear));
    }
}
