//! A small team of worker threads for the CPU kernels' data parallelism (`run`): the calling
//! thread and `threads() - 1` helpers share the tasks `0..tasks` of one job, claimed one at a
//! time from a single atomic word. Helpers spin for a short while after each job before they
//! sleep, so the next op of a forward reaches them in well under a microsecond instead of
//! through a futex wake-up (a decode step runs a few hundred ops of tens of microseconds each,
//! where a rayon hand-off per op cost a third of the time on two cores).
//!
//! One caller at a time owns the team; a call made while it is busy (from a helper inside a
//! task, or from another thread) runs its tasks inline on the calling thread, so nesting and
//! concurrent callers are always correct, merely serial.
//!
//! The claim word packs the job's epoch, task count and next task index, so a helper that
//! read a finished job's word can never claim a task of the next job by mistake: its
//! compare-and-swap fails on the epoch. A claimed task keeps its job alive (the caller waits
//! for every task to finish), so a helper reads the job's closure only after claiming.
//!
//! Must not: hold locks while running tasks, or let a task's panic escape a helper (it is
//! caught and re-raised on the caller).

use std::any::Any;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

const EPOCH_BITS: u32 = 24;
const TASK_BITS: u32 = 20;
/// The most tasks one job may have.
pub const MAX_TASKS: usize = (1 << TASK_BITS) - 1;
const TASK_MASK: u64 = (1 << TASK_BITS) - 1;
const EPOCH_MASK: u64 = (1 << EPOCH_BITS) - 1;
/// How long an idle helper polls for the next job before it sleeps.
const SPIN: Duration = Duration::from_micros(100);

type Task<'a> = dyn Fn(usize) + Sync + 'a;

