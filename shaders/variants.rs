// The shader variant table: which GLSL sources under `shaders/` are compiled, once per
// weight-format define where a kernel is per-format, and a second time with `HW_DOT` for the
// formats with 8-bit activations. Included (`include!`) by `runtime/build.rs`, which embeds
// the committed SPIR-V under `shaders/spirv/`, by `tools/shaders` (the generator, which
// compiles it with shaderc) and by the runtime's staleness test. Plain constants and one
// hash function: no dependencies, nothing that touches the file system but `sources_hash`.

/// Shader sources: (Rust variant, file under shaders/, compiled once per weight-format variant).
pub const KERNELS: &[(&str, &str, bool)] = &[
    ("Matvec", "matvec.comp", true),
    ("Matmul", "matmul.comp", true),
    ("Embed", "embed.comp", true),
    ("QuantizeQ8", "quantize_q8.comp", false),
    ("QuantizeRows", "quantize_rows.comp", false),
    ("RmsNorm", "rms_norm.comp", false),
    ("Rope", "rope.comp", false),
    ("RopeKv", "rope_kv.comp", false),
    ("Glu", "glu.comp", false),
    ("Binary", "binary.comp", false),
    ("Route", "route.comp", false),
    ("AttnSplit", "attn_split.comp", false),
    ("AttnSeqs", "attn_seqs.comp", false),
    ("AttnBlock", "attn_block.comp", false),
    ("AttnPart", "attn_part.comp", false),
    ("MoeMatvec", "moe_matvec.comp", true),
    ("MoeMatmul", "moe_matmul.comp", true),
    ("MoeGroup", "moe_group.comp", false),
    ("MoeSum", "moe_sum.comp", false),
    ("MoeGluQ8", "moe_glu_q8.comp", false),
    ("MoePage", "moe_page.comp", false),
    ("DeltanetConv", "deltanet_conv.comp", false),
    ("DeltanetRule", "deltanet_rule.comp", false),
    ("KdaRule", "kda_rule.comp", false),
    ("MlaKv", "mla_kv.comp", false),
    ("MlaAbsorb", "mla_absorb.comp", true),
    ("MlaAttn", "mla_attn.comp", false),
    ("MlaValue", "mla_value.comp", true),
    ("MlaAttnSparse", "mla_attn_sparse.comp", false),
    ("DsaSelect", "dsa_select.comp", false),
    ("DsaScore", "dsa_score.comp", false),
    ("LayerNorm", "layer_norm.comp", false),
    ("MatmulCoop", "matmul_coop.comp", true),
    ("MoeMatmulCoop", "moe_matmul_coop.comp", true),
    ("AttnCoop", "attn_coop.comp", false),
    ("HyperPre", "hyper_pre.comp", false),
    ("HyperPost", "hyper_post.comp", false),
    ("GroupCols", "group_cols.comp", false),
    ("AttnCompressed", "attn_compressed.comp", false),
    ("CompressPool", "compress_pool.comp", false),
];

/// Kernels compiled a second time with `KV_F16` (`shaders/kv_type.glsl`: an attention layer's
/// K/V mirror and read-back rows in 16-bit floats): (Rust variant of the twin, the source's
/// variant in `KERNELS`). The twin's blob is the source's stem and `_kv16`.
pub const KV16_KERNELS: &[(&str, &str)] = &[
    ("AttnSplit16", "AttnSplit"),
    ("AttnSeqs16", "AttnSeqs"),
    ("AttnBlock16", "AttnBlock"),
    ("AttnPart16", "AttnPart"),
    ("AttnCoop16", "AttnCoop"),
    ("RopeKv16", "RopeKv"),
];

