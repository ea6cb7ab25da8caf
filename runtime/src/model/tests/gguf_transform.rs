//! The split MLA pair of a GGUF joined back into `attn_kv_b`: the layout per head (key rows
//! transposed, then value rows) in F32 and bit for bit in F16, a file that holds `attn_kv_b`
//! itself left as it is, and a pair whose shapes do not fit a typed error naming the tensor.
//! Qwen3.5's tiled value heads grouped back byte for byte in a block format (rows and columns),
//! and `ssm_a` that is not negative a typed error.

use super::*;

/// `kv_b[h * (nope + v) + d][c]`: distinct values so any misplaced element shows.
fn kv_b(heads: usize, nope: usize, v: usize, latent: usize) -> Vec<f32> {
    (0..heads * (nope + v) * latent).map(|i| i as f32 * 0.25 - 3.0).collect()
}

/// llama.cpp's split of `kv_b`: `k_b` [heads, latent, nope], `v_b` [heads, v, latent].
fn split(kv: &[f32], heads: usize, nope: usize, v: usize, latent: usize) -> (Vec<f32>, Vec<f32>) {
    let at = |h: usize, d: usize, c: usize| kv[(h * (nope + v) + d) * latent + c];
    let mut k_b = Vec::new();
    let mut v_b = Vec::new();
    for h in 0..heads {
        for c in 0..latent {
            k_b.extend((0..nope).map(|d| at(h, d, c)));
        }
        for d in 0..v {
            v_b.extend((0..latent).map(|c| at(h, nope + d, c)));
        }
    }
    (k_b, v_b)
}

fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| half::f16::from_f32(*x).to_le_bytes()).collect()
}

#[test]
fn the_split_pair_joins_back_into_kv_b() {
    let (heads, nope, v, latent) = (3, 4, 2, 5);
    let kv = kv_b(heads, nope, v, latent);
    let (k_b, v_b) = split(&kv, heads, nope, v, latent);
    for (ty, bytes, format) in
        [(0u32, f32_bytes as fn(&[f32]) -> Vec<u8>, WeightFormat::F32), (1, f16_bytes, WeightFormat::F16)]
    {
        let d = tmp();
        let tensors = [
            ("blk.0.attn_k_b.weight", vec![heads, latent, nope], ty, bytes(&k_b)),
            ("blk.0.attn_v_b.weight", vec![heads, v, latent], ty, bytes(&v_b)),
        ];
        let p = write(d.path(), "m.gguf", &gguf_bytes(3, &[], &tensors, 32));
        let ck = open(&p).unwrap();
        let name = "blk.0.attn_kv_b.weight";
        assert!(ck.has(name) && ck.names().any(|n| n == name));
        let t = ck.tensor(name).unwrap();
        assert_eq!((t.shape.clone(), t.format), (vec![heads * (nope + v), latent], format));
        assert_eq!(t.bytes(), &bytes(&kv)[..], "{format}: the joined bytes");
        let info = &ck.bindings().tensors.unwrap()[name];
        assert_eq!((info.shape.clone(), info.bytes), (t.shape.clone(), t.bytes().len() as u64));
    }
}

#[test]
fn a_file_with_kv_b_keeps_its_own() {
    let d = tmp();
    let tensors = [
        ("blk.0.attn_k_b.weight", vec![1, 2, 2], 0u32, f32_bytes(&[0.0; 4])),
        ("blk.0.attn_v_b.weight", vec![1, 1, 2], 0, f32_bytes(&[0.0; 2])),
        ("blk.0.attn_kv_b.weight", vec![3, 2], 0, f32_bytes(&[7.0; 6])),
    ];
    let p = write(d.path(), "m.gguf", &gguf_bytes(3, &[], &tensors, 32));
    let ck = open(&p).unwrap();
    assert_eq!(ck.tensor("blk.0.attn_kv_b.weight").unwrap().to_f32_vec().unwrap(), vec![7.0; 6]);
    assert_eq!(ck.names().filter(|n| *n == "blk.0.attn_kv_b.weight").count(), 1);
}

