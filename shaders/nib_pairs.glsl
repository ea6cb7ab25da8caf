// nib_pairs.glsl: the 16-level formats' decode by table (IQ4_NL, IQ4_XS, MXFP4), included by
// wformat.glsl in their section with NIB_LEVEL naming the format's level function. A byte of
// packed nibbles (low nibble: element i of a 32-block, high: element i + 16) indexes a shared
// table of its two levels as signed bytes (low in byte 0, high in byte 1), so a word of eight
// nibbles takes four table loads instead of eight level selects; wformat_init fills the table.
// The cooperative GEMMs (WFORMAT_NO_TABLE) keep the selects and their shared memory for their
// tiles. The arithmetic is unchanged: the same levels, the same sums.
// Must not: change a level (the table is NIB_LEVEL's values).

#if !defined(ACTS_F32) && !defined(WFORMAT_NO_TABLE)
shared uint nib_pairs[256];

// The levels of the low and the high nibbles of each byte of w, in the bytes' places.
uvec2 nib_word(uint w) {
    uint e0 = nib_pairs[w & 255u], e1 = nib_pairs[(w >> 8) & 255u];
    uint e2 = nib_pairs[(w >> 16) & 255u], e3 = nib_pairs[w >> 24];
    uint x = e0 | (e2 << 16), y = e1 | (e3 << 16);
    return uvec2((x & 0x00ff00ffu) | ((y & 0x00ff00ffu) << 8), ((x >> 8) & 0x00ff00ffu) | (y & 0xff00ff00u));
}

// Levels of the 16 low nibbles (lo: elements 0..15 of the block) and the 16 high (hi).
void nib_levels(uvec4 w, out uvec4 lo, out uvec4 hi) {
    uvec2 a = nib_word(w.x), b = nib_word(w.y), c = nib_word(w.z), d = nib_word(w.w);
    lo = uvec4(a.x, b.x, c.x, d.x);
    hi = uvec4(a.y, b.y, c.y, d.y);
}

#define WFORMAT_INIT 1
void wformat_init() {
    uint n = gl_WorkGroupSize.x * gl_WorkGroupSize.y * gl_WorkGroupSize.z;
    for (uint i = gl_LocalInvocationIndex; i < 256u; i += n) {
        nib_pairs[i] = NIB_LEVEL(i) | (NIB_LEVEL(i >> 4) << 8);
    }
    barrier();
}
#else
// Without the table (f32 activations, or the cooperative GEMMs): the selects.
void nib_levels(uvec4 w, out uvec4 lo, out uvec4 hi) {
    lo = uvec4(0u);
    hi = uvec4(0u);
    for (uint j = 0u; j < 4u; j++) {
        uint n = w[j];
        lo[j] = NIB_LEVEL(n) | (NIB_LEVEL(n >> 8) << 8) | (NIB_LEVEL(n >> 16) << 16) | (NIB_LEVEL(n >> 24) << 24);
        hi[j] = NIB_LEVEL(n >> 4) | (NIB_LEVEL(n >> 12) << 8) | (NIB_LEVEL(n >> 20) << 16) | (NIB_LEVEL(n >> 28) << 24);
    }
}
#endif
#undef NIB_LEVEL
