#version 450
// moe_matmul_coop.comp: moe_matmul.comp for every weight format with q8 activations on int8
// cooperative matrices (coop_q8.glsl: shapes, tiles, the per-block scaling; coop_w.glsl: a
// weight block as codes and factors, as in matmul_coop.comp). Workgroup z is expert e, y a
// tile of BN of its pairs (moe_group.comp's list: offsets[0..E] then pair ids p = r*K + k),
// x a tile of BO output rows.
// Mode 0 (gate and up): rows e*2F + o and e*2F + F + o against x[r] (two weight tiles, two
//   accumulators), h[p][o] = glu(scale * gate + bg, scale * up + bu).
// Mode 1 (down): rows e*H + o against h[p]; y[p][o] = scale * down + bd (moe_sum.comp adds
//   the ranks in order). Tiles past an expert's pairs exit at once (the whole workgroup).
// Must not: run on a format without q8 activations or without a coop_w.glsl decoding (rows a
// multiple of 32).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "coop_q8.glsl"

layout(std430, binding = 0) readonly buffer WQ { uvec4 wq[]; };
layout(std430, binding = 1) readonly buffer WS { uint ws[]; };
layout(std430, binding = 3) readonly buffer XQ { uvec4 xq[]; };
layout(std430, binding = 4) readonly buffer XD { vec2 xd[]; };
layout(std430, binding = 5) writeonly buffer OUT { float outv[]; };
layout(std430, binding = 6) readonly buffer GR { uint groups[]; };
layout(std430, binding = 7) readonly buffer BS { float bias[]; };

layout(push_constant) uniform PC {
    uint rows; uint cols; uint qs; uint ss;
    uint x_off; uint out_off; uint top_k; uint experts;
    uint mode; uint glu; float limit; float alpha;
    uint bias_off; uint pad0; uint pad1; uint pad2;
} pc;

#define NONE 0xffffffffu
#include "moe.glsl"
#define QS pc.qs
#define SS pc.ss
#define COLS pc.cols
#define XQ_BLK(xr) ((xr) * (pc.cols >> 5))
#include "wformat.glsl"
#include "coop_w.glsl"
#include "coop_stage.glsl"

shared i8vec4 wg_t[BO * RS];
shared i8vec4 wu_t[BO * RS];
shared uint pair_t[BN];
// The blocks' weight factors of the gate (or down) and up rows ([block][half][row]) and
// offsets ([block][row]).
shared float wdg_t[BLKS * SUBS * BO];
shared float wdu_t[BLKS * SUBS * BO];
#ifdef HAS_MIN
shared float wmg_t[BLKS * BO];
shared float wmu_t[BLKS * BO];
#endif

void put_g(uint o, uint u, uvec4 v) {
    uint b = o * RS + 4u * u;
    wg_t[b] = unpack8(int(v.x)); wg_t[b + 1u] = unpack8(int(v.y)); wg_t[b + 2u] = unpack8(int(v.z)); wg_t[b + 3u] = unpack8(int(v.w));
}

void put_u(uint o, uint u, uvec4 v) {
    uint b = o * RS + 4u * u;
    wu_t[b] = unpack8(int(v.x)); wu_t[b + 1u] = unpack8(int(v.y)); wu_t[b + 2u] = unpack8(int(v.z)); wu_t[b + 3u] = unpack8(int(v.w));
}

