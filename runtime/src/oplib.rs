//! The op-library interface: what every backend (CPU, Vulkan) answers about itself. The
//! executor asks `supports` before it places an op, so an op a library cannot run is a clear
//! error at load (or a cut to the CPU), never a failure in the middle of a forward.

use crate::format::WeightFormat;
use coli_compiler::ir::Op;

/// A backend's answers about what it can run.
pub trait OpLib {
    /// The library's name, for messages (`cpu`, `vulkan: NVIDIA H200`).
    fn name(&self) -> String;
    /// Whether the library runs `op` with its weights in `format` (`None` for an op without
    /// weights, or for the format of its first weight unknown).
    fn supports(&self, op: &Op, format: Option<WeightFormat>) -> bool;
}

/// The short name of an op, for messages.
pub fn op_name(op: &Op) -> &'static str {
    match op {
        Op::Embed { .. } => "embed",
        Op::Input { .. } => "input",
        Op::Concat { .. } => "concat",
        Op::RmsNorm { .. } => "rms_norm",
        Op::LayerNorm { .. } => "layer_norm",
        Op::Linear { .. } => "linear",
        Op::GroupedLinear { .. } => "grouped_linear",
        Op::HyperPre { .. } => "hyper_pre",
        Op::HyperPost { .. } => "hyper_post",
        Op::Rope { .. } => "rope",
        Op::Attention { .. } => "attention",
        Op::Act { .. } => "act",
        Op::Glu { .. } => "glu",
        Op::Add { .. } => "add",
        Op::Mul { .. } => "mul",
        Op::Route { .. } => "route",
        Op::RoutedExperts { .. } => "routed_experts",
        Op::Mla { .. } => "mla",
        Op::Indexer { .. } => "indexer",
        Op::KvCompress { .. } => "kv_compress",
        Op::LinearAttention { .. } => "linear_attention",
    }
}
