//! Tokenizer, chat-template and streaming tests against references written by
//! `tools/make_tokenizer_fixtures.py` (Python `tokenizers`, transformers, Jinja2, sentencepiece).
//!
//! The SmolLM2 GGUF and the pymoe-22m directory are read when present; a test whose input is
//! absent prints a note and passes. The GGUF's metadata is read by the small test-only parser
//! below (the runtime's own GGUF reader lives in `coli_runtime::model`), which must not be
//! used outside these tests.

use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::path::PathBuf;

use coli_runtime::text::{ChatMessage, ChatTemplate, GgufKv, GgufVocab, StopMatcher, TextError, Tokenizer};
use serde_json::Value;

fn data(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn smollm2_path() -> Option<PathBuf> {
    let p = match std::env::var_os("COLI_SMOLLM2_GGUF") {
        Some(p) => PathBuf::from(p),
        None => {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            cache.join("coli/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")
        }
    };
    if p.is_file() {
        Some(p)
    } else {
        eprintln!("note: {} is absent (tools/fetch-model.sh fetches it); skipping", p.display());
        None
    }
}

fn pymoe_dir() -> Option<PathBuf> {
    let p =
        std::env::var_os("COLI_PYMOE_DIR").map(PathBuf::from).unwrap_or_else(|| "/work/shared/models/pymoe-22m".into());
    if p.join("tokenizer.json").is_file() {
        Some(p)
    } else {
        eprintln!("note: {} has no tokenizer.json; skipping", p.display());
        None
    }
}

// ---- a minimal GGUF metadata reader, for these tests only ----

#[derive(Debug, Clone)]
enum Kv {
    Int(i128),
    F64(f64),
    Bool(bool),
    Str(String),
    Arr(Vec<Kv>),
}

struct Meta(HashMap<String, Kv>);

fn read_gguf_meta(path: &PathBuf) -> Meta {
    let mut r = BufReader::new(std::fs::File::open(path).unwrap());
    let mut b4 = [0u8; 4];
    r.read_exact(&mut b4).unwrap();
    assert_eq!(&b4, b"GGUF");
    let u32_ = |r: &mut BufReader<std::fs::File>| {
        let mut b = [0u8; 4];
        r.read_exact(&mut b).unwrap();
        u32::from_le_bytes(b)
    };
    let u64_ = |r: &mut BufReader<std::fs::File>| {
        let mut b = [0u8; 8];
        r.read_exact(&mut b).unwrap();
        u64::from_le_bytes(b)
    };
    let version = u32_(&mut r);
    assert!(version >= 2, "GGUF v{version}");
    let _tensors = u64_(&mut r);
    let kvs = u64_(&mut r);
    fn string(r: &mut BufReader<std::fs::File>) -> String {
        let mut b = [0u8; 8];
        r.read_exact(&mut b).unwrap();
        let mut s = vec![0u8; u64::from_le_bytes(b) as usize];
        r.read_exact(&mut s).unwrap();
        String::from_utf8(s).unwrap()
    }
    fn value(r: &mut BufReader<std::fs::File>, ty: u32) -> Kv {
        let mut raw = |n: usize| {
            let mut b = vec![0u8; n];
            r.read_exact(&mut b).unwrap();
            b
        };
        match ty {
            0 => Kv::Int(raw(1)[0] as i128),
            1 => Kv::Int(raw(1)[0] as i8 as i128),
            2 => Kv::Int(u16::from_le_bytes(raw(2).try_into().unwrap()) as i128),
            3 => Kv::Int(i16::from_le_bytes(raw(2).try_into().unwrap()) as i128),
            4 => Kv::Int(u32::from_le_bytes(raw(4).try_into().unwrap()) as i128),
            5 => Kv::Int(i32::from_le_bytes(raw(4).try_into().unwrap()) as i128),
            6 => Kv::F64(f32::from_le_bytes(raw(4).try_into().unwrap()) as f64),
            7 => Kv::Bool(raw(1)[0] != 0),
            8 => Kv::Str(string(r)),
            9 => {
                let ety = u32::from_le_bytes(raw(4).try_into().unwrap());
                let n = u64::from_le_bytes(raw(8).try_into().unwrap());
                Kv::Arr((0..n).map(|_| value(r, ety)).collect())
            }
            10 => Kv::Int(u64::from_le_bytes(raw(8).try_into().unwrap()) as i128),
            11 => Kv::Int(i64::from_le_bytes(raw(8).try_into().unwrap()) as i128),
            12 => Kv::F64(f64::from_le_bytes(raw(8).try_into().unwrap())),
            t => panic!("GGUF value type {t}"),
        }
    }
    let mut map = HashMap::new();
    for _ in 0..kvs {
        let key = string(&mut r);
        let ty = u32_(&mut r);
        map.insert(key, value(&mut r, ty));
    }
    Meta(map)
}

impl GgufKv for Meta {
    fn get_str(&self, key: &str) -> Option<String> {
        match self.0.get(key)? {
            Kv::Str(s) => Some(s.clone()),
            _ => None,
        }
    }
    fn get_u64(&self, key: &str) -> Option<u64> {
        match self.0.get(key)? {
            Kv::Int(i) => u64::try_from(*i).ok(),
            _ => None,
        }
    }
    fn get_bool(&self, key: &str) -> Option<bool> {
        match self.0.get(key)? {
            Kv::Bool(b) => Some(*b),
            _ => None,
        }
    }
    fn get_str_array(&self, key: &str) -> Option<Vec<String>> {
        match self.0.get(key)? {
            Kv::Arr(a) => a.iter().map(|v| if let Kv::Str(s) = v { Some(s.clone()) } else { None }).collect(),
            _ => None,
        }
    }
    fn get_i64_array(&self, key: &str) -> Option<Vec<i64>> {
        match self.0.get(key)? {
            Kv::Arr(a) => a.iter().map(|v| if let Kv::Int(i) = v { i64::try_from(*i).ok() } else { None }).collect(),
            _ => None,
        }
    }
    fn get_f32_array(&self, key: &str) -> Option<Vec<f32>> {
        match self.0.get(key)? {
            Kv::Arr(a) => a.iter().map(|v| if let Kv::F64(f) = v { Some(*f as f32) } else { None }).collect(),
            _ => None,
        }
    }
}

fn smollm2() -> Option<Tokenizer> {
    let meta = read_gguf_meta(&smollm2_path()?);
    let vocab = GgufVocab::from_kv(&meta).unwrap();
    Some(Tokenizer::from_gguf_vocab(&vocab).unwrap())
}

/// Decodes ids one at a time; every chunk is whole UTF-8 by construction (a `String`).
fn stream(tok: &Tokenizer, ids: &[u32], skip_special: bool) -> String {
    let mut d = tok.stream_decoder(skip_special);
    let mut out: String = ids.iter().map(|&id| d.push(id)).collect();
    out += &d.finish();
    out
}

fn messages(v: &Value) -> Vec<ChatMessage> {
    serde_json::from_value(v.clone()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).unwrap()
}

// ---- SmolLM2 (GGUF vocabulary) ----

#[test]
fn smollm2_ids_match_reference() {
    let Some(tok) = smollm2() else { return };
    let fx = data("smollm2_tokenizer.json");
    assert_eq!(tok.vocab_size() as u64, fx["vocab_size"].as_u64().unwrap());
    assert_eq!(tok.bos(), Some(1));
    assert!(!tok.adds_bos());
    assert_eq!(tok.eos_ids(), &[0, 2], "<|endoftext|> and <|im_end|>");
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(1));
    assert_eq!(tok.token_to_id("Ġthe"), Some(260));
    let mut failures = Vec::new();
    for case in fx["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        let got = tok.encode(text, true).unwrap();
        if got != want {
            failures.push(format!("{text:?}\n  want {want:?}\n  got  {got:?}"));
        }
        let decoded = case["decoded"].as_str().unwrap();
        assert_eq!(tok.decode(&want), decoded);
        assert_eq!(stream(&tok, &want, false), decoded);
        // transformers' GGUF loader differs only where the digit split matters.
        if case.get("ids_transformers_gguf").is_some() {
            assert!(text.chars().any(char::is_numeric), "{text:?}");
        }
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn smollm2_chat_template_matches_transformers() {
    let Some(tok) = smollm2() else { return };
    let fx = data("smollm2_tokenizer.json");
    assert_eq!(tok.chat_template_source(), fx["chat_template"].as_str());
    let tmpl = tok.chat_template().unwrap();
    for chat in fx["chats"].as_array().unwrap() {
        let msgs = messages(&chat["messages"]);
        let gen = chat["add_generation_prompt"].as_bool().unwrap();
        let text = tmpl.render(&msgs, gen).unwrap();
        assert_eq!(text, chat["rendered"].as_str().unwrap());
        assert_eq!(tok.encode(&text, true).unwrap(), ids(&chat["ids"]));
    }
}

#[test]
fn smollm2_stream_holds_split_characters() {
    let Some(tok) = smollm2() else { return };
    let ids = tok.encode("a😀b", false).unwrap();
    assert!(ids.len() > 3, "the emoji spans several byte tokens: {ids:?}");
    let mut d = tok.stream_decoder(false);
    let chunks: Vec<String> = ids.iter().map(|&id| d.push(id)).collect();
    assert_eq!(chunks.first().map(String::as_str), Some("a"));
    assert_eq!(chunks.iter().filter(|c| c.contains('😀')).count(), 1);
    assert_eq!(chunks.concat(), "a😀b");
    // Control tokens are dropped when asked.
    let ids = tok.encode("<|im_start|>assistant\nHi<|im_end|>", false).unwrap();
    assert_eq!(stream(&tok, &ids, true), "assistant\nHi");
    assert_eq!(tok.decode_with(&ids, true), "assistant\nHi");
}

// ---- pymoe-22m (HF tokenizer.json) ----

#[test]
fn pymoe_ids_match_reference() {
    let Some(dir) = pymoe_dir() else { return };
    let tok = Tokenizer::from_hf_dir(&dir).unwrap();
    let fx = data("pymoe22m_tokenizer.json");
    assert_eq!(tok.vocab_size() as u64, fx["vocab_size"].as_u64().unwrap());
    assert_eq!(tok.eos_ids(), &[0]);
    assert_eq!(tok.bos(), Some(0));
    for case in fx["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        assert_eq!(tok.encode(text, true).unwrap(), want, "{text:?}");
        assert_eq!(tok.decode(&want), case["decoded"].as_str().unwrap());
        assert_eq!(stream(&tok, &want, false), case["decoded"].as_str().unwrap());
    }
    assert!(matches!(tok.chat_template(), Err(TextError::NoChatTemplate)));
}

// ---- a SentencePiece BPE model (trained by the fixture script) as a GGUF "llama" vocab ----

#[test]
fn sentencepiece_ids_match_reference() {
    let fx = data("spm_tokenizer.json");
    let id = |k: &str| fx[k].as_u64().map(|v| v as u32);
    let v = GgufVocab {
        model: "llama".into(),
        tokens: serde_json::from_value(fx["tokens"].clone()).unwrap(),
        scores: serde_json::from_value(fx["scores"].clone()).unwrap(),
        token_types: serde_json::from_value(fx["token_types"].clone()).unwrap(),
        bos: id("bos"),
        eos: id("eos"),
        unk: id("unk"),
        ..Default::default()
    };
    let tok = Tokenizer::from_gguf_vocab(&v).unwrap();
    assert!(tok.adds_bos(), "llama vocabularies add BOS unless the GGUF says otherwise");
    let mut failures = Vec::new();
    for case in fx["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        let got = tok.encode(text, false).unwrap();
        if got != want {
            failures.push(format!("{text:?}\n  want {want:?}\n  got  {got:?}"));
        }
        let decoded = case["decoded"].as_str().unwrap();
        assert_eq!(tok.decode(&want), decoded, "{text:?}");
        assert_eq!(stream(&tok, &want, false), decoded, "{text:?}");
        let mut with_bos = vec![id("bos").unwrap()];
        with_bos.extend(&want);
        assert_eq!(tok.encode(text, true).unwrap(), with_bos);
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

/// A hand-written HF directory: byte-level `tokenizer.json` with a BOS/EOS pair, a
/// `tokenizer_config.json` with a named-template list and `add_bos_token`, and a
/// `generation_config.json` whose `eos_token_id` is a list.
#[test]
fn hf_dir_configs_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let mut vocab = serde_json::Map::new();
    for (i, t) in ["<s>", "</s>", "<|eot|>", "h", "i", "Ġ", "hi", "Ġhi"].iter().enumerate() {
        vocab.insert(t.to_string(), i.into());
    }
    let added = |id: u32, content: &str| {
        serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                           "rstrip": false, "normalized": false, "special": true})
    };
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [added(0, "<s>"), added(1, "</s>"), added(2, "<|eot|>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": [["h", "i"], ["Ġ", "hi"]]}
    });
    let config = serde_json::json!({
        "bos_token": "<s>",
        "eos_token": {"content": "</s>", "special": true},
        "add_bos_token": true,
        "chat_template": [
            {"name": "tool_use", "template": "TOOLS"},
            {"name": "default", "template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"}
        ]
    });
    let write = |name: &str, v: &Value| std::fs::write(dir.path().join(name), v.to_string()).unwrap();
    write("tokenizer.json", &tokenizer);
    write("tokenizer_config.json", &config);
    write("generation_config.json", &serde_json::json!({"eos_token_id": [1, 2]}));
    let tok = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert_eq!(tok.vocab_size(), 8);
    assert_eq!((tok.bos(), tok.adds_bos()), (Some(0), true));
    assert_eq!(tok.eos_ids(), &[1, 2]);
    assert_eq!(tok.encode("hi hi", true).unwrap(), vec![0, 6, 7]);
    assert_eq!(tok.encode("hi</s>", false).unwrap(), vec![6, 1]);
    assert_eq!(tok.decode_with(&[0, 6, 7, 1], true), "hi hi");
    let text = tok.chat_template().unwrap().render(&[ChatMessage::user("hi")], true).unwrap();
    assert_eq!(text, "<s>hi</s>");
    // A chat_template.jinja file takes precedence over tokenizer_config.json.
    std::fs::write(dir.path().join("chat_template.jinja"), "[{{ messages[0].content }}]\n").unwrap();
    let tok = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert_eq!(tok.chat_template().unwrap().render(&[ChatMessage::user("x")], false).unwrap(), "[x]");
    // A malformed config is an error, not silently ignored.
    std::fs::write(dir.path().join("generation_config.json"), "{").unwrap();
    assert!(matches!(Tokenizer::from_hf_dir(dir.path()), Err(TextError::Json { .. })));
    assert!(matches!(Tokenizer::from_hf_dir(dir.path().join("missing")), Err(TextError::Io { .. })));
}

