//! Shared by the Vulkan tests: the context (a missing device fails loudly unless
//! `COLI_VK_TESTS=skip` opts out), a seeded generator, random weights in every format, and
//! the closeness check with its stated tolerance. `COLI_VK_VALIDATION=1` runs every context
//! made here under the Khronos validation layer (`VkOptions::default()` reads it; see
//! `coli_runtime::vk::Validation`): a validation error fails the test whose submission follows
//! it, and the test binary's exit status.
//!
//! Must not: compare a device path with itself (references are the CPU's).

#![allow(dead_code)]

use coli_runtime::format::{fp16, quantize, WeightFormat};
use coli_runtime::vk::{Context, DeviceBuffer, FormatVariant, KvType, MemoryUse, VkError, VkOptions};
use std::sync::OnceLock;

/// The shared context, or `None` when the run opted out of Vulkan tests. CI installs Lavapipe,
/// so a missing device is a setup bug: it fails the test with the reason.
pub fn ctx() -> Option<&'static Context> {
    static CTX: OnceLock<Option<Context>> = OnceLock::new();
    CTX.get_or_init(|| open(&VkOptions::default())).as_ref()
}

/// A context of its own (fault injection, caps), same opt-out rule.
pub fn open(opts: &VkOptions) -> Option<Context> {
    match Context::new(opts) {
        Ok(c) => Some(c),
        // Asked for (COLI_VK_VALIDATION=1) and missing: a setup bug whatever the opt-out says.
        Err(e @ (VkError::NoValidationLayer | VkError::BadEnvironment { .. })) => panic!("{e}"),
        // The suite's own environment variable: an explicit opt-out on machines without any
        // Vulkan driver (never set in CI).
        Err(e) if std::env::var("COLI_VK_TESTS").as_deref() == Ok("skip") => {
            eprintln!("skipping Vulkan test: {e}");
            None
        }
        Err(e) => {
            panic!("no Vulkan device for the tests ({e}); install Lavapipe (tools/setup.sh) or set COLI_VK_TESTS=skip")
        }
    }
}

/// xorshift64*, seeded per test.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1), never exactly zero in practice.
    pub fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.unit() * scale).collect()
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The weight formats the shaders decode (`FormatVariant::of`): every one, the grid formats
/// (`IQ1_*`, `IQ2_*`, `IQ3_*`) included.
pub fn device_formats() -> Vec<WeightFormat> {
    WeightFormat::ALL.into_iter().filter(|&f| FormatVariant::of(f, 256).is_some()).collect()
}

/// Random stored rows: encoded from random values where coli encodes the format; random
/// blocks (every bit pattern of the values) with sane f16 scales otherwise.
pub fn random_rows(format: WeightFormat, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    if format == WeightFormat::FP8_E4M3 {
        // Random codes (NaN codes moved to zero) under f32 scales 2^-9 .. 2^-5: weights up to
        // about 0.9, every code's bit pattern but the two NaNs.
        let mut b: Vec<u8> = (0..rows * format.row_bytes(cols).unwrap()).map(|_| rng.next() as u8).collect();
        for block in b.chunks_exact_mut(format.block_bytes()) {
            let scale = 2f32.powi(-9) * (1.0 + 15.0 * rng.unit().abs());
            block[0..4].copy_from_slice(&scale.to_le_bytes());
            block[4..].iter_mut().filter(|c| **c & 0x7f == 0x7f).for_each(|c| *c = 0);
        }
        return b;
    }
    if format == WeightFormat::MXFP4 {
        // Random nibbles under power-of-two half scales 2^-10 .. 2^-6: weights up to 0.19, as
        // the other formats' random blocks.
        let mut b: Vec<u8> = (0..rows * format.row_bytes(cols).unwrap()).map(|_| rng.next() as u8).collect();
        for block in b.chunks_exact_mut(format.block_bytes()) {
            block[0] = 118 + (rng.next() % 5) as u8;
        }
        return b;
    }
    let fields = format.f16_fields();
    if fields.is_empty() {
        return quantize(format, &rng.vec(rows * cols, 0.5), cols).unwrap();
    }
    let n = rows * format.row_bytes(cols).unwrap();
    let mut b: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
    for block in b.chunks_exact_mut(format.block_bytes()) {
        for &a in fields {
            let v = 0.001 + 0.02 * rng.unit().abs();
            format.set_f16_field(block, a, fp16::f32_to_f16(v));
        }
    }
    b
}

