//! The bytes each token id stands for, computed once per vocabulary, so that decoding (whole
//! or streamed) is a concatenation of byte strings followed by one UTF-8 conversion.
//!
//! Three spellings are understood: GPT-2 byte-level (every byte is drawn as a printable
//! character, `Ġ` for a space), SentencePiece (`▁` for a space, `<0xNN>` byte-fallback
//! tokens) and plain text. This file only maps strings to bytes; it never decides which ids
//! are special and never reads files.

/// Bytes per id, plus the one context rule decoding needs.
#[derive(Debug, Clone, Default)]
pub(crate) struct Pieces {
    bytes: Vec<Box<[u8]>>,
    /// SentencePiece vocabularies prepend a space when encoding; decoding drops one leading
    /// space from the start of the text again.
    pub(crate) strip_leading_space: bool,
}

/// How a vocabulary's token strings spell bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Spelling {
    /// GPT-2 byte-level: each character of a token is one byte, via [`byte_to_char`].
    ByteLevel,
    /// SentencePiece: `▁` is a space, `<0xNN>` is the byte NN (when `byte_fallback`).
    SentencePiece { byte_fallback: bool },
    /// The token string is the text.
    Plain,
}

impl Pieces {
    /// Builds the table from each id's token string (`None` for ids with no token, which
    /// decode to nothing).
    pub(crate) fn build<'a>(
        tokens: impl IntoIterator<Item = Option<&'a str>>,
        spelling: Spelling,
        strip_leading_space: bool,
    ) -> Self {
        let bytes = tokens
            .into_iter()
            .map(|t| match t {
                None => Box::<[u8]>::default(),
                Some(t) => token_bytes(t, spelling).into_boxed_slice(),
            })
            .collect();
        Pieces { bytes, strip_leading_space }
    }

    /// The bytes of one id; empty for an id outside the vocabulary.
    pub(crate) fn get(&self, id: u32) -> &[u8] {
        self.bytes.get(id as usize).map(|b| &b[..]).unwrap_or(&[])
    }

    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }
}

/// The bytes one token string stands for under `spelling`.
pub(crate) fn token_bytes(token: &str, spelling: Spelling) -> Vec<u8> {
    match spelling {
        Spelling::Plain => token.as_bytes().to_vec(),
        Spelling::ByteLevel => {
            // A token that is not entirely byte-level characters (an added token such as
            // "<|im_start|>" whose characters all happen to be, or one with a raw space) is
            // its own UTF-8: this is what the GPT-2 decoder does too.
            let mut out = Vec::with_capacity(token.len());
            for c in token.chars() {
                match char_to_byte(c) {
                    Some(b) => out.push(b),
                    None => return token.as_bytes().to_vec(),
                }
            }
            out
        }
        Spelling::SentencePiece { byte_fallback } => {
            if byte_fallback {
                if let Some(b) = parse_byte_token(token) {
                    return vec![b];
                }
            }
            token.replace('\u{2581}', " ").into_bytes()
        }
    }
}

/// `<0xNN>` → NN.
pub(crate) fn parse_byte_token(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// GPT-2's printable stand-in for byte `b`: printable Latin-1 bytes stand for themselves, the
/// 68 others (controls, space, DEL, NBSP, soft hyphen) are moved to U+0100 onwards in order.
#[cfg(test)]
pub(crate) fn byte_to_char(b: u8) -> char {
    let shifted = match b {
        0..=32 => b as u32,
        127..=160 => 33 + (b as u32 - 127),
        173 => 67,
        _ => return b as char,
    };
    char::from_u32(256 + shifted).unwrap_or('\u{FFFD}')
}

fn is_self_printing(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// Inverse of [`byte_to_char`].
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let u = c as u32;
    if u < 256 && is_self_printing(u as u8) {
        return Some(u as u8);
    }
    match u.checked_sub(256)? {
        n @ 0..=32 => Some(n as u8),
        n @ 33..=66 => Some((127 + n - 33) as u8),
        67 => Some(173),
        _ => None,
    }
}

/// Appends `bytes` as text: whole UTF-8 characters go to `out`, an incomplete character at the
/// end stays in `pending` for the next call, and invalid sequences become U+FFFD.
pub(crate) fn drain_utf8(pending: &mut Vec<u8>, out: &mut String) {
    let mut start = 0;
    loop {
        match std::str::from_utf8(&pending[start..]) {
            Ok(s) => {
                out.push_str(s);
                pending.clear();
                return;
            }
            Err(e) => {
                let good = start + e.valid_up_to();
                // The prefix up to `good` was just validated.
                out.push_str(std::str::from_utf8(&pending[start..good]).unwrap_or_default());
                match e.error_len() {
                    Some(bad) => {
                        out.push('\u{FFFD}');
                        start = good + bad;
                    }
                    None => {
                        pending.drain(..good);
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_table_round_trips() {
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = byte_to_char(b);
            assert!(seen.insert(c));
            assert_eq!(char_to_byte(c), Some(b));
        }
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(char_to_byte('€'), None);
    }

    #[test]
    fn spellings() {
        assert_eq!(token_bytes("Ġhello", Spelling::ByteLevel), b" hello");
        assert_eq!(token_bytes("<|im_end|>", Spelling::ByteLevel), b"<|im_end|>");
        assert_eq!(token_bytes("a b€", Spelling::ByteLevel), "a b€".as_bytes());
        let spm = Spelling::SentencePiece { byte_fallback: true };
        assert_eq!(token_bytes("▁the", spm), b" the");
        assert_eq!(token_bytes("<0x0A>", spm), b"\n");
        assert_eq!(token_bytes("<0x0A>", Spelling::SentencePiece { byte_fallback: false }), b"<0x0A>");
        assert_eq!(parse_byte_token("<0xZZ>"), None);
    }

    #[test]
    fn drain_holds_incomplete_and_replaces_invalid() {
        let mut out = String::new();
        let mut p = "é".as_bytes()[..1].to_vec();
        drain_utf8(&mut p, &mut out);
        assert_eq!((out.as_str(), p.len()), ("", 1));
        p.extend_from_slice(&"é".as_bytes()[1..]);
        p.extend_from_slice(b"x\xFFy");
        drain_utf8(&mut p, &mut out);
        assert_eq!(out, "éx\u{FFFD}y");
        assert!(p.is_empty());
    }
}
