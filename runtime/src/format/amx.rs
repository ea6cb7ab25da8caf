//! Intel AMX tiles for the q8 matmul of many activation rows (a prompt chunk, an expert's
//! rows of one): the integer block products on the tile unit, the block scales on AVX-512.
//!
//! Per unit `k` (32 columns) the tile unit multiplies 16 weight rows (tile A: the unit's bytes,
//! read straight from the matrix for `Q8_0` and `I8Row`, decoded by `simd::unit_scalar` for the
//! others) by 16 activation rows (tile B: their 8-bit codes four bytes a column, packed once a
//! call, `TileActs`) into 16 x 16 exact i32 sums. Each sum then takes, in this order, in f32:
//!
//! ```text
//! acc = fma(a_r * d_i, dot, acc)      // a_r: the weight unit's multiplier, d_i the block's scale
//! acc = fma(b_r, s_i, acc)            // formats with an offset or a min (Q4_0, Q4_1, Q4_K, I4G64)
//! ```
//!
//! and at the end `out = scale_r * acc` (I8Row's row scale, else 1). Every output element goes
//! through the same operations whatever the other rows of its tiles are, so a row's bits do not
//! depend on which rows share its call (as on the other levels), but they are not the AVX-512
//! kernels' bits: those sum each unit in four partial lanes. Calls of fewer than `TILE_ROWS`
//! activation rows (decode, a checked draft, a batched step of a few sequences) keep the
//! AVX-512 kernels; a row gets one set of bits in every call of `TILE_ROWS` rows or more, and
//! the other in every smaller call.
//!
//! Must not: run unless `usable()` said so (the tile registers need the kernel's permission,
//! asked for once a process) and inside code compiled with AVX-512 F/BW/VL enabled; hold the
//! tile configuration past a call (`tilerelease` at the end of each).

#![cfg(target_arch = "x86_64")]

use super::matrix::Matrix;
use super::q8::{QuantizedActs, TileActs};
use super::simd::{signed, unit_scalar, F_I4G64, F_I8ROW, F_Q4K, F_Q4_0, F_Q4_1, F_Q8_0};
use super::WeightFormat;
use std::arch::asm;
use std::arch::x86_64::*;

