// wformat.glsl: the device layouts of every weight format and how to read them. One source,
// compiled once per format (FMT_* define, see runtime/build.rs). The host repacks a matrix at
// upload (runtime/src/vk/layout.rs) into two regions:
//   wq: per row QS uvec4s of quantized values (16-byte loads; rows padded with zeros),
//   ws: per row SS uints of scales (f16 pairs, f32 bits, or raw scale bytes).
// A row is a sequence of units (UNITS per row); unit_dot(row, u, xr) is the dot product of
// unit u with activation row xr, in the same arithmetic as the CPU kernel of the format
// (integer formats against 8-bit activations quantized as the CPU quantizes them:
// quantize_q8.comp). dequant(row, k) is element k, as the CPU's dequant_row computes it.
// The including shader declares wq, ws (and xf / xq, xd for activations) and defines QS, SS,
// COLS, XF_OFF (float activations: index of the row's first element) and XQ_BLK (q8
// activations: index of the row's first 32-block), and optionally XLOAD (see xat); it calls
// wformat_init() first in main.
// Must not: declare bindings, or depend on the workgroup shape.

#if defined(FMT_F32) || defined(FMT_F16) || defined(FMT_BF16) || defined(FMT_I8ROW_F)
#define FLOAT_ACTS 1
#define FLOAT_FORMAT 1
#endif
// ACTS_F32 (with an integer format): activations stay f32, each weight decoded (dequant) and
// multiplied in f32, as the CPU's Precision::Exact. Units of 32 elements, see the end.
#ifdef ACTS_F32
#define FLOAT_ACTS 1
#endif

float f16_at(uint base, uint i) {
    vec2 h = unpackHalf2x16(ws[base + (i >> 1)]);
    return (i & 1u) == 0u ? h.x : h.y;
}

uint wbyte(uint qbase, uint b) { return (wq[qbase + (b >> 4)][(b >> 2) & 3u] >> (8u * (b & 3u))) & 0xffu; }

#ifdef FLOAT_ACTS
// XLOAD(xr, k): the including shader may transform activations as they are read (a fused
// RMSNorm or gated unit); by default element k of activation row xr.
#ifndef XLOAD
#define XLOAD(xr, k) xf[XF_OFF(xr) + (k)]
#endif
float xat(uint xr, uint k) { return k < COLS ? XLOAD(xr, k) : 0.0; }
#else
uvec4 xq16(uint blk, uint half_) { return xq[2u * blk + half_]; }
#endif

// ---------------------------------------------------------------------------------------
#if defined(FMT_F32)
uint units_per_row() { return QS; }
float unit_dot(uint row, uint u, uint xr) {
    vec4 w = uintBitsToFloat(wq[row * QS + u]);
    uint k = 4u * u;
    return w.x * xat(xr, k) + w.y * xat(xr, k + 1u) + w.z * xat(xr, k + 2u) + w.w * xat(xr, k + 3u);
}
float row_finish(uint row, float acc) { return acc; }
float dequant(uint row, uint k) { return uintBitsToFloat(wq[row * QS + (k >> 2)][k & 3u]); }

// ---------------------------------------------------------------------------------------
#elif defined(FMT_F16) || defined(FMT_BF16)
vec2 unpack2(uint w) {
#ifdef FMT_F16
    return unpackHalf2x16(w);
#else
    return unpack_bf16x2(w);
#endif
}
uint units_per_row() { return QS; }
float unit_dot(uint row, uint u, uint xr) {
    uvec4 w = wq[row * QS + u];
    uint k = 8u * u;
    float s = 0.0;
    for (uint i = 0u; i < 4u; i++) {
        vec2 p = unpack2(w[i]);
        s += p.x * xat(xr, k + 2u * i) + p.y * xat(xr, k + 2u * i + 1u);
    }
    return s;
}
float row_finish(uint row, float acc) { return acc; }
float dequant(uint row, uint k) {
    vec2 p = unpack2(wq[row * QS + (k >> 3)][(k >> 1) & 3u]);
    return (k & 1u) == 0u ? p.x : p.y;
}

