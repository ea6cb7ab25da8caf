//! A GGUF file's own vocabulary (`tokenizer.ggml.*` keys) as a plain struct, and the
//! byte-level BPE tokenizer assembled from it for `tokenizer.ggml.model = "gpt2"`.
//!
//! This file does not parse GGUF files: the checkpoint reader (`crate::model`) owns that and
//! hands the keys over through the small [`GgufKv`] trait (or fills [`GgufVocab`] directly).
//! Pre-tokenizer names are mapped to split rules only where the rules are known; an unknown
//! name is an error rather than a silent guess, since a wrong split changes every prompt.

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use super::{Result, TextError};

/// `tokenizer.ggml.token_type` values (llama.cpp's numbering).
pub(crate) mod token_type {
    pub const NORMAL: i32 = 1;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const BYTE: i32 = 6;
}

/// The `tokenizer.*` metadata of a GGUF file, decoded.
#[derive(Debug, Clone, Default)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: "gpt2" (byte-level BPE) or "llama" (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: names the pre-tokenizer split rules of "gpt2" vocabularies.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, indexed by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type` (1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte);
    /// empty means all normal.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges`, "left right" by rank ("gpt2" only).
    pub merges: Vec<String>,
    /// `tokenizer.ggml.scores` ("llama" only; empty means all zero).
    pub scores: Vec<f32>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`: end of turn, also a stop token.
    pub eot: Option<u32>,
    pub unk: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`; `None` takes the model's default (llama: yes, gpt2: no).
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: bool,
    /// `tokenizer.ggml.add_space_prefix`; `None` takes the model's default (llama: yes).
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
}

/// Read access to GGUF metadata, by key. The checkpoint reader implements this for its
/// metadata type; a missing key or a value of another type is `None`.
pub trait GgufKv {
    fn get_str(&self, key: &str) -> Option<String>;
    fn get_u64(&self, key: &str) -> Option<u64>;
    fn get_bool(&self, key: &str) -> Option<bool>;
    fn get_str_array(&self, key: &str) -> Option<Vec<String>>;
    fn get_i64_array(&self, key: &str) -> Option<Vec<i64>>;
    fn get_f32_array(&self, key: &str) -> Option<Vec<f32>>;
}

impl GgufVocab {
    /// Collects the `tokenizer.*` keys. Fails only when `tokenizer.ggml.model` or
    /// `tokenizer.ggml.tokens` is missing or an id key does not fit in 32 bits.
    pub fn from_kv(kv: &impl GgufKv) -> Result<Self> {
        let need = |k: &str| TextError::BadVocab(format!("GGUF metadata has no {k}"));
        let id = |k: &str| -> Result<Option<u32>> {
            kv.get_u64(k)
                .map(|v| u32::try_from(v).map_err(|_| TextError::BadVocab(format!("{k} = {v} is out of range"))))
                .transpose()
        };
        let token_types = kv
            .get_i64_array("tokenizer.ggml.token_type")
            .unwrap_or_default()
            .into_iter()
            .map(|t| i32::try_from(t).unwrap_or(token_type::NORMAL))
            .collect();
        Ok(GgufVocab {
            model: kv.get_str("tokenizer.ggml.model").ok_or_else(|| need("tokenizer.ggml.model"))?,
            pre: kv.get_str("tokenizer.ggml.pre"),
            tokens: kv.get_str_array("tokenizer.ggml.tokens").ok_or_else(|| need("tokenizer.ggml.tokens"))?,
            token_types,
            merges: kv.get_str_array("tokenizer.ggml.merges").unwrap_or_default(),
            scores: kv.get_f32_array("tokenizer.ggml.scores").unwrap_or_default(),
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            eot: id("tokenizer.ggml.eot_token_id")?,
            unk: id("tokenizer.ggml.unknown_token_id")?,
            add_bos: kv.get_bool("tokenizer.ggml.add_bos_token"),
            add_eos: kv.get_bool("tokenizer.ggml.add_eos_token").unwrap_or(false),
            add_space_prefix: kv.get_bool("tokenizer.ggml.add_space_prefix"),
            chat_template: kv.get_str("tokenizer.chat_template"),
        })
    }

