//! Tests of the format kernels: every format's dot products against dequantize-then-f32-dot,
//! the quantizers' round-trip error, matmul against per-row dots, the GGUF block decoders
//! against gguf-py's (vectors from `tools/make_quant_vectors.py`), and the error paths.
//!
//! Must not: depend on files outside `runtime/tests/data`.

use super::*;

/// A small deterministic generator (xorshift64*), so tests need no extra crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.unit() * scale).collect()
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Random stored rows in `format`: encoded from random values where coli can encode the
/// format, else random blocks (every bit pattern of the values) with sane f16 scales.
fn random_rows(format: WeightFormat, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    if format == WeightFormat::FP8_E4M3 {
        // Random codes (every finite one, NaN codes moved to zero) under scales 2^-9 .. 2^-4.
        let mut b = rng.bytes(rows * format.row_bytes(cols).unwrap());
        for block in b.chunks_exact_mut(format.block_bytes()) {
            let scale = 2f32.powi(-9) * (1.0 + 31.0 * rng.unit().abs());
            block[0..4].copy_from_slice(&scale.to_le_bytes());
            block[4..].iter_mut().filter(|c| **c & 0x7f == 0x7f).for_each(|c| *c = 0);
        }
        return b;
    }
    if format == WeightFormat::MXFP4 {
        // Random nibbles under power-of-two scales 2^-10 .. 2^-3.
        let mut b: Vec<u8> = (0..rows * format.row_bytes(cols).unwrap()).map(|_| rng.next() as u8).collect();
        for block in b.chunks_exact_mut(format.block_bytes()) {
            block[0] = 118 + (rng.next() % 8) as u8;
        }
        return b;
    }
    let fields = format.f16_fields();
    if fields.is_empty() {
        return quantize(format, &rng.vec(rows * cols, 0.5), cols).unwrap();
    }
    let mut b = rng.bytes(rows * format.row_bytes(cols).unwrap());
    for block in b.chunks_exact_mut(format.block_bytes()) {
        for &a in fields {
            let v = 0.001 + 0.02 * rng.unit().abs();
            format.set_f16_field(block, a, fp16::f32_to_f16(v));
        }
    }
    b
}

fn dequant(format: WeightFormat, row: &[u8], cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; cols];
    dequant_row(format, row, &mut out);
    out
}

fn ref_dot(w: &[f32], x: &[f32]) -> (f32, f32) {
    let dot: f64 = w.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum();
    let mag: f64 = w.iter().zip(x).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
    (dot as f32, mag as f32)
}

const COLS: [usize; 3] = [256, 512, 1536];

#[test]
fn dot_row_matches_dequantized_dot_for_every_format() {
    // Tolerance: f32 rounding of block sums, 1e-5 of the sum of |w x| (plus an absolute 1e-6).
    let mut rng = Rng(0x1234_5678);
    for format in WeightFormat::ALL {
        for cols in COLS {
            let row = random_rows(format, 1, cols, &mut rng);
            let x = rng.vec(cols, 1.0);
            let (want, mag) = ref_dot(&dequant(format, &row, cols), &x);
            let got = dot_row(format, &row, &x);
            assert!((got - want).abs() <= 1e-5 * mag + 1e-6, "{format} cols {cols}: {got} vs {want}");
        }
    }
}

#[test]
fn i8row_dot_handles_columns_that_are_not_a_multiple_of_32() {
    let mut rng = Rng(7);
    for cols in [1usize, 31, 33, 100] {
        let row = quantize(WeightFormat::I8Row, &rng.vec(cols, 1.0), cols).unwrap();
        let x = rng.vec(cols, 1.0);
        let (want, mag) = ref_dot(&dequant(WeightFormat::I8Row, &row, cols), &x);
        let got = dot_row(WeightFormat::I8Row, &row, &x);
        assert!((got - want).abs() <= 1e-5 * mag + 1e-6, "cols {cols}");
        assert!(!WeightFormat::I8Row.uses_q8_acts(cols) || cols % 32 == 0);
    }
}

#[test]
fn q8_dot_is_within_the_activation_quantization_bound() {
    // Quantizing x to d * q per 32-block moves each x by at most d / 2, so the dot moves by at
    // most sum |w_i| d_b / 2; add 1e-5 of sum |w x| for f32 rounding.
    let mut rng = Rng(99);
    for format in WeightFormat::ALL {
        for cols in COLS {
            let row = random_rows(format, 1, cols, &mut rng);
            let x = rng.vec(cols, 2.0);
            let acts = QuantizedActs::new(&x, 1, cols).unwrap();
            let w = dequant(format, &row, cols);
            let (want, mag) = ref_dot(&w, &x);
            let bound: f32 =
                w.chunks(32).zip(acts.row(0)).map(|(ws, b)| ws.iter().map(|v| v.abs()).sum::<f32>() * b.d / 2.0).sum();
            let got = dot_row_q8(format, &row, acts.row(0));
            assert!(
                (got - want).abs() <= bound + 1e-5 * mag + 1e-6,
                "{format} cols {cols}: {got} vs {want} (bound {bound})"
            );
        }
    }
}

