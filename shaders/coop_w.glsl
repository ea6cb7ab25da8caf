// coop_w.glsl: the weight side of the cooperative-matrix GEMMs for every format with 8-bit
// activations: a 32-element block of a weight row as 32 signed 8-bit codes and the factors
// that turn the block's exact integer product with a q8 activation block (xd = (d, s): its
// scale and the sum of its dequantized values) into the CPU's value:
//     block = (xd.d * wd) * sum_k code[k] q[k] + wm * xd.s
// where the format has offsets (HAS_MIN: Q4_1, Q5_1, Q4_K, Q5_K, I4G64; wm = 0 for the rest).
// Formats whose scales change every 16 elements (Q6_K, Q3_K, IQ2_XS, IQ2_S, IQ1_M: HALVES,
// SUBS 2) take one
// product per half (the including shader masks the other half of the activations) and a
// factor wd per half.
//   coop_codes(row, blk, h): the codes of elements 16h .. 16h + 15, four to a uint.
//   coop_wd(row, blk, sub), coop_wm(row, blk): the factors (sub: the half, 0 where SUBS 1).
//   coop_row_scale(row): the factor of the whole row, applied at the store (I8Row's scale).
// Each decodes the layout wformat.glsl documents for the format, with its helpers; the
// arithmetic is the CPU's up to the order of f32 products (results differ in the last bits).
// Included after wformat.glsl, with QS and SS defined by the including shader.
// Must not: be compiled for a format without 8-bit activations or with per-16 offsets (Q2_K):
// there is no coop blob for those, and the host does not dispatch one.

#if defined(FMT_Q6_K) || defined(FMT_Q3_K) || defined(FMT_IQ2_XS) || defined(FMT_IQ2_S) || defined(FMT_IQ1_M)
#define HALVES 1
const uint SUBS = 2u;
#else
const uint SUBS = 1u;
#endif
#if defined(FMT_Q4_1) || defined(FMT_Q5_1) || defined(FMT_Q4_K) || defined(FMT_Q5_K) || defined(FMT_I4G64)
#define HAS_MIN 1
#endif

// Sign extension of packed fields: each byte of t holds a field of `bits` bits whose top bit
// is the sign; returns the four bytes as signed 8-bit values.
uvec4 sext4(uvec4 t) { return t | ((t & 0x08080808u) * 0x1eu); }
uvec4 sext5(uvec4 t) { return t | ((t & 0x10101010u) * 0x0eu); }
uvec4 sext6(uvec4 t) { return t | ((t & 0x20202020u) * 0x06u); }
uvec4 sext3(uvec4 t) { return t | ((t & 0x04040404u) * 0x3eu); }

#if defined(FMT_I8ROW) || defined(FMT_Q8_0)
uvec4 coop_codes(uint row, uint blk, uint h) { return wq[row * QS + 2u * blk + h]; }
#ifdef FMT_I8ROW
float coop_wd(uint row, uint blk, uint sub) { return 1.0; }
float coop_row_scale(uint row) { return uintBitsToFloat(ws[row * SS]); }
#else
float coop_wd(uint row, uint blk, uint sub) { return f16_at(row * SS, blk); }
#endif

#elif defined(FMT_Q4_0) || defined(FMT_Q4_1)
uvec4 coop_codes(uint row, uint blk, uint h) {
    uvec4 q = (wq[row * QS + blk] >> (4u * h)) & 0x0f0f0f0fu;
#ifdef FMT_Q4_0
    // q - 8: flipping bit 3 gives the 4-bit two's complement.
    return sext4(q ^ 0x08080808u);
#else
    return q;
#endif
}
#ifdef FMT_Q4_0
float coop_wd(uint row, uint blk, uint sub) { return f16_at(row * SS, blk); }
#else
float coop_wd(uint row, uint blk, uint sub) { return unpackHalf2x16(ws[row * SS + blk]).x; }
float coop_wm(uint row, uint blk) { return unpackHalf2x16(ws[row * SS + blk]).y; }
#endif

#elif defined(FMT_Q5_0) || defined(FMT_Q5_1)
uvec4 coop_codes(uint row, uint blk, uint h) {
    uvec4 q = ((wq[row * QS + blk] >> (4u * h)) & 0x0f0f0f0fu) | q5_high(ws[row * SS + 2u * blk + 1u] >> (16u * h));
#ifdef FMT_Q5_0
    return sext5(q ^ 0x10101010u);
#else
    return q;
#endif
}
float coop_wd(uint row, uint blk, uint sub) { return unpackHalf2x16(ws[row * SS + 2u * blk]).x; }
#ifdef FMT_Q5_1
float coop_wm(uint row, uint blk) { return unpackHalf2x16(ws[row * SS + 2u * blk]).y; }
#endif

#elif defined(FMT_I4G64)
// Block blk is the low (even) or high (odd) nibbles of group blk / 2.
uvec4 coop_codes(uint row, uint blk, uint h) { return (wq[row * QS + 2u * (blk >> 1) + h] >> (4u * (blk & 1u))) & 0x0f0f0f0fu; }
float coop_wd(uint row, uint blk, uint sub) { return unpackHalf2x16(ws[row * SS + (blk >> 1)]).x; }
float coop_wm(uint row, uint blk) { return unpackHalf2x16(ws[row * SS + (blk >> 1)]).y; }

