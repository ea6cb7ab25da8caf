//! The options of a Vulkan context, as one typed struct the caller passes explicitly
//! (command-line flags map onto it).
//!
//! One environment override, read here and nowhere else in the Vulkan layer:
//!
//! | variable | values | effect |
//! |---|---|---|
//! | `COLI_VK_VALIDATION` | `1` (on), `0` or unset (off) | `Validation::default()`: every context made with the default option runs under `VK_LAYER_KHRONOS_validation` (so CI runs the device tests under it without editing them: `COLI_VK_VALIDATION=1 cargo test -p coli-runtime --test 'vk_*'`); another value is `VkError::BadEnvironment` at `Context::new` |
//!
//! Must not: read other environment variables, or files.

/// How resident data (weights) reaches device memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UploadPath {
    /// Staged when the host-visible device-local window is small (a discrete card without
    /// Resizable BAR: less than a quarter of the largest device-local heap) or absent;
    /// written through a mapping otherwise (Resizable BAR, integrated GPUs, Lavapipe).
    #[default]
    Auto,
    /// Always through a mapping of host-visible device-local memory.
    Mapped,
    /// Always into memory the host does not map, copied from a staging buffer.
    Staged,
}

/// Whether prompt GEMMs may run on cooperative matrices (tensor cores).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CoopMatUse {
    /// Where the device has a suitable int8 shape (`DeviceCaps::coopmat_i8`): the GEMMs of
    /// the formats with q8 activations (`matmul_coop.comp`, `moe_matmul_coop.comp`) from
    /// `COOP_MIN_ROWS` activation rows.
    #[default]
    Auto,
    /// Never: the f32 tiles everywhere (comparison benchmarks and tests); the extension is
    /// not enabled.
    Off,
}

/// Whether the kernels with 8-bit activations use the device's packed integer dot product.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IntDotUse {
    /// Where the device has it (Vulkan 1.3's `shaderIntegerDotProduct`): the `HW_DOT`
    /// variants of the GEMV and GEMM shaders.
    #[default]
    Auto,
    /// Never: the byte arithmetic (comparison benchmarks and tests); the feature is not
    /// enabled.
    Off,
}

/// The variable `Validation::default()` reads.
pub const VALIDATION_ENV: &str = "COLI_VK_VALIDATION";

/// Whether a context runs under the Khronos validation layer (`VK_LAYER_KHRONOS_validation`,
/// Debian's `vulkan-validationlayers`), a development and CI mode: every message of severity
/// error or warning is counted (`Context::validation_counts`) and logged to stderr in one line,
/// the first submission after an error fails with `VkError::Validation`, and a process that saw
/// an error nobody took (`Context::take_validation_errors`) exits with status 1 at its end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Validation {
    /// No layer (the default when `COLI_VK_VALIDATION` is unset or `0`).
    Off,
    /// The layer's default checks plus synchronization validation (missing or wrong
    /// barriers); `Context::new` fails with `VkError::NoValidationLayer` when the layer is not
    /// installed.
    On,
    /// `COLI_VK_VALIDATION` held a value other than `0` or `1` (refused by `Context::new`).
    BadEnv(String),
}

impl Default for Validation {
    /// `On` when `COLI_VK_VALIDATION=1`, `Off` when it is unset, empty or `0`.
    fn default() -> Validation {
        match std::env::var(VALIDATION_ENV) {
            Err(std::env::VarError::NotPresent) => Validation::Off,
            Ok(v) if v.is_empty() || v == "0" => Validation::Off,
            Ok(v) if v == "1" => Validation::On,
            Ok(v) => Validation::BadEnv(v),
            Err(std::env::VarError::NotUnicode(v)) => Validation::BadEnv(v.to_string_lossy().into_owned()),
        }
    }
}

/// Make the n-th operation of a kind fail, to test the fallback paths (1-based counts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultInjection {
    /// The n-th queue submission fails as a lost device (the context stays lost).
    pub fail_submit: Option<u64>,
    /// The n-th device-memory allocation (a block, not a sub-allocation) is refused as
    /// out of memory.
    pub fail_alloc: Option<u64>,
}

/// Which of the machine's devices a context opens.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DeviceRole {
    /// The primary device: the first whose name contains `device_name`, else the best kind.
    #[default]
    Primary,
    /// A second device beside the primary one that `primary_name` picks (the primary's own
    /// `device_name`): the first other device whose name contains `device_name`, else the best
    /// GPU other than the primary. With no other device, the primary's physical device opens
    /// again as a second logical device of its own (how one GPU, or Lavapipe, stands in for
    /// two in tests).
    Second { primary_name: Option<String> },
}

