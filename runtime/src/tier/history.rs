//! The routing history: how often each routed expert of each layer was routed, kept in a
//! small text file beside the checkpoint, merged with every run's routings at its end, and read
//! at startup to fill the tier hottest first (the warm start).
//!
//! Format (text, one header line, then a line per MoE layer):
//! ```text
//! coli-usage 1 experts 64
//! 3 0 17 2 ...        # layer index, then one count per expert
//! ```
//! A file that does not parse, or whose expert count differs from the model's, is reported and
//! ignored (the run starts cold and rewrites it); it never stops a run. Writes go to a
//! temporary file renamed over the old one, so a crash leaves the old history.
//!
//! Must not: decide residency (the tier reads the counts), or touch the device.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Counts per layer index, each `experts` long.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    pub experts: usize,
    pub layers: BTreeMap<usize, Vec<u64>>,
}

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}:{line}: {msg}")]
    Parse { path: PathBuf, line: usize, msg: String },
}

/// Where the history of a checkpoint lives: `<file>.coli_usage` beside a single-file
/// checkpoint, `<dir>/.coli_usage` in a checkpoint directory.
pub fn path_for(checkpoint: &Path) -> PathBuf {
    if checkpoint.is_dir() {
        checkpoint.join(".coli_usage")
    } else {
        let mut name = checkpoint.file_name().map(|n| n.to_os_string()).unwrap_or_default();
        name.push(".coli_usage");
        checkpoint.with_file_name(name)
    }
}

impl History {
    pub fn new(experts: usize) -> History {
        History { experts, layers: BTreeMap::new() }
    }

    /// Adds `counts` (one per expert) to layer `l`.
    pub fn add(&mut self, l: usize, counts: &[u64]) {
        let row = self.layers.entry(l).or_insert_with(|| vec![0; self.experts]);
        for (a, &c) in row.iter_mut().zip(counts) {
            *a += c;
        }
    }

    /// Reads `path`; `Ok(None)` when there is no file.
    pub fn load(path: &Path) -> Result<Option<History>, HistoryError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(HistoryError::Io { path: path.into(), source }),
        };
        Self::parse(&text, path).map(Some)
    }

    pub fn parse(text: &str, path: &Path) -> Result<History, HistoryError> {
        let bad = |line: usize, msg: &str| HistoryError::Parse { path: path.into(), line, msg: msg.into() };
        let mut lines = text.lines().enumerate();
        let experts = match lines.next().map(|(_, l)| l.split_whitespace().collect::<Vec<_>>()) {
            Some(h) if h.len() == 4 && h[0] == "coli-usage" && h[1] == "1" && h[2] == "experts" => {
                h[3].parse::<usize>().map_err(|_| bad(1, "expert count is not a number"))?
            }
            _ => return Err(bad(1, "expected `coli-usage 1 experts <n>`")),
        };
        let mut h = History::new(experts);
        for (i, line) in lines {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let nums: Result<Vec<u64>, _> = line.split_whitespace().map(str::parse::<u64>).collect();
            let nums = nums.map_err(|_| bad(i + 1, "expected numbers"))?;
            if nums.len() != experts + 1 {
                return Err(bad(
                    i + 1,
                    &format!("expected a layer index and {experts} counts, found {} numbers", nums.len()),
                ));
            }
            h.add(nums[0] as usize, &nums[1..]);
        }
        Ok(h)
    }

    pub fn to_text(&self) -> String {
        let mut s = format!("coli-usage 1 experts {}\n", self.experts);
        for (l, row) in &self.layers {
            s.push_str(&l.to_string());
            for c in row {
                s.push(' ');
                s.push_str(&c.to_string());
            }
            s.push('\n');
        }
        s
    }

    /// Merges `self` into the file at `path` (adding to what it holds when it parses and has
    /// the same expert count; replacing it otherwise).
    pub fn merge_into(&self, path: &Path) -> Result<(), HistoryError> {
        let mut merged = match Self::load(path) {
            Ok(Some(old)) if old.experts == self.experts => old,
            _ => History::new(self.experts),
        };
        for (l, row) in &self.layers {
            merged.add(*l, row);
        }
        let tmp = path.with_extension("coli_usage.tmp");
        let io = |source| HistoryError::Io { path: path.into(), source };
        std::fs::write(&tmp, merged.to_text()).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_round_trips_and_merges_by_adding() {
        let dir = std::env::temp_dir().join(format!("coli-history-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.gguf.coli_usage");
        let _ = std::fs::remove_file(&path);
        let mut a = History::new(3);
        a.add(2, &[1, 0, 5]);
        a.merge_into(&path).unwrap();
        a.add(4, &[0, 1, 0]);
        a.merge_into(&path).unwrap();
        let h = History::load(&path).unwrap().unwrap();
        assert_eq!(h.layers[&2], vec![2, 0, 10]);
        assert_eq!(h.layers[&4], vec![0, 1, 0]);
        assert_eq!(path_for(&dir.join("m.gguf")), path);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_bad_history_is_a_located_error() {
        let p = Path::new("h");
        assert!(matches!(History::parse("nonsense", p), Err(HistoryError::Parse { line: 1, .. })));
        let e = History::parse("coli-usage 1 experts 2\n0 1 2\n1 5\n", p).unwrap_err();
        assert!(e.to_string().contains("h:3"), "{e}");
    }
}
