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
//! ignored (the run starts cold and rewrites it); it never stops a run. Lines of layers the
//! model does not have are dropped on load (and so from the next write); counts saturate at
//! `u64::MAX` instead of wrapping.
//!
//! Writes are safe under concurrent runs of the same checkpoint: the read-merge-write holds an
//! exclusive `flock` on `<history>.lock` beside it (never followed through a link; left in place,
//! as removing a lock file races with its next taker), so concurrent runs add up. The new text
//! goes to a temporary file of the writer's own (`<history>.<pid>-<n>-<random>.tmp`) created
//! with `O_EXCL`, so a name already taken, a planted link included, is skipped and never
//! written through, then renamed over the history: a crash leaves the old history.
//!
//! Must not: decide residency (the tier reads the counts), or touch the device.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

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
        with_suffix(checkpoint, ".coli_usage")
    }
}

/// `path` with `suffix` appended to its file name.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(suffix);
    path.with_file_name(name)
}

/// The lock file the writers of the history at `path` take turns on.
pub fn lock_path(path: &Path) -> PathBuf {
    with_suffix(path, ".lock")
}

/// How many temporary names a write tries before it gives up (each taken name is skipped).
const TEMP_TRIES: usize = 64;

impl History {
    pub fn new(experts: usize) -> History {
        History { experts, layers: BTreeMap::new() }
    }

    /// Adds `counts` (one per expert) to layer `l`, saturating at `u64::MAX`.
    pub fn add(&mut self, l: usize, counts: &[u64]) {
        let row = self.layers.entry(l).or_insert_with(|| vec![0; self.experts]);
        for (a, &c) in row.iter_mut().zip(counts) {
            *a = a.saturating_add(c);
        }
    }

    /// Reads `path`, keeping the layers below `model_layers` (the model's layer count);
    /// `Ok(None)` when there is no file.
    pub fn load(path: &Path, model_layers: usize) -> Result<Option<History>, HistoryError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(HistoryError::Io { path: path.into(), source }),
        };
        let mut h = Self::parse(&text, path)?;
        h.layers.retain(|&l, _| l < model_layers);
        Ok(Some(h))
    }

    /// Parses the text of a history file (every layer index it names kept).
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
            let layer = usize::try_from(nums[0]).map_err(|_| bad(i + 1, "layer index out of range"))?;
            h.add(layer, &nums[1..]);
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
    /// the same expert count; replacing it otherwise), keeping only layers below
    /// `model_layers`. Holds the history's lock from the read to the rename, so concurrent
    /// merges add up.
    pub fn merge_into(&self, path: &Path, model_layers: usize) -> Result<(), HistoryError> {
        self.merge_with_names(path, model_layers, temp_names(path))
    }

    /// `merge_into` with the temporary names to try, in order (the tests plant links at some).
    fn merge_with_names(
        &self,
        path: &Path,
        model_layers: usize,
        names: impl IntoIterator<Item = PathBuf>,
    ) -> Result<(), HistoryError> {
        let _lock = lock(path)?;
        let mut merged = match Self::load(path, model_layers) {
            Ok(Some(old)) if old.experts == self.experts => old,
            _ => History::new(self.experts),
        };
        for (l, row) in self.layers.range(..model_layers) {
            merged.add(*l, row);
        }
        write_replacing(path, merged.to_text().as_bytes(), names)
    }
}

/// Takes the exclusive lock of the history at `path` (blocking); released when the returned
/// file closes.
fn lock(path: &Path) -> Result<File, HistoryError> {
    let lp = lock_path(path);
    let io = |source| HistoryError::Io { path: lp.clone(), source };
    let mut o = OpenOptions::new();
    o.read(true).write(true).create(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // A link planted at the lock's name is not followed (ELOOP): nothing is created or
        // opened through it.
        o.custom_flags(libc::O_NOFOLLOW);
    }
    let file = o.open(&lp).map_err(io)?;
    #[cfg(unix)]
    {
        use std::os::unix::io::AsRawFd;
        loop {
            // SAFETY: `file` owns the descriptor and outlives the call; flock reads no memory.
            let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if r == 0 {
                break;
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(io(e));
            }
        }
    }
    Ok(file)
}

