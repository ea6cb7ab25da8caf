//! Memory policy, as pure functions over plain data (so every rule is unit-tested without a
//! device): which memory type serves which use, whether weights go up staged or mapped, and
//! the block allocator that sub-allocates large device allocations (first fit, freed ranges
//! coalesced with their neighbours).
//!
//! Uses: `Device` (only the GPU touches it: weights, activations, the KV mirror), `Upload`
//! (the host writes it: staging, per-forward inputs), `Readback` (the host reads it: logits,
//! rows a host step needs; host-cached where the device has such a type), `Pool` (the tier's
//! host pool: host memory the device reads over the bus, a host-visible type off the
//! device-local heaps where there is one, host-cached preferred so the CPU reads it fast too),
//! `PoolImport` (the same, in the process's own pages imported with
//! `VK_EXT_external_memory_host`; its type comes from the pointer, `arena.rs`).
//!
//! Must not: call Vulkan (arena.rs does), or know about tensors.

use super::error::{Result, VkError};
use super::options::UploadPath;
use ash::vk;
use std::collections::BTreeMap;

/// What a buffer is for; decides its memory type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryUse {
    Device,
    Upload,
    Readback,
    Pool,
    PoolImport,
}

/// A memory type as the policy sees it.
#[derive(Clone, Copy, Debug)]
pub struct MemType {
    pub flags: vk::MemoryPropertyFlags,
    pub heap: u32,
}

/// A device's memory types and heaps (sizes in bytes; `device_local` per heap).
#[derive(Clone, Debug)]
pub struct MemoryProps {
    pub types: Vec<MemType>,
    pub heaps: Vec<(u64, bool)>,
}

impl MemoryProps {
    pub fn from_vk(p: &vk::PhysicalDeviceMemoryProperties) -> MemoryProps {
        MemoryProps {
            types: p.memory_types[..p.memory_type_count as usize]
                .iter()
                .map(|t| MemType { flags: t.property_flags, heap: t.heap_index })
                .collect(),
            heaps: p.memory_heaps[..p.memory_heap_count as usize]
                .iter()
                .map(|h| (h.size, h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL)))
                .collect(),
        }
    }
}

/// The chosen memory type of each use, and whether resident data is staged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub device: u32,
    pub upload: u32,
    pub readback: u32,
    /// The host pool's type (`MemoryUse::Pool`).
    pub pool: u32,
    /// Weights go into memory the host does not map, through staging copies.
    pub staged: bool,
    /// Whether the `Device` type is mapped by the host (writes and reads go straight there).
    pub device_mapped: bool,
}

impl Placement {
    pub fn type_of(&self, usage: MemoryUse) -> u32 {
        match usage {
            MemoryUse::Device => self.device,
            MemoryUse::Upload => self.upload,
            MemoryUse::Readback => self.readback,
            MemoryUse::Pool | MemoryUse::PoolImport => self.pool,
        }
    }
}

const HV: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::HOST_VISIBLE;
const HC: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::HOST_COHERENT;
const CACHED: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::HOST_CACHED;
const DL: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::DEVICE_LOCAL;

