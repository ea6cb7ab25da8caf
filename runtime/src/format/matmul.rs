//! `matmul` over a `Matrix` (`matrix.rs`): `out[n x rows] = x[n x cols] * W^T`,
//! parallel over chunks of weight rows on the thread team (`pool`). Each task takes a run of
//! weight rows and dots every row with all `n` activation rows while it is hot in cache, so
//! prefill decodes each weight block once per task, not once per token; results go straight
//! to their place in `out` (tasks own disjoint columns). Integer formats take the activations
//! quantized once per call (`QuantizedActs`); callers that feed one input to several matrices
//! (q/k/v, gate/up) quantize once and call `matmul_q_multi`, one pass over all of them.
//!
//! The inner loops are compiled three times: portable, with AVX2+FMA+F16C, and with AVX-512
//! VNNI, chosen once at run time (`simd` holds the integer kernels, `fsimd` the float ones); on
//! a CPU with AMX the 8-bit formats take `amx`'s kernels (the AMX level). `QuantizedActs::new`
//! lives here, beside the builds that quantize.
//!
//! Must not: allocate per row, hold weights beyond the call, or panic on mismatched sizes
//! (they are `FormatError`s).

use super::matrix::Matrix;
use super::pool::{self, SendPtr};
use super::q8::{self, BlockQ8, QuantizedActs};
use super::{dot, FormatError, WeightFormat};
use std::sync::OnceLock;

/// `out[n x rows] = x[n x cols] * W^T`. Panics if `x` or `out` has the wrong length (the
/// caller's invariant); `try_matmul` reports it instead.
#[track_caller]
pub fn matmul(w: &Matrix, x: &[f32], n: usize, out: &mut [f32]) {
    if let Err(e) = try_matmul(w, x, n, out) {
        panic!("matmul with {w:?}: {e}");
    }
}

/// `matmul_q` that panics on mismatched sizes.
#[track_caller]
pub fn matmul_q(w: &Matrix, acts: &QuantizedActs, out: &mut [f32]) {
    if let Err(e) = try_matmul_q(w, acts, out) {
        panic!("matmul with {w:?}: {e}");
    }
}

/// `matmul` that reports mismatched sizes as an error.
pub fn try_matmul(w: &Matrix, x: &[f32], n: usize, out: &mut [f32]) -> Result<(), FormatError> {
    if x.len() != n * w.cols {
        return Err(FormatError::Length { what: "matmul input (n x cols)", expected: n * w.cols, found: x.len() });
    }
    check_out(w, n, out)?;
    if w.format.uses_q8_acts(w.cols) {
        let acts = QuantizedActs::new(x, n, w.cols)?;
        drive(&[Seg { w: *w, n, out: SendPtr(out.as_mut_ptr()) }], &|_, w, r0, r1, o| tile_q8(w, &acts, r0, r1, o));
    } else {
        drive(&[Seg { w: *w, n, out: SendPtr(out.as_mut_ptr()) }], &|_, w, r0, r1, o| tile_f32(w, x, n, r0, r1, o));
    }
    Ok(())
}

/// `matmul` with activations already quantized (reuse one `QuantizedActs` across the matrices
/// that read the same input). Float formats dequantize the activations first.
pub fn try_matmul_q(w: &Matrix, acts: &QuantizedActs, out: &mut [f32]) -> Result<(), FormatError> {
    try_matmul_q_multi(&mut [(*w, out)], acts)
}

/// Several matmuls of one input (q/k/v, gate/up) in one parallel pass: `out_j = x * W_j^T`
/// for each `(W_j, out_j)`, `x` given quantized. One dispatch to the thread team instead of
/// one per matrix.
pub fn try_matmul_q_multi(mats: &mut [(Matrix, &mut [f32])], acts: &QuantizedActs) -> Result<(), FormatError> {
    let n = acts.n();
    for (w, out) in mats.iter() {
        if acts.cols() != w.cols {
            return Err(FormatError::Length {
                what: "quantized activation columns",
                expected: w.cols,
                found: acts.cols(),
            });
        }
        check_out(w, n, out)?;
    }
    let segs: Vec<Seg> = mats.iter_mut().map(|(w, out)| Seg { w: *w, n, out: SendPtr(out.as_mut_ptr()) }).collect();
    if segs.iter().all(|s| s.w.format.uses_q8_acts(s.w.cols)) {
        drive(&segs, &|_, w, r0, r1, o| tile_q8(w, acts, r0, r1, o));
    } else {
        let x = acts.dequantize();
        drive(&segs, &|_, w, r0, r1, o| {
            if w.format.uses_q8_acts(w.cols) {
                tile_q8(w, acts, r0, r1, o)
            } else {
                tile_f32(w, &x, n, r0, r1, o)
            }
        });
    }
    Ok(())
}

