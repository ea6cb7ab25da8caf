//! The Khronos validation layer's messages, as counts (`Validation::On`): a `VK_EXT_debug_utils`
//! messenger per instance logs every message of severity error or warning to stderr in one line
//! and counts it in the context's `Log`. Errors also count process-wide: the context's next
//! submission fails with `VkError::Validation` (so a test that runs a frame fails where the
//! error happened), and at the process's end the errors nobody took
//! (`Context::take_validation_errors`) are summed up on stderr and the process exits with status
//! 1 (so an error no submission saw, one made while objects are destroyed or swallowed by the
//! executor's CPU fallback, still fails the run).
//!
//! Why not a `Drop` that panics: the tests' shared contexts live in statics and are never
//! dropped, a panic while a failing test unwinds aborts the process, and a context may be
//! dropped on a worker thread whose panic nobody reads. The submission error fails the test
//! that caused it with the message; the exit status catches the rest.
//!
//! Must not: panic inside the callback (it is called from the driver's stack), or filter
//! messages silently.

use ash::vk;
use std::ffi::{c_void, CStr};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

/// Error texts a log keeps (later errors are counted, not kept).
const KEEP: usize = 256;
/// Error texts the summary at the process's end prints.
const SUMMARY: usize = 8;

/// Messages of the validation layer seen: of severity error, and of severity warning.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ValidationCounts {
    pub errors: u64,
    pub warnings: u64,
}

/// One instance's messages (the messenger's user data).
pub(crate) struct Log {
    id: usize,
    state: Mutex<LogState>,
}

#[derive(Default)]
struct LogState {
    counts: ValidationCounts,
    /// The first `KEEP` error texts, in order.
    texts: Vec<String>,
    /// Errors already turned into a `VkError::Validation` (or taken).
    reported: u64,
    /// Errors taken by `take`.
    taken: u64,
}

/// Errors of every log not taken, and the first texts among them (log id, text).
#[derive(Default)]
struct Untaken {
    count: u64,
    first: Vec<(usize, String)>,
}

static UNTAKEN: Mutex<Untaken> = Mutex::new(Untaken { count: 0, first: Vec::new() });
static TOTAL: Mutex<ValidationCounts> = Mutex::new(ValidationCounts { errors: 0, warnings: 0 });
static NEXT_ID: AtomicUsize = AtomicUsize::new(0);
static EXIT_HOOK: Once = Once::new();

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The validation messages of every context of this process so far.
pub fn validation_counts() -> ValidationCounts {
    *lock(&TOTAL)
}

impl Log {
    /// A log for a new instance; the first one registers the check at the process's end.
    pub fn new() -> Log {
        EXIT_HOOK.call_once(register_exit_check);
        Log { id: NEXT_ID.fetch_add(1, Ordering::Relaxed), state: Mutex::new(LogState::default()) }
    }

    pub fn counts(&self) -> ValidationCounts {
        lock(&self.state).counts
    }

    /// The errors since the last call (or `take`): how many, and the first one's text.
    pub fn new_errors(&self) -> Option<(u64, String)> {
        let mut s = lock(&self.state);
        let new = s.counts.errors - s.reported;
        if new == 0 {
            return None;
        }
        let first = s.texts.get(s.reported as usize).cloned().unwrap_or_else(|| "(text not kept)".into());
        s.reported = s.counts.errors;
        Some((new, first))
    }

    /// The texts of the errors not taken yet (at most `KEEP` in all are kept); they no longer
    /// fail a submission or the process.
    pub fn take(&self) -> Vec<String> {
        let mut s = lock(&self.state);
        let from = (s.taken as usize).min(s.texts.len());
        let texts = s.texts[from..].to_vec();
        let n = s.counts.errors - s.taken;
        s.taken = s.counts.errors;
        s.reported = s.counts.errors;
        // Under the log's lock (the order `note` takes them), so no error of this log lands
        // between the two.
        let mut u = lock(&UNTAKEN);
        u.count -= n;
        u.first.retain(|(id, _)| *id != self.id);
        texts
    }

    fn note(&self, error: bool, text: String) {
        let mut s = lock(&self.state);
        let mut total = lock(&TOTAL);
        if !error {
            s.counts.warnings += 1;
            total.warnings += 1;
            return;
        }
        s.counts.errors += 1;
        total.errors += 1;
        drop(total);
        let mut u = lock(&UNTAKEN);
        u.count += 1;
        if u.first.len() < SUMMARY {
            u.first.push((self.id, text.clone()));
        }
        drop(u);
        if s.texts.len() < KEEP {
            s.texts.push(text);
        }
    }
}

/// The messenger's create info: errors and warnings of every type, into `log`.
pub(crate) fn messenger_info(log: &Log) -> vk::DebugUtilsMessengerCreateInfoEXT<'static> {
    vk::DebugUtilsMessengerCreateInfoEXT::default()
        .message_severity(vk::DebugUtilsMessageSeverityFlagsEXT::ERROR | vk::DebugUtilsMessageSeverityFlagsEXT::WARNING)
        .message_type(
            vk::DebugUtilsMessageTypeFlagsEXT::GENERAL
                | vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION
                | vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE,
        )
        .pfn_user_callback(Some(on_message))
        .user_data(log as *const Log as *mut c_void)
}

/// The messenger's callback: one line on stderr, one count.
///
/// # Safety
/// Called by the layer with valid callback data; `user` is the `Log` of `messenger_info`, alive
/// until the messenger and the instance are destroyed.
unsafe extern "system" fn on_message(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    _types: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    user: *mut c_void,
) -> vk::Bool32 {
    let error = severity.contains(vk::DebugUtilsMessageSeverityFlagsEXT::ERROR);
    let text = match data.as_ref().and_then(|d| d.message_as_c_str()) {
        Some(m) => one_line(m),
        None => "(no message)".to_string(),
    };
    if let Some(log) = (user as *const Log).as_ref() {
        log.note(error, text.clone());
    }
    let what = if error { "error" } else { "warning" };
    // Printed with `eprintln!` so a test's capture keeps it with that test's output; a failed
    // write must not unwind into the driver.
    let _ = std::panic::catch_unwind(|| eprintln!("vulkan validation {what}: {text}"));
    vk::FALSE
}

fn one_line(m: &CStr) -> String {
    m.to_string_lossy().split_whitespace().collect::<Vec<_>>().join(" ")
}

/// At the process's end: the errors nobody took, summed up on stderr, and exit status 1.
#[cfg(unix)]
extern "C" fn exit_check() {
    let u = lock(&UNTAKEN);
    if u.count == 0 {
        return;
    }
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "vulkan validation: {} error(s) in this process (the first {} below); exiting with status 1",
        u.count,
        u.first.len()
    );
    for (_, t) in &u.first {
        let _ = writeln!(err, "  {t}");
    }
    let _ = err.flush();
    // SAFETY: `_exit` ends the process at once and may be called from an exit handler (where
    // `exit` may not).
    unsafe { _exit(1) }
}

#[cfg(unix)]
extern "C" {
    fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
    fn _exit(status: std::ffi::c_int) -> !;
}

#[cfg(unix)]
fn register_exit_check() {
    // SAFETY: registers a plain function with the C library's exit handlers.
    let _ = unsafe { atexit(exit_check) };
}

/// Elsewhere no exit check: the submission errors and the counts remain.
#[cfg(not(unix))]
fn register_exit_check() {}
