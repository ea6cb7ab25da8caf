//! The element type of an attention layer's K/V mirror and of its read-back rows (`KvType`):
//! what the attention ops check views against and which kernel twin they dispatch, what the
//! context converts host rows to and from.
//!
//! Must not: decide which layers take f16 (the executor does, `exec::device::kv_rows`).

use super::error::{Result, VkError};
use super::shaders::Kernel;

/// The element type of an attention layer's K/V mirror and of its read-back rows
/// (`shaders/kv_type.glsl`). Views over them count 4-byte words, as every view does: an f16
/// mirror's row of `w` elements is `w / 2` words (`w` even).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvType {
    #[default]
    F32,
    /// 16-bit floats (round to nearest even): half the memory, and half the bytes decode
    /// attention reads over a long context. Needs the device's 16-bit storage buffers.
    F16,
}

impl KvType {
    /// Bytes of one element.
    pub fn bytes(self) -> usize {
        match self {
            KvType::F32 => 4,
            KvType::F16 => 2,
        }
    }

    /// 4-byte words that `elems` elements take.
    pub fn words(self, elems: usize) -> usize {
        (elems * self.bytes()).div_ceil(4)
    }

    /// Elements in `words` 4-byte words (a view's offset as a kernel indexes the mirror).
    pub fn elems(self, words: usize) -> usize {
        words * 4 / self.bytes()
    }

    /// The kernel that reads and writes mirrors of this type.
    pub(crate) fn kernel(self, k: Kernel) -> Kernel {
        match self {
            KvType::F32 => k,
            KvType::F16 => k.kv16().unwrap_or(k),
        }
    }

    /// Checks that rows of `widths` elements lie on word boundaries (an f16 row's width even).
    pub(crate) fn check_widths(self, op: &'static str, widths: &[usize]) -> Result<()> {
        if self == KvType::F16 && widths.iter().any(|w| w % 2 != 0) {
            return Err(VkError::BadArgument { op, msg: format!("f16 K/V rows of odd widths {widths:?}") });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_and_elements_of_each_type() {
        assert_eq!((KvType::F32.bytes(), KvType::F32.words(6), KvType::F32.elems(3)), (4, 6, 3));
        assert_eq!((KvType::F16.bytes(), KvType::F16.words(6), KvType::F16.elems(3)), (2, 3, 6));
        assert_eq!(KvType::F16.words(7), 4, "a partial word counts");
        assert_eq!(KvType::F16.kernel(Kernel::AttnSplit), Kernel::AttnSplit16);
        assert_eq!(KvType::F16.kernel(Kernel::Matvec), Kernel::Matvec, "kernels without a twin stay");
        assert_eq!(KvType::F32.kernel(Kernel::RopeKv), Kernel::RopeKv);
        assert_eq!(Kernel::AttnPart16.base(), Kernel::AttnPart);
        assert!(KvType::F16.check_widths("t", &[64, 48]).is_ok());
        assert!(KvType::F16.check_widths("t", &[64, 9]).is_err());
        assert!(KvType::F32.check_widths("t", &[9]).is_ok());
    }
}