/// Weight-format variants: (Rust variant of `FormatVariant`, the defines the sources test).
/// `I8RowF` is `I8Row` with f32 activations (rows whose length is not a multiple of 32, which
/// the CPU also multiplies in f32). The `*Exact` variants keep f32 activations for an integer
/// format (the CPU's `Precision::Exact`). `FP8_E4M3` always keeps f32 activations (its codes
/// are floats, as on the CPU), so it has no `*Exact` twin and no `HW_DOT` or cooperative build.
pub const FORMATS: &[(&str, &[&str])] = &[
    ("F32", &["FMT_F32"]),
    ("F16", &["FMT_F16"]),
    ("BF16", &["FMT_BF16"]),
    ("Q8_0", &["FMT_Q8_0"]),
    ("Q4_0", &["FMT_Q4_0"]),
    ("Q4_1", &["FMT_Q4_1"]),
    ("Q4_K", &["FMT_Q4_K"]),
    ("Q6_K", &["FMT_Q6_K"]),
    ("I8Row", &["FMT_I8ROW"]),
    ("I8RowF", &["FMT_I8ROW_F"]),
    ("I4G64", &["FMT_I4G64"]),
    ("Q5_0", &["FMT_Q5_0"]),
    ("Q5_1", &["FMT_Q5_1"]),
    ("Q2_K", &["FMT_Q2_K"]),
    ("Q3_K", &["FMT_Q3_K"]),
    ("Q5_K", &["FMT_Q5_K"]),
    ("IQ4_NL", &["FMT_IQ4_NL"]),
    ("IQ4_XS", &["FMT_IQ4_XS"]),
    ("MXFP4", &["FMT_MXFP4"]),
    ("IQ2_XXS", &["FMT_IQ2_XXS"]),
    ("IQ2_XS", &["FMT_IQ2_XS"]),
    ("IQ2_S", &["FMT_IQ2_S"]),
    ("IQ3_XXS", &["FMT_IQ3_XXS"]),
    ("IQ3_S", &["FMT_IQ3_S"]),
    ("IQ1_S", &["FMT_IQ1_S"]),
    ("IQ1_M", &["FMT_IQ1_M"]),
    ("FP8_E4M3", &["FMT_FP8_E4M3", "ACTS_F32"]),
    ("Q8_0Exact", &["FMT_Q8_0", "ACTS_F32"]),
    ("Q4_0Exact", &["FMT_Q4_0", "ACTS_F32"]),
    ("Q4_1Exact", &["FMT_Q4_1", "ACTS_F32"]),
    ("Q4_KExact", &["FMT_Q4_K", "ACTS_F32"]),
    ("Q6_KExact", &["FMT_Q6_K", "ACTS_F32"]),
    ("I8RowExact", &["FMT_I8ROW", "ACTS_F32"]),
    ("I4G64Exact", &["FMT_I4G64", "ACTS_F32"]),
    ("Q5_0Exact", &["FMT_Q5_0", "ACTS_F32"]),
    ("Q5_1Exact", &["FMT_Q5_1", "ACTS_F32"]),
    ("Q2_KExact", &["FMT_Q2_K", "ACTS_F32"]),
    ("Q3_KExact", &["FMT_Q3_K", "ACTS_F32"]),
    ("Q5_KExact", &["FMT_Q5_K", "ACTS_F32"]),
    ("IQ4_NLExact", &["FMT_IQ4_NL", "ACTS_F32"]),
    ("IQ4_XSExact", &["FMT_IQ4_XS", "ACTS_F32"]),
    ("MXFP4Exact", &["FMT_MXFP4", "ACTS_F32"]),
    ("IQ2_XXSExact", &["FMT_IQ2_XXS", "ACTS_F32"]),
    ("IQ2_XSExact", &["FMT_IQ2_XS", "ACTS_F32"]),
    ("IQ2_SExact", &["FMT_IQ2_S", "ACTS_F32"]),
    ("IQ3_XXSExact", &["FMT_IQ3_XXS", "ACTS_F32"]),
    ("IQ3_SExact", &["FMT_IQ3_S", "ACTS_F32"]),
    ("IQ1_SExact", &["FMT_IQ1_S", "ACTS_F32"]),
    ("IQ1_MExact", &["FMT_IQ1_M", "ACTS_F32"]),
];

