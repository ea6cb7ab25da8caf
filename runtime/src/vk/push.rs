//! Push constants: one `#[repr(C)]` struct per shader `layout(push_constant)` block, its fields
//! named, typed and ordered as the GLSL declares them (`uint` is `u32`, `int` `i32`, `float`
//! `f32`; pads kept), and the kernels each is pushed to. `Frame::dispatch` takes one and
//! refuses a kernel it is not declared for; `PUSH_LAYOUTS` lists every struct's name, size and
//! fields so that a test can hold them against the shader sources (`runtime/tests/vk_push.rs`).
//!
//! Must not: hold anything but 4-byte scalars (a struct's bytes are pushed as they lie in
//! memory, zero-extended to the pipeline layout's `PUSH_BYTES`).

use super::pipeline::PUSH_BYTES;
use super::shaders::Kernel;

/// A push-constant field type.
///
/// # Safety
/// The type is 4 bytes with 4-byte alignment and every bit pattern is a valid value, so a
/// `#[repr(C)]` struct of such fields has no padding and its bytes are all initialized.
pub(crate) unsafe trait Scalar: Copy {
    /// The type as GLSL spells it.
    const GLSL: &'static str;
}

// SAFETY: 4-byte plain integers and floats.
unsafe impl Scalar for u32 {
    const GLSL: &'static str = "uint";
}
// SAFETY: as above.
unsafe impl Scalar for i32 {
    const GLSL: &'static str = "int";
}
// SAFETY: as above.
unsafe impl Scalar for f32 {
    const GLSL: &'static str = "float";
}

/// A push-constant struct as a table: what tests compare with the shader sources.
#[derive(Clone, Copy, Debug)]
pub struct PushLayout {
    /// The Rust struct's name.
    pub name: &'static str,
    /// The kernels it is pushed to (the shaders whose block it mirrors).
    pub kernels: &'static [Kernel],
    /// `size_of` the struct, in bytes.
    pub size: usize,
    /// (name, GLSL type) per field, in declaration order; a name that is a Rust keyword keeps
    /// its `r#` prefix.
    pub fields: &'static [(&'static str, &'static str)],
}

/// A kernel's push constants.
///
/// # Safety
/// The type is `#[repr(C)]`, made only of `Scalar` fields, and at most `PUSH_BYTES` long
/// (`push_blocks!` checks all three for the structs it defines).
pub(crate) unsafe trait PushConstants: Copy {
    /// The struct's table.
    const LAYOUT: PushLayout;

    /// The struct's bytes, as the shader reads them.
    fn bytes(&self) -> &[u8] {
        // SAFETY: by the trait's contract the value is `size_of::<Self>()` initialized bytes
        // with no padding; the slice borrows `self`.
        unsafe { std::slice::from_raw_parts((self as *const Self).cast::<u8>(), std::mem::size_of::<Self>()) }
    }
}

