//! x86-64 kernels for `matmul`'s hot path: the q8-activation dot products of the integer
//! formats (`Q4_0`, `Q4_1`, `Q8_0`, `I8Row`, `I4G64`, `Q4_K`, `Q6_K`) with AVX2 byte products
//! (`maddubs`), or with AVX-512 VNNI's `dpbusd` when `VNNI` is true. One block is one 256-bit
//! register of weights against one of activations; the i32 sums become f32 once per block and
//! accumulate with one FMA per block.
//!
//! Signed-by-signed byte products go through the usual identity
//! `a * b = |a| * (sign(a) b)`, so every product is unsigned-by-signed.
//!
//! Must not: be called except from code compiled with AVX2+FMA enabled (and AVX-512 VNNI+VL
//! when `VNNI`): every function is `#[inline(always)]` and relies on being inlined into the
//! `#[target_feature]` wrappers in `matmul.rs`, which only run after detection. Lengths are the
//! caller's (checked) invariant.

#![cfg(target_arch = "x86_64")]

use super::matrix::Matrix;
use super::q8::{BlockQ8, QuantizedActs};
use super::WeightFormat;
use std::arch::x86_64::*;

/// Eight i32 sums of four `u8 * i8` products each, as f32.
#[inline(always)]
unsafe fn dot_u8i8<const VNNI: bool>(a: __m256i, b: __m256i) -> __m256 {
    let s = if VNNI {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b)
    } else {
        _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))
    };
    _mm256_cvtepi32_ps(s)
}

/// `dot_u8i8` for two signed operands.
#[inline(always)]
unsafe fn dot_i8i8<const VNNI: bool>(a: __m256i, b: __m256i) -> __m256 {
    dot_u8i8::<VNNI>(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a))
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
}

/// 16 packed bytes to 32 nibbles: low nibbles first, then high nibbles.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> __m256i {
    let qs = _mm_loadu_si128(p.cast());
    _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), _mm256_set1_epi8(0x0f))
}

#[inline(always)]
unsafe fn load(q: &[i8; 32]) -> __m256i {
    _mm256_loadu_si256(q.as_ptr().cast())
}

// ---- Register-tiled matmul kernels -------------------------------------------------------
//
// Every 32-element unit of a supported format becomes `(wu, a, b)`: 32 unsigned bytes and two
// f32 such that the unit's dot with a q8 block `(d, s, q)` is `a * d * sum(wu * q) + b * s`
// (`s = d * sum(q)`). With VNNI, signed weights get their sign bit flipped (`w + 128`) and
// `b = -128 a` undoes the offset (AVX2 keeps them signed, see `signed`); 4-bit formats use
// their nibbles directly. A kernel computes an
// `R x C` tile (R weight rows by C activation rows) per pass over the units, so each weight unit
// is decoded once for C activation rows and each activation block loaded once for R rows.

pub(super) const F_Q8_0: u8 = 0;
pub(super) const F_Q4_0: u8 = 1;
pub(super) const F_Q4_1: u8 = 2;
pub(super) const F_I8ROW: u8 = 3;
pub(super) const F_I4G64: u8 = 4;
pub(super) const F_Q4K: u8 = 5;
const F_Q6K: u8 = 6;

#[inline(always)]
unsafe fn f16x2(p: *const u8) -> (f32, f32) {
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(p.cast::<i32>().read_unaligned()));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_shuffle_ps(v, v, 1)))
}

/// Whether the format stores signed bytes: AVX2's `maddubs` would saturate on `w + 128`, so
/// without VNNI these keep their signed bytes (`b = 0`) and take the sign-transfer product.
pub(super) const fn signed(f: u8) -> bool {
    f == F_Q8_0 || f == F_I8ROW
}

/// Formats whose units always hold signed bytes (`Q6_K`: its scale changes every 16 elements,
/// so its offset of 32 cannot be folded into `b`), on every level.
const fn always_signed(f: u8) -> bool {
    f == F_Q6K
}

