#version 450
// moe_matmul.comp: routed experts for a prompt chunk, grouped per expert: workgroup z is
// expert e, y a tile of BR of its pairs (the pair list moe_group.comp wrote: offsets[0..E]
// then pair ids, p = r*K + k), x a tile of BO output rows; as matmul.comp, each BK step
// decodes the weight rows into shared memory once and stages the pairs' activation rows.
// Mode 0 (gate and up): rows e*2F + o and e*2F + F + o against x[r] (two weight tiles),
//   h[p][o] = glu(gate + bg, up + bu).
// Mode 1 (down): rows e*H + o against h[p]; y[p][o] = down + bd (moe_sum.comp adds the
//   ranks in order). Tiles past an expert's pairs exit at once; a pair's sum does not depend
//   on where in a tile it sits, so the order moe_group gives is free.
// Must not: read weights or activations outside the matrix (edges are masked to zero).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

#define BO 64
#define BR 32
#define BK 32
#define TO 4
#define TR 2
layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer WQ { uvec4 wq[]; };
layout(std430, binding = 1) readonly buffer WS { uint ws[]; };
layout(std430, binding = 2) readonly buffer XF { float xf[]; };
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
#define QS pc.qs
#define SS pc.ss
#define COLS pc.cols
#define XF_OFF(xr) (pc.x_off + (xr) * pc.cols)
#define XQ_BLK(xr) ((xr) * (pc.cols >> 5))
#include "wformat.glsl"
#include "moe.glsl"

float xval(uint xr, uint k) {
#ifdef FLOAT_ACTS
    return xat(xr, k);
#else
    uint blk = XQ_BLK(xr) + (k >> 5);
    uint w = xq[2u * blk + ((k >> 4) & 1u)][(k >> 2) & 3u];
    return xd[blk].x * float(sbyte(w, k & 3u));
#endif
}

shared float wg_t[BK][BO + 1];
shared float wu_t[BK][BO + 1];
shared float xs_t[BK][BR + 1];
shared uint pair_t[BR];

void main() {
    wformat_init();
    uint e = gl_WorkGroupID.z;
    uint start = groups[e], count = groups[e + 1u] - start;
    uint r0 = gl_WorkGroupID.y * BR;
    if (r0 >= count) return;
    uint tid = gl_LocalInvocationID.x;
    uint gate_up = pc.mode == 0u ? 1u : 0u;
    uint f = pc.rows;
    // Weight row of output o: the gate (or down) row; the up row is f further.
    uint wbase = gate_up == 1u ? e * 2u * f : e * f;
    uint o0 = gl_WorkGroupID.x * BO;
    if (tid < BR) pair_t[tid] = r0 + tid < count ? groups[pc.experts + 1u + start + r0 + tid] : 0u;
    barrier();
    uint to = tid % (BO / TO), tr = tid / (BO / TO);
    float accg[TO][TR], accu[TO][TR];
    for (uint i = 0u; i < TO; i++) for (uint j = 0u; j < TR; j++) { accg[i][j] = 0.0; accu[i][j] = 0.0; }
    for (uint k0 = 0u; k0 < pc.cols; k0 += BK) {
        for (uint q = tid; q < BO * BK; q += 256u) {
            uint o = q / BK, k = q % BK;
            bool in_ = o0 + o < f && k0 + k < pc.cols;
            wg_t[k][o] = in_ ? dequant(wbase + o0 + o, k0 + k) : 0.0;
            if (gate_up == 1u) wu_t[k][o] = in_ ? dequant(wbase + f + o0 + o, k0 + k) : 0.0;
        }
        for (uint q = tid; q < BR * BK; q += 256u) {
            uint r = q / BK, k = q % BK;
            uint p = pair_t[r];
            uint xr = gate_up == 1u ? p / pc.top_k : p;
            xs_t[k][r] = (r0 + r < count && k0 + k < pc.cols) ? xval(xr, k0 + k) : 0.0;
        }
        barrier();
        float pg[TO][TR], pu[TO][TR];
        for (uint i = 0u; i < TO; i++) for (uint j = 0u; j < TR; j++) { pg[i][j] = 0.0; pu[i][j] = 0.0; }
        for (uint k = 0u; k < BK; k++) {
            float x[TR];
            for (uint j = 0u; j < TR; j++) x[j] = xs_t[k][tr * TR + j];
            for (uint i = 0u; i < TO; i++) {
                float w = wg_t[k][to * TO + i];
                for (uint j = 0u; j < TR; j++) pg[i][j] += w * x[j];
            }
            if (gate_up == 1u) {
                for (uint i = 0u; i < TO; i++) {
                    float w = wu_t[k][to * TO + i];
                    for (uint j = 0u; j < TR; j++) pu[i][j] += w * x[j];
                }
            }
        }
        for (uint i = 0u; i < TO; i++) for (uint j = 0u; j < TR; j++) { accg[i][j] += pg[i][j]; accu[i][j] += pu[i][j]; }
        barrier();
    }
    for (uint i = 0u; i < TO; i++) {
        uint o = o0 + to * TO + i;
        if (o >= f) continue;
        for (uint j = 0u; j < TR; j++) {
            uint r = tr * TR + j;
            if (r0 + r >= count) continue;
            uint p = pair_t[r];
            float g = accg[i][j];
            if (gate_up == 1u) {
                float u = accu[i][j];
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
