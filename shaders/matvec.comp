#version 450
// matvec.comp: decode GEMV, out[xr][row] = sum_k W[row][k] * x[xr][k] for one (or a few)
// activation rows; one subgroup per weight row, each lane taking the row's units (16-byte
// loads) in turn, joined by a subgroup sum. Workgroups stride over rows, so any subgroup size
// the driver picks is correct. Activation row xr = gl_WorkGroupID.y. Fused (fuse_in.glsl): an
// RMSNorm or gated unit on the float input (each subgroup computes the row's norm itself, no
// workgroup barrier), and a residual added to the output.
// Must not: assume a subgroup size, or read activations past the row (tails are masked).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;

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
float g_inv = 1.0;
#define ROW_INV(xr) g_inv
#include "fuse_in.glsl"
#include "wformat.glsl"

// Units a lane takes per pass: their loads issue together, so a row of a few units per lane
// waits for memory once, not once per unit.
#define UNROLL 4u

void main() {
    uint xr = gl_WorkGroupID.y;
    uint units = units_per_row();
    uint step = gl_NumWorkGroups.x * gl_NumSubgroups;
    uint lanes = gl_SubgroupSize;
#ifdef FLOAT_ACTS
    if (pc.in_mode == 1u) g_inv = 1.0 / sqrt(row_ss_subgroup(xr) / float(pc.cols) + pc.p0);
#endif
    for (uint row = gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID; row < pc.rows; row += step) {
        float acc = 0.0;
        for (uint u0 = gl_SubgroupInvocationID; u0 < units; u0 += UNROLL * lanes) {
            float part[UNROLL];
            [[unroll]] for (uint i = 0u; i < UNROLL; i++) {
                uint u = u0 + i * lanes;
                part[i] = u < units ? unit_dot(row, u, xr) : 0.0;
            }
            acc += (part[0] + part[1]) + (part[2] + part[3]);
        }
        acc = subgroupAdd(acc);
        if (subgroupElect()) outv[pc.out_off + xr * pc.out_stride + row] = with_residual(xr, row, row_finish(row, acc));
    }
}
