//! The architecture specs built into the runtime (the files under `graphs/`, embedded at build
//! time), so a model loads from any directory. A spec file given in `EngineOptions::spec` wins.

use coli_compiler::{Diagnostics, Spec};
use std::path::{Path, PathBuf};

/// `(file name, text)` of every spec under `graphs/`.
pub const BUILTIN: &[(&str, &str)] = &[
    ("llama.ron", include_str!("../../../graphs/llama.ron")),
    ("olmoe.ron", include_str!("../../../graphs/olmoe.ron")),
    ("qwen3_moe.ron", include_str!("../../../graphs/qwen3_moe.ron")),
    ("mixtral.ron", include_str!("../../../graphs/mixtral.ron")),
    ("deepseek_v3.ron", include_str!("../../../graphs/deepseek_v3.ron")),
    ("qwen3_next.ron", include_str!("../../../graphs/qwen3_next.ron")),
    ("qwen3_5_moe.ron", include_str!("../../../graphs/qwen3_5_moe.ron")),
    ("kimi_linear.ron", include_str!("../../../graphs/kimi_linear.ron")),
    ("inkling.ron", include_str!("../../../graphs/inkling.ron")),
    ("gpt_oss.ron", include_str!("../../../graphs/gpt_oss.ron")),
    ("mimo_v2_flash.ron", include_str!("../../../graphs/mimo_v2_flash.ron")),
    ("deepseek_v32.ron", include_str!("../../../graphs/deepseek_v32.ron")),
    ("glm_moe_dsa.ron", include_str!("../../../graphs/glm_moe_dsa.ron")),
    ("deepseek_v4.ron", include_str!("../../../graphs/deepseek_v4.ron")),
];

/// Parses a built-in spec (its path reads `graphs/<name>` in messages).
pub fn builtin(name: &str, text: &str) -> Result<Spec, Diagnostics> {
    Spec::parse(text, &PathBuf::from("graphs").join(name))
}

/// The built-in spec serving architecture `arch` (an HF class or a GGUF architecture).
pub fn for_architecture(arch: &str) -> Option<Spec> {
    BUILTIN.iter().filter_map(|(n, t)| builtin(n, t).ok()).find(|s| s.serves(arch))
}

/// The names of the architectures the built-in specs serve, for messages.
pub fn served() -> Vec<String> {
    BUILTIN
        .iter()
        .filter_map(|(n, t)| builtin(n, t).ok())
        .flat_map(|s| s.file.serves.hf.iter().chain(&s.file.serves.gguf).cloned().collect::<Vec<_>>())
        .collect()
}

/// Loads the spec at `path`.
pub fn load(path: &Path) -> Result<Spec, Diagnostics> {
    Spec::load(path)
}
