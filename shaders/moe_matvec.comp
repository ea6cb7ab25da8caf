#version 450
// moe_matvec.comp: routed experts for a few rows (decode), each (row, rank) pair a GEMV of the
// expert the routing buffer names (read here: no host round trip). The experts of a layer are
// stacked in one matrix per role: gate and up as rows e*2F + j and e*2F + F + j (F = ffn),
// down as rows e*H + i (H = hidden).
// Mode 0 (gate and up): workgroup y = pair p = r*K + k; h[p][j] = glu(gate_e[j] . x[r] + bg,
//   up_e[j] . x[r] + bu), the activation rows those of x. With `route` set, every workgroup
//   routes row r itself from the router's logits (route.glsl, route.comp's arithmetic; its
//   bits: 0 on, 1-2 scoring, 3 renormalize, 4 bias, 5 group_max, 8-15 groups, 16-23 groups
//   kept), and workgroup x = 0 of each pair writes its pair into the routing (binding 10) for
//   the down kernel: no Route dispatch between the router's GEMV and the experts. With hq_on,
//   h's 8-bit blocks as well (bindings 13-14, quantize_q8.comp's layout and q8_block's
//   arithmetic): each row's writer bumps its block's count (binding 15, never reset: a
//   dispatch adds 32 a block) and the subgroup that brings it to a multiple of 32 quantizes
//   the block, so no QuantizeQ8 dispatch runs before the down GEMV.
// Mode 1 (down and sum): workgroup y = row r; out[r][i] = sum over ranks k, in rank order
//   from 0, of w[r,k] * (down_e[i] . h[r*K + k] + bd): the CPU's order (cpu/experts.rs); with
//   res_on, res[r][i] + that sum (the residual Add folded into the store).
// Mode 2 (down per pair, the expert tier's batches): workgroup y = pair p; y[p][i] =
//   down_e[i] . h[p] + bd, not weighted (the host joins the pairs to their rows in rank order).
// Modes 3 and 4 (several rows a step): modes 0 and 2 with workgroup y = expert e over the pairs
//   moe_group.comp listed for e (binding 9), PB pairs at a time, so an expert's weights are read
//   once for PB pairs instead of once a pair; each pair's dot sums its units in the order of
//   modes 0/2 (the same numbers). Mode 4 always writes per pair (moe_sum.comp joins them).
// One subgroup per output row, lanes over the row's units, joined by a subgroup sum, as
// matvec.comp. Biases (gpt-oss): bias[bias_off + e*2F + j] for gate/up rows, bias[bias_off +
// e*H + i] for down, when bias_off != NONE.
// Must not: assume a subgroup size, or read an expert the routing does not name validly.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;

layout(std430, binding = 0) readonly buffer WQ { uvec4 wq[]; };
layout(std430, binding = 1) readonly buffer WS { uint ws[]; };
layout(std430, binding = 2) readonly buffer XF { float xf[]; };
layout(std430, binding = 3) readonly buffer XQ { uvec4 xq[]; };
layout(std430, binding = 4) readonly buffer XD { vec2 xd[]; };
layout(std430, binding = 5) coherent buffer OUT { float outv[]; };
layout(std430, binding = 6) readonly buffer RT { float routing[]; };
layout(std430, binding = 7) readonly buffer BS { float bias[]; };
layout(std430, binding = 8) readonly buffer RES { float resv[]; };
layout(std430, binding = 9) readonly buffer GR { uint groups[]; };
layout(std430, binding = 10) writeonly buffer RW { float routing_out[]; };
layout(std430, binding = 11) readonly buffer LG { float logits[]; };
layout(std430, binding = 12) readonly buffer RB { float rbias[]; };
layout(std430, binding = 13) writeonly buffer HQ { uint hq_words[]; };
layout(std430, binding = 14) writeonly buffer HD { vec2 hd_out[]; };
layout(std430, binding = 15) coherent buffer CN { uint counts[]; };

layout(push_constant) uniform PC {
    uint rows; uint cols; uint qs; uint ss;
    uint x_off; uint out_off; uint r_off; uint top_k;
    uint experts; uint mode; uint glu; float limit;
    float alpha; uint bias_off; uint res_on; uint res_off;
    uint route; uint l_off; float rscale; uint hq_on;
} pc;

#define NONE 0xffffffffu
#define QS pc.qs
#define SS pc.ss
#define COLS pc.cols
#define XF_OFF(xr) (pc.x_off + (xr) * pc.cols)
#define XQ_BLK(xr) ((xr) * (pc.cols >> 5))
#define R_OFF pc.r_off
#define TOP_K pc.top_k
#include "wformat.glsl"
#include "moe.glsl"

