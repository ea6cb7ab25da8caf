//! Tests of the checkpoint readers: GGUF and safetensors files built here in temporary
//! directories (round trips, and one test per kind of bad file, each checking the typed error
//! names the file and tensor), quantize-at-load, and the real checkpoints when present
//! (SmolLM2-135M GGUF in `~/.cache/coli/models`, pymoe-22m in the shared models directory).
//! `bad_files.rs` holds the hostile files: overlapping ranges, huge counts and names, files
//! that are not regular, truncated, changed after opening, or holding non-finite weights.
//!
//! Must not: download anything; a missing real checkpoint skips its test with a note.

use super::*;
use crate::format::{dot_row, matmul, quantize};
use std::path::PathBuf;

mod bad_files;
mod fp8;
mod gguf_transform;
mod hub;
mod mxfp4;
mod split;

/// Bytes of a GGUF file: `tensors` are (name, shape outermost first, type id, data).
fn gguf_bytes(
    version: u32,
    kv: &[(&str, GgufValue)],
    tensors: &[(&str, Vec<usize>, u32, Vec<u8>)],
    alignment: usize,
) -> Vec<u8> {
    fn s(b: &mut Vec<u8>, x: &str) {
        b.extend((x.len() as u64).to_le_bytes());
        b.extend(x.as_bytes());
    }
    fn arr(b: &mut Vec<u8>, a: &GgufArray) {
        macro_rules! put {
            ($ty:expr, $v:expr) => {{
                b.extend(($ty as u32).to_le_bytes());
                b.extend(($v.len() as u64).to_le_bytes());
                for x in $v {
                    b.extend(x.to_le_bytes());
                }
            }};
        }
        match a {
            GgufArray::U8(v) => put!(0, v),
            GgufArray::I8(v) => put!(1, v),
            GgufArray::U16(v) => put!(2, v),
            GgufArray::I16(v) => put!(3, v),
            GgufArray::U32(v) => put!(4, v),
            GgufArray::I32(v) => put!(5, v),
            GgufArray::F32(v) => put!(6, v),
            GgufArray::U64(v) => put!(10, v),
            GgufArray::I64(v) => put!(11, v),
            GgufArray::F64(v) => put!(12, v),
            GgufArray::Bool(v) => put!(7, v.iter().map(|&x| x as u8).collect::<Vec<u8>>()),
            GgufArray::String(v) => {
                b.extend(8u32.to_le_bytes());
                b.extend((v.len() as u64).to_le_bytes());
                v.iter().for_each(|x| s(b, x));
            }
            GgufArray::Array(v) => {
                b.extend(9u32.to_le_bytes());
                b.extend((v.len() as u64).to_le_bytes());
                v.iter().for_each(|x| arr(b, x));
            }
        }
    }
    let mut b = b"GGUF".to_vec();
    b.extend(version.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((kv.len() as u64).to_le_bytes());
    for (k, v) in kv {
        s(&mut b, k);
        let (ty, bytes): (u32, Vec<u8>) = match v {
            GgufValue::U8(x) => (0, x.to_le_bytes().to_vec()),
            GgufValue::I8(x) => (1, x.to_le_bytes().to_vec()),
            GgufValue::U16(x) => (2, x.to_le_bytes().to_vec()),
            GgufValue::I16(x) => (3, x.to_le_bytes().to_vec()),
            GgufValue::U32(x) => (4, x.to_le_bytes().to_vec()),
            GgufValue::I32(x) => (5, x.to_le_bytes().to_vec()),
            GgufValue::F32(x) => (6, x.to_le_bytes().to_vec()),
            GgufValue::Bool(x) => (7, vec![*x as u8]),
            GgufValue::U64(x) => (10, x.to_le_bytes().to_vec()),
            GgufValue::I64(x) => (11, x.to_le_bytes().to_vec()),
            GgufValue::F64(x) => (12, x.to_le_bytes().to_vec()),
            GgufValue::String(x) => {
                let mut t = Vec::new();
                s(&mut t, x);
                (8, t)
            }
            GgufValue::Array(a) => {
                let mut t = Vec::new();
                arr(&mut t, a);
                (9, t)
            }
        };
        b.extend(ty.to_le_bytes());
        b.extend(bytes);
    }
    let mut offset = 0usize;
    let mut offsets = Vec::new();
    for (name, shape, ty, data) in tensors {
        s(&mut b, name);
        b.extend((shape.len() as u32).to_le_bytes());
        for &d in shape.iter().rev() {
            b.extend((d as u64).to_le_bytes());
        }
        b.extend(ty.to_le_bytes());
        b.extend((offset as u64).to_le_bytes());
        offsets.push(offset);
        offset = (offset + data.len()).div_ceil(alignment) * alignment;
    }
    b.resize(b.len().div_ceil(alignment) * alignment, 0);
    let start = b.len();
    for ((_, _, _, data), off) in tensors.iter().zip(offsets) {
        b.resize(start + off, 0);
        b.extend(data);
    }
    b
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn open(p: &Path) -> Result<Checkpoint, LoadError> {
    Checkpoint::open(p, &LoadOptions::default())
}

fn sample_gguf() -> Vec<u8> {
    let q8 = quantize(WeightFormat::Q8_0, &(0..4 * 8 * 32).map(|i| (i as f32 * 0.37).sin()).collect::<Vec<_>>(), 32)
        .unwrap();
    let kv = vec![
        ("general.architecture", GgufValue::String("llama".into())),
        ("general.alignment", GgufValue::U32(64)),
        ("llama.block_count", GgufValue::U32(2)),
        ("llama.rope.freq_base", GgufValue::F32(10000.0)),
        ("flag", GgufValue::Bool(true)),
        ("neg", GgufValue::I64(-5)),
        ("small", GgufValue::I8(-3)),
        ("wide", GgufValue::F64(0.5)),
        ("tokenizer.ggml.tokens", GgufValue::Array(GgufArray::String(vec!["<s>".into(), "a".into(), "b".into()]))),
        ("tokenizer.ggml.token_type", GgufValue::Array(GgufArray::I32(vec![3, 1, 1]))),
        ("tokenizer.ggml.scores", GgufValue::Array(GgufArray::F32(vec![0.0, -1.0, -2.0]))),
        ("tokenizer.ggml.bos_token_id", GgufValue::U32(0)),
        ("nested", GgufValue::Array(GgufArray::Array(vec![GgufArray::U16(vec![1, 2]), GgufArray::Bool(vec![true])]))),
    ];
    let tensors = vec![
        ("norm.weight", vec![6], 0u32, f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])),
        ("blk.0.ffn_up_exps.weight", vec![4, 8, 32], 8u32, q8),
        ("odd.weight", vec![2, 256], 34u32, vec![7u8; 2 * 54]),
    ];
    gguf_bytes(3, &kv, &tensors, 64)
}

