#version 450
// matmul.comp: tiled GEMM for prompt chunks (n >= 2 activation rows),
// out[r][o] = sum_k W[o][k] * x[r][k]. A workgroup owns a BO-output x BR-row tile; for each
// BK-wide step it decodes its weight rows into shared memory once (dequant), stages the
// activation rows beside them (the q8 values the CPU multiplies, for integer formats) and
// runs a TO x TR block per invocation (its weights one vec4, its activations one vec2 of shared
// memory per k; float formats staged a 16-byte unit at a time). Each step sums into a fresh partial that is then added
// to the accumulator (blocked summation keeps the error at the GEMV's level). Fused
// (fuse_in.glsl): an RMSNorm or gated unit on float activations as they are staged (each
// workgroup computes its rows' norms first), and a residual added to the output.
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

layout(push_constant) uniform PC {
    uint rows; uint cols; uint qs; uint ss;
    uint x_off; uint out_off; uint out_stride; uint n;
    uint in_mode; uint aux_off; float p0; float p1;
    uint res_on; uint res_off; uint pad0; uint pad1;
} pc;

#define QS pc.qs
#define SS pc.ss
#define COLS pc.cols
#define XF_OFF(xr) (pc.x_off + (xr) * pc.cols)
#define XQ_BLK(xr) ((xr) * (pc.cols >> 5))
shared float inv_s[BR];
#define ROW_INV(xr) inv_s[(xr) - gl_WorkGroupID.y * BR]
#include "fuse_in.glsl"
#include "wformat.glsl"

float xval(uint xr, uint k) {
#ifdef FLOAT_ACTS
    return xat(xr, k);
#else
    uint blk = XQ_BLK(xr) + (k >> 5);
    uint w = xq[2u * blk + ((k >> 4) & 1u)][(k >> 2) & 3u];
    return xd[blk].x * float(sbyte(w, k & 3u));
#endif
}

// The tiles, k-major: a thread reads its TO weights as one vec4 and its TR activations as one
// vec2 per k. Rows padded by a vec4 / vec2 to spread the stores over the banks.
shared vec4 ws4[BK][BO / 4 + 1];
shared vec2 xs2[BK][BR / 2 + 1];
shared float ss_s[256];

void stage_w(uint o, uint k, float v) { ws4[k][o >> 2][o & 3u] = v; }

void main() {
    wformat_init();
    uint tid = gl_LocalInvocationID.x;
    uint o0 = gl_WorkGroupID.x * BO, r0 = gl_WorkGroupID.y * BR;
    uint to = tid % (BO / TO), tr = tid / (BO / TO);
#ifdef FLOAT_ACTS
    if (pc.in_mode == 1u) {
        // 8 invocations a row: partial sums of squares, then one joins them.
        uint r = tid / 8u, j = tid % 8u;
        float ss = 0.0;
        if (r0 + r < pc.n) {
            for (uint k = j; k < pc.cols; k += 8u) {
                float v = xf[XF_OFF(r0 + r) + k];
                ss += v * v;
            }
        }
        ss_s[tid] = ss;
        barrier();
        if (j == 0u) {
            float t = 0.0;
            for (uint i = 0u; i < 8u; i++) t += ss_s[tid + i];
            inv_s[r] = 1.0 / sqrt(t / float(pc.cols) + pc.p0);
        }
        barrier();
    }
#endif
    float acc[TO][TR];
    for (uint i = 0u; i < TO; i++) for (uint j = 0u; j < TR; j++) acc[i][j] = 0.0;
    for (uint k0 = 0u; k0 < pc.cols; k0 += BK) {
#if defined(FMT_F16) || defined(FMT_BF16)
        // One 16-byte unit (8 weights) an invocation: BO rows x BK / 8 units.
        {
            uint o = tid / (BK / 8u), u = tid % (BK / 8u);
            uint unit = (k0 >> 3) + u;
            uvec4 wv = (o0 + o < pc.rows && unit < QS) ? wq[(o0 + o) * QS + unit] : uvec4(0u);
            [[unroll]] for (uint i = 0u; i < 4u; i++) {
                vec2 pr = unpack2(wv[i]);
                stage_w(o, 8u * u + 2u * i, pr.x);
                stage_w(o, 8u * u + 2u * i + 1u, pr.y);
            }
        }
#elif defined(FMT_F32)
        for (uint e = tid; e < BO * BK / 4u; e += 256u) {
            uint o = e / (BK / 4u), u = e % (BK / 4u);
            uint unit = (k0 >> 2) + u;
            vec4 wv = (o0 + o < pc.rows && unit < QS) ? uintBitsToFloat(wq[(o0 + o) * QS + unit]) : vec4(0.0);
            [[unroll]] for (uint i = 0u; i < 4u; i++) stage_w(o, 4u * u + i, wv[i]);
        }
#else
        for (uint e = tid; e < BO * BK; e += 256u) {
            uint o = e / BK, k = e % BK;
            stage_w(o, k, (o0 + o < pc.rows && k0 + k < pc.cols) ? dequant(o0 + o, k0 + k) : 0.0);
        }
#endif
        for (uint e = tid; e < BR * BK; e += 256u) {
            uint r = e / BK, k = e % BK;
            xs2[k][r >> 1][r & 1u] = (r0 + r < pc.n && k0 + k < pc.cols) ? xval(r0 + r, k0 + k) : 0.0;
        }
        barrier();
        float part[TO][TR];
        for (uint i = 0u; i < TO; i++) for (uint j = 0u; j < TR; j++) part[i][j] = 0.0;
        [[unroll]] for (uint k = 0u; k < BK; k++) {
            vec4 w = ws4[k][to];
            vec2 x = xs2[k][tr];
            for (uint i = 0u; i < TO; i++) for (uint j = 0u; j < TR; j++) part[i][j] += w[i] * x[j];
        }
        for (uint i = 0u; i < TO; i++) for (uint j = 0u; j < TR; j++) acc[i][j] += part[i][j];
        barrier();
    }
    for (uint i = 0u; i < TO; i++) {
        uint o = o0 + to * TO + i;
        if (o >= pc.rows) continue;
        for (uint j = 0u; j < TR; j++) {
            uint r = r0 + tr * TR + j;
            if (r < pc.n) outv[pc.out_off + r * pc.out_stride + o] = with_residual(r, o, acc[i][j]);
        }
    }
}
