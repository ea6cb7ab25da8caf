//! The grid formats (`IQ2_XXS`, `IQ2_XS`, `IQ2_S`, `IQ3_XXS`, `IQ3_S`, `IQ1_S`, `IQ1_M`,
//! `shaders/iq_grid.glsl`) on whatever device the machine has (Lavapipe in CI) against the CPU (`format/iq_grid.rs`, the
//! reference): GEMV and tiled GEMM at odd shapes (odd row counts, 1, 3 and 33 super-blocks a
//! row, activation rows 1 to 33), both precisions, and the decode itself.
//!
//! Tolerances, of each output's sum of |w x|: 1e-5 (the integer sums are exact on both sides,
//! the f32 steps in another order; measured on Lavapipe: at most 2.4e-7, printed), but 5e-5
//! for the tiled GEMM with 8-bit activations, where among 33 rows of 8448 activations one can
//! quantize one step away from the CPU's (a last-bit difference before the rounding; measured:
//! 1.1e-5 for IQ2_XXS, 5.4e-6 for IQ2_S, every other case at most 7.4e-8). The decode
//! (`dequant`, read through the embedding gather): bit for bit.
//!
//! Must not: compare a device path with itself.

mod vk_common;

use coli_runtime::cpu::linear::linear;
use coli_runtime::cpu::Precision;
use coli_runtime::format::{dequant_row, Matrix, WeightFormat};
use coli_runtime::vk::MatmulPath;
use vk_common::{assert_close_terms, ctx, random_rows, term_magnitudes, Rng};

const GRIDS: [WeightFormat; 7] = [
    WeightFormat::IQ2_XXS,
    WeightFormat::IQ2_XS,
    WeightFormat::IQ2_S,
    WeightFormat::IQ3_XXS,
    WeightFormat::IQ3_S,
    WeightFormat::IQ1_S,
    WeightFormat::IQ1_M,
];

/// (rows, cols): odd row counts; one super-block a row, three, and 33 (many units per lane).
const SHAPES: &[(usize, usize)] = &[(37, 256), (13, 768), (5, 8448)];

#[test]
fn grid_products_match_cpu_at_odd_shapes() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_6121);
    let cases = [
        (1, MatmulPath::Gemv, Precision::Fast),
        (3, MatmulPath::Gemv, Precision::Fast),
        (7, MatmulPath::Gemm, Precision::Fast),
        (33, MatmulPath::Gemm, Precision::Fast),
        (1, MatmulPath::Gemv, Precision::Exact),
        (5, MatmulPath::Gemm, Precision::Exact),
    ];
    for format in GRIDS {
        // Per (path, precision): the largest |device - cpu| / sum |w x| and |device - cpu|.
        let mut worst = vec![(0f32, 0f32); cases.len()];
        for &(rows, cols) in SHAPES {
            let bytes = random_rows(format, rows, cols, &mut rng);
            let m = Matrix::new(format, rows, cols, &bytes).unwrap();
            let w = ctx.upload_matrix(format, rows, cols, &bytes).unwrap();
            for (c, &(n, path, precision)) in cases.iter().enumerate() {
                let x = rng.vec(n * cols, 1.0);
                let mut want = vec![0f32; n * rows];
                linear(&m, &x, n, &mut want, precision);
                let xb = ctx.upload_f32(&x).unwrap();
                let ob = ctx.f32_buffer(n * rows).unwrap();
                let mut f = ctx.frame().unwrap();
                f.matmul_with(&w, xb.all(), n, ob.all(), path, precision).unwrap();
                f.run().unwrap();
                let got = ctx.download_f32(ob.all()).unwrap();
                let mag = term_magnitudes(format, &bytes, rows, cols, &x, n);
                let what = format!("{format} {rows}x{cols} n={n} {path:?} {precision:?}");
                let tol = if path == MatmulPath::Gemm && precision == Precision::Fast { 5e-5 } else { 1e-5 };
                assert_close_terms(&what, &got, &want, &mag, tol);
                for ((g, w), m) in got.iter().zip(&want).zip(&mag) {
                    let d = (g - w).abs();
                    worst[c] = (worst[c].0.max(d / m.max(1e-30)), worst[c].1.max(d));
                }
            }
        }
        for (&(_, path, precision), (rel, abs)) in cases.iter().zip(&worst) {
            eprintln!("{format} {path:?} {precision:?}: max |device - cpu| = {abs:.2e}, {rel:.2e} of sum |w x|");
        }
    }
}

/// The decode: the embedding gather reads every element through `dequant`, which must give the
/// CPU's `dequant_row` bit for bit (the same f32 operations in the same order).
#[test]
fn grid_decode_is_the_cpus_bit_for_bit() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_6122);
    for format in GRIDS {
        let (vocab, cols) = (9, 768);
        let bytes = random_rows(format, vocab, cols, &mut rng);
        let m = Matrix::new(format, vocab, cols, &bytes).unwrap();
        let table = ctx.upload_matrix(format, vocab, cols, &bytes).unwrap();
        let tokens: Vec<u32> = (0..vocab as u32).rev().collect();
        let mut want = vec![0f32; vocab * cols];
        for (i, &t) in tokens.iter().enumerate() {
            dequant_row(format, m.row(t as usize), &mut want[i * cols..(i + 1) * cols]);
        }
        let tb = ctx.upload_tokens(&tokens, vocab).unwrap();
        let out = ctx.f32_buffer(want.len()).unwrap();
        let mut f = ctx.frame().unwrap();
        f.embed(&table, tb.all(), tokens.len(), 1.0, out.all()).unwrap();
        f.run().unwrap();
        let got = ctx.download_f32(out.all()).unwrap();
        let differ = got.iter().zip(&want).position(|(g, w)| g.to_bits() != w.to_bits());
        assert!(differ.is_none(), "{format}: element {differ:?} differs: {:?}", differ.map(|i| (got[i], want[i])));
    }
}
