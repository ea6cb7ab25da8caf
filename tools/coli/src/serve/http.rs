//! The HTTP side: the routes, the API key check, and each request's answer: one JSON body, or
//! server-sent events in OpenAI's chunk format ending with `data: [DONE]`. Every handler hands
//! its job to the engine thread and waits on the job's own channel; a client that goes away
//! drops that channel, which cancels the job there.
//!
//! Must not: run the model, or answer an error in any shape but `ApiError`'s.

use super::api::{self, ApiError, Job};
use super::metrics::Metrics;
use super::worker::{Reply, Submission};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use coli_runtime::slots::{Event, Finish};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio_stream::wrappers::ReceiverStream;

/// What every handler shares.
pub struct AppState {
    pub jobs: Mutex<mpsc::Sender<Submission>>,
    /// The name `/v1/models` lists and requests may give.
    pub model_id: String,
    pub api_key: Option<String>,
    /// The sampling of a request that gives none (the checkpoint's generation config over
    /// coli's defaults).
    pub sampling: coli_runtime::sample::SamplerConfig,
    pub metrics: Arc<Metrics>,
    pub slots: usize,
    /// Unix seconds at startup (`created` of the model).
    pub started: u64,
    pub next_id: AtomicU64,
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(|| async { ApiError::not_found("no such route", "not_found") })
        .with_state(state)
}

/// The two kinds of completion, which differ only in their JSON.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Text,
}

impl AppState {
    fn authorize(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(key) = &self.api_key else { return Ok(()) };
        let given =
            headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        if given == Some(key.as_str()) {
            Ok(())
        } else {
            Err(ApiError::unauthorized())
        }
    }

    fn submit(&self, job: Job) -> Result<UnboundedReceiver<Reply>, ApiError> {
        let (tx, rx) = unbounded_channel();
        let jobs = self.jobs.lock().map_err(|_| ApiError::internal("the engine thread is gone"))?;
        jobs.send(Submission { job, replies: tx }).map_err(|_| ApiError::internal("the engine thread is gone"))?;
        Ok(rx)
    }
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

async fn chat(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    run(s, headers, body, Kind::Chat).await.unwrap_or_else(IntoResponse::into_response)
}

async fn completions(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    run(s, headers, body, Kind::Text).await.unwrap_or_else(IntoResponse::into_response)
}

/// The answer's fixed fields.
struct Head {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
    return_tokens: bool,
}

impl Head {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Text, _) => "text_completion",
        }
    }

    /// One choice: the message (or text) so far and the finish reason.
    fn choice(&self, text: &str, finish: Option<&Finish>, chunk: bool, role: bool) -> Value {
        let reason = finish.map(|f| api::finish_reason(f.reason));
        let mut c = match (self.kind, chunk) {
            (Kind::Chat, false) => json!({"index": 0, "message": {"role": "assistant", "content": text}}),
            (Kind::Chat, true) => {
                let delta = match (role, text.is_empty()) {
                    (true, _) => json!({"role": "assistant", "content": ""}),
                    (false, true) => json!({}),
                    (false, false) => json!({"content": text}),
                };
                json!({"index": 0, "delta": delta})
            }
            (Kind::Text, _) => json!({"index": 0, "text": text}),
        };
        c["logprobs"] = Value::Null;
        c["finish_reason"] = json!(reason);
        if let (Some(f), true) = (finish, self.return_tokens) {
            c["tokens"] = json!(f.generated);
        }
        c
    }

    fn body(&self, choices: Vec<Value>, chunk: bool) -> Value {
        json!({"id": self.id, "object": self.object(chunk), "created": self.created, "model": self.model, "choices": choices})
    }
}

