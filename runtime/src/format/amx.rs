//! The 8-bit formats' and `Q4_0` / `Q4_1` / `Q4_K`'s q8 matmul on a CPU with AMX: one
//! arithmetic for every call, whatever its row count, so a row's bits never depend on the rows
//! beside it (a prompt chunk, a reused prefix's suffix, a batched decode step and a decode step
//! agree bit for bit).
//!
//! Per unit `k` (32 columns) a weight row `r` and an activation row `i` give an exact i32 sum
//! of 32 byte products, which then takes, in this order, in f32:
//!
//! ```text
//! acc = fma(a_r * d_i, dot, acc)      // a_r: the weight unit's multiplier, d_i the block's scale
//! acc = fma(b_r, s_i, acc)            // an offset or a min: Q4_0's -8 d, Q4_1's m, Q4_K's -dmin m
//! ```
//!
//! and at the end `out = scale_r * acc` (I8Row's row scale, else 1). Calls of `TILE_ROWS` (16)
//! activation rows or more run on the tile unit (`tile_q8`: 16 weight rows by 16 activation
//! rows a unit, tile A the 8-bit weights' bytes as stored or the nibbles decoded a group at a
//! time, tile B the activations packed once a call, `TileActs`); smaller ones (decode, a checked
//! draft, a batched step of a few sequences) on AVX-512 VNNI across 16 weight rows (`few_q8`,
//! each unit's bytes or nibbles and factors taken from the matrix in registers). These are not
//! the AVX-512 level's bits (that level sums each unit in four partial lanes); `Q8_0`, `I8Row`,
//! `Q4_0`, `Q4_1` and `Q4_K` are taken, `I4G64` keeps that level's kernels (see `code`).
//!
//! Must not: run unless `usable()` said so (the tile registers need the kernel's permission,
//! asked for once a process) and inside code compiled with AVX-512 F/BW/VL/VNNI enabled; hold
//! the tile configuration past a call (`tilerelease` at the end of each).

#![cfg(target_arch = "x86_64")]

use super::matrix::Matrix;
use super::q8::{QuantizedActs, TileActs};
use super::simd::{signed, unit_scalar, F_I8ROW, F_Q4K, F_Q4_0, F_Q4_1, F_Q8_0};
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

/// `simd`'s code for `format`, where the tile path takes it: the 8-bit formats, whose bytes tile
/// A reads as stored, and `Q4_0` / `Q4_1` / `Q4_K`, whose decode's units `few_rows` spreads in
/// registers (a unit decoded into a buffer per row, as `Group::fill` does for the tiles, made
/// SmolLM2 Q4_1's decode 2x slower; docs/BENCHMARKS.md). `I4G64` keeps the AVX-512 kernels for
/// every call, until `few_rows` decodes it too: a format takes one arithmetic for every row
/// count.
fn code(format: WeightFormat) -> Option<u8> {
    Some(match format {
        WeightFormat::Q8_0 => F_Q8_0,
        WeightFormat::I8Row => F_I8ROW,
        WeightFormat::Q4_0 => F_Q4_0,
        WeightFormat::Q4_1 => F_Q4_1,
        WeightFormat::Q4_K => F_Q4K,
        _ => return None,
    })
}

/// Whether `few` decodes a full group's units in registers (the 8-bit formats' bytes as
/// stored, `Q4_0`'s, `Q4_1`'s and `Q4_K`'s nibbles spread and their factors gathered), not from a
/// `Group` filled a unit at a time.
const fn few_direct(f: u8) -> bool {
    f == F_Q8_0 || f == F_I8ROW || f == F_Q4_0 || f == F_Q4_1 || f == F_Q4K
}

/// Bytes of one unit (block of 32) in a row of the format (`Q4_K`: its super-block's share).
const fn unit_bytes(f: u8) -> usize {
    match f {
        F_Q8_0 => 34,
        F_Q4_0 => 18,
        F_Q4_1 => 20,
        F_Q4K => 18,
        _ => 32,
    }
}

/// Lane `j` holds `j * stride`: the offsets of 16 rows `stride` apart, for gathers and
/// scatters across them.
#[inline(always)]
unsafe fn lane_strides(stride: usize) -> __m512i {
    _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(stride as i32),
    )
}