    /// The type of token `id` (normal when the file gives none).
    pub(crate) fn token_type(&self, id: usize) -> i32 {
        self.token_types.get(id).copied().unwrap_or(token_type::NORMAL)
    }

    /// Control and user-defined tokens: matched as whole strings in input text.
    pub(crate) fn specials(&self) -> impl Iterator<Item = (u32, &str, i32)> + '_ {
        self.tokens.iter().enumerate().filter_map(|(i, t)| {
            let ty = self.token_type(i);
            (matches!(ty, token_type::CONTROL | token_type::USER_DEFINED) && !t.is_empty()).then_some((
                i as u32,
                t.as_str(),
                ty,
            ))
        })
    }

    /// Checks lengths and ids against the token list.
    pub(crate) fn validate(&self) -> Result<()> {
        let n = self.tokens.len();
        if n == 0 {
            return Err(TextError::BadVocab("the token list is empty".into()));
        }
        if u32::try_from(n).is_err() {
            return Err(TextError::BadVocab(format!("{n} tokens do not fit 32-bit ids")));
        }
        for (what, len) in [("token_type", self.token_types.len()), ("scores", self.scores.len())] {
            if len != 0 && len != n {
                return Err(TextError::BadVocab(format!("{len} {what} entries for {n} tokens")));
            }
        }
        for (what, id) in [("bos", self.bos), ("eos", self.eos), ("eot", self.eot), ("unk", self.unk)] {
            if let Some(id) = id.filter(|&id| id as usize >= n) {
                return Err(TextError::BadVocab(format!("{what} id {id} is outside the {n}-token vocabulary")));
            }
        }
        Ok(())
    }
}

/// Llama 3's split (also tiktoken's cl100k): case-insensitive contractions, numbers in 1-3
/// digit groups, newlines kept with the punctuation before them.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split: Llama 3's with every digit on its own.
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GPT-4o's split (tiktoken's o200k): words split before an upper-case run's last capital
/// (`mixedCase` is `mixed`, `Case`), contractions kept with their word, numbers in 1-3 digit
/// groups, `/` kept with punctuation before a newline.
const GPT4O_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Kimi K2's split: GPT-4o's with runs of Han characters split off first and out of words.
const KIMI_K2_SPLIT: &str = r"\p{Han}+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// DeepSeek-V3's splits, applied one after the other: numbers in 1-3 digit groups; runs of
/// CJK ideographs and kana; then words (a punctuation mark joins the ASCII word after it),
/// punctuation and symbols, spaces.
const DEEPSEEK_V3_SPLITS: [&str; 3] = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r"[!\x22#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

/// How a named pre-tokenizer splits text before BPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PreSplit {
    /// GPT-2's regex (`ByteLevel { use_regex: true }`).
    Gpt2,
    /// Every numeric character alone, then GPT-2's regex (SmolLM, StarCoder).
    DigitsThenGpt2,
    /// Llama 3's regex; a whole word found in the vocabulary skips merging.
    Llama3,
    /// Llama 3's regex, merging every word (GLM-4's `glm4`, `chatglm-bpe`).
    Glm4,
    /// Qwen2's regex.
    Qwen2,
    /// GPT-4o's regex (also gpt-oss's).
    Gpt4o,
    /// Kimi K2's regex.
    KimiK2,
    /// DeepSeek-V3's three regexes in turn.
    DeepseekV3,
}

/// The names `from_name` knows, for messages.
pub(crate) const KNOWN_PRE: &str = "default, gpt2, gpt-2, phi-2, olmo, smollm, starcoder, refact, command-r, llama3, \
     llama-v3, llama-bpe, dbrx, smaug-bpe, glm4, chatglm-bpe, qwen2, deepseek-r1-qwen, gpt-4o, kimi-k2, deepseek-v3";