#[test]
fn gguf_round_trip_metadata_tensors_and_bindings() {
    let d = tmp();
    let p = write(d.path(), "m.gguf", &sample_gguf());
    let ck = open(&p).unwrap();
    let m = ck.gguf_metadata().unwrap();
    assert_eq!(m.version, 3);
    assert_eq!(m.get_str("general.architecture"), Some("llama"));
    assert_eq!(m.get_u64("llama.block_count"), Some(2));
    assert_eq!(m.get_f32("llama.rope.freq_base"), Some(10000.0));
    assert_eq!(m.get_bool("flag"), Some(true));
    assert_eq!(m.get_i64("neg"), Some(-5));
    assert_eq!(m.get_u64("neg"), None);
    assert_eq!(m.get_i64("small"), Some(-3));
    assert_eq!(m.get_f32("wide"), Some(0.5));
    assert_eq!(m.get_str_array("tokenizer.ggml.tokens").unwrap(), ["<s>", "a", "b"]);
    assert_eq!(m.get_i32_array("tokenizer.ggml.token_type"), Some(vec![3, 1, 1]));
    assert_eq!(m.get_f32_array("tokenizer.ggml.scores"), Some(vec![0.0, -1.0, -2.0]));
    assert_eq!(
        m.get("nested"),
        Some(&GgufValue::Array(GgufArray::Array(vec![GgufArray::U16(vec![1, 2]), GgufArray::Bool(vec![true])])))
    );
    assert!(ck.dir().is_none());

    let b = ck.bindings();
    assert_eq!(b.naming, Naming::Gguf);
    assert_eq!(b.architecture(), Some("llama"));
    assert!(!b.config.contains_key("tokenizer.ggml.tokens"));
    assert_eq!(b.config["tokenizer.ggml.bos_token_id"], serde_json::json!(0));
    assert_eq!(b.config["nested"], serde_json::json!([[1, 2], [true]]));
    let t = &b.tensors.as_ref().unwrap();
    assert_eq!(
        t["blk.0.ffn_up_exps.weight"],
        TensorInfo { shape: vec![4, 8, 32], dtype: "Q8_0".into(), bytes: 4 * 8 * 34 }
    );
    assert_eq!(t["odd.weight"].dtype, "TQ1_0");

    let norm = ck.tensor("norm.weight").unwrap();
    assert!(norm.is_mapped());
    assert_eq!(norm.to_f32_vec().unwrap(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(norm.as_matrix().rows, 1);
    let exps = ck.tensor("blk.0.ffn_up_exps.weight").unwrap();
    assert_eq!(exps.bytes().as_ptr() as usize % 64, 0, "aligned inside the map");
    let e2 = exps.expert(2);
    assert_eq!((e2.rows, e2.cols), (8, 32));
    assert_eq!(e2.bytes(), &exps.bytes()[2 * 8 * 34..3 * 8 * 34]);
    assert!(matches!(exps.try_expert(4), Err(LoadError::Shape { .. })));
    assert!(matches!(norm.try_expert(0), Err(LoadError::Shape { .. })));
    let all = exps.to_f32_vec().unwrap();
    let x: Vec<f32> = (0..32).map(|i| i as f32 / 32.0).collect();
    let want: f32 = all[(2 * 8 + 3) * 32..(2 * 8 + 4) * 32].iter().zip(&x).map(|(a, b)| a * b).sum();
    assert!((dot_row(WeightFormat::Q8_0, e2.row(3), &x) - want).abs() < 1e-4);
    let mut out = vec![0f32; 8];
    matmul(&e2, &x, 1, &mut out);
    assert!((out[3] - want).abs() < 0.05);

    match ck.tensor("odd.weight") {
        Err(e @ LoadError::UnsupportedType { .. }) => {
            assert!(e.to_string().contains("odd.weight") && e.to_string().contains("m.gguf"))
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(ck.tensor("nope"), Err(LoadError::NoSuchTensor { .. })));
    assert!(ck.has("norm.weight") && !ck.has("nope"));
    // A directory holding one GGUF (and no safetensors) opens that file.
    assert_eq!(open(d.path()).unwrap().path(), p);
}

#[test]
fn gguf_version_2_opens_and_version_1_is_refused() {
    let d = tmp();
    let mut b = sample_gguf();
    b[4..8].copy_from_slice(&2u32.to_le_bytes());
    assert_eq!(open(&write(d.path(), "v2.gguf", &b)).unwrap().gguf_metadata().unwrap().version, 2);
    b[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert!(matches!(open(&write(d.path(), "v1.gguf", &b)), Err(LoadError::UnsupportedVersion { version: 1, .. })));
}

#[test]
fn gguf_bad_magic() {
    let d = tmp();
    let mut b = sample_gguf();
    b[0..4].copy_from_slice(b"GGML");
    let e = open(&write(d.path(), "bad.gguf", &b)).unwrap_err();
    assert!(matches!(e, LoadError::BadMagic { found: [b'G', b'G', b'M', b'L'], .. }), "{e}");
    assert!(e.to_string().contains("bad.gguf"));
}

#[test]
fn gguf_truncated_header() {
    let d = tmp();
    let b = sample_gguf();
    for cut in [0usize, 3, 10, 30, 200] {
        let e = open(&write(d.path(), "t.gguf", &b[..cut])).unwrap_err();
        // A count the rest of the file cannot hold is refused before the items are read.
        let too_many = matches!(&e, LoadError::BadHeader { msg, .. } if msg.contains("cannot fit"));
        assert!(matches!(e, LoadError::TruncatedHeader { .. }) || too_many, "cut {cut}: {e}");
        assert!(e.to_string().contains("t.gguf"));
    }
}

#[test]
fn gguf_tensor_past_end_of_file() {
    let d = tmp();
    let b = sample_gguf();
    let e = open(&write(d.path(), "short.gguf", &b[..b.len() - 1])).unwrap_err();
    match &e {
        LoadError::TensorPastEnd { name, end, file_len, .. } => {
            assert_eq!(name, "odd.weight");
            assert_eq!(*end, *file_len as u128 + 1);
        }
        _ => panic!("{e}"),
    }
    assert!(e.to_string().contains("short.gguf") && e.to_string().contains("odd.weight"));
}

#[test]
fn gguf_tensor_length_disagreeing_with_shape_and_type() {
    let d = tmp();
    // A Q8_0 row of 30 columns is not a whole number of blocks.
    let b = gguf_bytes(3, &[], &[("w", vec![2, 30], 8, vec![0u8; 68])], 32);
    let e = open(&write(d.path(), "ragged.gguf", &b)).unwrap_err();
    assert!(matches!(&e, LoadError::RaggedTensor { name, .. } if name == "w"), "{e}");
    // Two tensors whose shapes claim more bytes than lie between their offsets.
    let mut b = gguf_bytes(3, &[], &[("a", vec![16], 0, vec![0u8; 64]), ("b", vec![16], 0, vec![0u8; 64])], 32);
    let at = b.windows(1).position(|w| w == b"b").unwrap();
    let off_at = at + 1 + 4 + 8 + 4; // name, n_dims, one dim, type
    b[off_at..off_at + 8].copy_from_slice(&32u64.to_le_bytes());
    let e = open(&write(d.path(), "overlap.gguf", &b)).unwrap_err();
    assert!(matches!(&e, LoadError::TensorSize { name, expected: 64, found: 32, .. } if name == "a"), "{e}");
    assert!(e.to_string().contains("overlap.gguf"));
}

#[test]
fn gguf_unknown_type_id() {
    let d = tmp();
    let b = gguf_bytes(3, &[], &[("w", vec![4], 99, vec![0u8; 16])], 32);
    let e = open(&write(d.path(), "u.gguf", &b)).unwrap_err();
    assert!(matches!(&e, LoadError::UnknownGgufType { id: 99, name, .. } if name == "w"), "{e}");
    assert!(e.to_string().contains("coli computes with F32, F16, BF16, Q8_0"), "the message lists what runs: {e}");
}

#[test]
fn gguf_bad_metadata_value_type_and_alignment() {
    let d = tmp();
    let mut b = gguf_bytes(3, &[("k", GgufValue::U32(1))], &[], 32);
    b[24 + 8 + 1..24 + 8 + 1 + 4].copy_from_slice(&77u32.to_le_bytes());
    assert!(matches!(open(&write(d.path(), "vt.gguf", &b)), Err(LoadError::BadHeader { .. })));
    let b = gguf_bytes(3, &[("general.alignment", GgufValue::U32(3))], &[], 32);
    assert!(matches!(open(&write(d.path(), "al.gguf", &b)), Err(LoadError::BadHeader { .. })));
}

/// Bytes of a safetensors file from `(name, dtype, shape, data)`.
fn st_bytes(tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut data: Vec<u8> = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [data.len(), data.len() + bytes.len()]}),
        );
        data.extend(bytes);
    }
    let h = serde_json::to_vec(&header).unwrap();
    let mut b = (h.len() as u64).to_le_bytes().to_vec();
    b.extend(h);
    b.extend(data);
    b
}

fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| half::bf16::from_f32(*x).to_bits().to_le_bytes()).collect()
}

const CONFIG: &str = r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 128}"#;

fn st_dir(tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) -> tempfile::TempDir {
    let d = tmp();
    write(d.path(), "config.json", CONFIG.as_bytes());
    write(d.path(), "model.safetensors", &st_bytes(tensors));
    d
}

fn weights(n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect()
}

#[test]
fn safetensors_single_file_round_trip() {
    let w = weights(64 * 128);
    let d = st_dir(&[
        ("model.layers.0.self_attn.q_proj.weight", "BF16", vec![64, 128], bf16_bytes(&w)),
        ("model.norm.weight", "F32", vec![4], f32_bytes(&[1.0, 2.0, 3.0, 4.0])),
        ("model.ids", "I64", vec![2], [3i64, -5].iter().flat_map(|v| v.to_le_bytes()).collect()),
        ("model.ids32", "I32", vec![2, 1], [7i32, 1 << 20].iter().flat_map(|v| v.to_le_bytes()).collect()),
        ("model.flags", "BOOL", vec![2], vec![0u8, 1]),
    ]);
    let ck = open(d.path()).unwrap();
    assert_eq!(ck.dir(), Some(d.path()));
    let b = ck.bindings();
    assert_eq!(b.naming, Naming::Hf);
    assert_eq!(b.architecture(), Some("LlamaForCausalLM"));
    assert_eq!(b.config["hidden_size"], 128);
    assert_eq!(
        b.tensors.as_ref().unwrap()["model.layers.0.self_attn.q_proj.weight"],
        TensorInfo { shape: vec![64, 128], dtype: "BF16".into(), bytes: 64 * 128 * 2 }
    );
    let q = ck.tensor("model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!(q.format, WeightFormat::BF16);
    let back = q.to_f32_vec().unwrap();
    assert!(back.iter().zip(&w).all(|(a, b)| (a - b).abs() <= b.abs() / 128.0));
    assert_eq!(q.row_f32(1).unwrap(), back[128..256]);
    assert_eq!(ck.tensor("model.norm.weight").unwrap().to_f32_vec().unwrap(), [1.0, 2.0, 3.0, 4.0]);
    // Integers read as f32 (DeepSeek V4's hash table of expert ids); other dtypes are refused.
    assert_eq!(ck.tensor("model.ids").unwrap().to_f32_vec().unwrap(), [3.0, -5.0]);
    assert_eq!(ck.tensor("model.ids32").unwrap().to_f32_vec().unwrap(), [7.0, (1 << 20) as f32]);
    let e = ck.tensor("model.flags").unwrap_err();
    assert!(
        matches!(&e, LoadError::UnsupportedType { dtype, name, .. } if dtype == "BOOL" && name == "model.flags"),
        "{e}"
    );
    assert!(e.to_string().contains("model.safetensors"));
}

#[test]
fn safetensors_sharded_and_missing_shard() {
    let d = tmp();
    write(d.path(), "config.json", CONFIG.as_bytes());
    write(
        d.path(),
        "model-00001-of-00002.safetensors",
        &st_bytes(&[("a.weight", "F32", vec![2], f32_bytes(&[1.0, 2.0]))]),
    );
    write(d.path(), "model-00002-of-00002.safetensors", &st_bytes(&[("b.weight", "F16", vec![1], vec![0, 0x3c])]));
    let index = r#"{"metadata": {}, "weight_map": {"a.weight": "model-00001-of-00002.safetensors", "b.weight": "model-00002-of-00002.safetensors"}}"#;
    write(d.path(), "model.safetensors.index.json", index.as_bytes());
    let ck = open(d.path()).unwrap();
    assert_eq!(ck.names().collect::<Vec<_>>(), ["a.weight", "b.weight"]);
    assert_eq!(ck.tensor("b.weight").unwrap().to_f32_vec().unwrap(), [1.0]);
    assert!(ck.tensor("b.weight").unwrap().source().ends_with("model-00002-of-00002.safetensors"));
    std::fs::remove_file(d.path().join("model-00002-of-00002.safetensors")).unwrap();
    let e = open(d.path()).unwrap_err();
    assert!(
        matches!(&e, LoadError::MissingShard { name, shard, .. } if name == "b.weight" && shard == "model-00002-of-00002.safetensors"),
        "{e}"
    );
    assert!(e.to_string().contains("model.safetensors.index.json"));
}

#[test]
fn safetensors_invalid_json_header() {
    let d = st_dir(&[]);
    let mut b = b"{not json".to_vec();
    let mut f = (b.len() as u64).to_le_bytes().to_vec();
    f.append(&mut b);
    write(d.path(), "model.safetensors", &f);
    let e = open(d.path()).unwrap_err();
    assert!(matches!(e, LoadError::InvalidJson { .. }), "{e}");
    assert!(e.to_string().contains("model.safetensors"));
    write(d.path(), "model.safetensors", &[1, 0]);
    assert!(matches!(open(d.path()), Err(LoadError::TruncatedHeader { .. })));
    write(d.path(), "model.safetensors", &1000u64.to_le_bytes());
    assert!(matches!(open(d.path()), Err(LoadError::TruncatedHeader { .. })));
}

#[test]
fn safetensors_size_mismatch_and_past_end() {
    let d = st_dir(&[("w", "F32", vec![3], vec![0u8; 8])]);
    let e = open(d.path()).unwrap_err();
    assert!(matches!(&e, LoadError::TensorSize { name, expected: 12, found: 8, .. } if name == "w"), "{e}");
    let mut b = st_bytes(&[("w", "F32", vec![4], vec![0u8; 16])]);
    b.truncate(b.len() - 4);
    write(d.path(), "model.safetensors", &b);
    let e = open(d.path()).unwrap_err();
    assert!(matches!(&e, LoadError::TensorPastEnd { name, .. } if name == "w"), "{e}");
    assert!(e.to_string().contains("model.safetensors") && e.to_string().contains(" w "));
}

#[test]
fn not_a_checkpoint_and_missing_config() {
    let d = tmp();
    assert!(matches!(open(d.path()), Err(LoadError::NotACheckpoint { .. })));
    assert!(matches!(open(&d.path().join("absent.gguf")), Err(LoadError::Io { .. })));
    write(d.path(), "model.safetensors", &st_bytes(&[]));
    let e = open(d.path()).unwrap_err();
    assert!(matches!(&e, LoadError::Io { path, .. } if path.ends_with("config.json")), "{e}");
    write(d.path(), "config.json", b"[1,");
    assert!(matches!(open(d.path()), Err(LoadError::InvalidJson { .. })));
}

#[test]
fn quantize_at_load_converts_eligible_matrices_only() {
    let w = weights(64 * 128);
    let tensors = [
        ("model.layers.0.mlp.experts.3.up_proj.weight", "BF16", vec![64, 128], bf16_bytes(&w)),
        ("model.layers.0.mlp.gate.weight", "BF16", vec![64, 128], bf16_bytes(&w)),
        ("model.embed_tokens.weight", "F32", vec![64, 128], f32_bytes(&w)),
        ("model.layers.0.input_layernorm.weight", "F32", vec![128], f32_bytes(&w[..128])),
        ("lm_head.weight", "F16", vec![2, 96], vec![0u8; 2 * 96 * 2]),
    ];
    let d = st_dir(&tensors);
    for target in [WeightFormat::I8Row, WeightFormat::I4G64] {
        let calls: Arc<std::sync::Mutex<Vec<(u64, u64)>>> = Arc::default();
        let c = calls.clone();
        let opts = LoadOptions {
            quantize: Some(target),
            progress: Some(Arc::new(move |a, b| c.lock().unwrap().push((a, b)))),
        };
        let ck = Checkpoint::open(d.path(), &opts).unwrap();
        let up = ck.tensor("model.layers.0.mlp.experts.3.up_proj.weight").unwrap();
        assert_eq!(up.format, target);
        assert!(!up.is_mapped());
        let back = up.to_f32_vec().unwrap();
        let tol = if target == WeightFormat::I8Row { 1.0 / 127.0 } else { 2.0 / 15.0 / 2.0 + 2e-3 };
        assert!(back.iter().zip(&w).all(|(a, b)| (a - b).abs() <= tol), "{target}");
        for keep in [
            "model.layers.0.mlp.gate.weight",
            "model.embed_tokens.weight",
            "model.layers.0.input_layernorm.weight",
            "lm_head.weight",
        ] {
            assert!(ck.tensor(keep).unwrap().is_mapped(), "{keep} kept as stored");
        }
        let info = &ck.bindings().tensors.unwrap()["model.layers.0.mlp.experts.3.up_proj.weight"];
        assert_eq!(info.dtype, target.name());
        assert_eq!(info.bytes as usize, up.bytes().len());
        assert_eq!(*calls.lock().unwrap(), vec![(64 * 128 * 2, 64 * 128 * 2)]);
    }
    let bad = LoadOptions { quantize: Some(WeightFormat::Q8_0), progress: None };
    assert!(matches!(Checkpoint::open(d.path(), &bad), Err(LoadError::BadQuantizeTarget { .. })));
}

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME").map(PathBuf::from)
}