/// `max |got - want|` over the largest |want| (at least 1e-3): the measure `assert_close` bounds.
pub fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
    got.iter().zip(want).fold(0f32, |m, (g, w)| m.max((g - w).abs())) / scale
}

/// The largest |got - want| relative to the largest |want| (the bound the tests state).
pub fn worst(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(1e-30f32, |a, b| a.max(b.abs()));
    got.iter().zip(want).map(|(a, b)| (a - b).abs() / scale).fold(0.0, f32::max)
}

/// `max |got - want| <= tol * scale` where `scale` is the largest |want| (at least 1e-3).
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
    let (mut worst, mut at) = (0f32, 0);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let d = (g - w).abs();
        if d.is_nan() || d > worst {
            worst = d;
            at = i;
        }
    }
    assert!(worst <= tol * scale, "{what}: |{} - {}| at {at} = {worst:e} > {tol:e} * {scale}", got[at], want[at]);
}

/// Per element `|got - want| <= tol * mag[i] + 1e-6`, where `mag[i]` is the sum of the
/// magnitudes of the terms that make up element i (for a dot product, sum |w x|): the bound of
/// f32 summation in another order, which stays meaningful when terms cancel.
pub fn assert_close_terms(what: &str, got: &[f32], want: &[f32], mag: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, ((g, w), m)) in got.iter().zip(want).zip(mag).enumerate() {
        let d = (g - w).abs();
        assert!(d <= tol * m + 1e-6, "{what}: |{g} - {w}| at {i} = {d:e} > {tol:e} * {m}");
    }
}

/// `sum_k |W[r][k] x[i][k]|` for every (activation row i, weight row r), from the dequantized
/// weights.
pub fn term_magnitudes(
    format: coli_runtime::format::WeightFormat,
    bytes: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
) -> Vec<f32> {
    let m = coli_runtime::format::Matrix::new(format, rows, cols, bytes).unwrap();
    let mut w = vec![0f32; cols];
    let mut mag = vec![0f32; n * rows];
    for r in 0..rows {
        coli_runtime::format::dequant_row(format, m.row(r), &mut w);
        for i in 0..n {
            mag[i * rows + r] = w.iter().zip(&x[i * cols..(i + 1) * cols]).map(|(a, b)| (a * b).abs()).sum();
        }
    }
    mag
}

/// One attention case: random queries (`n` rows), keys and values (`pos0 + n` positions) and
/// sinks, the device's shape, and the CPU's answer (`cpu::attention::attend`, then the value
/// scale, as the executor applies it).
pub struct AttnCase {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub sinks: Vec<f32>,
    pub shape: coli_runtime::vk::AttnShape,
    pub want: Vec<f32>,
}

/// `AttnCase` for `heads` / `kv_heads` heads of `head_dim` (keys) and `v_head_dim` (values),
/// scale 1 / sqrt(head_dim), f32 mirrors.
#[allow(clippy::too_many_arguments)]
pub fn attention_case(
    rng: &mut Rng,
    dims: (usize, usize, usize, usize),
    window: Option<usize>,
    with_sinks: bool,
    value_scale: f32,
    n: usize,
    pos0: usize,
) -> AttnCase {
    attention_case_kv(rng, dims, window, with_sinks, value_scale, (n, pos0), KvType::F32)
}