#[test]
fn quantized_acts_reconstruct_within_half_a_step() {
    let mut rng = Rng(5);
    let x = rng.vec(3 * 64, 3.0);
    let acts = QuantizedActs::new(&x, 3, 64).unwrap();
    for i in 0..3 {
        for (b, xs) in acts.row(i).iter().zip(x[i * 64..(i + 1) * 64].chunks(32)) {
            let sum: i32 = b.q.iter().map(|&q| q as i32).sum();
            assert!((b.s - b.d * sum as f32).abs() <= 1e-6);
            for (&q, &v) in b.q.iter().zip(xs) {
                assert!((b.d * q as f32 - v).abs() <= b.d * 0.5 + 1e-6);
            }
        }
    }
    let zeros = QuantizedActs::new(&[0.0; 32], 1, 32).unwrap();
    assert_eq!(zeros.row(0)[0].q, [0i8; 32]);
}

#[test]
fn quantize_round_trip_error_is_bounded() {
    // I8Row: |x - x'| <= scale / 2 (scale = max|x| / 127). I4G64/Q4_1: <= step / 2 plus the f16
    // rounding of min and step (relative 2^-11 of each, times up to 15 steps).
    let mut rng = Rng(42);
    let (rows, cols) = (5, 256);
    let x = rng.vec(rows * cols, 0.8);
    let i8 = quantize(WeightFormat::I8Row, &x, cols).unwrap();
    assert_eq!(i8.len(), rows * (4 + cols));
    for (r, xs) in x.chunks(cols).enumerate() {
        let row = &i8[r * (4 + cols)..(r + 1) * (4 + cols)];
        let scale = xs.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
        for (a, b) in dequant(WeightFormat::I8Row, row, cols).iter().zip(xs) {
            assert!((a - b).abs() <= scale * 0.5 + 1e-7);
        }
    }
    for format in [WeightFormat::I4G64, WeightFormat::Q4_1] {
        let g = format.block_size();
        let q = quantize(format, &x, cols).unwrap();
        let rb = format.row_bytes(cols).unwrap();
        for (r, xs) in x.chunks(cols).enumerate() {
            let back = dequant(format, &q[r * rb..(r + 1) * rb], cols);
            for (bg, xg) in back.chunks(g).zip(xs.chunks(g)) {
                let lo = xg.iter().copied().fold(f32::INFINITY, f32::min);
                let hi = xg.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let step = (hi - lo) / 15.0;
                let tol = step * 0.5 + (lo.abs() + 15.0 * step) * 1e-3;
                for (a, b) in bg.iter().zip(xg) {
                    assert!((a - b).abs() <= tol, "{format}: {a} vs {b} (tol {tol})");
                }
            }
        }
    }
    // A constant group stores step 0 and reproduces the constant.
    let flat = quantize(WeightFormat::I4G64, &[0.25; 64], 64).unwrap();
    assert!(dequant(WeightFormat::I4G64, &flat, 64).iter().all(|&v| v == 0.25));
}

#[test]
fn quantize_rejects_what_it_cannot_encode() {
    assert!(matches!(quantize(WeightFormat::I8Row, &[1.0, f32::NAN], 2), Err(FormatError::NonFinite { index: 1, .. })));
    assert!(matches!(quantize(WeightFormat::I4G64, &[1e6; 64], 64), Err(FormatError::NonFinite { .. })));
    assert!(matches!(quantize(WeightFormat::I4G64, &[0.0; 63], 63), Err(FormatError::RaggedRow { .. })));
    assert!(matches!(quantize(WeightFormat::Q4_K, &[0.0; 256], 256), Err(FormatError::NotAQuantizeTarget { .. })));
    assert!(matches!(quantize(WeightFormat::I8Row, &[0.0; 10], 4), Err(FormatError::Length { .. })));
}

#[test]
fn matmul_matches_row_dots_for_every_format() {
    let mut rng = Rng(2024);
    for format in WeightFormat::ALL {
        for &(rows, cols, n) in &[(37usize, 256usize, 1usize), (300, 512, 3), (64, 256, 8), (45, 512, 5)] {
            let bytes = random_rows(format, rows, cols, &mut rng);
            let w = Matrix::new(format, rows, cols, &bytes).unwrap();
            let x = rng.vec(n * cols, 1.0);
            let mut out = vec![f32::NAN; n * rows];
            matmul(&w, &x, n, &mut out);
            let acts = QuantizedActs::new(&x, n, cols).unwrap();
            let mut out_q = vec![f32::NAN; n * rows];
            matmul_q(&w, &acts, &mut out_q);
            for i in 0..n {
                for r in 0..rows {
                    let row = w.row(r);
                    let want = if format.uses_q8_acts(cols) {
                        dot_row_q8(format, row, acts.row(i))
                    } else {
                        dot_row(format, row, &x[i * cols..(i + 1) * cols])
                    };
                    // Same products, different association (SIMD lanes, per-16 scales): allow
                    // 1e-5 of sum |w x|, the scale of f32 rounding in any summation order.
                    let (_, mag) = ref_dot(&dequant(format, row, cols), &x[i * cols..(i + 1) * cols]);
                    let tol = 1e-5 * mag + 1e-6;
                    let got = out[i * rows + r];
                    assert!((got - want).abs() <= tol, "{format} {rows}x{cols} n={n} [{i},{r}]: {got} vs {want}");
                    let want_q = dot_row_q8(format, row, acts.row(i));
                    assert!((out_q[i * rows + r] - want_q).abs() <= tol, "{format} matmul_q");
                }
            }
        }
    }
}