/// Chooses the memory types (rule: see the module doc and `UploadPath::Auto`). Vendor types
/// (AMD's device-coherent and uncached ones) and protected memory are passed over.
pub fn place(props: &MemoryProps, upload: UploadPath) -> Result<Placement> {
    let vendor = vk::MemoryPropertyFlags::DEVICE_COHERENT_AMD
        | vk::MemoryPropertyFlags::DEVICE_UNCACHED_AMD
        | vk::MemoryPropertyFlags::PROTECTED;
    let ok: Vec<(u32, MemType)> = props
        .types
        .iter()
        .enumerate()
        .filter(|(_, t)| !t.flags.intersects(vendor))
        .map(|(i, t)| (i as u32, *t))
        .collect();
    let heap_size = |t: &MemType| props.heaps[t.heap as usize].0;
    // The best type among those with `need`, by (preference score, heap size).
    let pick = |need: vk::MemoryPropertyFlags, score: &dyn Fn(vk::MemoryPropertyFlags) -> u32| {
        ok.iter()
            .filter(|(_, t)| t.flags.contains(need))
            .max_by_key(|(i, t)| (score(t.flags), heap_size(t), u32::MAX - i))
            .map(|(i, _)| *i)
    };
    let largest_dl = props.heaps.iter().filter(|h| h.1).map(|h| h.0).max().unwrap_or(0);
    let hv_dl = pick(DL | HV | HC, &|_| 0);
    let hv_dl_size = hv_dl.map_or(0, |i| heap_size(&props.types[i as usize]));
    let staged = match upload {
        UploadPath::Staged => true,
        UploadPath::Mapped => hv_dl.is_none(),
        UploadPath::Auto => hv_dl.is_none() || hv_dl_size < largest_dl / 4,
    };
    let device = if staged {
        // Prefer a type the host does not map, on the largest device-local heap.
        pick(DL, &|f| if f.contains(HV) { 0 } else { 1 })
    } else {
        hv_dl
    }
    .ok_or(VkError::NoMemoryType("device-local buffers"))?;
    let upload_t = pick(HV | HC, &|f| if f.contains(DL) { 0 } else { 1 }).ok_or(VkError::NoMemoryType("uploads"))?;
    let readback = pick(HV, &|f| (f.contains(CACHED) as u32) * 2 + f.contains(HC) as u32)
        .ok_or(VkError::NoMemoryType("read-backs"))?;
    let pool = pick(HV, &|f| (!f.contains(DL) as u32) * 4 + (f.contains(CACHED) as u32) * 2 + f.contains(HC) as u32)
        .ok_or(VkError::NoMemoryType("the host pool"))?;
    // Staged placement never maps device memory, even where the type would allow it (so a
    // forced `Staged` exercises the copy path on Lavapipe too).
    let device_mapped = !staged && props.types[device as usize].flags.contains(HV | HC);
    Ok(Placement { device, upload: upload_t, readback, pool, staged, device_mapped })
}

/// Sub-allocation of one block: first fit over a free list ordered by offset; freeing
/// coalesces with both neighbours, so a block whose allocations are all freed is one range.
#[derive(Clone, Debug)]
pub struct BlockAllocator {
    size: u64,
    free: BTreeMap<u64, u64>,
    used: u64,
}

fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

impl BlockAllocator {
    pub fn new(size: u64) -> BlockAllocator {
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(0, size);
        }
        BlockAllocator { size, free, used: 0 }
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn used(&self) -> u64 {
        self.used
    }

    pub fn is_empty(&self) -> bool {
        self.used == 0
    }

    /// Number of free ranges (1 for an empty block: everything coalesced).
    pub fn fragments(&self) -> usize {
        self.free.len()
    }

    /// Reserves `len` bytes at an offset that is a multiple of `align` (a power of two or
    /// any positive number); `None` when no free range fits.
    pub fn alloc(&mut self, len: u64, align: u64) -> Option<u64> {
        let len = len.max(1);
        let (off, flen, at) = self.free.iter().find_map(|(&off, &flen)| {
            let at = align_up(off, align.max(1));
            (at + len <= off + flen).then_some((off, flen, at))
        })?;
        self.free.remove(&off);
        if at > off {
            self.free.insert(off, at - off);
        }
        if at + len < off + flen {
            self.free.insert(at + len, off + flen - (at + len));
        }
        self.used += len;
        Some(at)
    }

