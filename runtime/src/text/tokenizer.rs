//! [`Tokenizer`]: text to ids and back, for a Hugging Face `tokenizer.json` or a GGUF
//! vocabulary, with the BOS/EOS facts and the chat template that came with it.
//!
//! Encoding goes through the `tokenizers` crate for every byte-level BPE vocabulary (HF files,
//! and GGUF "gpt2" vocabularies assembled in `gguf.rs`) and through `spm.rs` for GGUF "llama"
//! vocabularies. Decoding is the same for all: each id's bytes (`pieces.rs`) concatenated.
//! Special tokens written in the input text (e.g. a chat template's `<|im_start|>`) always
//! encode to their single id. This type holds no model state and never panics on input.

use std::collections::BTreeSet;
use std::path::Path;

use super::chat::ChatTemplate;
use super::gguf::{gpt2_tokenizer, token_type, GgufVocab};
use super::hf::{decoder_spelling, HfSettings};
use super::pieces::{drain_utf8, Pieces, Spelling};
use super::spm::{SpecialSplitter, SpmModel};
use super::stream::StreamDecoder;
use super::{Result, TextError};

/// Special tokens that end a turn in common chat vocabularies; when one of them is a special
/// token of the vocabulary it joins the stop set (as llama.cpp does).
const END_OF_TURN_TEXTS: &[&str] = &[
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|end_of_text|>",
    "<｜end▁of▁sentence｜>",
];

enum Backend {
    /// Byte-level BPE through the `tokenizers` crate (HF files and GGUF "gpt2").
    Hf(Box<tokenizers::Tokenizer>),
    /// SentencePiece BPE (GGUF "llama").
    Spm { model: Box<SpmModel>, specials: SpecialSplitter },
}

