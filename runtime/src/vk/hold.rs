//! The clock hold: while a forward whose device waits for the host between frames runs (an
//! offload layout: routed experts or layers on the CPU), a thread submits a one-workgroup
//! kernel (`shaders/hold.comp`, about a millisecond of dependent arithmetic at full clock) to
//! the compute family's second queue over and over, so the GPU never looks idle to its driver
//! and keeps its clock. Measured on an H100 (docs/BENCHMARKS.md, 2026-12-07 16:43): through a
//! hybrid decode the SM clock fell to 345-585 MHz and every trunk kernel took 3.6x its time.
//!
//! `Holder` is the thread and its state, generic over what one run is (a test counts runs
//! without a device); `Context::clock_hold` makes one over the device's second queue. A
//! forward takes a `HoldGuard` (`Holder::hold`); the thread runs while any guard lives and
//! sleeps otherwise. A run that fails stops the thread (the forward's own submissions report
//! a lost device; a hold never fails a forward).
//!
//! Must not: submit to the forwards' queue, or run while no forward holds it.

use super::context::Context;
use super::error::{Result, VkError};
use super::frame::{Bind, Recorded};
use super::push::HoldPush;
use super::shaders::Kernel;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// Dependent multiply-adds an invocation of the hold kernel runs: about a millisecond on an
/// H100 at full clock (a run's end is where a released hold stops, so it stays short).
pub const HOLD_ROUNDS: u32 = 1 << 19;

#[derive(Default)]
struct State {
    holds: usize,
    stop: bool,
    runs: u64,
    failed: Option<String>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The hold's thread; stopped (and joined) on drop.
pub struct Holder {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// While it lives, the holder runs.
pub struct HoldGuard<'a> {
    shared: &'a Shared,
}

impl Drop for HoldGuard<'_> {
    fn drop(&mut self) {
        self.shared.lock().holds -= 1;
    }
}

impl Holder {
    /// A thread that calls `make` once, then the run it made over and over while held. An
    /// error from either stops the thread (`failed` says why).
    pub fn spawn<R, M>(make: M) -> Holder
    where
        M: FnOnce() -> std::result::Result<R, VkError> + Send + 'static,
        R: FnMut() -> std::result::Result<(), VkError>,
    {
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let thread = std::thread::Builder::new().name("coli-clock-hold".into()).spawn(move || {
            let stopped = |e: VkError| s.lock().failed = Some(e.to_string());
            let mut run = match make() {
                Ok(r) => r,
                Err(e) => return stopped(e),
            };
            loop {
                {
                    let mut st = s.lock();
                    while st.holds == 0 && !st.stop {
                        st = s.wake.wait(st).unwrap_or_else(|p| p.into_inner());
                    }
                    if st.stop {
                        return;
                    }
                }
                if let Err(e) = run() {
                    return stopped(e);
                }
                s.lock().runs += 1;
            }
        });
        let thread = match thread {
            Ok(t) => Some(t),
            Err(e) => {
                shared.lock().failed = Some(format!("the hold's thread did not start: {e}"));
                None
            }
        };
        Holder { shared, thread }
    }

    /// Runs the hold until the guard is dropped (nothing where the thread stopped).
    pub fn hold(&self) -> HoldGuard<'_> {
        self.shared.lock().holds += 1;
        self.shared.wake.notify_all();
        HoldGuard { shared: &self.shared }
    }

    /// Runs completed so far.
    pub fn runs(&self) -> u64 {
        self.shared.lock().runs
    }

    /// Why the thread stopped, where a run failed.
    pub fn failed(&self) -> Option<String> {
        self.shared.lock().failed.clone()
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Context {
    /// `VkOptions::clock_hold` as given.
    pub fn clock_hold_use(&self) -> super::ClockHoldUse {
        self.shared.clock_hold
    }

    /// A clock hold over this device's second compute queue, or `None` where it has one queue.
    pub fn clock_hold(&self) -> Option<Holder> {
        self.shared.dev.queue2?;
        let ctx = self.clone();
        Some(Holder::spawn(move || {
            let rec = record_hold(&ctx)?;
            Ok(move || rec.run_second())
        }))
    }
}

/// One dispatch of the hold kernel, recorded to run many times.
fn record_hold(ctx: &Context) -> Result<Recorded> {
    let out = ctx.f32_buffer(32)?;
    let mut f = ctx.recording()?;
    record_into(&mut f, &out, HOLD_ROUNDS)?;
    f.finish()
}

/// Records the hold kernel once into `f` with `rounds` (tests run it in a frame on devices of
/// one queue).
pub fn record_into<'a>(f: &mut super::Frame<'a>, out: &'a super::DeviceBuffer, rounds: u32) -> Result<()> {
    let push = HoldPush { rounds, pad0: 0, pad1: 0, pad2: 0 };
    f.hint("hold");
    f.dispatch(Kernel::Hold, None, &[Bind::buf(out)], &push, [1, 1, 1])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    fn wait_until(f: impl Fn() -> bool) -> bool {
        let t = Instant::now();
        while !f() {
            if t.elapsed() > Duration::from_secs(10) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    #[test]
    fn the_holder_runs_only_while_held_and_stops_when_dropped() {
        let calls = Arc::new(AtomicU64::new(0));
        let c = calls.clone();
        let h = Holder::spawn(move || {
            Ok(move || {
                c.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_micros(200));
                Ok(())
            })
        });
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(calls.load(Ordering::SeqCst), 0, "no run without a hold");
        {
            let _a = h.hold();
            let _b = h.hold();
            assert!(wait_until(|| h.runs() >= 3));
        }
        // Released: at most a run that had passed its check already still starts; then none.
        let mut after = calls.load(Ordering::SeqCst);
        for _ in 0..50 {
            std::thread::sleep(Duration::from_millis(20));
            let now = calls.load(Ordering::SeqCst);
            if now == after {
                break;
            }
            after = now;
        }
        assert!(after <= h.runs() + 1, "{after} runs started, {} finished", h.runs());
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(calls.load(Ordering::SeqCst), after, "runs after the last guard went");
        let _g = h.hold();
        assert!(wait_until(|| calls.load(Ordering::SeqCst) > after), "held again, it runs again");
        drop(_g);
        assert_eq!(h.failed(), None);
        drop(h);
    }

    #[test]
    fn a_failing_run_stops_the_holder_and_says_why() {
        let h = Holder::spawn(|| Ok(|| Err(VkError::BadArgument { op: "hold", msg: "injected".into() })));
        let _g = h.hold();
        assert!(wait_until(|| h.failed().is_some()));
        assert!(h.failed().unwrap().contains("injected"));
        assert_eq!(h.runs(), 0);
        // A failed holder still takes and drops guards, and drops cleanly.
        drop(_g);
        let _g2 = h.hold();
        drop(_g2);
        let h2 = Holder::spawn(|| -> std::result::Result<fn() -> std::result::Result<(), VkError>, VkError> {
            Err(VkError::BadArgument { op: "hold", msg: "no recording".into() })
        });
        assert!(wait_until(|| h2.failed().is_some()));
    }
}
