//! A prompt as a front end gives it (ids, text, or a chat turn) and its token ids: a chat turn
//! through the checkpoint's chat template, which writes its own BOS; plain text with a BOS
//! when the tokenizer adds one.

use super::{EngineError, NoTokenizer};
use crate::text::{ChatMessage, Tokenizer};

/// A prompt.
#[derive(Clone, Copy, Debug)]
pub enum Prompt<'a> {
    /// Token ids, no tokenizer involved.
    Ids(&'a [u32]),
    /// Text, encoded as it is.
    Text(&'a str),
    /// A user message (after an optional system message) in the chat template, ready for the
    /// assistant's answer.
    Chat { system: Option<&'a str>, user: &'a str },
}

impl Prompt<'_> {
    /// The prompt's ids with `tokenizer` (or why there is none).
    pub(super) fn encode(&self, tokenizer: Result<&Tokenizer, &NoTokenizer>) -> Result<Vec<u32>, EngineError> {
        let tok = || tokenizer.map_err(|e| EngineError::NoTokenizer(e.to_string()));
        match *self {
            Prompt::Ids(ids) => Ok(ids.to_vec()),
            Prompt::Text(text) => tok()?.encode(text, true).map_err(EngineError::Encode),
            Prompt::Chat { system, user } => {
                let t = tok()?;
                let template = t.chat_template().map_err(EngineError::Chat)?;
                let mut messages = Vec::new();
                if let Some(s) = system {
                    messages.push(ChatMessage::system(s.to_string()));
                }
                messages.push(ChatMessage::user(user.to_string()));
                let text = template.render(&messages, true).map_err(EngineError::Chat)?;
                t.encode(&text, false).map_err(EngineError::Encode)
            }
        }
    }
}
