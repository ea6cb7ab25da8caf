//! The server's counters, shared by the engine thread (which counts) and the HTTP side (which
//! shows them at `/metrics` in Prometheus' text format and at `/health`).
//!
//! Must not: lock (every field is an atomic).

use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Metrics {
    /// Requests the engine thread received.
    pub requests: AtomicU64,
    pub completed: AtomicU64,
    /// Refused before running (bad prompt, full queue).
    pub rejected: AtomicU64,
    pub failed: AtomicU64,
    /// Ended because the client went away.
    pub cancelled: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub cached_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    pub queued: AtomicU64,
    pub running: AtomicU64,
    /// The expert tier's routed pairs and those its devices served.
    pub tier_routed: AtomicU64,
    pub tier_device: AtomicU64,
    /// Bytes of the slots' host caches and of their kept recurrent states (part of the first).
    pub cache_bytes: AtomicU64,
    pub snapshot_bytes: AtomicU64,
    /// A device failed and requests continue on the CPU.
    pub degraded: AtomicBool,
    /// Steps of the slots (one forward for every running request) and the nanoseconds they took.
    pub steps: AtomicU64,
    pub step_ns: AtomicU64,
    /// Nanoseconds the devices' submissions were waited for, and their frames recorded (all
    /// devices, since the start).
    pub device_wait_ns: AtomicU64,
    pub device_record_ns: AtomicU64,
}

impl Metrics {
    /// Prometheus' text exposition format.
    pub fn render(&self, slots: usize) -> String {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut out = String::new();
        let mut line = |name: &str, kind: &str, help: &str, value: f64| {
            let _ = writeln!(out, "# HELP coli_{name} {help}\n# TYPE coli_{name} {kind}\ncoli_{name} {value}");
        };
        line("requests_total", "counter", "Requests received.", get(&self.requests) as f64);
        line("requests_completed_total", "counter", "Requests answered in full.", get(&self.completed) as f64);
        line("requests_rejected_total", "counter", "Requests refused before running.", get(&self.rejected) as f64);
        line("requests_failed_total", "counter", "Requests that failed while running.", get(&self.failed) as f64);
        line("requests_cancelled_total", "counter", "Requests whose client went away.", get(&self.cancelled) as f64);
        line("prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", get(&self.prompt_tokens) as f64);
        line(
            "prompt_tokens_cached_total",
            "counter",
            "Prompt tokens reused from a slot's cache.",
            get(&self.cached_tokens) as f64,
        );
        line("completion_tokens_total", "counter", "Tokens generated.", get(&self.completion_tokens) as f64);
        line("queue_depth", "gauge", "Requests waiting for a slot.", get(&self.queued) as f64);
        line("requests_running", "gauge", "Requests in a slot.", get(&self.running) as f64);
        line("slots", "gauge", "Conversation slots.", slots as f64);
        line(
            "kv_cache_bytes",
            "gauge",
            "Bytes of the slots' host caches (K/V rows, recurrent states and their kept copies).",
            get(&self.cache_bytes) as f64,
        );
        line(
            "state_snapshot_bytes",
            "gauge",
            "Bytes of recurrent states kept for prefix reuse (part of kv_cache_bytes).",
            get(&self.snapshot_bytes) as f64,
        );
        let (routed, device) = (get(&self.tier_routed), get(&self.tier_device));
        line(
            "tier_routed_pairs_total",
            "counter",
            "Routed (row, expert) pairs through the expert tier.",
            routed as f64,
        );
        line("tier_device_pairs_total", "counter", "Routed pairs the tier's devices served.", device as f64);
        let rate = if routed == 0 { 0.0 } else { device as f64 / routed as f64 };
        line("tier_hit_rate", "gauge", "Share of routed pairs the devices served.", rate);
        line("steps_total", "counter", "Steps: one forward for every running request.", get(&self.steps) as f64);
        let secs = |a: &AtomicU64| get(a) as f64 * 1e-9;
        line("step_seconds_total", "counter", "Seconds the steps took.", secs(&self.step_ns));
        line(
            "device_wait_seconds_total",
            "counter",
            "Seconds the host waited for the devices' submissions.",
            secs(&self.device_wait_ns),
        );
        line(
            "device_record_seconds_total",
            "counter",
            "Seconds the host spent recording the devices' frames.",
            secs(&self.device_record_ns),
        );
        let degraded = if self.degraded.load(Ordering::Relaxed) { 1.0 } else { 0.0 };
        line("degraded", "gauge", "1 after a device failed (requests continue on the CPU).", degraded);
        out
    }
}
