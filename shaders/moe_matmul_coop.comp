#version 450
// moe_matmul_coop.comp: moe_matmul.comp's products for every weight format with q8 activations
// on int8 cooperative matrices (coop_q8.glsl: shapes, tiles, the per-block scaling; coop_w.glsl:
// a weight block as codes and factors; coop_gemm.glsl: the main loop matmul_coop.comp shares).
// Workgroup z is expert e, y a tile of BN of its pairs (moe_group.comp's list: offsets[0..E]
// then pair ids p = r*K + k), x a tile of BO of the expert's R = pc.rows weight rows e*R + o.
// Mode 0 (gate and up, R = 2F: the gate rows above the up rows) against x[r]: the raw sums
//   gu[p][o] = scale * (gate or up) with no bias, which moe_glu_q8.comp turns into h and its
//   8-bit blocks. (The gated unit in this kernel's store, the up half's sums handed to the gate
//   half through shared memory, made the call 1.5-2.3x as long on the H100.)
// Mode 1 (down, R = H) against h[p]: y[p][o] = scale * down + bd (moe_sum.comp adds the ranks
//   in order). Tiles past an expert's pairs exit at once (the whole workgroup).
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
// The tiles take the shared memory: the 16-level formats decode by selects (nib_pairs.glsl).
#define WFORMAT_NO_TABLE 1
#include "wformat.glsl"
#include "coop_w.glsl"
#include "coop_stage.glsl"

shared uint pair_t[BN];
// The activation row of each staged pair (r = p / top_k for gate/up, p for down), computed once.
shared uint row_t[BN];

// The workgroup's expert rows: the first weight row of its expert and the tile's first o0; its
// pairs r0.. of count.
uint wbase, o0, r0, count;
uint w_row(uint o) { return wbase + o0 + o; }
bool w_in(uint o) { return o0 + o < pc.rows; }
uint x_row(uint r) { return row_t[r]; }
bool x_in(uint r) { return r0 + r < count; }
#include "coop_gemm.glsl"

void main() {
    wformat_init();
    uint e = gl_WorkGroupID.z;
    uint start = groups[e];
    count = groups[e + 1u] - start;
    r0 = gl_WorkGroupID.y * BN;
    if (r0 >= count) return;
    uint tid = gl_LocalInvocationID.x;
    bool gate_up = pc.mode == 0u;
    wbase = e * pc.rows;
    o0 = gl_WorkGroupID.x * BO;
    uint sg = gl_SubgroupID;
    uint so = (sg & 1u) * 32u, sn = (sg >> 1u) * 32u;
    uint nblk = pc.cols >> 5, xunits = pc.cols >> 4;
    for (uint i = tid; i < BN; i += NT) {
        uint p = r0 + i < count ? groups[pc.experts + 1u + start + r0 + i] : 0u;
        pair_t[i] = p;
        row_t[i] = gate_up ? p / pc.top_k : p;
    }
    fill_codes(tid);
    barrier();
    MAT_F code;
    coopMatLoad(code, code_t, 0, CM_N, gl_CooperativeMatrixLayoutRowMajor);
    coop_gemm(tid, so, sn, nblk, xunits);
    [[unroll]] for (uint i = 0u; i < TM; i++) {
        [[unroll]] for (uint j = 0u; j < TN; j++) {
            for (int c = 0; c < code.length(); c++) {
                uint o = o0 + so + i * CM_M + code_row(code[c]);
                uint r = sn + j * CM_N + code_col(code[c]);
                if (o >= pc.rows || r0 + r >= count) continue;
                float g = coop_row_scale(wbase + o) * acc[i * TN + j][c];
                if (pc.bias_off != NONE) g += bias[pc.bias_off + wbase + o];
                outv[pc.out_off + pair_t[r] * pc.rows + o] = g;
            }
        }
    }
}
