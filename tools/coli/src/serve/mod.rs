//! `coli serve`: an OpenAI-compatible HTTP server over one model. The model loads on its own
//! engine thread (`worker`), which owns it and `--parallel` conversation slots with prefix
//! reuse; the HTTP side (`http`, on tokio and axum) checks each request (`api`), hands it to
//! that thread and streams the answer back. Counters for `/metrics` and `/health` are in
//! `metrics`. Ctrl-C stops the server.
//!
//! Must not: hold engine logic (the runtime's `slots` and `Engine` do).

mod api;
mod http;
mod metrics;
mod worker;

use crate::engine_args::heading;
use crate::load_args::LoadArgs;
use clap::Args;
use coli_runtime::sample::SamplerConfig;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{mpsc, Arc, Mutex};

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1", help_heading = heading::SERVER)]
    pub host: String,
    /// The port to listen on (0: any free port; the address is printed).
    #[arg(long, default_value_t = 8080, help_heading = heading::SERVER)]
    pub port: u16,
    /// Conversations served at once (each has its own KV cache); more requests wait.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256), help_heading = heading::SERVER)]
    pub parallel: u16,
    /// Requests that may wait for a slot; beyond them a request gets 503.
    #[arg(long, default_value_t = 256, help_heading = heading::SERVER)]
    pub max_queue: usize,
    /// Require `Authorization: Bearer KEY` on the API's routes.
    #[arg(long, help_heading = heading::SERVER)]
    pub api_key: Option<String>,
    /// The model's name in the API (default: the hub id given to --model, else the
    /// checkpoint's file or directory name).
    #[arg(long, help_heading = heading::SERVER)]
    pub alias: Option<String>,
    /// Drafts for a conversation that decodes alone (several at once decode a token each).
    #[command(flatten)]
    pub speculate: crate::speculate_args::SpeculateArgs,
}

/// The name a checkpoint's path gives the model: its file stem or its directory's name.
pub fn model_id(path: &Path) -> String {
    let name = if path.is_dir() { path.file_name() } else { path.file_stem() };
    name.map_or_else(|| "model".to_string(), |n| n.to_string_lossy().into_owned())
}

pub fn run(a: ServeArgs) -> Result<(), String> {
    let addr: SocketAddr =
        format!("{}:{}", a.host, a.port).parse().map_err(|e| format!("--host {} --port {}: {e}", a.host, a.port))?;
    let metrics = Arc::new(metrics::Metrics::default());
    let (jobs_tx, jobs_rx) = mpsc::channel::<worker::Submission>();
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(String, SamplerConfig), String>>();
    let slots = usize::from(a.parallel);
    let load = a.load.clone();
    let m = metrics.clone();
    let max_queue = a.max_queue;
    let speculation = a.speculate.speculation();
    let draft = a.speculate.wants_draft();
    // The engine thread owns the model from its load to the end.
    let engine_thread = std::thread::Builder::new()
        .name("coli-engine".into())
        .spawn(move || {
            let (engine, path) = match load.load_for(draft) {
                Ok(e) => e,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let cfg = worker::WorkerConfig {
                slots,
                context: load.context(&engine),
                chunk_rows: load.chunk,
                max_queue,
                speculation,
            };
            let slots = match worker::slots(&engine, &cfg) {
                Ok(s) => s,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let sampling = engine.generation_defaults().sampler(SamplerConfig::default());
            let _ = ready_tx.send(Ok((model_id(&path), sampling)));
            worker::run(&engine, slots, &cfg, jobs_rx, m);
            if let Some(line) = engine.ram_summary() {
                tracing::info!("{line}");
            }
            if let Some(d) = engine.device() {
                if let Some(line) = d.tier_summary() {
                    tracing::info!("{line}");
                }
                if let Err(e) = d.save_tier_history() {
                    tracing::warn!("the routing history was not saved: {e}");
                }
            }
        })
        .map_err(|e| format!("the engine thread did not start: {e}"))?;
    let (model_id, sampling) = ready_rx.recv().map_err(|_| "the engine thread stopped while loading".to_string())??;
    // A hub id (`org/name`) names the model as the user gave it, not by its snapshot's folder.
    let given = a.load.model.model.as_ref().filter(|p| !p.exists()).map(|p| p.display().to_string());
    let model_id = a.alias.clone().or(given).unwrap_or(model_id);
    let state = Arc::new(http::AppState {
        jobs: Mutex::new(jobs_tx),
        model_id: model_id.clone(),
        api_key: a.api_key.clone(),
        sampling,
        metrics,
        slots,
        started: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        next_id: AtomicU64::new(1),
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("the server's runtime did not start: {e}"))?;
    rt.block_on(async move {
        let listener =
            tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let local = listener.local_addr().map_err(|e| e.to_string())?;
        // The one line on stdout: where to connect (tests and scripts read it).
        println!("coli: serving {model_id} on http://{local} ({slots} slots)");
        let shutdown = async {
            let _ = tokio::signal::ctrl_c().await;
            tracing::info!("stopping");
        };
        axum::serve(listener, http::router(state)).with_graceful_shutdown(shutdown).await.map_err(|e| e.to_string())
    })?;
    // The router (and with it the last sender of jobs) is gone: the engine thread ends.
    let _ = engine_thread.join();
    Ok(())
}
