//! The quantized-activation fast path: activations quantized once per matmul to 8 bits per
//! block of 32 (`QuantizedActs`, symmetric, `x ~ d * q`), and the integer dot products of every
//! integer weight format against them. Each block product is an i32 sum of 32 byte products,
//! scaled once per block; the code is written over fixed-size arrays so the compiler vectorizes
//! it (the callers in `matmul` compile it once per CPU feature level).
//!
//! Must not: check lengths (the public entry points in `format` do), or allocate per row.

use super::fp16::read_f16;
pub use super::prim::{idot_i8, idot_u8};
use super::WeightFormat;
use super::{iq4, iq_grid, kquant, kquant_lo, mxfp4, q5};

/// 32 activations quantized to i8: `x[i] ~ d * q[i]`; `s = d * sum(q)` (for formats with a min).
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct BlockQ8 {
    pub d: f32,
    pub s: f32,
    pub q: [i8; 32],
}

/// `n` rows of `cols` activations, each row as `cols / 32` blocks.
#[derive(Clone, Debug, Default)]
pub struct QuantizedActs {
    pub(super) n: usize,
    pub(super) cols: usize,
    pub(super) blocks: Vec<BlockQ8>,
    /// The blocks packed for the AMX tiles, made by the first tile that needs them.
    #[cfg(target_arch = "x86_64")]
    pub(super) tiles: std::sync::OnceLock<TileActs>,
}

/// (`new` and `requantize` are in `matmul`, beside the SIMD builds that quantize.)
impl QuantizedActs {
    pub fn n(&self) -> usize {
        self.n
    }

    /// The blocks packed for the AMX tiles (made once, by the first caller; the others wait).
    ///
    /// # Safety
    /// AVX-512 F is enabled in the caller.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(super) unsafe fn tile_acts(&self) -> &TileActs {
        // The packing in a function of its own with the feature: inside the closure the
        // intrinsics would not inline. SAFETY: the caller's.
        #[target_feature(enable = "avx512f")]
        unsafe fn pack(acts: &QuantizedActs) -> TileActs {
            TileActs::new(acts)
        }
        self.tiles.get_or_init(|| unsafe { pack(self) })
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The activations as f32 again (`d * q`), `n x cols` row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        self.blocks.iter().flat_map(|b| b.q.iter().map(move |&q| b.d * q as f32)).collect()
    }

    /// The blocks of activation row `i` (`i < n`).
    pub fn row(&self, i: usize) -> &[BlockQ8] {
        let per = self.cols / 32;
        &self.blocks[i * per..(i + 1) * per]
    }
}

#[inline(always)]
pub(super) fn quantize_block(x: &[f32; 32]) -> BlockQ8 {
    let mut amax = 0f32;
    for v in x {
        amax = amax.max(v.abs());
    }
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0i8; 32];
    let mut sum = 0i32;
    for i in 0..32 {
        q[i] = (x[i] * id).round_ties_even() as i8;
        sum += q[i] as i32;
    }
    BlockQ8 { d, s: d * sum as f32, q }
}

/// The 32 nibbles of a 16-byte `Q4_0`/`Q4_1` body in element order.
#[inline(always)]
fn nibbles16(qs: &[u8]) -> [u8; 32] {
    let qs: &[u8; 16] = qs[..16].try_into().unwrap();
    let mut out = [0u8; 32];
    for i in 0..16 {
        out[i] = qs[i] & 0x0f;
        out[i + 16] = qs[i] >> 4;
    }
    out
}

#[inline(always)]
fn q8_0(row: &[u8], x: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (b, xb) in row.chunks_exact(34).zip(x) {
        let q: &[u8; 32] = b[2..34].try_into().unwrap();
        let q: &[i8; 32] = &q.map(|v| v as i8);
        acc += read_f16(b, 0) * xb.d * idot_i8(q, &xb.q) as f32;
    }
    acc
}

#[inline(always)]
fn q4_0(row: &[u8], x: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (b, xb) in row.chunks_exact(18).zip(x) {
        let q = nibbles16(&b[2..18]).map(|v| v as i8 - 8);
        acc += read_f16(b, 0) * xb.d * idot_i8(&q, &xb.q) as f32;
    }
    acc
}

#[inline(always)]
fn q4_1(row: &[u8], x: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (b, xb) in row.chunks_exact(20).zip(x) {
        let q = nibbles16(&b[4..20]);
        acc += read_f16(b, 0) * xb.d * idot_u8(&q, &xb.q) as f32 + read_f16(b, 2) * xb.s;
    }
    acc
}

#[inline(always)]
fn i8row(row: &[u8], x: &[BlockQ8]) -> f32 {
    let scale = f32::from_le_bytes(row[0..4].try_into().unwrap());
    let mut acc = 0f32;
    for (b, xb) in row[4..].chunks_exact(32).zip(x) {
        let q: &[u8; 32] = b.try_into().unwrap();
        acc += xb.d * idot_i8(&q.map(|v| v as i8), &xb.q) as f32;
    }
    scale * acc
}

#[inline(always)]
fn i4g64(row: &[u8], x: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (b, xs) in row.chunks_exact(36).zip(x.chunks_exact(2)) {
        let qs: &[u8; 32] = b[4..36].try_into().unwrap();
        let lo = qs.map(|v| v & 0x0f);
        let hi = qs.map(|v| v >> 4);
        let i = xs[0].d * idot_u8(&lo, &xs[0].q) as f32 + xs[1].d * idot_u8(&hi, &xs[1].q) as f32;
        acc += read_f16(b, 0) * i + read_f16(b, 2) * (xs[0].s + xs[1].s);
    }
    acc
}

