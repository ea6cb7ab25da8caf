#version 450
// binary.comp: out = a + b or a * b over n rows of `width`, b either the same shape, one
// scalar per row (width 1), or one row broadcast to every row (a bias). In place allowed.
// One invocation per element.
// Must not: read b outside its shape.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer A { float av[]; };
layout(std430, binding = 1) readonly buffer B { float bv[]; };
layout(std430, binding = 2) writeonly buffer OUT { float outv[]; };
layout(push_constant) uniform PC {
    uint count; uint width; uint op; uint bmode;
    uint a_off; uint b_off; uint o_off; uint pad;
} pc;

// op: 0 add, 1 mul. bmode: 0 same shape, 1 per-row scalar, 2 row broadcast.
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= pc.count) return;
    uint bi = pc.bmode == 0u ? i : (pc.bmode == 1u ? i / pc.width : i % pc.width);
    float a = av[pc.a_off + i], b = bv[pc.b_off + bi];
    outv[pc.o_off + i] = pc.op == 0u ? a + b : a * b;
}