// ---------------------------------------------------------------------------------------
#elif defined(FMT_I8ROW_F)
// ws: one uint per row, the f32 scale. Units of 16 values.
uint units_per_row() { return QS; }
float unit_dot(uint row, uint u, uint xr) {
    uvec4 w = wq[row * QS + u];
    uint k = 16u * u;
    float s = 0.0;
    for (uint i = 0u; i < 16u; i++) s += float(sbyte(w[i >> 2], i & 3u)) * xat(xr, k + i);
    return s;
}
float row_finish(uint row, float acc) { return uintBitsToFloat(ws[row * SS]) * acc; }
float dequant(uint row, uint k) { return uintBitsToFloat(ws[row * SS]) * float(int(wbyte(row * QS, k) << 24) >> 24); }

// ---------------------------------------------------------------------------------------
#elif defined(FMT_I8ROW)
// As I8ROW_F, with units of one 32-block (two uvec4) against q8 activations.
#ifndef ACTS_F32
uint units_per_row() { return QS >> 1; }
float unit_dot(uint row, uint u, uint xr) {
    uint blk = XQ_BLK(xr) + u;
    int i = dot16_ss(wq[row * QS + 2u * u], xq16(blk, 0u)) + dot16_ss(wq[row * QS + 2u * u + 1u], xq16(blk, 1u));
    return xd[blk].x * float(i);
}
float row_finish(uint row, float acc) { return uintBitsToFloat(ws[row * SS]) * acc; }
#endif
float dequant(uint row, uint k) { return uintBitsToFloat(ws[row * SS]) * float(int(wbyte(row * QS, k) << 24) >> 24); }

// ---------------------------------------------------------------------------------------
#elif defined(FMT_Q8_0)
// wq: 2 uvec4 a block; ws: the blocks' f16 d, two to a uint.
#ifndef ACTS_F32
uint units_per_row() { return QS >> 1; }
float unit_dot(uint row, uint u, uint xr) {
    uint blk = XQ_BLK(xr) + u;
    int i = dot16_ss(wq[row * QS + 2u * u], xq16(blk, 0u)) + dot16_ss(wq[row * QS + 2u * u + 1u], xq16(blk, 1u));
    return f16_at(row * SS, u) * xd[blk].x * float(i);
}
float row_finish(uint row, float acc) { return acc; }
#endif
float dequant(uint row, uint k) { return f16_at(row * SS, k >> 5) * float(int(wbyte(row * QS, k) << 24) >> 24); }

// ---------------------------------------------------------------------------------------
#elif defined(FMT_Q4_0) || defined(FMT_Q4_1)
// wq: 1 uvec4 a block (element i < 16: low nibble of byte i; i + 16: its high nibble).
// ws: Q4_0: f16 d, two to a uint; Q4_1: one uint a block, f16 d (low) and f16 m (high).
#ifndef ACTS_F32
uint units_per_row() { return QS; }
float unit_dot(uint row, uint u, uint xr) {
    uint blk = XQ_BLK(xr) + u;
    uvec4 w = wq[row * QS + u];
    uvec4 x0 = xq16(blk, 0u), x1 = xq16(blk, 1u);
    int i = dot16_us(w & 0x0f0f0f0fu, x0) + dot16_us((w >> 4) & 0x0f0f0f0fu, x1);
#ifdef FMT_Q4_0
    i -= 8 * (sum16_s(x0) + sum16_s(x1));
    return f16_at(row * SS, u) * xd[blk].x * float(i);
#else
    vec2 dm = unpackHalf2x16(ws[row * SS + u]);
    return dm.x * xd[blk].x * float(i) + dm.y * xd[blk].y;
#endif
}
float row_finish(uint row, float acc) { return acc; }
#endif
float dequant(uint row, uint k) {
    uint b = k >> 5, i = k & 31u;
    uint q = (wbyte(row * QS + b, i & 15u) >> (4u * (i >> 4))) & 15u;
#ifdef FMT_Q4_0
    return f16_at(row * SS, b) * float(int(q) - 8);
#else
    vec2 dm = unpackHalf2x16(ws[row * SS + b]);
    return dm.x * float(q) + dm.y;
#endif
}

