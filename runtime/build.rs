//! Compiles the GLSL compute shaders under `shaders/` to SPIR-V with shaderc at build time and
//! writes `$OUT_DIR/shaders.rs`: the `Kernel` enum (one variant per shader source), the table of
//! weight-format variants (one source, one `#define` per format), and `spirv(kernel, variant)`
//! returning the embedded words (`include_bytes!`), so the engine needs neither shaderc nor glslc
//! at run time.
//!
//! shaderc is built from the crate's vendored sources (`build-from-source`: cmake, ninja, a C++
//! compiler and python3; several minutes, once per target directory): the cooperative-matrix
//! kernels need `GL_KHR_cooperative_matrix`, which Debian 12's system glslang (11.13) rejects.
//!
//! Must not: read anything outside `shaders/`, or decide at build time anything the device
//! decides at run time (workgroup and subgroup sizes are specialization constants).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Shader sources: (Rust variant, file under shaders/, compiled once per weight-format variant).
const KERNELS: &[(&str, &str, bool)] = &[
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
    ("AttnBlock", "attn_block.comp", false),
    ("AttnPart", "attn_part.comp", false),
    ("MoeMatvec", "moe_matvec.comp", true),
    ("MoeMatmul", "moe_matmul.comp", true),
    ("MoeGroup", "moe_group.comp", false),
    ("MoeSum", "moe_sum.comp", false),
    ("DeltanetConv", "deltanet_conv.comp", false),
    ("DeltanetRule", "deltanet_rule.comp", false),
    ("MlaKv", "mla_kv.comp", false),
    ("MlaAbsorb", "mla_absorb.comp", true),
    ("MlaAttn", "mla_attn.comp", false),
    ("MlaValue", "mla_value.comp", true),
    ("MatmulCoop", "matmul_coop.comp", false),
    ("MoeMatmulCoop", "moe_matmul_coop.comp", false),
];

/// Weight-format variants: (Rust variant of `FormatVariant`, the defines the sources test).
/// `I8RowF` is `I8Row` with f32 activations (rows whose length is not a multiple of 32, which
/// the CPU also multiplies in f32). The `*Exact` variants keep f32 activations for an integer
/// format (the CPU's `Precision::Exact`).
const FORMATS: &[(&str, &[&str])] = &[
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
    ("Q8_0Exact", &["FMT_Q8_0", "ACTS_F32"]),
    ("Q4_0Exact", &["FMT_Q4_0", "ACTS_F32"]),
    ("Q4_1Exact", &["FMT_Q4_1", "ACTS_F32"]),
    ("Q4_KExact", &["FMT_Q4_K", "ACTS_F32"]),
    ("Q6_KExact", &["FMT_Q6_K", "ACTS_F32"]),
    ("I8RowExact", &["FMT_I8ROW", "ACTS_F32"]),
    ("I4G64Exact", &["FMT_I4G64", "ACTS_F32"]),
];

