//! The OpenAI-compatible request bodies as the server reads them (`ChatRequest`,
//! `CompletionRequest`), checked into what the engine thread runs (`Job`), the JSON the server
//! answers with, and errors in OpenAI's shape (`ApiError`). Fields a client may send that coli
//! cannot honour are refused with a 400 naming the field, never silently ignored, when they
//! ask for something other than their neutral value; fields that change nothing are accepted.
//!
//! Must not: touch the engine (the worker does), or panic on any body.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use coli_runtime::generate::StopReason;
use coli_runtime::sample::SamplerConfig;
use coli_runtime::text::ChatMessage;
use serde::Deserialize;
use serde_json::{json, Value};

/// An error answered as `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code: None,
        }
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "a valid API key is needed: send `Authorization: Bearer <key>`".into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    pub fn not_found(message: impl Into<String>, code: &'static str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some(code),
        }
    }

    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

/// What the engine thread is asked to run.
#[derive(Clone, Debug)]
pub enum Input {
    /// Messages through the model's chat template, ready for the assistant's answer.
    Chat(Vec<ChatMessage>),
    /// Text, encoded as it is (with a BOS when the tokenizer adds one).
    Text(String),
    /// Token ids.
    Ids(Vec<u32>),
}

/// A checked request.
#[derive(Clone, Debug)]
pub struct Job {
    pub input: Input,
    pub sampler: SamplerConfig,
    /// `None`: until EOS or the context's end.
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// Answer the generated ids too (`tokens`, an extension).
    pub return_tokens: bool,
    pub ignore_eos: bool,
}

/// A string or a list of strings (`stop`).
#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// A chat message's content: a string or a list of parts.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize, Debug)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize, Debug)]
struct Message {
    role: String,
    #[serde(default)]
    content: Option<Content>,
}

#[derive(Deserialize, Debug, Default)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// The fields both endpoints share.
#[derive(Deserialize, Debug, Default)]
struct Common {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    max_tokens: Option<i64>,
    #[serde(default)]
    max_completion_tokens: Option<i64>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    top_k: Option<i64>,
    #[serde(default)]
    min_p: Option<f32>,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    stop: Option<OneOrMany>,
    #[serde(default)]
    repetition_penalty: Option<f32>,
    #[serde(default)]
    frequency_penalty: Option<f32>,
    #[serde(default)]
    presence_penalty: Option<f32>,
    #[serde(default)]
    n: Option<i64>,
    #[serde(default)]
    logprobs: Option<Value>,
    #[serde(default)]
    return_tokens: bool,
    #[serde(default)]
    ignore_eos: bool,
}

#[derive(Deserialize, Debug)]
struct ChatBody {
    #[serde(flatten)]
    common: Common,
    messages: Vec<Message>,
    #[serde(default)]
    tools: Option<Value>,
}

#[derive(Deserialize, Debug)]
struct CompletionBody {
    #[serde(flatten)]
    common: Common,
    prompt: Value,
    #[serde(default)]
    echo: bool,
    #[serde(default)]
    suffix: Option<String>,
}

/// At most this many stop strings a request.
const MAX_STOPS: usize = 16;

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        let what =
            if e.is_syntax() || e.is_eof() { "the body is not valid JSON" } else { "the body does not fit the API" };
        ApiError::bad_request(format!("{what}: {e}"), None)
    })
}

impl Common {
    /// The model the request names, checked against the one served.
    fn check_model(&self, served: &str) -> Result<(), ApiError> {
        match self.model.as_deref() {
            None | Some("") => Ok(()),
            Some(m) if m == served => Ok(()),
            Some(m) => Err(ApiError::not_found(
                format!("the model `{m}` does not exist; this server serves `{served}`"),
                "model_not_found",
            )),
        }
    }