/// `$f!(F)` for the tile path's format code `$code` (a `u8` from `code`).
macro_rules! by_code {
    ($code:expr, $f:ident) => {
        match $code {
            F_Q8_0 => $f!(F_Q8_0),
            F_Q4_0 => $f!(F_Q4_0),
            F_Q4_1 => $f!(F_Q4_1),
            F_Q4K => $f!(F_Q4K),
            _ => $f!(F_I8ROW),
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

/// (bytes a row, rows) of tmm0-2: the sums, tile A, tile B; tmm3-5 repeat them.
const SHAPES: [(u16, u8); 3] = [(64, 16), (32, 16), (64, 8)];

const CONFIG: Config = {
    let mut c = Config { palette: 1, start_row: 0, reserved: [0; 14], colsb: [0; 16], rows: [0; 16] };
    let mut t = 0;
    while t < 6 {
        (c.colsb[t], c.rows[t]) = SHAPES[t % 3];
        t += 1;
    }
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
            let at = lane_strides(w.row_bytes());
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
    // Where a scattered block's outputs go: activation row `i` of the tile `ld` floats on.
    let index = lane_strides(ld);
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
            if aliased(ld) {
                // The block turned so that each activation row's 16 outputs are one store.
                let mut cols = acc;
                transpose16(&mut cols);
                let scale = _mm512_loadu_ps(g.scale.as_ptr());
                let mask: __mmask16 = if rows == 16 { 0xffff } else { (1u16 << rows) - 1 };
                for (i, col) in cols.iter().enumerate().take(m) {
                    _mm512_mask_storeu_ps(out.add((16 * t + i) * ld + r), mask, _mm512_mul_ps(scale, *col));
                }
            } else {
                // Weight row j's outputs down the block's column.
                let mask: __mmask16 = if m == 16 { 0xffff } else { (1u16 << m) - 1 };
                let o = out.add(16 * t * ld + r);
                for (j, acc) in acc.iter().enumerate().take(rows) {
                    let v = _mm512_mul_ps(_mm512_set1_ps(g.scale[j]), *acc);
                    _mm512_mask_i32scatter_ps::<4>(o.add(j).cast(), mask, index, v);
                }
            }
        }
        r += rows;
    }
    asm!("tilerelease", options(nostack, nomem));
}

/// Whether a tile's 16 output rows, `ld` floats apart, fall in few cache sets (a stride of a
/// multiple of 1 KiB: OLMoE's 1024- and 2048-row matrices, most models' power-of-two widths):
/// there a scatter down a column rewrites the same contended lines 16 times, and turning the
/// block to store each row's 16 outputs at once took a 1024 x 2048 Q8_0 product of 512 rows
/// from 163 to 209-218 GMAC/s on one core; at SmolLM2's 576 rows the scatter was 3-6 % ahead
/// end to end (docs/BENCHMARKS.md).
const fn aliased(ld: usize) -> bool {
    ld.is_multiple_of(256)
}

/// Turns 16 vectors of 16 (`v[j][i]`) into `v[i][j]`, in registers: pairs, then pairs of pairs,
/// then 128-bit lanes twice.
#[inline(always)]
unsafe fn transpose16(v: &mut [__m512; 16]) {
    let mut t = [_mm512_setzero_ps(); 16];
    for k in 0..8 {
        t[2 * k] = _mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]);
    }
    for k in 0..4 {
        let (a, b) = (_mm512_castps_pd(t[4 * k]), _mm512_castps_pd(t[4 * k + 2]));
        let (c, d) = (_mm512_castps_pd(t[4 * k + 1]), _mm512_castps_pd(t[4 * k + 3]));
        v[4 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        v[4 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        v[4 * k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        v[4 * k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    for h in 0..2 {
        for c in 0..4 {
            let (a, b) = (v[8 * h + c], v[8 * h + 4 + c]);
            t[8 * h + c] = _mm512_shuffle_f32x4::<0x88>(a, b);
            t[8 * h + 4 + c] = _mm512_shuffle_f32x4::<0xdd>(a, b);
        }
    }
    for c in 0..8 {
        v[c] = _mm512_shuffle_f32x4::<0x88>(t[c], t[8 + c]);
        v[8 + c] = _mm512_shuffle_f32x4::<0xdd>(t[c], t[8 + c]);
    }
}

/// Rows `r0..r1` of `w` against fewer than `TILE_ROWS` activation rows (decode, a checked
/// draft, a batched step of a few sequences) in the tiles' arithmetic, on AVX-512 VNNI: the
/// same exact i32 sum a unit (the byte products summed in lanes, then across them: integer
/// sums, any order) and the same f32 operations per element, so a row has the tiles' bits in
/// every call. Vectors run across 16 weight rows. `false` when the format has no tile path.
///
/// # Safety
/// As `tile_q8` (without the tiles' permission), with AVX-512 VNNI enabled in the caller.
#[inline(always)]
pub unsafe fn few_q8(w: &Matrix, acts: &QuantizedActs, r0: usize, r1: usize, out: *mut f32) -> bool {
    let Some(f) = code(w.format) else { return false };
    macro_rules! go {
        ($f:ident) => {
            few::<$f, { signed($f) }>(w, acts, r0, r1, out)
        };
    }
    by_code!(f, go);
    true
}

#[inline(always)]
unsafe fn few<const F: u8, const SIGNED: bool>(w: &Matrix, acts: &QuantizedActs, r0: usize, r1: usize, out: *mut f32) {
    let (n, units) = (acts.n(), w.cols / 32);
    // Signed weights go through `dpbusd` as `w + 128`; 128 times each block's code sum comes off.
    let sums: Vec<Vec<i32>> = (0..if SIGNED { n } else { 0 })
        .map(|i| acts.row(i).iter().map(|b| 128 * b.q.iter().map(|&q| q as i32).sum::<i32>()).collect())
        .collect();
    let order = lane_rows();
    let mut g = Group::new(units);
    let mut r = r0;
    while r < r1 {
        let rows = (r1 - r).min(16);
        let direct = rows == 16 && few_direct(F);
        if direct && !(F == F_Q8_0 || F == F_I8ROW) {
            // The nibble formats' units come from the matrix in `few_rows`; only the row scale,
            // and Q4_K's factors (six-bit scales and mins, a super-block's eight at once).
            g.scale = [1.0; 16];
            if F == F_Q4K {
                q4k_factors(w.bytes().as_ptr().add(r * w.row_bytes()), w.row_bytes(), units, &mut g);
            }
        } else {
            g.fill::<F>(w, r, rows, direct);
        }
        let mut c0 = 0;
        while c0 < n {
            let m = (n - c0).min(4);
            let at = Few { w, g: &g, direct, r, rows, acts, sums: &sums, c0, order, out };
            match m {
                1 => few_rows::<F, SIGNED, 1>(at),
                2 => few_rows::<F, SIGNED, 2>(at),
                3 => few_rows::<F, SIGNED, 3>(at),
                _ => few_rows::<F, SIGNED, 4>(at),
            }
            c0 += m;
        }
        r += rows;
    }
}

/// A full group of 16 `Q4_K` rows from `base` (`rb` bytes apart): every unit's `a = d * scale`
/// and `b = -dmin * min` into `g`, `unit_scalar`'s values, a super-block's eight units at once
/// across the 16 rows (d and dmin and the 12 bytes of six-bit scales and mins gathered).
#[inline(always)]
unsafe fn q4k_factors(base: *const u8, rb: usize, units: usize, g: &mut Group) {
    let at = lane_strides(rb);
    let (m6, m4) = (_mm512_set1_epi32(63), _mm512_set1_epi32(0x0f));
    for sb in 0..units / 8 {
        let b = base.add(144 * sb);
        let dd = _mm512_i32gather_epi32::<1>(at, b.cast());
        let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
        // -dmin by its sign bit (as the scalar negation, zeros included).
        let dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(dd)));
        let neg_dmin = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(dmin), _mm512_set1_epi32(i32::MIN)));
        // Scale bytes 0-3, 4-7 and 8-11 of each row.
        let s0 = _mm512_i32gather_epi32::<1>(at, b.add(4).cast());
        let s1 = _mm512_i32gather_epi32::<1>(at, b.add(8).cast());
        let s2 = _mm512_i32gather_epi32::<1>(at, b.add(12).cast());
        macro_rules! byte {
            ($v:expr, $i:literal) => {
                _mm512_and_si512(_mm512_srli_epi32::<{ 8 * $i }>($v), _mm512_set1_epi32(0xff))
            };
        }
        macro_rules! unit {
            ($u:literal, $i:literal) => {{
                let (sc, m) = if $u < 4 {
                    (_mm512_and_si512(byte!(s0, $i), m6), _mm512_and_si512(byte!(s1, $i), m6))
                } else {
                    // (No closure: it would not carry the caller's target features.)
                    let (lo, a0, a1) = (byte!(s2, $i), byte!(s0, $i), byte!(s1, $i));
                    let (h0, h1) = (
                        _mm512_slli_epi32::<4>(_mm512_srli_epi32::<6>(a0)),
                        _mm512_slli_epi32::<4>(_mm512_srli_epi32::<6>(a1)),
                    );
                    (_mm512_or_si512(_mm512_and_si512(lo, m4), h0), _mm512_or_si512(_mm512_srli_epi32::<4>(lo), h1))
                };
                let k = 8 * sb + $u;
                _mm512_storeu_ps(g.a[k].as_mut_ptr(), _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
                _mm512_storeu_ps(g.b[k].as_mut_ptr(), _mm512_mul_ps(neg_dmin, _mm512_cvtepi32_ps(m)));
            }};
        }
        unit!(0, 0);
        unit!(1, 1);
        unit!(2, 2);
        unit!(3, 3);
        unit!(4, 0);
        unit!(5, 1);
        unit!(6, 2);
        unit!(7, 3);
    }
}

/// One group of 16 weight rows against activation rows `c0..c0 + C` (`few`'s inner call).
#[derive(Clone, Copy)]
struct Few<'a> {
    w: &'a Matrix<'a>,
    g: &'a Group,
    direct: bool,
    r: usize,
    rows: usize,
    acts: &'a QuantizedActs,
    sums: &'a [Vec<i32>],
    c0: usize,
    order: __m512i,
    out: *mut f32,
}