/// The unit's weights, its per-lane multiplier `a` (lanes 0-3 cover elements 0-15 of the
/// unit's i32 sums, lanes 4-7 elements 16-31) and its `b`.
#[inline(always)]
unsafe fn unit<const F: u8, const VNNI: bool>(row: *const u8, k: usize) -> (__m256i, __m256, f32) {
    let (w, a, b) = unit_scalar::<F, VNNI>(row, k);
    if F == F_Q6K {
        return (w, a_q6k(row, k), b);
    }
    (w, _mm256_set1_ps(a), b)
}

/// With VNNI, signed bytes go in offset by 128 (sign bit flipped) and are corrected through
/// `b`: the mask that flips them, and the offset (`b = off * d`).
#[inline(always)]
unsafe fn vnni_flip<const VNNI: bool>() -> (__m256i, f32) {
    if VNNI {
        (_mm256_set1_epi8(-128), -128.0)
    } else {
        (_mm256_setzero_si256(), 0.0)
    }
}

#[inline(always)]
pub(super) unsafe fn unit_scalar<const F: u8, const VNNI: bool>(row: *const u8, k: usize) -> (__m256i, f32, f32) {
    let (flip, off) = vnni_flip::<VNNI>();
    match F {
        F_Q8_0 => {
            let b = row.add(34 * k);
            let (d, _) = f16x2(b);
            (_mm256_xor_si256(_mm256_loadu_si256(b.add(2).cast()), flip), d, off * d)
        }
        F_Q4_0 => {
            let b = row.add(18 * k);
            let (d, _) = f16x2(b);
            (nibbles(b.add(2)), d, -8.0 * d)
        }
        F_Q4_1 => {
            let b = row.add(20 * k);
            let (d, m) = f16x2(b);
            (nibbles(b.add(4)), d, m)
        }
        F_I8ROW => (_mm256_xor_si256(_mm256_loadu_si256(row.add(4 + 32 * k).cast()), flip), 1.0, off),
        F_Q4K => {
            let b = row.add(144 * (k / 8));
            let j = k % 8;
            let (d, dmin) = f16x2(b);
            let s = b.add(4);
            let (sc, m) = if j < 4 {
                (*s.add(j) & 63, *s.add(j + 4) & 63)
            } else {
                ((*s.add(j + 4) & 0x0f) | ((*s.add(j - 4) >> 6) << 4), (*s.add(j + 4) >> 4) | ((*s.add(j) >> 6) << 4))
            };
            let qs = _mm256_loadu_si256(b.add(16 + 32 * (j / 2)).cast());
            let q = if j.is_multiple_of(2) { qs } else { _mm256_srli_epi16(qs, 4) };
            (_mm256_and_si256(q, _mm256_set1_epi8(0x0f)), d * sc as f32, -dmin * m as f32)
        }
        F_Q6K => {
            let b = row.add(210 * (k / 8));
            let j = k % 8;
            let (h, g) = (j / 4, j % 4);
            let ql = _mm256_loadu_si256(b.add(64 * h + 32 * (g % 2)).cast());
            let qh = _mm256_loadu_si256(b.add(128 + 32 * h).cast());
            let lo = if g < 2 { ql } else { _mm256_srli_epi16(ql, 4) };
            let hi = match g {
                0 => qh,
                1 => _mm256_srli_epi16(qh, 2),
                2 => _mm256_srli_epi16(qh, 4),
                _ => _mm256_srli_epi16(qh, 6),
            };
            let q = _mm256_or_si256(
                _mm256_and_si256(lo, _mm256_set1_epi8(0x0f)),
                _mm256_slli_epi16(_mm256_and_si256(hi, _mm256_set1_epi8(3)), 4),
            );
            (_mm256_sub_epi8(q, _mm256_set1_epi8(32)), 0.0, 0.0)
        }
        _ => {
            let b = row.add(36 * (k / 2));
            let (d, m) = f16x2(b);
            let qs = _mm256_loadu_si256(b.add(4).cast());
            let q = if k.is_multiple_of(2) { qs } else { _mm256_srli_epi16(qs, 4) };
            (_mm256_and_si256(q, _mm256_set1_epi8(0x0f)), d, m)
        }
    }
}

