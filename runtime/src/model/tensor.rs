//! `Tensor`: one weight of a checkpoint, a view into the checkpoint's memory map (or an owned
//! buffer after quantize-at-load), with its name, storage format and shape (outermost first).
//! Cheap to clone: the bytes are shared.
//!
//! A `Tensor` is only built by the checkpoint readers, after they have checked that its bytes
//! hold exactly its shape in its format; the accessors rely on that (a matrix view cannot
//! fail to build). Must not: copy mapped bytes, or know about file formats.

use super::file::MappedFile;
use super::LoadError;
use crate::format::{dequant_row, Matrix, WeightFormat};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Clone)]
enum Data {
    Mapped { map: Arc<MappedFile>, start: usize, len: usize },
    Owned(Arc<Vec<u8>>),
}

/// A weight tensor: `shape` is outermost first (`[out, in]` for a Linear weight, `[experts,
/// rows, cols]` for stacked experts); rows of the innermost dimension are stored in `format`.
#[derive(Clone)]
pub struct Tensor {
    pub name: String,
    pub format: WeightFormat,
    pub shape: Vec<usize>,
    data: Data,
    source: Arc<PathBuf>,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({} {} {:?}, {} bytes)", self.name, self.format, self.shape, self.bytes().len())
    }
}

/// Bytes of a tensor of `shape` in `format` (`None` when the innermost dimension is not a whole
/// number of blocks or the size overflows).
pub fn tensor_bytes(format: WeightFormat, shape: &[usize]) -> Option<usize> {
    let cols = shape.last().copied().unwrap_or(1);
    let rows = shape[..shape.len().saturating_sub(1)].iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
    rows.checked_mul(format.row_bytes(cols).ok()?)
}

impl Tensor {
    /// A view of `len` bytes at `start` of `map`; the caller has checked the range and the size.
    pub(crate) fn mapped(
        name: String,
        format: WeightFormat,
        shape: Vec<usize>,
        map: Arc<MappedFile>,
        start: usize,
        len: usize,
        source: Arc<PathBuf>,
    ) -> Tensor {
        debug_assert!(start + len <= map.bytes().len());
        debug_assert_eq!(tensor_bytes(format, &shape), Some(len));
        Tensor { name, format, shape, data: Data::Mapped { map, start, len }, source }
    }

    /// A tensor owning its bytes (quantize-at-load); the caller has checked the size.
    pub(crate) fn owned(
        name: String,
        format: WeightFormat,
        shape: Vec<usize>,
        bytes: Vec<u8>,
        source: Arc<PathBuf>,
    ) -> Tensor {
        debug_assert_eq!(tensor_bytes(format, &shape), Some(bytes.len()));
        Tensor { name, format, shape, data: Data::Owned(Arc::new(bytes)), source }
    }

    /// The stored bytes.
    pub fn bytes(&self) -> &[u8] {
        match &self.data {
            Data::Mapped { map, start, len } => &map.bytes()[*start..*start + *len],
            Data::Owned(v) => v,
        }
    }

    /// Tells the kernel this process no longer needs the pages of a mapped tensor (their
    /// matrices live on a device): they leave the process's resident set, and a later read
    /// faults them in again from the file with the same bytes. Returns the bytes advised (0
    /// for an owned tensor, or where the kernel declines: it is advice).
    pub fn advise_not_needed(&self) -> usize {
        let Data::Mapped { map, start, len } = &self.data else { return 0 };
        if map.advise_not_needed(*start, *len) {
            *len
        } else {
            0
        }
    }

    /// Whether the bytes are a view of the file (true) or owned (quantized at load).
    pub fn is_mapped(&self) -> bool {
        matches!(self.data, Data::Mapped { .. })
    }

    /// Where a mapped tensor's bytes start in its file (`None` for an owned tensor): the RAM
    /// expert cache reads experts from there with positioned reads instead of the map.
    pub fn file_offset(&self) -> Option<u64> {
        match &self.data {
            Data::Mapped { start, .. } => Some(*start as u64),
            Data::Owned(_) => None,
        }
    }

    /// The file the tensor was read from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Columns: the innermost dimension (1 for a scalar).
    pub fn cols(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// The tensor as a matrix of `cols` columns and all outer dimensions as rows: `[out, in]`
    /// for a 2-D tensor, `[1, n]` for a vector, `[experts * rows, cols]` for a stacked tensor.
    pub fn as_matrix(&self) -> Matrix<'_> {
        let rows = self.shape[..self.shape.len().saturating_sub(1)].iter().product();
        Matrix::new(self.format, rows, self.cols(), self.bytes()).expect("tensor sizes are checked when it is built")
    }

    /// Expert `e` of a stacked `[experts, rows, cols]` tensor as a `[rows, cols]` matrix.
    /// Panics if the tensor is not 3-D or `e` is out of range; `try_expert` reports those.
    #[track_caller]
    pub fn expert(&self, e: usize) -> Matrix<'_> {
        match self.try_expert(e) {
            Ok(m) => m,
            Err(err) => panic!("{err}"),
        }
    }

    /// Expert `e` of a stacked `[experts, rows, cols]` tensor as a `[rows, cols]` matrix.
    pub fn try_expert(&self, e: usize) -> Result<Matrix<'_>, LoadError> {
        let &[experts, rows, _] = self.shape.as_slice() else {
            return Err(self.shape_error("is not a stacked [experts, rows, cols] tensor"));
        };
        if e >= experts {
            return Err(self.shape_error("has no such expert"));
        }
        let m = self.as_matrix();
        Ok(m.rows_range(e * rows, (e + 1) * rows))
    }

    /// Row `r` of the tensor seen as a matrix (`as_matrix`), expanded to f32.
    pub fn row_f32(&self, r: usize) -> Result<Vec<f32>, LoadError> {
        let m = self.as_matrix();
        let row = m.get_row(r).ok_or_else(|| self.shape_error("has no such row"))?;
        let mut out = vec![0f32; m.cols];
        dequant_row(self.format, row, &mut out);
        Ok(out)
    }

    /// The whole tensor expanded to f32, row-major (for small tensors: norms, biases).
    pub fn to_f32_vec(&self) -> Result<Vec<f32>, LoadError> {
        let m = self.as_matrix();
        let mut out = vec![0f32; m.rows * m.cols];
        if m.cols > 0 {
            for (r, o) in out.chunks_exact_mut(m.cols).enumerate() {
                dequant_row(self.format, m.row(r), o);
            }
        }
        Ok(out)
    }

    fn shape_error(&self, what: &'static str) -> LoadError {
        LoadError::Shape { path: self.source.to_path_buf(), name: self.name.clone(), shape: self.shape.clone(), what }
    }
}
