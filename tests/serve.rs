//! `coli serve` end to end: the binary started on a free port, driven over HTTP/1.1 by a small
//! client here, by curl, and by the `openai` Python package (`tools/fetch-openai-client.sh`;
//! each skipped with a note where it is not installed). Answers are checked against the same
//! generation run in this process through `Engine::generate` (a separate loop), token for
//! token under greedy decoding:
//! - chat and completions, streamed and not (the streamed text equals the other), `usage`;
//! - the next turn of a conversation takes its prefix from the slot's cache and answers as a
//!   fresh session does; 8 concurrent requests over 4 slots each answer as they do alone;
//! - bad requests get 4xx errors in OpenAI's shape and the server keeps serving; a client
//!   that disconnects mid-stream is counted as cancelled and frees its slot;
//! - the API key, token-id prompts on a fixture without a tokenizer, a MoE fixture on the
//!   Vulkan device with the expert tier, and a device that fails mid-request (the answer
//!   finished on the CPU, `/health` degraded, the server still serving);
//! - load: 32 clients x 10 requests of random lengths, with malformed bodies, oversized prompts
//!   and clients leaving mid-stream among them: every good answer equals its single-request
//!   reference, nothing is left running, and resident memory returns near its idle level.

mod common;

use coli_runtime::engine::{Engine, Prompt};
use coli_runtime::generate::GenerateOptions;
use coli_runtime::sample::{Sampler, SamplerConfig};
use common::{default_model_path, fixture_dir, run_greedy};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `coli serve`, killed on drop.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_coli"))
            .args(["serve", "-q", "--port", "0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("coli serve starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr = line.split("http://").nth(1).and_then(|r| r.split_whitespace().next()).unwrap_or_else(|| {
            let _ = child.kill();
            panic!("no address in {line:?}")
        });
        Server { addr: addr.to_string(), child }
    }

    fn request(&self, method: &str, path: &str, body: Option<&Value>, key: Option<&str>) -> (u16, String) {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let auth = key.map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{auth}Connection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let text = String::from_utf8(raw).unwrap();
        let (head, rest) = text.split_once("\r\n\r\n").unwrap();
        let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
        (status, if chunked { dechunk(rest) } else { rest.to_string() })
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, text) = self.request("POST", path, Some(body), None);
        (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
    }

    fn get(&self, path: &str) -> (u16, String) {
        self.request("GET", path, None, None)
    }

    /// The server's counter `name` from `/metrics`.
    fn counter(&self, name: &str) -> f64 {
        let (_, text) = self.get("/metrics");
        text.lines().find_map(|l| l.strip_prefix(&format!("{name} ")).map(|v| v.parse().unwrap())).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

/// The `data:` payloads of a server-sent event stream.
fn events(body: &str) -> Vec<String> {
    body.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_string).collect()
}

/// What `Engine::generate` answers to `prompt` greedily: the text and the token count.
fn reference(engine: &Engine, prompt: &Prompt, max: usize) -> (String, usize, usize) {
    let ids = engine.prompt_ids(prompt).unwrap();
    let mut session = engine.session().unwrap();
    let mut sampler = Sampler::new(SamplerConfig::greedy()).unwrap();
    let opts = GenerateOptions { max_new_tokens: max, ..GenerateOptions::default() };
    let mut text = String::new();
    let g = engine.generate(&mut session, &mut sampler, &ids, &opts, &mut |t| text.push_str(t)).unwrap();
    (text, ids.len(), g.generated.len())
}

fn chat_body(messages: &[(&str, &str)], max: usize) -> Value {
    let messages: Vec<Value> = messages.iter().map(|(r, c)| json!({"role": r, "content": c})).collect();
    json!({"messages": messages, "temperature": 0, "max_tokens": max})
}

fn content(v: &Value) -> String {
    v["choices"][0]["message"]["content"].as_str().unwrap().to_string()
}

#[test]
fn chat_and_completions_answer_as_the_engine_does() {
    let Some(path) = default_model_path() else { return };
    let engine = common::load_model(&path);
    let server = Server::start(&["--model", path.to_str().unwrap(), "--parallel", "4", "--ctx", "512"]);
    let (status, models) = server.get("/v1/models");
    assert_eq!(status, 200);
    let id = serde_json::from_str::<Value>(&models).unwrap()["data"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(id, "SmolLM2-135M-Instruct.Q4_1");

    // Chat, not streamed.
    let q = "What is the capital of France? Answer in one sentence.";
    let (want, prompt_tokens, completion_tokens) = reference(&engine, &Prompt::Chat { system: None, user: q }, 24);
    let mut body = chat_body(&[("user", q)], 24);
    body["model"] = json!(id);
    let (status, v) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(content(&v), want);
    assert!(want.contains("Paris"), "{want}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["usage"]["prompt_tokens"], prompt_tokens);
    assert_eq!(v["usage"]["completion_tokens"], completion_tokens);
    assert_eq!(v["usage"]["total_tokens"], prompt_tokens + completion_tokens);
    let finish = v["choices"][0]["finish_reason"].as_str().unwrap();
    assert_eq!(finish, if completion_tokens == 24 { "length" } else { "stop" });

    // The same, streamed: the deltas concatenate to the same text, then usage, then [DONE].
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (status, text) = server.request("POST", "/v1/chat/completions", Some(&body), None);
    assert_eq!(status, 200);
    let ev = events(&text);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = ev[..ev.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(streamed, want);
    let last = chunks.last().unwrap();
    assert_eq!(last["usage"]["completion_tokens"], completion_tokens);
    assert_eq!(chunks[chunks.len() - 2]["choices"][0]["finish_reason"], finish);

    // Completions on plain text.
    let p = "The capital of France is";
    let (want_text, p_tokens, _) = reference(&engine, &Prompt::Text(p), 12);
    let (status, v) = server.post("/v1/completions", &json!({"prompt": p, "temperature": 0, "max_tokens": 12}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"].as_str().unwrap(), want_text);
    assert_eq!(v["usage"]["prompt_tokens"], p_tokens);

    // The next turn reuses the conversation's prefix and answers as a fresh session does.
    let turn2 = [("user", q), ("assistant", want.as_str()), ("user", "And of Italy?")];
    let (status, v) = server.post("/v1/chat/completions", &chat_body(&turn2, 16));
    assert_eq!(status, 200, "{v}");
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() as usize;
    assert!(cached >= prompt_tokens, "the first turn's prompt came from the cache: {cached} < {prompt_tokens}");
    let tok = engine.tokenizer().unwrap();
    let msgs: Vec<_> = turn2.iter().map(|(r, c)| coli_runtime::text::ChatMessage::new(*r, *c)).collect();
    let rendered = tok.chat_template().unwrap().render(&msgs, true).unwrap();
    let ids = tok.encode(&rendered, false).unwrap();
    let (want2, n2, _) = reference(&engine, &Prompt::Ids(&ids), 16);
    assert_eq!(content(&v), want2);
    assert_eq!(v["usage"]["prompt_tokens"], n2);

    // 8 concurrent requests over 4 slots: each answers as it does alone.
    let questions: Vec<String> = (0..8).map(|i| format!("Name a colour, then count to {}.", i + 2)).collect();
    let wants: Vec<String> =
        questions.iter().map(|q| reference(&engine, &Prompt::Chat { system: None, user: q }, 20).0).collect();
    let got: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = questions
            .iter()
            .map(|q| {
                let server = &server;
                s.spawn(move || content(&server.post("/v1/chat/completions", &chat_body(&[("user", q)], 20)).1))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(got, wants);
    assert_eq!(server.counter("coli_requests_completed_total"), 12.0);
    // The slots' caches hold the conversations; an attention model keeps no recurrent states.
    assert!(server.counter("coli_kv_cache_bytes") > 0.0);
    assert_eq!(server.counter("coli_state_snapshot_bytes"), 0.0);
    // On the CPU: steps counted and timed, no device time.
    assert!(server.counter("coli_steps_total") > 20.0 && server.counter("coli_step_seconds_total") > 0.0);
    assert_eq!(server.counter("coli_device_wait_seconds_total"), 0.0);
}

#[test]
fn bad_requests_get_openai_errors_and_the_server_keeps_serving() {
    let Some(path) = default_model_path() else { return };
    let server = Server::start(&["--model", path.to_str().unwrap(), "--parallel", "2", "--ctx", "64"]);
    let bad = |status: u16, path: &str, body: &str, needle: &str| {
        let mut s = TcpStream::connect(&server.addr).unwrap();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let got: u16 = text.split_whitespace().nth(1).unwrap().parse().unwrap();
        let body = dechunk_or_plain(&text);
        let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        assert_eq!(got, status, "{path} {body}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
        assert!(v["error"]["type"].is_string());
    };
    bad(400, "/v1/chat/completions", "{\"messages\": [", "not valid JSON");
    bad(400, "/v1/chat/completions", "{\"messages\": 5}", "does not fit the API");
    bad(400, "/v1/chat/completions", "{\"messages\": []}", "`messages` is empty");
    bad(
        404,
        "/v1/chat/completions",
        "{\"model\": \"gpt-9\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}",
        "gpt-9",
    );
    let hi = "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]";
    bad(400, "/v1/chat/completions", &format!("{{{hi}, \"max_tokens\": 0}}"), "at least 1");
    bad(400, "/v1/chat/completions", &format!("{{{hi}, \"n\": 2}}"), "one choice");
    bad(400, "/v1/chat/completions", &format!("{{{hi}, \"top_p\": 7}}"), "top_p");
    bad(400, "/v1/chat/completions", &format!("{{{hi}, \"frequency_penalty\": 0.5}}"), "repetition_penalty");
    bad(400, "/v1/completions", "{\"prompt\": {\"a\": 1}}", "string or an array");
    let long = "word ".repeat(200);
    bad(400, "/v1/completions", &format!("{{\"prompt\": \"{long}\"}}"), "context holds 64");
    bad(404, "/v2/anything", "{}", "no such route");
    assert_eq!(server.counter("coli_requests_rejected_total"), 1.0);

    // A client that goes away mid-stream is cancelled; the server answers the next request.
    let mut s = TcpStream::connect(&server.addr).unwrap();
    let body = json!({"prompt": "Once upon a time", "max_tokens": 40, "stream": true, "temperature": 0}).to_string();
    write!(s, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut first = [0u8; 64];
    let n = s.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    drop(s);
    let t0 = Instant::now();
    while server.counter("coli_requests_cancelled_total") < 1.0 {
        assert!(t0.elapsed() < Duration::from_secs(30), "the disconnected stream was not cancelled");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, v) = server.post("/v1/completions", &json!({"prompt": "Hello", "max_tokens": 3, "temperature": 0}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    let (status, health) = server.get("/health");
    assert_eq!(status, 200);
    let h: Value = serde_json::from_str(&health).unwrap();
    assert_eq!((h["status"].as_str(), h["running"].as_u64()), (Some("ok"), Some(0)));
}

fn dechunk_or_plain(response: &str) -> String {
    let (head, rest) = response.split_once("\r\n\r\n").unwrap();
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        dechunk(rest)
    } else {
        rest.to_string()
    }
}

/// Token ids in, token ids out (`return_tokens`), on a fixture without a tokenizer; past the
/// fixture's EOS id (its generation config's), as the references run.
fn ids_request(server: &Server, prompt: &[u32], max: usize, key: Option<&str>) -> (u16, Value) {
    let body =
        json!({"prompt": prompt, "max_tokens": max, "temperature": 0, "return_tokens": true, "ignore_eos": true});
    let (status, text) = server.request("POST", "/v1/completions", Some(&body), key);
    (status, serde_json::from_str(&text).unwrap())
}

fn tokens(v: &Value) -> Vec<u32> {
    common::ids(&v["choices"][0]["tokens"])
}

#[test]
fn the_api_key_guards_the_api_and_token_prompts_run_without_a_tokenizer() {
    let dir = fixture_dir("llama");
    let server = Server::start(&["--model", dir.to_str().unwrap(), "--device", "cpu", "--api-key", "sesame"]);
    let (status, text) = server.request("GET", "/v1/models", None, None);
    assert_eq!(status, 401, "{text}");
    assert_eq!(server.request("GET", "/v1/models", None, Some("sesame")).0, 200);
    assert_eq!(server.get("/health").0, 200);
    let prompt = [3u32, 14, 15, 92, 65];
    assert_eq!(ids_request(&server, &prompt, 4, Some("wrong")).0, 401);
    let (status, v) = ids_request(&server, &prompt, 4, Some("sesame"));
    assert_eq!(status, 200, "{v}");
    let engine = common::load_model(&dir);
    assert_eq!(tokens(&v), run_greedy(&engine, &prompt, 4, 4, 64, false).toks);
    // Chat needs a tokenizer: a 400 that says so.
    let (status, text) =
        server.request("POST", "/v1/chat/completions", Some(&chat_body(&[("user", "hi")], 2)), Some("sesame"));
    assert_eq!(status, 400);
    assert!(text.contains("tokenizer"), "{text}");
}

#[test]
fn concurrent_moe_requests_through_the_expert_tier_answer_as_the_cpu_does() {
    let dir = fixture_dir("olmoe");
    if !vulkan_present(&dir) {
        return;
    }
    let args = ["--model", dir.to_str().unwrap(), "--device", "vulkan", "--tier-experts", "3", "--parallel", "3"];
    let server = Server::start(&args);
    let cpu = common::load_model(&dir);
    let prompts: Vec<Vec<u32>> = (0..5u32).map(|k| (0..4 + k).map(|i| (i * 31 + k * 7 + 1) % 250).collect()).collect();
    let got: Vec<Vec<u32>> = std::thread::scope(|s| {
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| {
                let server = &server;
                s.spawn(move || tokens(&ids_request(server, p, 5, None).1))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (p, g) in prompts.iter().zip(&got) {
        assert_eq!(g, &run_greedy(&cpu, p, 4, 5, 64, false).toks, "prompt {p:?}");
    }
    assert!(server.counter("coli_tier_device_pairs_total") > 0.0);
    // Where the time went: the steps, and within them the waits for the device.
    let steps = server.counter("coli_steps_total");
    let (step, wait) = (server.counter("coli_step_seconds_total"), server.counter("coli_device_wait_seconds_total"));
    assert!(steps >= 5.0 && step > 0.0 && wait > 0.0, "steps {steps}, {step} s, device waits {wait} s");
    assert!(server.counter("coli_device_record_seconds_total") > 0.0);
}

fn vulkan_present(dir: &Path) -> bool {
    let o = Command::new(env!("CARGO_BIN_EXE_coli")).args(["probe", "-q"]).output().unwrap();
    let ok = o.status.success();
    if !ok {
        eprintln!("note: no Vulkan device for {}; skipping", dir.display());
    }
    ok
}

#[test]
fn curl_streams_a_completion() {
    let Some(path) = default_model_path() else { return };
    if Command::new("curl").arg("--version").output().is_err() {
        eprintln!("note: curl is not installed; skipping");
        return;
    }
    let server = Server::start(&["--model", path.to_str().unwrap(), "--ctx", "256"]);
    let url = format!("http://{}/v1/completions", server.addr);
    let body = json!({"prompt": "One, two,", "max_tokens": 6, "temperature": 0, "stream": true}).to_string();
    let o = Command::new("curl")
        .args(["-sS", "-N", "-H", "Content-Type: application/json", "-d", &body, &url])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ev = events(&String::from_utf8(o.stdout).unwrap());
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
    let text: String = ev[..ev.len() - 1]
        .iter()
        .map(|e| {
            serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"].as_str().unwrap_or_default().to_string()
        })
        .collect();
    let (non_streamed_status, v) =
        server.post("/v1/completions", &json!({"prompt": "One, two,", "max_tokens": 6, "temperature": 0}));
    assert_eq!(non_streamed_status, 200);
    assert_eq!(text, v["choices"][0]["text"].as_str().unwrap());
}

/// Resident memory of process `pid` in KiB (Linux), or `None`.
fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[test]
fn many_clients_with_bad_ones_among_them_all_get_their_own_answers() {
    let dir = fixture_dir("llama");
    let server =
        Server::start(&["--model", dir.to_str().unwrap(), "--device", "cpu", "--parallel", "4", "--ctx", "64"]);
    let engine = common::load_model(&dir);
    // Warm up once, then the idle level.
    assert_eq!(ids_request(&server, &[1, 2, 3], 2, None).0, 200);
    let idle = rss_kib(server.child.id());
    let t0 = Instant::now();
    let clients = 32;
    let per_client = 10;
    let failures: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..clients)
            .map(|c: u32| {
                let (server, engine) = (&server, &engine);
                s.spawn(move || {
                    let mut bad = Vec::new();
                    for r in 0..per_client {
                        let k = c * per_client + r;
                        match k % 10 {
                            // A malformed body.
                            3 => {
                                let (status, text) = server.request("POST", "/v1/completions", None, None);
                                if status != 400 {
                                    bad.push(format!("malformed: {status} {text}"));
                                }
                            }
                            // A prompt over the context.
                            5 => {
                                let (status, _) = ids_request(server, &[7; 80], 2, None);
                                if status != 400 {
                                    bad.push(format!("oversized: {status}"));
                                }
                            }
                            // A client that leaves mid-stream.
                            7 => {
                                let mut st = TcpStream::connect(&server.addr).unwrap();
                                let body = json!({"prompt": [1, 2, 3], "max_tokens": 30, "stream": true}).to_string();
                                let req = format!(
                                    "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
                                    body.len()
                                );
                                st.write_all(req.as_bytes()).unwrap();
                                let mut b = [0u8; 16];
                                let _ = st.read(&mut b);
                            }
                            _ => {
                                let len = 1 + (k as usize * 7) % 20;
                                let prompt: Vec<u32> = (0..len as u32).map(|i| (i * 13 + k) % 250).collect();
                                let max = 1 + (k as usize % 6);
                                let (status, v) = ids_request(server, &prompt, max, None);
                                let want = run_greedy(engine, &prompt, 4, max, 64, false).toks;
                                if status != 200 || tokens(&v) != want {
                                    bad.push(format!("request {k}: {status} {v} (want {want:?})"));
                                }
                            }
                        }
                    }
                    bad
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    assert!(failures.is_empty(), "{} failures, first: {:?}", failures.len(), failures.first());
    assert!(t0.elapsed() < Duration::from_secs(120), "320 requests took {:?}", t0.elapsed());
    let good = clients * per_client * 7 / 10;
    assert!(server.counter("coli_requests_completed_total") >= f64::from(good));
    // Nothing runs or waits afterwards, and memory is back near its idle level.
    let t1 = Instant::now();
    while server.counter("coli_requests_running") > 0.0 || server.counter("coli_queue_depth") > 0.0 {
        assert!(t1.elapsed() < Duration::from_secs(30), "requests left running");
        std::thread::sleep(Duration::from_millis(50));
    }
    if let (Some(before), Some(after)) = (idle, rss_kib(server.child.id())) {
        assert!(after < before + 64 * 1024, "resident memory grew from {before} KiB to {after} KiB");
    }
}

/// The python of the environment `tools/fetch-openai-client.sh` makes, when it is there.
fn openai_python() -> Option<std::path::PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache")))?;
    let p = cache.join("coli/venv-openai/bin/python");
    if p.is_file() {
        Some(p)
    } else {
        eprintln!("note: {} is absent (run tools/fetch-openai-client.sh); skipping", p.display());
        None
    }
}

/// Drives the server with the `openai` package: a chat, the same chat streamed, a completion,
/// the model list, and an error; prints what it got as one JSON object.
const OPENAI_SCRIPT: &str = r#"
import json, sys, openai
c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="sk-none", max_retries=0)
q = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
chat = c.chat.completions.create(model=sys.argv[2], messages=q, temperature=0, max_tokens=24)
parts = []
for chunk in c.chat.completions.create(model=sys.argv[2], messages=q, temperature=0, max_tokens=24, stream=True):
    if chunk.choices and chunk.choices[0].delta.content:
        parts.append(chunk.choices[0].delta.content)
comp = c.completions.create(model=sys.argv[2], prompt="The capital of France is", temperature=0, max_tokens=8)
try:
    c.chat.completions.create(model="no-such-model", messages=q)
    err = None
except openai.NotFoundError as e:
    err = e.status_code
print(json.dumps({
    "chat": chat.choices[0].message.content,
    "finish": chat.choices[0].finish_reason,
    "usage": [chat.usage.prompt_tokens, chat.usage.completion_tokens],
    "streamed": "".join(parts),
    "completion": comp.choices[0].text,
    "models": [m.id for m in c.models.list().data],
    "error": err,
}))
"#;

#[test]
fn the_openai_python_client_chats_streams_and_completes() {
    let Some(path) = default_model_path() else { return };
    let Some(python) = openai_python() else { return };
    let engine = common::load_model(&path);
    let server = Server::start(&["--model", path.to_str().unwrap(), "--ctx", "512"]);
    let o = Command::new(python)
        .args(["-c", OPENAI_SCRIPT, &format!("http://{}", server.addr), "SmolLM2-135M-Instruct.Q4_1"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let q = "What is the capital of France? Answer in one sentence.";
    let (want, prompt_tokens, completion_tokens) = reference(&engine, &Prompt::Chat { system: None, user: q }, 24);
    assert_eq!(v["chat"].as_str(), Some(want.as_str()));
    assert_eq!(v["streamed"], v["chat"]);
    assert_eq!(v["usage"], json!([prompt_tokens, completion_tokens]));
    assert!(v["finish"] == "stop" || v["finish"] == "length");
    assert_eq!(
        v["completion"].as_str(),
        Some(reference(&engine, &Prompt::Text("The capital of France is"), 8).0.as_str())
    );
    assert_eq!(v["models"], json!(["SmolLM2-135M-Instruct.Q4_1"]));
    assert_eq!(v["error"], 404);
}

#[test]
fn a_device_that_fails_mid_request_finishes_it_on_the_cpu_and_health_says_so() {
    let dir = fixture_dir("llama");
    if !vulkan_present(&dir) {
        return;
    }
    let args = ["--model", dir.to_str().unwrap(), "--device", "vulkan", "--fail-submit", "4", "--parallel", "2"];
    let server = Server::start(&args);
    let prompt: Vec<u32> = (0..6).map(|i| i * 11 + 3).collect();
    let (status, v) = ids_request(&server, &prompt, 8, None);
    assert_eq!(status, 200, "{v}");
    let cpu = common::load_model(&dir);
    assert_eq!(tokens(&v), run_greedy(&cpu, &prompt, 4, 8, 64, false).toks);
    let (_, health) = server.get("/health");
    let h: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(h["status"], "degraded", "{h}");
    assert_eq!(server.counter("coli_degraded"), 1.0);
    // It keeps serving, on the CPU.
    let (status, v) = ids_request(&server, &prompt[..3], 4, None);
    assert_eq!(status, 200, "{v}");
    assert_eq!(tokens(&v), run_greedy(&cpu, &prompt[..3], 4, 4, 64, false).toks);
}