/// `Q6_K`'s per-lane multipliers for unit `k`: `d * scale[2j]` for the first 16 elements and
/// `d * scale[2j + 1]` for the last 16.
#[inline(always)]
unsafe fn a_q6k(row: *const u8, k: usize) -> __m256 {
    let b = row.add(210 * (k / 8));
    let j = k % 8;
    let (_, d) = f16x2(b.add(206));
    let s0 = *b.add(192 + 2 * j) as i8 as f32 * d;
    let s1 = *b.add(192 + 2 * j + 1) as i8 as f32 * d;
    _mm256_setr_ps(s0, s0, s0, s0, s1, s1, s1, s1)
}

/// `out[r][c] = row_r . x_c` for `R` weight rows and `C` activation rows.
#[inline(always)]
unsafe fn kernel<const F: u8, const R: usize, const C: usize, const VNNI: bool>(
    rows: [*const u8; R],
    xs: [*const BlockQ8; C],
    units: usize,
) -> [[f32; C]; R] {
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let mut accb = [[0f32; C]; R];
    for k in 0..units {
        let mut xq = [_mm256_setzero_si256(); C];
        let mut xd = [_mm256_setzero_ps(); C];
        let mut xsum = [0f32; C];
        for c in 0..C {
            let b = &*xs[c].add(k);
            xq[c] = load(&b.q);
            xd[c] = _mm256_set1_ps(b.d);
            xsum[c] = b.s;
        }
        for r in 0..R {
            let (wu, a, b) = unit::<F, VNNI>(rows[r], k);
            for c in 0..C {
                let s = if always_signed(F) || (signed(F) && !VNNI) {
                    dot_i8i8::<VNNI>(wu, xq[c])
                } else {
                    dot_u8i8::<VNNI>(wu, xq[c])
                };
                acc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(a, xd[c]), s, acc[r][c]);
                accb[r][c] += b * xsum[c];
            }
        }
    }
    let mut out = [[0f32; C]; R];
    for r in 0..R {
        let scale = if F == F_I8ROW { f32::from_le_bytes(rows[r].cast::<[u8; 4]>().read_unaligned()) } else { 1.0 };
        for c in 0..C {
            out[r][c] = scale * (hsum(acc[r][c]) + accb[r][c]);
        }
    }
    out
}

/// `kernel` for `P` pairs of weight rows by four activation rows, with the `b * s` terms
/// accumulated as vectors: lanes 0-3 of `accb[p]` are pair `p`'s first row against the four
/// activation rows, lanes 4-7 its second row. `sx[k]` holds the four rows' `s` of unit `k`.
#[inline(always)]
unsafe fn kernel4<const F: u8, const P: usize, const VNNI: bool>(
    rows: [[*const u8; 2]; P],
    xs: [*const BlockQ8; 4],
    sx: *const [f32; 4],
    units: usize,
) -> [[[f32; 4]; 2]; P] {
    let mut acc = [[[_mm256_setzero_ps(); 4]; 2]; P];
    let mut accb = [_mm256_setzero_ps(); P];
    for k in 0..units {
        let mut xq = [_mm256_setzero_si256(); 4];
        let mut xd = [_mm256_setzero_ps(); 4];
        for c in 0..4 {
            let b = &*xs[c].add(k);
            xq[c] = load(&b.q);
            xd[c] = _mm256_set1_ps(b.d);
        }
        let sv = _mm256_broadcast_ps(&*sx.add(k).cast::<__m128>());
        for p in 0..P {
            let u = [unit::<F, VNNI>(rows[p][0], k), unit::<F, VNNI>(rows[p][1], k)];
            if !always_signed(F) {
                let bv = _mm256_set_m128(_mm_set1_ps(u[1].2), _mm_set1_ps(u[0].2));
                accb[p] = _mm256_fmadd_ps(bv, sv, accb[p]);
            }
            for h in 0..2 {
                let (wu, a, _) = u[h];
                for c in 0..4 {
                    let s = if always_signed(F) || (signed(F) && !VNNI) {
                        dot_i8i8::<VNNI>(wu, xq[c])
                    } else {
                        dot_u8i8::<VNNI>(wu, xq[c])
                    };
                    acc[p][h][c] = _mm256_fmadd_ps(_mm256_mul_ps(a, xd[c]), s, acc[p][h][c]);
                }
            }
        }
    }
    let mut out = [[[0f32; 4]; 2]; P];
    for p in 0..P {
        let mut b = [0f32; 8];
        _mm256_storeu_ps(b.as_mut_ptr(), accb[p]);
        for h in 0..2 {
            let scale =
                if F == F_I8ROW { f32::from_le_bytes(rows[p][h].cast::<[u8; 4]>().read_unaligned()) } else { 1.0 };
            for c in 0..4 {
                out[p][h][c] = scale * (hsum(acc[p][h][c]) + b[4 * h + c]);
            }
        }
    }
    out
}

