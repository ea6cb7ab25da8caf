//! SentencePiece-style BPE for GGUF vocabularies with `tokenizer.ggml.model = "llama"`: the
//! text's spaces become `▁`, then adjacent pieces are merged, highest-scoring merged piece
//! first (leftmost on ties), as long as the merged piece is in the vocabulary; characters the
//! vocabulary lacks fall back to `<0xNN>` byte tokens.
//!
//! It follows llama.cpp's reading of such GGUFs (a space is prefixed to every run of text that
//! starts the input or follows a special token when `add_space_prefix`). It only encodes;
//! decoding is byte concatenation in `pieces.rs`. It must not panic on any input text.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::pieces::parse_byte_token;

/// A SentencePiece vocabulary ready to encode.
#[derive(Debug, Clone)]
pub(crate) struct SpmModel {
    ids: HashMap<String, u32>,
    scores: Vec<f32>,
    byte_ids: [Option<u32>; 256],
    unk: Option<u32>,
    add_space_prefix: bool,
}

/// Special tokens matched as whole strings in the input before any model runs.
#[derive(Debug, Clone, Default)]
pub(crate) struct SpecialSplitter {
    /// By first byte: (text, id), longest first.
    by_first: HashMap<u8, Vec<(String, u32)>>,
}

/// One run of the input: plain text or a special token.
#[derive(Debug, PartialEq)]
pub(crate) enum Fragment<'a> {
    Text(&'a str),
    Special(u32),
}

impl SpecialSplitter {
    pub(crate) fn new(specials: impl IntoIterator<Item = (String, u32)>) -> Self {
        let mut by_first: HashMap<u8, Vec<(String, u32)>> = HashMap::new();
        for (text, id) in specials {
            if let Some(&b) = text.as_bytes().first() {
                by_first.entry(b).or_default().push((text, id));
            }
        }
        for v in by_first.values_mut() {
            v.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        }
        SpecialSplitter { by_first }
    }

    /// Splits `text` into text runs and special tokens (longest match wins, left to right).
    pub(crate) fn split<'a>(&self, text: &'a str) -> Vec<Fragment<'a>> {
        let mut out = Vec::new();
        let bytes = text.as_bytes();
        let (mut run_start, mut i) = (0, 0);
        while i < bytes.len() {
            let hit = self
                .by_first
                .get(&bytes[i])
                .and_then(|cands| cands.iter().find(|(s, _)| bytes[i..].starts_with(s.as_bytes())));
            match hit {
                Some((s, id)) => {
                    if run_start < i {
                        out.push(Fragment::Text(&text[run_start..i]));
                    }
                    out.push(Fragment::Special(*id));
                    i += s.len();
                    run_start = i;
                }
                None => i += 1,
            }
        }
        if run_start < bytes.len() {
            out.push(Fragment::Text(&text[run_start..]));
        }
        out
    }
}

/// A candidate merge of two adjacent symbols, ordered best-first for the heap.
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    /// Byte length of the merged text when queued; a stale entry no longer matches.
    len: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then_with(|| other.left.cmp(&self.left))
    }
}

/// A piece of the text being merged: a byte range, linked to its neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

impl SpmModel {
    /// `tokens[i]` has score `scores[i]`; `unk` is used when a byte has no `<0xNN>` token.
    pub(crate) fn new(tokens: &[String], scores: &[f32], unk: Option<u32>, add_space_prefix: bool) -> Self {
        let mut ids = HashMap::with_capacity(tokens.len());
        let mut byte_ids = [None; 256];
        for (i, t) in tokens.iter().enumerate() {
            let id = i as u32;
            ids.entry(t.clone()).or_insert(id);
            if let Some(b) = parse_byte_token(t) {
                byte_ids[b as usize].get_or_insert(id);
            }
        }
        let mut scores = scores.to_vec();
        scores.resize(tokens.len(), 0.0);
        SpmModel { ids, scores, byte_ids, unk, add_space_prefix }
    }

