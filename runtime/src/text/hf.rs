//! What a Hugging Face checkpoint directory says about its tokenizer beyond `tokenizer.json`:
//! BOS/EOS tokens and whether to add BOS (`tokenizer_config.json`), the stop ids
//! (`generation_config.json`, `config.json`), and the chat template (`chat_template.jinja`,
//! `tokenizer_config.json`'s `chat_template`, or `chat_template.json`).
//!
//! Every file is optional; a file that exists but is malformed is an error (a silently
//! ignored config would change what the model sees). This file reads JSON only; it does not
//! build tokenizers and does not touch weights.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::pieces::Spelling;
use super::{Result, TextError};

/// The tokenizer-related settings of an HF checkpoint directory.
#[derive(Debug, Clone, Default)]
pub(crate) struct HfSettings {
    pub bos_token: Option<String>,
    pub eos_tokens: Vec<String>,
    pub bos_id: Option<u32>,
    pub eos_ids: Vec<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub chat_template: Option<String>,
}

/// Refuses a path that exists but is not a regular file (a FIFO would block the read forever,
/// a device would never end); a missing path is left to the read.
pub(crate) fn refuse_special(path: &Path) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => Err(TextError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::other("not a regular file (a FIFO, a device or a directory)"),
        }),
        _ => Ok(()),
    }
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    refuse_special(path)?;
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(TextError::Io { path: path.to_path_buf(), source }),
    };
    serde_json::from_str(&text).map(Some).map_err(|source| TextError::Json { path: path.to_path_buf(), source })
}

/// A token written as a string or as an `AddedToken` object `{ "content": ... }`.
fn token_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

/// An id written as a number or a list of numbers (`eos_token_id` may be either).
fn ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().and_then(|n| u32::try_from(n).ok()).into_iter().collect(),
        Some(Value::Array(a)) => a.iter().flat_map(|x| ids(Some(x))).collect(),
        _ => Vec::new(),
    }
}

/// `chat_template` may be a string or a list of `{ name, template }` (the "default" one wins).
fn template_of(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => {
            let named = |want: &str| list.iter().find(|e| e.get("name").and_then(Value::as_str) == Some(want));
            named("default")
                .or_else(|| list.first())
                .and_then(|e| e.get("template"))
                .and_then(Value::as_str)
                .map(str::to_string)
        }
        _ => None,
    }
}

impl HfSettings {
    /// Reads the optional config files of `dir`.
    pub(crate) fn read(dir: &Path) -> Result<Self> {
        let mut s = HfSettings::default();
        if let Some(tc) = read_json(&dir.join("tokenizer_config.json"))? {
            s.bos_token = tc.get("bos_token").and_then(token_text);
            s.eos_tokens.extend(tc.get("eos_token").and_then(token_text));
            s.add_bos = tc.get("add_bos_token").and_then(Value::as_bool);
            s.add_eos = tc.get("add_eos_token").and_then(Value::as_bool);
            s.chat_template = template_of(tc.get("chat_template"));
        }
        if s.chat_template.is_none() {
            if let Some(ct) = read_json(&dir.join("chat_template.json"))? {
                s.chat_template = template_of(ct.get("chat_template"));
            }
        }
        let jinja: PathBuf = dir.join("chat_template.jinja");
        refuse_special(&jinja)?;
        match std::fs::read_to_string(&jinja) {
            Ok(t) => s.chat_template = Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(TextError::Io { path: jinja, source }),
        }
        // generation_config.json is what HF generation stops on; config.json is the fallback.
        for file in ["generation_config.json", "config.json"] {
            if let Some(c) = read_json(&dir.join(file))? {
                if s.eos_ids.is_empty() {
                    s.eos_ids = ids(c.get("eos_token_id"));
                }
                if s.bos_id.is_none() {
                    s.bos_id = ids(c.get("bos_token_id")).first().copied();
                }
            }
        }
        Ok(s)
    }
}

/// How `tokenizer.json`'s decoder spells bytes, read from its serialized form: byte-level,
/// SentencePiece-like (`▁` replaced by a space, byte fallback, a leading space stripped), or
/// plain. Anything else (WordPiece, CTC...) is treated as plain text, an approximation.
pub(crate) fn decoder_spelling(decoder: Option<&Value>) -> (Spelling, bool) {
    let Some(d) = decoder else {
        return (Spelling::Plain, false);
    };
    let mut kinds = Vec::new();
    collect_decoders(d, &mut kinds);
    let has = |t: &str| kinds.iter().any(|k| k.get("type").and_then(Value::as_str) == Some(t));
    if has("ByteLevel") {
        return (Spelling::ByteLevel, false);
    }
    let metaspace = kinds.iter().find(|k| k.get("type").and_then(Value::as_str) == Some("Metaspace"));
    let replaces_meta = kinds.iter().any(|k| {
        k.get("type").and_then(Value::as_str) == Some("Replace")
            && k.pointer("/pattern/String").and_then(Value::as_str) == Some("\u{2581}")
    });
    if metaspace.is_some() || replaces_meta {
        let strip = kinds.iter().any(|k| {
            k.get("type").and_then(Value::as_str) == Some("Strip")
                && k.get("start").and_then(Value::as_u64).unwrap_or(0) > 0
        }) || metaspace.is_some_and(|m| {
            m.get("prepend_scheme").and_then(Value::as_str).unwrap_or("always") != "never"
                || m.get("add_prefix_space").and_then(Value::as_bool).unwrap_or(false)
        });
        return (Spelling::SentencePiece { byte_fallback: has("ByteFallback") }, strip);
    }
    (Spelling::Plain, false)
}

fn collect_decoders<'a>(d: &'a Value, out: &mut Vec<&'a Value>) {
    match d.get("decoders").and_then(Value::as_array) {
        Some(list) => list.iter().for_each(|x| collect_decoders(x, out)),
        None => out.push(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn decoder_kinds() {
        assert_eq!(decoder_spelling(Some(&json!({"type": "ByteLevel"}))), (Spelling::ByteLevel, false));
        let llama2 = json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]});
        assert_eq!(decoder_spelling(Some(&llama2)), (Spelling::SentencePiece { byte_fallback: true }, true));
        assert_eq!(decoder_spelling(None), (Spelling::Plain, false));
        assert_eq!(decoder_spelling(Some(&json!({"type": "WordPiece"}))), (Spelling::Plain, false));
    }

    #[test]
    fn config_shapes() {
        assert_eq!(ids(Some(&json!([2, 32000]))), vec![2, 32000]);
        assert_eq!(ids(Some(&json!(7))), vec![7]);
        assert_eq!(token_text(&json!({"content": "<s>", "special": true})), Some("<s>".into()));
        let list = json!([{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]);
        assert_eq!(template_of(Some(&list)), Some("D".into()));
    }
}