/// Four activation rows rearranged for `kernel_pair`, per pair of units `(2p, 2p + 1)`: the
/// first sixteen bytes of both units in `lo[c]` and the last sixteen in `hi[c]`, so that two
/// byte dot products leave unit `2p`'s sum in lanes 0-3 and unit `2p + 1`'s in lanes 4-7;
/// `d[c]` holds the two units' scales four times each, `s` their sums (`s[c]` unit `2p`,
/// `s[4 + c]` unit `2p + 1`). A missing last unit (odd count) is all zeros.
#[repr(C, align(32))]
#[derive(Clone, Copy)]
pub struct PairActs {
    lo: [[i8; 32]; 4],
    hi: [[i8; 32]; 4],
    d: [[f32; 8]; 4],
    s: [f32; 8],
}

const EMPTY_PAIR: PairActs = PairActs { lo: [[0; 32]; 4], hi: [[0; 32]; 4], d: [[0.0; 8]; 4], s: [0.0; 8] };

/// Fills `out` with the `PairActs` of activation rows `xs` (`units` blocks each; up to four,
/// the slots past them zero).
#[inline(always)]
unsafe fn pair_acts<const C: usize>(xs: [*const BlockQ8; C], units: usize, out: &mut Vec<PairActs>) {
    out.clear();
    out.resize(units.div_ceil(2), EMPTY_PAIR);
    for (p, pa) in out.iter_mut().enumerate() {
        for h in 0..2 {
            let k = 2 * p + h;
            if k == units {
                break;
            }
            for (c, x) in xs.iter().enumerate() {
                let b = &*x.add(k);
                pa.lo[c][16 * h..16 * h + 16].copy_from_slice(&b.q[..16]);
                pa.hi[c][16 * h..16 * h + 16].copy_from_slice(&b.q[16..]);
                pa.d[c][4 * h..4 * h + 4].fill(b.d);
                pa.s[4 * h + c] = b.s;
            }
        }
    }
}

/// `i32` lanes of `acc` plus four-byte dot products of `w` (bytes as `unit` gives them) and
/// `x` (signed).
#[inline(always)]
unsafe fn dot_acc<const F: u8, const VNNI: bool>(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    if VNNI {
        _mm256_dpbusd_epi32(acc, w, x)
    } else {
        let (a, b) = if signed(F) { (_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)) } else { (w, x) };
        _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)))
    }
}