#elif defined(FMT_Q4_K) || defined(FMT_Q5_K)
// Sub-block j = blk % 8 of super-block blk / 8: chunk j / 2, low or high nibbles.
uvec4 coop_codes(uint row, uint blk, uint h) {
    uint s = blk >> 3, j = blk & 7u;
#ifdef FMT_Q4_K
    return (wq[row * QS + 8u * s + 2u * (j >> 1) + h] >> (4u * (j & 1u))) & 0x0f0f0f0fu;
#else
    uint qb = row * QS + 10u * s;
    return ((wq[qb + 2u * (j >> 1) + h] >> (4u * (j & 1u))) & 0x0f0f0f0fu) | (((wq[qb + 8u + h] >> j) & 0x01010101u) << 4);
#endif
}
void kq_scale(uint row, uint blk, out uint sc, out uint m) {
#ifdef FMT_Q4_K
    k4_scale(row * SS + 4u * (blk >> 3), blk & 7u, sc, m);
#else
    k5_scale(row * SS + 4u * (blk >> 3), blk & 7u, sc, m);
#endif
}
float coop_wd(uint row, uint blk, uint sub) {
    uint sc, m;
    kq_scale(row, blk, sc, m);
    return unpackHalf2x16(ws[row * SS + 4u * (blk >> 3)]).x * float(sc);
}
float coop_wm(uint row, uint blk) {
    uint sc, m;
    kq_scale(row, blk, sc, m);
    return -unpackHalf2x16(ws[row * SS + 4u * (blk >> 3)]).y * float(m);
}

#elif defined(FMT_Q6_K)
uvec4 coop_codes(uint row, uint blk, uint h) {
    uint s = blk >> 3, j = blk & 7u, hh = j >> 2, t = j & 3u;
    uint qb = row * QS + 12u * s;
    uint li = qb + 4u * hh + 2u * (t & 1u) + h, hi = qb + 8u + 2u * hh + h;
    uvec4 q = ((wq[li] >> (4u * (t >> 1))) & 0x0f0f0f0fu) | (((wq[hi] >> (2u * t)) & 0x03030303u) << 4);
    // q - 32.
    return sext6(q ^ 0x20202020u);
}
float coop_wd(uint row, uint blk, uint sub) {
    uint sbase = row * SS + 5u * (blk >> 3);
    return uintBitsToFloat(ws[sbase + 4u]) * float(k6_scale(sbase, 2u * (blk & 7u) + sub));
}

#elif defined(FMT_Q3_K)
uvec4 coop_codes(uint row, uint blk, uint h) {
    uint s = blk >> 3, j = blk & 7u;
    uint qb = row * QS + 6u * s;
    uvec4 q = ((wq[qb + 2u * (j >> 2) + h] >> (2u * (j & 3u))) & 0x03030303u) | (((wq[qb + 4u + h] >> j) & 0x01010101u) << 2);
    // q - 4.
    return sext3(q ^ 0x04040404u);
}
float coop_wd(uint row, uint blk, uint sub) {
    uint sbase = row * SS + 4u * (blk >> 3);
    return unpackHalf2x16(ws[sbase + 3u]).x * float(k3_scale(sbase, 2u * (blk & 7u) + sub));
}

#elif defined(FMT_IQ4_NL) || defined(FMT_IQ4_XS)
uvec4 coop_codes(uint row, uint blk, uint h) { return iq4_levels((wq[row * QS + blk] >> (4u * h)) & 0x0f0f0f0fu); }
#ifdef FMT_IQ4_NL
float coop_wd(uint row, uint blk, uint sub) { return f16_at(row * SS, blk); }
#else
float coop_wd(uint row, uint blk, uint sub) {
    uint sbase = row * SS + 2u * (blk >> 3);
    return unpackHalf2x16(ws[sbase]).x * float(iq4xs_scale(sbase, blk & 7u));
}
#endif

#elif defined(FMT_MXFP4)
uvec4 coop_codes(uint row, uint blk, uint h) { return mx_levels((wq[row * QS + blk] >> (4u * h)) & 0x0f0f0f0fu); }
float coop_wd(uint row, uint blk, uint sub) { return uintBitsToFloat(ws[row * SS + blk]); }

#elif defined(FMT_IQ2_XXS) || defined(FMT_IQ2_XS) || defined(FMT_IQ2_S) || defined(FMT_IQ3_XXS) || defined(FMT_IQ3_S) \
    || defined(FMT_IQ1_S) || defined(FMT_IQ1_M)
// The grid formats (iq_grid.glsl): block blk is sub-block blk % 8 of super-block blk / 8, its
// codes the lattice's signed values (IQ1_*: 8 (g + delta)), its factor per half (HALVES: the
// formats whose scales change every 16 elements) the super-block's d times IQ_UNIT (2 s + 1).
uvec4 coop_codes(uint row, uint blk, uint h) {
    uint qb = row * QS + IQ_QB * (blk >> 3), ib = blk & 7u, w = 4u * h;
    return uvec4(iq_word(qb, ib, w), iq_word(qb, ib, w + 1u), iq_word(qb, ib, w + 2u), iq_word(qb, ib, w + 3u));
}
float coop_wd(uint row, uint blk, uint sub) {
    uint qb = row * QS + IQ_QB * (blk >> 3);
    return f16_at(row * SS, blk >> 3) * IQ_UNIT * float(2u * iq_scale(qb, blk & 7u, sub) + 1u);
}

#else
#error "no cooperative decoding for this weight format"
#endif

#ifndef FMT_I8ROW
float coop_row_scale(uint row) { return 1.0; }
#endif
#ifndef HAS_MIN
float coop_wm(uint row, uint blk) { return 0.0; }
#endif
