#version 450
// matmul_coop.comp: the tiled GEMM of matmul.comp for every weight format with q8 activations
// on int8 cooperative matrices (coop_q8.glsl: shapes, tiles, the per-block scaling; coop_w.glsl:
// a weight block as int8 codes and its factors). out[r][o] = (residual[r][o] +)
// row_scale[o] * sum_b (d[r][b] * wd[o][b] * (W[o] . q[r]) + wm[o][b] * s[r][b]) over blocks b
// (the halves of a block apart where the format's scales are per 16 elements). Input
// transforms (norm, gated unit) are applied by the quantization before (quantize_rows.comp);
// the residual add is fused into the store. Workgroup (x, y): BO weight rows from x * BO, BN
// activation rows from y * BN.
// The main loop is coop_gemm.glsl's.
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
// The tiles take the shared memory: the 16-level formats decode by selects (nib_pairs.glsl).
#define WFORMAT_NO_TABLE 1
#include "wformat.glsl"
#include "coop_w.glsl"
#include "coop_stage.glsl"

// The workgroup's first weight row and activation row (set before the first barrier).
uint o0, r0;
uint w_row(uint o) { return o0 + o; }
bool w_in(uint o) { return o0 + o < pc.rows; }
uint x_row(uint r) { return r0 + r; }
bool x_in(uint r) { return r0 + r < pc.n; }
#include "coop_gemm.glsl"

void main() {
    wformat_init();
    uint tid = gl_LocalInvocationID.x;
    o0 = gl_WorkGroupID.x * BO;
    r0 = gl_WorkGroupID.y * BN;
    uint sg = gl_SubgroupID;
    uint so = (sg & 1u) * 32u, sn = (sg >> 1u) * 32u;
    uint nblk = pc.cols >> 5, xunits = pc.cols >> 4;
    fill_codes(tid);
    barrier();
    MAT_F code;
    coopMatLoad(code, code_t, 0, CM_N, gl_CooperativeMatrixLayoutRowMajor);
    coop_gemm(tid, so, sn, nblk, xunits);
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