/// Units `k` and `k + 1` of a row in `kernel_pair`'s layout: first halves, second halves, the
/// scales and the `b` terms (four lanes each). `k + 1 < units` unless `LAST`, where the second
/// unit is absent and contributes zeros.
#[inline(always)]
unsafe fn pair_unit<const F: u8, const VNNI: bool, const LAST: bool>(
    row: *const u8,
    k: usize,
) -> (__m256i, __m256i, __m256, __m256) {
    if !LAST && (F == F_Q4_1 || F == F_Q4_0) {
        // Nibble formats: both units' 16 bytes in one register give both halves directly.
        let (size, qs) = if F == F_Q4_1 { (20, 4) } else { (18, 2) };
        let (p0, p1) = (row.add(size * k), row.add(size * (k + 1)));
        let raw = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128(p0.add(qs).cast())),
            _mm_loadu_si128(p1.add(qs).cast()),
            1,
        );
        let m = _mm256_set1_epi8(0x0f);
        let hdr =
            _mm_cvtph_ps(_mm_setr_epi32(p0.cast::<i32>().read_unaligned(), p1.cast::<i32>().read_unaligned(), 0, 0));
        let hdr = _mm256_castps128_ps256(hdr);
        // Q4_1: lanes d0, m0, d1, m1; Q4_0: d0, (q bytes), d1, (q bytes), with b = -8 d.
        let av = _mm256_permutevar8x32_ps(hdr, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2));
        let bv = if F == F_Q4_1 {
            _mm256_permutevar8x32_ps(hdr, _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3))
        } else {
            _mm256_mul_ps(av, _mm256_set1_ps(-8.0))
        };
        return (_mm256_and_si256(raw, m), _mm256_and_si256(_mm256_srli_epi16(raw, 4), m), av, bv);
    }
    if !LAST && F == F_Q8_0 {
        // Both units' scales converted at once and spread in vector lanes (`unit`'s way goes
        // through a scalar and back for each): the same `a = d`, `b = off * d`.
        let (p0, p1) = (row.add(34 * k), row.add(34 * (k + 1)));
        let (flip, off) = vnni_flip::<VNNI>();
        let u0 = _mm256_xor_si256(_mm256_loadu_si256(p0.add(2).cast()), flip);
        let u1 = _mm256_xor_si256(_mm256_loadu_si256(p1.add(2).cast()), flip);
        let hdr =
            _mm_cvtph_ps(_mm_setr_epi32(p0.cast::<i32>().read_unaligned(), p1.cast::<i32>().read_unaligned(), 0, 0));
        let av = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(hdr), _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2));
        let bv = _mm256_mul_ps(_mm256_set1_ps(off), av);
        return (_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u0, u1, 0x31), av, bv);
    }
    let (u0, a0, b0) = unit::<F, VNNI>(row, k);
    let (u1, a1, b1) =
        if LAST { (_mm256_setzero_si256(), _mm256_setzero_ps(), 0.0) } else { unit::<F, VNNI>(row, k + 1) };
    let wlo = _mm256_permute2x128_si256(u0, u1, 0x20);
    let whi = _mm256_permute2x128_si256(u0, u1, 0x31);
    (wlo, whi, _mm256_blend_ps(a0, a1, 0xf0), _mm256_blend_ps(_mm256_set1_ps(b0), _mm256_set1_ps(b1), 0xf0))
}

/// One step of `kernel_pair`: units `k` and `k + 1` (only `k` when `LAST`).
#[inline(always)]
unsafe fn pair_step<const F: u8, const R: usize, const C: usize, const VNNI: bool, const LAST: bool>(
    rows: [*const u8; R],
    a: &PairActs,
    k: usize,
    acc: &mut [[__m256; C]; R],
    accb: &mut [__m256; R],
) {
    let xlo: [__m256i; C] = std::array::from_fn(|c| load(&a.lo[c]));
    let xhi: [__m256i; C] = std::array::from_fn(|c| load(&a.hi[c]));
    let xd: [__m256; C] = std::array::from_fn(|c| _mm256_load_ps(a.d[c].as_ptr()));
    let sv = _mm256_load_ps(a.s.as_ptr());
    for r in 0..R {
        let (wlo, whi, av, bv) = pair_unit::<F, VNNI, LAST>(rows[r], k);
        accb[r] = _mm256_fmadd_ps(bv, sv, accb[r]);
        for c in 0..C {
            let s = dot_acc::<F, VNNI>(dot_acc::<F, VNNI>(_mm256_setzero_si256(), wlo, xlo[c]), whi, xhi[c]);
            acc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(av, xd[c]), _mm256_cvtepi32_ps(s), acc[r][c]);
        }
    }
}