// ---------------------------------------------------------------------------------------
#elif defined(FMT_I4G64)
// wq: 2 uvec4 a group of 64 (element i < 32: low nibble of byte i; i + 32: its high nibble).
// ws: one uint a group, f16 scale (low) and f16 min (high). A unit is a group.
#ifndef ACTS_F32
uint units_per_row() { return QS >> 1; }
float unit_dot(uint row, uint u, uint xr) {
    uint ba = XQ_BLK(xr) + 2u * u, bb = ba + 1u;
    uvec4 w0 = wq[row * QS + 2u * u], w1 = wq[row * QS + 2u * u + 1u];
    int ia = dot16_us(w0 & 0x0f0f0f0fu, xq16(ba, 0u)) + dot16_us(w1 & 0x0f0f0f0fu, xq16(ba, 1u));
    int ib = dot16_us((w0 >> 4) & 0x0f0f0f0fu, xq16(bb, 0u)) + dot16_us((w1 >> 4) & 0x0f0f0f0fu, xq16(bb, 1u));
    vec2 sm = unpackHalf2x16(ws[row * SS + u]);
    float i = xd[ba].x * float(ia) + xd[bb].x * float(ib);
    return sm.x * i + sm.y * (xd[ba].y + xd[bb].y);
}
float row_finish(uint row, float acc) { return acc; }
#endif
float dequant(uint row, uint k) {
    uint g = k >> 6, i = k & 63u;
    uint q = (wbyte(row * QS + 2u * g, i & 31u) >> (4u * (i >> 5))) & 15u;
    vec2 sm = unpackHalf2x16(ws[row * SS + g]);
    return sm.x * float(q) + sm.y;
}

// ---------------------------------------------------------------------------------------
#elif defined(FMT_Q4_K)
// wq: 8 uvec4 a super-block of 256 (GGUF's nibble order). ws: 4 uints a super-block:
// f16 d (low) and f16 dmin (high), then the 12 packed 6-bit scale/min bytes.
// A unit is one 32-byte chunk c: sub-block 2c in its low nibbles, 2c + 1 in its high ones.
uint k4_byte(uint sbase, uint i) { return (ws[sbase + 1u + (i >> 2)] >> (8u * (i & 3u))) & 0xffu; }
void k4_scale(uint sbase, uint j, out uint sc, out uint m) {
    if (j < 4u) {
        sc = k4_byte(sbase, j) & 63u;
        m = k4_byte(sbase, j + 4u) & 63u;
    } else {
        sc = (k4_byte(sbase, j + 4u) & 15u) | ((k4_byte(sbase, j - 4u) >> 6) << 4);
        m = (k4_byte(sbase, j + 4u) >> 4) | ((k4_byte(sbase, j) >> 6) << 4);
    }
}
#ifndef ACTS_F32
uint units_per_row() { return QS >> 1; }
float unit_dot(uint row, uint u, uint xr) {
    uint s = u >> 2, c = u & 3u;
    uint sbase = row * SS + 4u * s;
    uvec4 w0 = wq[row * QS + 8u * s + 2u * c], w1 = wq[row * QS + 8u * s + 2u * c + 1u];
    uint ba = XQ_BLK(xr) + 8u * s + 2u * c, bb = ba + 1u;
    int ia = dot16_us(w0 & 0x0f0f0f0fu, xq16(ba, 0u)) + dot16_us(w1 & 0x0f0f0f0fu, xq16(ba, 1u));
    int ib = dot16_us((w0 >> 4) & 0x0f0f0f0fu, xq16(bb, 0u)) + dot16_us((w1 >> 4) & 0x0f0f0f0fu, xq16(bb, 1u));
    uint sca, ma, scb, mb;
    k4_scale(sbase, 2u * c, sca, ma);
    k4_scale(sbase, 2u * c + 1u, scb, mb);
    vec2 dd = unpackHalf2x16(ws[sbase]);
    float a = xd[ba].x * float(int(sca) * ia) + xd[bb].x * float(int(scb) * ib);
    float mm = float(ma) * xd[ba].y + float(mb) * xd[bb].y;
    return dd.x * a - dd.y * mm;
}
float row_finish(uint row, float acc) { return acc; }
#endif
float dequant(uint row, uint k) {
    uint s = k >> 8, e = k & 255u, c = e >> 6, w = e & 63u, j = 2u * c + (w >> 5), l = w & 31u;
    uint sbase = row * SS + 4u * s;
    uint q = (wbyte(row * QS + 8u * s + 2u * c, l) >> (4u * (w >> 5))) & 15u;
    uint sc, m;
    k4_scale(sbase, j, sc, m);
    vec2 dd = unpackHalf2x16(ws[sbase]);
    return (dd.x * float(sc)) * float(q) - dd.y * float(m);
}