/// Several matmuls of one f32 input `x` (`n x cols`) in one parallel pass, as `matmul` would
/// compute each: integer formats against `x` quantized once (into `acts`, reused scratch),
/// float formats against `x` itself.
pub fn try_matmul_multi(
    mats: &mut [(Matrix, &mut [f32])],
    x: &[f32],
    n: usize,
    acts: &mut QuantizedActs,
) -> Result<(), FormatError> {
    for (w, out) in mats.iter() {
        if x.len() != n * w.cols {
            return Err(FormatError::Length { what: "matmul input (n x cols)", expected: n * w.cols, found: x.len() });
        }
        check_out(w, n, out)?;
    }
    let q8 = mats.iter().any(|(w, _)| w.format.uses_q8_acts(w.cols));
    if q8 {
        acts.requantize(x, n, mats[0].0.cols)?;
    }
    let acts = &*acts;
    let segs: Vec<Seg> = mats.iter_mut().map(|(w, out)| Seg { w: *w, n, out: SendPtr(out.as_mut_ptr()) }).collect();
    drive(&segs, &|_, w, r0, r1, o| {
        if w.format.uses_q8_acts(w.cols) {
            tile_q8(w, acts, r0, r1, o)
        } else {
            tile_f32(w, x, n, r0, r1, o)
        }
    });
    Ok(())
}

/// Matmuls of different inputs in one parallel pass: `out_j = x_j * W_j^T` for each
/// `(W_j, x_j, out_j)`, every `x_j` given quantized (its own row count): the routed experts of
/// a decode step, one job for all their gate and up matrices instead of one a matrix. Each
/// output is the bits `matmul_q` gives it alone. Float formats dequantize their input first.
pub fn try_matmul_q_each(mats: &mut [(Matrix, &QuantizedActs, &mut [f32])]) -> Result<(), FormatError> {
    for (w, acts, out) in mats.iter() {
        if acts.cols() != w.cols {
            return Err(FormatError::Length {
                what: "quantized activation columns",
                expected: w.cols,
                found: acts.cols(),
            });
        }
        check_out(w, acts.n(), out)?;
    }
    let floats: Vec<Option<Vec<f32>>> =
        mats.iter().map(|(w, acts, _)| (!w.format.uses_q8_acts(w.cols)).then(|| acts.dequantize())).collect();
    let acts: Vec<&QuantizedActs> = mats.iter().map(|m| m.1).collect();
    let segs: Vec<Seg> =
        mats.iter_mut().map(|(w, acts, out)| Seg { w: *w, n: acts.n(), out: SendPtr(out.as_mut_ptr()) }).collect();
    drive(&segs, &|j, w, r0, r1, o| match &floats[j] {
        Some(x) => tile_f32(w, x, acts[j].n(), r0, r1, o),
        None => tile_q8(w, acts[j], r0, r1, o),
    });
    Ok(())
}

/// `try_matmul_multi` that panics on mismatched sizes.
#[track_caller]
pub fn matmul_multi(mats: &mut [(Matrix, &mut [f32])], x: &[f32], n: usize, acts: &mut QuantizedActs) {
    if let Err(e) = try_matmul_multi(mats, x, n, acts) {
        panic!("matmul of {} matrices: {e}", mats.len());
    }
}

/// `try_matmul_q_multi` that panics on mismatched sizes.
#[track_caller]
pub fn matmul_q_multi(mats: &mut [(Matrix, &mut [f32])], acts: &QuantizedActs) {
    if let Err(e) = try_matmul_q_multi(mats, acts) {
        panic!("matmul of {} matrices: {e}", mats.len());
    }
}