/// `R` weight rows against the first `C` (at most four) activation rows of `pa` (`units`
/// units), two units per step: per (row, activation row) one conversion, one scale product
/// and one FMA cover 64 byte products. A (row, activation row)'s sum is the same bits whatever
/// `R` and `C` and whichever other rows share the call. Not for `Q6_K` (its scale changes
/// inside a unit).
#[inline(always)]
unsafe fn kernel_pair<const F: u8, const R: usize, const C: usize, const VNNI: bool>(
    rows: [*const u8; R],
    pa: &[PairActs],
    units: usize,
) -> [[f32; C]; R] {
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let mut accb = [_mm256_setzero_ps(); R];
    for (p, pair) in pa[..units / 2].iter().enumerate() {
        pair_step::<F, R, C, VNNI, false>(rows, pair, 2 * p, &mut acc, &mut accb);
    }
    if units % 2 == 1 {
        pair_step::<F, R, C, VNNI, true>(rows, &pa[units / 2], units - 1, &mut acc, &mut accb);
    }
    let mut out = [[0f32; C]; R];
    for r in 0..R {
        let scale = if F == F_I8ROW { f32::from_le_bytes(rows[r].cast::<[u8; 4]>().read_unaligned()) } else { 1.0 };
        let mut b = [0f32; 8];
        _mm256_storeu_ps(b.as_mut_ptr(), accb[r]);
        for c in 0..C {
            out[r][c] = scale * (hsum(acc[r][c]) + b[c] + b[4 + c]);
        }
    }
    out
}

/// How far ahead of the weight row it multiplies a decode tile prefetches (`tile_f`'s `few!`).
/// Measured on this 2-core machine's DRAM (docs/BENCHMARKS.md, 2026-12-06): rows of 2 KiB one
/// row ahead and of 1 KiB three ahead were best; 8 KiB and more lost a quarter.
const DECODE_AHEAD: usize = 4096;

