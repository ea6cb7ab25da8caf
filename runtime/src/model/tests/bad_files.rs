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

/// The byte offset of the tensor info of `name` (its name's length field) in a GGUF file.
fn info_at(b: &[u8], name: &str) -> usize {
    let mut pat = (name.len() as u64).to_le_bytes().to_vec();
    pat.extend(name.as_bytes());
    b.windows(pat.len()).position(|w| w == pat).unwrap()
}

/// A message fit to print: one short line of printable characters.
fn assert_sane(e: &LoadError) {
    let m = e.to_string();
    assert!(m.len() < 600, "{} bytes: {}...", m.len(), &m[..300]);
    assert!(!m.chars().any(|c| c.is_control()), "{m:?}");
}

#[test]
fn gguf_misread_tensor_info_gives_a_short_message() {
    // Tensor `a` says it has no dimensions but its writer put one: every field after it is
    // read one step off, and `c`'s name length is read from `a`'s offset (600000), which the
    // file can hold. Before, that made a 600 kB "name" of raw bytes, printed in the error.
    let big = vec![0x1bu8; 600_000];
    let tensors =
        [("big", vec![600_000], 24u32, big), ("a", vec![16], 0, vec![0u8; 64]), ("c", vec![4], 0, vec![0; 16])];
    let mut b = gguf_bytes(3, &[], &tensors, 32);
    let n_dims_at = info_at(&b, "a") + 8 + 1;
    b[n_dims_at..n_dims_at + 4].copy_from_slice(&0u32.to_le_bytes());
    let d = tmp();
    let e = open(&write(d.path(), "misread.gguf", &b)).unwrap_err();
    assert!(matches!(&e, LoadError::BadHeader { msg, .. } if msg.contains("600000 bytes long")), "{e}");
    assert!(e.to_string().contains("misread.gguf"));
    assert_sane(&e);
}

#[test]
fn gguf_names_and_keys_have_length_limits() {
    let d = tmp();
    let long = "n".repeat(300);
    let b = gguf_bytes(3, &[], &[(long.as_str(), vec![4], 0, vec![0u8; 16])], 32);
    let e = open(&write(d.path(), "long.gguf", &b)).unwrap_err();
    assert!(matches!(&e, LoadError::BadHeader { msg, .. } if msg.contains("tensor info 0")), "{e}");
    assert_sane(&e);
    // A key may be long (up to 2^16 - 1 bytes) but is cut in messages.
    let key = "k\u{7}".repeat(30_000);
    let b = gguf_bytes(3, &[(key.as_str(), GgufValue::U32(1)), (key.as_str(), GgufValue::U32(2))], &[], 32);
    let e = open(&write(d.path(), "twice.gguf", &b)).unwrap_err();
    assert!(matches!(&e, LoadError::BadHeader { msg, .. } if msg.contains("appears twice")), "{e}");
    assert_sane(&e);
    let key = "k".repeat(70_000);
    let b = gguf_bytes(3, &[(key.as_str(), GgufValue::U32(1))], &[], 32);
    let e = open(&write(d.path(), "key.gguf", &b)).unwrap_err();
    assert!(matches!(&e, LoadError::BadHeader { msg, .. } if msg.contains("70000 bytes long")), "{e}");
}

#[test]
fn gguf_counts_are_checked_against_the_file_before_allocating() {
    let d = tmp();
    let b = gguf_bytes(3, &[("k", GgufValue::U32(1))], &[("w", vec![4], 0, vec![0u8; 16])], 32);
    for (at, what) in [(8, "tensor count"), (16, "metadata count")] {
        let mut c = b.clone();
        c[at..at + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
        let e = open(&write(d.path(), "count.gguf", &c)).unwrap_err();
        assert!(
            matches!(&e, LoadError::BadHeader { msg, .. } if msg.contains(what) && msg.contains("cannot fit")),
            "{e}"
        );
    }
    // An array of 2^58 strings, each at least its 8-byte length: refused before a vector of them.
    let arr = GgufValue::Array(GgufArray::String(vec!["x".into()]));
    let mut c = gguf_bytes(3, &[("tokens", arr)], &[], 32);
    let len_at = info_at(&c, "tokens") + 8 + 6 + 4 + 4;
    c[len_at..len_at + 8].copy_from_slice(&(1u64 << 58).to_le_bytes());
    let e = open(&write(d.path(), "array.gguf", &c)).unwrap_err();
    assert!(
        matches!(&e, LoadError::BadHeader { msg, .. } if msg.contains("tokens") && msg.contains("cannot fit")),
        "{e}"
    );
    // Nested arrays and fixed-size elements alike.
    for a in [GgufArray::Array(vec![GgufArray::U8(vec![1])]), GgufArray::U64(vec![1])] {
        let mut c = gguf_bytes(3, &[("nest", GgufValue::Array(a))], &[], 32);
        let len_at = info_at(&c, "nest") + 8 + 4 + 4 + 4;
        c[len_at..len_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = open(&write(d.path(), "nest.gguf", &c)).unwrap_err();
        assert!(matches!(&e, LoadError::BadHeader { msg, .. } if msg.contains("nest")), "{e}");
    }
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", p.display());
}

/// `open(p)` on another thread, failing the test (instead of hanging it) after 20 s.
fn open_or_hang(p: &Path) -> Result<Checkpoint, LoadError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let p = p.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(open(&p));
    });
    rx.recv_timeout(std::time::Duration::from_secs(20)).expect("opening blocked")
}

