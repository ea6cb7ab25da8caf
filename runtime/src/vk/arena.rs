//! Device memory in large blocks: each use (`MemoryUse`) has an arena of blocks, each block one
//! `VkDeviceMemory` with one buffer over all of it (mapped when host-visible), sub-allocated
//! with `BlockAllocator`. Large requests get a block of their own. The arena counts the
//! device-only memory it holds (not staging or read-back buffers) against the cap
//! (`VkOptions::memory_cap`, else the heap), sizes its last blocks to what the cap has left, and injects
//! allocation faults; running out is `VkError::OutOfMemory`, never a crash. A block of
//! `MemoryUse::PoolImport` is host memory of the process's own (page-aligned, zeroed) imported
//! with `VK_EXT_external_memory_host` (`HostImport`), freed after its device memory.
//!
//! Must not: record commands or know what the bytes are.

use super::error::{Result, VkError, VkResultExt};
use super::memory::{BlockAllocator, MemoryProps, MemoryUse, Placement};
use ash::vk;

/// Default size of a block; requests above half of it get a block of their own.
const BLOCK: u64 = 64 << 20;

struct Block {
    memory: vk::DeviceMemory,
    buffer: vk::Buffer,
    mapped: *mut u8,
    coherent: bool,
    counted: u64,
    dedicated: bool,
    alloc: BlockAllocator,
    /// The host allocation an imported block lives in.
    host: Option<(*mut u8, std::alloc::Layout)>,
}

/// `VK_EXT_external_memory_host`'s entry points and the alignment an imported pointer needs.
pub(crate) struct HostImport {
    pub ext: ash::ext::external_memory_host::Device,
    pub align: u64,
}

/// One sub-allocation: which arena and block, where, how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Allocation {
    pub usage: MemoryUse,
    pub block: usize,
    pub offset: u64,
    pub size: u64,
}

/// Bytes held, for reports and leak tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Device memory held in blocks (what the cap counts).
    pub device_bytes: u64,
    /// Bytes handed out and not yet freed.
    pub used_bytes: u64,
    pub blocks: usize,
    /// Block allocations made so far (what fault injection counts).
    pub allocations: u64,
}

pub(crate) struct Allocator {
    placement: Placement,
    props: MemoryProps,
    limit: u64,
    block_size: u64,
    align: u64,
    max_range: u64,
    arenas: [Vec<Option<Block>>; ARENAS],
    import: Option<HostImport>,
    device_bytes: u64,
    allocations: u64,
    fail_at: Option<u64>,
    /// Blocks (but imported ones) are made so that shaders can reach them by address.
    addresses: bool,
}

// SAFETY: the raw mapped pointers are only dereferenced under the allocator's mutex or through
// ranges a single owner holds; Vulkan handles are plain integers.
unsafe impl Send for Allocator {}

const ARENAS: usize = 5;

fn arena_index(u: MemoryUse) -> usize {
    match u {
        MemoryUse::Device => 0,
        MemoryUse::Upload => 1,
        MemoryUse::Readback => 2,
        MemoryUse::Pool => 3,
        MemoryUse::PoolImport => 4,
    }
}

impl Allocator {
    pub fn new(
        placement: Placement,
        props: MemoryProps,
        cap: Option<u64>,
        align: u64,
        max_range: u64,
        fail_at: Option<u64>,
        import: Option<HostImport>,
    ) -> Allocator {
        let heap = props.heaps[props.types[placement.device as usize].heap as usize].0;
        let limit = cap.map_or(heap, |c| c.min(heap));
        // A small cap gets small blocks, so that the cap means what it says.
        let block_size = BLOCK.min((limit / 8).max(1 << 16)).min(max_range);
        Allocator {
            placement,
            props,
            limit,
            block_size,
            align: align.max(256),
            max_range,
            arenas: Default::default(),
            import,
            device_bytes: 0,
            allocations: 0,
            fail_at,
            addresses: false,
        }
    }

    /// Makes every later block (but imported host memory) reachable by its device address
    /// (the device's `bufferDeviceAddress` enabled).
    pub fn with_addresses(mut self, on: bool) -> Allocator {
        self.addresses = on;
        self
    }