// ---------------------------------------------------------------------------------------
#elif defined(FMT_Q6_K)
// wq: 12 uvec4 a super-block: ql (8), then qh (4), GGUF's order. ws: 5 uints a super-block:
// the 16 signed scale bytes, then d as f32 bits. A unit is one 32-element block j of 8.
int k6_scale(uint sbase, uint i) { return sbyte(ws[sbase + (i >> 2)], i & 3u); }
#ifndef ACTS_F32
uint units_per_row() { return (QS / 12u) * 8u; }
float unit_dot(uint row, uint u, uint xr) {
    uint s = u >> 3, j = u & 7u, h = j >> 2, t = j & 3u;
    uint qb = row * QS + 12u * s;
    uint lsh = 4u * (t >> 1), hsh = 2u * t;
    uint li = qb + 4u * h + 2u * (t & 1u), hi = qb + 8u + 2u * h;
    uvec4 q0 = ((wq[li] >> lsh) & 0x0f0f0f0fu) | (((wq[hi] >> hsh) & 0x03030303u) << 4);
    uvec4 q1 = ((wq[li + 1u] >> lsh) & 0x0f0f0f0fu) | (((wq[hi + 1u] >> hsh) & 0x03030303u) << 4);
    uint blk = XQ_BLK(xr) + u;
    uvec4 x0 = xq16(blk, 0u), x1 = xq16(blk, 1u);
    uint sbase = row * SS + 5u * s;
    int i = k6_scale(sbase, 2u * j) * (dot16_us(q0, x0) - 32 * sum16_s(x0))
          + k6_scale(sbase, 2u * j + 1u) * (dot16_us(q1, x1) - 32 * sum16_s(x1));
    return uintBitsToFloat(ws[sbase + 4u]) * (xd[blk].x * float(i));
}
float row_finish(uint row, float acc) { return acc; }
#endif
float dequant(uint row, uint k) {
    uint s = k >> 8, p = k & 255u, h = p >> 7, e = p & 127u, l = e & 31u, t = e >> 5;
    uint qb = row * QS + 12u * s;
    uint ql = (wbyte(qb + 4u * h, (t & 1u) * 32u + l) >> (4u * (t >> 1))) & 15u;
    uint qh = (wbyte(qb + 8u + 2u * h, l) >> (2u * t)) & 3u;
    uint sbase = row * SS + 5u * s;
    return uintBitsToFloat(ws[sbase + 4u]) * float(k6_scale(sbase, p >> 4)) * float(int(ql | (qh << 4)) - 32);
}
// ---------------------------------------------------------------------------------------
#elif defined(FMT_Q5_0) || defined(FMT_Q5_1)
// wq: 1 uvec4 a block (the low four bits, nibbles as in Q4_0). ws: 2 uints a block: f16 d
// (low; Q5_1: f16 m high, Q5_0: zero), then qh, whose bit i is element i's fifth bit.
// q5_spread: bits 0..3 of x to bit 4 of bytes 0..3.
uint q5_spread(uint x) { return ((x & 1u) << 4) | ((x & 2u) << 11) | ((x & 4u) << 18) | ((x & 8u) << 25); }
uvec4 q5_high(uint qh) { return uvec4(q5_spread(qh), q5_spread(qh >> 4), q5_spread(qh >> 8), q5_spread(qh >> 12)); }
#ifndef ACTS_F32
uint units_per_row() { return QS; }
float unit_dot(uint row, uint u, uint xr) {
    uint blk = XQ_BLK(xr) + u;
    uvec4 w = wq[row * QS + u];
    uint qh = ws[row * SS + 2u * u + 1u];
    uvec4 x0 = xq16(blk, 0u), x1 = xq16(blk, 1u);
    int i = dot16_us((w & 0x0f0f0f0fu) | q5_high(qh), x0) + dot16_us(((w >> 4) & 0x0f0f0f0fu) | q5_high(qh >> 16), x1);
    vec2 dm = unpackHalf2x16(ws[row * SS + 2u * u]);
#ifdef FMT_Q5_0
    i -= 16 * (sum16_s(x0) + sum16_s(x1));
    return dm.x * xd[blk].x * float(i);
#else
    return dm.x * xd[blk].x * float(i) + dm.y * xd[blk].y;
#endif
}
float row_finish(uint row, float acc) { return acc; }
#endif
float dequant(uint row, uint k) {
    uint b = k >> 5, i = k & 31u;
    uint q = ((wbyte(row * QS + b, i & 15u) >> (4u * (i >> 4))) & 15u) | (((ws[row * SS + 2u * b + 1u] >> i) & 1u) << 4);
    vec2 dm = unpackHalf2x16(ws[row * SS + 2u * b]);
#ifdef FMT_Q5_0
    return dm.x * float(int(q) - 16);
#else
    return dm.x * float(q) + dm.y;
#endif
}