    fn job(self, input: Input, defaults: &SamplerConfig) -> Result<Job, ApiError> {
        let refuse =
            |field: &'static str, why: &str| Err(ApiError::bad_request(format!("`{field}`: {why}"), Some(field)));
        if self.n.is_some_and(|n| n != 1) {
            return refuse("n", "only one choice per request is generated");
        }
        if self.frequency_penalty.is_some_and(|p| p != 0.0) {
            return refuse("frequency_penalty", "not supported; use `repetition_penalty`");
        }
        if self.presence_penalty.is_some_and(|p| p != 0.0) {
            return refuse("presence_penalty", "not supported; use `repetition_penalty`");
        }
        if self.logprobs.as_ref().is_some_and(|v| !(v.is_null() || v == &Value::Bool(false))) {
            return refuse("logprobs", "not supported");
        }
        let max_tokens = match self.max_completion_tokens.or(self.max_tokens) {
            None => None,
            Some(n) if n >= 1 => Some(n as usize),
            Some(n) => return refuse("max_tokens", &format!("must be at least 1, got {n}")),
        };
        let d = defaults;
        let top_k = match self.top_k {
            None => d.top_k,
            Some(k) if k >= 0 => k as usize,
            Some(k) => return refuse("top_k", &format!("must be >= 0, got {k}")),
        };
        let sampler = SamplerConfig {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_k,
            top_p: self.top_p.unwrap_or(d.top_p),
            min_p: self.min_p.unwrap_or(d.min_p),
            repetition_penalty: self.repetition_penalty.unwrap_or(d.repetition_penalty),
            seed: self.seed.unwrap_or_else(clock_seed),
        };
        if let Err(e) = coli_runtime::sample::Sampler::new(sampler) {
            return Err(ApiError::bad_request(e.to_string(), None));
        }
        let stop = match self.stop {
            None => Vec::new(),
            Some(OneOrMany::One(s)) => vec![s],
            Some(OneOrMany::Many(v)) => v,
        };
        if stop.len() > MAX_STOPS {
            return refuse("stop", &format!("at most {MAX_STOPS} stop strings"));
        }
        Ok(Job {
            input,
            sampler,
            max_tokens,
            stop,
            stream: self.stream,
            include_usage: self.stream_options.is_some_and(|o| o.include_usage),
            return_tokens: self.return_tokens,
            ignore_eos: self.ignore_eos,
        })
    }
}

/// A seed from the clock, for requests that give none.
fn clock_seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// A `POST /v1/chat/completions` body, checked.
/// `defaults`: the sampling of a request that gives none.
pub fn chat_job(body: &[u8], served: &str, defaults: &SamplerConfig) -> Result<Job, ApiError> {
    let b: ChatBody = parse(body)?;
    b.common.check_model(served)?;
    if b.tools.as_ref().is_some_and(|t| !t.is_null() && t.as_array().is_none_or(|a| !a.is_empty())) {
        return Err(ApiError::bad_request("`tools`: tool calls are not supported", Some("tools")));
    }
    if b.messages.is_empty() {
        return Err(ApiError::bad_request("`messages` is empty", Some("messages")));
    }
    let mut messages = Vec::with_capacity(b.messages.len());
    for m in b.messages {
        let content = match m.content {
            None => String::new(),
            Some(Content::Text(t)) => t,
            Some(Content::Parts(parts)) => {
                let mut text = String::new();
                for p in parts {
                    match (p.kind.as_str(), p.text) {
                        ("text", Some(t)) => text.push_str(&t),
                        (kind, _) => {
                            return Err(ApiError::bad_request(
                                format!("message content of type `{kind}` is not supported (text only)"),
                                Some("messages"),
                            ))
                        }
                    }
                }
                text
            }
        };
        messages.push(ChatMessage::new(m.role, content));
    }
    b.common.job(Input::Chat(messages), defaults)
}

/// A `POST /v1/completions` body, checked.
pub fn completion_job(body: &[u8], served: &str, defaults: &SamplerConfig) -> Result<Job, ApiError> {
    let b: CompletionBody = parse(body)?;
    b.common.check_model(served)?;
    if b.echo {
        return Err(ApiError::bad_request("`echo`: not supported", Some("echo")));
    }
    if b.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::bad_request("`suffix`: not supported", Some("suffix")));
    }
    let bad = || ApiError::bad_request("`prompt` must be a string or an array of token ids", Some("prompt"));
    let input = match b.prompt {
        Value::String(s) => Input::Text(s),
        Value::Array(items) if items.len() == 1 && items[0].is_string() => {
            Input::Text(items[0].as_str().unwrap_or_default().to_string())
        }
        Value::Array(items) if items.iter().all(Value::is_u64) => {
            let ids = items.iter().map(|v| v.as_u64().and_then(|i| u32::try_from(i).ok()).ok_or_else(bad));
            Input::Ids(ids.collect::<Result<_, _>>()?)
        }
        _ => return Err(bad()),
    };
    b.common.job(input, defaults)
}

/// OpenAI's name for why a generation ended.
pub fn finish_reason(r: StopReason) -> &'static str {
    match r {
        StopReason::Eos | StopReason::StopString => "stop",
        StopReason::MaxTokens | StopReason::ContextFull => "length",
    }
}

/// The `usage` object.
pub fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}