// `k` indexes the group's units, the activation blocks and their code sums alike.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn few_rows<const F: u8, const SIGNED: bool, const C: usize>(at: Few) {
    let Few { w, g, direct, r, rows, acts, sums, c0, order, out } = at;
    let (units, ld, rb) = (w.cols / 32, w.rows, w.row_bytes());
    let base = w.bytes().as_ptr().add(r * rb);
    let flip = _mm512_set1_epi8(if SIGNED { -128 } else { 0 });
    let at_rows = lane_strides(rb);
    let mut acc = [_mm512_setzero_ps(); C];
    // The next group's rows on their way from memory, a unit's bytes at a time.
    let ahead = if r + 32 <= w.rows { 16 * rb } else { 0 };
    for k in 0..units {
        if ahead != 0 && k % 2 == 0 {
            let off = unit_bytes(F) * k;
            for j in 0..16 {
                _mm_prefetch::<_MM_HINT_T0>(base.add(ahead + j * rb + off).cast());
            }
        }
        // Weight rows 2p and 2p + 1 in the halves of vector p. (No closures here: they would
        // not carry the caller's target features, and the intrinsics would become calls.)
        let mut wv = [_mm512_setzero_si512(); 8];
        let nib = direct && (F == F_Q4_0 || F == F_Q4_1);
        for (p, v) in wv.iter_mut().enumerate() {
            if direct && F == F_Q4K {
                // Unit k is the low or high nibbles of 32 bytes of its super-block.
                let off = 144 * (k / 8) + 16 + 32 * ((k % 8) / 2);
                let (lo, hi) = (base.add(2 * p * rb + off), base.add((2 * p + 1) * rb + off));
                let both = _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_loadu_si256(lo.cast())),
                    _mm256_loadu_si256(hi.cast()),
                );
                let shifted = if k % 2 == 1 { _mm512_srli_epi16::<4>(both) } else { both };
                *v = _mm512_and_si512(shifted, _mm512_set1_epi8(0x0f));
                continue;
            }
            if nib {
                // The 16 code bytes of rows 2p and 2p + 1 spread to 32 nibbles each.
                let off = unit_bytes(F) * k + if F == F_Q4_0 { 2 } else { 4 };
                // Each row's 16 bytes twice (lanes 0-1: row 2p, 2-3: row 2p + 1), the second
                // copy shifted down a nibble: `nibbles`' order, for both rows in four operations.
                let a = _mm256_broadcastsi128_si256(_mm_loadu_si128(base.add(2 * p * rb + off).cast()));
                let b = _mm256_broadcastsi128_si256(_mm_loadu_si128(base.add((2 * p + 1) * rb + off).cast()));
                let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b);
                let shifts = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
                *v = _mm512_and_si512(_mm512_srlv_epi64(both, shifts), _mm512_set1_epi8(0x0f));
                continue;
            }
            let (lo, hi) = if direct {
                let off = if F == F_Q8_0 { 34 * k + 2 } else { 4 + 32 * k };
                (base.add(2 * p * rb + off), base.add((2 * p + 1) * rb + off))
            } else {
                (g.q[k].as_ptr().add(64 * p), g.q[k].as_ptr().add(64 * p + 32))
            };
            let both = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_loadu_si256(lo.cast())),
                _mm256_loadu_si256(hi.cast()),
            );
            *v = _mm512_xor_si512(both, flip);
        }
        let (av, bv) = if nib {
            // The 16 rows' f16 factors of the unit at once: d (and Q4_1's m above it); Q4_0's
            // offset is -8 d, as `unit_scalar` makes it.
            let bits = _mm512_i32gather_epi32::<1>(at_rows, base.add(unit_bytes(F) * k).cast());
            let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(bits));
            let b = if F == F_Q4_0 {
                _mm512_mul_ps(_mm512_set1_ps(-8.0), d)
            } else {
                _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(bits)))
            };
            (d, b)
        } else {
            (_mm512_loadu_ps(g.a[k].as_ptr()), _mm512_loadu_ps(g.b[k].as_ptr()))
        };
        for (c, acc) in acc.iter_mut().enumerate() {
            let blk = &acts.row(c0 + c)[k];
            let x = _mm512_broadcast_i64x4(_mm256_loadu_si256(blk.q.as_ptr().cast()));
            let z = _mm512_setzero_si512();
            let mut sums8 = [z; 8];
            for (d, v) in sums8.iter_mut().zip(&wv) {
                *d = _mm512_dpbusd_epi32(z, *v, x);
            }
            let mut dot = reduce(sums8);
            if SIGNED {
                dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(sums[c0 + c][k]));
            }
            let dot = _mm512_cvtepi32_ps(_mm512_permutexvar_epi32(order, dot));
            *acc = _mm512_fmadd_ps(_mm512_mul_ps(av, _mm512_set1_ps(blk.d)), dot, *acc);
            if !SIGNED {
                *acc = _mm512_fmadd_ps(bv, _mm512_set1_ps(blk.s), *acc);
            }
        }
    }
    let sv = _mm512_loadu_ps(g.scale.as_ptr());
    let mask: __mmask16 = if rows == 16 { 0xffff } else { (1u16 << rows) - 1 };
    for (c, acc) in acc.iter().enumerate() {
        _mm512_mask_storeu_ps(out.add((c0 + c) * ld + r), mask, _mm512_mul_ps(sv, *acc));
    }
}