/// The format variants whose shaders take 8-bit activations: compiled a second time with
/// `HW_DOT` (the device's packed 4x8-bit integer dot product, `GL_EXT_integer_dot_product`)
/// for devices that have it.
pub const DOT_FORMATS: &[&str] = &[
    "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K", "I8Row", "I4G64", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K", "IQ4_NL", "IQ4_XS",
    "MXFP4", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M",
];

/// The cooperative-matrix kernels (int8 tensor cores): per-format, but compiled only for the
/// formats of `COOP_FORMATS` (`shaders/coop_w.glsl` decodes their blocks), never with `HW_DOT`.
pub const COOP_KERNELS: &[&str] = &["MatmulCoop", "MoeMatmulCoop"];

/// The format variants the cooperative kernels are compiled for: every format with 8-bit
/// activations except Q2_K (an offset per 16 elements, which the kernels' per-block sums do
/// not carry). The grid formats decode their lattice from shared memory beside the tiles (at
/// most 4 KiB: the MoE kernel stays within 48 KiB).
pub const COOP_FORMATS: &[&str] = &[
    "I8Row", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "I4G64", "Q4_K", "Q5_K", "Q6_K", "Q3_K", "IQ4_NL", "IQ4_XS", "MXFP4",
    "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M",
];

/// One compiled blob: its file stem under `shaders/spirv/`, the kernel, the format variant
/// (per-format kernels), the defines it is compiled with, and whether it is the `HW_DOT` build.
pub struct Blob {
    pub name: String,
    pub kernel: &'static str,
    pub file: &'static str,
    pub variant: Option<&'static str>,
    pub defines: Vec<&'static str>,
    pub dot: bool,
}

/// Every blob of the table, in table order.
pub fn blobs() -> Vec<Blob> {
    let mut out = Vec::new();
    for &(kernel, file, per_format) in KERNELS {
        let stem = file.trim_end_matches(".comp");
        if !per_format {
            out.push(Blob { name: stem.to_string(), kernel, file, variant: None, defines: Vec::new(), dot: false });
            if let Some(&(twin, _)) = KV16_KERNELS.iter().find(|(_, k)| *k == kernel) {
                let name = format!("{stem}_kv16");
                out.push(Blob { name, kernel: twin, file, variant: None, defines: vec!["KV_F16"], dot: false });
            }
            continue;
        }
        let coop = COOP_KERNELS.contains(&kernel);
        for &(v, defines) in FORMATS {
            if coop && !COOP_FORMATS.contains(&v) {
                continue;
            }
            let name = format!("{stem}_{}", v.to_lowercase());
            out.push(Blob { name: name.clone(), kernel, file, variant: Some(v), defines: defines.to_vec(), dot: false });
            if !coop && DOT_FORMATS.contains(&v) {
                let defines = defines.iter().copied().chain(["HW_DOT"]).collect();
                out.push(Blob { name: format!("{name}_dot"), kernel, file, variant: Some(v), defines, dot: true });
            }
        }
    }
    out
}

/// FNV-1a (64 bits) over the names and contents of every `.comp` and `.glsl` file in `dir`
/// and of this table, in name order: what the committed SPIR-V was compiled from. Line ends
/// are normalized (`\r\n` counts as `\n`) so a checkout's conversion does not change it.
pub fn sources_hash(dir: &std::path::Path) -> std::io::Result<u64> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".comp") || name.ends_with(".glsl") || name == "variants.rs" {
            names.push(name);
        }
    }
    names.sort();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for name in names {
        let text = std::fs::read_to_string(dir.join(&name))?.replace("\r\n", "\n");
        feed(name.as_bytes());
        feed(&[0]);
        feed(text.as_bytes());
        feed(&[0]);
    }
    Ok(h)
}