fn check_out(w: &Matrix, n: usize, out: &[f32]) -> Result<(), FormatError> {
    if out.len() != n * w.rows {
        return Err(FormatError::Length { what: "matmul output (n x rows)", expected: n * w.rows, found: out.len() });
    }
    Ok(())
}

/// Below this many weight bytes (times `n`) a matmul runs on the calling thread.
const SERIAL_BYTES: usize = 48 * 1024;
/// The least work (weight bytes times `n`) worth a task.
const TASK_BYTES: usize = 16 * 1024;
/// Tasks per thread, for balance when another process takes part of a core.
const TASKS_PER_THREAD: usize = 4;

/// One matrix of a parallel pass, its activation rows and where its `[n x rows]` output starts.
struct Seg<'a> {
    w: Matrix<'a>,
    n: usize,
    out: SendPtr<f32>,
}

/// A tile computes rows `r0..r1` of segment `j`'s `w` against all its `n` activation rows,
/// writing element `(i, r)` at `out + i * w.rows + r`.
type Tile<'t> = dyn Fn(usize, &Matrix, usize, usize, *mut f32) + Sync + 't;

/// Runs `tile` over chunks of weight rows of every segment, spread over the thread team.
fn drive(segs: &[Seg], tile: &Tile) {
    let threads = pool::threads();
    let work: usize = segs.iter().map(|s| s.w.bytes().len().saturating_mul(s.n)).sum();
    if work < SERIAL_BYTES || threads == 1 || pool::busy() {
        for (j, s) in segs.iter().enumerate() {
            if s.w.rows > 0 && s.n > 0 {
                tile(j, &s.w, 0, s.w.rows, s.out.0);
            }
        }
        return;
    }
    // Every segment gets chunks of about the same work; chunk counts add up across segments.
    let target = (work / (threads * TASKS_PER_THREAD)).max(TASK_BYTES);
    let mut tasks: Vec<(usize, usize, usize)> = Vec::new();
    for (j, s) in segs.iter().enumerate() {
        if s.w.rows == 0 || s.n == 0 {
            continue;
        }
        let per_row = s.w.row_bytes().max(1).saturating_mul(s.n);
        // Multiples of 4 rows keep the register-tiled kernels off their one-row tail path.
        let chunk = target.div_ceil(per_row).next_multiple_of(4).min(s.w.rows);
        let mut r = 0;
        while r < s.w.rows {
            tasks.push((j, r, (r + chunk).min(s.w.rows)));
            r += chunk;
        }
    }
    pool::run(tasks.len(), &|t| {
        let (j, r0, r1) = tasks[t];
        tile(j, &segs[j].w, r0, r1, segs[j].out.0);
    });
}

/// Activation rows from which a q8 matmul of an 8-bit format runs on the AMX tiles, where the
/// CPU has them (fewer rows take AVX-512 kernels in the same arithmetic: the bits agree).
pub const TILE_ROWS: usize = 16;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Level {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// AVX-512 VNNI, and for the 8-bit formats `amx`'s arithmetic (the tiles from `TILE_ROWS`
    /// rows).
    #[cfg(target_arch = "x86_64")]
    Amx,
}

fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let forced = std::env::var("COLI_CPU_LEVEL").ok();
            let avx2 =
                is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
            let avx512 = avx2
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni");
            match forced.as_deref() {
                Some("portable") => return Level::Portable,
                Some("avx2") if avx2 => return Level::Avx2,
                Some("avx512vnni") if avx512 => return Level::Avx512,
                _ => {}
            }
            if avx512 && super::amx::usable() {
                return Level::Amx;
            }
            if avx512 {
                return Level::Avx512;
            }
            if avx2 {
                return Level::Avx2;
            }
        }
        Level::Portable
    })
}

/// The kernel level `matmul` uses on this machine (for benchmarks and logs). The environment
/// variable `COLI_CPU_LEVEL=portable|avx2|avx512vnni` caps it (read once).
pub fn kernel_level() -> &'static str {
    match level() {
        Level::Portable => "portable",
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => "avx2",
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 => "avx512vnni",
        #[cfg(target_arch = "x86_64")]
        Level::Amx => "amx",
    }
}

