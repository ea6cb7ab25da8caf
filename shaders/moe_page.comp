#version 450
// moe_page.comp: a chunk's routing as one page of a layer's resident experts sees it (experts
// base .. base + count, stacked in buffers of their own where the whole layer exceeds one
// storage buffer): out[i] = (e - base, w) for the pair i whose expert e lies in the page, else
// (-1, w), which the experts' kernels skip (`moe_expert`). One invocation per (row, rank) pair;
// the routing is n x top_k pairs of (expert as f32, weight) from r_off, out from 0.
// Must not: change a weight, or a pair's place.

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer RT { float routing[]; };
layout(std430, binding = 1) writeonly buffer OUT { float outv[]; };
layout(push_constant) uniform PC { uint pairs; uint r_off; uint base; uint count; } pc;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= pc.pairs) return;
    float e = routing[pc.r_off + 2u * i];
    float b = float(pc.base);
    bool inside = e >= b && e < b + float(pc.count);
    outv[2u * i] = inside ? e - b : -1.0;
    outv[2u * i + 1u] = routing[pc.r_off + 2u * i + 1u];
}
