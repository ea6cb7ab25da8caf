// fuse_in.glsl: what the matrix kernels (matvec.comp, matmul.comp) fuse around the product.
// Input modes (push in_mode), applied to float activations as they are read, in the CPU's
// arithmetic (cpu::norm::rms_norm, cpu::elementwise::glu):
//   0: x as stored;
//   1: RMSNorm of the whole row: x * ROW_INV(xr) * (aux[k] + p1), ROW_INV the including
//      shader's 1 / sqrt(mean(x^2) + p0) of row xr;
//   2, 3, 4, 5: the gated unit glu(kind = in_mode - 2, act.glsl's glu_apply) of x (the gate)
//      and aux (up, rows of `cols` from aux_off), p0 = limit, p1 = alpha.
// Output: with res_on, out = product + res (res laid out as out, from res_off), the CPU's
// residual Add folded into the product's store (a + b is exact either way round).
// The including shader declares the push constants (fields below) and xf, and defines
// ROW_INV before including this file, and this file before wformat.glsl.
// Must not: be used for q8 activations (quantize_q8.comp applies the same modes there).
#include "act.glsl"

layout(std430, binding = 6) readonly buffer AUX { float auxv[]; };
layout(std430, binding = 7) readonly buffer RES { float resv[]; };

float x_in(uint xr, uint k) {
    float v = xf[XF_OFF(xr) + k];
    if (pc.in_mode == 1u) return v * ROW_INV(xr) * (auxv[pc.aux_off + k] + pc.p1);
    if (pc.in_mode >= 2u) return glu_apply(pc.in_mode - 2u, v, auxv[pc.aux_off + xr * pc.cols + k], pc.p0, pc.p1);
    return v;
}
#define XLOAD(xr, k) x_in(xr, k)

float with_residual(uint xr, uint row, float v) {
    return pc.res_on != 0u ? resv[pc.res_off + xr * pc.out_stride + row] + v : v;
}
