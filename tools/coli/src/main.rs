//! The `coli` command line: `compile` prints a plan, `exec` runs a model, `serve` serves one,
//! `chat` talks with one.

use clap::{Parser, Subcommand};
use coli::{bench_cmd, chat_cmd, compile_cmd, exec_cmd, probe_cmd, serve};

#[derive(Parser)]
#[command(name = "coli", version, about = "Runs Mixture-of-Experts language models on Vulkan GPUs and on the CPU")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// More messages on stderr (-v debug, -vv trace); `COLI_LOG` (a tracing filter) overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count, help_heading = coli::engine_args::heading::DIAGNOSTICS)]
    verbose: u8,
    /// Only warnings and errors on stderr.
    #[arg(short, long, global = true, conflicts_with = "verbose", help_heading = coli::engine_args::heading::DIAGNOSTICS)]
    quiet: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Compile an architecture spec for a checkpoint and a device profile; print the plan.
    Compile(compile_cmd::CompileArgs),
    /// Run a model on a prompt and stream the generated text.
    Exec(exec_cmd::ExecArgs),
    /// Measure prompt and decode tokens/s of a model.
    Bench(bench_cmd::BenchArgs),
    /// Open the Vulkan device(s) and print their profile as RON (for `coli compile --profile`).
    Probe(probe_cmd::ProbeArgs),
    /// Serve a model over an OpenAI-compatible HTTP API, several conversations at once.
    Serve(serve::ServeArgs),
    /// Chat with a model in the terminal (multi-turn, through its chat template).
    Chat(chat_cmd::ChatArgs),
}

fn main() {
    let cli = Cli::parse();
    coli::log::init(cli.verbose, cli.quiet);
    let result = match cli.command {
        Command::Compile(a) => compile_cmd::run(a),
        Command::Exec(a) => exec_cmd::run(a),
        Command::Bench(a) => bench_cmd::run(a),
        Command::Probe(a) => probe_cmd::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Chat(a) => chat_cmd::run(a),
    };
    if let Err(e) = result {
        eprintln!("coli: error: {e}");
        std::process::exit(1);
    }
}