    /// Encodes fragments (already split around special tokens) and appends ids to `out`.
    pub(crate) fn encode_fragments(&self, fragments: &[Fragment<'_>], out: &mut Vec<u32>) {
        let mut prev_special = true;
        for f in fragments {
            match f {
                Fragment::Special(id) => {
                    out.push(*id);
                    prev_special = true;
                }
                Fragment::Text(t) => {
                    let mut text = String::with_capacity(t.len() + 3);
                    if self.add_space_prefix && prev_special {
                        text.push('\u{2581}');
                    }
                    text.push_str(&t.replace(' ', "\u{2581}"));
                    self.encode_piece(&text, out);
                    prev_special = false;
                }
            }
        }
    }

    /// The id of a vocabulary entry.
    pub(crate) fn id(&self, s: &str) -> Option<u32> {
        self.ids.get(s).copied()
    }

    fn encode_piece(&self, text: &str, out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let mut syms: Vec<Symbol> = Vec::new();
        for (start, c) in text.char_indices() {
            let n = syms.len();
            syms.push(Symbol { start, len: c.len_utf8(), prev: n.checked_sub(1), next: None });
            if n > 0 {
                syms[n - 1].next = Some(n);
            }
        }
        let mut heap = BinaryHeap::new();
        for i in 1..syms.len() {
            self.push_bigram(text, &syms, i - 1, i, &mut heap);
        }
        while let Some(bg) = heap.pop() {
            let (l, r) = (syms[bg.left], syms[bg.right]);
            if l.len == 0 || r.len == 0 || l.len + r.len != bg.len || l.next != Some(bg.right) {
                continue; // stale: one side was merged into something else since
            }
            syms[bg.left].len += r.len;
            syms[bg.left].next = r.next;
            syms[bg.right].len = 0;
            if let Some(n) = r.next {
                syms[n].prev = Some(bg.left);
            }
            if let Some(p) = syms[bg.left].prev {
                self.push_bigram(text, &syms, p, bg.left, &mut heap);
            }
            if let Some(n) = syms[bg.left].next {
                self.push_bigram(text, &syms, bg.left, n, &mut heap);
            }
        }
        let mut cur = Some(0);
        while let Some(i) = cur {
            let s = syms[i];
            let piece = &text[s.start..s.start + s.len];
            match self.id(piece) {
                Some(id) => out.push(id),
                None => {
                    for b in piece.bytes() {
                        if let Some(id) = self.byte_ids[b as usize].or(self.unk) {
                            out.push(id);
                        }
                    }
                }
            }
            cur = s.next;
        }
    }

    fn push_bigram(&self, text: &str, syms: &[Symbol], left: usize, right: usize, heap: &mut BinaryHeap<Bigram>) {
        let (l, r) = (syms[left], syms[right]);
        let merged = &text[l.start..r.start + r.len];
        if let Some(id) = self.id(merged) {
            heap.push(Bigram { score: self.scores[id as usize], left, right, len: merged.len() });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> (SpmModel, Vec<String>) {
        let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>"].iter().map(|s| s.to_string()).collect();
        for b in 0..=255u32 {
            tokens.push(format!("<0x{b:02X}>"));
        }
        let words = [
            ("▁", -1.0),
            ("h", -2.0),
            ("e", -2.0),
            ("l", -2.0),
            ("o", -2.0),
            ("w", -2.0),
            ("r", -2.0),
            ("d", -2.0),
            ("ll", -3.0),
            ("he", -4.0),
            ("hell", -5.0),
            ("hello", -6.0),
            ("▁hello", -7.0),
            ("or", -8.0),
            ("▁w", -9.0),
            ("ld", -10.0),
            ("▁wor", -11.0),
        ];
        let mut scores = vec![0.0; tokens.len()];
        for (w, s) in words {
            tokens.push(w.to_string());
            scores.push(s);
        }
        (SpmModel::new(&tokens, &scores, Some(0), true), tokens)
    }

    fn encode(m: &SpmModel, sp: &SpecialSplitter, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        m.encode_fragments(&sp.split(text), &mut out);
        out
    }

    fn names(tokens: &[String], ids: &[u32]) -> Vec<String> {
        ids.iter().map(|&i| tokens[i as usize].clone()).collect()
    }

    #[test]
    fn merges_by_score_and_falls_back_to_bytes() {
        let (m, tokens) = model();
        let sp = SpecialSplitter::new([("<s>".to_string(), 1), ("</s>".to_string(), 2)]);
        let ids = encode(&m, &sp, "hello world");
        assert_eq!(names(&tokens, &ids), ["▁hello", "▁wor", "ld"]);
        // 'é' is not in the vocabulary: two byte tokens.
        let ids = encode(&m, &sp, "hé");
        assert_eq!(names(&tokens, &ids), ["▁", "h", "<0xC3>", "<0xA9>"]);
        // A special token splits the text; the following run gets its own space prefix.
        let ids = encode(&m, &sp, "<s>hello</s>hello");
        assert_eq!(names(&tokens, &ids), ["<s>", "▁hello", "</s>", "▁hello"]);
        assert!(encode(&m, &sp, "").is_empty());
    }

    #[test]
    fn splitter_prefers_longest() {
        let sp = SpecialSplitter::new([("<a>".to_string(), 7), ("<a>b".to_string(), 8)]);
        assert_eq!(
            sp.split("x<a>by<a>"),
            vec![Fragment::Text("x"), Fragment::Special(8), Fragment::Text("y"), Fragment::Special(7)]
        );
        assert_eq!(sp.split("é<a"), vec![Fragment::Text("é<a")]);
    }
}