#[test]
fn real_smollm2_gguf() {
    let Some(p) = home().map(|h| h.join(".cache/coli/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"))
    else {
        return;
    };
    if !p.is_file() {
        eprintln!("note: skipping real_smollm2_gguf: {} is absent (tools/fetch-model.sh fetches it)", p.display());
        return;
    }
    let ck = open(&p).unwrap();
    let m = ck.gguf_metadata().unwrap();
    assert_eq!(m.get_str("general.architecture"), Some("llama"));
    assert_eq!(m.get_u64("llama.block_count"), Some(30));
    assert_eq!(m.get_u64("llama.embedding_length"), Some(576));
    assert_eq!(m.get_str_array("tokenizer.ggml.tokens").map(|t| t.len()), Some(49152));
    assert!(m.get_str_array("tokenizer.ggml.merges").is_some_and(|v| !v.is_empty()));
    assert!(m.get_u64("tokenizer.ggml.bos_token_id").is_some());
    assert!(m.get_str("tokenizer.chat_template").is_some());
    let emb = ck.tensor("token_embd.weight").unwrap();
    assert_eq!((emb.format, emb.shape.as_slice()), (WeightFormat::Q8_0, [49152usize, 576].as_slice()));
    let q = ck.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!((q.format, q.shape.as_slice()), (WeightFormat::Q4_1, [576usize, 576].as_slice()));
    let norm = ck.tensor("blk.0.attn_norm.weight").unwrap().to_f32_vec().unwrap();
    assert_eq!(norm.len(), 576);
    assert!(norm.iter().all(|v| v.is_finite()));
    let row = emb.row_f32(1000).unwrap();
    assert!(row.iter().all(|v| v.is_finite()) && row.iter().any(|&v| v != 0.0));
    let b = ck.bindings();
    assert_eq!(b.config["llama.embedding_length"], 576);
    assert!(!b.config.contains_key("tokenizer.ggml.tokens"));
}

