// coop_q8.glsl: what the cooperative-matrix q8 GEMMs (matmul_coop.comp, moe_matmul_coop.comp)
// share. Weights are I8Row (int8 values, one f32 scale per row), activations q8 blocks of 32
// (int8 values, per block (d, s); quantize_q8.comp / quantize_rows.comp). The CPU computes a
// row's product as scale * sum over blocks b of (d[b] * float(sum_k w[k] q[k])); the integer
// sum of one block is exact in int32, so each block's products are one (or 32 / CM_K)
// int8 x int8 -> int32 cooperative-matrix products per tile, then scaled by the activation row's
// d of that block and added to f32 accumulators in block order, as the CPU does (results
// differ from the CPU only where the driver contracts the multiply-add into an FMA).
//
// Shapes: the device lists them; the host picks one (device.rs, choose_coopmat_i8) and
// specializes: constant 0 the workgroup size (four subgroups), 1..3 M, N, K (M, N, K divide 32).
// A workgroup owns a BO (weight rows) x BN (activation rows) output tile, 2 x 2 subgroups of
// 32 x 32 each (TM x TN cooperative tiles of M x N). Each stage stages BK = 128 columns (four
// q8 blocks) of the weight rows and of the activation rows into shared memory, 16-byte loads,
// rows padded to spread the banks.
// The loop over the stages is coop_gemm.glsl's; the shaders say only which rows are staged.
//
// Scaling: each block's integer tile is converted and scaled by the block's factors as whole
// matrices (COL_FACTORS / ROW_FACTORS below: the activation rows' d broadcast down the columns,
// the weight rows' factors along the rows), componentwise, so no invocation needs to know which
// element it holds. Only the store does: the accumulator's element-to-invocation mapping is the
// implementation's, but the same for every matrix of one type, so a matrix loaded once from a
// table of (row, column) codes tells each invocation where each of its components belongs.
// The including shader declares the push constants, bindings, xs_t / ws_t style tiles it
// stages (int8 tiles as i8vec4 arrays), and calls the helpers below from uniform control flow.
// Must not: be used where the device has no suitable shape (the host does not dispatch then),
// or read weights or activations outside their matrices (edges are staged as zeros).
#extension GL_KHR_cooperative_matrix : require
// Needed for gl_ScopeSubgroup; makes the module use the Vulkan memory model (device feature
// vulkanMemoryModel, enabled with the extension).
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int32 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint CM_M = 16;
layout(constant_id = 2) const uint CM_N = 16;
layout(constant_id = 3) const uint CM_K = 32;

#define BO 64u
#define BN 64u
#define BK 128u
#define BLKS 4u
// Row stride of a staged tile in i8vec4s (the unit of coopMatLoad offsets and strides here):
// BK bytes and 16 bytes of padding.
#define RS 36u
const uint TM = 32u / CM_M;
const uint TN = 32u / CM_N;
const uint KS = 32u / CM_K;
const uint NT = gl_WorkGroupSize.x;

#define MAT_A coopmat<int8_t, gl_ScopeSubgroup, CM_M, CM_K, gl_MatrixUseA>
#define MAT_B coopmat<int8_t, gl_ScopeSubgroup, CM_K, CM_N, gl_MatrixUseB>
#define MAT_I coopmat<int32_t, gl_ScopeSubgroup, CM_M, CM_N, gl_MatrixUseAccumulator>
#define MAT_F coopmat<float, gl_ScopeSubgroup, CM_M, CM_N, gl_MatrixUseAccumulator>

// The activation tile (BN rows of BK bytes) and its blocks' d ([block][row]).
shared i8vec4 xs_t[BN * RS];
shared float xd_t[BLKS * BN];
// (row, column) codes of an M x N tile, row-major: row * 32 + column.
shared float code_t[32 * 32];

void put_x(uint r, uint u, uvec4 v) {
    uint b = r * RS + 4u * u;
    xs_t[b] = unpack8(int(v.x)); xs_t[b + 1u] = unpack8(int(v.y)); xs_t[b + 2u] = unpack8(int(v.z)); xs_t[b + 3u] = unpack8(int(v.w));
}

// Fills code_t (call before the first barrier).
void fill_codes(uint tid) {
    for (uint e = tid; e < CM_M * CM_N; e += NT) code_t[e] = float((e / CM_N) * 32u + e % CM_N);
}

uint code_row(float c) { return uint(c) >> 5; }

// A block's factors as accumulator-shaped matrices, loaded with a stride of 0 so that one
// vector of BN (or BO) floats fills every row or every column: COL_FACTORS(m, f, at) gives
// m(i, j) = f[at + j] (an activation row's factor down its column), ROW_FACTORS gives
// m(i, j) = f[at + i] (a weight row's factor along its row). Componentwise products with a
// block's integer tile then scale it as the CPU does, with no per-element indexing.
#define COL_FACTORS(m, f, at) coopMatLoad(m, f, at, 0u, gl_CooperativeMatrixLayoutRowMajor)
#define ROW_FACTORS(m, f, at) coopMatLoad(m, f, at, 0u, gl_CooperativeMatrixLayoutColumnMajor)
uint code_col(float c) { return uint(c) & 31u; }