#[test]
fn matmul_checks_its_sizes() {
    let bytes = vec![0u8; 2 * 34];
    let w = Matrix::new(WeightFormat::Q8_0, 2, 32, &bytes).unwrap();
    let mut out = vec![0f32; 2];
    assert!(matches!(try_matmul(&w, &[0.0; 31], 1, &mut out), Err(FormatError::Length { .. })));
    assert!(matches!(try_matmul(&w, &[0.0; 32], 1, &mut out[..1]), Err(FormatError::Length { .. })));
    assert!(try_matmul(&w, &[0.0; 32], 1, &mut out).is_ok());
    assert!(w.get_row(2).is_none());
    assert!(matches!(w.dequant_row(2, &mut [0f32; 32]), Err(FormatError::Length { .. })));
    assert!(w.dequant_row(1, &mut [0f32; 32]).is_ok());
    assert_eq!(w.rows_range(1, 2).rows, 1);
    assert!(matches!(Matrix::new(WeightFormat::Q8_0, 3, 32, &bytes), Err(FormatError::MatrixBytes { .. })));
    assert!(matches!(Matrix::new(WeightFormat::Q4_K, 1, 100, &bytes), Err(FormatError::RaggedRow { .. })));
    let acts = QuantizedActs::new(&[0.0; 64], 1, 64).unwrap();
    assert!(matches!(try_matmul_q(&w, &acts, &mut out), Err(FormatError::Length { .. })));
    assert!(matches!(QuantizedActs::new(&[0.0; 48], 1, 48), Err(FormatError::RaggedRow { .. })));
}

#[test]
fn kernels_reject_rows_of_the_wrong_length() {
    let mut out = vec![0f32; 32];
    assert!(matches!(
        try_dequant_row(WeightFormat::Q4_1, &[0u8; 19], &mut out),
        Err(FormatError::RowBytes { expected: 20, found: 19, .. })
    ));
    assert!(matches!(try_dot_row(WeightFormat::Q6_K, &[0u8; 210], &out), Err(FormatError::RaggedRow { .. })));
    assert!(matches!(try_dot_row(WeightFormat::F16, &[0u8; 3], &[0.0; 2]), Err(FormatError::RowBytes { .. })));
    let caught = std::panic::catch_unwind(|| dot_row(WeightFormat::Q8_0, &[0u8; 33], &[0.0; 32]));
    assert!(caught.is_err(), "the unchecked kernel asserts its invariant");
}

#[test]
fn gguf_type_ids_round_trip_and_unknown_ids_are_errors() {
    for format in WeightFormat::ALL {
        if let Some(id) = format.gguf_type() {
            assert_eq!(WeightFormat::from_gguf_type(id), Ok(format));
        }
    }
    // TQ1_0 (34) and TQ2_0 (35) are GGUF types coli does not compute.
    assert_eq!(WeightFormat::from_gguf_type(34), Err(FormatError::UnknownGgufType(34)));
    assert_eq!(WeightFormat::from_gguf_type(35), Err(FormatError::UnknownGgufType(35)));
    assert_eq!(WeightFormat::from_gguf_type(19), Ok(WeightFormat::IQ1_S));
    assert_eq!(WeightFormat::from_gguf_type(29), Ok(WeightFormat::IQ1_M));
    assert_eq!(WeightFormat::from_gguf_type(18), Ok(WeightFormat::IQ3_XXS));
    assert_eq!(WeightFormat::from_gguf_type(13), Ok(WeightFormat::Q5_K));
    for (format, block, bytes) in [
        (WeightFormat::Q5_0, 32, 22),
        (WeightFormat::Q5_1, 32, 24),
        (WeightFormat::Q2_K, 256, 84),
        (WeightFormat::Q3_K, 256, 110),
        (WeightFormat::Q5_K, 256, 176),
        (WeightFormat::IQ4_NL, 32, 18),
        (WeightFormat::IQ4_XS, 256, 136),
        (WeightFormat::IQ2_XXS, 256, 66),
        (WeightFormat::IQ2_XS, 256, 74),
        (WeightFormat::IQ2_S, 256, 82),
        (WeightFormat::IQ3_XXS, 256, 98),
        (WeightFormat::IQ3_S, 256, 110),
        (WeightFormat::IQ1_S, 256, 50),
        (WeightFormat::IQ1_M, 256, 56),
        (WeightFormat::MXFP4, 32, 17),
    ] {
        assert_eq!((format.block_size(), format.block_bytes()), (block, bytes), "{format}");
        assert!(format.gguf_type().is_some() && format.uses_q8_acts(block), "{format}");
    }
    assert_eq!(WeightFormat::Q4_K.row_bytes(512), Ok(288));
    assert_eq!(WeightFormat::Q6_K.row_bytes(256), Ok(210));
    assert_eq!(WeightFormat::I8Row.row_bytes(10), Ok(14));
    assert_eq!(WeightFormat::I4G64.row_bytes(128), Ok(72));
    let fp8 = WeightFormat::FP8_E4M3;
    assert_eq!((fp8.block_size(), fp8.block_bytes(), fp8.row_bytes(256)), (128, 132, Ok(264)));
    assert_eq!(fp8.row_bytes(192), Err(FormatError::RaggedRow { format: fp8, cols: 192, block: 128 }));
    assert!(fp8.gguf_type().is_none() && !fp8.uses_q8_acts(128));
}