#define RT_MAX_E 256
#define RT_LOGIT(e) logits[rt_base + (e)]
#define RT_BIAS(e) rbias[e]
#include "route.glsl"

// Ranks whose down rows one subgroup reads at once (mode 1).
#define KB 8u
// Pairs one subgroup takes through an expert's rows at once (modes 3 and 4).
#define PB 8u

float row_dot(uint row, uint xr) {
    uint units = units_per_row();
    float acc = 0.0;
    for (uint u = gl_SubgroupInvocationID; u < units; u += gl_SubgroupSize) acc += unit_dot(row, u, xr);
    return row_finish(row, subgroupAdd(acc));
}

// Mode 0 with hq_on: h's block `blk` (32 values from element blk * 32 of out) into 8 bits,
// q8_scale and q8_code with the subgroup's lanes over the block's words; the subgroup that
// wrote the block's last value calls it.
void h_block(uint blk) {
    uint base = pc.out_off + blk * 32u;
    float amax = 0.0;
    for (uint i = gl_SubgroupInvocationID; i < 32u; i += gl_SubgroupSize) amax = max(amax, abs(outv[base + i]));
    vec2 sc = q8_scale(subgroupMax(amax));
    float d = sc.x, id = sc.y;
    int sum = 0;
    for (uint w = gl_SubgroupInvocationID; w < 8u; w += gl_SubgroupSize) {
        uint packed = 0u;
        for (uint j = 0u; j < 4u; j++) {
            int q = q8_code(outv[base + 4u * w + j], id);
            sum += q;
            packed |= (uint(q) & 0xffu) << (8u * j);
        }
        hq_words[blk * 8u + w] = packed;
    }
    sum = subgroupAdd(sum);
    if (subgroupElect()) hd_out[blk] = vec2(d, d * float(sum));
}

