#version 450
// matmul_coop.comp: the tiled GEMM of matmul.comp for every weight format with q8 activations
// on int8 cooperative matrices (coop_q8.glsl: shapes, tiles, the per-block scaling; coop_w.glsl:
// a weight block as int8 codes and its factors). out[r][o] = (residual[r][o] +)
// row_scale[o] * sum_b (d[r][b] * wd[o][b] * (W[o] . q[r]) + wm[o][b] * s[r][b]) over blocks b
// (the halves of a block apart where the format's scales are per 16 elements). Input
// transforms (norm, gated unit) are applied by the quantization before (quantize_rows.comp);
// the residual add is fused into the store. Workgroup (x, y): BO weight rows from x * BO, BN
// activation rows from y * BN.
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
layout(std430, binding = 7) readonly buffer RES { float resv[]; };

layout(push_constant) uniform PC {
    uint rows; uint cols; uint qs; uint ss;
    uint x_off; uint out_off; uint out_stride; uint n;
    uint in_mode; uint aux_off; float p0; float p1;
    uint res_on; uint res_off; uint pad0; uint pad1;
} pc;

#define QS pc.qs
#define SS pc.ss
#define COLS pc.cols
#define XQ_BLK(xr) ((xr) * (pc.cols >> 5))
#include "wformat.glsl"
#include "coop_w.glsl"
#include "coop_stage.glsl"

shared i8vec4 ws_t[BO * RS];
// The blocks' weight factors ([block][half][row]) and offsets ([block][row]).
shared float wd_t[BLKS * SUBS * BO];
#ifdef HAS_MIN
shared float wm_t[BLKS * BO];
#endif

void put_w(uint o, uint u, uvec4 v) {
    uint b = o * RS + 4u * u;
    ws_t[b] = unpack8(int(v.x)); ws_t[b + 1u] = unpack8(int(v.y)); ws_t[b + 2u] = unpack8(int(v.z)); ws_t[b + 3u] = unpack8(int(v.w));
}

// The next stage's operands, loaded into registers while the current stage computes (so the
// global loads' latency overlaps the products): up to PU units of each kind an invocation
// (the workgroup has at least 64 invocations). Activation rows share the weight rows' indices:
// BN == BO.
#define PU 8u
uvec4 pw[PU], px[PU];
float pd[PU][SUBS], pm[PU];
vec2 pxd[PU];

void fetch(uint k0, uint tid, uint o0, uint r0, uint nblk, uint xunits) {
    [[unroll]] for (uint i = 0u; i < PU; i++) {
        uint e = tid + i * NT;
        if (e < BO * 8u) {
            uint o = e >> 3, u = e & 7u, blk = k0 + (u >> 1);
            pw[i] = (o0 + o < pc.rows && blk < nblk) ? coop_codes(o0 + o, blk, u & 1u) : uvec4(0u);
            uint unit = 2u * k0 + u;
            px[i] = (r0 + o < pc.n && unit < xunits) ? xq[(r0 + o) * xunits + unit] : uvec4(0u);
        }
        if (e < BLKS * BO) {
            uint b = e / BO, o = e % BO;
            bool in_ = o0 + o < pc.rows && k0 + b < nblk;
            [[unroll]] for (uint h = 0u; h < SUBS; h++) pd[i][h] = in_ ? coop_wd(o0 + o, k0 + b, h) : 0.0;
#ifdef HAS_MIN
            pm[i] = in_ ? coop_wm(o0 + o, k0 + b) : 0.0;
#endif
            uint r = e % BN;
            pxd[i] = (r0 + r < pc.n && k0 + b < nblk) ? xd[(r0 + r) * nblk + k0 + b] : vec2(0.0);
        }
    }
}

void store(uint tid) {
    [[unroll]] for (uint i = 0u; i < PU; i++) {
        uint e = tid + i * NT;
        if (e < BO * 8u) {
            put_w(e >> 3, e & 7u, pw[i]);
            stage_x(e >> 3, e & 7u, px[i]);
        }
        if (e < BLKS * BO) {
            uint b = e / BO, o = e % BO;
            [[unroll]] for (uint h = 0u; h < SUBS; h++) wd_t[(b * SUBS + h) * BO + o] = pd[i][h];
#ifdef HAS_MIN
            wm_t[e] = pm[i];
            xsum_t[e] = pxd[i].y;
#endif
            xd_t[e] = pxd[i].x;
        }
    }
}