#[test]
fn a_pair_that_does_not_fit_is_a_typed_error() {
    let d = tmp();
    // v_b's latent (3) is not k_b's (2).
    let tensors = [
        ("blk.4.attn_k_b.weight", vec![1, 2, 2], 0u32, f32_bytes(&[0.0; 4])),
        ("blk.4.attn_v_b.weight", vec![1, 1, 3], 0, f32_bytes(&[0.0; 3])),
    ];
    let p = write(d.path(), "m.gguf", &gguf_bytes(3, &[], &tensors, 32));
    match open(&p) {
        Err(e @ LoadError::Shape { .. }) => {
            assert!(e.to_string().contains("blk.4.attn_v_b.weight") && e.to_string().contains("m.gguf"), "{e}")
        }
        other => panic!("expected a shape error, got {other:?}"),
    }
}

/// Q8_0 rows whose blocks carry their block's index in every quant (scale 1.0).
fn q8_tagged(rows: usize, cols: usize) -> Vec<u8> {
    let mut b = Vec::new();
    for blk in 0..rows * cols / 32 {
        b.extend(half::f16::from_f32(1.0).to_le_bytes());
        b.extend(std::iter::repeat_n((blk % 128) as u8, 32));
    }
    b
}

fn qwen35_meta() -> Vec<(&'static str, GgufValue)> {
    vec![
        ("general.architecture", GgufValue::String("qwen35moe".into())),
        ("qwen35moe.ssm.group_count", GgufValue::U32(2)),
        ("qwen35moe.ssm.time_step_rank", GgufValue::U32(4)),
        ("qwen35moe.ssm.state_size", GgufValue::U32(8)),
        ("qwen35moe.ssm.inner_size", GgufValue::U32(128)),
    ]
}

#[test]
fn qwen35_tiled_value_heads_are_grouped_back_in_their_own_format() {
    // 2 key heads, 4 value heads of 32: grouped head j is tiled head (j % 2) * 2 + j / 2.
    let tiled_of = |j: usize| (j % 2) * 2 + j / 2;
    let d = tmp();
    let tensors = [
        ("blk.0.attn_gate.weight", vec![128, 32], 8u32, q8_tagged(128, 32)),
        ("blk.0.ssm_out.weight", vec![2, 128], 8, q8_tagged(2, 128)),
        ("blk.0.ssm_dt.bias", vec![4], 0, f32_bytes(&[0.0, 1.0, 2.0, 3.0])),
        ("blk.0.ssm_a", vec![4], 0, f32_bytes(&[-1.0, -2.0, -3.0, -4.0])),
    ];
    let p = write(d.path(), "m.gguf", &gguf_bytes(3, &qwen35_meta(), &tensors, 32));
    let ck = open(&p).unwrap();
    let gate = ck.tensor("blk.0.attn_gate.grouped").unwrap();
    assert_eq!((gate.format, gate.shape.clone()), (WeightFormat::Q8_0, vec![128, 32]));
    for row in 0..128 {
        let (j, r) = (row / 32, row % 32);
        assert_eq!(gate.bytes()[row * 34 + 2] as usize, tiled_of(j) * 32 + r, "attn_gate row {row}");
    }
    let out = ck.tensor("blk.0.ssm_out.grouped").unwrap();
    assert_eq!(out.format, WeightFormat::Q8_0);
    for row in 0..2 {
        for j in 0..4 {
            assert_eq!(
                out.bytes()[(row * 4 + j) * 34 + 2] as usize,
                row * 4 + tiled_of(j),
                "ssm_out row {row} head {j}"
            );
        }
    }
    let dt = ck.tensor("blk.0.ssm_dt.grouped").unwrap().to_f32_vec().unwrap();
    assert_eq!(dt, vec![0.0, 2.0, 1.0, 3.0]);
    let a = ck.tensor("blk.0.ssm_a_log").unwrap().to_f32_vec().unwrap();
    let want: Vec<f32> = [1.0f32, 3.0, 2.0, 4.0].iter().map(|x| x.ln()).collect();
    assert_eq!(a, want);
}

#[test]
fn an_ssm_a_that_is_not_negative_is_a_typed_error() {
    let d = tmp();
    let tensors = [("blk.2.ssm_a", vec![2], 0u32, f32_bytes(&[-1.0, 0.5]))];
    let p = write(d.path(), "m.gguf", &gguf_bytes(3, &[], &tensors, 32));
    let ck = open(&p).unwrap();
    match ck.tensor("blk.2.ssm_a_log") {
        Err(e @ LoadError::Shape { .. }) => {
            assert!(e.to_string().contains("blk.2.ssm_a") && e.to_string().contains("-exp(A_log)"), "{e}")
        }
        other => panic!("expected a shape error, got {other:?}"),
    }
}