// ---------------------------------------------------------------------------------------
#elif defined(FMT_IQ4_NL) || defined(FMT_IQ4_XS)
// Nibbles index 16 fixed levels (format/iq4.rs). wq: 1 uvec4 per 32 elements, nibbles as in
// Q4_0. ws: IQ4_NL: f16 d, two to a uint; IQ4_XS: 2 uints a super-block of 256, f16 d (low)
// and the u16 high scale bits (high), then the 4 bytes of low scale bits.
// The levels -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113 as
// signed bytes, four to a uint; picked by selects (no array in private memory).
uint iq4_level(uint n) {
    n &= 15u;
    uint w = n < 8u ? (n < 4u ? 0xbfad9881u : 0xf6eaddcfu) : (n < 12u ? 0x26190d01u : 0x71594535u);
    return (w >> (8u * (n & 3u))) & 0xffu;
}
// Four bytes of nibble values (0..15) to four signed level bytes.
uint iq4_pack(uint n) {
    return iq4_level(n) | (iq4_level(n >> 8) << 8) | (iq4_level(n >> 16) << 16) | (iq4_level(n >> 24) << 24);
}
uvec4 iq4_levels(uvec4 n) { return uvec4(iq4_pack(n.x), iq4_pack(n.y), iq4_pack(n.z), iq4_pack(n.w)); }
#define NIB_LEVEL iq4_level
#include "nib_pairs.glsl"
#ifdef FMT_IQ4_XS
// Sub-block j's scale of the super-block whose scales start at sbase, -32..31.
int iq4xs_scale(uint sbase, uint j) {
    uint lo = (ws[sbase + 1u] >> (8u * (j >> 1) + 4u * (j & 1u))) & 15u;
    uint hi = (ws[sbase] >> (16u + 2u * j)) & 3u;
    return int(lo | (hi << 4)) - 32;
}
#endif
#ifndef ACTS_F32
uint units_per_row() { return QS; }
float unit_dot(uint row, uint u, uint xr) {
    uint blk = XQ_BLK(xr) + u;
    uvec4 lo, hi;
    nib_levels(wq[row * QS + u], lo, hi);
    int i = dot16_ss(lo, xq16(blk, 0u)) + dot16_ss(hi, xq16(blk, 1u));
#ifdef FMT_IQ4_NL
    return f16_at(row * SS, u) * xd[blk].x * float(i);
#else
    uint sbase = row * SS + 2u * (u >> 3);
    return unpackHalf2x16(ws[sbase]).x * (xd[blk].x * float(iq4xs_scale(sbase, u & 7u) * i));
#endif
}
float row_finish(uint row, float acc) { return acc; }
#endif
float dequant(uint row, uint k) {
    uint b = k >> 5, i = k & 31u;
    float q = float(int(iq4_level(wbyte(row * QS + b, i & 15u) >> (4u * (i >> 4)))) << 24 >> 24);
#ifdef FMT_IQ4_NL
    return f16_at(row * SS, b) * q;
#else
    uint sbase = row * SS + 2u * (k >> 8);
    return (unpackHalf2x16(ws[sbase]).x * float(iq4xs_scale(sbase, b & 7u))) * q;
#endif
}

