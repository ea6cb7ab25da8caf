#version 450
// matvec.comp: decode GEMV, out[xr][row] = sum_k W[row][k] * x[xr][k] for one (or a few)
// activation rows; one subgroup per weight row, each lane taking the row's units (16-byte
// loads) in turn, joined by a subgroup sum. Workgroups stride over rows, so any subgroup size
// the driver picks is correct. Activation row xr = gl_WorkGroupID.y. With `ksplit` k > 1 (few
// weight rows: a router's 64), k subgroups of a workgroup share a row, each taking every k-th
// pass of its units, joined in shared memory in subgroup order (k falls back to 1 when it does
// not divide the workgroup's subgroups). Fused (fuse_in.glsl): an RMSNorm or gated unit on the
// float input (the row's norm summed by the whole workgroup first), and a residual added to
// the output.
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
    uint res_on; uint res_off; uint ksplit; uint pad1;
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

shared float k_part[64];

void main() {
    wformat_init();
    uint xr = gl_WorkGroupID.y;
    uint units = units_per_row();
    uint lanes = gl_SubgroupSize;
    uint ks = pc.ksplit;
    if (ks < 1u || ks > gl_NumSubgroups || gl_NumSubgroups % ks != 0u) ks = 1u;
    uint per = gl_NumSubgroups / ks;
    uint sub = gl_SubgroupID / ks, part = gl_SubgroupID % ks;
    uint step = gl_NumWorkGroups.x * per;
#ifdef FLOAT_ACTS
    // The row's norm: every invocation of the workgroup a share of the squares (a few loads
    // each, not a subgroup's whole row), joined in shared memory in subgroup order.
    if (pc.in_mode == 1u) {
        uint wg = gl_WorkGroupSize.x;
        float ss = 0.0;
        for (uint k0 = gl_LocalInvocationID.x; k0 < pc.cols; k0 += 4u * wg) {
            float v[4];
            [[unroll]] for (uint i = 0u; i < 4u; i++) {
                uint k = k0 + i * wg;
                v[i] = k < pc.cols ? xf[XF_OFF(xr) + k] : 0.0;
            }
            [[unroll]] for (uint i = 0u; i < 4u; i++) ss += v[i] * v[i];
        }
        ss = subgroupAdd(ss);
        if (subgroupElect()) k_part[gl_SubgroupID] = ss;
        barrier();
        float total = 0.0;
        for (uint s = 0u; s < gl_NumSubgroups; s++) total += k_part[s];
        barrier();
        g_inv = 1.0 / sqrt(total / float(pc.cols) + pc.p0);
    }
#endif
    if (ks == 1u) {
        for (uint row = gl_WorkGroupID.x * per + sub; row < pc.rows; row += step) {
            float acc = 0.0;
            for (uint u0 = gl_SubgroupInvocationID; u0 < units; u0 += UNROLL * lanes) {
                float part_[UNROLL];
                [[unroll]] for (uint i = 0u; i < UNROLL; i++) {
                    uint u = u0 + i * lanes;
                    part_[i] = u < units ? unit_dot(row, u, xr) : 0.0;
                }
                acc += (part_[0] + part_[1]) + (part_[2] + part_[3]);
            }
            acc = subgroupAdd(acc);
            if (subgroupElect()) outv[pc.out_off + xr * pc.out_stride + row] = with_residual(xr, row, row_finish(row, acc));
        }
        return;
    }
    // Rows shared by ks subgroups: the same number of rounds for the whole workgroup (the
    // barriers), a row past the end computing nothing.
    for (uint base = gl_WorkGroupID.x * per; base < pc.rows; base += step) {
        uint row = base + sub;
        float acc = 0.0;
        if (row < pc.rows) {
            for (uint u0 = part * UNROLL * lanes + gl_SubgroupInvocationID; u0 < units; u0 += ks * UNROLL * lanes) {
                float part_[UNROLL];
                [[unroll]] for (uint i = 0u; i < UNROLL; i++) {
                    uint u = u0 + i * lanes;
                    part_[i] = u < units ? unit_dot(row, u, xr) : 0.0;
                }
                acc += (part_[0] + part_[1]) + (part_[2] + part_[3]);
            }
        }
        acc = subgroupAdd(acc);
        if (subgroupElect()) k_part[gl_SubgroupID] = acc;
        barrier();
        if (part == 0u && subgroupElect() && row < pc.rows) {
            float total = 0.0;
            for (uint j = 0u; j < ks; j++) total += k_part[gl_SubgroupID + j];
            outv[pc.out_off + xr * pc.out_stride + row] = with_residual(xr, row, row_finish(row, total));
        }
        barrier();
    }
}