/// The sums of eight vectors' lanes by row (vector `p`: row `2p` in lanes 0-7, row `2p + 1` in
/// lanes 8-15), one row a lane, in `lane_rows`' order.
#[inline(always)]
unsafe fn reduce(v: [__m512i; 8]) -> __m512i {
    macro_rules! pair32 {
        ($a:expr, $b:expr) => {
            _mm512_add_epi32(_mm512_unpacklo_epi32($a, $b), _mm512_unpackhi_epi32($a, $b))
        };
    }
    macro_rules! pair64 {
        ($a:expr, $b:expr) => {
            _mm512_add_epi32(_mm512_unpacklo_epi64($a, $b), _mm512_unpackhi_epi64($a, $b))
        };
    }
    let a = [pair32!(v[0], v[1]), pair32!(v[2], v[3]), pair32!(v[4], v[5]), pair32!(v[6], v[7])];
    let (b0, b1) = (pair64!(a[0], a[1]), pair64!(a[2], a[3]));
    let even = _mm512_shuffle_i32x4::<0b10_00_10_00>(b0, b1);
    let odd = _mm512_shuffle_i32x4::<0b11_01_11_01>(b0, b1);
    _mm512_add_epi32(even, odd)
}

/// The permutation that puts row `j`'s sum from `reduce` in lane `j`.
#[inline(always)]
unsafe fn lane_rows() -> __m512i {
    // Each row's id + 1 in one of its lanes: `reduce` then leaves it where that row's sum lands.
    let mut v = [_mm512_setzero_si512(); 8];
    for (p, v) in v.iter_mut().enumerate() {
        let mut l = [0i32; 16];
        l[0] = 2 * p as i32 + 1;
        l[8] = 2 * p as i32 + 2;
        *v = _mm512_loadu_si512(l.as_ptr().cast());
    }
    let mut ids = [0i32; 16];
    _mm512_storeu_si512(ids.as_mut_ptr().cast(), reduce(v));
    let mut order = [0i32; 16];
    for (lane, &id) in ids.iter().enumerate() {
        order[(id - 1) as usize] = lane as i32;
    }
    _mm512_loadu_si512(order.as_ptr().cast())
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