/// Defines each push-constant struct with its `PushConstants` impl, and `PUSH_LAYOUTS` over
/// them all.
macro_rules! push_blocks {
    ($($(#[$meta:meta])* $name:ident for [$($kernel:ident),+] { $($field:ident: $ty:ty),+ $(,)? })+) => {
        $(
            $(#[$meta])*
            #[repr(C)]
            #[derive(Clone, Copy, Debug)]
            pub(crate) struct $name {
                $(pub $field: $ty),+
            }

            const _: () = assert!(std::mem::size_of::<$name>() <= PUSH_BYTES as usize);

            // SAFETY: `#[repr(C)]`, every field is a `Scalar` (`<$ty as Scalar>` below does not
            // compile otherwise) and the size is checked against `PUSH_BYTES` above.
            unsafe impl PushConstants for $name {
                const LAYOUT: PushLayout = PushLayout {
                    name: stringify!($name),
                    kernels: &[$(Kernel::$kernel),+],
                    size: std::mem::size_of::<$name>(),
                    fields: &[$((stringify!($field), <$ty as Scalar>::GLSL)),+],
                };
            }
        )+

        /// Every push-constant struct's table.
        pub const PUSH_LAYOUTS: &[PushLayout] = &[$(<$name as PushConstants>::LAYOUT),+];
    };
}

push_blocks! {
    /// Mirrors `matvec.comp`'s push block.
    MatvecPush for [Matvec] {
        rows: u32, cols: u32, qs: u32, ss: u32,
        x_off: u32, out_off: u32, out_stride: u32, n: u32,
        in_mode: u32, aux_off: u32, p0: f32, p1: f32,
        res_on: u32, res_off: u32, ksplit: u32, pad1: u32,
    }

    /// Mirrors the push block of `matmul.comp` and `matmul_coop.comp`.
    MatmulPush for [Matmul, MatmulCoop] {
        rows: u32, cols: u32, qs: u32, ss: u32,
        x_off: u32, out_off: u32, out_stride: u32, n: u32,
        in_mode: u32, aux_off: u32, p0: f32, p1: f32,
        res_on: u32, res_off: u32, pad0: u32, pad1: u32,
    }

    /// Mirrors `embed.comp`'s push block.
    EmbedPush for [Embed] {
        rows: u32, cols: u32, qs: u32, ss: u32,
        out_off: u32, scale: f32, pad0: u32, pad1: u32,
    }

    /// Mirrors `quantize_q8.comp`'s push block.
    QuantizeQ8Push for [QuantizeQ8] {
        blocks: u32, cols: u32, x_off: u32, pad: u32,
    }

    /// Mirrors `quantize_rows.comp`'s push block.
    QuantizeRowsPush for [QuantizeRows] {
        rows: u32, cols: u32, x_off: u32, in_mode: u32,
        aux_off: u32, p0: f32, p1: f32, pad: u32,
    }

    /// Mirrors `rms_norm.comp`'s push block.
    RmsNormPush for [RmsNorm] {
        width: u32, group: u32, eps: f32, offset: f32,
        x_off: u32, out_off: u32, width2: u32, group2: u32,
        x2_off: u32, out2_off: u32, scale: f32, unweighted: u32,
    }

    /// Mirrors `rope.comp`'s push block.
    RopePush for [Rope] {
        n: u32, width: u32, heads: u32, head_dim: u32,
        half_: u32, interleaved: u32, pos0: u32, mscale: f32,
        x_off: u32, r#dyn: u32, skip: u32, inverse: u32,
    }

    /// Mirrors `rope_kv.comp`'s push block.
    RopeKvPush for [RopeKv] {
        n: u32, heads: u32, kv_heads: u32, head_dim: u32,
        v_head_dim: u32, half_: u32, interleaved: u32, pos0: u32,
        mscale: f32, q_off: u32, k_off: u32, v_off: u32,
        r#dyn: u32, has_q: u32, ring: u32, no_back: u32,
    }

    /// Mirrors `glu.comp`'s push block.
    GluPush for [Glu] {
        count: u32, kind: u32, limit: f32, alpha: f32,
        g_off: u32, u_off: u32, o_off: u32, pad: u32,
    }

    /// Mirrors `binary.comp`'s push block.
    BinaryPush for [Binary] {
        count: u32, width: u32, op: u32, bmode: u32,
        a_off: u32, b_off: u32, o_off: u32, pad: u32,
    }

    /// Mirrors `route.comp`'s push block.
    RoutePush for [Route] {
        n: u32, top_k: u32, scoring: u32, renormalize: u32,
        has_bias: u32, n_group: u32, topk_group: u32, scale: f32,
        l_off: u32, o_off: u32, group_max: u32, hash: u32,
        vocab: u32, t_off: u32, shared_: u32, has_scale_by: u32,
    }

    /// Mirrors `attn.glsl`'s push block (`attn_split.comp`, `attn_seqs.comp`, `attn_block.comp`).
    AttnPush for [AttnSplit, AttnSeqs, AttnBlock, AttnCoop] {
        n: u32, heads: u32, kv_heads: u32, head_dim: u32,
        v_head_dim: u32, pos0: u32, window: u32, flags: u32,
        scale: f32, q_off: u32, k_off: u32, v_off: u32,
        o_off: u32, splits: u32, chunk: u32, value_scale: f32,
        ring: u32, pad0: u32, pad1: u32, pad2: u32,
    }

    /// Mirrors `attn_part.comp`'s push block.
    AttnPartPush for [AttnPart] {
        n: u32, heads: u32, kv_heads: u32, head_dim: u32,
        v_head_dim: u32, pos0: u32, window: u32, r#dyn: u32,
        scale: f32, q_off: u32, ring: u32, positions: u32,
        block: u32, acc_off: u32, ml_off: u32, pad0: u32,
    }

    /// Mirrors `moe_matvec.comp`'s push block.
    MoeMatvecPush for [MoeMatvec] {
        rows: u32, cols: u32, qs: u32, ss: u32,
        x_off: u32, out_off: u32, r_off: u32, top_k: u32,
        experts: u32, mode: u32, glu: u32, limit: f32,
        alpha: f32, bias_off: u32, res_on: u32, res_off: u32,
        route: u32, l_off: u32, rscale: f32, hq_on: u32,
    }

    /// Mirrors the push block of `moe_matmul.comp` and `moe_matmul_coop.comp`.
    MoeMatmulPush for [MoeMatmul, MoeMatmulCoop] {
        rows: u32, cols: u32, qs: u32, ss: u32,
        x_off: u32, out_off: u32, top_k: u32, experts: u32,
        mode: u32, glu: u32, limit: f32, alpha: f32,
        bias_off: u32, pad0: u32, pad1: u32, pad2: u32,
    }

    /// Mirrors `moe_glu_q8.comp`'s push block.
    MoeGluQ8Push for [MoeGluQ8] {
        blocks: u32, ffn: u32, top_k: u32, experts: u32,
        r_off: u32, glu: u32, limit: f32, alpha: f32,
        bias_off: u32, pad0: u32, pad1: u32, pad2: u32,
    }

    /// Mirrors `moe_group.comp`'s push block.
    MoeGroupPush for [MoeGroup] {
        n: u32, top_k: u32, experts: u32, r_off: u32,
    }

    /// Mirrors `moe_page.comp`'s push block.
    MoePagePush for [MoePage] {
        pairs: u32, r_off: u32, base: u32, count: u32,
    }

    /// Mirrors `moe_sum.comp`'s push block.
    MoeSumPush for [MoeSum] {
        n: u32, hidden: u32, top_k: u32, experts: u32,
        r_off: u32, out_off: u32, res_on: u32, res_off: u32,
    }

    /// Mirrors `deltanet_conv.comp`'s push block.
    DeltanetConvPush for [DeltanetConv] {
        n: u32, nk: u32, nv: u32, dk: u32,
        dv: u32, kk: u32, p_off: u32, ring_off: u32,
        conv_off: u32, planar: u32, scale: f32, pad2: u32,
    }

    /// Mirrors `deltanet_rule.comp`'s push block.
    DeltanetRulePush for [DeltanetRule] {
        n: u32, nk: u32, nv: u32, dk: u32,
        dv: u32, eps: f32, state_off: u32, conv_off: u32,
        p_off: u32, ba_off: u32, out_off: u32, apart: u32,
    }

    /// Mirrors `kda_rule.comp`'s push block.
    KdaRulePush for [KdaRule] {
        n: u32, heads: u32, d: u32, eps: f32,
        state_off: u32, conv_off: u32, f_off: u32, g_off: u32,
        b_off: u32, out_off: u32, pad0: u32, pad1: u32,
    }

    /// Mirrors `mla_kv.comp`'s push block.
    MlaKvPush for [MlaKv] {
        n: u32, heads: u32, dn: u32, dr: u32,
        c: u32, eps: f32, interleaved: u32, pos0: u32,
        mscale: f32, ckv_off: u32, q_off: u32, dyn_pos: u32,
        no_back: u32,
    }

    /// Mirrors `mla_absorb.comp`'s push block.
    MlaAbsorbPush for [MlaAbsorb] {
        n: u32, heads: u32, dn: u32, dr: u32,
        dv: u32, c: u32, qs: u32, ss: u32,
        q_off: u32, out_off: u32, pad0: u32, pad1: u32,
    }

    /// Mirrors the push block of `mla_attn.comp` and `mla_attn_sparse.comp` (`mla_attn.glsl`;
    /// `topk` and `s_off` the selection's, 0 without one; `group` heads a workgroup, `splits`
    /// workgroups a row's positions).
    MlaAttnPush for [MlaAttn, MlaAttnSparse] {
        n: u32, heads: u32, dn: u32, dr: u32,
        c: u32, pos0: u32, scale: f32, q_off: u32,
        l_off: u32, dyn_pos: u32, topk: u32, s_off: u32,
        group: u32, splits: u32, pad0: u32, pad1: u32,
    }

    /// Mirrors `dsa_score.comp`'s push block.
    DsaScorePush for [DsaScore] {
        n: u32, heads: u32, dim: u32, pos0: u32,
        stride: u32, scale: f32, w_scale: f32, q_off: u32,
        w_off: u32, r#dyn: u32, rate: u32, pad1: u32,
    }

    /// Mirrors `dsa_select.comp`'s push block.
    DsaSelectPush for [DsaSelect] {
        n: u32, pos0: u32, topk: u32, stride: u32,
        o_off: u32, r#dyn: u32, rate: u32, pad1: u32,
    }

    /// Mirrors `layer_norm.comp`'s push block.
    LayerNormPush for [LayerNorm] {
        width: u32, eps: f32, x_off: u32, out_off: u32,
        has_bias: u32, pad0: u32, pad1: u32, pad2: u32,
    }

    /// Mirrors `mla_value.comp`'s push block.
    MlaValuePush for [MlaValue] {
        n: u32, heads: u32, dn: u32, dv: u32,
        c: u32, qs: u32, ss: u32, x_off: u32,
        out_off: u32, pad0: u32, pad1: u32, pad2: u32,
    }

    /// Mirrors `hyper_pre.comp`'s push block.
    HyperPrePush for [HyperPre] {
        streams: u32, hidden: u32, rows: u32, mix_on: u32,
        iters: u32, eps: f32, norm_eps: f32, x_off: u32,
        out_off: u32, mix_off: u32, phase: u32, pad1: u32,
    }

    /// Mirrors `hyper_post.comp`'s push block.
    HyperPostPush for [HyperPost] {
        n: u32, streams: u32, hidden: u32, mix_on: u32,
        in_place: u32, x_off: u32, res_off: u32, mix_off: u32,
        out_off: u32, pad0: u32, pad1: u32, pad2: u32,
    }

    /// Mirrors `group_cols.comp`'s push block.
    GroupColsPush for [GroupCols] {
        n: u32, groups: u32, cols: u32, x_off: u32,
        out_off: u32, pad0: u32, pad1: u32, pad2: u32,
    }

    /// Mirrors `attn_compressed.comp`'s push block.
    AttnCompressedPush for [AttnCompressed] {
        n: u32, heads: u32, dim: u32, pos0: u32,
        window: u32, rate: u32, scale: f32, q_off: u32,
        o_off: u32, r#dyn: u32, topk: u32, s_off: u32,
        has_sinks: u32, ring: u32, pad1: u32, pad2: u32,
    }

    /// Mirrors `compress_pool.comp`'s push block.
    CompressPoolPush for [CompressPool] {
        dim: u32, half_: u32, rate: u32, overlap: u32,
        e0: u32, count: u32, rope_dim: u32, eps: f32,
        mscale: f32, pad0: u32, pad1: u32, pad2: u32,
    }
}
