#version 450
// hold.comp: one workgroup that computes for a while and writes nothing that anyone reads.
// The clock hold (vk/hold.rs) runs it on a second queue while the device would otherwise wait
// for the host between a forward's frames, so the GPU's clock does not fall to its idle state
// under that duty cycle. `rounds` dependent multiply-adds per invocation; the result is
// written only where it is not finite, which it never is for these inputs, so the loop
// stays and the buffer is not touched.
// Must not: run more than one workgroup's worth of the device (the real work runs beside it).
layout(local_size_x = 32) in;
layout(std430, binding = 0) writeonly buffer OUT { float outv[]; };
layout(push_constant) uniform PC { uint rounds; uint pad0; uint pad1; uint pad2; } pc;

void main() {
    float x = float(gl_LocalInvocationID.x) * 1e-3;
    for (uint i = 0u; i < pc.rounds; i++) x = x * 0.999 + 1e-4;
    if (isinf(x) || isnan(x)) outv[gl_LocalInvocationID.x] = x;
}