impl PreSplit {
    pub(crate) fn from_name(pre: Option<&str>) -> Result<Self> {
        Ok(match pre.unwrap_or("default") {
            "default" | "gpt2" | "gpt-2" | "phi-2" | "olmo" => PreSplit::Gpt2,
            "smollm" | "starcoder" | "refact" | "command-r" => PreSplit::DigitsThenGpt2,
            "llama3" | "llama-v3" | "llama-bpe" | "dbrx" | "smaug-bpe" => PreSplit::Llama3,
            "glm4" | "chatglm-bpe" => PreSplit::Glm4,
            "qwen2" | "deepseek-r1-qwen" => PreSplit::Qwen2,
            "gpt-4o" => PreSplit::Gpt4o,
            "kimi-k2" => PreSplit::KimiK2,
            "deepseek-v3" => PreSplit::DeepseekV3,
            other => return Err(TextError::UnsupportedPreTokenizer(other.to_string())),
        })
    }

    /// The regexes that split text, one after the other (`None`: GPT-2's, inside `ByteLevel`).
    fn regexes(self) -> Option<&'static [&'static str]> {
        Some(match self {
            PreSplit::Gpt2 | PreSplit::DigitsThenGpt2 => return None,
            PreSplit::Llama3 | PreSplit::Glm4 => &[LLAMA3_SPLIT],
            PreSplit::Qwen2 => &[QWEN2_SPLIT],
            PreSplit::Gpt4o => &[GPT4O_SPLIT],
            PreSplit::KimiK2 => &[KIMI_K2_SPLIT],
            PreSplit::DeepseekV3 => &DEEPSEEK_V3_SPLITS,
        })
    }

    /// The regex splits alone, without the bytes' spelling.
    fn splits(self) -> Result<Vec<PreTokenizerWrapper>> {
        self.regexes()
            .unwrap_or_default()
            .iter()
            .map(|re| {
                Split::new(SplitPattern::Regex(re.to_string()), SplitDelimiterBehavior::Isolated, false)
                    .map(Into::into)
                    .map_err(|e| TextError::Tokenizers(e.to_string()))
            })
            .collect()
    }

    fn pre_tokenizer(self) -> Result<PreTokenizerWrapper> {
        match self {
            PreSplit::Gpt2 => Ok(ByteLevel::new(false, true, true).into()),
            PreSplit::DigitsThenGpt2 => {
                Ok(Sequence::new(vec![Digits::new(true).into(), ByteLevel::new(false, true, true).into()]).into())
            }
            _ => {
                let mut steps = self.splits()?;
                steps.push(ByteLevel::new(false, false, false).into());
                Ok(Sequence::new(steps).into())
            }
        }
    }
}

/// Whether the split rules of a "gpt2" vocabulary's `tokenizer.ggml.pre` are known
/// (`UnsupportedPreTokenizer` when not), checked before anything else is built.
pub fn check_pre_tokenizer(model: &str, pre: Option<&str>) -> Result<()> {
    match model {
        "gpt2" => PreSplit::from_name(pre).map(|_| ()),
        _ => Ok(()),
    }
}

