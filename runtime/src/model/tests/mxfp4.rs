//! MXFP4 checkpoints built here: `X_blocks` with `X_scales` (U8, the published gpt-oss layout)
//! handed out as the tensor `X` in `MXFP4` rows of shape `[.., rows, 32 G]`, whose every element
//! is its code's E2M1 value times its own block's scale (codes and scales chosen so that a
//! swapped nibble, a wrong block or a wrong expert reads another value); the compiler's
//! bindings at the repacked size; and each way the pairing can fail, a typed error naming the
//! weight, while the checkpoint still opens.
//!
//! Must not: depend on real checkpoints.

use super::*;
use crate::model::mxfp4::Mxfp4Problem;

/// E2M1 values of the 16 codes.
const E2M1: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// The code of element `k` of row `r` (all rows of all experts numbered together).
fn code(r: usize, k: usize) -> u8 {
    ((k * 5 + r * 3) % 16) as u8
}

/// Published blocks of `rows` rows of `cols` elements: byte j holds elements 2j (low) and 2j+1.
fn blocks(rows: usize, cols: usize) -> Vec<u8> {
    (0..rows).flat_map(|r| (0..cols / 2).map(move |j| code(r, 2 * j) | (code(r, 2 * j + 1) << 4))).collect()
}

/// Scale bytes (E8M0, bias 127) between 2^-4 and 2^3, a different one per block.
fn scales(n: usize) -> Vec<u8> {
    (0..n).map(|i| 123 + (i * 7 % 8) as u8).collect()
}

#[test]
fn mxfp4_pairs_become_mxfp4_rows_with_their_blocks_scales() {
    // Stacked [3 experts, 4 rows, 64 cols]: 2 blocks a row.
    let (e, rows, cols) = (3, 4, 64);
    let d = st_dir(&[
        ("m.experts.w_blocks", "U8", vec![e, rows, cols / 32, 16], blocks(e * rows, cols)),
        ("m.experts.w_scales", "U8", vec![e, rows, cols / 32], scales(e * rows * cols / 32)),
        ("m.experts.w_bias", "BF16", vec![e, rows], bf16_bytes(&vec![0.0; e * rows])),
    ]);
    let ck = open(d.path()).unwrap();
    assert!(ck.has("m.experts.w"));
    let t = ck.tensor("m.experts.w").unwrap();
    assert_eq!(
        (t.format, t.shape.clone(), t.bytes().len()),
        (WeightFormat::MXFP4, vec![e, rows, cols], e * rows * 2 * 17)
    );
    let s = scales(e * rows * cols / 32);
    let v = t.to_f32_vec().unwrap();
    for (i, &x) in v.iter().enumerate() {
        let (r, k) = (i / cols, i % cols);
        let scale = (s[r * 2 + k / 32] as f32 - 127.0).exp2();
        assert_eq!(x, E2M1[code(r, k) as usize] * scale, "row {r} element {k}");
    }
    assert_eq!(t.expert(2).row(3), ck.tensor("m.experts.w").unwrap().expert(2).row(3), "the same bytes every time");
    let info = &ck.bindings().tensors.unwrap()["m.experts.w"];
    assert_eq!(
        (info.dtype.as_str(), info.shape.clone(), info.bytes),
        ("MXFP4", vec![e, rows, cols], (e * rows * 2 * 17) as u64)
    );
}

#[test]
fn mxfp4_weights_without_usable_scales_are_errors_naming_them() {
    let d = st_dir(&[
        ("none_blocks", "U8", vec![1, 2, 1, 16], blocks(2, 32)),
        ("shape_blocks", "U8", vec![1, 2, 2, 16], blocks(2, 64)),
        ("shape_scales", "U8", vec![1, 2, 1], scales(2)),
        ("type_blocks", "U8", vec![1, 2, 1, 16], blocks(2, 32)),
        ("type_scales", "F32", vec![1, 2, 1], f32_bytes(&[1.0, 1.0])),
        ("wide_blocks", "U8", vec![1, 2, 1, 8], vec![0; 16]),
        ("wide_scales", "U8", vec![1, 2, 1], scales(2)),
        ("flat_blocks", "U8", vec![2, 16], blocks(2, 32)),
        ("bytes_blocks", "F32", vec![1, 2, 1, 16], f32_bytes(&[0.0; 32])),
    ]);
    let ck = open(d.path()).expect("a checkpoint with unreadable MXFP4 tensors still opens");
    let problem = |name: &str| match ck.tensor(name) {
        Err(LoadError::Mxfp4 { name: n, problem, path }) => {
            assert!(n == name && path.ends_with("model.safetensors"));
            let e = LoadError::Mxfp4 { name: n, problem: problem.clone(), path };
            assert!(e.to_string().contains(name), "{e}");
            *problem
        }
        other => panic!("{name}: {other:?}"),
    };
    let s = |x: &str| x.to_string();
    assert_eq!(problem("none"), Mxfp4Problem::MissingScales { blocks: s("none_blocks"), scales: s("none_scales") });
    assert_eq!(
        problem("shape"),
        Mxfp4Problem::ScalesShape {
            blocks: s("shape_blocks"),
            scales: s("shape_scales"),
            got: vec![1, 2, 1],
            want: vec![1, 2, 2]
        }
    );
    assert_eq!(problem("type"), Mxfp4Problem::ScalesType { scales: s("type_scales"), dtype: s("F32") });
    assert_eq!(problem("wide"), Mxfp4Problem::BlocksShape { blocks: s("wide_blocks"), shape: vec![1, 2, 1, 8] });
    assert_eq!(problem("flat"), Mxfp4Problem::BlocksShape { blocks: s("flat_blocks"), shape: vec![2, 16] });
    assert_eq!(problem("bytes"), Mxfp4Problem::BlocksType { blocks: s("bytes_blocks"), dtype: s("F32") });
}