// ---------------------------------------------------------------------------------------
#elif defined(FMT_MXFP4)
// Nibbles index the 16 E2M1 values doubled (format/mxfp4.rs). wq: 1 uvec4 per 32 elements,
// nibbles as in Q4_0. ws: the block's half scale 2^(e - 128) as f32 bits (decoded at upload).
// The levels 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 as signed bytes, four to
// a uint; picked by selects (no array in private memory).
uint mx_level(uint n) {
    n &= 15u;
    uint w = n < 8u ? (n < 4u ? 0x03020100u : 0x0c080604u) : (n < 12u ? 0xfdfeff00u : 0xf4f8fafcu);
    return (w >> (8u * (n & 3u))) & 0xffu;
}
uint mx_pack(uint n) {
    return mx_level(n) | (mx_level(n >> 8) << 8) | (mx_level(n >> 16) << 16) | (mx_level(n >> 24) << 24);
}
uvec4 mx_levels(uvec4 n) { return uvec4(mx_pack(n.x), mx_pack(n.y), mx_pack(n.z), mx_pack(n.w)); }
#define NIB_LEVEL mx_level
#include "nib_pairs.glsl"
#ifndef ACTS_F32
uint units_per_row() { return QS; }
float unit_dot(uint row, uint u, uint xr) {
    uint blk = XQ_BLK(xr) + u;
    uvec4 lo, hi;
    nib_levels(wq[row * QS + u], lo, hi);
    int i = dot16_ss(lo, xq16(blk, 0u)) + dot16_ss(hi, xq16(blk, 1u));
    return uintBitsToFloat(ws[row * SS + u]) * xd[blk].x * float(i);
}
float row_finish(uint row, float acc) { return acc; }
#endif
float dequant(uint row, uint k) {
    uint b = k >> 5, i = k & 31u;
    float q = float(int(mx_level(wbyte(row * QS + b, i & 15u) >> (4u * (i >> 4)))) << 24 >> 24);
    return uintBitsToFloat(ws[row * SS + b]) * q;
}

// ---------------------------------------------------------------------------------------
#elif defined(FMT_FP8_E4M3)
// E4M3 codes under an f32 scale per 128 elements (format/fp8.rs); always with ACTS_F32 (the
// codes are floats: f32 activations, as on the CPU). wq: 8 uvec4 a block, the 128 codes in
// order. ws: one uint a block, the scale's f32 bits. NaN codes (0x7f, 0xff) never reach the
// device: the loader refuses them (first_non_finite).
float e4m3(uint c) {
    uint e = (c >> 3) & 15u, m = c & 7u;
    float v = e == 0u ? float(m) * (1.0 / 512.0) : uintBitsToFloat(((e + 120u) << 23) | (m << 20));
    return (c & 128u) != 0u ? -v : v;
}
float dequant(uint row, uint k) {
    return uintBitsToFloat(ws[row * SS + (k >> 7)]) * e4m3(wbyte(row * QS, k));
}