/// The shared models directory: `$COLI_SHARED/models`, else `../shared/models` beside the
/// workspace root, else `/work/shared/models`.
fn shared_models() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent()?;
    let candidates = [
        std::env::var_os("COLI_SHARED").map(|s| PathBuf::from(s).join("models")),
        Some(root.join("../shared/models")),
        Some(PathBuf::from("/work/shared/models")),
    ];
    candidates.into_iter().flatten().find(|p| p.is_dir())
}

#[test]
fn real_pymoe_safetensors() {
    let Some(dir) = shared_models().map(|m| m.join("pymoe-22m")).filter(|d| d.is_dir()) else {
        eprintln!("note: skipping real_pymoe_safetensors: shared models directory absent (set COLI_SHARED)");
        return;
    };
    let ck = open(&dir).unwrap();
    let b = ck.bindings();
    assert_eq!(b.architecture(), Some("OlmoeForCausalLM"));
    assert_eq!(b.config["num_experts"], 32);
    let tensors = b.tensors.unwrap();
    assert!(tensors.values().all(|t| t.dtype == "BF16"), "pymoe-22m is all bf16");
    let e = ck.tensor("model.layers.0.mlp.experts.0.up_proj.weight").unwrap();
    assert_eq!((e.format, e.shape.as_slice()), (WeightFormat::BF16, [128usize, 256].as_slice()));
    assert!(ck.has("model.embed_tokens.weight"));
    let opts = LoadOptions { quantize: Some(WeightFormat::I8Row), progress: None };
    let q = Checkpoint::open(&dir, &opts).unwrap();
    assert_eq!(q.tensor("model.layers.0.mlp.experts.0.up_proj.weight").unwrap().format, WeightFormat::I8Row);
    assert_eq!(q.tensor("model.embed_tokens.weight").unwrap().format, WeightFormat::BF16);
}
