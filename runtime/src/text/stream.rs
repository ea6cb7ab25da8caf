//! [`StreamDecoder`]: ids in one at a time, whole UTF-8 text out. A character whose bytes are
//! split across tokens (byte-level BPE and byte-fallback tokens do this for most non-ASCII
//! text) is held until its last byte arrives, so what is printed is never a broken character
//! and the concatenated output equals [`Tokenizer::decode`] of all ids.
//!
//! It keeps only the few bytes of an unfinished character; it does not look for stop strings
//! (`stop.rs`) or end-of-sequence ids (the caller's loop does).

use super::pieces::drain_utf8;
use super::Tokenizer;

/// Incremental decoder over one tokenizer.
#[derive(Debug)]
pub struct StreamDecoder<'t> {
    tok: &'t Tokenizer,
    skip_special: bool,
    pending: Vec<u8>,
    at_start: bool,
}

impl<'t> StreamDecoder<'t> {
    /// A decoder for `tok`; control tokens produce no text when `skip_special`.
    pub fn new(tok: &'t Tokenizer, skip_special: bool) -> Self {
        StreamDecoder { tok, skip_special, pending: Vec::new(), at_start: true }
    }

    /// Adds one id and returns the text it completes (often empty mid-character).
    pub fn push(&mut self, id: u32) -> String {
        if self.skip_special && self.tok.is_special(id) {
            return String::new();
        }
        let mut bytes = self.tok.token_bytes(id);
        if self.at_start && !bytes.is_empty() {
            self.at_start = false;
            if self.tok.pieces().strip_leading_space && bytes[0] == b' ' {
                bytes = &bytes[1..];
            }
        }
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        drain_utf8(&mut self.pending, &mut out);
        out
    }

    /// Ends the stream: an unfinished character at the end becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        let out = if self.pending.is_empty() { String::new() } else { "\u{FFFD}".to_string() };
        self.pending.clear();
        out
    }

    /// Whether bytes of an unfinished character are being held.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }
}