/// Options of `Context::new`.
#[derive(Clone, Debug, Default)]
pub struct VkOptions {
    /// Take the first device whose name contains this (case-insensitive); else the best:
    /// discrete > integrated > virtual > CPU (Lavapipe). For a second device, see `role`.
    pub device_name: Option<String>,
    /// The primary device or a second one beside it.
    pub role: DeviceRole,
    /// Use at most this many bytes of device memory, whatever the device has (tests make a
    /// large device behave like a small one).
    pub memory_cap: Option<u64>,
    /// Fault injection, for tests of the fallback.
    pub fault: Option<FaultInjection>,
    /// How weights are uploaded.
    pub upload: UploadPath,
    /// The Khronos validation layer, counted and logged messages (default: from
    /// `COLI_VK_VALIDATION`).
    pub validation: Validation,
    /// Time every command on the device (timestamp queries) and sum the times per kernel
    /// (`Context::profile`); costs a little on each command.
    pub profile: bool,
    /// Print each compute pipeline's driver statistics to stderr when it is created, one line
    /// a pipeline (`pipeline KERNEL VARIANT: NAME=VALUE, ...`: registers, shared memory,
    /// spills, whatever the driver reports; `Context::pipeline_stats` keeps them), for tuning
    /// kernels against register pressure and occupancy. Needs
    /// `VK_KHR_pipeline_executable_properties` (`DeviceCaps::pipeline_executable_info`), which
    /// is enabled only with this option; on a device without it `Context::new` prints one line
    /// saying so and nothing else changes. A failed query prints a line and never fails the
    /// pipeline.
    pub pipeline_stats: bool,
    /// Cooperative-matrix GEMMs where the device has them, or never.
    pub coopmat: CoopMatUse,
    /// The packed integer dot product where the device has it, or never.
    pub int_dot: IntDotUse,
    /// Dense products of at most this many rows (a batched decode step's) take the GEMV, one
    /// pass over the weights per row, instead of the tiled GEMMs (default
    /// `DEFAULT_GEMV_ROWS`).
    pub gemv_rows: Option<usize>,
    /// Routed-expert products of at most this many rows take per-pair GEMVs instead of the
    /// grouped GEMMs (default `DEFAULT_MOE_GEMV_ROWS`).
    pub moe_gemv_rows: Option<usize>,
    /// Of those, products of at most this many rows take one GEMV per (row, rank) pair; more
    /// take one GEMV per expert over the pairs routed to it (default `DEFAULT_MOE_PAIR_ROWS`).
    pub moe_pair_rows: Option<usize>,
    /// A layer's resident experts in stacks of at most this many bytes a buffer (default and
    /// most: the device's storage-buffer range and allocation size); a layer beyond it goes up
    /// in pages (`vk::ops::moe_pages`). Tests make pages of a small fixture with it.
    pub expert_page_bytes: Option<u64>,
    /// The attention layers' K/V mirrors (and their read-back rows) in f32 (the default) or
    /// in 16-bit floats: half the memory and half the bytes decode attention reads, the values
    /// rounded to f16 (the host's cache then holds the same rounded values). A device without
    /// 16-bit storage buffers keeps f32 (`Context::kv_mirror` says which).
    pub kv_mirror: super::kv_type::KvType,
}

/// Rows up to which a dense product takes the GEMV by default: below the cooperative GEMMs'
/// rows. The f32 tiled GEMM of a few rows has too few workgroups to keep a large device busy
/// (measured on the H200, docs/BENCHMARKS.md: Llama-3.1-8B Q8_0 at 16 streams 106 tok/s on
/// the tiles, 416 on the GEMV).
pub const DEFAULT_GEMV_ROWS: usize = 31;

/// Rows up to which a routed-expert product takes per-pair GEMVs by default: a batched decode
/// step's. The grouped GEMMs of a few rows per expert are slower (measured on the H200,
/// docs/BENCHMARKS.md: OLMoE-1B-7B Q8_0 at 16 streams 220 tok/s grouped, 1,385 per pair; at 64
/// streams 1,034 on the cooperative grouped GEMM, 1,322 per pair); prompt chunks take the
/// grouped GEMMs.
pub const DEFAULT_MOE_GEMV_ROWS: usize = 64;

/// Rows up to which a routed-expert GEMV runs one pass over an expert's weights per (row,
/// rank) pair by default; from there one pass per expert serves up to 8 of its pairs
/// (`moe_matvec.comp` modes 3 and 4), which pays a grouping dispatch and the join of the pairs.
/// Measured on the H200 (docs/BENCHMARKS.md, OLMoE-1B-7B Q8_0): at 64 streams the experts'
/// device time per step 12.5 -> 9.0 ms; at 4 streams per pair was ahead (1,042-1,200 tok/s
/// against 961-975).
pub const DEFAULT_MOE_PAIR_ROWS: usize = 8;
