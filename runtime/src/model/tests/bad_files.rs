//! Hostile and damaged checkpoint files, built here: each must be a typed `LoadError` naming
//! the file (and the tensor, where there is one), with a message of a sane length; nothing may
//! read another tensor's bytes, block, allocate what the file cannot hold, or crash.
//!
//! Must not: depend on real checkpoints (those are in `mod.rs`).

use super::*;
use serde_json::json;

/// A safetensors file from a raw header (any offsets) and the data section.
fn st_raw(header: serde_json::Value, data: &[u8]) -> Vec<u8> {
    let h = serde_json::to_vec(&header).unwrap();
    let mut b = (h.len() as u64).to_le_bytes().to_vec();
    b.extend(h);
    b.extend(data);
    b
}

#[test]
fn safetensors_overlapping_ranges_are_refused() {
    let d = st_dir(&[]);
    // The embedding's range covers the norm's bytes: before, each read the other's data.
    let header = json!({
        "embed.weight": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "norm.weight": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},
    });
    write(d.path(), "model.safetensors", &st_raw(header, &[0u8; 16]));
    let e = open(d.path()).unwrap_err();
    match &e {
        LoadError::Overlap { name, other, range, other_range, .. } => {
            assert_eq!((name.as_str(), other.as_str()), ("embed.weight", "norm.weight"));
            assert_eq!(other_range.0 - range.0, 8);
        }
        _ => panic!("{e}"),
    }
    assert!(e.to_string().contains("model.safetensors") && e.to_string().contains("embed.weight"), "{e}");
    // The same range twice overlaps too; empty tensors anywhere and ranges that touch do not.
    let header = json!({
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
    });
    write(d.path(), "model.safetensors", &st_raw(header, &[0u8; 8]));
    assert!(matches!(open(d.path()), Err(LoadError::Overlap { .. })));
    let header = json!({
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},
        "e": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},
    });
    write(d.path(), "model.safetensors", &st_raw(header, &[0u8; 16]));
    assert_eq!(open(d.path()).unwrap().names().count(), 3);
}

#[test]
fn safetensors_end_offset_near_2_64_is_reported_unwrapped() {
    let d = st_dir(&[]);
    let header = json!({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, u64::MAX]}});
    let b = st_raw(header, &[0u8; 8]);
    let header_len = b.len() as u128 - 8;
    write(d.path(), "model.safetensors", &b);
    let e = open(d.path()).unwrap_err();
    match &e {
        LoadError::TensorPastEnd { end, .. } => assert_eq!(*end, header_len + u64::MAX as u128),
        _ => panic!("{e}"),
    }
    assert!(e.to_string().contains(&(header_len + u64::MAX as u128).to_string()), "{e}");
}
