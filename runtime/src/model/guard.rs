//! The guard over mapped checkpoint files: a SIGBUS handler that turns a read of a mapped page
//! the file no longer has (the file was truncated or rewritten while coli runs) into one line
//! on stderr naming the file, and exit code 74 (`EX_IOERR`), instead of a crash (128 + SIGBUS).
//!
//! A registry of the mapped ranges (start address, length, the message pre-formatted when the
//! file was mapped) lives in a fixed static table, so the handler only reads atomics and
//! static bytes and calls `write(2)` and `_exit(2)`: async-signal-safe. The handler is
//! installed once, when the first file is mapped; a SIGBUS at an address outside every range
//! goes to the action that was installed before (the default, or the Rust runtime's), as if
//! the guard were not there. With every slot taken, a further file is mapped unguarded.
//!
//! Linux and Android only (`si_addr`); elsewhere `register` guards nothing. Must not: allocate,
//! lock or format in the handler, or free a message the handler may be reading.

/// The exit status after a guarded SIGBUS: `EX_IOERR` of `sysexits.h`.
pub const EXIT_CODE: i32 = 74;

/// A mapped range in the registry; unregistered when dropped (before the range is unmapped).
#[derive(Debug)]
pub struct Registration {
    #[cfg_attr(not(any(target_os = "linux", target_os = "android")), allow(dead_code))]
    slot: usize,
}

/// The message for a read of `path`'s map that failed: the handler appends the byte offset
/// and `SUFFIX`.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn message(path: &std::path::Path) -> String {
    format!(
        "error: {}: the checkpoint file shrank while in use (truncated or rewritten by another program): byte ",
        path.display()
    )
}

#[cfg(any(target_os = "linux", target_os = "android"))]
mod imp {
    use super::{message, Registration, EXIT_CODE};
    use std::cell::UnsafeCell;
    use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
    use std::sync::{Once, OnceLock};

    /// Enough for the largest sharded checkpoints (DeepSeek-V3's 163 files) several times over;
    /// untouched slots cost no memory (zeroed static pages).
    const SLOTS: usize = 1024;
    const MSG: usize = 1024;
    const SUFFIX: &[u8] = b" of the file can no longer be read; stopping\n";
    const FREE: u8 = 0;
    const WRITING: u8 = 1;
    const LIVE: u8 = 2;

    struct Slot {
        state: AtomicU8,
        start: AtomicUsize,
        len: AtomicUsize,
        msg_len: AtomicUsize,
        msg: UnsafeCell<[u8; MSG]>,
    }

    // SAFETY: `msg` is written only by the thread that moved `state` from FREE to WRITING, and
    // read (by the handler) only once `state` is LIVE, published with Release/Acquire.
    unsafe impl Sync for Slot {}

    #[allow(clippy::declare_interior_mutable_const)]
    const EMPTY: Slot = Slot {
        state: AtomicU8::new(FREE),
        start: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        msg_len: AtomicUsize::new(0),
        msg: UnsafeCell::new([0; MSG]),
    };
    static REGISTRY: [Slot; SLOTS] = [EMPTY; SLOTS];
    static INSTALL: Once = Once::new();
    /// The SIGBUS action before ours, for faults outside every range.
    static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

    pub fn register(path: &std::path::Path, start: usize, len: usize) -> Option<Registration> {
        INSTALL.call_once(install);
        PREVIOUS.get()?;
        let slot = REGISTRY
            .iter()
            .position(|s| s.state.compare_exchange(FREE, WRITING, Ordering::Acquire, Ordering::Relaxed).is_ok())?;
        let s = &REGISTRY[slot];
        let text = message(path);
        // Cut at a character boundary, leaving room for the offset and the suffix.
        let mut n = text.len().min(MSG - SUFFIX.len() - 24);
        while !text.is_char_boundary(n) {
            n -= 1;
        }
        // SAFETY: this thread owns the slot (WRITING) until it stores LIVE below.
        unsafe { (&mut *s.msg.get())[..n].copy_from_slice(&text.as_bytes()[..n]) };
        s.msg_len.store(n, Ordering::Relaxed);
        s.start.store(start, Ordering::Relaxed);
        s.len.store(len, Ordering::Relaxed);
        s.state.store(LIVE, Ordering::Release);
        Some(Registration { slot })
    }

    pub fn unregister(r: &Registration) {
        REGISTRY[r.slot].state.store(FREE, Ordering::Release);
    }

    fn install() {
        // SAFETY: plain sigaction calls with valid pointers; the handler is async-signal-safe.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                return;
            }
            let _ = PREVIOUS.set(old);
            let mut new: libc::sigaction = std::mem::zeroed();
            let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = on_sigbus;
            new.sa_sigaction = handler as usize;
            new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut new.sa_mask);
            libc::sigaction(libc::SIGBUS, &new, std::ptr::null_mut());
        }
    }

    /// Writes all of `b` to stderr (retrying short writes and EINTR; giving up on errors).
    fn write_all(mut b: &[u8]) {
        while !b.is_empty() {
            // SAFETY: write(2) on fd 2 from a valid slice.
            let n = unsafe { libc::write(2, b.as_ptr().cast(), b.len()) };
            if n > 0 {
                b = &b[n as usize..];
            } else if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            } else {
                return;
            }
        }
    }

    /// `x` in decimal, into `buf`; returns the digits.
    fn decimal(mut x: usize, buf: &mut [u8; 20]) -> &[u8] {
        let mut i = buf.len();
        loop {
            i -= 1;
            buf[i] = b'0' + (x % 10) as u8;
            x /= 10;
            if x == 0 {
                return &buf[i..];
            }
        }
    }

    extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
        let addr = unsafe { (*info).si_addr() } as usize;
        for s in REGISTRY.iter() {
            if s.state.load(Ordering::Acquire) != LIVE {
                continue;
            }
            let (start, len) = (s.start.load(Ordering::Relaxed), s.len.load(Ordering::Relaxed));
            if addr >= start && addr - start < len {
                let n = s.msg_len.load(Ordering::Relaxed).min(MSG);
                // SAFETY: a LIVE slot's message is not written until it is freed, and the map
                // it describes (which faulted just now) is still mapped.
                write_all(unsafe { &(&*s.msg.get())[..n] });
                write_all(decimal(addr - start, &mut [0; 20]));
                write_all(SUFFIX);
                // SAFETY: _exit(2) is async-signal-safe; nothing is unwound or flushed.
                unsafe { libc::_exit(EXIT_CODE) };
            }
        }
        // Not a mapped checkpoint: the previous action takes over. For a fault, returning
        // re-runs the instruction, which faults again under that action; a signal sent by
        // someone is sent again, delivered once this handler returns.
        if let Some(prev) = PREVIOUS.get() {
            // SAFETY: sigaction(2) and raise(3) are async-signal-safe.
            unsafe {
                libc::sigaction(sig, prev, std::ptr::null_mut());
                if (*info).si_code <= 0 {
                    libc::raise(sig);
                }
            }
        }
    }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
mod imp {
    use super::Registration;

    pub fn register(_path: &std::path::Path, _start: usize, _len: usize) -> Option<Registration> {
        None
    }

    pub fn unregister(_r: &Registration) {}
}

/// Registers the mapped range `[start, start + len)` of `path`: a SIGBUS inside it reports the
/// file and exits with `EXIT_CODE`. `None` when it cannot be guarded (no free slot, or no
/// handler on this platform).
pub fn register(path: &std::path::Path, start: usize, len: usize) -> Option<Registration> {
    imp::register(path, start, len)
}

impl Drop for Registration {
    fn drop(&mut self) {
        imp::unregister(self);
    }
}