#[derive(serde::Deserialize)]
struct E4m3Vectors {
    /// Every code's value as numpy decodes it; `None` for NaN.
    values: Vec<Option<f64>>,
    /// One `FP8_E4M3` row (hex) and its values.
    cols: usize,
    hex: String,
    row: Vec<f64>,
}

#[test]
fn e4m3_codes_and_fp8_rows_match_numpy() {
    // The table exactly (every E4M3 value is an f32) as the numpy decoder of tools/make_fp8.py
    // computes it from the bit fields in float64; a row's values within the f32 rounding of
    // `scale * value` (2^-24 relative; numpy kept the product in float64).
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/fp8_vectors.json");
    let v: E4m3Vectors = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(v.values.len(), 256);
    for (code, want) in v.values.iter().enumerate() {
        let got = fp8::E4M3[code];
        match want {
            None => assert!(got.is_nan(), "code {code:#04x}: {got}, numpy NaN"),
            Some(w) => assert_eq!(got as f64, *w, "code {code:#04x}"),
        }
    }
    let bytes: Vec<u8> =
        (0..v.hex.len()).step_by(2).map(|i| u8::from_str_radix(&v.hex[i..i + 2], 16).unwrap()).collect();
    let got = dequant(WeightFormat::FP8_E4M3, &bytes, v.cols);
    for (i, (a, b)) in got.iter().zip(&v.row).enumerate() {
        assert!((*a as f64 - b).abs() <= 1e-7 * b.abs(), "[{i}]: {a} vs numpy {b}");
    }
}

#[derive(serde::Deserialize)]
struct Vectors {
    rows: Vec<VectorRow>,
}

#[derive(serde::Deserialize)]
struct VectorRow {
    format: String,
    cols: usize,
    hex: String,
    values: Vec<f32>,
}

#[test]
fn block_decoders_match_gguf_py() {
    // Exact: both sides compute d * scale * q (- dmin * m) in f32 from the same f16 values;
    // allow 1 ulp-ish (1e-6 relative) for a different association of the products.
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/quant_vectors.json");
    let v: Vectors = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut seen = Vec::new();
    for r in &v.rows {
        let format = WeightFormat::ALL.into_iter().find(|f| f.name() == r.format).unwrap();
        let bytes: Vec<u8> =
            (0..r.hex.len()).step_by(2).map(|i| u8::from_str_radix(&r.hex[i..i + 2], 16).unwrap()).collect();
        let got = dequant(format, &bytes, r.cols);
        // The grid formats compute `db * g` as the reference does: bit for bit.
        let exact = ["IQ1", "IQ2", "IQ3"].iter().any(|p| format.name().starts_with(p));
        for (i, (a, b)) in got.iter().zip(&r.values).enumerate() {
            let tol = if exact { 0.0 } else { 1e-6 * b.abs().max(1e-3) };
            assert!((a - b).abs() <= tol, "{format}[{i}]: {a} vs gguf-py {b}");
        }
        seen.push(format);
    }
    for f in WeightFormat::ALL.into_iter().filter(|f| f.gguf_type().is_some() && f.block_size() > 1) {
        assert!(seen.contains(&f), "no vector for {f}");
    }
}

#[test]
fn quantized_acts_match_the_portable_block_quantizer_bit_for_bit() {
    // Large enough to be quantized in parallel, on the SIMD path where the CPU has one.
    let (n, cols) = (40, 1536);
    let mut rng = Rng(77);
    let mut x = rng.vec(n * cols, 3.0);
    x[..32].iter_mut().for_each(|v| *v = 0.0);
    // Exact ties: amax 127 gives d = 1, so k + 0.5 must round to even.
    for (i, v) in x[32..64].iter_mut().enumerate() {
        *v = if i == 0 { 127.0 } else { i as f32 - 15.5 };
    }
    let acts = QuantizedActs::new(&x, n, cols).unwrap();
    for i in 0..n {
        for (b, got) in acts.row(i).iter().enumerate() {
            let at = i * cols + 32 * b;
            let want = q8::quantize_block(x[at..at + 32].try_into().unwrap());
            assert_eq!(*got, want, "row {i} block {b}");
        }
    }
    // Element 33 is -14.5: it rounds to the even -14, not away from zero to -15.
    assert_eq!(acts.row(0)[1].q[1], -14, "ties to even");
}

