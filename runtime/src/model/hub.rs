//! The Hugging Face hub cache, read as the hub's own tools lay it out: a model given as
//! `org/name` (or `org/name@revision`, or either with `:FILE` to pick one file of the snapshot)
//! that is not a path on disk is looked for under the cache directory, in
//! `models--org--name/`: `refs/<revision>` (default `main`) names a commit (or the revision is
//! a commit itself), and `snapshots/<commit>/` is the checkpoint: its safetensors directory, or
//! its one GGUF checkpoint (a file, or shard 1 of a split set, at the top or one folder down).
//! Several GGUF checkpoints are `HubError::SeveralGguf`, listing them as `org/name:FILE`. The
//! snapshot's files are symbolic links into `blobs/`; a link whose blob is missing (a download
//! cut short) is `Incomplete`.
//!
//! The cache directory, as the hub's tools find it (`HubEnv`, read here and nowhere else in
//! the runtime):
//!
//! | variable | the cache |
//! |---|---|
//! | `HF_HUB_CACHE` | that directory |
//! | `HF_HOME` | `$HF_HOME/hub` |
//! | `HOME` | `~/.cache/huggingface/hub` |
//!
//! Must not: reach the network, write to the cache, or open any checkpoint file (that is
//! `Checkpoint::open`'s, given the path found here).

use super::split;
use std::fmt;
use std::path::{Path, PathBuf};

/// A model named by its hub id: `org/name[@revision][:file]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelRef {
    pub org: String,
    pub name: String,
    /// A branch, tag or commit; `None`: `main`.
    pub revision: Option<String>,
    /// A file (or folder) inside the snapshot, relative to it.
    pub file: Option<String>,
}

fn id_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 96
        && !s.starts_with(['.', '-'])
        && !s.contains("--")
        && !s.contains("..")
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// A relative path with no `..`, `.` or empty component.
fn relative(s: &str) -> bool {
    !s.is_empty() && !s.starts_with('/') && s.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

impl ModelRef {
    /// Parses `org/name`, `org/name@revision`, `org/name:FILE` or `org/name@revision:FILE`;
    /// `None` for anything else (a path, say).
    pub fn parse(s: &str) -> Option<ModelRef> {
        let (id, file) = match s.split_once(':') {
            Some((id, f)) => (id, Some(f).filter(|f| relative(f))?.into()),
            None => (s, None),
        };
        let (repo, revision) = match id.split_once('@') {
            Some((r, rev)) => (r, Some(rev).filter(|v| relative(v) && !v.contains(['\\', ' ']))?.into()),
            None => (id, None),
        };
        let (org, name) = repo.split_once('/')?;
        (id_part(org) && id_part(name)).then(|| ModelRef {
            org: org.into(),
            name: name.into(),
            revision: revision.map(str::to_string),
            file: file.map(str::to_string),
        })
    }

    /// `org/name`.
    pub fn repo(&self) -> String {
        format!("{}/{}", self.org, self.name)
    }

    /// The model's folder in the cache at `cache`.
    pub fn dir_in(&self, cache: &Path) -> PathBuf {
        cache.join(format!("models--{}--{}", self.org, self.name))
    }
}

impl fmt::Display for ModelRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.org, self.name)?;
        if let Some(r) = &self.revision {
            write!(f, "@{r}")?;
        }
        if let Some(p) = &self.file {
            write!(f, ":{p}")?;
        }
        Ok(())
    }
}

/// The variables that place the cache (see the module doc), as plain data.
#[derive(Clone, Debug, Default)]
pub struct HubEnv {
    pub hf_hub_cache: Option<PathBuf>,
    pub hf_home: Option<PathBuf>,
    pub home: Option<PathBuf>,
}

impl HubEnv {
    /// The process's `HF_HUB_CACHE`, `HF_HOME` and `HOME` (empty values count as unset).
    pub fn from_process() -> HubEnv {
        let var = |k| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        HubEnv { hf_hub_cache: var("HF_HUB_CACHE"), hf_home: var("HF_HOME"), home: var("HOME") }
    }

    /// The cache directory these variables give.
    pub fn cache_dir(&self) -> Result<PathBuf, HubError> {
        if let Some(c) = &self.hf_hub_cache {
            return Ok(c.clone());
        }
        if let Some(h) = &self.hf_home {
            return Ok(h.join("hub"));
        }
        self.home.as_ref().map(|h| h.join(".cache/huggingface/hub")).ok_or(HubError::NoCache)
    }
}

/// Why a hub id found no checkpoint in the cache.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("no Hugging Face cache: none of HF_HUB_CACHE, HF_HOME or HOME is set")]
    NoCache,
    #[error("{repo} is not in the Hugging Face cache (looked for {}; nothing is downloaded: fetch it first, e.g. `hf download {repo}`)", dir.display())]
    NotCached { repo: String, dir: PathBuf },
    #[error("{repo}: no revision {revision:?} in the cache (looked for {} and a snapshot of that name; snapshots: {})", refs.display(), list(snapshots))]
    NoRevision { repo: String, revision: String, refs: PathBuf, snapshots: Vec<String> },
    #[error("{repo}: {} names commit {commit}, whose snapshot {} is missing", refs.display(), dir.display())]
    NoSnapshot { repo: String, refs: PathBuf, commit: String, dir: PathBuf },
    #[error("{repo}: {} is not a commit", refs.display())]
    BadRef { repo: String, refs: PathBuf },
    #[error("{repo}: the snapshot {} has no {file} (it has: {})", snapshot.display(), list(files))]
    NoFile { repo: String, file: String, snapshot: PathBuf, files: Vec<String> },
    #[error("{repo}: {} links to a blob that is missing (a download cut short?)", path.display())]
    Incomplete { repo: String, path: PathBuf },
    #[error("{repo}: the snapshot {} holds no safetensors and no .gguf file (it has: {})", snapshot.display(), list(files))]
    NoCheckpoint { repo: String, snapshot: PathBuf, files: Vec<String> },
    #[error("{repo}: the snapshot {} holds several GGUF checkpoints; pick one: {}", snapshot.display(), choices.join(", "))]
    SeveralGguf { repo: String, snapshot: PathBuf, choices: Vec<String> },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