/// The format variants whose shaders take 8-bit activations: compiled a second time with
/// `HW_DOT` (the device's packed 4x8-bit integer dot product, `GL_EXT_integer_dot_product`)
/// for devices that have it; `spirv_dot` returns those.
const DOT_FORMATS: &[&str] = &["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K", "I8Row", "I4G64"];

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shaders");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    println!("cargo:rerun-if-changed={}", root.display());
    for entry in std::fs::read_dir(&root).expect("shaders/ is readable") {
        println!("cargo:rerun-if-changed={}", entry.unwrap().path().display());
    }
    let compiler = shaderc::Compiler::new().expect("shaderc initializes");
    let mut failures = Vec::new();
    let mut arms = String::new();
    let mut dot_arms = String::new();
    for &(kernel, file, per_format) in KERNELS {
        let path = root.join(file);
        let source = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let variants: Vec<(Option<&str>, &[&str])> =
            if per_format { FORMATS.iter().map(|&(v, d)| (Some(v), d)).collect() } else { vec![(None, &[])] };
        for (variant, defines) in variants {
            let name = match variant {
                Some(v) => format!("{}_{}", file.trim_end_matches(".comp"), v.to_lowercase()),
                None => file.trim_end_matches(".comp").to_string(),
            };
            match compile(&compiler, &root, file, &source, defines) {
                Ok(words) => {
                    let spv = out.join(format!("{name}.spv"));
                    std::fs::write(&spv, words).unwrap();
                    let pat = match variant {
                        Some(v) => format!("(Kernel::{kernel}, Some(FormatVariant::{v}))"),
                        None => format!("(Kernel::{kernel}, None)"),
                    };
                    writeln!(arms, "        {pat} => Some(include_bytes!({:?})),", spv.display().to_string()).unwrap();
                }
                Err(e) => failures.push(format!("{name}: {e}")),
            }
            if variant.is_some_and(|v| DOT_FORMATS.contains(&v)) {
                let with_dot: Vec<&str> = defines.iter().copied().chain(["HW_DOT"]).collect();
                match compile(&compiler, &root, file, &source, &with_dot) {
                    Ok(words) => {
                        let spv = out.join(format!("{name}_dot.spv"));
                        std::fs::write(&spv, words).unwrap();
                        let v = variant.expect("checked");
                        writeln!(
                            dot_arms,
                            "        (Kernel::{kernel}, Some(FormatVariant::{v})) => Some(include_bytes!({:?})),",
                            spv.display().to_string()
                        )
                        .unwrap();
                    }
                    Err(e) => failures.push(format!("{name} (HW_DOT): {e}")),
                }
            }
        }
    }
    if !failures.is_empty() {
        panic!("shader compilation failed:\n{}", failures.join("\n"));
    }
    let mut gen = String::new();
    gen.push_str("/// A compute shader source under `shaders/` (generated from the table in `build.rs`).\n");
    gen.push_str("#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]\npub enum Kernel {\n");
    for &(k, file, _) in KERNELS {
        writeln!(gen, "    /// `shaders/{file}`").unwrap();
        writeln!(gen, "    {k},").unwrap();
    }
    gen.push_str("}\n\nimpl Kernel {\n    /// Whether the shader is compiled once per `FormatVariant`.\n");
    gen.push_str("    pub fn per_format(self) -> bool {\n        match self {\n");
    for &(k, _, pf) in KERNELS {
        writeln!(gen, "            Kernel::{k} => {pf},").unwrap();
    }
    gen.push_str("        }\n    }\n}\n\n");
    gen.push_str("/// The weight-format variants a per-format shader is compiled for.\n");
    gen.push_str("#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]\n#[allow(non_camel_case_types)]\npub enum FormatVariant {\n");
    for &(v, d) in FORMATS {
        writeln!(gen, "    /// compiled with `{}`", d.join(", ")).unwrap();
        writeln!(gen, "    {v},").unwrap();
    }
    gen.push_str("}\n\n/// The SPIR-V of a kernel (and its variant), as bytes.\n");
    gen.push_str("pub fn spirv(kernel: Kernel, variant: Option<FormatVariant>) -> Option<&'static [u8]> {\n    match (kernel, variant) {\n");
    gen.push_str(&arms);
    gen.push_str("        _ => None,\n    }\n}\n\n");
    gen.push_str(
        "/// The SPIR-V of a kernel variant built with `HW_DOT` (the device's integer dot product), if any.\n",
    );
    gen.push_str("pub fn spirv_dot(kernel: Kernel, variant: Option<FormatVariant>) -> Option<&'static [u8]> {\n    match (kernel, variant) {\n");
    gen.push_str(&dot_arms);
    gen.push_str("        _ => None,\n    }\n}\n");
    std::fs::write(out.join("shaders.rs"), gen).unwrap();
}

fn compile(
    compiler: &shaderc::Compiler,
    root: &Path,
    file: &str,
    source: &str,
    defines: &[&str],
) -> Result<Vec<u8>, String> {
    let mut opts = shaderc::CompileOptions::new().map_err(|e| e.to_string())?;
    opts.set_target_env(shaderc::TargetEnv::Vulkan, shaderc::EnvVersion::Vulkan1_2 as u32);
    opts.set_target_spirv(shaderc::SpirvVersion::V1_5);
    opts.set_optimization_level(shaderc::OptimizationLevel::Performance);
    for d in defines {
        opts.add_macro_definition(d, Some("1"));
    }
    let root = root.to_path_buf();
    opts.set_include_callback(move |name, _ty, _from, _depth| {
        let path = root.join(name);
        let content = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(shaderc::ResolvedInclude { resolved_name: path.display().to_string(), content })
    });
    let art = compiler
        .compile_into_spirv(source, shaderc::ShaderKind::Compute, file, "main", Some(&opts))
        .map_err(|e| e.to_string())?;
    Ok(art.as_binary_u8().to_vec())
}