// ---------------------------------------------------------------------------------------
#elif defined(FMT_Q5_K)
// wq: 10 uvec4 a super-block: the 128 bytes of nibbles (Q4_K's order), then the 32 bytes qh
// (bit j of byte l: the fifth bit of element 32j + l). ws: 4 uints as Q4_K's. A unit is one
// 32-byte chunk c of nibbles: sub-blocks 2c and 2c + 1.
uint k5_byte(uint sbase, uint i) { return (ws[sbase + 1u + (i >> 2)] >> (8u * (i & 3u))) & 0xffu; }
void k5_scale(uint sbase, uint j, out uint sc, out uint m) {
    if (j < 4u) {
        sc = k5_byte(sbase, j) & 63u;
        m = k5_byte(sbase, j + 4u) & 63u;
    } else {
        sc = (k5_byte(sbase, j + 4u) & 15u) | ((k5_byte(sbase, j - 4u) >> 6) << 4);
        m = (k5_byte(sbase, j + 4u) >> 4) | ((k5_byte(sbase, j) >> 6) << 4);
    }
}
#ifndef ACTS_F32
uint units_per_row() { return (QS / 10u) * 4u; }
float unit_dot(uint row, uint u, uint xr) {
    uint s = u >> 2, c = u & 3u;
    uint sbase = row * SS + 4u * s, qb = row * QS + 10u * s;
    uvec4 w0 = wq[qb + 2u * c], w1 = wq[qb + 2u * c + 1u];
    uvec4 h0 = wq[qb + 8u], h1 = wq[qb + 9u];
    uint ba = XQ_BLK(xr) + 8u * s + 2u * c, bb = ba + 1u;
    uint ja = 2u * c, jb = ja + 1u;
    uvec4 qa0 = (w0 & 0x0f0f0f0fu) | (((h0 >> ja) & 0x01010101u) << 4);
    uvec4 qa1 = (w1 & 0x0f0f0f0fu) | (((h1 >> ja) & 0x01010101u) << 4);
    uvec4 qb0 = ((w0 >> 4) & 0x0f0f0f0fu) | (((h0 >> jb) & 0x01010101u) << 4);
    uvec4 qb1 = ((w1 >> 4) & 0x0f0f0f0fu) | (((h1 >> jb) & 0x01010101u) << 4);
    int ia = dot16_us(qa0, xq16(ba, 0u)) + dot16_us(qa1, xq16(ba, 1u));
    int ib = dot16_us(qb0, xq16(bb, 0u)) + dot16_us(qb1, xq16(bb, 1u));
    uint sca, ma, scb, mb;
    k5_scale(sbase, ja, sca, ma);
    k5_scale(sbase, jb, scb, mb);
    vec2 dd = unpackHalf2x16(ws[sbase]);
    float a = xd[ba].x * float(int(sca) * ia) + xd[bb].x * float(int(scb) * ib);
    float mm = float(ma) * xd[ba].y + float(mb) * xd[bb].y;
    return dd.x * a - dd.y * mm;
}
float row_finish(uint row, float acc) { return acc; }
#endif
float dequant(uint row, uint k) {
    uint s = k >> 8, e = k & 255u, c = e >> 6, w = e & 63u, j = 2u * c + (w >> 5), l = w & 31u;
    uint sbase = row * SS + 4u * s, qb = row * QS + 10u * s;
    uint q = ((wbyte(qb + 2u * c, l) >> (4u * (w >> 5))) & 15u) | (((wbyte(qb + 8u, l) >> j) & 1u) << 4);
    uint sc, m;
    k5_scale(sbase, j, sc, m);
    vec2 dd = unpackHalf2x16(ws[sbase]);
    return (dd.x * float(sc)) * float(q) - dd.y * float(m);
}

// ---------------------------------------------------------------------------------------
#elif defined(FMT_Q2_K)
// wq: 4 uvec4 a super-block, the 64 bytes qs (GGUF's order). ws: 5 uints a super-block: the
// 16 scale bytes (low nibble scale, high nibble min, one per 16 elements), then f16 d (low)
// and f16 dmin (high). A unit is one 32-element block j of 8.
uint k2_byte(uint sbase, uint i) { return (ws[sbase + (i >> 2)] >> (8u * (i & 3u))) & 0xffu; }
#ifndef ACTS_F32
uint units_per_row() { return QS * 2u; }
float unit_dot(uint row, uint u, uint xr) {
    uint s = u >> 3, j = u & 7u, h = j >> 2, sh = 2u * (j & 3u);
    uint qb = row * QS + 4u * s + 2u * h, sbase = row * SS + 5u * s;
    uvec4 q0 = (wq[qb] >> sh) & 0x03030303u, q1 = (wq[qb + 1u] >> sh) & 0x03030303u;
    uint blk = XQ_BLK(xr) + u;
    uvec4 x0 = xq16(blk, 0u), x1 = xq16(blk, 1u);
    uint s0 = k2_byte(sbase, 2u * j), s1 = k2_byte(sbase, 2u * j + 1u);
    int i = int(s0 & 15u) * dot16_us(q0, x0) + int(s1 & 15u) * dot16_us(q1, x1);
    int mi = int(s0 >> 4) * sum16_s(x0) + int(s1 >> 4) * sum16_s(x1);
    vec2 dd = unpackHalf2x16(ws[sbase + 4u]);
    return dd.x * (xd[blk].x * float(i)) - dd.y * (xd[blk].x * float(mi));
}
float row_finish(uint row, float acc) { return acc; }
#endif
float dequant(uint row, uint k) {
    uint s = k >> 8, p = k & 255u, h = p >> 7, e = p & 127u, l = e & 31u;
    uint sbase = row * SS + 5u * s;
    uint q = (wbyte(row * QS + 4u * s + 2u * h, l) >> (2u * (e >> 5))) & 3u;
    uint sm = k2_byte(sbase, p >> 4);
    vec2 dd = unpackHalf2x16(ws[sbase + 4u]);
    return (dd.x * float(sm & 15u)) * float(q) - dd.y * float(sm >> 4);
}