void main() {
    wformat_init();
    uint tid = gl_LocalInvocationID.x;
    uint o0 = gl_WorkGroupID.x * BO, r0 = gl_WorkGroupID.y * BN;
    uint sg = gl_SubgroupID;
    uint so = (sg & 1u) * 32u, sn = (sg >> 1u) * 32u;
    uint nblk = pc.cols >> 5, xunits = pc.cols >> 4;
    fill_codes(tid);
    barrier();
    MAT_F code;
    coopMatLoad(code, code_t, 0, CM_N, gl_CooperativeMatrixLayoutRowMajor);
    MAT_F acc[TM * TN];
    [[unroll]] for (uint t = 0u; t < TM * TN; t++) acc[t] = MAT_F(0.0);
    fetch(0u, tid, o0, r0, nblk, xunits);
    for (uint k0 = 0u; k0 < nblk; k0 += BLKS) {
        store(tid);
        barrier();
        if (k0 + BLKS < nblk) fetch(k0 + BLKS, tid, o0, r0, nblk, xunits);
        for (uint b = 0u; b < BLKS && k0 + b < nblk; b++) {
            MAT_I ci[TM * TN];
#ifdef HALVES
            MAT_I ch[TM * TN];
#endif
            [[unroll]] for (uint t = 0u; t < TM * TN; t++) {
                ci[t] = MAT_I(0);
#ifdef HALVES
                ch[t] = MAT_I(0);
#endif
            }
            for (uint ks = 0u; ks < KS; ks++) {
                uint kw = 8u * b + ks * (CM_K / 4u);
                MAT_A a[TM];
                MAT_B x[TN];
                [[unroll]] for (uint i = 0u; i < TM; i++) coopMatLoad(a[i], ws_t, (so + i * CM_M) * RS + kw, RS, gl_CooperativeMatrixLayoutRowMajor);
                [[unroll]] for (uint j = 0u; j < TN; j++) coopMatLoad(x[j], xs_t, (sn + j * CM_N) * RS + kw, RS, gl_CooperativeMatrixLayoutColumnMajor);
                [[unroll]] for (uint i = 0u; i < TM; i++)
                    [[unroll]] for (uint j = 0u; j < TN; j++) ci[i * TN + j] = coopMatMulAdd(a[i], x[j], ci[i * TN + j]);
#ifdef HALVES
                [[unroll]] for (uint j = 0u; j < TN; j++) coopMatLoad(x[j], xh_t, (sn + j * CM_N) * RS + kw, RS, gl_CooperativeMatrixLayoutColumnMajor);
                [[unroll]] for (uint i = 0u; i < TM; i++)
                    [[unroll]] for (uint j = 0u; j < TN; j++) ch[i * TN + j] = coopMatMulAdd(a[i], x[j], ch[i * TN + j]);
#endif
            }
            // Block b's factors as matrices: the activation rows' down the columns, the weight
            // rows' along the rows.
            MAT_F xdm[TN], xsm[TN];
            [[unroll]] for (uint j = 0u; j < TN; j++) {
                COL_FACTORS(xdm[j], xd_t, b * BN + sn + j * CM_N);
#ifdef HAS_MIN
                COL_FACTORS(xsm[j], xsum_t, b * BN + sn + j * CM_N);
#endif
            }
            [[unroll]] for (uint i = 0u; i < TM; i++) {
                uint wrow = so + i * CM_M;
                MAT_F wd, wh, wm;
#ifndef FMT_I8ROW
                ROW_FACTORS(wd, wd_t, b * SUBS * BO + wrow);
#endif
#ifdef HALVES
                ROW_FACTORS(wh, wd_t, (b * SUBS + 1u) * BO + wrow);
#endif
#ifdef HAS_MIN
                ROW_FACTORS(wm, wm_t, b * BO + wrow);
#endif
                [[unroll]] for (uint j = 0u; j < TN; j++) {
                    uint t = i * TN + j;
#ifdef HALVES
                    acc[t] += block_scaled(ci[t], ch[t], xdm[j], xsm[j], wd, wh, wm);
#else
                    acc[t] += block_scaled(ci[t], ci[t], xdm[j], xsm[j], wd, wh, wm);
#endif
                }
            }
        }
        barrier();
    }
    [[unroll]] for (uint i = 0u; i < TM; i++) {
        [[unroll]] for (uint j = 0u; j < TN; j++) {
            for (int c = 0; c < code.length(); c++) {
                uint o = o0 + so + i * CM_M + code_row(code[c]);
                uint r = r0 + sn + j * CM_N + code_col(code[c]);
                if (o < pc.rows && r < pc.n) {
                    float v = coop_row_scale(o) * acc[i * TN + j][c];
                    uint at = r * pc.out_stride + o;
                    outv[pc.out_off + at] = pc.res_on != 0u ? resv[pc.res_off + at] + v : v;
                }
            }
        }
    }
}
