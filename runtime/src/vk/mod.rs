//! The Vulkan op library: a thin, unsafe Vulkan layer split by concern (`instance`, `device`,
//! `memory`/`arena`, `pipeline`, `command`, `context`, `frame`) under a safe op layer (`ops`,
//! `layout`) whose every op agrees with the CPU reference within a stated tolerance.
//! Shaders are GLSL under `shaders/`, committed as SPIR-V (`shaders/spirv/`) and embedded by `runtime/build.rs`.
//!
//! Typical use:
//! ```no_run
//! # use coli_runtime::vk::*;
//! # fn main() -> Result<(), VkError> {
//! let ctx = Context::new(&VkOptions::default())?;
//! let w = ctx.upload_matrix(coli_runtime::format::WeightFormat::F32, 2, 4, &[0u8; 32])?;
//! let x = ctx.upload_f32(&[1.0, 2.0, 3.0, 4.0])?;
//! let y = ctx.f32_buffer(2)?;
//! let mut f = ctx.frame()?;
//! f.matmul(&w, x.all(), 1, y.all())?;
//! f.run()?;
//! let out = ctx.download_f32(y.all())?;
//! # Ok(()) }
//! ```
//!
//! Must not: be required: a machine without Vulkan gets `VkError::NoLoader` from
//! `Context::new` and the caller runs on the CPU.

mod arena;
mod command;
mod context;
mod device;
mod error;
mod frame;
mod hazards;
mod instance;
mod kv_io;
mod kv_type;
mod layout;
mod memory;
mod oplib;
pub mod ops;
mod options;
mod pipeline;
pub use pipeline::PUSH_BYTES;
mod push;
mod shaders;
mod validation;

pub use arena::MemoryStats;
pub use context::{Context, DeviceBuffer, View};
pub use device::{
    choose_coopmat_i8, choose_device, choose_second, Candidate, CoopMatI8, CoopMatShape, CoopType, DeviceCaps,
    DeviceKind,
};
pub use error::VkError;
pub use frame::{Frame, Recorded};
pub use layout::{pack, DeviceMatrix, Packed};
pub use memory::{place, BlockAllocator, MemType, MemoryProps, MemoryUse, Placement};
pub use oplib::VkOps;
pub use ops::elementwise::Broadcast;
pub use ops::norm::{NormArgs, RopePart, RopeShape};
pub use ops::{
    AttnArgs, AttnPath, AttnShape, CompressedArgs, CompressedShape, DecodeArgs, DeltaNetCall, DeltaNetIn, DeltaNetMats,
    DeltaNetScratch, DeltaNetShape, DeviceExperts, DsaSelectArgs, DsaShape, ExpertPages, HyperMix, HyperShape, KdaCall,
    KdaMats, KdaRuleViews, KdaScratch, KdaShape, KvMirror, KvShape, KvType, MatIn, MatmulPath, MlaAttnArgs, MlaCache,
    MlaCall, MlaKvArgs, MlaMats, MlaQuery, MlaScratch, MlaSeq, MlaShape, MoeCall, MoeGluQ8, MoePath, MoeRoute,
    MoeScratch, PackedExpert, PoolArgs, PoolShape, Pos, QkNorm, QuantizedActs, RelArgs, RopeArgs, RopeKvArgs,
    RouteHash, RouteParams, RouteSink, RowConv, MAX_ATTN_SEQS, MOE_MAX_EXPERTS,
};
pub use options::{
    CoopMatUse, DeviceRole, FaultInjection, IntDotUse, UploadPath, Validation, VkOptions, DEFAULT_GEMV_ROWS,
    DEFAULT_MOE_GEMV_ROWS, DEFAULT_MOE_PAIR_ROWS, VALIDATION_ENV,
};
pub use push::{PushLayout, PUSH_LAYOUTS};
pub use shaders::{FormatVariant, Kernel};
pub use validation::{validation_counts, ValidationCounts};