/// Whether this CPU runs the wide (AVX2+FMA or better) kernels; other modules use it to pick
/// their own `#[target_feature]` paths, honouring `COLI_CPU_LEVEL` as `matmul` does.
pub fn wide_simd() -> bool {
    level() != Level::Portable
}

#[inline(always)]
fn tile_q8_body<const LEVEL: u8>(w: &Matrix, acts: &QuantizedActs, r0: usize, r1: usize, out: *mut f32) {
    #[cfg(target_arch = "x86_64")]
    if LEVEL > 0 {
        // SAFETY: LEVEL > 0 runs only inside the `#[target_feature]` wrappers below, after
        // `level()` detected AVX2+FMA+F16C (and AVX-512 VNNI+VL for 2); `acts.cols == w.cols`,
        // `r0 <= r1 <= w.rows` and `out` holds `n x w.rows` (checked by `try_matmul*`, `drive`).
        let done = unsafe {
            let amx = LEVEL == 3
                && if acts.n() >= TILE_ROWS {
                    super::amx::tile_q8(w, acts, r0, r1, out)
                } else {
                    super::amx::few_q8(w, acts, r0, r1, out)
                };
            if amx {
                true
            } else if LEVEL >= 2 {
                super::simd::tile_q8::<true>(w, acts, r0, r1, out)
            } else {
                super::simd::tile_q8::<false>(w, acts, r0, r1, out)
            }
        };
        if done {
            return;
        }
    }
    for r in r0..r1 {
        let row = w.row_unchecked(r);
        for i in 0..acts.n() {
            // SAFETY: `(i, r)` is inside the `n x rows` output (the caller's invariant).
            unsafe { *out.add(i * w.rows + r) = q8::dot_row_q8(w.format, row, acts.row(i)) };
        }
    }
}

#[inline(always)]
fn tile_f32_body<const LEVEL: u8>(w: &Matrix, x: &[f32], n: usize, r0: usize, r1: usize, out: *mut f32) {
    #[cfg(target_arch = "x86_64")]
    if LEVEL > 0 {
        // SAFETY: as in `tile_q8_body`; `x` holds `n x cols`.
        let done = unsafe {
            if LEVEL >= 2 {
                super::fsimd::tile_float::<true>(w, x, n, r0, r1, out)
            } else {
                super::fsimd::tile_float::<false>(w, x, n, r0, r1, out)
            }
        };
        if done {
            return;
        }
    }
    let cols = w.cols;
    // SAFETY (every write below): `(i, r)` with `i < n`, `r0 <= r < r1 <= w.rows` is inside the
    // `n x rows` output (the caller's invariant).
    if n < 4 {
        for r in r0..r1 {
            let row = w.row_unchecked(r);
            for i in 0..n {
                unsafe { *out.add(i * w.rows + r) = dot::dot_row(w.format, row, &x[i * cols..(i + 1) * cols]) };
            }
        }
        return;
    }
    // Prefill: expand each weight row to f32 once, then dot it with four activation rows at a
    // time (the expansion is amortized over all `n`, each weight load over four rows).
    let mut wf = vec![0f32; cols];
    for r in r0..r1 {
        super::dequant::dequant_row(w.format, w.row_unchecked(r), &mut wf);
        let mut i = 0;
        while i + 4 <= n {
            let xs: [&[f32]; 4] = std::array::from_fn(|c| &x[(i + c) * cols..(i + c + 1) * cols]);
            for (c, v) in dot::fdot_rows(&wf, xs).into_iter().enumerate() {
                unsafe { *out.add((i + c) * w.rows + r) = v };
            }
            i += 4;
        }
        for j in i..n {
            unsafe { *out.add(j * w.rows + r) = dot::fdot_rows(&wf, [&x[j * cols..(j + 1) * cols]])[0] };
        }
    }
}

#[inline(always)]
fn quantize_blocks_body<const LEVEL: u8>(x: &[f32], out: &mut [q8::BlockQ8]) {
    #[cfg(target_arch = "x86_64")]
    if LEVEL > 0 {
        // SAFETY: inside the `#[target_feature]` wrappers, after detection (see `tile_q8_body`).
        return unsafe { super::simd::quantize_blocks(x, out) };
    }
    for (o, c) in out.iter_mut().zip(x.chunks_exact(32)) {
        *o = q8::quantize_block(c.try_into().unwrap());
    }
}

