#version 450
// rope_kv.comp: the block's RoPE and its KV append in one kernel: rotates q in place and k
// in place (as rope.comp, the CPU's cpu::rope::apply_row), then writes k and v rows into the
// layer's KV mirror at positions pos0.. and into the read-back rows the host appends to its
// cache. half = 0: no rotation (copies only). pos0 comes from the push constants, or from
// params[0] when `dyn` is set (a recording replayed at every position).
// One invocation per item of a row: q pairs, k pairs, k columns past the rotary ones, v columns.
// ring != 0 (a KV split's mirror): position p goes to mirror row p % ring.
// no_back != 0: the read-back rows are not written here (the host's copy commands take them
// from the mirror after: a prompt's rows reach host memory in large transfers, not as
// scattered 4-byte writes over the bus).
// The mirror and the read-back rows are KV_T (kv_type.glsl): f32, or 16-bit floats with KV_F16.
// Must not: write mirror rows other than those of pos0..pos0 + n.
#extension GL_GOOGLE_include_directive : require
#include "kv_type.glsl"
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Q { float qv[]; };
layout(std430, binding = 1) buffer K { float kv[]; };
layout(std430, binding = 2) readonly buffer V { float vv[]; };
layout(std430, binding = 3) readonly buffer F { float freq[]; };
layout(std430, binding = 4) writeonly buffer MK { KV_T mk[]; };
layout(std430, binding = 5) writeonly buffer MV { KV_T mv[]; };
layout(std430, binding = 6) writeonly buffer SK { KV_T sk[]; };
layout(std430, binding = 7) writeonly buffer SV { KV_T sv[]; };
layout(std430, binding = 8) readonly buffer PRM { uint params[]; };
layout(push_constant) uniform PC {
    uint n; uint heads; uint kv_heads; uint head_dim;
    uint v_head_dim; uint half_; uint interleaved; uint pos0;
    float mscale; uint q_off; uint k_off; uint v_off;
    uint dyn; uint has_q; uint ring; uint no_back;
} pc;

// Rotates the pair (a, b) of x at position p by frequency i.
void rot(uint p, uint i, inout float x0, inout float x1) {
    float s, c;
    sincos_rr(float(p) * freq[i], s, c);
    c *= pc.mscale;
    s *= pc.mscale;
    float a = x0, b = x1;
    x0 = a * c - b * s;
    x1 = b * c + a * s;
}

uint pair_a(uint base, uint i) { return pc.interleaved != 0u ? base + 2u * i : base + i; }
uint pair_b(uint a) { return pc.interleaved != 0u ? a + 1u : a + pc.half_; }

void main() {
    uint qp = pc.has_q != 0u ? pc.heads * pc.half_ : 0u;
    uint kp = pc.kv_heads * pc.half_;
    uint kr = pc.kv_heads * (pc.head_dim - 2u * pc.half_);
    uint vc = pc.kv_heads * pc.v_head_dim;
    uint per_row = qp + kp + kr + vc;
    uint id = gl_GlobalInvocationID.x;
    if (id >= pc.n * per_row) return;
    uint r = id / per_row, t = id % per_row;
    uint pos0 = pc.dyn != 0u ? params[0] : pc.pos0;
    uint p = pos0 + r;
    uint mp = pc.ring != 0u ? p % pc.ring : p;
    uint kw = pc.kv_heads * pc.head_dim, vw = pc.kv_heads * pc.v_head_dim;
    if (t < qp) {
        uint h = t / pc.half_, i = t % pc.half_;
        uint a = pair_a(pc.q_off + r * pc.heads * pc.head_dim + h * pc.head_dim, i), b = pair_b(a);
        float x0 = qv[a], x1 = qv[b];
        rot(p, i, x0, x1);
        qv[a] = x0;
        qv[b] = x1;
        return;
    }
    t -= qp;
    if (t < kp) {
        uint h = t / pc.half_, i = t % pc.half_;
        uint ca = pair_a(h * pc.head_dim, i), cb = pair_b(ca);
        uint kb = pc.k_off + r * kw;
        float x0 = kv[kb + ca], x1 = kv[kb + cb];
        rot(p, i, x0, x1);
        kv[kb + ca] = x0;
        kv[kb + cb] = x1;
        mk[mp * kw + ca] = KV_T(x0);
        mk[mp * kw + cb] = KV_T(x1);
        if (pc.no_back == 0u) {
            sk[r * kw + ca] = KV_T(x0);
            sk[r * kw + cb] = KV_T(x1);
        }
        return;
    }
    t -= kp;
    if (t < kr) {
        uint rest = pc.head_dim - 2u * pc.half_;
        uint c = (t / rest) * pc.head_dim + 2u * pc.half_ + t % rest;
        float x = kv[pc.k_off + r * kw + c];
        mk[mp * kw + c] = KV_T(x);
        if (pc.no_back == 0u) sk[r * kw + c] = KV_T(x);
        return;
    }
    t -= kr;
    float x = vv[pc.v_off + r * vw + t];
    mv[mp * vw + t] = KV_T(x);
    if (pc.no_back == 0u) sv[r * vw + t] = KV_T(x);
}