void main() {
    wformat_init();
    uint step = gl_NumWorkGroups.x * gl_NumSubgroups;
    uint first = gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID;
    if (pc.mode == 0u) {
        uint p = gl_WorkGroupID.y, r = p / pc.top_k, k = p % pc.top_k;
        uint e;
        if ((pc.route & 1u) != 0u) {
            uint b = pc.route;
            RouteArgs a = RouteArgs(pc.experts, pc.top_k, (b >> 1u) & 3u, (b >> 3u) & 1u, (b >> 4u) & 1u,
                (b >> 8u) & 255u, (b >> 16u) & 255u, (b >> 5u) & 1u, pc.rscale);
            rt_base = pc.l_off + r * pc.experts;
            route_scores(a);
            route_choose(a);
            e = rt_chosen[k];
            if (gl_WorkGroupID.x == 0u && gl_LocalInvocationID.x == 0u) {
                routing_out[pc.r_off + r * 2u * pc.top_k + 2u * k] = float(e);
                routing_out[pc.r_off + r * 2u * pc.top_k + 2u * k + 1u] = route_weight(a, k);
            }
        } else {
            e = moe_expert(r, k, pc.experts);
        }
        if (e >= pc.experts) return;
        uint f = pc.rows;
        for (uint j = first; j < f; j += step) {
            uint rg = e * 2u * f + j, ru = rg + f;
            // Gate and up rows read together (their loads in flight at once).
            float ga = 0.0, ua = 0.0;
            uint units = units_per_row();
            for (uint t = gl_SubgroupInvocationID; t < units; t += gl_SubgroupSize) {
                ga += unit_dot(rg, t, r);
                ua += unit_dot(ru, t, r);
            }
            float g = row_finish(rg, subgroupAdd(ga)), u = row_finish(ru, subgroupAdd(ua));
            if (pc.bias_off != NONE) {
                g += bias[pc.bias_off + rg];
                u += bias[pc.bias_off + ru];
            }
            uint o = p * f + j;
            uint seen = 0u;
            if (subgroupElect()) {
                outv[pc.out_off + o] = moe_glu(pc.glu, g, u, pc.limit, pc.alpha);
                if (pc.hq_on != 0u) {
                    memoryBarrierBuffer();
                    seen = atomicAdd(counts[o >> 5u], 1u);
                }
            }
            // The block's 32nd value: its 8-bit codes now (the counts wrap, never reset).
            if (pc.hq_on != 0u && (subgroupMax(seen) & 31u) == 31u) {
                memoryBarrierBuffer();
                h_block(o >> 5u);
            }
        }
    } else if (pc.mode >= 3u) {
        uint e = gl_WorkGroupID.y, f = pc.rows, units = units_per_row();
        uint g1 = groups[e + 1u];
        for (uint q0 = groups[e]; q0 < g1; q0 += PB) {
            uint pr[PB];
            [[unroll]] for (uint b = 0u; b < PB; b++) pr[b] = q0 + b < g1 ? groups[pc.experts + 1u + q0 + b] : NONE;
            for (uint j = first; j < f; j += step) {
                if (pc.mode == 3u) {
                    uint rg = e * 2u * f + j, ru = rg + f;
                    float ga[PB], ua[PB];
                    [[unroll]] for (uint b = 0u; b < PB; b++) {
                        ga[b] = 0.0;
                        ua[b] = 0.0;
                    }
                    for (uint t = gl_SubgroupInvocationID; t < units; t += gl_SubgroupSize) {
                        [[unroll]] for (uint b = 0u; b < PB; b++) {
                            if (pr[b] == NONE) continue;
                            uint r = pr[b] / pc.top_k;
                            ga[b] += unit_dot(rg, t, r);
                            ua[b] += unit_dot(ru, t, r);
                        }
                    }
                    [[unroll]] for (uint b = 0u; b < PB; b++) {
                        if (pr[b] == NONE) continue;
                        float g = row_finish(rg, subgroupAdd(ga[b])), u = row_finish(ru, subgroupAdd(ua[b]));
                        if (pc.bias_off != NONE) {
                            g += bias[pc.bias_off + rg];
                            u += bias[pc.bias_off + ru];
                        }
                        if (subgroupElect()) outv[pc.out_off + pr[b] * f + j] = moe_glu(pc.glu, g, u, pc.limit, pc.alpha);
                    }
                } else {
                    uint row = e * f + j;
                    float acc[PB];
                    [[unroll]] for (uint b = 0u; b < PB; b++) acc[b] = 0.0;
                    for (uint t = gl_SubgroupInvocationID; t < units; t += gl_SubgroupSize) {
                        [[unroll]] for (uint b = 0u; b < PB; b++) {
                            if (pr[b] != NONE) acc[b] += unit_dot(row, t, pr[b]);
                        }
                    }
                    [[unroll]] for (uint b = 0u; b < PB; b++) {
                        if (pr[b] == NONE) continue;
                        float t = row_finish(row, subgroupAdd(acc[b]));
                        if (pc.bias_off != NONE) t += bias[pc.bias_off + row];
                        if (subgroupElect()) outv[pc.out_off + pr[b] * f + j] = t;
                    }
                }
            }
        }
    } else if (pc.mode == 2u) {
        uint p = gl_WorkGroupID.y, r = p / pc.top_k, k = p % pc.top_k, hdim = pc.rows;
        uint e = moe_expert(r, k, pc.experts);
        if (e >= pc.experts) return;
        for (uint i = first; i < hdim; i += step) {
            uint row = e * hdim + i;
            float t = row_dot(row, p);
            if (pc.bias_off != NONE) t += bias[pc.bias_off + row];
            if (subgroupElect()) outv[pc.out_off + p * hdim + i] = t;
        }
    } else {
        // The ranks in groups of KB: the group's loads are issued together (one wait for
        // memory a group, not one a rank); the weighted sum still adds rank by rank.
        uint r = gl_WorkGroupID.y, hdim = pc.rows, units = units_per_row();
        for (uint i = first; i < hdim; i += step) {
            precise float o = 0.0;
            for (uint k0 = 0u; k0 < pc.top_k; k0 += KB) {
                uint rows_[KB];
                float acc[KB];
                [[unroll]] for (uint b = 0u; b < KB; b++) {
                    uint e = k0 + b < pc.top_k ? moe_expert(r, k0 + b, pc.experts) : pc.experts;
                    rows_[b] = e < pc.experts ? e * hdim + i : NONE;
                    acc[b] = 0.0;
                }
                for (uint u = gl_SubgroupInvocationID; u < units; u += gl_SubgroupSize) {
                    [[unroll]] for (uint b = 0u; b < KB; b++) {
                        if (rows_[b] != NONE) acc[b] += unit_dot(rows_[b], u, r * pc.top_k + k0 + b);
                    }
                }
                [[unroll]] for (uint b = 0u; b < KB; b++) {
                    float t = row_finish(rows_[b] == NONE ? 0u : rows_[b], subgroupAdd(acc[b]));
                    if (rows_[b] == NONE) continue;
                    if (pc.bias_off != NONE) t += bias[pc.bias_off + rows_[b]];
                    precise float wt = moe_weight(r, k0 + b) * t;
                    o = o + wt;
                }
            }
            if (subgroupElect()) outv[pc.out_off + r * hdim + i] = pc.res_on != 0u ? resv[pc.res_off + r * hdim + i] + o : o;
        }
    }
}