#[test]
fn text_types_are_thread_safe() {
    fn check<T: Send + Sync>() {}
    check::<Tokenizer>();
    check::<ChatTemplate>();
    check::<coli_runtime::sample::Sampler>();
}

/// Deterministic pseudo-random strings mixing ASCII, whitespace, accents, CJK, emoji and
/// pieces of special tokens.
fn random_texts(n: usize) -> Vec<String> {
    let alphabet: Vec<&str> = vec![
        "a",
        "b",
        "Z",
        " ",
        "  ",
        "\n",
        "\t",
        "\r\n",
        "0",
        "7",
        "42",
        ".",
        ",",
        "'s",
        "'",
        "\"",
        "<",
        "|",
        ">",
        "<|",
        "im_",
        "end",
        "é",
        "ß",
        "Ω",
        "語",
        "😀",
        "👍🏽",
        "\u{200b}",
        "\u{301}",
        "½",
        "<s>",
        "</s>",
        "<|im_end|>",
        "hello",
        "▁",
        "Ġ",
        "\u{0}",
        "\u{7f}",
    ];
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..n)
        .map(|_| {
            let len = (next() % 24) as usize;
            (0..len).map(|_| alphabet[(next() % alphabet.len() as u64) as usize]).collect()
        })
        .collect()
}