fn list(v: &[String]) -> String {
    if v.is_empty() {
        "nothing".into()
    } else {
        v.join(", ")
    }
}

/// The names in `dir`, sorted (`/` after folders).
fn names(dir: &Path) -> Result<Vec<String>, HubError> {
    let io = |source| HubError::Io { path: dir.to_path_buf(), source };
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io)? {
        let e = e.map_err(io)?;
        let dir = e.path().is_dir();
        out.push(format!("{}{}", e.file_name().to_string_lossy(), if dir { "/" } else { "" }));
    }
    out.sort();
    Ok(out)
}

/// Whether `p` is a link whose target is missing.
fn dangling(p: &Path) -> bool {
    p.symlink_metadata().is_ok() && !p.exists()
}

/// The path `arg` stands for: `arg` itself when it exists or is no hub id, else the checkpoint
/// it names in the cache at `cache` (`None`: where `HubEnv::from_process` says).
pub fn locate(arg: &Path, cache: Option<&Path>) -> Result<PathBuf, HubError> {
    let r = match arg.to_str().and_then(ModelRef::parse) {
        Some(r) if !arg.exists() && arg.symlink_metadata().is_err() => r,
        _ => return Ok(arg.to_path_buf()),
    };
    let cache = match cache {
        Some(c) => c.to_path_buf(),
        None => HubEnv::from_process().cache_dir()?,
    };
    resolve(&r, &cache)
}

/// The checkpoint `r` names in the cache at `cache` (see the module doc).
pub fn resolve(r: &ModelRef, cache: &Path) -> Result<PathBuf, HubError> {
    let repo = r.repo();
    let dir = r.dir_in(cache);
    if !dir.is_dir() {
        return Err(HubError::NotCached { repo, dir });
    }
    // 1. The revision's commit and its snapshot.
    let revision = r.revision.as_deref().unwrap_or("main");
    let refs = dir.join("refs").join(revision);
    let snapshots = dir.join("snapshots");
    let commit = if refs.is_file() {
        let text = std::fs::read_to_string(&refs).map_err(|source| HubError::Io { path: refs.clone(), source })?;
        let commit = text.trim().to_string();
        if commit.is_empty() || commit.len() > 64 || !commit.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(HubError::BadRef { repo, refs });
        }
        commit
    } else if snapshots.join(revision).is_dir() {
        revision.to_string()
    } else {
        let snapshots = if snapshots.is_dir() { names(&snapshots)? } else { Vec::new() };
        return Err(HubError::NoRevision { repo, revision: revision.into(), refs, snapshots });
    };
    let snapshot = snapshots.join(&commit);
    if !snapshot.is_dir() {
        return Err(HubError::NoSnapshot { repo, refs, commit, dir: snapshot });
    }
    // 2. The file asked for, or the snapshot's one checkpoint.
    if let Some(file) = &r.file {
        let p = snapshot.join(file);
        if dangling(&p) {
            return Err(HubError::Incomplete { repo, path: p });
        }
        if !p.exists() {
            let files = names(&snapshot)?;
            return Err(HubError::NoFile { repo, file: file.clone(), snapshot, files });
        }
        return Ok(p);
    }
    if ["model.safetensors", "model.safetensors.index.json"].iter().any(|f| snapshot.join(f).exists()) {
        return Ok(snapshot);
    }
    let choices = gguf_choices(&snapshot)?;
    match choices.as_slice() {
        [] => Err(HubError::NoCheckpoint { repo, files: names(&snapshot)?, snapshot }),
        [one] => {
            let p = snapshot.join(one);
            if dangling(&p) {
                return Err(HubError::Incomplete { repo, path: p });
            }
            Ok(p)
        }
        _ => {
            let choices = choices.iter().map(|c| format!("{repo}:{c}")).collect();
            Err(HubError::SeveralGguf { repo, snapshot, choices })
        }
    }
}

/// The GGUF checkpoints of a snapshot, relative to it: each `.gguf` file at the top or one
/// folder down, a split set as its shard 1, sorted.
fn gguf_choices(snapshot: &Path) -> Result<Vec<String>, HubError> {
    let mut out = Vec::new();
    let mut dirs = vec![(snapshot.to_path_buf(), String::new())];
    let mut depth = 0;
    while !dirs.is_empty() && depth < 2 {
        let mut next = Vec::new();
        for (dir, rel) in dirs {
            let io = |source| HubError::Io { path: dir.clone(), source };
            for e in std::fs::read_dir(&dir).map_err(io)? {
                let e = e.map_err(io)?;
                let name = e.file_name().to_string_lossy().into_owned();
                let rel = format!("{rel}{name}");
                let p = e.path();
                if p.is_dir() && !name.starts_with('.') {
                    next.push((p, format!("{rel}/")));
                } else if name.ends_with(".gguf") {
                    // A split set is one checkpoint: its shard 1 stands for it.
                    match split::split_name(Path::new(&rel)) {
                        Some((prefix, _, n)) => {
                            out.push(split::shard_path(&prefix, 1, n).to_string_lossy().into_owned())
                        }
                        None => out.push(rel),
                    }
                }
            }
        }
        dirs = next;
        depth += 1;
    }
    out.sort();
    out.dedup();
    Ok(out)
}
