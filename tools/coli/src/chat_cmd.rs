//! `coli chat`: an interactive conversation in the terminal. Each turn goes through the
//! model's chat template with the whole history, in one slot of `coli_runtime::slots`, so the
//! history already computed is reused rather than run again. `/reset` forgets the history,
//! `/exit` (or Ctrl-D) leaves; Ctrl-C while the model answers stops the answer (what it said
//! so far stays in the history), and at the prompt clears the line. This file reads lines and
//! prints; generating is the runtime's.

use crate::engine_args::{heading, message};
use crate::load_args::LoadArgs;
use crate::sampling_args::SamplingArgs;
use clap::Args;
use coli_runtime::sample::SamplerConfig;
use coli_runtime::slots::{Event, Request, Slots};
use coli_runtime::text::ChatMessage;
use rustyline::error::ReadlineError;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// A system message at the start of the conversation.
    #[arg(long, help_heading = heading::GENERATION)]
    pub system: Option<String>,
    /// Tokens of one answer at most.
    #[arg(short = 'n', long = "max-tokens", default_value_t = 1024, help_heading = heading::GENERATION)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub speculate: crate::speculate_args::SpeculateArgs,
}

/// Sets a flag on each Ctrl-C (from the first call on, Ctrl-C no longer ends the program).
fn interrupts() -> Result<Arc<AtomicBool>, String> {
    let flag = Arc::new(AtomicBool::new(false));
    let f = flag.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("the Ctrl-C handler did not start: {e}"))?;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("coli-ctrl-c".into())
        .spawn(move || {
            rt.block_on(async move {
                // Registered before the main thread goes on, so no Ctrl-C is missed.
                #[cfg(unix)]
                {
                    use tokio::signal::unix::{signal, SignalKind};
                    let Ok(mut s) = signal(SignalKind::interrupt()) else { return };
                    let _ = ready_tx.send(());
                    while s.recv().await.is_some() {
                        f.store(true, Ordering::Relaxed);
                    }
                }
                #[cfg(not(unix))]
                {
                    let _ = ready_tx.send(());
                    while tokio::signal::ctrl_c().await.is_ok() {
                        f.store(true, Ordering::Relaxed);
                    }
                }
            })
        })
        .map_err(|e| format!("the Ctrl-C handler did not start: {e}"))?;
    let _ = ready_rx.recv();
    Ok(flag)
}

pub fn run(a: ChatArgs) -> Result<(), String> {
    // coli's chat defaults, under the checkpoint's generation config, under the flags.
    let front = SamplerConfig { temperature: 0.7, ..SamplerConfig::default() };
    a.sampling.config(&front)?;
    let (engine, _) = a.load.load_for(a.speculate.wants_draft())?;
    let sampler = a.sampling.config(&engine.generation_defaults().sampler(front))?;
    let tok = engine.tokenizer().ok_or_else(|| {
        let why = engine.tokenizer_note().map_or_else(String::new, |n| format!(": {n}"));
        format!("chat needs a tokenizer and the model has none{why}")
    })?;
    let template = tok.chat_template().map_err(|e| format!("the chat template: {e}"))?;
    let mut slots = Slots::new(&engine, 1, a.load.context(&engine), a.load.chunk).map_err(message)?;
    let stop = interrupts()?;
    let mut editor = rustyline::DefaultEditor::new().map_err(|e| format!("the line editor did not start: {e}"))?;
    let fresh = || a.system.iter().map(|s| ChatMessage::system(s.clone())).collect::<Vec<_>>();
    let mut history = fresh();
    eprintln!("coli: chatting with {} ({}); /reset forgets, /exit leaves", engine.path().display(), engine.summary());
    let mut turn = 0u64;
    loop {
        let line = match editor.readline("> ") {
            Ok(l) => l,
            Err(ReadlineError::Interrupted) => continue,
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(format!("reading a line: {e}")),
        };
        let line = line.trim();
        match line {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                history = fresh();
                eprintln!("coli: the conversation starts again");
                continue;
            }
            _ => {}
        }
        let _ = editor.add_history_entry(line);
        history.push(ChatMessage::user(line));
        let text = template.render(&history, true).map_err(|e| format!("the chat template: {e}"))?;
        let ids = tok.encode(&text, false).map_err(|e| e.to_string())?;
        turn += 1;
        // A conversation after /reset shares the system prompt: its state is kept there.
        let marks = engine.branch_points(&history, &ids);
        let request = Request {
            prompt: ids,
            sampler: SamplerConfig { seed: a.sampling.seed.wrapping_add(turn), ..sampler },
            max_new_tokens: a.max_tokens,
            stop_strings: Vec::new(),
            stop_at_eos: true,
            penalty_window: 64,
            speculation: a.speculate.speculation(),
            marks,
        };
        stop.store(false, Ordering::Relaxed);
        let answer = match slots.admit(turn, request) {
            Ok(_) => answer(&mut slots, turn, &stop),
            Err(e) => {
                eprintln!("coli: {e}; /reset to start again");
                history.pop();
                continue;
            }
        };
        history.push(ChatMessage::assistant(answer));
    }
    Ok(())
}

/// Streams request `id`'s answer to stdout until it ends or Ctrl-C; returns its text.
fn answer(slots: &mut Slots, id: u64, stop: &AtomicBool) -> String {
    let mut text = String::new();
    let mut out = std::io::stdout();
    'run: loop {
        if stop.load(Ordering::Relaxed) {
            slots.cancel(id);
            let _ = writeln!(out, " [stopped]");
            break;
        }
        for (_, e) in slots.step() {
            match e {
                Event::Text(t) => {
                    let _ = out.write_all(t.as_bytes());
                    let _ = out.flush();
                    text.push_str(&t);
                }
                Event::Done(_) => {
                    let _ = writeln!(out);
                    break 'run;
                }
                Event::Failed(e) => {
                    eprintln!("\ncoli: the answer failed: {e}");
                    break 'run;
                }
            }
        }
        for n in slots.take_notices() {
            tracing::warn!("{n}");
        }
    }
    text
}
