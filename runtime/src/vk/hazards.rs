//! A frame's hazards: the byte ranges kernels and copy commands touched since the last barrier
//! that waited for them, apart, so a barrier waits only for the kind of command the next one
//! conflicts with (a copy runs on beside later kernels that leave its ranges alone).
//!
//! Must not: record commands (frame.rs puts the barriers in).

use super::command::Waits;
use ash::vk;

/// A byte range of a buffer: (buffer, start, end).
pub(crate) type Range = (vk::Buffer, u64, u64);

/// Byte ranges touched since the last barrier that waited for them: (buffer, start, end).
#[derive(Default)]
pub(crate) struct Touched {
    written: Vec<Range>,
    read: Vec<Range>,
}

fn overlaps(set: &[Range], r: Range) -> bool {
    set.iter().any(|&(b, s, e)| b == r.0 && s < r.2 && r.1 < e)
}

impl Touched {
    /// Whether a command reading `reads` and writing `writes` must wait for these.
    pub(crate) fn conflicts(&self, reads: &[Range], writes: &[Range]) -> bool {
        reads.iter().any(|&r| overlaps(&self.written, r))
            || writes.iter().any(|&w| overlaps(&self.written, w) || overlaps(&self.read, w))
    }

    pub(crate) fn note(&mut self, reads: &[Range], writes: &[Range]) {
        self.read.extend_from_slice(reads);
        self.written.extend_from_slice(writes);
    }

    pub(crate) fn clear(&mut self) {
        self.read.clear();
        self.written.clear();
    }
}

/// What kernels and what copy commands touched since a barrier waited for them, apart: a
/// barrier waits only for the kind a command conflicts with, so a copy (a prompt's K/V rows
/// into their read-back buffers) runs on beside the kernels after it that leave its ranges
/// alone.
#[derive(Default)]
pub(crate) struct Hazards {
    pub kernels: Touched,
    pub copies: Touched,
}

impl Hazards {
    /// The earlier commands a command reading `reads` and writing `writes` must wait for.
    pub(crate) fn waits(&self, reads: &[Range], writes: &[Range]) -> Option<Waits> {
        let w = Waits { kernels: self.kernels.conflicts(reads, writes), copies: self.copies.conflicts(reads, writes) };
        (w.kernels || w.copies).then_some(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ash::vk::Handle;

    fn r(buf: u64, start: u64, end: u64) -> Range {
        (vk::Buffer::from_raw(buf), start, end)
    }

    #[test]
    fn a_barrier_waits_only_for_the_kind_of_command_a_later_one_depends_on() {
        let mut h = Hazards::default();
        // A copy of buffer 1's rows into buffer 2 (a prompt's K/V rows into read-back rows).
        h.copies.note(&[r(1, 0, 64)], &[r(2, 0, 64)]);
        // A kernel that reads the copy's source and writes elsewhere waits for nothing.
        assert_eq!(h.waits(&[r(1, 0, 64)], &[r(3, 0, 16)]), None);
        h.kernels.note(&[r(1, 0, 64)], &[r(3, 0, 16)]);
        // One that reads that kernel's output waits for kernels only: the copy runs on.
        assert_eq!(h.waits(&[r(3, 0, 16)], &[r(4, 0, 16)]), Some(Waits { kernels: true, copies: false }));
        // Reading the copy's destination, or writing it, waits for copies; writing its source
        // waits for both (the kernel read it too).
        assert_eq!(h.waits(&[r(2, 32, 40)], &[]), Some(Waits { kernels: false, copies: true }));
        assert_eq!(h.waits(&[], &[r(2, 60, 70)]), Some(Waits { kernels: false, copies: true }));
        assert_eq!(h.waits(&[], &[r(1, 60, 70)]), Some(Waits::BOTH));
        // Both, where it touches both.
        assert_eq!(h.waits(&[r(2, 0, 4), r(3, 0, 4)], &[]), Some(Waits::BOTH));
        // Ranges that only touch at an end do not overlap.
        assert_eq!(h.waits(&[r(2, 64, 80)], &[r(1, 64, 80)]), None);
        h.copies.clear();
        assert_eq!(h.waits(&[r(2, 0, 64)], &[]), None);
    }
}