#[test]
fn encode_decode_round_trips() {
    let fx = data("spm_tokenizer.json");
    let v = GgufVocab {
        model: "llama".into(),
        tokens: serde_json::from_value(fx["tokens"].clone()).unwrap(),
        scores: serde_json::from_value(fx["scores"].clone()).unwrap(),
        token_types: serde_json::from_value(fx["token_types"].clone()).unwrap(),
        bos: Some(1),
        eos: Some(2),
        unk: Some(0),
        ..Default::default()
    };
    let mut toks = vec![("spm", Tokenizer::from_gguf_vocab(&v).unwrap()), ("tiny-gpt2", tiny_gpt2())];
    toks.extend(smollm2().map(|t| ("smollm2", t)));
    for (name, tok) in &toks {
        for text in random_texts(400) {
            // llama.cpp (and this encoder) give the text after a special token its own space
            // prefix, which decoding keeps: "<s>7" comes back as "<s> 7". A literal "▁" is
            // SentencePiece's space symbol and comes back as a space.
            if *name == "spm" && (text.contains("<s>") || text.contains("</s>") || text.contains('▁')) {
                continue;
            }
            let ids = tok.encode(&text, false).unwrap();
            assert_eq!(tok.decode(&ids), text, "{name}: {text:?} -> {ids:?}");
            assert_eq!(stream(tok, &ids, false), text, "{name}: {text:?}");
        }
    }
}