void main() {
    wformat_init();
    uint e = gl_WorkGroupID.z;
    uint start = groups[e], count = groups[e + 1u] - start;
    uint r0 = gl_WorkGroupID.y * BN;
    if (r0 >= count) return;
    uint tid = gl_LocalInvocationID.x;
    bool gate_up = pc.mode == 0u;
    uint f = pc.rows;
    // Weight row of output o: the gate (or down) row; the up row is f further.
    uint wbase = gate_up ? e * 2u * f : e * f;
    uint o0 = gl_WorkGroupID.x * BO;
    uint sg = gl_SubgroupID;
    uint so = (sg & 1u) * 32u, sn = (sg >> 1u) * 32u;
    uint nblk = pc.cols >> 5, xunits = pc.cols >> 4;
    for (uint i = tid; i < BN; i += NT) pair_t[i] = r0 + i < count ? groups[pc.experts + 1u + start + r0 + i] : 0u;
    fill_codes(tid);
    barrier();
    MAT_F code;
    coopMatLoad(code, code_t, 0, CM_N, gl_CooperativeMatrixLayoutRowMajor);
    MAT_F accg[TM * TN], accu[TM * TN];
    [[unroll]] for (uint t = 0u; t < TM * TN; t++) { accg[t] = MAT_F(0.0); accu[t] = MAT_F(0.0); }
    for (uint k0 = 0u; k0 < nblk; k0 += BLKS) {
        for (uint q = tid; q < BO * 8u; q += NT) {
            uint o = q >> 3, u = q & 7u, blk = k0 + (u >> 1);
            bool in_ = o0 + o < f && blk < nblk;
            put_g(o, u, in_ ? coop_codes(wbase + o0 + o, blk, u & 1u) : uvec4(0u));
            if (gate_up) put_u(o, u, in_ ? coop_codes(wbase + f + o0 + o, blk, u & 1u) : uvec4(0u));
        }
        for (uint q = tid; q < BLKS * BO; q += NT) {
            uint b = q / BO, o = q % BO;
            bool in_ = o0 + o < f && k0 + b < nblk;
            [[unroll]] for (uint h = 0u; h < SUBS; h++) {
                uint wi = (b * SUBS + h) * BO + o;
                wdg_t[wi] = in_ ? coop_wd(wbase + o0 + o, k0 + b, h) : 0.0;
                if (gate_up) wdu_t[wi] = in_ ? coop_wd(wbase + f + o0 + o, k0 + b, h) : 0.0;
            }
#ifdef HAS_MIN
            wmg_t[q] = in_ ? coop_wm(wbase + o0 + o, k0 + b) : 0.0;
            if (gate_up) wmu_t[q] = in_ ? coop_wm(wbase + f + o0 + o, k0 + b) : 0.0;
#endif
        }
        for (uint q = tid; q < BN * 8u; q += NT) {
            uint r = q >> 3, u = q & 7u, unit = 2u * k0 + u;
            uint p = pair_t[r];
            uint xr = gate_up ? p / pc.top_k : p;
            stage_x(r, u, (r0 + r < count && unit < xunits) ? xq[xr * xunits + unit] : uvec4(0u));
        }
        for (uint q = tid; q < BLKS * BN; q += NT) {
            uint b = q / BN, r = q % BN;
            uint p = pair_t[r];
            uint xr = gate_up ? p / pc.top_k : p;
            vec2 d = (r0 + r < count && k0 + b < nblk) ? xd[xr * nblk + k0 + b] : vec2(0.0);
            xd_t[q] = d.x;
#ifdef HAS_MIN
            xsum_t[q] = d.y;
#endif
        }
        barrier();
        for (uint b = 0u; b < BLKS && k0 + b < nblk; b++) {
            MAT_I cg[TM * TN], cu[TM * TN];
#ifdef HALVES
            MAT_I hg[TM * TN], hu[TM * TN];
#endif
            [[unroll]] for (uint t = 0u; t < TM * TN; t++) {
                cg[t] = MAT_I(0);
                cu[t] = MAT_I(0);
#ifdef HALVES
                hg[t] = MAT_I(0);
                hu[t] = MAT_I(0);
#endif
            }
            for (uint ks = 0u; ks < KS; ks++) {
                uint kw = 8u * b + ks * (CM_K / 4u);
                MAT_B x[TN];
#ifdef HALVES
                MAT_B xh[TN];
                [[unroll]] for (uint j = 0u; j < TN; j++) coopMatLoad(xh[j], xh_t, (sn + j * CM_N) * RS + kw, RS, gl_CooperativeMatrixLayoutColumnMajor);
#endif
                [[unroll]] for (uint j = 0u; j < TN; j++) coopMatLoad(x[j], xs_t, (sn + j * CM_N) * RS + kw, RS, gl_CooperativeMatrixLayoutColumnMajor);
                [[unroll]] for (uint i = 0u; i < TM; i++) {
                    MAT_A a;
                    coopMatLoad(a, wg_t, (so + i * CM_M) * RS + kw, RS, gl_CooperativeMatrixLayoutRowMajor);
                    [[unroll]] for (uint j = 0u; j < TN; j++) cg[i * TN + j] = coopMatMulAdd(a, x[j], cg[i * TN + j]);
#ifdef HALVES
                    [[unroll]] for (uint j = 0u; j < TN; j++) hg[i * TN + j] = coopMatMulAdd(a, xh[j], hg[i * TN + j]);
#endif
                    if (gate_up) {
                        coopMatLoad(a, wu_t, (so + i * CM_M) * RS + kw, RS, gl_CooperativeMatrixLayoutRowMajor);
                        [[unroll]] for (uint j = 0u; j < TN; j++) cu[i * TN + j] = coopMatMulAdd(a, x[j], cu[i * TN + j]);
#ifdef HALVES
                        [[unroll]] for (uint j = 0u; j < TN; j++) hu[i * TN + j] = coopMatMulAdd(a, xh[j], hu[i * TN + j]);
#endif
                    }
                }
            }
            // Block b's factors as matrices: the activation rows' down the columns, the weight
            // rows' (gate or down, and up) along the rows.
            MAT_F xdm[TN], xsm[TN];
            [[unroll]] for (uint j = 0u; j < TN; j++) {
                COL_FACTORS(xdm[j], xd_t, b * BN + sn + j * CM_N);
#ifdef HAS_MIN
                COL_FACTORS(xsm[j], xsum_t, b * BN + sn + j * CM_N);
#endif
            }
            [[unroll]] for (uint i = 0u; i < TM; i++) {
                uint wrow = so + i * CM_M;
                MAT_F gd, gh, gm, ud, uh, um;
#ifndef FMT_I8ROW
                ROW_FACTORS(gd, wdg_t, b * SUBS * BO + wrow);
                if (gate_up) ROW_FACTORS(ud, wdu_t, b * SUBS * BO + wrow);
#endif
#ifdef HALVES
                ROW_FACTORS(gh, wdg_t, (b * SUBS + 1u) * BO + wrow);
                if (gate_up) ROW_FACTORS(uh, wdu_t, (b * SUBS + 1u) * BO + wrow);
#endif
#ifdef HAS_MIN
                ROW_FACTORS(gm, wmg_t, b * BO + wrow);
                if (gate_up) ROW_FACTORS(um, wmu_t, b * BO + wrow);
#endif
                [[unroll]] for (uint j = 0u; j < TN; j++) {
                    uint t = i * TN + j;
#ifdef HALVES
                    accg[t] += block_scaled(cg[t], hg[t], xdm[j], xsm[j], gd, gh, gm);
                    if (gate_up) accu[t] += block_scaled(cu[t], hu[t], xdm[j], xsm[j], ud, uh, um);
#else
                    accg[t] += block_scaled(cg[t], cg[t], xdm[j], xsm[j], gd, gh, gm);
                    if (gate_up) accu[t] += block_scaled(cu[t], cu[t], xdm[j], xsm[j], ud, uh, um);
#endif
                }
            }
        }
        barrier();
    }
    [[unroll]] for (uint i = 0u; i < TM; i++) {
        [[unroll]] for (uint j = 0u; j < TN; j++) {
            uint t = i * TN + j;
            for (int c = 0; c < code.length(); c++) {
                uint o = o0 + so + i * CM_M + code_row(code[c]);
                uint r = sn + j * CM_N + code_col(code[c]);
                if (o >= f || r0 + r >= count) continue;
                uint p = pair_t[r];
                float g = coop_row_scale(wbase + o) * accg[t][c];
                if (gate_up) {
                    float u = coop_row_scale(wbase + f + o) * accu[t][c];
                    if (pc.bias_off != NONE) {
                        g += bias[pc.bias_off + wbase + o];
                        u += bias[pc.bias_off + wbase + f + o];
                    }
                    outv[pc.out_off + p * f + o] = moe_glu(pc.glu, g, u, pc.limit, pc.alpha);
                } else {
                    if (pc.bias_off != NONE) g += bias[pc.bias_off + wbase + o];
                    outv[pc.out_off + p * f + o] = g;
                }
            }
        }
    }
}
