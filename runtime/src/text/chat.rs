//! [`ChatTemplate`]: renders a checkpoint's Jinja chat template into the prompt text, the
//! way transformers' `apply_chat_template` does: `trim_blocks` and `lstrip_blocks` on, the
//! trailing newline of the template dropped, `raise_exception`, `strftime_now`, a Python
//! `json.dumps`-style `tojson`, Python string/dict methods (`.strip()`, `.items()`...) and
//! loop controls; `{% generation %}` blocks (an HF extension) render their body.
//!
//! The context holds `messages`, `add_generation_prompt`, `bos_token`, `eos_token` and any
//! extra variables the caller passes (`tools`, ...). When a checkpoint has no template, the
//! ChatML one ([`CHATML_TEMPLATE`]) is the documented fallback, and only for vocabularies that
//! have the ChatML markers (see `Tokenizer::chat_template`). Rendering produces text only; it
//! does not tokenize.

use minijinja::{context, Environment, Value};
use serde::{Deserialize, Serialize};

use super::jinja_fns;
use super::Result;
use super::Tokenizer;

/// One chat turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// "system", "user", "assistant" (or whatever the template accepts).
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage { role: role.into(), content: content.into() }
    }
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// The ChatML layout (`<|im_start|>role\ncontent<|im_end|>\n`), used when a checkpoint whose
/// vocabulary has these markers ships no template of its own. No default system prompt.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\
{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const NAME: &str = "chat_template";

/// A compiled chat template plus the BOS/EOS texts it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`; syntax errors are reported here rather than at render time.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_formatter(jinja_fns::py_formatter);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", jinja_fns::raise_exception);
        env.add_function("strftime_now", jinja_fns::strftime_now);
        env.add_filter("tojson", jinja_fns::tojson);
        env.add_template_owned(NAME, strip_generation_tags(source))?;
        Ok(ChatTemplate { env, bos_token: bos_token.to_string(), eos_token: eos_token.to_string() })
    }

    /// The ChatML fallback ([`CHATML_TEMPLATE`]).
    pub fn chatml(bos_token: &str, eos_token: &str) -> Result<Self> {
        Self::new(CHATML_TEMPLATE, bos_token, eos_token)
    }

    /// The position of `ids` (`messages` rendered and encoded with `tok`) where its leading
    /// system messages end: where their rendering alone, encoded, parts from `ids` (a merge
    /// across the boundary may end it a token early). `None` without a system message before
    /// another one, when the template refuses the system messages alone, or at 0.
    pub fn system_end(&self, tok: &Tokenizer, messages: &[ChatMessage], ids: &[u32]) -> Option<usize> {
        let system = messages.iter().take_while(|m| m.role == "system").count();
        if system == 0 || system == messages.len() {
            return None;
        }
        let text = self.render(&messages[..system], false).ok()?;
        let head = tok.encode(&text, false).ok()?;
        let at = head.iter().zip(ids).take_while(|(a, b)| a == b).count();
        (at > 0 && at < ids.len()).then_some(at)
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends where the assistant's
    /// reply begins.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, add_generation_prompt, ())
    }

    /// Renders any serializable message list (e.g. with tool calls) with extra context
    /// variables: `extra` must serialize to a map (`()` for none); its keys override nothing
    /// of `messages`, `add_generation_prompt`, `bos_token`, `eos_token`.
    pub fn render_with<M: Serialize + ?Sized, E: Serialize>(
        &self,
        messages: &M,
        add_generation_prompt: bool,
        extra: E,
    ) -> Result<String> {
        let tmpl = self.env.get_template(NAME)?;
        let ctx = context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
            ..Value::from_serialize(extra)
        };
        Ok(tmpl.render(ctx)?)
    }
}

/// `{% generation %}`/`{% endgeneration %}` (transformers' assistant-mask extension) become a
/// plain `{% if true %}` block, keeping their whitespace-control dashes.
fn strip_generation_tags(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        // The closing `%}` comes after the opening `{%` (in `{%}` they share the `%`).
        let Some(end) = tag[2..].find("%}").map(|e| e + 2) else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (lead, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, trail) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[b.len()..]),
            None => (body, ""),
        };
        match body.trim() {
            "generation" => out.push_str(&format!("{{%{lead} if true {trail}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{lead} endif {trail}%}}")),
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_fallback() {
        let t = ChatTemplate::chatml("", "").unwrap();
        let s = t.render(&[ChatMessage::system("Be brief."), ChatMessage::user("Hi")], true).unwrap();
        assert_eq!(
            s,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn helpers_and_errors() {
        let t = ChatTemplate::new("{{ raise_exception('no ' + messages[0].role) }}", "", "").unwrap();
        let err = t.render(&[ChatMessage::user("x")], false).unwrap_err().to_string();
        assert!(err.contains("no user"), "{err}");
        assert!(ChatTemplate::new("{% for %}", "", "").is_err());
        let t =
            ChatTemplate::new("{{ strftime_now('%Y')|length }} {{ bos_token }}{{ tools[0].name }}", "<s>", "").unwrap();
        let s = t.render_with(&Vec::<ChatMessage>::new(), false, context! { tools => vec![context! { name => "f" }] });
        assert_eq!(s.unwrap(), "4 <s>f");
    }

    #[test]
    fn generation_blocks_render_their_body() {
        let src = "{% for m in messages %}{%- generation -%} [{{ m.content }}] {%- endgeneration %}{% endfor %}";
        assert!(strip_generation_tags(src).contains("{%- if true -%}"));
        let t = ChatTemplate::new(src, "", "").unwrap();
        assert_eq!(t.render(&[ChatMessage::user("a"), ChatMessage::assistant("b")], false).unwrap(), "[a][b]");
    }

    #[test]
    fn a_tag_closed_by_its_own_percent_is_an_error_not_a_panic() {
        for src in ["{%}", "a{%}b{% endif %}", "{%-}", "{%"] {
            assert!(ChatTemplate::new(src, "", "").is_err(), "{src}");
        }
    }
}
