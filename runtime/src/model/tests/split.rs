//! Split GGUF: a file cut into shards here (as `gguf-split` lays them out: every shard's
//! `split.*` keys, the metadata in shard 1) opens from any shard with the tensors and values
//! of the whole file, and the tiny llama fixture made a GGUF and split into three runs to the
//! same logits and greedy tokens as the one file, on the CPU through `Engine::load`. Each bad
//! set is its own typed error: a missing shard (named), counts that disagree, a tensor in two
//! shards, a total that does not add up, a split file whose name hides its siblings. And a
//! GGUF naming an unknown pre-tokenizer is refused before its weights are read.

use super::*;
use crate::engine::{Engine, EngineOptions};
use crate::exec::{LogitRows, Session};

pub(super) type T = (String, Vec<usize>, u32, Vec<u8>);

/// Writes `tensors` as `name-0000K-of-0000N.gguf` files in `dir`, shard `k` holding the
/// tensors `parts[k-1]` says (counts, in order), `kv` in shard 1 and the `split.*` keys in every
/// shard (`split.tensors.count` as `total`, normally `tensors.len()`). Returns the paths.
pub(super) fn write_split(
    dir: &Path,
    name: &str,
    kv: &[(&str, GgufValue)],
    tensors: &[T],
    parts: &[usize],
    total: u64,
) -> Vec<PathBuf> {
    let n = parts.len();
    let mut at = 0;
    let mut paths = Vec::new();
    for (i, &count) in parts.iter().enumerate() {
        let mut keys: Vec<(&str, GgufValue)> = if i == 0 { kv.to_vec() } else { Vec::new() };
        keys.push(("split.no", GgufValue::U16(i as u16)));
        keys.push(("split.count", GgufValue::U16(n as u16)));
        keys.push(("split.tensors.count", GgufValue::I32(total as i32)));
        let part: Vec<(&str, Vec<usize>, u32, Vec<u8>)> =
            tensors[at..at + count].iter().map(|(nm, s, ty, d)| (nm.as_str(), s.clone(), *ty, d.clone())).collect();
        at += count;
        let file = format!("{name}-{:05}-of-{n:05}.gguf", i + 1);
        paths.push(write(dir, &file, &gguf_bytes(3, &keys, &part, 32)));
    }
    paths
}

pub(super) fn small() -> (Vec<(&'static str, GgufValue)>, Vec<T>) {
    let kv = vec![
        ("general.architecture", GgufValue::String("llama".into())),
        ("llama.block_count", GgufValue::U32(2)),
        ("tokenizer.ggml.tokens", GgufValue::Array(GgufArray::String(vec!["a".into(), "b".into()]))),
    ];
    let q8 = quantize(WeightFormat::Q8_0, &weights(2 * 64), 64).unwrap();
    let tensors = vec![
        ("a.weight".to_string(), vec![6], 0u32, f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])),
        ("b.weight".to_string(), vec![2, 64], 8u32, q8),
        ("c.weight".to_string(), vec![3, 4], 0u32, f32_bytes(&weights(12))),
        ("d.weight".to_string(), vec![5], 0u32, f32_bytes(&weights(5))),
    ];
    (kv, tensors)
}

fn unsplit(kv: &[(&str, GgufValue)], tensors: &[T]) -> Vec<u8> {
    let t: Vec<(&str, Vec<usize>, u32, Vec<u8>)> =
        tensors.iter().map(|(n, s, ty, d)| (n.as_str(), s.clone(), *ty, d.clone())).collect();
    gguf_bytes(3, kv, &t, 32)
}

#[test]
fn a_split_gguf_opens_from_any_shard_as_the_whole_file() {
    let d = tmp();
    let (kv, tensors) = small();
    let one = open(&write(d.path(), "whole.gguf", &unsplit(&kv, &tensors))).unwrap();
    let paths = write_split(d.path(), "m", &kv, &tensors, &[1, 2, 1], 4);
    for p in &paths {
        let ck = open(p).unwrap();
        assert_eq!(ck.path(), p.as_path());
        assert_eq!(ck.names().collect::<Vec<_>>(), one.names().collect::<Vec<_>>());
        for name in one.names() {
            let (a, b) = (one.tensor(name).unwrap(), ck.tensor(name).unwrap());
            assert_eq!((a.format, &a.shape, a.bytes()), (b.format, &b.shape, b.bytes()), "{name}");
        }
        // Each tensor's bytes are in its own shard's file.
        assert_eq!(ck.tensor("a.weight").unwrap().source(), paths[0].as_path());
        assert_eq!(ck.tensor("c.weight").unwrap().source(), paths[1].as_path());
        assert_eq!(ck.tensor("d.weight").unwrap().source(), paths[2].as_path());
        let m = ck.gguf_metadata().unwrap();
        assert_eq!(m.get_str("general.architecture"), Some("llama"));
        assert_eq!(m.get_str_array("tokenizer.ggml.tokens").unwrap(), ["a", "b"]);
        assert_eq!(ck.bindings().tensors, one.bindings().tensors);
    }
    // A directory holding one split set opens it.
    let sub = d.path().join("set");
    std::fs::create_dir(&sub).unwrap();
    write_split(&sub, "m", &kv, &tensors, &[2, 2], 4);
    assert_eq!(open(&sub).unwrap().names().count(), 4);
    // Two checkpoints in one directory are named, not guessed between.
    let e = open(d.path()).unwrap_err();
    assert!(matches!(e, LoadError::SeveralGguf { .. }), "{e}");
    assert!(
        e.to_string().contains("m-00001-of-00003.gguf, m-00002-of-00003.gguf") && e.to_string().contains("whole.gguf"),
        "{e}"
    );
}