/// `attention_case` over mirrors of `kv`: the keys and values are values of `kv` (rounded to
/// f16 for `KvType::F16`, so the CPU's answer is over what the mirrors hold).
pub fn attention_case_kv(
    rng: &mut Rng,
    (heads, kv_heads, head_dim, v_head_dim): (usize, usize, usize, usize),
    window: Option<usize>,
    with_sinks: bool,
    value_scale: f32,
    (n, pos0): (usize, usize),
    kv: KvType,
) -> AttnCase {
    use coli_runtime::cpu::attention as cpu;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let cs = cpu::AttnShape { heads, kv_heads, head_dim, v_head_dim, scale, window };
    let shape = coli_runtime::vk::AttnShape {
        heads,
        kv_heads,
        head_dim,
        v_head_dim,
        scale,
        window,
        value_scale,
        ring: None,
        kv,
    };
    let len = pos0 + n;
    let q = rng.vec(n * heads * head_dim, 1.0);
    let k = as_kv(&rng.vec(len * kv_heads * head_dim, 1.0), kv);
    let v = as_kv(&rng.vec(len * kv_heads * v_head_dim, 1.0), kv);
    let sinks = rng.vec(heads, 1.0);
    let mut want = vec![0f32; n * heads * v_head_dim];
    cpu::attend(cs, &q, &k, &v, pos0, with_sinks.then_some(&sinks[..]), &mut want);
    want.iter_mut().for_each(|x| *x *= value_scale);
    AttnCase { q, k, v, sinks, shape, want }
}

/// `x` as elements of `kv` hold it: rounded to f16 (nearest even) and widened, or as it is.
pub fn as_kv(x: &[f32], kv: KvType) -> Vec<f32> {
    match kv {
        KvType::F32 => x.to_vec(),
        KvType::F16 => x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect(),
    }
}

/// A K/V mirror of `kv` elements holding `rows` (`Context::write_kv`: f16 rounds them).
#[allow(dead_code)]
pub fn upload_kv(ctx: &Context, rows: &[f32], kv: KvType) -> DeviceBuffer {
    let b = ctx.buffer(MemoryUse::Device, (rows.len() * kv.bytes()).max(4)).unwrap();
    ctx.write_kv(&b, 0, rows, kv).unwrap();
    b
}

/// The first `count` elements of a K/V buffer of `kv` elements, widened to f32.
#[allow(dead_code)]
pub fn download_kv(ctx: &Context, b: &DeviceBuffer, count: usize, kv: KvType) -> Vec<f32> {
    let mut out = Vec::new();
    ctx.read_append_kv(b, 0, count, kv, &mut out).unwrap();
    out
}

/// The mirror types a device runs: f32, and f16 where it has 16-bit storage buffers.
#[allow(dead_code)]
pub fn kv_types(ctx: &Context) -> Vec<KvType> {
    if ctx.caps().storage_16bit {
        vec![KvType::F32, KvType::F16]
    } else {
        vec![KvType::F32]
    }
}

/// Rows `len - ring..len` of `rows` (`width` floats each) in a ring of `ring` rows (position `p`
/// in row `p % ring`, as a sliding window's mirror); rows of the ring no position fills hold
/// 40.0, far from the inputs' range, so a kernel reading one shows.
#[allow(dead_code)]
pub fn to_ring(rows: &[f32], width: usize, len: usize, ring: usize) -> Vec<f32> {
    let mut r = vec![40.0; ring * width];
    for p in len.saturating_sub(ring)..len {
        r[(p % ring) * width..][..width].copy_from_slice(&rows[p * width..][..width]);
    }
    r
}

/// A routing of `n` rows: `top_k` distinct experts each (every expert equally likely),
/// positive weights, by rank.
pub fn routing(n: usize, top_k: usize, experts: usize, rng: &mut Rng) -> Vec<f32> {
    let mut out = Vec::with_capacity(n * 2 * top_k);
    for _ in 0..n {
        let mut chosen: Vec<usize> = Vec::new();
        while chosen.len() < top_k {
            let e = rng.below(experts);
            if !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        for e in chosen {
            out.extend([e as f32, 0.1 + rng.unit().abs()]);
        }
    }
    out
}
