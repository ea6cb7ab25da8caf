//! x86-64 kernels for `matmul`'s float path (weights stored as `F32`, `F16`, `BF16` or
//! `FP8_E4M3`, f32 activations): register tiles of `R` weight rows by `C` activation rows, eight
//! columns per step, each weight vector converted to f32 once (F16C for `F16`, a 16-bit shift
//! for `BF16`; for `FP8_E4M3` the E4M3 bit fields moved into f32's, subnormals and NaN codes
//! blended in, times the block's scale) and fused-multiply-added into every activation row of
//! the tile. Sums are exact f32
//! products accumulated in eight lanes, so results match `dot_row` up to summation order.
//!
//! Must not: be called except from code compiled with AVX2+FMA+F16C enabled (every function is
//! `#[inline(always)]` and relies on being inlined into the `#[target_feature]` wrappers in
//! `matmul.rs`, which only run after detection). Lengths are the caller's (checked) invariant.

#![cfg(target_arch = "x86_64")]

use super::matrix::Matrix;
use super::WeightFormat;
use std::arch::x86_64::*;

const F32: u8 = 0;
const F16: u8 = 1;
const BF16: u8 = 2;
const FP8: u8 = 3;

/// Eight E4M3 codes at `p` as f32 (exactly `fp8::E4M3`'s values, NaN codes NaN), times `scale`.
#[inline(always)]
unsafe fn e4m3x8(p: *const u8, scale: f32) -> __m256 {
    let c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast()));
    // Exponent and mantissa moved to f32's places, the bias 7 raised to 127; exponent 0 is
    // m * 2^-9 instead; exponent 15 with mantissa 7 is NaN; then the sign.
    let normal = _mm256_castsi256_ps(_mm256_add_epi32(
        _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x7f)), 20),
        _mm256_set1_epi32(120 << 23),
    ));
    let sub = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(c, _mm256_set1_epi32(7))), _mm256_set1_ps(1.0 / 512.0));
    let is_sub = _mm256_cmpeq_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x78)), _mm256_setzero_si256());
    let v = _mm256_blendv_ps(normal, sub, _mm256_castsi256_ps(is_sub));
    let is_nan = _mm256_cmpeq_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x7f)), _mm256_set1_epi32(0x7f));
    let v = _mm256_blendv_ps(v, _mm256_set1_ps(f32::NAN), _mm256_castsi256_ps(is_nan));
    let v = _mm256_or_ps(v, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24)));
    _mm256_mul_ps(v, _mm256_set1_ps(scale))
}

/// The f32 scale of the `FP8_E4M3` block holding column `col`, and the offset of its code.
#[inline(always)]
unsafe fn fp8_at(row: *const u8, col: usize) -> (f32, usize) {
    let b = col / super::fp8::FP8_BLOCK;
    let at = b * super::fp8::FP8_BYTES;
    (row.add(at).cast::<f32>().read_unaligned(), at + 4 + col % super::fp8::FP8_BLOCK)
}

/// Eight weights from column `col` of a stored row, as f32.
#[inline(always)]
unsafe fn load8<const F: u8>(row: *const u8, col: usize) -> __m256 {
    match F {
        F32 => _mm256_loadu_ps(row.cast::<f32>().add(col)),
        F16 => _mm256_cvtph_ps(_mm_loadu_si128(row.add(2 * col).cast())),
        // Eight columns never span two blocks (128 is a multiple of 8).
        FP8 => {
            let (scale, at) = fp8_at(row, col);
            e4m3x8(row.add(at), scale)
        }
        _ => {
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(row.add(2 * col).cast())), 16))
        }
    }
}

#[inline(always)]
unsafe fn load1<const F: u8>(row: *const u8, col: usize) -> f32 {
    match F {
        F32 => row.cast::<f32>().add(col).read_unaligned(),
        F16 => super::fp16::f16_to_f32(row.add(2 * col).cast::<u16>().read_unaligned()),
        FP8 => {
            let (scale, at) = fp8_at(row, col);
            super::fp8::E4M3[*row.add(at) as usize] * scale
        }
        _ => super::fp16::bf16_to_f32(row.add(2 * col).cast::<u16>().read_unaligned()),
    }
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
}

