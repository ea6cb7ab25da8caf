//! Byte views of plain number slices (`f32`, `u32`, `u16`), for writes to and reads from device
//! buffers. One place for the one `unsafe` cast the executor, the tier and the Vulkan layer
//! all need.
//!
//! Must not: take a type with padding or with invalid bit patterns (`Plain` is sealed to
//! `f32`, `u32` and `u16`).

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for u32 {}
    impl Sealed for u16 {}
}

/// A number type every byte pattern of which is valid and which has no padding.
pub trait Plain: Copy + sealed::Sealed {}
impl Plain for f32 {}
impl Plain for u32 {}
impl Plain for u16 {}

/// The bytes of `v`.
pub fn as_bytes<T: Plain>(v: &[T]) -> &[u8] {
    // SAFETY: `Plain` types have no padding; every byte pattern is a valid u8.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

/// The bytes of `v`, writable: any bytes written make valid values (`Plain`).
pub fn as_bytes_mut<T: Plain>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as above; every byte pattern is a valid `T` (`Plain`).
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip() {
        let mut v = [1.5f32, -2.0];
        assert_eq!(as_bytes(&v), &[0, 0, 0xc0, 0x3f, 0, 0, 0, 0xc0]);
        as_bytes_mut(&mut v)[..4].copy_from_slice(&7u32.to_le_bytes());
        assert_eq!(as_bytes(&[7u32]), as_bytes(&v[..1]));
    }
}