// ---- chat templates, without any checkpoint ----

#[test]
fn templates_render_like_jinja2() {
    let fx = data("chat_templates.json");
    for r in fx["renderings"].as_array().unwrap() {
        let name = r["name"].as_str().unwrap();
        let t = ChatTemplate::new(r["template"].as_str().unwrap(), "<s>", "</s>").unwrap();
        let got = t.render(&messages(&r["messages"]), r["add_generation_prompt"].as_bool().unwrap());
        assert_eq!(got.unwrap(), r["rendered"].as_str().unwrap(), "template {name}");
    }
}

// ---- small hand-made vocabularies, without any checkpoint ----

/// A byte-level vocabulary: the 256 byte characters, a few merges, two control tokens.
fn tiny_gpt2() -> Tokenizer {
    let mut tokens: Vec<String> = vec!["<|endoftext|>".into(), "<|im_end|>".into()];
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut shifted = 0;
    for b in 0..=255u8 {
        let c = if printable(b) {
            b as char
        } else {
            shifted += 1;
            char::from_u32(255 + shifted).unwrap()
        };
        tokens.push(c.to_string());
    }
    let merges = vec!["Ġ h".to_string(), "Ġh i".to_string()];
    tokens.push("Ġh".into());
    tokens.push("Ġhi".into());
    let n = tokens.len();
    let mut token_types = vec![1; n];
    token_types[0] = 3;
    token_types[1] = 3;
    let v = GgufVocab {
        model: "gpt2".into(),
        pre: Some("smollm".into()),
        tokens,
        token_types,
        merges,
        eos: Some(1),
        ..Default::default()
    };
    Tokenizer::from_gguf_vocab(&v).unwrap()
}