/// Assembles a byte-level BPE `tokenizers::Tokenizer` from a "gpt2" vocabulary: the vocab and
/// merges, the pre-tokenizer its `pre` names, control and user-defined tokens matched whole.
pub(crate) fn gpt2_tokenizer(v: &GgufVocab) -> Result<tokenizers::Tokenizer> {
    let split = PreSplit::from_name(v.pre.as_deref())?;
    let mut vocab = Vocab::default();
    for (i, t) in v.tokens.iter().enumerate() {
        vocab.entry(t.clone()).or_insert(i as u32);
    }
    let mut merges = Vec::with_capacity(v.merges.len());
    for (rank, m) in v.merges.iter().enumerate() {
        let (a, b) = m
            .split_once(' ')
            .ok_or_else(|| TextError::BadVocab(format!("merge {rank} ({m:?}) is not \"left right\"")))?;
        merges.push((a.to_string(), b.to_string()));
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(split == PreSplit::Llama3)
        .build()
        .map_err(|e| TextError::BadVocab(format!("BPE: {e}")))?;
    let mut tok = tokenizers::Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(split.pre_tokenizer()?));
    tok.with_decoder(Some(ByteLevel::default()));
    let specials: Vec<AddedToken> = v
        .specials()
        .map(|(_, t, ty)| AddedToken::from(t.to_string(), ty == token_type::CONTROL).normalized(false))
        .collect();
    tok.add_special_tokens(&specials);
    Ok(tok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pre_names() {
        assert_eq!(PreSplit::from_name(Some("smollm")).unwrap(), PreSplit::DigitsThenGpt2);
        assert_eq!(PreSplit::from_name(None).unwrap(), PreSplit::Gpt2);
        assert!(matches!(PreSplit::from_name(Some("nonesuch")), Err(TextError::UnsupportedPreTokenizer(_))));
        let all = [
            PreSplit::Gpt2,
            PreSplit::DigitsThenGpt2,
            PreSplit::Llama3,
            PreSplit::Glm4,
            PreSplit::Qwen2,
            PreSplit::Gpt4o,
            PreSplit::KimiK2,
            PreSplit::DeepseekV3,
        ];
        for s in all {
            s.pre_tokenizer().unwrap();
        }
        for name in KNOWN_PRE.split(", ") {
            PreSplit::from_name(Some(name)).unwrap();
        }
    }

    /// The pieces the regexes of `pre` cut `text` into.
    fn pieces(pre: &str, text: &str) -> Vec<String> {
        use tokenizers::{PreTokenizedString, PreTokenizer};
        let seq = Sequence::new(PreSplit::from_name(Some(pre)).unwrap().splits().unwrap());
        let mut p = PreTokenizedString::from(text);
        seq.pre_tokenize(&mut p).unwrap();
        p.get_splits(tokenizers::OffsetReferential::Original, tokenizers::OffsetType::Byte)
            .into_iter()
            .map(|(s, _, _)| s.to_string())
            .collect()
    }

    /// Each named pre-tokenizer against the split its regexes make of one sample (worked out
    /// by hand from the patterns: case runs, contractions, digit groups, CJK, punctuation
    /// before a newline).
    #[test]
    fn pre_tokenizers_split_a_sample_as_their_models_do() {
        let text = "I'm HAPPY2024 mixedCase 東京タワー is 12345!!\n ok";
        let cl100k =
            ["I", "'m", " HAPPY", "202", "4", " mixedCase", " 東京タワー", " is", " ", "123", "45", "!!\n", " ok"];
        for pre in ["llama-bpe", "llama3", "glm4"] {
            assert_eq!(pieces(pre, text), cl100k, "{pre}");
        }
        let qwen2 = [
            "I",
            "'m",
            " HAPPY",
            "2",
            "0",
            "2",
            "4",
            " mixedCase",
            " 東京タワー",
            " is",
            " ",
            "1",
            "2",
            "3",
            "4",
            "5",
            "!!\n",
            " ok",
        ];
        assert_eq!(pieces("qwen2", text), qwen2);
        let o200k =
            ["I'm", " HAPPY", "202", "4", " mixed", "Case", " 東京タワー", " is", " ", "123", "45", "!!\n", " ok"];
        assert_eq!(pieces("gpt-4o", text), o200k);
        assert_eq!(pieces("gpt-4o", "a/\nb"), ["a", "/\n", "b"], "o200k keeps / with what ends a line");
        let kimi = [
            "I'm",
            " HAPPY",
            "202",
            "4",
            " mixed",
            "Case",
            " ",
            "東京",
            "タワー",
            " is",
            " ",
            "123",
            "45",
            "!!\n",
            " ok",
        ];
        assert_eq!(pieces("kimi-k2", text), kimi);
        let deepseek =
            ["I", "'m", " HAPPY", "202", "4", " mixedCase", " ", "東京タワー", " is", " ", "123", "45", "!!\n", " ok"];
        assert_eq!(pieces("deepseek-v3", text), deepseek);
        assert_eq!(
            pieces("deepseek-v3", "x.foo+1"),
            ["x", ".foo", "+", "1"],
            "punctuation joins the ASCII word after it"
        );
    }

    #[test]
    fn validate_catches_mismatches() {
        let mut v = GgufVocab { model: "gpt2".into(), tokens: vec!["a".into(), "b".into()], ..Default::default() };
        v.validate().unwrap();
        v.scores = vec![0.0];
        assert!(v.validate().is_err());
        v.scores.clear();
        v.eos = Some(2);
        assert!(v.validate().is_err());
        v.eos = None;
        v.merges = vec!["ab".into()];
        assert!(gpt2_tokenizer(&v).is_err());
    }
}