/// `out[r][c] = row_r . x_c` over `cols` columns.
#[inline(always)]
unsafe fn kernel<const F: u8, const R: usize, const C: usize>(
    rows: [*const u8; R],
    xs: [*const f32; C],
    cols: usize,
) -> [[f32; C]; R] {
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let c8 = cols / 8 * 8;
    let mut j = 0;
    while j < c8 {
        // A loop, not `array::from_fn`: a closure is compiled without the caller's target
        // features, and its intrinsics became calls (FP8 decode ran 50x slower that way).
        let mut wv = [_mm256_setzero_ps(); R];
        for (r, v) in wv.iter_mut().enumerate() {
            *v = load8::<F>(rows[r], j);
        }
        for c in 0..C {
            let xv = _mm256_loadu_ps(xs[c].add(j));
            for r in 0..R {
                acc[r][c] = _mm256_fmadd_ps(wv[r], xv, acc[r][c]);
            }
        }
        j += 8;
    }
    let mut out = [[0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            let mut s = hsum(acc[r][c]);
            for t in c8..cols {
                s = load1::<F>(rows[r], t).mul_add(*xs[c].add(t), s);
            }
            out[r][c] = s;
        }
    }
    out
}

/// Rows `r0..r1` of `w` against the `n` rows of `x`; element `(i, r)` goes to
/// `out + i * w.rows + r`. `WIDE`: AVX-512's 32 registers allow four weight rows per tile.
#[inline(always)]
unsafe fn tile_f<const F: u8, const WIDE: bool>(w: &Matrix, x: &[f32], n: usize, r0: usize, r1: usize, out: *mut f32) {
    let cols = w.cols;
    let ld = w.rows;
    let rp = |r: usize| w.bytes().as_ptr().add(r * w.row_bytes());
    let xp = |i: usize| x.as_ptr().add(i * cols);
    let put = |i: usize, r: usize, v: f32| *out.add(i * ld + r) = v;
    let mut r = r0;
    if n == 1 {
        while r + 4 <= r1 {
            let t = kernel::<F, 4, 1>([rp(r), rp(r + 1), rp(r + 2), rp(r + 3)], [xp(0)], cols);
            for (k, row) in t.iter().enumerate() {
                put(0, r + k, row[0]);
            }
            r += 4;
        }
    } else {
        while r + 2 <= r1 {
            let mut i = 0;
            if WIDE && r + 4 <= r1 {
                while i + 4 <= n {
                    let t = kernel::<F, 4, 4>(
                        [rp(r), rp(r + 1), rp(r + 2), rp(r + 3)],
                        [xp(i), xp(i + 1), xp(i + 2), xp(i + 3)],
                        cols,
                    );
                    for (k, row) in t.iter().enumerate() {
                        for (c, &v) in row.iter().enumerate() {
                            put(i + c, r + k, v);
                        }
                    }
                    i += 4;
                }
                while i < n {
                    let t = kernel::<F, 4, 1>([rp(r), rp(r + 1), rp(r + 2), rp(r + 3)], [xp(i)], cols);
                    for (k, row) in t.iter().enumerate() {
                        put(i, r + k, row[0]);
                    }
                    i += 1;
                }
                r += 4;
                continue;
            }
            while i + 4 <= n {
                let t = kernel::<F, 2, 4>([rp(r), rp(r + 1)], [xp(i), xp(i + 1), xp(i + 2), xp(i + 3)], cols);
                for (k, row) in t.iter().enumerate() {
                    for (c, &v) in row.iter().enumerate() {
                        put(i + c, r + k, v);
                    }
                }
                i += 4;
            }
            while i < n {
                let t = kernel::<F, 2, 1>([rp(r), rp(r + 1)], [xp(i)], cols);
                put(i, r, t[0][0]);
                put(i, r + 1, t[1][0]);
                i += 1;
            }
            r += 2;
        }
    }
    while r < r1 {
        for i in 0..n {
            put(i, r, kernel::<F, 1, 1>([rp(r)], [xp(i)], cols)[0][0]);
        }
        r += 1;
    }
}

/// The register-tiled float matmul tile for `w.format` (rows `r0..r1`, output layout as in
/// `tile_f`); `false` when the format is not a float format.
#[inline(always)]
pub unsafe fn tile_float<const WIDE: bool>(
    w: &Matrix,
    x: &[f32],
    n: usize,
    r0: usize,
    r1: usize,
    out: *mut f32,
) -> bool {
    match w.format {
        WeightFormat::F32 => tile_f::<F32, WIDE>(w, x, n, r0, r1, out),
        WeightFormat::F16 => tile_f::<F16, WIDE>(w, x, n, r0, r1, out),
        WeightFormat::BF16 => tile_f::<BF16, WIDE>(w, x, n, r0, r1, out),
        WeightFormat::FP8_E4M3 => tile_f::<FP8, WIDE>(w, x, n, r0, r1, out),
        _ => return false,
    }
    true
}