#[test]
fn tiny_byte_level_vocab() {
    let tok = tiny_gpt2();
    let hi = tok.token_to_id("Ġhi").unwrap();
    let ids = tok.encode("a hi<|im_end|>", true).unwrap();
    assert_eq!(ids, vec![tok.token_to_id("a").unwrap(), hi, 1]);
    assert_eq!(tok.decode(&ids), "a hi<|im_end|>");
    assert_eq!(tok.eos_ids(), &[0, 1]);
    // "é" is two byte tokens: nothing comes out until the second one.
    let ids = tok.encode("é", false).unwrap();
    assert_eq!(ids.len(), 2);
    let mut d = tok.stream_decoder(false);
    assert_eq!(d.push(ids[0]), "");
    assert!(d.has_pending());
    assert_eq!(d.push(ids[1]), "é");
    // A character cut off at the end decodes to U+FFFD, never a panic; unknown ids to nothing.
    assert_eq!(tok.decode(&ids[..1]), "\u{FFFD}");
    assert_eq!(stream(&tok, &ids[..1], false), "\u{FFFD}");
    assert_eq!(tok.decode(&[999_999]), "");
    // ChatML fallback: this vocabulary has <|im_end|> but no <|im_start|>.
    assert!(matches!(tok.chat_template(), Err(TextError::NoChatTemplate)));
}

#[test]
fn tiny_sentencepiece_vocab() {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    for b in 0..=255u32 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    let mut scores = vec![0.0; tokens.len()];
    for (w, s) in [("▁", -1.0), ("h", -2.0), ("i", -2.0), ("▁h", -3.0), ("▁hi", -4.0)] {
        tokens.push(w.into());
        types.push(1);
        scores.push(s);
    }
    let v = GgufVocab {
        model: "llama".into(),
        tokens,
        token_types: types,
        scores,
        bos: Some(1),
        eos: Some(2),
        unk: Some(0),
        chat_template: Some(
            "{% for m in messages %}{{ bos_token }}[{{ m.content }}]{{ eos_token }}{% endfor %}".into(),
        ),
        ..Default::default()
    };
    let tok = Tokenizer::from_gguf_vocab(&v).unwrap();
    assert!(tok.adds_bos());
    let ids = tok.encode("hi hi", true).unwrap();
    let hi = tok.token_to_id("▁hi").unwrap();
    assert_eq!(ids, vec![1, hi, hi]);
    // The leading space the encoder added is dropped again; "<s>" is shown unless skipped.
    assert_eq!(tok.decode_with(&ids, true), "hi hi");
    assert_eq!(tok.decode(&ids), "<s> hi hi");
    assert_eq!(stream(&tok, &ids, true), "hi hi");
    // "€" is not in the vocabulary: three byte-fallback tokens, streamed as one character.
    let ids = tok.encode("€", false).unwrap();
    assert_eq!(ids.len(), 4, "▁ and three bytes: {ids:?}");
    assert_eq!(stream(&tok, &ids, false), "€");
    let t = tok.chat_template().unwrap();
    assert_eq!(t.render(&[ChatMessage::user("x")], false).unwrap(), "<s>[x]</s>");
}