fn assert_not_regular(r: Result<Checkpoint, LoadError>, file: &str, kind: &str) {
    let e = r.unwrap_err();
    assert!(
        matches!(&e, LoadError::NotARegularFile { path, kind: k } if path.ends_with(file) && k.contains(kind)),
        "{e}"
    );
    assert!(e.to_string().contains(file) && e.to_string().contains("not a regular file"), "{e}");
}

#[test]
fn fifos_and_devices_are_refused_without_blocking() {
    let d = tmp();
    let p = d.path().join("m.gguf");
    mkfifo(&p);
    assert_not_regular(open_or_hang(&p), "m.gguf", "FIFO");
    // A directory holding one .gguf, which is a FIFO.
    assert_not_regular(open_or_hang(d.path()), "m.gguf", "FIFO");
    let dev = d.path().join("zero.gguf");
    std::os::unix::fs::symlink("/dev/zero", &dev).unwrap();
    assert_not_regular(open_or_hang(&dev), "zero.gguf", "character device");

    // Each file of a safetensors directory in turn.
    let index = r#"{"weight_map": {"w": "model-1.safetensors"}}"#;
    for fifo in ["config.json", "model.safetensors.index.json", "model-1.safetensors"] {
        let d = tmp();
        write(d.path(), "config.json", CONFIG.as_bytes());
        write(d.path(), "model.safetensors.index.json", index.as_bytes());
        write(d.path(), "model-1.safetensors", &st_bytes(&[("w", "F32", vec![1], vec![0; 4])]));
        std::fs::remove_file(d.path().join(fifo)).unwrap();
        mkfifo(&d.path().join(fifo));
        assert_not_regular(open_or_hang(d.path()), fifo, "FIFO");
    }
    let d = st_dir(&[]);
    std::fs::remove_file(d.path().join("model.safetensors")).unwrap();
    mkfifo(&d.path().join("model.safetensors"));
    assert_not_regular(open_or_hang(d.path()), "model.safetensors", "FIFO");
    // The check other readers use (the tokenizer's files).
    assert!(matches!(check_regular(&d.path().join("model.safetensors")), Err(LoadError::NotARegularFile { .. })));
    assert!(check_regular(&d.path().join("config.json")).is_ok());
}

#[test]
fn json_files_have_a_size_bound() {
    let d = tmp();
    let p = write(d.path(), "config.json", &[b' '; 100]);
    assert_eq!(crate::model::file::read_text(&p, 100).unwrap().len(), 100);
    let e = crate::model::file::read_text(&p, 99).unwrap_err();
    assert!(matches!(e, LoadError::TooLarge { len: 100, max: 99, .. }), "{e}");
}

#[test]
fn a_file_that_shrank_after_opening_is_an_error_before_its_bytes_are_read() {
    let w = weights(4096);
    let d = st_dir(&[("a", "F32", vec![4096], f32_bytes(&w)), ("b", "F32", vec![4096], f32_bytes(&w))]);
    let ck = open(d.path()).unwrap();
    assert_eq!(ck.tensor("a").unwrap().to_f32_vec().unwrap(), w);
    let f = std::fs::OpenOptions::new().write(true).open(d.path().join("model.safetensors")).unwrap();
    f.set_len(100).unwrap();
    let e = ck.tensor("b").unwrap_err();
    assert!(matches!(&e, LoadError::FileChanged { now: 100, was, .. } if *was > 100), "{e}");
    assert!(e.to_string().contains("model.safetensors") && e.to_string().contains("shrank"), "{e}");
}

