//! The command line's messages on stderr, through `tracing`: one line each, `coli: ` first
//! (`coli: warning: `, `coli: debug: ` for those levels). The level is `info` by default, `warn`
//! with `-q`, `debug` with `-v` and `trace` with `-vv`; `COLI_LOG` (a `tracing` filter such as
//! `debug` or `coli_runtime=trace`) replaces it. Generated text goes to stdout and never through
//! here; when a message comes while a streamed line is open on the same terminal, it starts on
//! a line of its own. Must not: print anything to stdout.

use std::fmt;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// Whether stdout holds a streamed line that has not ended yet.
static OPEN_LINE: AtomicBool = AtomicBool::new(false);

/// Says whether the text just written to stdout left its line open (no trailing newline).
pub fn note_stdout(text: &str) {
    if !text.is_empty() {
        OPEN_LINE.store(!text.ends_with('\n'), Ordering::Relaxed);
    }
}

/// The level the flags ask for: `-q` warnings and errors only, each `-v` one level more.
pub fn level(verbose: u8, quiet: bool) -> Level {
    match (quiet, verbose) {
        (true, _) => Level::WARN,
        (false, 0) => Level::INFO,
        (false, 1) => Level::DEBUG,
        _ => Level::TRACE,
    }
}

/// Installs the stderr logger (once; later calls change nothing).
pub fn init(verbose: u8, quiet: bool) {
    let filter = match std::env::var("COLI_LOG") {
        Ok(f) if !f.trim().is_empty() => EnvFilter::new(f),
        _ => EnvFilter::new(level(verbose, quiet).as_str().to_lowercase()),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .event_format(Line { both_terminals: std::io::stderr().is_terminal() && std::io::stdout().is_terminal() })
        .try_init();
}

/// One message a line, `coli: ` first.
struct Line {
    both_terminals: bool,
}

impl<S, N> FormatEvent<S, N> for Line
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut w: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        if self.both_terminals && OPEN_LINE.swap(false, Ordering::Relaxed) {
            writeln!(w)?;
        }
        let tag = match *event.metadata().level() {
            Level::ERROR => "error: ",
            Level::WARN => "warning: ",
            Level::INFO => "",
            Level::DEBUG => "debug: ",
            Level::TRACE => "trace: ",
        };
        write!(w, "coli: {tag}")?;
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_choose_the_level() {
        assert_eq!(level(0, false), Level::INFO);
        assert_eq!(level(1, false), Level::DEBUG);
        assert_eq!(level(3, false), Level::TRACE);
        assert_eq!(level(2, true), Level::WARN);
    }

    #[test]
    fn an_open_line_is_remembered_until_it_ends() {
        note_stdout("Paris");
        assert!(OPEN_LINE.load(Ordering::Relaxed));
        note_stdout("");
        assert!(OPEN_LINE.load(Ordering::Relaxed));
        note_stdout(".\n");
        assert!(!OPEN_LINE.load(Ordering::Relaxed));
    }
}