/// `row . x` for an integer format against one row of quantized activations.
/// The caller has checked `format.uses_q8_acts(cols)` and the row length.
#[inline(always)]
pub fn dot_row_q8(format: WeightFormat, row: &[u8], x: &[BlockQ8]) -> f32 {
    match format {
        WeightFormat::Q8_0 => q8_0(row, x),
        WeightFormat::Q4_0 => q4_0(row, x),
        WeightFormat::Q4_1 => q4_1(row, x),
        WeightFormat::Q4_K => kquant::dot_q4k_q8(row, x),
        WeightFormat::Q6_K => kquant::dot_q6k_q8(row, x),
        WeightFormat::Q5_0 => q5::dot_q5_0_q8(row, x),
        WeightFormat::Q5_1 => q5::dot_q5_1_q8(row, x),
        WeightFormat::Q2_K => kquant_lo::dot_q2k_q8(row, x),
        WeightFormat::Q3_K => kquant_lo::dot_q3k_q8(row, x),
        WeightFormat::Q5_K => kquant_lo::dot_q5k_q8(row, x),
        WeightFormat::IQ4_NL => iq4::dot_iq4_nl_q8(row, x),
        WeightFormat::MXFP4 => mxfp4::dot_mxfp4_q8(row, x),
        WeightFormat::IQ4_XS => iq4::dot_iq4_xs_q8(row, x),
        WeightFormat::IQ2_XXS => iq_grid::dot_iq2_xxs_q8(row, x),
        WeightFormat::IQ2_XS => iq_grid::dot_iq2_xs_q8(row, x),
        WeightFormat::IQ2_S => iq_grid::dot_iq2_s_q8(row, x),
        WeightFormat::IQ3_XXS => iq_grid::dot_iq3_xxs_q8(row, x),
        WeightFormat::IQ3_S => iq_grid::dot_iq3_s_q8(row, x),
        WeightFormat::IQ1_S => iq_grid::dot_iq1_s_q8(row, x),
        WeightFormat::IQ1_M => iq_grid::dot_iq1_m_q8(row, x),
        WeightFormat::I8Row => i8row(row, x),
        WeightFormat::I4G64 => i4g64(row, x),
        WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16 | WeightFormat::FP8_E4M3 => {
            unreachable!("float formats do not take quantized activations")
        }
    }
}

/// A call's activation rows for tile B, 16 at a time (the last tile's missing rows zeros):
/// `q[t * units + k]` holds unit `k` of tile `t`, row `i`'s bytes `4u..4u + 4` at
/// `u * 64 + 4 * i`; `d` and `s` the blocks' scales and sums in the same order.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Debug, Default)]
pub struct TileActs {
    pub(super) units: usize,
    pub(super) q: Vec<[u8; 512]>,
    pub(super) d: Vec<[f32; 16]>,
    pub(super) s: Vec<[f32; 16]>,
}

#[cfg(target_arch = "x86_64")]
impl TileActs {
    /// `acts` packed (`acts.cols()` a multiple of 32).
    ///
    /// # Safety
    /// AVX-512 F is enabled in the caller.
    #[inline(always)]
    pub unsafe fn new(acts: &QuantizedActs) -> TileActs {
        let (n, units) = (acts.n(), acts.cols() / 32);
        let tiles = n.div_ceil(16);
        let mut p = TileActs {
            units,
            q: vec![[0; 512]; tiles * units],
            d: vec![[0.0; 16]; tiles * units],
            s: vec![[0.0; 16]; tiles * units],
        };
        let size = std::mem::size_of::<BlockQ8>() as i32;
        let lanes = std::arch::x86_64::_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        // Byte offsets of the 16 rows' blocks of one unit, `units` blocks apart.
        let rows =
            std::arch::x86_64::_mm512_mullo_epi32(lanes, std::arch::x86_64::_mm512_set1_epi32(size * units as i32));
        for t in 0..tiles {
            let m = (n - 16 * t).min(16);
            let mask: std::arch::x86_64::__mmask16 = if m == 16 { 0xffff } else { (1u16 << m) - 1 };
            let first = acts.row(16 * t).as_ptr().cast::<u8>();
            for k in 0..units {
                let at = t * units + k;
                let b = first.add(k * size as usize);
                let z = std::arch::x86_64::_mm512_setzero_si512();
                // BlockQ8: d at 0, s at 4, the codes from 8.
                let d = std::arch::x86_64::_mm512_mask_i32gather_epi32::<1>(z, mask, rows, b.cast());
                let s = std::arch::x86_64::_mm512_mask_i32gather_epi32::<1>(z, mask, rows, b.add(4).cast());
                std::arch::x86_64::_mm512_storeu_si512(p.d[at].as_mut_ptr().cast(), d);
                std::arch::x86_64::_mm512_storeu_si512(p.s[at].as_mut_ptr().cast(), s);
                for u in 0..8 {
                    let q = std::arch::x86_64::_mm512_mask_i32gather_epi32::<1>(z, mask, rows, b.add(8 + 4 * u).cast());
                    std::arch::x86_64::_mm512_storeu_si512(p.q[at].as_mut_ptr().add(64 * u).cast(), q);
                }
            }
        }
        p
    }
}
