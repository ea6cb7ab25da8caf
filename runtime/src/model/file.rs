//! Opening checkpoint files safely: each is checked to be a regular file by its metadata before
//! it is opened (a FIFO given as the model would block the open forever; a device would read
//! endlessly), opened read-only and non-blocking, and checked again on the open descriptor
//! (the path may have changed in between). JSON files are read whole up to a size bound;
//! tensor files are memory-mapped read-only, the map registered with the SIGBUS guard
//! (`guard.rs`), and their size re-checked (`MappedFile::check_unchanged`) before tensors are
//! handed out.
//!
//! Must not: write to a checkpoint file, or open one for writing.

use super::guard::{self, Registration};
use super::LoadError;
use memmap2::Mmap;
use std::fs::{File, Metadata};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Largest JSON file read (`config.json`, the shard index): far beyond any real one.
pub const MAX_JSON: u64 = 256 << 20;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> LoadError + '_ {
    move |source| LoadError::Io { path: path.to_path_buf(), source }
}

/// What kind of file `m` describes, when it is not a regular file.
fn irregular(m: &Metadata) -> Option<&'static str> {
    let t = m.file_type();
    Some(if t.is_file() {
        return None;
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    })
}

fn check_metadata(path: &Path, m: &Metadata) -> Result<(), LoadError> {
    match irregular(m) {
        None => Ok(()),
        Some(kind) => Err(LoadError::NotARegularFile { path: path.to_path_buf(), kind }),
    }
}

/// Checks, without opening it, that `path` is a regular file (following symbolic links): a
/// missing file is `Io` (not found), a FIFO, device, socket or directory `NotARegularFile`.
/// For every file read for a checkpoint, the tokenizer's included.
pub fn check_regular(path: &Path) -> Result<(), LoadError> {
    check_metadata(path, &std::fs::metadata(path).map_err(io(path))?)
}

/// Whether `path` exists, and if it does, that it is a regular file (`check_regular`).
pub(crate) fn regular_if_present(path: &Path) -> Result<bool, LoadError> {
    match std::fs::metadata(path) {
        Ok(m) => check_metadata(path, &m).map(|()| true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io(path)(e)),
    }
}

/// Opens the regular file `path` read-only: checked before the open (no blocking on a FIFO)
/// and after it, on the descriptor.
fn open_regular(path: &Path) -> Result<(File, u64), LoadError> {
    check_regular(path)?;
    // Non-blocking: should the path have become a FIFO since the check, the open returns.
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).map_err(io(path))?;
    let m = file.metadata().map_err(io(path))?;
    check_metadata(path, &m)?;
    Ok((file, m.len()))
}

/// The text of the regular file `path`, of at most `max` bytes.
pub(crate) fn read_text(path: &Path, max: u64) -> Result<String, LoadError> {
    let (file, len) = open_regular(path)?;
    if len > max {
        return Err(LoadError::TooLarge { path: path.to_path_buf(), len, max });
    }
    let mut text = String::with_capacity(len as usize);
    file.take(max + 1).read_to_string(&mut text).map_err(io(path))?;
    if text.len() as u64 > max {
        return Err(LoadError::TooLarge { path: path.to_path_buf(), len: text.len() as u64, max });
    }
    Ok(text)
}

/// A checkpoint file mapped read-only, guarded against SIGBUS while mapped.
pub struct MappedFile {
    path: Arc<PathBuf>,
    file: File,
    // Dropped before `map`: the range leaves the guard's registry before it is unmapped.
    _guard: Option<Registration>,
    map: Mmap,
}

impl std::fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MappedFile({}, {} bytes)", self.path.display(), self.map.len())
    }
}

impl MappedFile {
    /// Opens (`open_regular`) and maps `path`.
    pub fn open(path: &Path) -> Result<MappedFile, LoadError> {
        let (file, _) = open_regular(path)?;
        // SAFETY: a read-only shared map. Should another process truncate the file while it
        // is mapped, a read of a lost page raises SIGBUS, which the guard turns into an error
        // exit naming the file; `check_unchanged` catches a shrunk file before use.
        let map = unsafe { Mmap::map(&file) }.map_err(io(path))?;
        let _guard = guard::register(path, map.as_ptr() as usize, map.len());
        Ok(MappedFile { path: Arc::new(path.to_path_buf()), file, _guard, map })
    }

    pub fn path(&self) -> &Arc<PathBuf> {
        &self.path
    }

    /// Every byte of the file, as mapped.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// Checks that the file still has the length it was mapped with (fstat on the open file):
    /// one that shrank since is `FileChanged`, found before a read of a lost page would fault.
    pub fn check_unchanged(&self) -> Result<(), LoadError> {
        let now = self.file.metadata().map_err(io(&self.path))?.len();
        let was = self.map.len() as u64;
        if now < was {
            return Err(LoadError::FileChanged { path: self.path.to_path_buf(), was, now });
        }
        Ok(())
    }

    /// Advises the kernel that `len` bytes at `start` are not needed (see
    /// `Tensor::advise_not_needed`). Returns whether the kernel took the advice.
    pub fn advise_not_needed(&self, start: usize, len: usize) -> bool {
        // SAFETY: the map is a read-only shared mapping of a file: dropping its pages changes
        // no byte any reference sees, the next read faults them in from the file again.
        unsafe { self.map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len) }.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_are_read_only_and_guarded() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f.bin");
        std::fs::write(&p, [1u8; 4096]).unwrap();
        let f = MappedFile::open(&p).unwrap();
        assert_eq!(f.bytes(), &[1u8; 4096]);
        // The descriptor is read-only: a write through it fails.
        use std::io::Write;
        assert!((&f.file).write(b"x").is_err());
        if cfg!(any(target_os = "linux", target_os = "android")) {
            assert!(f._guard.is_some());
        }
        // And the map is: /proc/self/maps lists it without `w`.
        if let Ok(maps) = std::fs::read_to_string("/proc/self/maps") {
            let start = format!("{:x}-", f.bytes().as_ptr() as usize);
            let line = maps.lines().find(|l| l.starts_with(&start)).unwrap();
            assert!(line.split_whitespace().nth(1).unwrap().starts_with("r-"), "{line}");
        }
    }
}