    /// Returns `[off, off + len)` (as given to `alloc`'s caller) to the free list.
    pub fn free(&mut self, off: u64, len: u64) {
        let len = len.max(1);
        debug_assert!(off + len <= self.size);
        let mut start = off;
        let mut end = off + len;
        if let Some((&p, &plen)) = self.free.range(..off).next_back() {
            if p + plen == off {
                self.free.remove(&p);
                start = p;
            }
        }
        if let Some(&nlen) = self.free.get(&end) {
            self.free.remove(&end);
            end += nlen;
        }
        self.free.insert(start, end - start);
        self.used -= len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(types: &[(vk::MemoryPropertyFlags, u32)], heaps: &[(u64, bool)]) -> MemoryProps {
        MemoryProps {
            types: types.iter().map(|&(flags, heap)| MemType { flags, heap }).collect(),
            heaps: heaps.to_vec(),
        }
    }

    const GB: u64 = 1 << 30;

    #[test]
    fn lavapipe_maps_everything() {
        let p = props(&[(DL | HV | HC | CACHED, 0)], &[(2 * GB, true)]);
        let pl = place(&p, UploadPath::Auto).unwrap();
        assert_eq!(pl, Placement { device: 0, upload: 0, readback: 0, pool: 0, staged: false, device_mapped: true });
        let st = place(&p, UploadPath::Staged).unwrap();
        assert!(st.staged && !st.device_mapped);
    }

    #[test]
    fn discrete_without_rebar_stages_into_unmapped_vram() {
        // 8 GiB of VRAM, a 256 MiB host-visible window, host memory cached and uncached.
        let p = props(
            &[(DL, 0), (HV | HC, 1), (HV | HC | CACHED, 1), (DL | HV | HC, 2)],
            &[(8 * GB, true), (16 * GB, false), (256 << 20, true)],
        );
        let pl = place(&p, UploadPath::Auto).unwrap();
        assert!(pl.staged && !pl.device_mapped);
        assert_eq!((pl.device, pl.upload, pl.readback), (0, 1, 2));
        assert_eq!(pl.pool, 2, "the host pool in cached host memory, off the device heaps");
        // Forced mapped uses the window.
        let pl = place(&p, UploadPath::Mapped).unwrap();
        assert_eq!((pl.device, pl.staged), (3, false));
    }

    #[test]
    fn rebar_maps_and_reads_back_through_cached_host_memory() {
        // The H200: type 4 covers the whole VRAM heap; type 3 is host cached.
        let p = props(
            &[(DL, 0), (DL, 0), (vk::MemoryPropertyFlags::empty(), 1), (HV | HC | CACHED, 1), (DL | HV | HC, 0)],
            &[(140 * GB, true), (94 * GB, false)],
        );
        let pl = place(&p, UploadPath::Auto).unwrap();
        assert_eq!((pl.device, pl.readback, pl.staged), (4, 3, false));
        // Staging never takes device-local memory when host memory exists.
        assert_eq!(pl.upload, 3);
    }

    #[test]
    fn amd_vendor_types_are_passed_over() {
        let amd = vk::MemoryPropertyFlags::DEVICE_COHERENT_AMD | vk::MemoryPropertyFlags::DEVICE_UNCACHED_AMD;
        let p =
            props(&[(DL | HV | HC | amd, 0), (DL | HV | HC, 0), (HV | HC, 1)], &[(16 * GB, true), (32 * GB, false)]);
        assert_eq!(place(&p, UploadPath::Auto).unwrap().device, 1);
    }

    #[test]
    fn block_allocator_aligns_frees_and_coalesces() {
        let mut b = BlockAllocator::new(1024);
        let a = b.alloc(100, 256).unwrap();
        let c = b.alloc(100, 256).unwrap();
        let d = b.alloc(100, 256).unwrap();
        assert_eq!((a, c, d), (0, 256, 512));
        assert_eq!(b.used(), 300);
        // Free the middle, then its neighbours: everything coalesces back into one range.
        b.free(c, 100);
        assert!(b.fragments() >= 2);
        let again = b.alloc(150, 256).unwrap();
        assert_eq!(again, 256, "first fit reuses the freed hole");
        b.free(again, 150);
        b.free(a, 100);
        b.free(d, 100);
        assert!(b.is_empty());
        assert_eq!(b.fragments(), 1);
        assert_eq!(b.alloc(1024, 1), Some(0));
    }

    #[test]
    fn block_allocator_refuses_what_does_not_fit() {
        let mut b = BlockAllocator::new(1000);
        assert_eq!(b.alloc(600, 16), Some(0));
        assert_eq!(b.alloc(500, 16), None);
        assert_eq!(b.alloc(400, 16), None, "aligned to 608, 400 bytes overrun the block");
        assert_eq!(b.alloc(392, 16), Some(608));
        assert_eq!(b.alloc(8, 1), Some(600), "the alignment gap stays usable");
        assert_eq!(b.alloc(1, 1), None);
    }

    #[test]
    fn block_allocator_random_workload_leaves_one_range() {
        let mut b = BlockAllocator::new(1 << 20);
        let mut live: Vec<(u64, u64)> = Vec::new();
        let mut s = 12345u64;
        for _ in 0..2000 {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            if live.is_empty() || !(s >> 33).is_multiple_of(3) {
                let len = 1 + (s >> 40) % 5000;
                if let Some(off) = b.alloc(len, 256) {
                    assert!(live.iter().all(|&(o, l)| off + len <= o || o + l <= off), "overlap");
                    live.push((off, len));
                }
            } else {
                let (o, l) = live.swap_remove(((s >> 20) as usize) % live.len());
                b.free(o, l);
            }
        }
        for (o, l) in live.drain(..) {
            b.free(o, l);
        }
        assert!(b.is_empty() && b.fragments() == 1);
    }
}
