//! The checkpoint's tensors a program never reads. A tensor of a layer that the spec does not
//! read is the mark of an option the spec does not serve (biases a configuration switched on,
//! a norm of a variant), which would otherwise run as a silently different model; the engine
//! warns with their names. Known companions are not counted: the file tensors behind a read
//! name (`Checkpoint::file_tensors_of`), RoPE frequency tables the engine computes itself, the
//! layers past the program's (multi-token-prediction layers), vision towers. Must not: refuse a
//! checkpoint (a warning only) or read any tensor's bytes.

use super::weights::visit_weights;
use crate::model::Checkpoint;
use coli_compiler::ir::{ExpertTensor, Op, Program};
use std::collections::HashSet;

/// The names of `ckpt`'s file tensors that `program` does not read and that are not known
/// companions, sorted.
pub fn unread(ckpt: &Checkpoint, program: &Program) -> Vec<String> {
    let mut read: HashSet<String> = HashSet::new();
    let ops = program.prologue.iter().chain(program.layers.iter().flat_map(|l| l.ops.iter())).chain(&program.epilogue);
    for op in ops {
        let mut experts: Vec<(ExpertTensor, usize)> = Vec::new();
        visit_weights(
            op,
            &mut |w, _| {
                read.insert(w.name.clone());
            },
            &mut |e, n| experts.push((e.clone(), n)),
        );
        for (e, n) in experts {
            for i in 0..n.max(1) {
                read.insert(e.name_of(i).0);
            }
        }
        if let Op::RoutedExperts { weights: w, .. } = op {
            read.extend([&w.gate_bias, &w.up_bias, &w.down_bias].into_iter().flatten().map(|b| b.name.clone()));
        }
    }
    let covered: HashSet<&str> = read.iter().flat_map(|n| ckpt.file_tensors_of(n)).collect();
    let layers = program.layers.len();
    let mut out: Vec<String> = ckpt
        .names()
        .filter(|n| !covered.contains(n) && !read.contains(*n) && !known_extra(n, layers))
        .map(String::from)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Tensors a checkpoint may hold beside what any spec reads.
fn known_extra(name: &str, layers: usize) -> bool {
    const EXTRA: [&str; 7] = [
        "rotary_emb.inv_freq",
        "rope_freqs.weight",
        "mtp.",
        "visual.",
        "vision_",
        "multi_modal_projector",
        "rope.freqs",
    ];
    if EXTRA.iter().any(|e| name.contains(e)) {
        return true;
    }
    // A layer past the program's: the multi-token-prediction layers DeepSeek and GLM append.
    let index = ["model.layers.", "model.language_model.layers.", "blk."]
        .iter()
        .find_map(|p| name.strip_prefix(p))
        .and_then(|rest| rest.split('.').next())
        .and_then(|i| i.parse::<usize>().ok());
    index.is_some_and(|i| i >= layers)
}

#[cfg(test)]
mod tests {
    use super::known_extra;

    #[test]
    fn layers_past_the_program_and_rope_tables_are_known_extras() {
        assert!(known_extra("model.layers.3.eh_proj.weight", 3));
        assert!(known_extra("blk.61.nextn.eh_proj.weight", 61));
        assert!(known_extra("rope_freqs.weight", 32));
        assert!(!known_extra("model.layers.2.self_attn.q_proj.bias", 3));
        assert!(!known_extra("model.norm.weight", 3));
    }
}
