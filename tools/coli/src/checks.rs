//! Checks of command-line values made before anything loads, so bad input fails in a second
//! with a one-line error instead of after a model loaded (or a whole generation ran): clap
//! value parsers for counts where 0 means nothing, for context lengths and for MiB figures
//! (every one fits what it becomes, nothing is truncated by a cast), the model path, and an
//! output file opened before the run and written at its end.
//!
//! Must not: load models or hold engine logic; the messages name the flag to change.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The most positions a context may have: positions are 32-bit on the devices.
pub const MAX_POSITIONS: usize = u32::MAX as usize;

/// A count of at least 1 (`what`: the unit, for the message).
fn at_least_one(s: &str, what: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err(format!("at least 1 {what}")),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// Rows of a prompt chunk (`--chunk`, `--chunk-rows`): at least 1.
pub fn rows(s: &str) -> Result<usize, String> {
    at_least_one(s, "row")
}

/// Tokens of a bench test (`-p`, `-n`): at least 1.
pub fn tokens(s: &str) -> Result<usize, String> {
    at_least_one(s, "token")
}

/// Repetitions of a bench (`-r`): at least 1.
pub fn reps(s: &str) -> Result<usize, String> {
    at_least_one(s, "repetition")
}

/// Positions of a KV block (`--kv-block`): at least 1.
pub fn block(s: &str) -> Result<usize, String> {
    at_least_one(s, "position")
}

/// A context length (`--ctx`, `--context`): 1 to `MAX_POSITIONS` positions.
pub fn context(s: &str) -> Result<usize, String> {
    let n = at_least_one(s, "position")?;
    if n > MAX_POSITIONS {
        return Err(format!("at most {MAX_POSITIONS} positions (positions are 32-bit on the devices)"));
    }
    Ok(n)
}

/// A memory figure in MiB whose bytes fit 64 bits (so `m << 20` loses nothing); 0 allowed.
pub fn mib(s: &str) -> Result<u64, String> {
    let m = s.parse::<u64>().map_err(|e| e.to_string())?;
    if m > u64::MAX >> 20 {
        return Err(format!("at most {} MiB", u64::MAX >> 20));
    }
    Ok(m)
}

/// A device's memory cap in MiB: at least 1 (a device with no memory runs nothing), its bytes
/// fitting 64 bits.
pub fn device_mib(s: &str) -> Result<u64, String> {
    match mib(s)? {
        0 => Err("at least 1 MiB (a device with no memory runs nothing: use --device cpu)".into()),
        m => Ok(m),
    }
}

/// The model named by `--model` exists (what is in it, the checkpoint reader checks).
pub fn model_path(path: &Path) -> Result<(), String> {
    if path.exists() {
        return Ok(());
    }
    Err(format!("no model at {}: pass a .gguf file or a directory with config.json (--model)", path.display()))
}

/// The spec named by `how` (`--spec`, or the spec argument) exists.
pub fn spec_path(path: &Path, how: &str) -> Result<(), String> {
    if path.exists() {
        return Ok(());
    }
    Err(format!("no spec at {}: pass an architecture spec such as graphs/llama.ron ({how})", path.display()))
}

/// `a + b + ...` without wrapping; `None` past `usize::MAX`.
pub fn sum(parts: &[usize]) -> Option<usize> {
    parts.iter().try_fold(0usize, |acc, &p| acc.checked_add(p))
}

/// An output file opened (created when absent) before the run, so an unwritable path fails
/// before the model loads, and written at the run's end. A file this run created and did not
/// write is removed when dropped (a failed run leaves no empty file behind); a file that was
/// already there keeps its old content until `write`.
pub struct OutputFile {
    path: PathBuf,
    file: Option<File>,
    created: bool,
}

impl OutputFile {
    /// Opens `path` for writing; the error names `flag`.
    pub fn open(path: &Path, flag: &str) -> Result<OutputFile, String> {
        let err = |e: std::io::Error| format!("cannot write {} ({flag}): {e}", path.display());
        let (file, created) = match OpenOptions::new().write(true).create_new(true).open(path) {
            Ok(f) => (f, true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                (OpenOptions::new().write(true).open(path).map_err(err)?, false)
            }
            Err(e) => return Err(err(e)),
        };
        Ok(OutputFile { path: path.to_path_buf(), file: Some(file), created })
    }

    /// Replaces the file's content with `bytes`.
    pub fn write(mut self, bytes: &[u8]) -> Result<(), String> {
        let err = |e: std::io::Error| format!("cannot write {}: {e}", self.path.display());
        let Some(mut f) = self.file.take() else { return Ok(()) };
        f.set_len(0).and_then(|()| f.write_all(bytes)).and_then(|()| f.flush()).map_err(err)
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        if self.created && self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_refuse_zero_and_contexts_fit_32_bits() {
        assert_eq!(rows("0").unwrap_err(), "at least 1 row");
        assert_eq!(rows("3"), Ok(3));
        assert!(context("0").is_err());
        assert_eq!(context("4294967295"), Ok(MAX_POSITIONS));
        assert!(context("4294967296").unwrap_err().contains("32-bit"));
        assert_eq!(mib("0"), Ok(0));
        assert!(mib(&(u64::MAX >> 19).to_string()).is_err());
        assert!(device_mib("0").is_err());
        assert_eq!(sum(&[1, 2, 3]), Some(6));
        assert_eq!(sum(&[usize::MAX, 1]), None);
    }

    #[test]
    fn an_output_file_created_and_not_written_is_removed() {
        let d = std::env::temp_dir().join(format!("coli-checks-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("out.json");
        drop(OutputFile::open(&p, "--x").unwrap());
        assert!(!p.exists());
        OutputFile::open(&p, "--x").unwrap().write(b"12345").unwrap();
        // An existing file keeps its content until written, then holds only the new bytes.
        drop(OutputFile::open(&p, "--x").unwrap());
        assert_eq!(std::fs::read(&p).unwrap(), b"12345");
        OutputFile::open(&p, "--x").unwrap().write(b"ab").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"ab");
        let e = OutputFile::open(&d, "--x").err().unwrap();
        assert!(e.contains("--x") && e.contains("cannot write"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
