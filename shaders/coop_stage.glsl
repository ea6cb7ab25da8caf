// coop_stage.glsl: the activation side of the cooperative GEMMs that coop_w.glsl's factors
// need beyond coop_q8.glsl's tile, and the scaling of a block's integer tiles by them
// (block_scaled); the blocks' sums of formats with offsets (xsum_t, HAS_MIN)
// and, for formats with a factor per 16 elements (HALVES), the tile split in two: xs_t holds
// the first half of each block (the second zeroed) and xh_t the second half, so one product
// with each gives the halves' integer sums.
// Included after coop_q8.glsl and coop_w.glsl.
// Must not: be used before coop_w.glsl has defined HAS_MIN and HALVES for the format.

#ifdef HAS_MIN
// The activation rows' block sums ([block][row]), beside coop_q8.glsl's xd_t.
shared float xsum_t[BLKS * BN];
#endif
#ifdef HALVES
shared i8vec4 xh_t[BN * RS];

void put_xh(uint r, uint u, uvec4 v) {
    uint b = r * RS + 4u * u;
    xh_t[b] = unpack8(int(v.x)); xh_t[b + 1u] = unpack8(int(v.y)); xh_t[b + 2u] = unpack8(int(v.z)); xh_t[b + 3u] = unpack8(int(v.w));
}
#endif

// Stages 16-byte unit u (half u % 2 of the stage's block u / 2) of activation row r.
void stage_x(uint r, uint u, uvec4 v) {
#ifdef HALVES
    bool hi = (u & 1u) != 0u;
    put_x(r, u, hi ? uvec4(0u) : v);
    put_xh(r, u, hi ? v : uvec4(0u));
#else
    put_x(r, u, v);
#endif
}

// Block b's integer tile ci (ch: its second half's, HALVES) of one accumulator as the CPU
// scales it: ci * (d * wd) (+ ch * (d * wh)) (+ wm * s), with the block's factors as
// matrices (coop_q8.glsl's COL_FACTORS / ROW_FACTORS: xdm the activation rows' d, xsm their
// sums; wd, wh, wm the weight rows' factors). Arguments a format does not have are ignored.
MAT_F block_scaled(MAT_I ci, MAT_I ch, MAT_F xdm, MAT_F xsm, MAT_F wd, MAT_F wh, MAT_F wm) {
#ifdef FMT_I8ROW
    return MAT_F(ci) * xdm;
#else
    MAT_F v = MAT_F(ci) * (xdm * wd);
#ifdef HALVES
    v += MAT_F(ch) * (xdm * wh);
#endif
#ifdef HAS_MIN
    v += wm * xsm;
#endif
    return v;
#endif
}