/// Rows `r0..r1` of `w` against all of `acts`; element `(i, r)` goes to `out + i * w.rows + r`.
#[inline(always)]
unsafe fn tile_f<const F: u8, const VNNI: bool>(w: &Matrix, acts: &QuantizedActs, r0: usize, r1: usize, out: *mut f32) {
    let n = acts.n();
    let ld = w.rows;
    let units = w.cols / 32;
    let rp = |r: usize| w.bytes().as_ptr().add(r * w.row_bytes());
    let xp = |i: usize| acts.row(i).as_ptr();
    let put = |i: usize, r: usize, v: f32| *out.add(i * ld + r) = v;
    let mut r = r0;
    // A (weight row, activation row)'s sum is the same bits whatever other rows share the call
    // (a decode row alone or batched with other sequences' rows, a prompt's last rows): pairs of
    // weight rows always take `kernel_pair`'s order (`Q6_K`: `kernel`'s, which `kernel4` shares),
    // a matrix's odd last row `kernel`'s.
    // `c` activation rows from `i` against the weight rows from `r` up to `end` (pairs), each
    // group of weight rows streamed once for all of them; gives the row it stopped at.
    macro_rules! rows_of {
        ($i:expr, $c:literal, $r:expr, $end:expr) => {{
            let (i, end) = ($i, $end);
            let xs: [*const BlockQ8; $c] = std::array::from_fn(|c| xp(i + c));
            let mut pa = Vec::new();
            if F != F_Q6K {
                pair_acts(xs, units, &mut pa);
            }
            let mut r = $r;
            // Four weight rows at a time with AVX-512's 32 registers, two with AVX2's 16.
            while VNNI && r + 4 <= end {
                let rows = [rp(r), rp(r + 1), rp(r + 2), rp(r + 3)];
                let t = if F != F_Q6K {
                    kernel_pair::<F, 4, $c, VNNI>(rows, &pa, units)
                } else {
                    kernel::<F, 4, $c, VNNI>(rows, xs, units)
                };
                for (j, row) in t.iter().enumerate() {
                    for (c, &v) in row.iter().enumerate() {
                        put(i + c, r + j, v);
                    }
                }
                r += 4;
            }
            while r + 2 <= end {
                let rows = [rp(r), rp(r + 1)];
                let t = if F != F_Q6K {
                    kernel_pair::<F, 2, $c, VNNI>(rows, &pa, units)
                } else {
                    kernel::<F, 2, $c, VNNI>(rows, xs, units)
                };
                for (j, row) in t.iter().enumerate() {
                    for (c, &v) in row.iter().enumerate() {
                        put(i + c, r + j, v);
                    }
                }
                r += 2;
            }
            r
        }};
    }
    let pairs_end = r0 + (r1 - r0) / 2 * 2;
    // One to three activation rows (decode, a checked draft): the weights stream from DRAM,
    // one row at a time, so the matrix is read front to back as one stream the hardware
    // prefetcher follows, and the row about `DECODE_AHEAD` bytes ahead is prefetched as each
    // row starts. Each row's sums take the order they take in pairs (`kernel_pair`; `Q6_K`
    // `kernel`), so the bits are those of every other path.
    macro_rules! few {
        ($c:literal) => {{
            let xs: [*const BlockQ8; $c] = std::array::from_fn(xp);
            let mut pa = Vec::new();
            if F != F_Q6K {
                pair_acts(xs, units, &mut pa);
            }
            let ahead = (DECODE_AHEAD / w.row_bytes().max(1)).max(1);
            while r < pairs_end {
                if r + ahead < w.rows {
                    let start = rp(r + ahead);
                    for off in (0..w.row_bytes()).step_by(64) {
                        _mm_prefetch::<_MM_HINT_T0>(start.add(off).cast());
                    }
                }
                let t = if F != F_Q6K {
                    kernel_pair::<F, 1, $c, VNNI>([rp(r)], &pa, units)
                } else {
                    kernel::<F, 1, $c, VNNI>([rp(r)], xs, units)
                };
                for (c, &v) in t[0].iter().enumerate() {
                    put(c, r, v);
                }
                r += 1;
            }
        }};
    }
    if n == 1 {
        few!(1);
    } else if n == 2 {
        few!(2);
    } else if n == 3 {
        few!(3);
    } else {
        // Activation rows four at a time (their `s` gathered once), each against every pair of
        // this tile's weight rows; then the leftover activation rows one at a time.
        let mut sx = vec![[0f32; 4]; units];
        let mut i = 0;
        if F != F_Q6K {
            let mut pa = Vec::new();
            while i + 4 <= n {
                pair_acts([xp(i), xp(i + 1), xp(i + 2), xp(i + 3)], units, &mut pa);
                let mut r = r0;
                while VNNI && r + 4 <= pairs_end {
                    let t = kernel_pair::<F, 4, 4, VNNI>([rp(r), rp(r + 1), rp(r + 2), rp(r + 3)], &pa, units);
                    for (j, row) in t.iter().enumerate() {
                        for (c, &v) in row.iter().enumerate() {
                            put(i + c, r + j, v);
                        }
                    }
                    r += 4;
                }
                while r < pairs_end {
                    let t = kernel_pair::<F, 2, 4, VNNI>([rp(r), rp(r + 1)], &pa, units);
                    for (j, row) in t.iter().enumerate() {
                        for (c, &v) in row.iter().enumerate() {
                            put(i + c, r + j, v);
                        }
                    }
                    r += 2;
                }
                i += 4;
            }
        }
        while i + 4 <= n {
            for (k, v) in sx.iter_mut().enumerate() {
                *v = std::array::from_fn(|c| (*xp(i + c).add(k)).s);
            }
            let mut r = r0;
            // With AVX-512's 32 registers, two pairs of weight rows share each activation load.
            while VNNI && r + 4 <= pairs_end {
                let t = kernel4::<F, 2, VNNI>(
                    [[rp(r), rp(r + 1)], [rp(r + 2), rp(r + 3)]],
                    [xp(i), xp(i + 1), xp(i + 2), xp(i + 3)],
                    sx.as_ptr(),
                    units,
                );
                for (p, pair) in t.iter().enumerate() {
                    for (j, row) in pair.iter().enumerate() {
                        for (c, &v) in row.iter().enumerate() {
                            put(i + c, r + 2 * p + j, v);
                        }
                    }
                }
                r += 4;
            }
            while r < pairs_end {
                let t = kernel4::<F, 1, VNNI>(
                    [[rp(r), rp(r + 1)]],
                    [xp(i), xp(i + 1), xp(i + 2), xp(i + 3)],
                    sx.as_ptr(),
                    units,
                );
                for (j, row) in t[0].iter().enumerate() {
                    for (c, &v) in row.iter().enumerate() {
                        put(i + c, r + j, v);
                    }
                }
                r += 2;
            }
            i += 4;
        }
        // The one to three activation rows left: together against each group of four weight
        // rows (each weight unit decoded once for all of them; the sums' order is `few!`'s).
        macro_rules! rest {
            ($i:expr, $c:literal) => {{
                rows_of!($i, $c, r0, pairs_end);
            }};
        }
        match n - i {
            3 if VNNI => rest!(i, 3),
            3 => {
                rest!(i, 2);
                rest!(i + 2, 1);
            }
            2 => rest!(i, 2),
            1 => rest!(i, 1),
            _ => {}
        }
        r = pairs_end;
    }
    while r < r1 {
        for i in 0..n {
            put(i, r, kernel::<F, 1, 1, VNNI>([rp(r)], [xp(i)], units)[0][0]);
        }
        r += 1;
    }
}