#[test]
fn a_nan_or_inf_weight_is_an_error_naming_the_tensor_on_first_use() {
    let mut w = weights(64 * 128);
    w[5 * 128 + 7] = f32::NAN;
    let d = st_dir(&[
        ("model.layers.0.self_attn.q_proj.weight", "BF16", vec![64, 128], bf16_bytes(&w)),
        ("model.norm.weight", "F32", vec![4], f32_bytes(&[1.0, f32::NEG_INFINITY, 3.0, 4.0])),
        ("model.ok.weight", "F16", vec![2], vec![0, 0x3c, 0, 0xbc]),
    ]);
    let ck = open(d.path()).unwrap();
    let e = ck.tensor("model.layers.0.self_attn.q_proj.weight").unwrap_err();
    match &e {
        LoadError::NonFinite { name, found, .. } => {
            assert_eq!(name, "model.layers.0.self_attn.q_proj.weight");
            assert_eq!((found.row, found.col), (5, 7));
            assert!(found.value.is_nan());
        }
        _ => panic!("{e}"),
    }
    let m = e.to_string();
    assert!(m.contains("model.safetensors") && m.contains("q_proj") && m.contains("row 5, column 7 is NaN"), "{m}");
    // Found again on a later use (the scan's result is kept), and for vectors too.
    assert!(matches!(ck.tensor("model.layers.0.self_attn.q_proj.weight"), Err(LoadError::NonFinite { .. })));
    let e = ck.tensor("model.norm.weight").unwrap_err();
    assert!(e.to_string().contains("column 1 is -inf"), "{e}");
    assert_eq!(ck.tensor("model.ok.weight").unwrap().to_f32_vec().unwrap(), [1.0, -1.0]);
    // Quantize-at-load reads the tensor first, so it reports the same.
    let opts = LoadOptions { quantize: Some(WeightFormat::I8Row), progress: None };
    assert!(matches!(Checkpoint::open(d.path(), &opts), Err(LoadError::NonFinite { .. })));
}

#[test]
fn a_non_finite_block_scale_is_an_error_naming_the_tensor() {
    let q8 = quantize(WeightFormat::Q8_0, &weights(4 * 64), 64).unwrap();
    let mut bad = q8.clone();
    // Row 3's second block: its f16 scale d becomes +inf.
    bad[3 * 68 + 34..3 * 68 + 36].copy_from_slice(&0x7c00u16.to_le_bytes());
    let b =
        gguf_bytes(3, &[], &[("good.weight", vec![4, 64], 8, q8), ("blk.0.ffn_down.weight", vec![4, 64], 8, bad)], 32);
    let d = tmp();
    let ck = open(&write(d.path(), "scale.gguf", &b)).unwrap();
    assert!(ck.tensor("good.weight").is_ok());
    let e = ck.tensor("blk.0.ffn_down.weight").unwrap_err();
    assert!(matches!(&e, LoadError::NonFinite { found, .. } if (found.row, found.col) == (3, 32)), "{e}");
    let m = e.to_string();
    assert!(m.contains("scale.gguf") && m.contains("blk.0.ffn_down.weight") && m.contains("scale d"), "{m}");
}

#[test]
fn a_file_cut_anywhere_is_a_typed_error_naming_it() {
    let d = tmp();
    let b = sample_gguf();
    // Every one of the first 64 bytes, then every 7th (each 8-byte count, length and offset
    // is cut inside at least once) and the last few.
    let cuts = (0..64).chain((64..b.len()).step_by(7)).chain(b.len() - 3..b.len());
    for cut in cuts {
        let e = open(&write(d.path(), "cut.gguf", &b[..cut])).unwrap_err();
        assert!(
            matches!(
                &e,
                LoadError::TruncatedHeader { .. } | LoadError::TensorPastEnd { .. } | LoadError::BadHeader { .. }
            ),
            "cut {cut}: {e}"
        );
        assert!(e.to_string().contains("cut.gguf"), "cut {cut}: {e}");
        assert_sane(&e);
    }
    let b =
        st_bytes(&[("a", "F32", vec![3], f32_bytes(&[1.0, 2.0, 3.0])), ("b", "F16", vec![2], vec![0, 0x3c, 0, 0x3c])]);
    let d = st_dir(&[]);
    for cut in 0..b.len() {
        write(d.path(), "model.safetensors", &b[..cut]);
        let e = open(d.path()).unwrap_err();
        assert!(
            matches!(
                &e,
                LoadError::TruncatedHeader { .. } | LoadError::InvalidJson { .. } | LoadError::TensorPastEnd { .. }
            ),
            "cut {cut}: {e}"
        );
        assert!(e.to_string().contains("model.safetensors"), "cut {cut}: {e}");
    }
}
