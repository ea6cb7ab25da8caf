// iq_grid.glsl: GGUF's grid formats IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M,
// included by wformat.glsl under their FMT_* define; the decode of
// runtime/src/format/iq_grid.rs (the CPU reference, whose doc gives the block layouts), the
// lattices in iq_grids.glsl.
// wq: a super-block's bytes after its f16 d, zero-padded to whole uvec4s (IQ_QB of them), so
// every field the CPU reads at byte b is here at b - 2 (all of them in whole 32-bit words);
// IQ1_M, which has no d in front, keeps all its bytes, each at the CPU's b.
// ws: the super-blocks' f16 d, two to a uint (IQ1_M's assembled by the host from its scale
// words' top nibbles). A unit is one sub-block of 32 elements (one q8 block of activations):
// its 32 signed values, eight uints of four signed bytes (IQ1_*: 8 (g + delta)), against the
// activations in integers, scaled per half as the CPU scales (c (2 s + 1), c = IQ_UNIT).
// The lattice lives in shared memory (iq_grids.glsl): wformat_init fills it, which the
// including shader calls first in main.
// Must not: read a byte the CPU does not, or round differently from the CPU's dequant.

#include "iq_grids.glsl"

#if defined(FMT_IQ2_XXS)
#define IQ_QB 4u
#elif defined(FMT_IQ2_XS) || defined(FMT_IQ2_S)
#define IQ_QB 5u
#elif defined(FMT_IQ3_XXS)
#define IQ_QB 6u
#elif defined(FMT_IQ1_S)
#define IQ_QB 3u
#elif defined(FMT_IQ1_M)
#define IQ_QB 4u
#else
#define IQ_QB 7u
#endif
#if defined(FMT_IQ3_XXS)
#define IQ_UNIT 0.25
#elif defined(FMT_IQ3_S)
#define IQ_UNIT 1.0
#else
#define IQ_UNIT 0.125
#endif

// Word w (bytes 4w..4w + 3) of the super-block whose values start at uvec4 qb.
uint iq_w(uint qb, uint w) { return wq[qb + (w >> 2)][w & 3u]; }
// Byte b of the same.
uint iq_b(uint qb, uint b) { return (iq_w(qb, b >> 2) >> (8u * (b & 3u))) & 0xffu; }
void wformat_init() { iq_lattice_init(); }
#define WFORMAT_INIT 1

#if defined(FMT_IQ3_XXS) || defined(FMT_IQ3_S)
// Lattice entry e: four magnitudes, byte j element j.
uint iq_grid4(uint e) { return iq_lat[e]; }
#elif defined(FMT_IQ1_S) || defined(FMT_IQ1_M)
// Half h (elements 4h..4h + 3) of lattice entry e as four bytes 8 (g + delta), two's
// complement, delta -1/8 where neg: the 2-bit codes c = g + 1 as bytes 0x80 + 8 c, less
// 8 - delta each (no byte borrows: each is at least 0x80), bit 7 flipped (as the CPU's iq1).
uint iq1_grid8(uint e, uint h, bool neg) {
    uint n = (iq_lat[e >> 1] >> (16u * (e & 1u) + 8u * h)) & 0xffu;
    uint c = (n & 3u) | ((n & 0xcu) << 6) | ((n & 0x30u) << 12) | ((n & 0xc0u) << 18);
    return ((0x80808080u | (c << 3)) - (neg ? 0x09090909u : 0x07070707u)) ^ 0x80808080u;
}
#else
// Half h (elements 4h..4h + 3) of lattice entry e: its 2-bit codes to magnitudes 8, 25, 43
// (8 + 17 c + c / 2) as four bytes.
uint iq_grid8(uint e, uint h) {
    uint n = (iq_lat[e >> 1] >> (16u * (e & 1u) + 8u * h)) & 0xffu;
    uint b = (n & 3u) | ((n & 0xcu) << 6) | ((n & 0x30u) << 12) | ((n & 0xc0u) << 18);
    return 0x08080808u + 17u * b + ((b >> 1) & 0x01010101u);
}
#endif
// GGUF's ksigns table: 7 stored sign bits, the eighth their parity (an even count of minus).
uint iq_ksigns(uint i) { return i | ((uint(bitCount(i)) & 1u) << 7); }
// Four magnitudes (bytes of g, each nonzero) negated where bits 0..3 of n are set, as
// two's-complement bytes: (v ^ 0xff) + 1 per negated byte, which never carries (v > 0).
uint iq_signed(uint g, uint n) {
    uint m = ((n & 1u) | ((n & 2u) << 7) | ((n & 4u) << 14) | ((n & 8u) << 21)) * 0xffu;
    return (g ^ m) + (m & 0x01010101u);
}