#[test]
fn float_matmul_handles_ragged_columns_and_tiles() {
    let mut rng = Rng(31);
    for format in [WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16] {
        for &(rows, cols, n) in &[(7usize, 13usize, 6usize), (9, 77, 1), (11, 3, 9), (64, 200, 5)] {
            let bytes = random_rows(format, rows, cols, &mut rng);
            let w = Matrix::new(format, rows, cols, &bytes).unwrap();
            let x = rng.vec(n * cols, 1.0);
            let mut out = vec![f32::NAN; n * rows];
            matmul(&w, &x, n, &mut out);
            for i in 0..n {
                for r in 0..rows {
                    let (want, mag) = ref_dot(&dequant(format, w.row(r), cols), &x[i * cols..(i + 1) * cols]);
                    let got = out[i * rows + r];
                    assert!(
                        (got - want).abs() <= 1e-5 * mag + 1e-6,
                        "{format} {rows}x{cols} n={n} [{i},{r}]: {got} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn q8_matmul_handles_odd_unit_counts_and_ragged_tiles() {
    // 9 units per row (the prefill kernel pairs units; the last one is alone), 1 to 11
    // activation rows (groups of four and one to three left over, which go together; or one to
    // three alone, as a decode step) and 11 weight rows (tiles of 4, 2 and 1). Every row gets the
    // same bits as alone, whatever rows share its call: a batched decode step or a prompt's rows
    // beside other sequences' give each sequence what it gets by itself.
    let mut rng = Rng(99);
    for (format, n) in WeightFormat::ALL
        .into_iter()
        .filter(|f| f.uses_q8_acts(288) && 288 % f.block_size() == 0)
        .flat_map(|f| (1..=11).map(move |n| (f, n)))
    {
        let (rows, cols) = (11, 288);
        let bytes = random_rows(format, rows, cols, &mut rng);
        let w = Matrix::new(format, rows, cols, &bytes).unwrap();
        let x = rng.vec(n * cols, 1.0);
        let acts = QuantizedActs::new(&x, n, cols).unwrap();
        let mut out = vec![f32::NAN; n * rows];
        matmul_q(&w, &acts, &mut out);
        for i in 0..n {
            for r in 0..rows {
                let want = dot_row_q8(format, w.row(r), acts.row(i));
                let (_, mag) = ref_dot(&dequant(format, w.row(r), cols), &x[i * cols..(i + 1) * cols]);
                let got = out[i * rows + r];
                assert!((got - want).abs() <= 1e-5 * mag + 1e-6, "{format} [{i},{r}]: {got} vs {want}");
            }
        }
        for i in 0..n {
            let mut one = vec![f32::NAN; rows];
            let alone = QuantizedActs::new(&x[i * cols..(i + 1) * cols], 1, cols).unwrap();
            matmul_q(&w, &alone, &mut one);
            assert_eq!(&out[i * rows..(i + 1) * rows], &one[..], "{format} n={n}: row {i} against alone");
        }
    }
}

/// On a CPU with AMX (`kernel_level() == "amx"`), calls of `TILE_ROWS` activation rows or
/// more take the tile kernels and smaller ones AVX-512 kernels in the same arithmetic: each
/// element is `amx::dot_row`'s bit for bit (tail tiles of weight and activation rows, an odd
/// unit count, 1 to 40 rows), within the dequantized product's bound, and a row gets the same
/// bits in any call (here: beside 15 other rows, and alone). Elsewhere it says that it skipped.
#[cfg(target_arch = "x86_64")]
#[test]
fn amx_tiles_give_their_reference_bits_whatever_rows_share_the_call() {
    if kernel_level() != "amx" {
        eprintln!("SKIPPED: kernel level {} has no AMX tiles", kernel_level());
        return;
    }
    let mut rng = Rng(0xa3c5);
    let rows = 37;
    let mut checked = 0;
    for format in WeightFormat::ALL {
        // Nine units a row (an odd count) where the format's blocks allow it.
        let Some(cols) = [288, 768].into_iter().find(|&c| c % format.block_size() == 0 && format.uses_q8_acts(c))
        else {
            continue;
        };
        let bytes = random_rows(format, rows, cols, &mut rng);
        let w = Matrix::new(format, rows, cols, &bytes).unwrap();
        let x = rng.vec(40 * cols, 1.0);
        // SAFETY: AVX2 and F16C are there (the AMX level implies them).
        if unsafe { super::amx::dot_row(format, w.row(0), QuantizedActs::new(&x[..cols], 1, cols).unwrap().row(0)) }
            .is_none()
        {
            continue;
        }
        for n in [1, 2, 3, 5, 15, 16, 17, 31, 40] {
            let acts = QuantizedActs::new(&x[..n * cols], n, cols).unwrap();
            let mut out = vec![f32::NAN; n * rows];
            matmul_q(&w, &acts, &mut out);
            for i in 0..n {
                for r in 0..rows {
                    // SAFETY: as above.
                    let want = unsafe { super::amx::dot_row(format, w.row(r), acts.row(i)) }.unwrap();
                    let got = out[i * rows + r];
                    assert_eq!(got.to_bits(), want.to_bits(), "{format} n={n} [{i},{r}]: {got} vs {want}");
                    let (_, mag) = ref_dot(&dequant(format, w.row(r), cols), &x[i * cols..(i + 1) * cols]);
                    let near = dot_row_q8(format, w.row(r), acts.row(i));
                    assert!((got - near).abs() <= 1e-5 * mag + 1e-6, "{format} [{i},{r}]: {got} vs {near}");
                }
            }
            // The last row again beside the first 15 rows (a tile call) and alone (the vectors').
            let last = n - 1;
            for beside in [15, 0] {
                let mut xs = x[..beside * cols].to_vec();
                xs.extend_from_slice(&x[last * cols..(last + 1) * cols]);
                let some = QuantizedActs::new(&xs, beside + 1, cols).unwrap();
                let mut other = vec![f32::NAN; (beside + 1) * rows];
                matmul_q(&w, &some, &mut other);
                assert_eq!(&other[beside * rows..], &out[last * rows..], "{format} n={n}: row {last} beside {beside}");
            }
        }
        // A height whose output rows share cache sets (`amx::aliased`: each tile stored turned),
        // in tasks whose rows start and end inside tiles.
        let tall = 256;
        let bytes = random_rows(format, tall, cols, &mut rng);
        let w = Matrix::new(format, tall, cols, &bytes).unwrap();
        for n in [16, 17, 40] {
            let acts = QuantizedActs::new(&x[..n * cols], n, cols).unwrap();
            let mut out = vec![f32::NAN; n * tall];
            // Last task first: a task writing past its rows would spoil the ones done.
            for (r0, r1) in [(43, tall), (20, 43), (0, 20)] {
                super::matmul::matmul_q_rows(&w, &acts, r0, r1, &mut out);
            }
            for i in 0..n {
                for r in 0..tall {
                    // SAFETY: as above.
                    let want = unsafe { super::amx::dot_row(format, w.row(r), acts.row(i)) }.unwrap();
                    assert_eq!(out[i * tall + r].to_bits(), want.to_bits(), "{format} {tall} rows, n={n} [{i},{r}]");
                }
            }
        }
        checked += 1;
    }
    assert_eq!(checked, 5, "Q8_0, I8Row, Q4_0, Q4_1 and Q4_K take the tiles");
}

#[test]
fn matmul_multi_matches_one_matmul_per_matrix() {
    // q/k/v-like shapes in mixed formats share one input; each result must equal `matmul`'s.
    let mut rng = Rng(8);
    let (cols, n) = (256, 5);
    let x = rng.vec(n * cols, 1.0);
    let formats = [WeightFormat::Q4_1, WeightFormat::BF16, WeightFormat::Q8_0, WeightFormat::F32];
    let rows = [96usize, 40, 33, 8];
    let bytes: Vec<Vec<u8>> = formats.iter().zip(rows).map(|(&f, r)| random_rows(f, r, cols, &mut rng)).collect();
    let ws: Vec<Matrix> =
        formats.iter().zip(rows).zip(&bytes).map(|((&f, r), b)| Matrix::new(f, r, cols, b).unwrap()).collect();
    let mut outs: Vec<Vec<f32>> = rows.iter().map(|&r| vec![f32::NAN; n * r]).collect();
    let mut acts = QuantizedActs::default();
    let mut mats: Vec<(Matrix, &mut [f32])> =
        ws.iter().zip(outs.iter_mut()).map(|(w, o)| (*w, o.as_mut_slice())).collect();
    matmul_multi(&mut mats, &x, n, &mut acts);
    for (w, got) in ws.iter().zip(&outs) {
        let mut want = vec![0f32; n * w.rows];
        matmul(w, &x, n, &mut want);
        assert_eq!(got, &want, "{}", w.format);
    }
    let mut short = vec![0f32; 3];
    assert!(matches!(
        try_matmul_multi(&mut [(ws[3], short.as_mut_slice())], &x, n, &mut acts),
        Err(FormatError::Length { .. })
    ));
}

#[test]
fn matmul_q_each_matches_one_matmul_q_per_matrix() {
    // Routed experts of a decode step: each matrix its own input and row count, mixed formats
    // (a float one dequantizes its input); each result must equal `matmul_q`'s alone.
    let mut rng = Rng(9);
    let cols = 256;
    let formats = [WeightFormat::Q8_0, WeightFormat::Q4_0, WeightFormat::F32, WeightFormat::Q8_0];
    let rows = [96usize, 40, 33, 8];
    let ns = [1usize, 3, 2, 7];
    let bytes: Vec<Vec<u8>> = formats.iter().zip(rows).map(|(&f, r)| random_rows(f, r, cols, &mut rng)).collect();
    let ws: Vec<Matrix> =
        formats.iter().zip(rows).zip(&bytes).map(|((&f, r), b)| Matrix::new(f, r, cols, b).unwrap()).collect();
    let acts: Vec<QuantizedActs> =
        ns.iter().map(|&n| QuantizedActs::new(&rng.vec(n * cols, 1.0), n, cols).unwrap()).collect();
    let mut outs: Vec<Vec<f32>> = rows.iter().zip(ns).map(|(&r, n)| vec![f32::NAN; n * r]).collect();
    let mut mats: Vec<(Matrix, &QuantizedActs, &mut [f32])> =
        ws.iter().zip(&acts).zip(outs.iter_mut()).map(|((w, a), o)| (*w, a, o.as_mut_slice())).collect();
    try_matmul_q_each(&mut mats).unwrap();
    for ((w, a), got) in ws.iter().zip(&acts).zip(&outs) {
        let mut want = vec![0f32; a.n() * w.rows];
        matmul_q(w, a, &mut want);
        assert_eq!(got, &want, "{}", w.format);
    }
    let mut short = vec![0f32; 3];
    assert!(matches!(
        try_matmul_q_each(&mut [(ws[0], &acts[0], short.as_mut_slice())]),
        Err(FormatError::Length { .. })
    ));
}

#[test]
fn first_non_finite_finds_nan_and_inf_in_elements_and_block_fields() {
    use super::{first_non_finite, NonFinite};
    let cols = 256;
    for format in WeightFormat::ALL {
        let mut b = random_rows(format, 4, cols, &mut Rng(7));
        assert_eq!(first_non_finite(format, &b, cols), None, "{format}");
        if format == WeightFormat::FP8_E4M3 {
            // A NaN code in row 2 (element 130 of the row: block 1's third), then an infinite
            // scale in row 3's first block: the code is reported, then the scale.
            let row = format.row_bytes(cols).unwrap();
            b[2 * row + 132 + 4 + 2] = 0xff;
            b[3 * row..3 * row + 4].copy_from_slice(&f32::INFINITY.to_le_bytes());
            let found = first_non_finite(format, &b, cols).unwrap();
            assert_eq!((found.row, found.col, found.field), (2, 130, "the e4m3 value"), "{found}");
            assert!(found.value.is_nan());
            b[2 * row + 132 + 4 + 2] = 0x7f;
            assert_eq!(first_non_finite(format, &b, cols).map(|f| (f.row, f.col)), Some((2, 130)));
            b[2 * row + 132 + 4 + 2] = 0x7e; // 448, finite
            let found = first_non_finite(format, &b, cols).unwrap();
            assert_eq!((found.row, found.col, found.value), (3, 0, f32::INFINITY), "{found}");
            assert_eq!(found.field, "the f32 scale of the block");
            continue;
        }
        if format == WeightFormat::MXFP4 {
            // No bit pattern of an E8M0 scale or an E2M1 value is non-finite.
            b.fill(0xff);
            assert_eq!(first_non_finite(format, &b, cols), None);
            continue;
        }
        // Row 2's first float field (an element, or its first block's scale) becomes +inf, and
        // a later one NaN: the first is reported.
        let row = format.row_bytes(cols).unwrap();
        let (at, width) = match format {
            WeightFormat::F32 | WeightFormat::I8Row => (0, 4),
            f => (f.f16_fields().first().copied().unwrap_or(0), 2),
        };
        let inf: &[u8] = match (format, width) {
            (WeightFormat::BF16, _) => &[0x80, 0x7f],
            (_, 4) => &[0, 0, 0x80, 0x7f],
            _ => &[0, 0x7c],
        };
        // Two-byte fields through `set_f16_field` (IQ1_M's d is four nibbles).
        let put = |b: &mut [u8], r: usize, v: &[u8]| match width {
            2 => format.set_f16_field(&mut b[r * row..], at, u16::from_le_bytes([v[0], v[1]])),
            _ => b[r * row + at..r * row + at + width].copy_from_slice(v),
        };
        put(&mut b, 2, inf);
        let nan: Vec<u8> = inf.iter().enumerate().map(|(i, &v)| if i == 0 { v | 1 } else { v }).collect();
        put(&mut b, 3, &nan);
        let found = first_non_finite(format, &b, cols).unwrap_or_else(|| panic!("{format}: not found"));
        assert_eq!((found.row, found.col, found.value), (2, 0, f32::INFINITY), "{format}: {found}");
        put(&mut b, 2, &[0; 4][..width]);
        let found: NonFinite = first_non_finite(format, &b, cols).unwrap();
        assert_eq!((found.row, found.col), (3, 0), "{format}: {found}");
        assert!(found.value.is_nan(), "{format}: {found}");
        assert!(found.to_string().contains("row 3, column 0 is NaN"), "{found}");
    }
}

#[test]
fn first_non_finite_spans_parallel_pieces_and_reports_the_first() {
    use super::first_non_finite;
    // 3 MiB of f32 over several 1 MiB pieces: the first bad element is in the second piece.
    let cols = 1024;
    let mut b = vec![0u8; 3 << 20];
    let at = |e: usize| e * 4 + 3;
    for e in [300_000usize, 700_000] {
        b[at(e) - 1] = 0x80;
        b[at(e)] = 0x7f;
    }
    let found = first_non_finite(WeightFormat::F32, &b, cols).unwrap();
    assert_eq!((found.row, found.col), (300_000 / cols, 300_000 % cols), "{found}");
    assert_eq!(found.field, "the value");
}

#[test]
fn block_formats_multiply_odd_block_counts_and_row_counts() {
    // Three super-blocks (or 24 blocks of 32) a row, 13 rows (tiles of 4 and a ragged one), one
    // to three and five activation rows: `matmul` equals the per-row q8 dot within f32 reassociation
    // (1e-5 of sum |w x|), and that dot equals the dequantized product within the activation
    // quantization bound (as in `q8_dot_is_within_the_activation_quantization_bound`).
    let mut rng = Rng(0xfeed);
    let (rows, cols) = (13, 768);
    for format in WeightFormat::ALL.into_iter().filter(|f| !f.f16_fields().is_empty()) {
        let bytes = random_rows(format, rows, cols, &mut rng);
        let w = Matrix::new(format, rows, cols, &bytes).unwrap();
        for n in [1usize, 2, 3, 5] {
            let x = rng.vec(n * cols, 1.0);
            let acts = QuantizedActs::new(&x, n, cols).unwrap();
            let mut out = vec![f32::NAN; n * rows];
            matmul(&w, &x, n, &mut out);
            if n <= 3 {
                // A few rows (a checked draft) give each row exactly what it gets alone.
                for i in 0..n {
                    let mut one = vec![f32::NAN; rows];
                    matmul(&w, &x[i * cols..(i + 1) * cols], 1, &mut one);
                    assert_eq!(&out[i * rows..(i + 1) * rows], &one[..], "{format} n={n} row {i}");
                }
            }
            for i in 0..n {
                let xi = &x[i * cols..(i + 1) * cols];
                for r in 0..rows {
                    let wf = dequant(format, w.row(r), cols);
                    let (exact, mag) = ref_dot(&wf, xi);
                    let q8 = dot_row_q8(format, w.row(r), acts.row(i));
                    let got = out[i * rows + r];
                    assert!((got - q8).abs() <= 1e-5 * mag + 1e-6, "{format} n={n} [{i},{r}]: {got} vs {q8}");
                    let bound: f32 = wf
                        .chunks(32)
                        .zip(acts.row(i))
                        .map(|(ws, b)| ws.iter().map(|v| v.abs()).sum::<f32>() * b.d / 2.0)
                        .sum();
                    assert!((q8 - exact).abs() <= bound + 1e-5 * mag + 1e-6, "{format} [{i},{r}]: {q8} vs {exact}");
                    let f = dot_row(format, w.row(r), xi);
                    assert!((f - exact).abs() <= 1e-5 * mag + 1e-6, "{format} [{i},{r}] f32: {f} vs {exact}");
                }
            }
        }
    }
}

#[test]
fn fp8_matmul_decodes_every_code_as_the_table_does() {
    // One row of every finite code (NaN codes as zero) under scales 1 and 0.5, against one-hot
    // activation rows: each output is one code's value times its scale, exactly, on whichever
    // kernel `matmul` picks (the SIMD decode where the CPU has one), for 256 rows and for 1.
    let format = WeightFormat::FP8_E4M3;
    let mut row = Vec::new();
    for (b, scale) in [1f32, 0.5].into_iter().enumerate() {
        row.extend_from_slice(&scale.to_le_bytes());
        let sign = 0x80 * b as u8;
        row.extend((0..128u8).map(|i| if i == 0x7f { 0 } else { i | sign }));
    }
    let w = Matrix::new(format, 1, 256, &row).unwrap();
    let want = dequant(format, &row, 256);
    let x: Vec<f32> = (0..256 * 256).map(|i| if i / 256 == i % 256 { 1.0 } else { 0.0 }).collect();
    let mut out = vec![f32::NAN; 256];
    matmul(&w, &x, 256, &mut out);
    assert_eq!(out, want);
    let mut one = [f32::NAN];
    matmul(&w, &x[200 * 256..201 * 256], 1, &mut one);
    assert_eq!(one[0], want[200]);
    // A NaN code reaches the output as NaN.
    let mut nan_row = row.clone();
    nan_row[4 + 3] = 0xff;
    let w = Matrix::new(format, 1, 256, &nan_row).unwrap();
    matmul(&w, &x[..256], 1, &mut one);
    assert!(one[0].is_nan());
}

/// The kernel tests at every lower CPU level this machine has (`COLI_CPU_LEVEL`, read once a
/// process, so each level runs this test binary again on the format tests): a machine with
/// AVX-512 VNNI would otherwise never run the AVX2 and portable kernels' tile paths.
#[test]
fn format_kernels_at_every_lower_cpu_level() {
    if std::env::var_os("COLI_CPU_LEVEL").is_some() {
        return;
    }
    let exe = std::env::current_exe().expect("the test binary");
    let below: &[&str] =
        if kernel_level() == "amx" { &["avx512vnni", "avx2", "portable"] } else { &["avx2", "portable"] };
    for &level in below {
        let out = std::process::Command::new(&exe)
            .args(["format::tests::", "--test-threads", "2", "--skip", "format_kernels_at_every_lower_cpu_level"])
            .env("COLI_CPU_LEVEL", level)
            .output()
            .expect("the test binary runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "COLI_CPU_LEVEL={level}:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("test result: ok") && !text.contains("ok. 0 passed"), "COLI_CPU_LEVEL={level}: {text}");
    }
}
