#version 450
// group_cols.comp: the column groups of rows laid out group after group, for a block-diagonal
// product (DeepSeek V4's grouped output projection, reference cpu::hyper::grouped_linear's
// gather): out[g][i][j] = x[i][g * cols + j] for n rows of groups * cols. One invocation per
// element.
// Must not: write in place (x and out are distinct buffers or ranges).
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float xv[]; };
layout(std430, binding = 1) writeonly buffer OUT { float outv[]; };
layout(push_constant) uniform PC {
    uint n; uint groups; uint cols; uint x_off;
    uint out_off; uint pad0; uint pad1; uint pad2;
} pc;

void main() {
    uint i = gl_GlobalInvocationID.x;
    uint width = pc.groups * pc.cols;
    if (i >= pc.n * width) return;
    uint r = i / width, c = i % width;
    uint g = c / pc.cols, j = c % pc.cols;
    outv[pc.out_off + (g * pc.n + r) * pc.cols + j] = xv[pc.x_off + i];
}