/// The register-tiled q8 matmul tile for `w.format` (rows `r0..r1`, output layout as in
/// `tile_f`); `false` when the format has no kernel here (the caller falls back to the
/// row-at-a-time path).
#[inline(always)]
pub unsafe fn tile_q8<const VNNI: bool>(w: &Matrix, acts: &QuantizedActs, r0: usize, r1: usize, out: *mut f32) -> bool {
    match w.format {
        WeightFormat::Q8_0 => tile_f::<F_Q8_0, VNNI>(w, acts, r0, r1, out),
        WeightFormat::Q4_0 => tile_f::<F_Q4_0, VNNI>(w, acts, r0, r1, out),
        WeightFormat::Q4_1 => tile_f::<F_Q4_1, VNNI>(w, acts, r0, r1, out),
        WeightFormat::I8Row => tile_f::<F_I8ROW, VNNI>(w, acts, r0, r1, out),
        WeightFormat::I4G64 => tile_f::<F_I4G64, VNNI>(w, acts, r0, r1, out),
        WeightFormat::Q4_K => tile_f::<F_Q4K, VNNI>(w, acts, r0, r1, out),
        WeightFormat::Q6_K => tile_f::<F_Q6K, VNNI>(w, acts, r0, r1, out),
        _ => return false,
    }
    true
}

/// `q8::quantize_block` for `out.len()` blocks of `x`, eight lanes at a time; the same
/// arithmetic (`amax / 127`, `x * (1 / d)` rounded to nearest even) so the blocks are
/// bit-identical to the portable ones.
#[inline(always)]
pub unsafe fn quantize_blocks(x: &[f32], out: &mut [BlockQ8]) {
    let sign = _mm256_set1_ps(-0.0);
    for (o, c) in out.iter_mut().zip(x.chunks_exact(32)) {
        let p = c.as_ptr();
        let v = [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24))];
        let a = v.map(|v| _mm256_andnot_ps(sign, v));
        let m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let i = v.map(|v| _mm256_cvtps_epi32(_mm256_mul_ps(v, id)));
        let sum = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
        let s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        let s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0b01_00_11_10));
        let total = _mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0b10_11_00_01)));
        // packs interleave 128-bit lanes; the permute restores element order.
        let q16a = _mm256_packs_epi32(i[0], i[1]);
        let q16b = _mm256_packs_epi32(i[2], i[3]);
        let q8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q16a, q16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        o.d = d;
        o.s = d * total as f32;
        _mm256_storeu_si256(o.q.as_mut_ptr().cast(), q8);
    }
}