async fn run(s: Arc<AppState>, headers: HeaderMap, body: Bytes, kind: Kind) -> Result<Response, ApiError> {
    s.authorize(&headers)?;
    let job = match kind {
        Kind::Chat => api::chat_job(&body, &s.model_id, &s.sampling)?,
        Kind::Text => api::completion_job(&body, &s.model_id, &s.sampling)?,
    };
    let (stream, include_usage) = (job.stream, job.include_usage);
    let prefix = if kind == Kind::Chat { "chatcmpl" } else { "cmpl" };
    let head = Head {
        id: format!("{prefix}-{}", s.next_id.fetch_add(1, Ordering::Relaxed)),
        created: now(),
        model: s.model_id.clone(),
        kind,
        return_tokens: job.return_tokens,
    };
    let mut rx = s.submit(job)?;
    let gone = || ApiError::internal("the engine thread stopped before answering");
    let (prompt_tokens, cached_tokens) = match rx.recv().await.ok_or_else(gone)? {
        Reply::Started { prompt_tokens, cached_tokens } => (prompt_tokens, cached_tokens),
        Reply::Rejected(e) => return Err(e),
        Reply::Event(_) => return Err(ApiError::internal("the engine thread answered out of order")),
    };
    if stream {
        let (tx, events) = tokio::sync::mpsc::channel::<Result<Sse, Infallible>>(64);
        tokio::spawn(async move {
            let send = |v: Value| tx.send(Ok(Sse::default().data(v.to_string())));
            if kind == Kind::Chat && send(head.body(vec![head.choice("", None, true, true)], true)).await.is_err() {
                return;
            }
            while let Some(reply) = rx.recv().await {
                let v = match reply {
                    Reply::Event(Event::Text(t)) => head.body(vec![head.choice(&t, None, true, false)], true),
                    Reply::Event(Event::Done(f)) => {
                        if send(head.body(vec![head.choice("", Some(&f), true, false)], true)).await.is_err() {
                            return;
                        }
                        if include_usage {
                            let mut u = head.body(Vec::new(), true);
                            u["usage"] = api::usage(prompt_tokens, f.generated.len(), cached_tokens);
                            if send(u).await.is_err() {
                                return;
                            }
                        }
                        break;
                    }
                    Reply::Event(Event::Failed(e)) => {
                        let _ = send(ApiError::internal(e).body()).await;
                        break;
                    }
                    Reply::Started { .. } | Reply::Rejected(_) => break,
                };
                if send(v).await.is_err() {
                    return;
                }
            }
            let _ = tx.send(Ok(Sse::default().data("[DONE]"))).await;
        });
        let sse = axum::response::Sse::new(ReceiverStream::new(events)).keep_alive(KeepAlive::default());
        return Ok(sse.into_response());
    }
    let mut text = String::new();
    loop {
        match rx.recv().await.ok_or_else(gone)? {
            Reply::Event(Event::Text(t)) => text.push_str(&t),
            Reply::Event(Event::Done(f)) => {
                let mut body = head.body(vec![head.choice(&text, Some(&f), false, false)], false);
                body["usage"] = api::usage(prompt_tokens, f.generated.len(), cached_tokens);
                return Ok(Json(body).into_response());
            }
            Reply::Event(Event::Failed(e)) => return Err(ApiError::internal(e)),
            Reply::Started { .. } | Reply::Rejected(_) => {
                return Err(ApiError::internal("the engine thread answered out of order"))
            }
        }
    }
}

async fn models(State(s): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = s.authorize(&headers) {
        return e.into_response();
    }
    let model = json!({"id": s.model_id, "object": "model", "created": s.started, "owned_by": "coli"});
    Json(json!({"object": "list", "data": [model]})).into_response()
}

async fn health(State(s): State<Arc<AppState>>) -> Response {
    let degraded = s.metrics.degraded.load(Ordering::Relaxed);
    let status = if degraded { "degraded" } else { "ok" };
    let mut body = json!({
        "status": status,
        "slots": s.slots,
        "running": s.metrics.running.load(Ordering::Relaxed),
        "queued": s.metrics.queued.load(Ordering::Relaxed),
    });
    if degraded {
        body["note"] = json!("a device failed; requests continue on the CPU");
    }
    (StatusCode::OK, Json(body)).into_response()
}

async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], s.metrics.render(s.slots)).into_response()
}