/// Whether this CPU has AMX-TILE and AMX-INT8 and the kernel lets this process use the tile
/// data (asked for here, once; Linux 5.16 or later).
pub fn usable() -> bool {
    let leaf7 = __cpuid_count(7, 0);
    let (tile, int8) = (leaf7.edx & (1 << 24) != 0, leaf7.edx & (1 << 25) != 0);
    if !tile || !int8 {
        return false;
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a request for a permission; it touches no memory of ours.
    unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

/// `simd`'s code for `format`, where the tile path takes it.
fn code(format: WeightFormat) -> Option<u8> {
    Some(match format {
        WeightFormat::Q8_0 => F_Q8_0,
        WeightFormat::Q4_0 => F_Q4_0,
        WeightFormat::Q4_1 => F_Q4_1,
        WeightFormat::I8Row => F_I8ROW,
        WeightFormat::I4G64 => F_I4G64,
        WeightFormat::Q4_K => F_Q4K,
        _ => return None,
    })
}

/// `$f!(F)` for the tile path's format code `$code` (a `u8` from `code`).
macro_rules! by_code {
    ($code:expr, $f:ident) => {
        match $code {
            F_Q8_0 => $f!(F_Q8_0),
            F_Q4_0 => $f!(F_Q4_0),
            F_Q4_1 => $f!(F_Q4_1),
            F_I8ROW => $f!(F_I8ROW),
            F_I4G64 => $f!(F_I4G64),
            _ => $f!(F_Q4K),
        }
    };
}

/// The tile registers' shapes (palette 1): tmm0 the 16 x 16 i32 sums, tmm1 16 weight rows of a
/// unit (32 bytes each), tmm2 16 activation rows of a unit (8 rows of 64 bytes); tmm3-5 the
/// same for every other unit.
#[repr(C, align(64))]
struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

const CONFIG: Config = {
    let mut c = Config { palette: 1, start_row: 0, reserved: [0; 14], colsb: [0; 16], rows: [0; 16] };
    c.colsb[0] = 64;
    c.rows[0] = 16;
    c.colsb[1] = 32;
    c.rows[1] = 16;
    c.colsb[2] = 64;
    c.rows[2] = 8;
    c.colsb[3] = 64;
    c.rows[3] = 16;
    c.colsb[4] = 32;
    c.rows[4] = 16;
    c.colsb[5] = 64;
    c.rows[5] = 8;
    c
};

/// 16 weight rows' unit decoded for tile A (row `j`'s 32 bytes at `32 * j`), every unit, with
/// `a[k][j]`, `b[k][j]` and `scale[j]`; rows past the group's are zeros.
struct Group {
    q: Vec<[u8; 512]>,
    a: Vec<[f32; 16]>,
    b: Vec<[f32; 16]>,
    scale: [f32; 16],
}

impl Group {
    fn new(units: usize) -> Group {
        Group { q: vec![[0; 512]; units], a: vec![[0.0; 16]; units], b: vec![[0.0; 16]; units], scale: [0.0; 16] }
    }

    /// Rows `r0..r0 + rows` of `w` (at most 16): the terms always, the bytes unless `direct`
    /// (16 rows of `Q8_0` or `I8Row`: tile A then reads them from the matrix).
    #[inline(always)]
    unsafe fn fill<const F: u8>(&mut self, w: &Matrix, r0: usize, rows: usize, direct: bool) {
        if direct {
            let base = w.bytes().as_ptr().add(r0 * w.row_bytes());
            let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
            let at = _mm512_mullo_epi32(lanes, _mm512_set1_epi32(w.row_bytes() as i32));
            for k in 0..self.q.len() {
                // The multiplier: Q8_0's scale, the 16 rows' f16 at once; I8Row's is 1.
                self.a[k] = if F == F_Q8_0 {
                    let bits = _mm512_i32gather_epi32::<1>(at, base.add(34 * k).cast());
                    let mut a = [0f32; 16];
                    _mm512_storeu_ps(a.as_mut_ptr(), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(bits)));
                    a
                } else {
                    [1.0; 16]
                };
                self.b[k] = [0.0; 16];
            }
            for j in 0..16 {
                let row = base.add(j * w.row_bytes());
                self.scale[j] =
                    if F == F_I8ROW { f32::from_le_bytes(row.cast::<[u8; 4]>().read_unaligned()) } else { 1.0 };
            }
            return;
        }
        for j in 0..16 {
            if j >= rows {
                for k in 0..self.q.len() {
                    self.q[k][32 * j..32 * j + 32].fill(0);
                    self.a[k][j] = 0.0;
                    self.b[k][j] = 0.0;
                }
                self.scale[j] = 0.0;
                continue;
            }
            let row = w.bytes().as_ptr().add((r0 + j) * w.row_bytes());
            for k in 0..self.q.len() {
                let (v, a, b) = unit_scalar::<F, false>(row, k);
                _mm256_storeu_si256(self.q[k].as_mut_ptr().add(32 * j).cast(), v);
                self.a[k][j] = a;
                self.b[k][j] = b;
            }
            self.scale[j] = if F == F_I8ROW { f32::from_le_bytes(row.cast::<[u8; 4]>().read_unaligned()) } else { 1.0 };
        }
    }
}

/// The 16 x 16 sums of one unit: weight rows at `w` (32 bytes each, `stride` bytes apart) by
/// the packed activation unit `x`, into `c` (`c[j][i]`: weight row `j`, activation row `i`),
/// on tiles 0-2 (`ODD` false) or 3-5, so that the next unit's sums run beside this one's
/// scaling.
#[inline(always)]
unsafe fn sums<const SIGNED: bool, const ODD: bool>(
    w: *const u8,
    stride: usize,
    x: &[u8; 512],
    c: &mut [[i32; 16]; 16],
) {
    macro_rules! tiles {
        ($op:literal, $c:literal, $a:literal, $b:literal) => {
            asm!(
                concat!("tileloadd ", $a, ", [{w} + {ws}*1]"),
                concat!("tileloadd ", $b, ", [{x} + {xs}*1]"),
                concat!("tilezero ", $c),
                concat!($op, " ", $c, ", ", $a, ", ", $b),
                concat!("tilestored [{c} + {cs}*1], ", $c),
                w = in(reg) w, ws = in(reg) stride, x = in(reg) x.as_ptr(), xs = in(reg) 64usize,
                c = in(reg) c.as_mut_ptr(), cs = in(reg) 64usize,
                options(nostack),
            )
        };
    }
    match (SIGNED, ODD) {
        (true, false) => tiles!("tdpbssd", "tmm0", "tmm1", "tmm2"),
        (true, true) => tiles!("tdpbssd", "tmm3", "tmm4", "tmm5"),
        (false, false) => tiles!("tdpbusd", "tmm0", "tmm1", "tmm2"),
        (false, true) => tiles!("tdpbusd", "tmm3", "tmm4", "tmm5"),
    }
}

/// Rows `r0..r1` of `w` against every activation row (`acts.n() >= TILE_ROWS`, 16); element
/// `(i, r)` goes to `out + i * w.rows + r`. `false` when the format has no tile path.
///
/// # Safety
/// `usable()` returned true; AVX-512 F/BW/VL are enabled in the caller; `acts.cols() == w.cols`,
/// `r0 <= r1 <= w.rows` and `out` holds `n x w.rows`.
#[inline(always)]
pub unsafe fn tile_q8(w: &Matrix, acts: &QuantizedActs, r0: usize, r1: usize, out: *mut f32) -> bool {
    let Some(f) = code(w.format) else { return false };
    let x = acts.tile_acts();
    macro_rules! go {
        ($f:ident) => {
            run::<$f, { signed($f) }>(w, x, acts.n(), r0, r1, out)
        };
    }
    by_code!(f, go);
    true
}

#[inline(always)]
unsafe fn run<const F: u8, const SIGNED: bool>(
    w: &Matrix,
    x: &TileActs,
    n: usize,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    let (units, ld) = (x.units, w.rows);
    let mut g = Group::new(units);
    // Where a tile's results go: activation row `i` of the tile `ld` floats after row 0.
    let index = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(ld as i32),
    );
    asm!("ldtilecfg [{}]", in(reg) &CONFIG as *const Config, options(nostack, readonly));
    let mut r = r0;
    while r < r1 {
        let rows = (r1 - r).min(16);
        // Q8_0's and I8Row's bytes are tile A's as stored.
        let direct = rows == 16 && (F == F_Q8_0 || F == F_I8ROW);
        g.fill::<F>(w, r, rows, direct);
        let base = w.bytes().as_ptr().add(r * w.row_bytes());
        for t in 0..n.div_ceil(16) {
            let mut acc = [_mm512_setzero_ps(); 16];
            let mut c = [[[0i32; 16]; 16]; 2];
            let unit = |k: usize| match F {
                _ if !direct => (g.q[k].as_ptr(), 32),
                F_Q8_0 => (base.add(34 * k + 2), w.row_bytes()),
                _ => (base.add(4 + 32 * k), w.row_bytes()),
            };
            // Unit k + 1's sums are issued before unit k's scaling (the other tiles and buffer).
            let (wp, stride) = unit(0);
            sums::<SIGNED, false>(wp, stride, &x.q[t * units], &mut c[0]);
            for k in 0..units {
                if k + 1 < units {
                    let (wp, stride) = unit(k + 1);
                    let (xq, ck) = (&x.q[t * units + k + 1], &mut c[(k + 1) % 2]);
                    if k % 2 == 0 {
                        sums::<SIGNED, true>(wp, stride, xq, ck);
                    } else {
                        sums::<SIGNED, false>(wp, stride, xq, ck);
                    }
                }
                let at = t * units + k;
                let dv = _mm512_loadu_ps(x.d[at].as_ptr());
                let sv = _mm512_loadu_ps(x.s[at].as_ptr());
                let ck = &c[k % 2];
                for (j, acc) in acc.iter_mut().enumerate() {
                    let dot = _mm512_cvtepi32_ps(_mm512_loadu_si512(ck[j].as_ptr().cast()));
                    *acc = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(g.a[k][j]), dv), dot, *acc);
                    if !SIGNED {
                        *acc = _mm512_fmadd_ps(_mm512_set1_ps(g.b[k][j]), sv, *acc);
                    }
                }
            }
            let m = (n - 16 * t).min(16);
            let mask: __mmask16 = if m == 16 { 0xffff } else { (1u16 << m) - 1 };
            let o = out.add(16 * t * ld + r);
            for (j, acc) in acc.iter().enumerate().take(rows) {
                let v = _mm512_mul_ps(_mm512_set1_ps(g.scale[j]), *acc);
                _mm512_mask_i32scatter_ps::<4>(o.add(j).cast(), mask, index, v);
            }
        }
        r += rows;
    }
    asm!("tilerelease", options(nostack, nomem));
}