// Uint w (elements 4w..4w + 3) of sub-block ib, signed.
uint iq_word(uint qb, uint ib, uint w) {
#if defined(FMT_IQ2_XXS)
    uint l = w >> 1, h = w & 1u;
    uint aux = iq_w(qb, 2u * ib + 1u);
    uint g = iq_grid8((iq_w(qb, 2u * ib) >> (8u * l)) & 0xffu, h);
    return iq_signed(g, iq_ksigns((aux >> (7u * l)) & 127u) >> (4u * h));
#elif defined(FMT_IQ2_XS)
    uint l = w >> 1, h = w & 1u;
    uint q = (iq_w(qb, 2u * ib + (l >> 1)) >> (16u * (l & 1u))) & 0xffffu;
    return iq_signed(iq_grid8(q & 511u, h), iq_ksigns(q >> 9) >> (4u * h));
#elif defined(FMT_IQ2_S)
    uint l = w >> 1, h = w & 1u;
    uint idx = ((iq_w(qb, ib) >> (8u * l)) & 0xffu) | (((iq_b(qb, 64u + ib) >> (2u * l)) & 3u) << 8);
    return iq_signed(iq_grid8(idx, h), (iq_w(qb, 8u + ib) >> (8u * l + 4u * h)) & 15u);
#elif defined(FMT_IQ3_XXS)
    uint aux = iq_w(qb, 16u + ib);
    uint idx = iq_b(qb, 8u * ib + w);
    return iq_signed(iq_grid4(idx), iq_ksigns((aux >> (7u * (w >> 1))) & 127u) >> (4u * (w & 1u)));
#elif defined(FMT_IQ1_S)
    uint l = w >> 1, h = w & 1u;
    uint qh = (iq_w(qb, 8u + (ib >> 1)) >> (16u * (ib & 1u))) & 0xffffu;
    uint idx = ((iq_w(qb, ib) >> (8u * l)) & 0xffu) | (((qh >> (3u * l)) & 7u) << 8);
    return iq1_grid8(idx, h, (qh & 0x8000u) != 0u);
#elif defined(FMT_IQ1_M)
    uint l = w >> 1, h = w & 1u;
    uint n = (iq_b(qb, 32u + 2u * ib + (l >> 1)) >> (4u * (l & 1u))) & 15u;
    uint idx = ((iq_w(qb, ib) >> (8u * l)) & 0xffu) | ((n & 7u) << 8);
    return iq1_grid8(idx, h, (n & 8u) != 0u);
#else
    uint idx = iq_b(qb, 8u * ib + w) | (((iq_b(qb, 64u + ib) >> w) & 1u) << 8);
    uint n = (iq_w(qb, 18u + ib) >> (8u * (w >> 1) + 4u * (w & 1u))) & 15u;
    return iq_signed(iq_grid4(idx), n);
#endif
}

// The 4-bit (IQ1_*: 3-bit) scale of half h (elements 16h..16h + 15) of sub-block ib.
uint iq_scale(uint qb, uint ib, uint h) {
#if defined(FMT_IQ2_XXS)
    return iq_w(qb, 2u * ib + 1u) >> 28;
#elif defined(FMT_IQ2_XS)
    return (iq_b(qb, 64u + ib) >> (4u * h)) & 15u;
#elif defined(FMT_IQ2_S)
    return (iq_b(qb, 72u + ib) >> (4u * h)) & 15u;
#elif defined(FMT_IQ3_XXS)
    return iq_w(qb, 16u + ib) >> 28;
#elif defined(FMT_IQ1_S)
    return (iq_w(qb, 8u + (ib >> 1)) >> (16u * (ib & 1u) + 12u)) & 7u;
#elif defined(FMT_IQ1_M)
    return (iq_w(qb, 12u + (ib >> 2)) >> (16u * ((ib >> 1) & 1u) + 6u * (ib & 1u) + 3u * h)) & 7u;
#else
    return (iq_b(qb, 104u + (ib >> 1)) >> (4u * (ib & 1u))) & 15u;
#endif
}

#ifndef ACTS_F32
uint units_per_row() { return (QS / IQ_QB) * 8u; }
float unit_dot(uint row, uint u, uint xr) {
    uint s = u >> 3, ib = u & 7u, qb = row * QS + IQ_QB * s;
    uvec4 lo = uvec4(iq_word(qb, ib, 0u), iq_word(qb, ib, 1u), iq_word(qb, ib, 2u), iq_word(qb, ib, 3u));
    uvec4 hi = uvec4(iq_word(qb, ib, 4u), iq_word(qb, ib, 5u), iq_word(qb, ib, 6u), iq_word(qb, ib, 7u));
    uint blk = XQ_BLK(xr) + u;
    int i = int(2u * iq_scale(qb, ib, 0u) + 1u) * dot16_ss(lo, xq16(blk, 0u))
          + int(2u * iq_scale(qb, ib, 1u) + 1u) * dot16_ss(hi, xq16(blk, 1u));
    return (f16_at(row * SS, s) * IQ_UNIT) * (xd[blk].x * float(i));
}
float row_finish(uint row, float acc) { return acc; }
#endif
float dequant(uint row, uint k) {
    uint s = k >> 8, e = k & 255u, ib = e >> 5, j = e & 31u, qb = row * QS + IQ_QB * s;
    float q = float(int(iq_word(qb, ib, j >> 2) << (24u - 8u * (j & 3u))) >> 24);
    float d = f16_at(row * SS, s);
    float sc = float(iq_scale(qb, ib, j >> 4));
#if defined(FMT_IQ3_S)
    float dl = d * (1.0 + 2.0 * sc);
#elif defined(FMT_IQ3_XXS)
    float dl = d * (0.5 + sc) * 0.5;
#elif defined(FMT_IQ1_S) || defined(FMT_IQ1_M)
    float dl = d * (1.0 + 2.0 * sc) * 0.125;
#else
    float dl = d * (0.5 + sc) * 0.25;
#endif
    return dl * q;
}
