#version 450
// glu.comp: elementwise activations. Gated (out = f(gate) * up): SwiGLU, GeGLU, clamped
// SwiGLU (gate clamped above at `limit`, up to [-limit, limit], out = g * sigmoid(alpha g) *
// (u + 1)), DeepSeek V4's limited SwiGLU (the same clamps, g * sigmoid(g) * u); plain
// (out = f(gate)): SiLU, sigmoid, ReLU, GELU (erf), GELU (tanh).
// Formulas are the CPU's (runtime/src/cpu/elementwise.rs). One invocation per element.
// Must not: read `up` for the plain kinds.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "act.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer G { float gv[]; };
layout(std430, binding = 1) readonly buffer U { float uv[]; };
layout(std430, binding = 2) writeonly buffer OUT { float outv[]; };
layout(push_constant) uniform PC {
    uint count; uint kind; float limit; float alpha;
    uint g_off; uint u_off; uint o_off; uint pad;
} pc;

// kinds: 0 SwiGLU, 1 GeGLU, 2 clamped SwiGLU, 3 limited SwiGLU, 10 SiLU, 11 sigmoid, 12 ReLU, 13 GELU, 14 GELU tanh
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= pc.count) return;
    float g = gv[pc.g_off + i];
    float r;
    if (pc.kind == 0u) r = silu(g) * uv[pc.u_off + i];
    else if (pc.kind == 1u) r = gelu(g) * uv[pc.u_off + i];
    else if (pc.kind == 2u) {
        float gg = min(g, pc.limit);
        float u = clamp(uv[pc.u_off + i], -pc.limit, pc.limit);
        r = gg * sigmoid(pc.alpha * gg) * (u + 1.0);
    }
    else if (pc.kind == 3u) r = glu_apply(3u, g, uv[pc.u_off + i], pc.limit, 0.0);
    else if (pc.kind == 10u) r = silu(g);
    else if (pc.kind == 11u) r = sigmoid(g);
    else if (pc.kind == 12u) r = max(g, 0.0);
    else if (pc.kind == 13u) r = gelu(g);
    else r = gelu_tanh(g);
    outv[pc.o_off + i] = r;
}
