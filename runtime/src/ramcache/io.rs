//! The RAM cache's I/O pool: a few reader threads that read whole expert tensors out of the
//! checkpoint's files with positioned reads (`FileExt::read_exact_at`), many requests in
//! flight at once, so all the misses of one layer's step load together.
//!
//! Each file is opened twice: with `O_DIRECT` where the file system takes it (the page cache
//! then holds no second copy of what the cache holds), and buffered. A direct read covers the
//! request's range widened to `ALIGN` on both sides, into a buffer aligned to `ALIGN`; a file
//! system that refuses direct I/O (tmpfs, some network file systems: the open or the read
//! fails with `EINVAL`) gets buffered reads from then on. Either way a request's bytes sit in
//! the buffer at the same offset modulo `ALIGN` as in the file (so as in the memory map):
//! the kernels see the alignment they see in the map.
//!
//! `submit` puts requests in flight and returns at once (`Pending`, waited for later: the
//! prefetch of the next layer's experts); a `Pending` dropped unwaited cancels its requests
//! that no reader took yet.
//!
//! A request past the file's end (the file was truncated behind the cache) is
//! `IoError::Truncated`, never short data.
//!
//! Must not: decide what to read or keep (the cache does), or write to a file.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Alignment of direct reads and of every buffer (a page; covers 512-byte and 4 KiB sectors).
pub const ALIGN: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("{}: {source}", path.display())]
    Open { path: PathBuf, source: std::io::Error },
    #[error("{}: reading {len} bytes at {offset}: {source}", path.display())]
    Read { path: PathBuf, offset: u64, len: usize, source: std::io::Error },
    #[error("{}: the file ends at byte {end}, an expert's bytes run to {want} (the checkpoint was truncated or rewritten after it was loaded)", path.display())]
    Truncated { path: PathBuf, end: u64, want: u64 },
    #[error("the I/O pool stopped (a reader thread is gone)")]
    Stopped,
}

/// A buffer of bytes aligned to `ALIGN`, and the range of it a request asked for.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    cap: usize,
    start: usize,
    len: usize,
}

// SAFETY: the buffer owns its allocation outright; shared access is read-only (`bytes`).
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} of {} bytes)", self.len, self.cap)
    }
}

impl AlignedBuf {
    /// A zeroed buffer of `cap` bytes (a multiple of `ALIGN`, at least one page).
    fn zeroed(cap: usize) -> AlignedBuf {
        let cap = cap.max(ALIGN).div_ceil(ALIGN) * ALIGN;
        let layout = Self::layout(cap);
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = std::ptr::NonNull::new(raw) else { std::alloc::handle_alloc_error(layout) };
        AlignedBuf { ptr, cap, start: 0, len: 0 }
    }

    fn layout(cap: usize) -> std::alloc::Layout {
        // `ALIGN` is a power of two and `cap` a multiple of it, far below isize::MAX for any
        // expert the limits admit.
        std::alloc::Layout::from_size_align(cap, ALIGN).unwrap_or(std::alloc::Layout::new::<[u8; ALIGN]>())
    }

    fn all_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is an allocation of `cap` initialised (zeroed) bytes that this buffer owns.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }

    /// The requested bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `start + len <= cap` (set by the reader), the bytes are initialised.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(self.start), self.len) }
    }

    /// Bytes allocated (what the buffer costs the RAM budget).
    pub fn capacity(&self) -> usize {
        self.cap
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.cap)) }
    }
}

/// One checkpoint file the pool reads.
struct Source {
    path: PathBuf,
    buffered: File,
    direct: Option<File>,
    /// Cleared on the first direct read the file system refuses.
    direct_ok: AtomicBool,
}

/// One read: `len` bytes at `offset` of file `file` (an index into the pool's paths).
#[derive(Clone, Copy, Debug)]
pub struct Request {
    pub file: usize,
    pub offset: u64,
    pub len: usize,
}

struct Job {
    req: Request,
    tag: usize,
    reply: Sender<(usize, Result<AlignedBuf, IoError>)>,
    /// Set when the `Pending` was dropped unwaited: a reader skips the job.
    cancel: Arc<AtomicBool>,
}