#[test]
fn unsupported_vocabularies_are_errors() {
    let v = GgufVocab { model: "bert".into(), tokens: vec!["a".into()], ..Default::default() };
    assert!(matches!(Tokenizer::from_gguf_vocab(&v), Err(TextError::UnsupportedModel(_))));
    let v =
        GgufVocab { model: "gpt2".into(), pre: Some("mystery".into()), tokens: vec!["a".into()], ..Default::default() };
    assert!(matches!(Tokenizer::from_gguf_vocab(&v), Err(TextError::UnsupportedPreTokenizer(_))));
    let v = GgufVocab { model: "gpt2".into(), tokens: vec![], ..Default::default() };
    assert!(matches!(Tokenizer::from_gguf_vocab(&v), Err(TextError::BadVocab(_))));
}

#[test]
fn stop_matcher_over_a_stream() {
    let mut m = StopMatcher::new(["<|im_end|>", "\n\nUser:"]);
    let mut shown = String::new();
    for piece in ["Sure", ".\n", "\nUs", "er", ": hi"] {
        let step = m.push(piece);
        shown += &step.text;
        if step.stopped {
            break;
        }
    }
    assert_eq!(shown, "Sure.");
    assert!(m.stopped());
}

/// A syntax error inside `decoder` is an error naming the file (the tokenizers crate panics on
/// it when handed the bytes unchecked).
#[test]
fn malformed_decoder_json_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fuzz/corpus/tokenizer/bpe_byte_level.json"),
    )
    .unwrap();
    assert!(good.contains("\"decoder\": {"));
    let bad = good.replacen("\"decoder\": {", "\"decoder\": {\"type\": \"Byte\u{1}Level\",", 1);
    std::fs::write(dir.path().join("tokenizer.json"), bad).unwrap();
    let err = Tokenizer::from_hf_dir(dir.path()).unwrap_err().to_string();
    assert!(err.contains("tokenizer.json") && err.contains("control character"), "{err}");
    std::fs::write(dir.path().join("tokenizer.json"), good).unwrap();
    assert!(Tokenizer::from_hf_dir(dir.path()).is_ok());
}

/// A FIFO where tokenizer.json or a settings file should be is refused at once (reading it
/// would block forever).
#[test]
fn tokenizer_files_that_are_fifos_are_refused() {
    let good = std::fs::read(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fuzz/corpus/tokenizer/bpe_byte_level.json"),
    )
    .unwrap();
    for name in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"] {
        let dir = tempfile::tempdir().unwrap();
        if name != "tokenizer.json" {
            std::fs::write(dir.path().join("tokenizer.json"), &good).unwrap();
        }
        let fifo = dir.path().join(name);
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let err = Tokenizer::from_hf_dir(dir.path()).unwrap_err().to_string();
        assert!(err.contains(name) && err.contains("not a regular file"), "{name}: {err}");
    }
}

/// A token id far past the vocabulary's size is refused instead of sizing tables by it, and a
/// vocabulary with a gap in its ids loads with the gap decoding to nothing.
#[test]
fn a_huge_token_id_is_refused_and_a_gap_is_harmless() {
    let good = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fuzz/corpus/tokenizer/bpe_byte_level.json"),
    )
    .unwrap();
    assert!(good.contains("\"\\u0120a\": 15"));
    let dir = tempfile::tempdir().unwrap();
    let huge = good.replacen("\"\\u0120a\": 15", "\"\\u0120a\": 184467440", 1);
    std::fs::write(dir.path().join("tokenizer.json"), huge).unwrap();
    let err = Tokenizer::from_hf_dir(dir.path()).unwrap_err().to_string();
    assert!(err.contains("largest token id") && err.contains("past the limit"), "{err}");
    let gap = good.replacen("\"\\u0120a\": 15", "\"\\u0120a\": 40", 1);
    std::fs::write(dir.path().join("tokenizer.json"), gap).unwrap();
    let tok = Tokenizer::from_hf_dir(dir.path()).unwrap();
    let ids = tok.encode("ab a", false).unwrap();
    assert!(ids.contains(&40), "{ids:?}");
    assert_eq!(tok.decode(&ids), "ab a");
}
