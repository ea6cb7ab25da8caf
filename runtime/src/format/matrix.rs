//! `Matrix`: a checked, borrowed view of a matrix's stored rows in one `WeightFormat` (what
//! `matmul` and the SIMD tiles take).
//!
//! Must not: copy the bytes or depend on any kernel module (it is their common leaf).

use super::{FormatError, WeightFormat};

/// A matrix of `rows` stored rows of `cols` elements each, in `format`, borrowed.
#[derive(Clone, Copy)]
pub struct Matrix<'a> {
    pub format: WeightFormat,
    pub rows: usize,
    pub cols: usize,
    bytes: &'a [u8],
    row_bytes: usize,
}

impl<'a> Matrix<'a> {
    /// Checks that `bytes` holds exactly `rows` rows of `cols` in `format`.
    pub fn new(format: WeightFormat, rows: usize, cols: usize, bytes: &'a [u8]) -> Result<Matrix<'a>, FormatError> {
        let row_bytes = format.row_bytes(cols)?;
        let expected = rows * row_bytes;
        if bytes.len() != expected {
            return Err(FormatError::MatrixBytes { format, rows, cols, expected, found: bytes.len() });
        }
        Ok(Matrix { format, rows, cols, bytes, row_bytes })
    }

    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// The stored bytes of row `r`. Panics if `r >= rows` (see `get_row`).
    #[track_caller]
    pub fn row(&self, r: usize) -> &'a [u8] {
        match self.get_row(r) {
            Some(row) => row,
            None => panic!("row {r} of a matrix of {} rows", self.rows),
        }
    }

    /// The stored bytes of row `r`, or `None` past the end.
    pub fn get_row(&self, r: usize) -> Option<&'a [u8]> {
        self.bytes.get(r * self.row_bytes..(r + 1) * self.row_bytes)
    }

    /// Row `r` expanded to f32 (`out.len() == cols`); an error past the end or for a wrong
    /// `out` length.
    pub fn dequant_row(&self, r: usize, out: &mut [f32]) -> Result<(), FormatError> {
        let row = self.get_row(r).ok_or(FormatError::Length {
            what: "matrix row index below",
            expected: self.rows,
            found: r,
        })?;
        super::try_dequant_row(self.format, row, out)
    }

    /// Rows `r0..r1` as a matrix of their own (a tile of a larger one). Panics past the end.
    #[track_caller]
    pub fn rows_range(&self, r0: usize, r1: usize) -> Matrix<'a> {
        assert!(r0 <= r1 && r1 <= self.rows, "rows {r0}..{r1} of a matrix of {} rows", self.rows);
        Matrix { rows: r1 - r0, bytes: &self.bytes[r0 * self.row_bytes..r1 * self.row_bytes], ..*self }
    }

    #[inline(always)]
    pub(super) fn row_unchecked(&self, r: usize) -> &'a [u8] {
        &self.bytes[r * self.row_bytes..(r + 1) * self.row_bytes]
    }
}

impl std::fmt::Debug for Matrix<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Matrix({} {} x {}, {} bytes)", self.format, self.rows, self.cols, self.bytes.len())
    }
}