struct Team {
    helpers: usize,
    /// `epoch << 40 | tasks << 20 | next`.
    word: AtomicU64,
    /// Tasks finished (by anyone) of the current job.
    done: AtomicUsize,
    busy: AtomicBool,
    /// The current job's closure; written by the owning caller before it publishes `word`.
    job: UnsafeCell<Option<*const Task<'static>>>,
    /// The caller's epoch counter (touched only by the owner).
    epoch: UnsafeCell<u64>,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    sleeping: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` and `epoch` are written only by the thread that holds `busy`, before it
// publishes the job with a release store of `word`; helpers read `job` only after a successful
// acquire CAS on `word` for that epoch, while the job cannot finish (their task is unfinished).
unsafe impl Sync for Team {}

fn pack(epoch: u64, tasks: u64, next: u64) -> u64 {
    epoch << (2 * TASK_BITS) | tasks << TASK_BITS | next
}

fn unpack(w: u64) -> (u64, u64, u64) {
    (w >> (2 * TASK_BITS), (w >> TASK_BITS) & TASK_MASK, w & TASK_MASK)
}

/// Threads the kernels use: `COLI_THREADS` if set, else the machine's available parallelism.
pub fn threads() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("COLI_THREADS")
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .min(64)
    })
}

fn team() -> &'static Team {
    static TEAM: OnceLock<&'static Team> = OnceLock::new();
    TEAM.get_or_init(|| {
        let helpers = threads() - 1;
        let t: &'static Team = Box::leak(Box::new(Team {
            helpers,
            word: AtomicU64::new(0),
            done: AtomicUsize::new(0),
            busy: AtomicBool::new(false),
            job: UnsafeCell::new(None),
            epoch: UnsafeCell::new(0),
            panic: Mutex::new(None),
            sleeping: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        }));
        for i in 0..helpers {
            std::thread::Builder::new()
                .name(format!("coli-cpu-{}", i + 1))
                .spawn(move || helper(t))
                .expect("spawning a CPU worker thread");
        }
        t
    })
}

impl Team {
    /// Claims the next task of job `epoch`, or `None` when it has none left (or has ended).
    fn claim(&self, epoch: u64) -> Option<usize> {
        let mut w = self.word.load(Ordering::Acquire);
        loop {
            let (e, tasks, next) = unpack(w);
            if e != epoch || next >= tasks {
                return None;
            }
            match self.word.compare_exchange_weak(w, w + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(next as usize),
                Err(now) => w = now,
            }
        }
    }

    /// Runs claimed tasks of job `epoch` until none is left; returns how many ran.
    fn work(&self, epoch: u64, first: usize) -> usize {
        // SAFETY: task `first` of `epoch` is claimed and unfinished, so the caller is still
        // inside `run` and the closure it published for this epoch is alive.
        let f = unsafe { &*(*self.job.get()).expect("a published job") };
        let mut count = 0;
        let mut i = Some(first);
        while let Some(t) = i {
            if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(t))) {
                self.panic.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(p);
            }
            count += 1;
            i = self.claim(epoch);
        }
        count
    }
}

fn helper(t: &'static Team) {
    let mut seen = unpack(t.word.load(Ordering::Acquire)).0;
    loop {
        let since = Instant::now();
        let mut polls = 0u32;
        let epoch = loop {
            let (e, tasks, next) = unpack(t.word.load(Ordering::Acquire));
            if e != seen {
                if next < tasks {
                    break e;
                }
                seen = e;
            }
            polls += 1;
            if !polls.is_multiple_of(256) {
                std::hint::spin_loop();
                continue;
            }
            if since.elapsed() < SPIN {
                continue;
            }
            let guard = t.lock.lock().unwrap_or_else(|e| e.into_inner());
            t.sleeping.fetch_add(1, Ordering::SeqCst);
            let (e, tasks, next) = unpack(t.word.load(Ordering::SeqCst));
            if e == seen || next >= tasks {
                drop(t.wake.wait_timeout(guard, Duration::from_secs(1)).unwrap_or_else(|e| e.into_inner()));
            } else {
                drop(guard);
            }
            t.sleeping.fetch_sub(1, Ordering::SeqCst);
        };
        seen = epoch;
        if let Some(first) = t.claim(epoch) {
            let n = t.work(epoch, first);
            t.done.fetch_add(n, Ordering::Release);
        }
    }
}

thread_local! {
    /// Set while this thread runs `inline`'s closure: its `run`s stay on it.
    static INLINE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with every `run` it makes on this thread inline (the team left alone): for work
/// that another pool already spreads over the cores (rayon's tasks), so the team's helpers
/// neither join one of them nor spin beside them.
pub fn inline<R>(f: impl FnOnce() -> R) -> R {
    /// Puts the flag back as it was, also when `f` panics.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            INLINE.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(INLINE.with(|c| c.replace(true)));
    f()
}

/// Whether a `run` called now on this thread would run its tasks inline on it (one thread,
/// inside `inline`, or the team busy with another job).
pub fn busy() -> bool {
    threads() == 1 || INLINE.with(|c| c.get()) || team().busy.load(Ordering::Acquire)
}

/// Runs `f(0)`, ..., `f(tasks - 1)`, spread over the team (the caller takes part), and returns
/// when all have finished. Order and placement of tasks are unspecified; a panicking task
/// panics the caller after every task has finished.
pub fn run(tasks: usize, f: &(dyn Fn(usize) + Sync)) {
    let t = if tasks > 1 { team() } else { return (0..tasks).for_each(f) };
    if t.helpers == 0 || tasks > MAX_TASKS || INLINE.with(|c| c.get()) || t.busy.swap(true, Ordering::Acquire) {
        return run_inline(tasks, f);
    }
    // SAFETY: we own the team (`busy`); helpers read `job` only after claiming a task of the
    // epoch published below, and `run` does not return before all of them have finished, so
    // extending the closure's lifetime to 'static never lets it be called after it dies.
    let epoch = unsafe {
        let e = &mut *t.epoch.get();
        *e = (*e + 1) & EPOCH_MASK;
        *t.job.get() = Some(std::mem::transmute::<*const Task<'_>, *const Task<'static>>(f as *const Task<'_>));
        *e
    };
    t.done.store(0, Ordering::Relaxed);
    t.word.store(pack(epoch, tasks as u64, 0), Ordering::SeqCst);
    if t.sleeping.load(Ordering::SeqCst) > 0 {
        let _g = t.lock.lock().unwrap_or_else(|e| e.into_inner());
        t.wake.notify_all();
    }
    let mine = match t.claim(epoch) {
        Some(first) => t.work(epoch, first),
        None => 0,
    };
    let mut finished = t.done.fetch_add(mine, Ordering::AcqRel) + mine;
    let mut polls = 0u32;
    while finished < tasks {
        polls += 1;
        if polls.is_multiple_of(1024) {
            // A helper was descheduled mid-task: let it run.
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
        finished = t.done.load(Ordering::Acquire);
    }
    let panic = t.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
    t.busy.store(false, Ordering::Release);
    if let Some(p) = panic {
        std::panic::resume_unwind(p);
    }
}

/// All tasks on the calling thread, with `run`'s panic behaviour (every task runs; the first
/// panic is re-raised at the end).
fn run_inline(tasks: usize, f: &(dyn Fn(usize) + Sync)) {
    let mut first = None;
    for i in 0..tasks {
        if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(i))) {
            first.get_or_insert(p);
        }
    }
    if let Some(p) = first {
        std::panic::resume_unwind(p);
    }
}

/// A raw pointer that tasks share to write disjoint parts of one buffer.
#[derive(Clone, Copy)]
pub struct SendPtr<T>(pub *mut T);

impl<T> SendPtr<T> {
    /// The pointer (a method, so closures capture the whole `SendPtr`, not its field).
    pub fn get(self) -> *mut T {
        self.0
    }
}

// SAFETY: users write disjoint elements from different tasks (their own invariant).
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_task_runs_exactly_once() {
        for tasks in [0usize, 1, 2, 3, 17, 1000] {
            let hits: Vec<AtomicU32> = (0..tasks).map(|_| AtomicU32::new(0)).collect();
            for _ in 0..50 {
                run(tasks, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
            }
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 50), "tasks {tasks}");
        }
    }

    #[test]
    fn nested_and_concurrent_calls_run_inline() {
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..200 {
                        run(4, &|_| {
                            run(3, &|_| {
                                total.fetch_add(1, Ordering::Relaxed);
                            });
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 4 * 200 * 12);
    }

    #[test]
    fn inside_inline_every_run_stays_on_its_thread() {
        let me = std::thread::current().id();
        let others = AtomicUsize::new(0);
        inline(|| {
            assert!(busy());
            run(64, &|_| {
                if std::thread::current().id() != me {
                    others.fetch_add(1, Ordering::Relaxed);
                }
            });
        });
        assert_eq!(others.load(Ordering::Relaxed), 0);
        // The flag is this thread's, and put back after a panic inside.
        assert!(!INLINE.with(|c| c.get()));
        assert!(std::panic::catch_unwind(|| inline(|| panic!("inside"))).is_err());
        assert!(!INLINE.with(|c| c.get()));
    }

    #[test]
    fn a_task_panic_reaches_the_caller_after_all_tasks() {
        let done = AtomicUsize::new(0);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run(8, &|i| {
                if i == 5 {
                    panic!("task five");
                }
                done.fetch_add(1, Ordering::Relaxed);
            })
        }));
        assert!(r.is_err());
        assert_eq!(done.load(Ordering::Relaxed), 7);
        // The team still works.
        let n = AtomicUsize::new(0);
        run(10, &|_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 10);
    }
}
