// coop_gemm.glsl: the main loop the cooperative-matrix GEMMs share (matmul_coop.comp,
// moe_matmul_coop.comp): a BO x BN tile of a workgroup, each subgroup's 32 x 32 of it summed
// over every block of the row in block order, the next stage's operands loaded into registers
// while the current stage computes (so the global loads' latency overlaps the products).
// The including shader says which rows the tile's staged rows are, as functions defined before
// the include: `w_row(o)` / `w_in(o)` the weight row of staged row o (0..BO-1) and whether it
// exists, `x_row(r)` / `x_in(r)` the activation row of staged column r (0..BN-1); they may read
// shared memory the shader filled before its first barrier.
// Included after coop_q8.glsl, wformat.glsl, coop_w.glsl and coop_stage.glsl.
// Must not: be called from non-uniform control flow (it has barriers).

shared i8vec4 ws_t[BO * RS];
// The blocks' weight factors ([block][half][row]) and offsets ([block][row]).
shared float wd_t[BLKS * SUBS * BO];
#ifdef HAS_MIN
shared float wm_t[BLKS * BO];
#endif

void put_w(uint o, uint u, uvec4 v) {
    uint b = o * RS + 4u * u;
    ws_t[b] = unpack8(int(v.x)); ws_t[b + 1u] = unpack8(int(v.y)); ws_t[b + 2u] = unpack8(int(v.z)); ws_t[b + 3u] = unpack8(int(v.w));
}

// The next stage's operands: up to PU units of each kind an invocation (the workgroup has at
// least 64 invocations). Activation rows share the weight rows' indices: BN == BO.
#define PU 8u
uvec4 pw[PU], px[PU];
float pd[PU][SUBS], pm[PU];
vec2 pxd[PU];

void fetch(uint k0, uint tid, uint nblk, uint xunits) {
    [[unroll]] for (uint i = 0u; i < PU; i++) {
        uint e = tid + i * NT;
        if (e < BO * 8u) {
            uint o = e >> 3, u = e & 7u, blk = k0 + (u >> 1);
            pw[i] = (w_in(o) && blk < nblk) ? coop_codes(w_row(o), blk, u & 1u) : uvec4(0u);
            uint unit = 2u * k0 + u;
            px[i] = (x_in(o) && unit < xunits) ? xq[x_row(o) * xunits + unit] : uvec4(0u);
        }
        if (e < BLKS * BO) {
            uint b = e / BO, o = e % BO;
            bool in_ = w_in(o) && k0 + b < nblk;
            [[unroll]] for (uint h = 0u; h < SUBS; h++) pd[i][h] = in_ ? coop_wd(w_row(o), k0 + b, h) : 0.0;
#ifdef HAS_MIN
            pm[i] = in_ ? coop_wm(w_row(o), k0 + b) : 0.0;
#endif
            pxd[i] = (x_in(o) && k0 + b < nblk) ? xd[x_row(o) * nblk + k0 + b] : vec2(0.0);
        }
    }
}

void store(uint tid) {
    [[unroll]] for (uint i = 0u; i < PU; i++) {
        uint e = tid + i * NT;
        if (e < BO * 8u) {
            put_w(e >> 3, e & 7u, pw[i]);
            stage_x(e >> 3, e & 7u, px[i]);
        }
        if (e < BLKS * BO) {
            uint b = e / BO, o = e % BO;
            [[unroll]] for (uint h = 0u; h < SUBS; h++) wd_t[(b * SUBS + h) * BO + o] = pd[i][h];
#ifdef HAS_MIN
            wm_t[e] = pm[i];
            xsum_t[e] = pxd[i].y;
#endif
            xd_t[e] = pxd[i].x;
        }
    }
}

// The subgroup's sums: its 32 x 32 of the tile (TM x TN matrices).
MAT_F acc[TM * TN];

// acc = this subgroup's (rows so.., columns sn..) 32 x 32 of the tile over the whole row.
void coop_gemm(uint tid, uint so, uint sn, uint nblk, uint xunits) {
    [[unroll]] for (uint t = 0u; t < TM * TN; t++) acc[t] = MAT_F(0.0);
    fetch(0u, tid, nblk, xunits);
    for (uint k0 = 0u; k0 < nblk; k0 += BLKS) {
        store(tid);
        barrier();
        if (k0 + BLKS < nblk) fetch(k0 + BLKS, tid, nblk, xunits);
        for (uint b = 0u; b < BLKS && k0 + b < nblk; b++) {
            MAT_I ci[TM * TN];
#ifdef HALVES
            MAT_I ch[TM * TN];
#endif
            [[unroll]] for (uint t = 0u; t < TM * TN; t++) {
                ci[t] = MAT_I(0);
#ifdef HALVES
                ch[t] = MAT_I(0);
#endif
            }
            for (uint ks = 0u; ks < KS; ks++) {
                uint kw = 8u * b + ks * (CM_K / 4u);
                MAT_A a[TM];
                MAT_B x[TN];
                [[unroll]] for (uint i = 0u; i < TM; i++) coopMatLoad(a[i], ws_t, (so + i * CM_M) * RS + kw, RS, gl_CooperativeMatrixLayoutRowMajor);
                [[unroll]] for (uint j = 0u; j < TN; j++) coopMatLoad(x[j], xs_t, (sn + j * CM_N) * RS + kw, RS, gl_CooperativeMatrixLayoutColumnMajor);
                [[unroll]] for (uint i = 0u; i < TM; i++)
                    [[unroll]] for (uint j = 0u; j < TN; j++) ci[i * TN + j] = coopMatMulAdd(a[i], x[j], ci[i * TN + j]);
#ifdef HALVES
                [[unroll]] for (uint j = 0u; j < TN; j++) coopMatLoad(x[j], xh_t, (sn + j * CM_N) * RS + kw, RS, gl_CooperativeMatrixLayoutColumnMajor);
                [[unroll]] for (uint i = 0u; i < TM; i++)
                    [[unroll]] for (uint j = 0u; j < TN; j++) ch[i * TN + j] = coopMatMulAdd(a[i], x[j], ch[i * TN + j]);
#endif
            }
            // Block b's factors as matrices: the activation rows' down the columns, the weight
            // rows' along the rows.
            MAT_F xdm[TN], xsm[TN];
            [[unroll]] for (uint j = 0u; j < TN; j++) {
                COL_FACTORS(xdm[j], xd_t, b * BN + sn + j * CM_N);
#ifdef HAS_MIN
                COL_FACTORS(xsm[j], xsum_t, b * BN + sn + j * CM_N);
#endif
            }
            [[unroll]] for (uint i = 0u; i < TM; i++) {
                uint wrow = so + i * CM_M;
                MAT_F wd, wh, wm;
#ifndef FMT_I8ROW
                ROW_FACTORS(wd, wd_t, b * SUBS * BO + wrow);
#endif
#ifdef HALVES
                ROW_FACTORS(wh, wd_t, (b * SUBS + 1u) * BO + wrow);
#endif
#ifdef HAS_MIN
                ROW_FACTORS(wm, wm_t, b * BO + wrow);
#endif
                [[unroll]] for (uint j = 0u; j < TN; j++) {
                    uint t = i * TN + j;
#ifdef HALVES
                    acc[t] += block_scaled(ci[t], ch[t], xdm[j], xsm[j], wd, wh, wm);
#else
                    acc[t] += block_scaled(ci[t], ci[t], xdm[j], xsm[j], wd, wh, wm);
#endif
                }
            }
        }
        barrier();
    }
}