/// Requests in flight (`IoPool::submit`): `wait` for their buffers; dropped unwaited, the
/// requests no reader took yet are skipped.
pub struct Pending {
    rx: Receiver<(usize, Result<AlignedBuf, IoError>)>,
    count: usize,
    cancel: Arc<AtomicBool>,
}

impl Pending {
    /// Requests in flight.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Each request's buffer or error, in the order submitted (the pool gone: `Stopped`).
    pub fn wait_each(self) -> Vec<Result<AlignedBuf, IoError>> {
        let mut out: Vec<Result<AlignedBuf, IoError>> = (0..self.count).map(|_| Err(IoError::Stopped)).collect();
        for _ in 0..self.count {
            let Ok((tag, r)) = self.rx.recv() else { break };
            if let Some(slot) = out.get_mut(tag) {
                *slot = r;
            }
        }
        out
    }

    /// The buffers in the order submitted, or the first error (by position).
    pub fn wait(self) -> Result<Vec<AlignedBuf>, IoError> {
        self.wait_each().into_iter().collect()
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

/// The reader threads and the files they read.
pub struct IoPool {
    files: Arc<Vec<Source>>,
    jobs: Option<Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
}

impl IoPool {
    /// Opens `paths` (direct where `direct` and the file system allow, buffered always) and
    /// starts `readers` threads.
    pub fn new(paths: &[PathBuf], readers: usize, direct: bool) -> Result<IoPool, IoError> {
        let mut files = Vec::with_capacity(paths.len());
        for p in paths {
            let open = |flags: i32| std::fs::OpenOptions::new().read(true).custom_flags(flags).open(p);
            let buffered = open(0).map_err(|source| IoError::Open { path: p.clone(), source })?;
            let direct = if direct { open(libc::O_DIRECT).ok() } else { None };
            let direct_ok = AtomicBool::new(direct.is_some());
            files.push(Source { path: p.clone(), buffered, direct, direct_ok });
        }
        let files = Arc::new(files);
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let workers = (0..readers.max(1))
            .map(|i| {
                let (files, rx) = (files.clone(), rx.clone());
                std::thread::Builder::new()
                    .name(format!("coli-io-{i}"))
                    .spawn(move || worker(&files, &rx))
                    .map_err(|source| IoError::Open { path: PathBuf::from("(reader thread)"), source })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(IoPool { files, jobs: Some(tx), workers })
    }

    /// Readers running.
    pub fn readers(&self) -> usize {
        self.workers.len()
    }

    /// Whether any file is read with direct I/O (as of now).
    pub fn direct(&self) -> bool {
        self.files.iter().any(|f| f.direct_ok.load(Ordering::Relaxed))
    }

    /// Puts every request in flight over the readers and returns at once.
    pub fn submit(&self, reqs: &[Request]) -> Result<Pending, IoError> {
        let jobs = self.jobs.as_ref().ok_or(IoError::Stopped)?;
        let (tx, rx) = channel();
        let cancel = Arc::new(AtomicBool::new(false));
        for (tag, &req) in reqs.iter().enumerate() {
            jobs.send(Job { req, tag, reply: tx.clone(), cancel: cancel.clone() }).map_err(|_| IoError::Stopped)?;
        }
        Ok(Pending { rx, count: reqs.len(), cancel })
    }

    /// Reads every request at once (all in flight over the readers); the buffers in the order
    /// of `reqs`, or the first error.
    pub fn read_all(&self, reqs: &[Request]) -> Result<Vec<AlignedBuf>, IoError> {
        self.submit(reqs)?.wait()
    }
}

impl Drop for IoPool {
    fn drop(&mut self) {
        // Closing the queue ends every reader's loop.
        self.jobs = None;
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn worker(files: &[Source], rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = {
            let Ok(rx) = rx.lock() else { return };
            match rx.recv() {
                Ok(j) => j,
                Err(_) => return,
            }
        };
        if job.cancel.load(Ordering::Relaxed) {
            continue;
        }
        let r = match files.get(job.req.file) {
            Some(f) => read(f, job.req),
            None => Err(IoError::Stopped),
        };
        let _ = job.reply.send((job.tag, r));
    }
}

/// One request: direct when the file allows it, else buffered.
fn read(f: &Source, r: Request) -> Result<AlignedBuf, IoError> {
    let lead = (r.offset % ALIGN as u64) as usize;
    let from = r.offset - lead as u64;
    let want = r.offset + r.len as u64;
    // The file's length now: a read past it is refused whatever the read returns (a direct
    // read may hand back a whole block past the end of a file truncated since).
    let end = f.buffered.metadata().map(|m| m.len()).map_err(|source| IoError::Read {
        path: f.path.clone(),
        offset: r.offset,
        len: r.len,
        source,
    })?;
    if end < want {
        return Err(IoError::Truncated { path: f.path.clone(), end, want });
    }
    let mut buf = AlignedBuf::zeroed(lead + r.len);
    if let (Some(d), true) = (&f.direct, f.direct_ok.load(Ordering::Relaxed)) {
        let span = buf.cap;
        match read_at(d, &mut buf.all_mut()[..span], from) {
            Ok(got) if from + got as u64 >= want => {
                buf.start = lead;
                buf.len = r.len;
                return Ok(buf);
            }
            Ok(got) => return Err(IoError::Truncated { path: f.path.clone(), end: from + got as u64, want }),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => f.direct_ok.store(false, Ordering::Relaxed),
            Err(source) => return Err(IoError::Read { path: f.path.clone(), offset: r.offset, len: r.len, source }),
        }
    }
    let got = read_at(&f.buffered, &mut buf.all_mut()[lead..lead + r.len], r.offset)
        .map_err(|source| IoError::Read { path: f.path.clone(), offset: r.offset, len: r.len, source })?;
    if got < r.len {
        return Err(IoError::Truncated { path: f.path.clone(), end: r.offset + got as u64, want });
    }
    buf.start = lead;
    buf.len = r.len;
    Ok(buf)
}

/// Reads into all of `buf` from `offset` until it is full or the file ends; the bytes read.
fn read_at(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_land_at_the_files_alignment_and_a_short_file_is_truncated() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f.bin");
        let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        for direct in [false, true] {
            let pool = IoPool::new(std::slice::from_ref(&p), 3, direct).unwrap();
            let reqs: Vec<Request> = [(5u64, 4000usize), (4096, 8192), (12_345, 7_000), (0, 1)]
                .iter()
                .map(|&(offset, len)| Request { file: 0, offset, len })
                .collect();
            let bufs = pool.read_all(&reqs).unwrap();
            for (b, r) in bufs.iter().zip(&reqs) {
                assert_eq!(b.bytes(), &data[r.offset as usize..r.offset as usize + r.len]);
                assert_eq!(b.bytes().as_ptr() as usize % ALIGN, r.offset as usize % ALIGN);
            }
            let past = pool.read_all(&[Request { file: 0, offset: 19_000, len: 2_000 }]);
            assert!(matches!(past, Err(IoError::Truncated { end: 20_000, want: 21_000, .. })), "{past:?}");
        }
    }

    #[test]
    fn submitted_reads_are_waited_for_later_each_with_its_own_result() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f.bin");
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 253) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        let pool = IoPool::new(std::slice::from_ref(&p), 2, false).unwrap();
        let reqs = [Request { file: 0, offset: 10, len: 100 }, Request { file: 0, offset: 9_990, len: 100 }];
        let pending = pool.submit(&reqs).unwrap();
        assert_eq!(pending.len(), 2);
        // Another read meanwhile, and a dropped submission, change nothing for it.
        drop(pool.submit(&reqs).unwrap());
        assert_eq!(pool.read_all(&reqs[..1]).unwrap()[0].bytes(), &data[10..110]);
        let each = pending.wait_each();
        assert_eq!(each[0].as_ref().unwrap().bytes(), &data[10..110]);
        assert!(matches!(each[1], Err(IoError::Truncated { .. })), "the second runs past the end");
    }
}