macro_rules! multiversion {
    ($name:ident, $body:ident, ($($arg:ident: $ty:ty),*)) => {
        fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma,f16c")]
                unsafe fn avx2($($arg: $ty),*) { $body::<1>($($arg),*) }
                #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
                unsafe fn avx512($($arg: $ty),*) { $body::<2>($($arg),*) }
                #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
                unsafe fn amx($($arg: $ty),*) { $body::<3>($($arg),*) }
                match level() {
                    // SAFETY: `level()` returned these only after detecting every feature enabled
                    // (and, for `Amx`, the tiles' permission).
                    Level::Avx2 => return unsafe { avx2($($arg),*) },
                    Level::Avx512 => return unsafe { avx512($($arg),*) },
                    Level::Amx => return unsafe { amx($($arg),*) },
                    Level::Portable => {}
                }
            }
            $body::<0>($($arg),*)
        }
    };
}

/// Rows `r0..r1` of `w` against every row of `acts`, as one task of a parallel pass computes
/// them (for tests: a task's rows need not start or end at a tile's).
#[cfg(test)]
pub(super) fn matmul_q_rows(w: &Matrix, acts: &QuantizedActs, r0: usize, r1: usize, out: &mut [f32]) {
    assert!(r0 <= r1 && r1 <= w.rows && acts.cols() == w.cols && out.len() == acts.n() * w.rows);
    tile_q8(w, acts, r0, r1, out.as_mut_ptr());
}

multiversion!(tile_q8, tile_q8_body, (w: &Matrix, acts: &QuantizedActs, r0: usize, r1: usize, out: *mut f32));
multiversion!(tile_f32, tile_f32_body, (w: &Matrix, x: &[f32], n: usize, r0: usize, r1: usize, out: *mut f32));
multiversion!(quantize_blocks_inner, quantize_blocks_body, (x: &[f32], out: &mut [q8::BlockQ8]));

/// Quantizes `x` (`32 * out.len()` values) into `out`, block by block, with the widest
/// instructions this CPU has (the same rounding on every level: ties to even).
pub(super) fn quantize_blocks(x: &[f32], out: &mut [q8::BlockQ8]) {
    quantize_blocks_inner(x, out)
}

impl QuantizedActs {
    /// Quantizes `x` (`n` rows of `cols`, row-major); `cols` must be a multiple of 32.
    pub fn new(x: &[f32], n: usize, cols: usize) -> Result<QuantizedActs, FormatError> {
        let mut acts = QuantizedActs::default();
        acts.requantize(x, n, cols)?;
        Ok(acts)
    }

    /// Re-fills this buffer from `x`, reusing its allocation.
    pub fn requantize(&mut self, x: &[f32], n: usize, cols: usize) -> Result<(), FormatError> {
        if !cols.is_multiple_of(32) {
            return Err(FormatError::RaggedRow { format: WeightFormat::Q8_0, cols, block: 32 });
        }
        if x.len() != n * cols {
            return Err(FormatError::Length { what: "activations (n x cols)", expected: n * cols, found: x.len() });
        }
        self.n = n;
        self.cols = cols;
        #[cfg(target_arch = "x86_64")]
        {
            self.tiles = std::sync::OnceLock::new();
        }
        let total = n * cols / 32;
        self.blocks.clear();
        self.blocks.resize(total, BlockQ8 { d: 0.0, s: 0.0, q: [0; 32] });
        // Large batches (prefill) quantize in parallel, a few rows per task.
        const BLOCKS_PER_TASK: usize = 512;
        let out = pool::SendPtr(self.blocks.as_mut_ptr());
        let tasks = total.div_ceil(BLOCKS_PER_TASK);
        pool::run(tasks, &|t| {
            let b0 = t * BLOCKS_PER_TASK;
            let b1 = (b0 + BLOCKS_PER_TASK).min(total);
            // SAFETY: tasks cover disjoint block ranges of `blocks`, which holds `total`.
            let dst = unsafe { std::slice::from_raw_parts_mut(out.get().add(b0), b1 - b0) };
            quantize_blocks(&x[32 * b0..32 * b1], dst);
        });
        Ok(())
    }
}
