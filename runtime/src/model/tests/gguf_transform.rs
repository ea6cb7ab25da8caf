//! The split MLA pair of a GGUF joined back into `attn_kv_b`: the layout per head (key rows
//! transposed, then value rows) in F32 and bit for bit in F16, a file that holds `attn_kv_b`
//! itself left as it is, and a pair whose shapes do not fit a typed error naming the tensor.

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
