//! FP8 checkpoints built here: `F8_E4M3` weights with F32 and BF16 `weight_scale_inv`, 2-D and
//! stacked, handed out as `FP8_E4M3` rows whose every element is its code's value times its
//! own tile's scale (the tile index is what is tested: codes and scales are chosen so that a
//! wrong tile gives another value); the compiler's bindings at the repacked size; and each
//! way the pairing can fail, a typed error naming the tensor, while the checkpoint still opens.
//!
//! Must not: depend on real checkpoints.

use super::*;
use crate::model::fp8::Fp8Problem;

/// Codes whose values are exact small numbers: 0x38 is 1.0, 0x40 2.0, 0xb8 -1.0.
fn codes(rows: usize, cols: usize) -> Vec<u8> {
    (0..rows * cols).map(|i| [0x38u8, 0x40, 0xb8][(i / cols + i % cols) % 3]).collect()
}

fn code_value(i: usize, cols: usize) -> f32 {
    [1.0, 2.0, -1.0][(i / cols + i % cols) % 3]
}

#[test]
fn fp8_weights_become_fp8_e4m3_rows_with_their_tiles_scales() {
    // [200, 256]: two row tiles (the second short), two column blocks; scales 1, 2, 4, 8.
    let scales = [1.0f32, 2.0, 4.0, 8.0];
    // Stacked [2, 64, 128], BF16 scales [2, 1, 1]: 0.5 and 0.25.
    let d = st_dir(&[
        ("a.weight", "F8_E4M3", vec![200, 256], codes(200, 256)),
        ("a.weight_scale_inv", "F32", vec![2, 2], f32_bytes(&scales)),
        ("e.weight", "F8_E4M3", vec![2, 64, 128], codes(128, 128)),
        ("e.weight_scale_inv", "BF16", vec![2, 1, 1], bf16_bytes(&[0.5, 0.25])),
    ]);
    let ck = open(d.path()).unwrap();
    let a = ck.tensor("a.weight").unwrap();
    assert_eq!((a.format, a.shape.clone(), a.bytes().len()), (WeightFormat::FP8_E4M3, vec![200, 256], 200 * 2 * 132));
    let v = a.to_f32_vec().unwrap();
    for (i, &x) in v.iter().enumerate() {
        let (r, c) = (i / 256, i % 256);
        assert_eq!(x, code_value(i, 256) * scales[(r / 128) * 2 + c / 128], "a[{r}][{c}]");
    }
    let e = ck.tensor("e.weight").unwrap();
    let v = e.to_f32_vec().unwrap();
    for (i, &x) in v.iter().enumerate() {
        assert_eq!(x, code_value(i, 128) * [0.5, 0.25][i / (64 * 128)], "e element {i}");
    }
    assert_eq!(e.expert(1).row(0), ck.tensor("e.weight").unwrap().expert(1).row(0), "the same bytes every time");
    let info = &ck.bindings().tensors.unwrap()["a.weight"];
    assert_eq!((info.dtype.as_str(), info.bytes), ("FP8_E4M3", 200 * 2 * 132));
}

#[test]
fn fp8_weights_without_a_usable_scale_are_errors_naming_them() {
    let d = st_dir(&[
        ("none.weight", "F8_E4M3", vec![64, 128], codes(64, 128)),
        ("shape.weight", "F8_E4M3", vec![256, 128], codes(256, 128)),
        ("shape.weight_scale_inv", "F32", vec![1, 1], f32_bytes(&[1.0])),
        ("type.weight", "F8_E4M3", vec![64, 128], codes(64, 128)),
        ("type.weight_scale_inv", "F16", vec![1, 1], vec![0, 0x3c]),
        ("ragged.weight", "F8_E4M3", vec![64, 192], codes(64, 192)),
        ("ragged.weight_scale_inv", "F32", vec![1, 2], f32_bytes(&[1.0, 1.0])),
        ("nan.weight", "F8_E4M3", vec![1, 128], [vec![0x38; 100], vec![0x7f], vec![0x38; 27]].concat()),
        ("nan.weight_scale_inv", "F32", vec![1, 1], f32_bytes(&[1.0])),
    ]);
    let ck = open(d.path()).expect("a checkpoint with unreadable FP8 tensors still opens");
    let problem = |name: &str| match ck.tensor(name) {
        Err(LoadError::Fp8 { name: n, problem, path }) => {
            assert!(n == name && path.ends_with("model.safetensors"));
            let e = LoadError::Fp8 { name: n, problem: problem.clone(), path };
            assert!(e.to_string().contains(name), "{e}");
            *problem
        }
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(problem("none.weight"), Fp8Problem::MissingScale { scale: "none.weight_scale_inv".into() });
    assert_eq!(
        problem("shape.weight"),
        Fp8Problem::ScaleShape { scale: "shape.weight_scale_inv".into(), got: vec![1, 1], want: vec![2, 1] }
    );
    assert_eq!(
        problem("type.weight"),
        Fp8Problem::ScaleType { scale: "type.weight_scale_inv".into(), dtype: "F16".into() }
    );
    assert_eq!(problem("ragged.weight"), Fp8Problem::Shape { shape: vec![64, 192] });
    let e = ck.tensor("nan.weight").unwrap_err();
    assert!(matches!(&e, LoadError::NonFinite { name, found, .. } if name == "nan.weight" && found.col == 100), "{e}");
    // Unpaired FP8 tensors keep their file dtype in the bindings (the compiler sizes them so).
    assert_eq!(ck.bindings().tensors.unwrap()["none.weight"].dtype, "F8_E4M3");
}

#[test]
fn quantize_at_load_leaves_fp8_weights_in_their_block_form() {
    let w = weights(64 * 128);
    let d = st_dir(&[
        ("model.layers.0.mlp.up_proj.weight", "F8_E4M3", vec![64, 128], codes(64, 128)),
        ("model.layers.0.mlp.up_proj.weight_scale_inv", "F32", vec![1, 1], f32_bytes(&[0.5])),
        ("lm_head.weight", "BF16", vec![64, 128], bf16_bytes(&w)),
    ]);
    let opts = LoadOptions { quantize: Some(WeightFormat::I8Row), ..LoadOptions::default() };
    let ck = Checkpoint::open(d.path(), &opts).unwrap();
    assert_eq!(ck.quantized_names(), vec!["lm_head.weight".to_string()]);
    let up = ck.tensor("model.layers.0.mlp.up_proj.weight").unwrap();
    assert_eq!(up.format, WeightFormat::FP8_E4M3);
    assert_eq!(up.row_f32(0).unwrap()[..3], [0.5, 1.0, -0.5]);
    assert_eq!(ck.tensor("lm_head.weight").unwrap().format, WeightFormat::I8Row);
}