    pub fn placement(&self) -> Placement {
        self.placement
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The heap `MemoryUse::Device` allocates from.
    pub fn device_heap(&self) -> usize {
        self.props.types[self.placement.device as usize].heap as usize
    }

    /// Whether `MemoryUse::PoolImport` is served (the device has `VK_EXT_external_memory_host`).
    pub fn imports(&self) -> bool {
        self.import.is_some()
    }

    pub fn stats(&self) -> MemoryStats {
        let blocks = self.arenas.iter().flatten().flatten();
        let (mut used, mut n) = (0, 0);
        for b in blocks {
            used += b.alloc.used();
            n += 1;
        }
        MemoryStats { device_bytes: self.device_bytes, used_bytes: used, blocks: n, allocations: self.allocations }
    }

    /// Whether blocks of `usage` count against the limit: device-only memory on a device-local
    /// heap. Staging and read-back buffers do not (on a discrete GPU they live in host RAM; on
    /// a device with one heap they would otherwise make a cap hold less than the fit counted).
    fn counts_against_cap(&self, usage: MemoryUse) -> bool {
        let heap = self.props.types[self.placement.type_of(usage) as usize].heap as usize;
        usage == MemoryUse::Device && self.props.heaps[heap].1
    }

    /// Sub-allocates `size` bytes for `usage`, making a new block when none has room.
    ///
    /// # Safety
    /// `dev` must be the device this allocator's memory belongs to.
    pub unsafe fn alloc(&mut self, dev: &ash::Device, usage: MemoryUse, size: u64) -> Result<Allocation> {
        let size = size.max(4);
        if size > self.max_range {
            return Err(VkError::TooLarge { size, max: self.max_range });
        }
        let ai = arena_index(usage);
        let align = self.align;
        if size <= self.block_size / 2 {
            for (bi, b) in self.arenas[ai].iter_mut().enumerate() {
                if let Some(b) = b.as_mut().filter(|b| !b.dedicated) {
                    if let Some(offset) = b.alloc.alloc(size, align) {
                        return Ok(Allocation { usage, block: bi, offset, size });
                    }
                }
            }
        }
        let exact = size.div_ceil(align) * align;
        let dedicated = size > self.block_size / 2;
        let bsize = if dedicated { exact } else { self.block_bytes(usage, exact) };
        let mut block = self.new_block(dev, usage, bsize)?;
        block.dedicated = dedicated;
        let offset = block.alloc.alloc(size, align).expect("a fresh block holds its first allocation");
        let slots = &mut self.arenas[ai];
        let bi = match slots.iter().position(Option::is_none) {
            Some(i) => {
                slots[i] = Some(block);
                i
            }
            None => {
                slots.push(Some(block));
                slots.len() - 1
            }
        };
        Ok(Allocation { usage, block: bi, offset, size })
    }

    /// The size of a new shared block of `usage` for a request of `exact` bytes: the arena's
    /// block size (uploads and read-backs, few and small, an eighth of it), or only what the
    /// cap has left, down to the request itself, when a whole block would pass the cap. So a
    /// cap holds what the fit counted, not a block less.
    fn block_bytes(&self, usage: MemoryUse, exact: u64) -> u64 {
        let full = match usage {
            MemoryUse::Device | MemoryUse::Pool | MemoryUse::PoolImport => self.block_size,
            MemoryUse::Upload | MemoryUse::Readback => (self.block_size / 8).max(1 << 16),
        }
        .max(exact);
        if !self.counts_against_cap(usage) {
            return full;
        }
        let left = self.limit.saturating_sub(self.device_bytes) / self.align * self.align;
        full.min(left.max(exact))
    }

    unsafe fn new_block(&mut self, dev: &ash::Device, usage: MemoryUse, size: u64) -> Result<Block> {
        if usage == MemoryUse::PoolImport {
            return self.import_block(dev, size);
        }
        let type_index = self.placement.type_of(usage);
        let counted = if self.counts_against_cap(usage) { size } else { 0 };
        self.allocations += 1;
        let oom =
            |injected| VkError::OutOfMemory { requested: size, in_use: self.device_bytes, limit: self.limit, injected };
        if self.fail_at == Some(self.allocations) {
            return Err(oom(true));
        }
        if self.device_bytes + counted > self.limit {
            return Err(oom(false));
        }
        let mut usage_flags = vk::BufferUsageFlags::STORAGE_BUFFER
            | vk::BufferUsageFlags::TRANSFER_SRC
            | vk::BufferUsageFlags::TRANSFER_DST;
        if self.addresses {
            usage_flags |= vk::BufferUsageFlags::SHADER_DEVICE_ADDRESS;
        }
        let bci =
            vk::BufferCreateInfo::default().size(size).usage(usage_flags).sharing_mode(vk::SharingMode::EXCLUSIVE);
        let buffer = dev.create_buffer(&bci, None).ctx("vkCreateBuffer")?;
        let req = dev.get_buffer_memory_requirements(buffer);
        if req.memory_type_bits & (1 << type_index) == 0 {
            dev.destroy_buffer(buffer, None);
            return Err(VkError::NoMemoryType("storage buffers of the chosen type"));
        }
        let mut flags_info = vk::MemoryAllocateFlagsInfo::default().flags(vk::MemoryAllocateFlags::DEVICE_ADDRESS);
        let mut mai = vk::MemoryAllocateInfo::default().allocation_size(req.size).memory_type_index(type_index);
        if self.addresses {
            mai = mai.push_next(&mut flags_info);
        }
        let memory = match dev.allocate_memory(&mai, None) {
            Ok(m) => m,
            Err(r) => {
                dev.destroy_buffer(buffer, None);
                return Err(match r {
                    vk::Result::ERROR_OUT_OF_DEVICE_MEMORY | vk::Result::ERROR_OUT_OF_HOST_MEMORY => oom(false),
                    r => VkError::from_vk("vkAllocateMemory", r),
                });
            }
        };
        let cleanup = |e: VkError| {
            dev.destroy_buffer(buffer, None);
            dev.free_memory(memory, None);
            e
        };
        dev.bind_buffer_memory(buffer, memory, 0).ctx("vkBindBufferMemory").map_err(cleanup)?;
        let flags = self.props.types[type_index as usize].flags;
        let map = flags.contains(vk::MemoryPropertyFlags::HOST_VISIBLE)
            && (usage != MemoryUse::Device || self.placement.device_mapped);
        let mapped = if map {
            dev.map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
                .ctx("vkMapMemory")
                .map_err(cleanup)? as *mut u8
        } else {
            std::ptr::null_mut()
        };
        self.device_bytes += counted;
        Ok(Block {
            memory,
            buffer,
            mapped,
            coherent: flags.contains(vk::MemoryPropertyFlags::HOST_COHERENT),
            counted,
            dedicated: false,
            alloc: BlockAllocator::new(size),
            host: None,
        })
    }

    /// A block of host memory of the process's own, imported: 1. allocate `size` (rounded up
    /// to the import alignment) zeroed and aligned; 2. ask which memory types may hold it, and
    /// take a host-visible one (host-cached first); 3. a buffer for external host memory over it,
    /// the memory imported and bound. Any failure frees what was made.
    unsafe fn import_block(&mut self, dev: &ash::Device, size: u64) -> Result<Block> {
        let Some(imp) = &self.import else {
            return Err(VkError::NoMemoryType("imported host memory (no VK_EXT_external_memory_host)"));
        };
        self.allocations += 1;
        let oom =
            |injected| VkError::OutOfMemory { requested: size, in_use: self.device_bytes, limit: self.limit, injected };
        if self.fail_at == Some(self.allocations) {
            return Err(oom(true));
        }
        let align = imp.align.max(4096);
        let size = size.div_ceil(align) * align;
        let layout = std::alloc::Layout::from_size_align(size as usize, align as usize)
            .map_err(|_| VkError::TooLarge { size, max: self.max_range })?;
        let ptr = std::alloc::alloc_zeroed(layout);
        if ptr.is_null() {
            return Err(oom(false));
        }
        let free_host = || std::alloc::dealloc(ptr, layout);
        let ht = vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT;
        let mut hp = vk::MemoryHostPointerPropertiesEXT::default();
        let r = (imp.ext.fp().get_memory_host_pointer_properties_ext)(
            imp.ext.device(),
            ht,
            ptr as *const std::ffi::c_void,
            &mut hp,
        );
        if r != vk::Result::SUCCESS {
            free_host();
            return Err(VkError::from_vk("vkGetMemoryHostPointerPropertiesEXT", r));
        }
        let hv = vk::MemoryPropertyFlags::HOST_VISIBLE;
        let cached = vk::MemoryPropertyFlags::HOST_CACHED;
        let type_index =
            (0..self.props.types.len() as u32).filter(|i| hp.memory_type_bits & (1 << i) != 0).max_by_key(|&i| {
                let f = self.props.types[i as usize].flags;
                (f.contains(hv) as u32) * 2 + f.contains(cached) as u32
            });
        let Some(type_index) = type_index else {
            free_host();
            return Err(VkError::NoMemoryType("imported host memory"));
        };
        let usage_flags = vk::BufferUsageFlags::STORAGE_BUFFER
            | vk::BufferUsageFlags::TRANSFER_SRC
            | vk::BufferUsageFlags::TRANSFER_DST;
        let mut ext_ci = vk::ExternalMemoryBufferCreateInfo::default().handle_types(ht);
        let bci = vk::BufferCreateInfo::default()
            .size(size)
            .usage(usage_flags)
            .sharing_mode(vk::SharingMode::EXCLUSIVE)
            .push_next(&mut ext_ci);
        let buffer = match dev.create_buffer(&bci, None) {
            Ok(b) => b,
            Err(r) => {
                free_host();
                return Err(VkError::from_vk("vkCreateBuffer", r));
            }
        };
        let req = dev.get_buffer_memory_requirements(buffer);
        if req.memory_type_bits & (1 << type_index) == 0 || req.size > size {
            dev.destroy_buffer(buffer, None);
            free_host();
            return Err(VkError::NoMemoryType("storage buffers over imported host memory"));
        }
        let mut import =
            vk::ImportMemoryHostPointerInfoEXT::default().handle_type(ht).host_pointer(ptr as *mut std::ffi::c_void);
        let mai = vk::MemoryAllocateInfo::default()
            .allocation_size(size)
            .memory_type_index(type_index)
            .push_next(&mut import);
        let memory = match dev.allocate_memory(&mai, None) {
            Ok(m) => m,
            Err(r) => {
                dev.destroy_buffer(buffer, None);
                free_host();
                return Err(match r {
                    vk::Result::ERROR_OUT_OF_DEVICE_MEMORY | vk::Result::ERROR_OUT_OF_HOST_MEMORY => oom(false),
                    r => VkError::from_vk("vkAllocateMemory", r),
                });
            }
        };
        if let Err(r) = dev.bind_buffer_memory(buffer, memory, 0) {
            dev.destroy_buffer(buffer, None);
            dev.free_memory(memory, None);
            free_host();
            return Err(VkError::from_vk("vkBindBufferMemory", r));
        }
        Ok(Block {
            memory,
            buffer,
            mapped: ptr,
            coherent: self.props.types[type_index as usize].flags.contains(vk::MemoryPropertyFlags::HOST_COHERENT),
            counted: 0,
            dedicated: false,
            alloc: BlockAllocator::new(size),
            host: Some((ptr, layout)),
        })
    }

    /// Returns an allocation; a dedicated block is released at once, a shared one when empty
    /// and another empty block of the arena exists (one is kept for reuse; `trim` drops it).
    ///
    /// # Safety
    /// `a` must come from this allocator and no pending GPU work may use it.
    pub unsafe fn free(&mut self, dev: &ash::Device, a: Allocation) {
        let ai = arena_index(a.usage);
        let Some(b) = self.arenas[ai].get_mut(a.block).and_then(Option::as_mut) else { return };
        b.alloc.free(a.offset, a.size);
        if b.alloc.is_empty() {
            let keep = !b.dedicated
                && self.arenas[ai]
                    .iter()
                    .enumerate()
                    .filter(|(i, x)| *i != a.block && x.as_ref().is_some_and(|x| x.alloc.is_empty()))
                    .count()
                    == 0;
            if !keep {
                let b = self.arenas[ai][a.block].take().unwrap();
                self.release(dev, b);
            }
        }
    }

    unsafe fn release(&mut self, dev: &ash::Device, b: Block) {
        if !b.mapped.is_null() && b.host.is_none() {
            dev.unmap_memory(b.memory);
        }
        dev.destroy_buffer(b.buffer, None);
        dev.free_memory(b.memory, None);
        if let Some((ptr, layout)) = b.host {
            // The device memory imported over it is freed above.
            std::alloc::dealloc(ptr, layout);
        }
        self.device_bytes -= b.counted;
    }

    /// Releases every empty block.
    ///
    /// # Safety
    /// As `free`.
    pub unsafe fn trim(&mut self, dev: &ash::Device) {
        for ai in 0..ARENAS {
            for bi in 0..self.arenas[ai].len() {
                if self.arenas[ai][bi].as_ref().is_some_and(|b| b.alloc.is_empty()) {
                    let b = self.arenas[ai][bi].take().unwrap();
                    self.release(dev, b);
                }
            }
        }
    }

    /// Releases everything (context teardown).
    ///
    /// # Safety
    /// No GPU work may be pending and no allocation used afterwards.
    pub unsafe fn destroy_all(&mut self, dev: &ash::Device) {
        for ai in 0..ARENAS {
            for b in std::mem::take(&mut self.arenas[ai]).into_iter().flatten() {
                self.release(dev, b);
            }
        }
    }

    /// The buffer holding `a` (descriptors bind `a.offset..a.offset + a.size` of it).
    pub fn buffer(&self, a: &Allocation) -> vk::Buffer {
        self.arenas[arena_index(a.usage)][a.block].as_ref().map_or(vk::Buffer::null(), |b| b.buffer)
    }

    /// The host address of `a`'s first byte when its block is mapped, and whether the memory
    /// is coherent (else writes need a flush and reads an invalidate).
    pub fn mapping(&self, a: &Allocation) -> Option<(*mut u8, bool, vk::DeviceMemory)> {
        let b = self.arenas[arena_index(a.usage)][a.block].as_ref()?;
        // SAFETY: `a` lies inside the block's mapped range.
        (!b.mapped.is_null()).then(|| (unsafe { b.mapped.add(a.offset as usize) }, b.coherent, b.memory))
    }
}
