#version 450
// rope.comp: rotary position embedding, in place, on the first `rotary_dim` columns of each
// head of each row; row i is at position pos0 + i. Pairs are (i, i + half) (rotate-half) or
// (2i, 2i + 1) (interleaved). The inverse frequencies come from the host (the CPU's table,
// scaling included); angles are pos * freq in f32 as on the CPU, sin/cos from sincos_rr.
// One invocation per (pair, head, row). pos0 comes from the push constants, or from params[0]
// when `dyn` is set (a recording replayed at every position). `skip` columns of each head come
// before the rotated ones (DeepSeek V4's RoPE on the heads' last columns: head_dim - rotary_dim);
// `inverse` rotates by the opposite angles (sin negated: the rotation undone). Reference:
// cpu::rope::rotate_part.
// Must not: touch columns outside skip..skip + rotary_dim of a head, or past heads * head_dim
// of a row.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer X { float xv[]; };
layout(std430, binding = 1) readonly buffer F { float freq[]; };
layout(std430, binding = 2) readonly buffer PRM { uint params[]; };
layout(push_constant) uniform PC {
    uint n; uint width; uint heads; uint head_dim;
    uint half_; uint interleaved; uint pos0; float mscale;
    uint x_off; uint dyn; uint skip; uint inverse;
} pc;

void main() {
    uint id = gl_GlobalInvocationID.x;
    uint total = pc.n * pc.heads * pc.half_;
    if (id >= total) return;
    uint i = id % pc.half_, h = (id / pc.half_) % pc.heads, r = id / (pc.half_ * pc.heads);
    uint pos0 = pc.dyn != 0u ? params[0] : pc.pos0;
    float angle = float(pos0 + r) * freq[i];
    float s, c;
    sincos_rr(angle, s, c);
    c *= pc.mscale;
    s *= pc.inverse != 0u ? -pc.mscale : pc.mscale;
    uint base = pc.x_off + r * pc.width + h * pc.head_dim + pc.skip;
    uint a = pc.interleaved != 0u ? base + 2u * i : base + i;
    uint b = pc.interleaved != 0u ? a + 1u : a + pc.half_;
    float x0 = xv[a], x1 = xv[b];
    xv[a] = x0 * c - x1 * s;
    xv[b] = x1 * c + x0 * s;
}
