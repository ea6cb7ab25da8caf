#version 450
// matmul_coop.comp: the tiled GEMM of matmul.comp for I8Row weights and q8 activations on
// cooperative matrices (coop_q8.glsl: shapes, tiles, the per-block scaling). out[r][o] =
// (residual[r][o] +) scale[o] * sum_b d[r][b] * (W[o] . q[r]) over block b. Input transforms
// (norm, gated unit) are applied by the quantization before (quantize_rows.comp); the residual
// add is fused into the store (fuse_in.glsl's res_on). Workgroup (x, y): BO weight rows from
// x * BO, BN activation rows from y * BN.
// Must not: run on a format other than I8Row with q8 activations (rows a multiple of 32).
#extension GL_GOOGLE_include_directive : require
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

shared i8vec4 ws_t[BO * RS];

void put_w(uint o, uint u, uvec4 v) {
    uint b = o * RS + 4u * u;
    ws_t[b] = unpack8(int(v.x)); ws_t[b + 1u] = unpack8(int(v.y)); ws_t[b + 2u] = unpack8(int(v.z)); ws_t[b + 3u] = unpack8(int(v.w));
}

void main() {
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
    for (uint k0 = 0u; k0 < nblk; k0 += BLKS) {
        // 16 bytes an invocation at a time: BK / 16 = 8 units a row.
        for (uint e = tid; e < BO * 8u; e += NT) {
            uint o = e >> 3, u = e & 7u, unit = 2u * k0 + u;
            put_w(o, u, (o0 + o < pc.rows && unit < pc.qs) ? wq[(o0 + o) * pc.qs + unit] : uvec4(0u));
        }
        for (uint e = tid; e < BN * 8u; e += NT) {
            uint r = e >> 3, u = e & 7u, unit = 2u * k0 + u;
            put_x(r, u, (r0 + r < pc.n && unit < xunits) ? xq[(r0 + r) * xunits + unit] : uvec4(0u));
        }
        for (uint e = tid; e < BLKS * BN; e += NT) {
            uint b = e / BN, r = e % BN;
            xd_t[e] = (r0 + r < pc.n && k0 + b < nblk) ? xd[(r0 + r) * nblk + k0 + b].x : 0.0;
        }
        barrier();
        for (uint b = 0u; b < BLKS && k0 + b < nblk; b++) {
            MAT_I ci[TM * TN];
            [[unroll]] for (uint t = 0u; t < TM * TN; t++) ci[t] = MAT_I(0);
            for (uint ks = 0u; ks < KS; ks++) {
                uint kw = 8u * b + ks * (CM_K / 4u);
                MAT_A a[TM];
                MAT_B x[TN];
                [[unroll]] for (uint i = 0u; i < TM; i++) coopMatLoad(a[i], ws_t, (so + i * CM_M) * RS + kw, RS, gl_CooperativeMatrixLayoutRowMajor);
                [[unroll]] for (uint j = 0u; j < TN; j++) coopMatLoad(x[j], xs_t, (sn + j * CM_N) * RS + kw, RS, gl_CooperativeMatrixLayoutColumnMajor);
                [[unroll]] for (uint i = 0u; i < TM; i++)
                    [[unroll]] for (uint j = 0u; j < TN; j++) ci[i * TN + j] = coopMatMulAdd(a[i], x[j], ci[i * TN + j]);
            }
            [[unroll]] for (uint i = 0u; i < TM; i++) {
                [[unroll]] for (uint j = 0u; j < TN; j++) {
                    MAT_F cf = MAT_F(ci[i * TN + j]);
                    uint dbase = b * BN + sn + j * CM_N;
                    for (int c = 0; c < cf.length(); c++) acc[i * TN + j][c] += cf[c] * xd_t[dbase + code_col(code[c])];
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
                    float v = uintBitsToFloat(ws[o * pc.ss]) * acc[i * TN + j][c];
                    uint at = r * pc.out_stride + o;
                    outv[pc.out_off + at] = pc.res_on != 0u ? resv[pc.res_off + at] + v : v;
                }
            }
        }
    }
}
