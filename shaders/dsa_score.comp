#version 450
// dsa_score.comp: the lightning indexer's score of each (row, position) of a block: row i at
// position pos0 + i against the cached index key of position t <= pos0 + i,
// score = sum_h (w[i, h] * w_scale) * relu(q[i, h] . k[t] * scale) (+ 0, so no score is -0),
// written to scores[i * stride + t]. Workgroup (x, i) scores positions TP x .. TP x + TP - 1
// of row i: the tile's keys and the row's queries (in chunks of QS floats, transposed so the
// lanes read consecutive heads) staged in shared memory once, each subgroup two positions at a
// time with its lanes over the heads, joined by a subgroup sum. pos0 comes from the push
// constants, or from params[0] when `dyn` is set (a recording replayed at every position). With
// `rate` above 1 the keys are a KV compressor's entries (DeepSeek V4's lightning indexer): row i
// sees t < (pos0 + i + 1) / rate (rate 1: t <= pos0 + i).
// Reference: the scores of cpu::indexer::select_rows (the heads summed in another order).
// Must not: read a key the row does not see; take a head dim over MAXD (the caller checks).
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Q { float qv[]; };
layout(std430, binding = 1) readonly buffer K { float kv[]; };
layout(std430, binding = 2) readonly buffer W { float wv[]; };
layout(std430, binding = 3) writeonly buffer S { float sc[]; };
layout(std430, binding = 4) readonly buffer PRM { uint params[]; };
layout(push_constant) uniform PC {
    uint n; uint heads; uint dim; uint pos0;
    uint stride; float scale; float w_scale; uint q_off;
    uint w_off; uint dyn; uint rate; uint pad1;
} pc;

const uint TP = 16u;
const uint MAXD = 128u;
const uint QS = 4096u;
shared float ks[TP * MAXD];
shared float qs[QS];
shared float part[TP];

void main() {
    uint i = gl_WorkGroupID.y, t0 = gl_WorkGroupID.x * TP, tid = gl_LocalInvocationID.x;
    uint pos0 = pc.dyn != 0u ? params[0] : pc.pos0;
    // What row i sees; uniform across the workgroup: before any barrier.
    uint seen = i < pc.n ? (pos0 + i + 1u) / max(pc.rate, 1u) : 0u;
    if (t0 >= seen) return;
    uint dim = pc.dim;
    uint qb = pc.q_off + i * pc.heads * dim, wb = pc.w_off + i * pc.heads;
    if (tid < TP) part[tid] = 0.0;
    for (uint e = tid; e < TP * dim; e += 256u) {
        uint t = t0 + e / dim;
        ks[e] = t < seen ? kv[t * dim + e % dim] : 0.0;
    }
    uint hc = max(QS / dim, 1u);
    uint sg = gl_SubgroupID, lanes = gl_SubgroupSize, lane = gl_SubgroupInvocationID;
    for (uint h0 = 0u; h0 < pc.heads; h0 += hc) {
        uint hn = min(hc, pc.heads - h0);
        barrier();
        for (uint e = tid; e < hn * dim; e += 256u) {
            uint h = e / dim, k = e % dim;
            qs[k * hn + h] = qv[qb + (h0 + h) * dim + k];
        }
        barrier();
        for (uint p = 2u * sg; p < TP; p += 2u * gl_NumSubgroups) {
            float v0 = 0.0, v1 = 0.0;
            for (uint h = lane; h < hn; h += lanes) {
                float d0 = 0.0, d1 = 0.0;
                for (uint k = 0u; k < dim; k++) {
                    float q = qs[k * hn + h];
                    d0 += q * ks[p * dim + k];
                    d1 += q * ks[(p + 1u) * dim + k];
                }
                float wh = wv[wb + h0 + h] * pc.w_scale;
                v0 += wh * max(d0 * pc.scale, 0.0);
                v1 += wh * max(d1 * pc.scale, 0.0);
            }
            v0 = subgroupAdd(v0);
            v1 = subgroupAdd(v1);
            if (subgroupElect()) {
                part[p] += v0;
                part[p + 1u] += v1;
            }
        }
    }
    barrier();
    if (tid < TP && t0 + tid < seen) sc[i * pc.stride + t0 + tid] = part[tid] + 0.0;
}
