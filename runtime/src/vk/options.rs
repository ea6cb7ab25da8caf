//! The options of a Vulkan context, as one typed struct the caller passes explicitly
//! (command-line flags map onto it; nothing here reads the environment).
//!
//! Must not: read environment variables or files.

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

/// Make the n-th operation of a kind fail, to test the fallback paths (1-based counts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultInjection {
    /// The n-th queue submission fails as a lost device (the context stays lost).
    pub fail_submit: Option<u64>,
    /// The n-th device-memory allocation (a block, not a sub-allocation) is refused as
    /// out of memory.
    pub fail_alloc: Option<u64>,
}

/// Options of `Context::new`.
#[derive(Clone, Debug, Default)]
pub struct VkOptions {
    /// Take the first device whose name contains this (case-insensitive); else the best:
    /// discrete > integrated > virtual > CPU (Lavapipe).
    pub device_name: Option<String>,
    /// Use at most this many bytes of device memory, whatever the device has (tests make a
    /// large device behave like a small one).
    pub memory_cap: Option<u64>,
    /// Fault injection, for tests of the fallback.
    pub fault: Option<FaultInjection>,
    /// How weights are uploaded.
    pub upload: UploadPath,
    /// Enable the Khronos validation layer when it is installed (development).
    pub validation: bool,
    /// Time every command on the device (timestamp queries) and sum the times per kernel
    /// (`Context::profile`); costs a little on each command.
    pub profile: bool,
}