/// `tile_q8`'s arithmetic one element at a time (the tests' reference): row `row` of a matrix
/// in `format` against one row of activation blocks; `None` where the tile path does not take
/// the format.
///
/// # Safety
/// AVX2 and F16C are enabled in the caller (the unit decoders'); `row` holds `x.len()` units.
#[cfg(test)]
#[inline(always)]
pub unsafe fn dot_row(format: WeightFormat, row: &[u8], x: &[super::q8::BlockQ8]) -> Option<f32> {
    let f = code(format)?;
    macro_rules! go {
        ($f:ident) => {
            dot_row_f::<$f>(row, x)
        };
    }
    Some(by_code!(f, go))
}

#[cfg(test)]
#[inline(always)]
unsafe fn dot_row_f<const F: u8>(row: &[u8], x: &[super::q8::BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (k, blk) in x.iter().enumerate() {
        let (v, a, b) = unit_scalar::<F, false>(row.as_ptr(), k);
        let mut bytes = [0u8; 32];
        _mm256_storeu_si256(bytes.as_mut_ptr().cast(), v);
        let w = |b: u8| if signed(F) { b as i8 as i32 } else { b as i32 };
        let dot: i32 = bytes.iter().zip(&blk.q).map(|(&b, &q)| q as i32 * w(b)).sum();
        acc = (a * blk.d).mul_add(dot as f32, acc);
        if !signed(F) {
            acc = b.mul_add(blk.s, acc);
        }
    }
    let scale = if F == F_I8ROW { f32::from_le_bytes(row[..4].try_into().unwrap()) } else { 1.0 };
    scale * acc
}