/// A tokenizer with its BOS/EOS ids and chat template. See the module docs.
pub struct Tokenizer {
    backend: Backend,
    pieces: Pieces,
    special: Vec<bool>,
    bos: Option<u32>,
    eos: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    bos_text: String,
    eos_text: String,
    chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .field("has_chat_template", &self.chat_template.is_some())
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json` with the optional `tokenizer_config.json`,
    /// `generation_config.json`, `config.json` and chat template files next to it.
    pub fn from_hf_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let path = dir.join("tokenizer.json");
        super::hf::refuse_special(&path)?;
        let bytes = std::fs::read(&path).map_err(|source| TextError::Io { path: path.clone(), source })?;
        // The JSON's syntax is checked first: the tokenizers crate panics on a syntax error
        // inside the `decoder` object instead of returning it.
        serde_json::from_slice::<serde_json::Value>(&bytes)
            .map_err(|e| TextError::Tokenizers(format!("{}: {e}", path.display())))?;
        let tok = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| TextError::Tokenizers(format!("{}: {e}", path.display())))?;
        let settings = HfSettings::read(dir)?;
        let decoder = tok.get_decoder().and_then(|d| serde_json::to_value(d).ok());
        let (spelling, strip) = decoder_spelling(decoder.as_ref());

        // Ids come from the file: the largest is bounded before anything is sized by it, and only
        // the ids present are looked up (a vocabulary may have gaps).
        let vocab = tok.get_vocab(true);
        let n = vocab.values().map(|&id| id as usize + 1).max().unwrap_or(0);
        coli_compiler::limits::VOCAB
            .check(n)
            .map_err(|e| TextError::BadVocab(format!("{}: the largest token id + 1: {e}", path.display())))?;
        let mut tokens: Vec<Option<String>> = vec![None; n];
        for &id in vocab.values() {
            tokens[id as usize] = tok.id_to_token(id);
        }
        let pieces = Pieces::build(tokens.iter().map(|t| t.as_deref()), spelling, strip);
        let mut special = vec![false; n];
        for (id, added) in tok.get_added_tokens_decoder() {
            if added.special {
                if let Some(s) = special.get_mut(id as usize) {
                    *s = true;
                }
            }
        }

        let bos = settings.bos_token.as_deref().and_then(|t| tok.token_to_id(t)).or(settings.bos_id);
        let mut eos: BTreeSet<u32> = settings.eos_ids.iter().copied().collect();
        eos.extend(settings.eos_tokens.iter().filter_map(|t| tok.token_to_id(t)));
        let primary_eos =
            settings.eos_tokens.first().and_then(|t| tok.token_to_id(t)).or(settings.eos_ids.first().copied());
        let mut t = Tokenizer {
            backend: Backend::Hf(Box::new(tok)),
            pieces,
            special,
            bos,
            eos: Vec::new(),
            add_bos: settings.add_bos.unwrap_or(false),
            add_eos: settings.add_eos.unwrap_or(false),
            bos_text: settings.bos_token.clone().unwrap_or_default(),
            eos_text: settings.eos_tokens.first().cloned().unwrap_or_default(),
            chat_template: settings.chat_template,
        };
        t.finish_ids(eos, primary_eos);
        Ok(t)
    }

    /// Builds the tokenizer a GGUF file carries ("gpt2" byte-level BPE or "llama"
    /// SentencePiece).
    pub fn from_gguf_vocab(v: &GgufVocab) -> Result<Self> {
        v.validate()?;
        let n = v.tokens.len();
        let (backend, pieces, add_bos_default) = match v.model.as_str() {
            "gpt2" => {
                let tok = gpt2_tokenizer(v)?;
                let pieces = Pieces::build(v.tokens.iter().map(|t| Some(t.as_str())), Spelling::ByteLevel, false);
                (Backend::Hf(Box::new(tok)), pieces, false)
            }
            "llama" => {
                let space = v.add_space_prefix.unwrap_or(true);
                let byte_fallback = v.token_types.contains(&token_type::BYTE)
                    || v.tokens.iter().any(|t| super::pieces::parse_byte_token(t).is_some());
                let model = Box::new(SpmModel::new(&v.tokens, &v.scores, v.unk, space));
                let specials = SpecialSplitter::new(v.specials().map(|(id, t, _)| (t.to_string(), id)));
                let pieces = Pieces::build(
                    v.tokens.iter().map(|t| Some(t.as_str())),
                    Spelling::SentencePiece { byte_fallback },
                    space,
                );
                (Backend::Spm { model, specials }, pieces, true)
            }
            other => return Err(TextError::UnsupportedModel(other.to_string())),
        };
        let special = (0..n).map(|i| v.token_type(i) == token_type::CONTROL).collect();
        let text_of =
            |id: Option<u32>| id.map(|id| String::from_utf8_lossy(pieces.get(id)).into_owned()).unwrap_or_default();
        let (bos_text, eos_text) = (text_of(v.bos), text_of(v.eos));
        let mut t = Tokenizer {
            backend,
            pieces,
            special,
            bos: v.bos,
            eos: Vec::new(),
            add_bos: v.add_bos.unwrap_or(add_bos_default) && v.bos.is_some(),
            add_eos: v.add_eos && v.eos.is_some(),
            bos_text,
            eos_text,
            chat_template: v.chat_template.clone(),
        };
        t.finish_ids(v.eos.into_iter().chain(v.eot).collect(), v.eos);
        Ok(t)
    }

    /// Completes the stop set with the vocabulary's end-of-turn special tokens and fills in
    /// the BOS/EOS texts that no config spelled out.
    fn finish_ids(&mut self, mut eos: BTreeSet<u32>, primary_eos: Option<u32>) {
        for text in END_OF_TURN_TEXTS {
            if let Some(id) = self.token_to_id(text).filter(|&id| self.is_special(id)) {
                eos.insert(id);
            }
        }
        eos.retain(|&id| (id as usize) < self.vocab_size());
        self.eos = eos.into_iter().collect();
        if self.bos_text.is_empty() {
            if let Some(b) = self.bos {
                self.bos_text = String::from_utf8_lossy(self.pieces.get(b)).into_owned();
            }
        }
        if self.eos_text.is_empty() {
            if let Some(e) = primary_eos.or(self.eos.first().copied()) {
                self.eos_text = String::from_utf8_lossy(self.pieces.get(e)).into_owned();
            }
        }
    }

    /// Text to ids. Special tokens written in `text` become their ids. With `add_special`,
    /// BOS (and EOS) are added where the checkpoint asks for them.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            ids.extend(self.bos);
        }
        match &self.backend {
            Backend::Hf(tok) => {
                let enc = tok.encode_fast(text, add_special).map_err(|e| TextError::Tokenizers(e.to_string()))?;
                let got = enc.get_ids();
                // tokenizer.json's own post-processor may already have added BOS.
                let skip = usize::from(!ids.is_empty() && got.first() == self.bos.as_ref());
                ids.extend_from_slice(&got[skip..]);
            }
            Backend::Spm { model, specials } => model.encode_fragments(&specials.split(text), &mut ids),
        }
        if add_special && self.add_eos && ids.last() != self.eos_ids().first() {
            ids.extend(self.eos_ids().first());
        }
        Ok(ids)
    }

    /// Ids to text, special tokens included as written. Ids outside the vocabulary decode to
    /// nothing; bytes that are not UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.decode_with(ids, false)
    }

    /// Ids to text, leaving control tokens out when `skip_special`.
    pub fn decode_with(&self, ids: &[u32], skip_special: bool) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            if !(skip_special && self.is_special(id)) {
                bytes.extend_from_slice(self.pieces.get(id));
            }
        }
        if self.pieces.strip_leading_space && bytes.first() == Some(&b' ') {
            bytes.remove(0);
        }
        let mut out = String::with_capacity(bytes.len());
        drain_utf8(&mut bytes, &mut out);
        if !bytes.is_empty() {
            out.push('\u{FFFD}');
        }
        out
    }

    /// A decoder for ids arriving one at a time (see [`StreamDecoder`]).
    pub fn stream_decoder(&self, skip_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, skip_special)
    }

    /// The raw bytes token `id` stands for (empty outside the vocabulary).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.pieces.get(id)
    }

    /// The id of a vocabulary entry, written as the vocabulary writes it (`"Ġthe"`, `"▁the"`,
    /// `"<|im_end|>"`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        match &self.backend {
            Backend::Hf(tok) => tok.token_to_id(token),
            Backend::Spm { model, .. } => model.id(token),
        }
    }

    /// Whether `id` is a control token (BOS, EOS, `<|im_start|>`...).
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    /// The BOS id, if the checkpoint names one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// Whether `encode(_, true)` adds BOS.
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }

    /// Every id that ends generation: EOS, end-of-turn, and the configs' extra stop ids;
    /// sorted.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos
    }

    /// Whether `id` ends generation.
    pub fn is_eos(&self, id: u32) -> bool {
        self.eos.binary_search(&id).is_ok()
    }

    /// Number of ids (added tokens included).
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// The checkpoint's chat template source, if it ships one.
    pub fn chat_template_source(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The checkpoint's chat template; without one, ChatML when the vocabulary has its
    /// `<|im_start|>`/`<|im_end|>` tokens, else [`TextError::NoChatTemplate`].
    pub fn chat_template(&self) -> Result<ChatTemplate> {
        match &self.chat_template {
            Some(src) => ChatTemplate::new(src, &self.bos_text, &self.eos_text),
            None if self.token_to_id("<|im_start|>").is_some() && self.token_to_id("<|im_end|>").is_some() => {
                ChatTemplate::chatml(&self.bos_text, &self.eos_text)
            }
            None => Err(TextError::NoChatTemplate),
        }
    }

    pub(crate) fn pieces(&self) -> &Pieces {
        &self.pieces
    }
}