// ---------------------------------------------------------------------------------------
#elif defined(FMT_Q3_K)
// wq: 6 uvec4 a super-block: the 64 bytes qs (low two bits, as Q2_K's), then the 32 bytes
// hmask (bit j of byte l: the third bit of element 32j + l). ws: 4 uints a super-block: the
// 12 packed scale bytes, then f16 d (low). A unit is one 32-element block j of 8.
uint k3_byte(uint sbase, uint i) { return (ws[sbase + (i >> 2)] >> (8u * (i & 3u))) & 0xffu; }
// Scale k (one per 16 elements), -32..31.
int k3_scale(uint sbase, uint k) {
    uint lo = k < 8u ? k3_byte(sbase, k) & 15u : k3_byte(sbase, k - 8u) >> 4;
    uint hi = (k3_byte(sbase, 8u + (k & 3u)) >> (2u * (k >> 2))) & 3u;
    return int(lo | (hi << 4)) - 32;
}
#ifndef ACTS_F32
uint units_per_row() { return (QS / 6u) * 8u; }
float unit_dot(uint row, uint u, uint xr) {
    uint s = u >> 3, j = u & 7u, h = j >> 2, sh = 2u * (j & 3u);
    uint qb = row * QS + 6u * s, sbase = row * SS + 4u * s;
    uvec4 q0 = ((wq[qb + 2u * h] >> sh) & 0x03030303u) | (((wq[qb + 4u] >> j) & 0x01010101u) << 2);
    uvec4 q1 = ((wq[qb + 2u * h + 1u] >> sh) & 0x03030303u) | (((wq[qb + 5u] >> j) & 0x01010101u) << 2);
    uint blk = XQ_BLK(xr) + u;
    uvec4 x0 = xq16(blk, 0u), x1 = xq16(blk, 1u);
    int i = k3_scale(sbase, 2u * j) * (dot16_us(q0, x0) - 4 * sum16_s(x0))
          + k3_scale(sbase, 2u * j + 1u) * (dot16_us(q1, x1) - 4 * sum16_s(x1));
    return unpackHalf2x16(ws[sbase + 3u]).x * (xd[blk].x * float(i));
}
float row_finish(uint row, float acc) { return acc; }
#endif
float dequant(uint row, uint k) {
    uint s = k >> 8, p = k & 255u, h = p >> 7, e = p & 127u, l = e & 31u;
    uint qb = row * QS + 6u * s, sbase = row * SS + 4u * s;
    uint lo = (wbyte(qb + 2u * h, l) >> (2u * (e >> 5))) & 3u;
    uint hb = (wbyte(qb + 4u, l) >> (p >> 5)) & 1u;
    return unpackHalf2x16(ws[sbase + 3u]).x * float(k3_scale(sbase, p >> 4)) * float(int(lo | (hb << 2)) - 4);
}
// ---------------------------------------------------------------------------------------
#elif defined(FMT_IQ2_XXS) || defined(FMT_IQ2_XS) || defined(FMT_IQ2_S) || defined(FMT_IQ3_XXS) || defined(FMT_IQ3_S) \
    || defined(FMT_IQ1_S) || defined(FMT_IQ1_M)
// Groups of magnitudes picked from fixed lattices, then signed (IQ1_*: values in -1, 0, 1,
// shifted by +-1/8; format/iq_grid.rs): their layouts and decode in iq_grid.glsl.
#include "iq_grid.glsl"
#else
#error "no weight format defined"
#endif

// wformat_init(): the including shader calls it first in main (uniform control flow, every
// invocation): the grid formats fill their lattice into shared memory there, the 16-level
// formats their table of nibble pairs (nib_pairs.glsl); nothing else.
#ifndef WFORMAT_INIT
void wformat_init() {}
#endif

#if defined(ACTS_F32) && !defined(FLOAT_FORMAT)
uint units_per_row() { return COLS >> 5; }
float unit_dot(uint row, uint u, uint xr) {
    float s = 0.0;
    for (uint i = 0u; i < 32u; i++) s += dequant(row, 32u * u + i) * xat(xr, 32u * u + i);
    return s;
}
float row_finish(uint row, float acc) { return acc; }
#endif
