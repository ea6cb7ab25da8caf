//! The block-level primitives every format kernel shares: f32 dot products over fixed-size
//! blocks, integer dot products of stored values against 8-bit activations, and fixed-size
//! views of a block's bytes. Written over fixed-size arrays so the compiler vectorizes them.
//!
//! Must not: know a format, check lengths beyond the slice bounds, or allocate.

/// The `N` elements of `s` from `at` as a fixed-size array (panics past the end of `s`, a
/// broken invariant of the caller: blocks are whole).
#[inline(always)]
pub fn arr<T, const N: usize>(s: &[T], at: usize) -> &[T; N] {
    s[at..at + N].try_into().unwrap()
}

/// Sum of `w[i] * x[i]` over a fixed-size block, with eight independent accumulators.
#[inline(always)]
pub fn fdot<const N: usize>(w: &[f32; N], x: &[f32]) -> f32 {
    let x: &[f32; N] = arr(x, 0);
    let mut acc = [0f32; 8];
    for i in 0..N {
        acc[i % 8] += w[i] * x[i];
    }
    acc.iter().sum()
}

/// Sum of `a[i] * b[i]` over signed bytes.
#[inline(always)]
pub fn idot_i8<const N: usize>(a: &[i8; N], b: &[i8; N]) -> i32 {
    let mut s = 0i32;
    for i in 0..N {
        s += a[i] as i16 as i32 * b[i] as i16 as i32;
    }
    s
}

/// Sum of `a[i] * b[i]`, `a` unsigned (nibbles or 5- and 6-bit values), `b` signed.
#[inline(always)]
pub fn idot_u8<const N: usize>(a: &[u8; N], b: &[i8; N]) -> i32 {
    let mut s = 0i32;
    for i in 0..N {
        s += a[i] as i16 as i32 * b[i] as i16 as i32;
    }
    s
}

/// Sum of signed bytes (the activation sum a sub-block's min multiplies).
#[inline(always)]
pub fn isum<const N: usize>(a: &[i8; N]) -> i32 {
    let mut s = 0i32;
    for v in a {
        s += *v as i32;
    }
    s
}
