//! `VkOptions::pipeline_stats`: a context with the option runs kernels as one without it does
//! (a Q8_0 product on the GEMV and on the tiled GEMM against `cpu::linear`, the tolerance of
//! vk_ops: 5e-5 of each output's sum of |w x|), and where the device has
//! `VK_KHR_pipeline_executable_properties` every pipeline it made has a statistics line with at
//! least one `NAME=VALUE`. Without the option the capability is cleared and no line is kept.
//! Lavapipe (Mesa 22.3) has no such extension: there the test checks the results and that no
//! line was kept; on a GPU the lines are checked too (and printed with `--nocapture`).
//!
//! Must not: compare a device path with itself (the reference is the CPU's).

mod vk_common;

use coli_runtime::cpu::linear::linear;
use coli_runtime::cpu::Precision;
use coli_runtime::format::{Matrix, WeightFormat};
use coli_runtime::vk::{MatmulPath, VkOptions};
use vk_common::{assert_close_terms, open, random_rows, term_magnitudes, Rng};

#[test]
fn pipeline_statistics_leave_results_alone_and_name_every_pipeline() {
    let Some(off) = open(&VkOptions::default()) else { return };
    assert!(!off.caps().pipeline_executable_info, "without the option the capability is cleared");
    drop(off);
    let Some(ctx) = open(&VkOptions { pipeline_stats: true, ..Default::default() }) else { return };
    let mut rng = Rng(0x5eed_5747);
    let (format, rows, cols) = (WeightFormat::Q8_0, 70, 160);
    let bytes = random_rows(format, rows, cols, &mut rng);
    let m = Matrix::new(format, rows, cols, &bytes).unwrap();
    let w = ctx.upload_matrix(format, rows, cols, &bytes).unwrap();
    for (n, path) in [(1, MatmulPath::Gemv), (37, MatmulPath::Gemm)] {
        let x = rng.vec(n * cols, 1.0);
        let mut want = vec![0f32; n * rows];
        linear(&m, &x, n, &mut want, Precision::Fast);
        let xb = ctx.upload_f32(&x).unwrap();
        let ob = ctx.f32_buffer(n * rows).unwrap();
        let mut f = ctx.frame().unwrap();
        f.matmul_with(&w, xb.all(), n, ob.all(), path, Precision::Fast).unwrap();
        f.run().unwrap();
        let got = ctx.download_f32(ob.all()).unwrap();
        let mag = term_magnitudes(format, &bytes, rows, cols, &x, n);
        assert_close_terms(&format!("{format} {rows}x{cols} n={n} {path:?}"), &got, &want, &mag, 5e-5);
    }
    let lines = ctx.pipeline_stats();
    if ctx.caps().pipeline_executable_info {
        // The GEMV and the GEMM at least (and the activations' quantization).
        assert!(lines.len() >= 2, "{lines:?}");
        for l in &lines {
            let (head, stats) = l.split_once(": ").unwrap_or((l, ""));
            assert!(head.starts_with("pipeline ") && stats.contains('='), "no statistic in {l:?}");
        }
    } else {
        assert!(lines.is_empty(), "{lines:?}");
        eprintln!("vk_stats: {} has no VK_KHR_pipeline_executable_properties: results checked only", ctx.caps().name);
    }
}