#[test]
fn bad_split_sets_are_typed_errors() {
    let (kv, tensors) = small();
    // A missing shard, named.
    let d = tmp();
    let paths = write_split(d.path(), "m", &kv, &tensors, &[1, 2, 1], 4);
    std::fs::remove_file(&paths[1]).unwrap();
    for p in [&paths[0], &paths[2]] {
        match open(p) {
            Err(e @ LoadError::SplitShardMissing { no: 2, count: 3, .. }) => {
                assert!(e.to_string().contains("m-00002-of-00003.gguf"), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }
    // Shards that disagree on the count: the second says three, the names say two.
    let d = tmp();
    let paths = write_split(d.path(), "m", &kv, &tensors, &[2, 2], 4);
    let mut three = write_split(d.path(), "x", &kv, &tensors, &[1, 2, 1], 4);
    std::fs::rename(three.remove(1), &paths[1]).unwrap();
    match open(&paths[0]) {
        Err(LoadError::SplitCount { path, found: 3, expected: 2 }) => assert_eq!(path, paths[1]),
        other => panic!("{other:?}"),
    }
    // A tensor in two shards.
    let d = tmp();
    let mut twice = tensors.clone();
    twice[3].0 = "a.weight".into();
    let paths = write_split(d.path(), "m", &kv, &twice, &[2, 2], 4);
    match open(&paths[0]) {
        Err(e @ LoadError::SplitDuplicateTensor { .. }) => {
            let s = e.to_string();
            assert!(s.contains("a.weight") && s.contains("m-00001-of-00002") && s.contains("m-00002-of-00002"), "{s}");
        }
        other => panic!("{other:?}"),
    }
    // split.tensors.count disagreeing with the tensors the shards hold.
    let d = tmp();
    let paths = write_split(d.path(), "m", &kv, &tensors, &[2, 2], 5);
    assert!(matches!(open(&paths[1]), Err(LoadError::SplitTensorCount { expected: 5, found: 4, shards: 2, .. })));
    // A shard whose split.no contradicts its name (files renamed).
    let d = tmp();
    let paths = write_split(d.path(), "m", &kv, &tensors, &[2, 2], 4);
    let (a, b, t) = (&paths[0], &paths[1], d.path().join("t"));
    std::fs::rename(a, &t).unwrap();
    std::fs::rename(b, a).unwrap();
    std::fs::rename(&t, b).unwrap();
    assert!(matches!(open(a), Err(LoadError::BadHeader { msg, .. }) if msg.contains("split.no")));
    // split.count on a file whose name does not say where the others are.
    let d = tmp();
    let mut keys = kv.clone();
    keys.push(("split.count", GgufValue::U16(2)));
    let p = write(d.path(), "renamed.gguf", &unsplit(&keys, &tensors));
    assert!(matches!(open(&p), Err(LoadError::SplitName { count: 2, .. })));
}

/// The tiny llama fixture (`tests/fixtures/llama`) as GGUF tensors and metadata, F32.
fn llama_gguf() -> (Vec<(&'static str, GgufValue)>, Vec<T>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/llama");
    let hf = open(&dir).unwrap();
    let rename = |n: &str| -> String {
        let n = n.replace("model.layers.", "blk.").replace("model.embed_tokens", "token_embd");
        let n = n.replace("model.norm", "output_norm").replace("lm_head", "output");
        let pairs = [
            (".input_layernorm", ".attn_norm"),
            (".post_attention_layernorm", ".ffn_norm"),
            (".self_attn.q_proj", ".attn_q"),
            (".self_attn.k_proj", ".attn_k"),
            (".self_attn.v_proj", ".attn_v"),
            (".self_attn.o_proj", ".attn_output"),
            (".mlp.gate_proj", ".ffn_gate"),
            (".mlp.up_proj", ".ffn_up"),
            (".mlp.down_proj", ".ffn_down"),
        ];
        pairs.iter().fold(n, |n, (a, b)| n.replace(a, b))
    };
    let tensors: Vec<T> = hf
        .names()
        .map(|n| {
            let t = hf.tensor(n).unwrap();
            assert_eq!(t.format, WeightFormat::F32);
            (rename(n), t.shape.clone(), 0u32, t.bytes().to_vec())
        })
        .collect();
    let u = GgufValue::U32;
    let kv = vec![
        ("general.architecture", GgufValue::String("llama".into())),
        ("llama.embedding_length", u(64)),
        ("llama.block_count", u(3)),
        ("llama.attention.head_count", u(4)),
        ("llama.attention.head_count_kv", u(2)),
        ("llama.attention.key_length", u(16)),
        ("llama.feed_forward_length", u(128)),
        ("llama.vocab_size", u(320)),
        ("llama.context_length", u(256)),
        ("llama.attention.layer_norm_rms_epsilon", GgufValue::F32(1e-5)),
        ("llama.rope.freq_base", GgufValue::F32(1e4)),
    ];
    (kv, tensors)
}

/// Every logit row of `prompt`, then 8 greedy tokens, on the CPU.
fn run(path: &Path, prompt: &[u32]) -> (Vec<f32>, Vec<u32>) {
    let engine = Engine::load(path, &EngineOptions::default()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut s = Session::new(engine.model(), 64);
    let rows = s.forward(prompt, LogitRows::All).unwrap();
    let vocab = engine.plan().program.dims.vocab;
    let mut last = rows[rows.len() - vocab..].to_vec();
    let mut toks = Vec::new();
    for _ in 0..8 {
        let id = (0..vocab).max_by(|&a, &b| last[a].total_cmp(&last[b]).then(b.cmp(&a))).unwrap() as u32;
        toks.push(id);
        last = s.forward(&[id], LogitRows::Last).unwrap();
    }
    (rows, toks)
}

#[test]
fn a_split_llama_runs_to_the_logits_and_tokens_of_the_one_file() {
    let d = tmp();
    let (kv, tensors) = llama_gguf();
    let whole = write(d.path(), "llama.gguf", &unsplit(&kv, &tensors));
    let n = tensors.len();
    let paths = write_split(d.path(), "llama", &kv, &tensors, &[5, n - 10, 5], n as u64);
    let prompt = [33, 104, 49, 287, 196, 85, 211, 194, 291, 49, 295, 104, 85, 28];
    let (rows, toks) = run(&whole, &prompt);
    assert!(rows.iter().all(|x| x.is_finite()) && rows.iter().any(|&x| x != 0.0));
    for p in [&paths[0], &paths[2]] {
        let (r, t) = run(p, &prompt);
        assert_eq!(r, rows, "{}: the same logits, bit for bit", p.display());
        assert_eq!(t, toks);
    }
}

/// A GGUF whose vocabulary names a pre-tokenizer with unknown split rules is refused before
/// any weight is read: its NaN weight (found when weights are read) is never reached.
#[test]
fn an_unknown_pre_tokenizer_is_refused_before_the_weights() {
    let d = tmp();
    let (mut kv, mut tensors) = llama_gguf();
    let tokens: Vec<String> = (0..320).map(|i| format!("t{i}")).collect();
    kv.push(("tokenizer.ggml.model", GgufValue::String("gpt2".into())));
    kv.push(("tokenizer.ggml.tokens", GgufValue::Array(GgufArray::String(tokens))));
    kv.push(("tokenizer.ggml.merges", GgufValue::Array(GgufArray::String(Vec::new()))));
    let t = tensors.iter_mut().find(|t| t.0 == "output_norm.weight").unwrap();
    t.3[..4].copy_from_slice(&f32::NAN.to_le_bytes());
    let with = |pre: &str| {
        let mut kv = kv.clone();
        kv.push(("tokenizer.ggml.pre", GgufValue::String(pre.into())));
        let p = write(d.path(), &format!("{pre}.gguf"), &unsplit(&kv, &tensors));
        Engine::load(&p, &EngineOptions::default()).err().map(|e| e.to_string()).unwrap_or_default()
    };
    let e = with("nonesuch");
    assert!(e.contains("unsupported GGUF pre-tokenizer \"nonesuch\"") && e.contains("kimi-k2"), "{e}");
    for known in ["gpt-4o", "deepseek-v3", "qwen2", "llama-bpe", "kimi-k2", "glm4"] {
        let e = with(known);
        assert!(e.contains("output_norm.weight") && e.contains("NaN"), "{known}: {e}");
    }
}