/// Temporary names beside `path` no other writer picks: this process's id, a counter of its
/// own and a random number.
fn temp_names(path: &Path) -> impl Iterator<Item = PathBuf> + '_ {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let pid = std::process::id();
    (0..TEMP_TRIES).map(move |_| {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let r = std::collections::hash_map::RandomState::new().build_hasher().finish();
        with_suffix(path, &format!(".{pid}-{n}-{r:016x}.tmp"))
    })
}

/// Writes `bytes` to the first of `names` that does not exist yet (created with `O_EXCL`: a
/// file or link already there is skipped, never opened) and renames it over `path`.
fn write_replacing(path: &Path, bytes: &[u8], names: impl IntoIterator<Item = PathBuf>) -> Result<(), HistoryError> {
    for tmp in names {
        let mut file = match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(source) => return Err(HistoryError::Io { path: tmp, source }),
        };
        let written = file.write_all(bytes).and_then(|()| file.sync_all());
        drop(file);
        let done = written.map_err(|source| HistoryError::Io { path: tmp.clone(), source }).and_then(|()| {
            std::fs::rename(&tmp, path).map_err(|source| HistoryError::Io { path: path.into(), source })
        });
        if done.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        return done;
    }
    let source = std::io::Error::new(std::io::ErrorKind::AlreadyExists, "every temporary name tried is taken");
    Err(HistoryError::Io { path: path.into(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn a_history_round_trips_and_merges_by_adding() {
        let d = dir();
        let path = d.path().join("m.gguf.coli_usage");
        let mut a = History::new(3);
        a.add(2, &[1, 0, 5]);
        a.merge_into(&path, 8).unwrap();
        a.add(4, &[0, 1, 0]);
        a.merge_into(&path, 8).unwrap();
        let h = History::load(&path, 8).unwrap().unwrap();
        assert_eq!(h.layers[&2], vec![2, 0, 10]);
        assert_eq!(h.layers[&4], vec![0, 1, 0]);
        assert_eq!(path_for(&d.path().join("m.gguf")), path);
        // No temporary file is left behind: the history and its lock only.
        assert_eq!(names_in(d.path()), ["m.gguf.coli_usage", "m.gguf.coli_usage.lock"]);
    }

    #[test]
    fn a_bad_history_is_a_located_error() {
        let p = Path::new("h");
        assert!(matches!(History::parse("nonsense", p), Err(HistoryError::Parse { line: 1, .. })));
        let e = History::parse("coli-usage 1 experts 2\n0 1 2\n1 5\n", p).unwrap_err();
        assert!(e.to_string().contains("h:3"), "{e}");
    }

    /// Eight threads, each merging 25 times under its own lock descriptor (as separate runs
    /// do): every count adds up exactly, none is lost to a rename race.
    #[test]
    fn concurrent_merges_add_up() {
        let d = dir();
        let path = d.path().join("m.gguf.coli_usage");
        let (threads, rounds) = (8u64, 25u64);
        std::thread::scope(|s| {
            for t in 0..threads {
                let path = &path;
                s.spawn(move || {
                    let mut h = History::new(2);
                    h.add(0, &[1, t]);
                    h.add(3, &[2, 0]);
                    for _ in 0..rounds {
                        h.merge_into(path, 4).unwrap();
                    }
                });
            }
        });
        let h = History::load(&path, 4).unwrap().unwrap();
        assert_eq!(h.layers[&0], vec![threads * rounds, rounds * (0..threads).sum::<u64>()]);
        assert_eq!(h.layers[&3], vec![2 * threads * rounds, 0]);
        assert_eq!(names_in(d.path()), ["m.gguf.coli_usage", "m.gguf.coli_usage.lock"]);
    }

    /// Links planted at temporary names (the old fixed one, and the first names a writer
    /// tries) are skipped: the files they point to stay as they were, and the history is
    /// written through a name of its own.
    #[cfg(unix)]
    #[test]
    fn a_link_at_a_temporary_name_is_not_followed() {
        use std::os::unix::fs::symlink;
        let d = dir();
        let path = d.path().join("m.gguf.coli_usage");
        let target = d.path().join("precious");
        std::fs::write(&target, "keep me").unwrap();
        let mut h = History::new(2);
        h.add(1, &[3, 4]);
        // The name every run used to write.
        symlink(&target, d.path().join("m.gguf.coli_usage.tmp")).unwrap();
        symlink(&target, d.path().join(".coli_usage.coli_usage.tmp")).unwrap();
        h.merge_into(&path, 2).unwrap();
        // Links at the first names tried, then a free one.
        let names: Vec<PathBuf> = ["a.tmp", "b.tmp", "c.tmp"].iter().map(|n| d.path().join(n)).collect();
        symlink(&target, &names[0]).unwrap();
        symlink(d.path().join("dangling"), &names[1]).unwrap();
        h.merge_with_names(&path, 2, names.clone()).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
        assert!(!d.path().join("dangling").exists(), "nothing was created through the dangling link");
        assert!(names[0].symlink_metadata().unwrap().file_type().is_symlink());
        assert!(!names[2].exists(), "renamed over the history");
        assert_eq!(History::load(&path, 2).unwrap().unwrap().layers[&1], vec![6, 8]);
        // Every name taken: an error, and still nothing written through a link.
        let e = h.merge_with_names(&path, 2, names[..2].to_vec()).unwrap_err();
        assert!(e.to_string().contains("temporary name"), "{e}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
    }

    /// A link planted at the lock's name is refused (an error: the history is not saved), not
    /// followed.
    #[cfg(unix)]
    #[test]
    fn a_link_at_the_lock_name_is_not_followed() {
        let d = dir();
        let path = d.path().join("m.gguf.coli_usage");
        let target = d.path().join("precious");
        std::fs::write(&target, "keep me").unwrap();
        std::os::unix::fs::symlink(&target, lock_path(&path)).unwrap();
        let mut h = History::new(1);
        h.add(0, &[1]);
        let e = h.merge_into(&path, 1).unwrap_err();
        assert!(e.to_string().contains(".lock"), "{e}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
        assert!(!path.exists());
    }

    /// Layers past the model's are dropped on load, and so from the file at the next merge.
    #[test]
    fn layers_outside_the_model_are_dropped() {
        let d = dir();
        let path = d.path().join("h");
        std::fs::write(&path, "coli-usage 1 experts 2\n1 5 6\n99 7 8\n18446744073709551615 1 1\n").unwrap();
        let h = History::load(&path, 4).unwrap().unwrap();
        assert_eq!(h.layers.keys().copied().collect::<Vec<_>>(), [1]);
        let mut run = History::new(2);
        run.add(2, &[1, 1]);
        run.add(7, &[9, 9]);
        run.merge_into(&path, 4).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, "coli-usage 1 experts 2\n1 5 6\n2 1 1\n");
    }

    /// Counts near `u64::MAX` stay there instead of wrapping to small numbers.
    #[test]
    fn counts_saturate() {
        let d = dir();
        let path = d.path().join("h");
        std::fs::write(&path, format!("coli-usage 1 experts 2\n0 {} 3\n", u64::MAX - 1)).unwrap();
        let mut run = History::new(2);
        run.add(0, &[5, 4]);
        run.merge_into(&path, 1).unwrap();
        assert_eq!(History::load(&path, 1).unwrap().unwrap().layers[&0], vec![u64::MAX, 7]);
        let mut h = History::new(1);
        h.add(0, &[u64::MAX]);
        h.add(0, &[u64::MAX]);
        assert_eq!(h.layers[&0], vec![u64::MAX]);
    }
}
