//! `LoadError`, every reason a checkpoint cannot be opened or a tensor not read, and `shown`,
//! which bounds and escapes the names a file gives (tensor names, metadata keys) before they go
//! into a message: a malformed header must not make a message of megabytes of raw bytes.
//!
//! Must not: hold file contents beyond names and numbers.

use crate::format::{FormatError, NonFinite, WeightFormat};
use std::path::PathBuf;

/// Longest name, in characters, that an error message shows (longer ones are cut, with `...`).
const SHOWN_CHARS: usize = 200;

/// `name` as a message shows it: control and other non-printable characters escaped (`\n`,
/// `\u{1b}`), cut after 200 characters of that, with `...(N bytes)` after a name that was cut.
pub fn shown(name: &str) -> String {
    let (mut out, mut chars) = (String::new(), 0);
    for c in name.chars() {
        if chars >= SHOWN_CHARS {
            out.push_str(&format!("...({} bytes)", name.len()));
            break;
        }
        if c.is_control() || c == '\u{fffd}' || (c.is_whitespace() && c != ' ') {
            let e = c.escape_default();
            chars += e.len();
            out.extend(e);
        } else {
            chars += 1;
            out.push(c);
        }
    }
    out
}

/// What an unsupported-type error lists: the weight types coli computes with.
pub const COMPUTED: &str = "coli computes with F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, \
     Q3_K, Q4_K, Q5_K, Q6_K, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS \
     and MXFP4 (in safetensors as U8 _blocks with _scales), F8_E4M3 with 128 x 128 block scales \
     (weight_scale_inv), and I8Row or I4G64 made at load by --quantize i8|i4";

/// A reason a checkpoint could not be opened or a tensor not read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: not a checkpoint: expected a .gguf file, or a directory with model.safetensors or model.safetensors.index.json", path.display())]
    NotACheckpoint { path: PathBuf },
    #[error("{}: bad magic {found:?}, expected {expected:?} (is this a GGUF file?)", path.display())]
    BadMagic { path: PathBuf, found: [u8; 4], expected: [u8; 4] },
    #[error("{}: GGUF version {version} is not supported (2 and 3 are, little-endian)", path.display())]
    UnsupportedVersion { path: PathBuf, version: u32 },
    #[error("{}: header truncated at byte {offset} while reading {}", path.display(), shown(what))]
    TruncatedHeader { path: PathBuf, offset: u64, what: String },
    #[error("{}: malformed header: {msg}", path.display())]
    BadHeader { path: PathBuf, msg: String },
    #[error("{}: invalid JSON in the {what}: {source}", path.display())]
    InvalidJson { path: PathBuf, what: &'static str, source: serde_json::Error },
    /// `end` is a u128: offsets and lengths near 2^64 add up without wrapping.
    #[error("{}: tensor {} ends at byte {end}, past the end of the file ({file_len} bytes)", path.display(), shown(name))]
    TensorPastEnd { path: PathBuf, name: String, end: u128, file_len: u64 },
    #[error("{}: tensor {} (bytes {}..{}) overlaps tensor {} (bytes {}..{})", path.display(), shown(name), range.0, range.1, shown(other), other_range.0, other_range.1)]
    Overlap { path: PathBuf, name: String, range: (u64, u64), other: String, other_range: (u64, u64) },
    #[error("{}: tensor {}: shape {shape:?} of {dtype} takes {expected} bytes, but the file gives it {found}", path.display(), shown(name))]
    TensorSize { path: PathBuf, name: String, shape: Vec<usize>, dtype: String, expected: u64, found: u64 },
    #[error("{}: tensor {}: shape {shape:?} is not a whole number of {} blocks per row (or overflows)", path.display(), shown(name), shown(dtype))]
    RaggedTensor { path: PathBuf, name: String, shape: Vec<usize>, dtype: String },
    #[error("{}: tensor {} has type {}, which coli does not compute with ({COMPUTED})", path.display(), shown(name), shown(dtype))]
    UnsupportedType { path: PathBuf, name: String, dtype: String },
    #[error("{}: tensor {} has unknown GGUF type id {id} ({COMPUTED})", path.display(), shown(name))]
    UnknownGgufType { path: PathBuf, name: String, id: u32 },
    #[error("{}: tensor {} is in shard {}, which is missing", path.display(), shown(name), shown(shard))]
    MissingShard { path: PathBuf, name: String, shard: String },
    #[error("{}: tensor {} appears twice", path.display(), shown(name))]
    DuplicateTensor { path: PathBuf, name: String },
    #[error("{}: no tensor named {}", path.display(), shown(name))]
    NoSuchTensor { path: PathBuf, name: String },
    #[error("{}: tensor {} of shape {shape:?} {what}", path.display(), shown(name))]
    Shape { path: PathBuf, name: String, shape: Vec<usize>, what: &'static str },
    #[error("{}: tensor {}: {source}", path.display(), shown(name))]
    Format { path: PathBuf, name: String, source: FormatError },
    #[error("{}: is {kind}, not a regular file (a checkpoint's files must be)", path.display())]
    NotARegularFile { path: PathBuf, kind: &'static str },
    #[error("{}: {len} bytes, more than the {max} read from a file of its kind", path.display())]
    TooLarge { path: PathBuf, len: u64, max: u64 },
    #[error("{}: the file shrank from {was} to {now} bytes since it was opened (truncated or rewritten by another program)", path.display())]
    FileChanged { path: PathBuf, was: u64, now: u64 },
    #[error("{}: FP8 tensor {}: {problem}", path.display(), shown(name))]
    Fp8 { path: PathBuf, name: String, problem: Box<crate::model::fp8::Fp8Problem> },
    #[error("{}: MXFP4 tensor {}: {problem}", path.display(), shown(name))]
    Mxfp4 { path: PathBuf, name: String, problem: Box<crate::model::mxfp4::Mxfp4Problem> },
    #[error("{}: tensor {}: {found}; weights must be finite", path.display(), shown(name))]
    NonFinite { path: PathBuf, name: String, found: NonFinite },
    #[error("{}: shard {no} of {count} of this split GGUF is missing: {}", path.display(), shard.display())]
    SplitShardMissing { path: PathBuf, shard: PathBuf, no: usize, count: usize },
    #[error("{}: split.count says {found} shards, but the set has {expected} (by the file names)", path.display())]
    SplitCount { path: PathBuf, found: u64, expected: u64 },
    #[error("{}: split.count says this file is one of {count} shards, but its name does not end in -NNNNN-of-NNNNN.gguf, so the others cannot be found", path.display())]
    SplitName { path: PathBuf, count: u64 },
    #[error("{}: tensor {} is also in shard {}", path.display(), shown(name), other.display())]
    SplitDuplicateTensor { path: PathBuf, name: String, other: PathBuf },
    #[error("{}: split.tensors.count says {expected} tensors, but the {shards} shards hold {found}", path.display())]
    SplitTensorCount { path: PathBuf, expected: u64, found: usize, shards: usize },
    #[error("{}: holds several GGUF checkpoints ({}); name one of them", path.display(), files.join(", "))]
    SeveralGguf { path: PathBuf, files: Vec<String> },
    #[error("cannot quantize at load to {format}: only I8Row and I4G64 are load-time formats")]
    BadQuantizeTarget { format: WeightFormat },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_names_are_bounded_and_escaped() {
        assert_eq!(shown("blk.0.attn_q.weight"), "blk.0.attn_q.weight");
        assert_eq!(shown("a\nb\u{1b}c\td"), "a\\nb\\u{1b}c\\td");
        let long = "x".repeat(58 << 20);
        let s = shown(&long);
        assert_eq!(s, format!("{}...({} bytes)", "x".repeat(200), 58 << 20));
        assert_eq!(shown(&"é".repeat(200)), "é".repeat(200), "200 characters are not cut");
        assert_eq!(shown(&"\u{7}".repeat(100)).len(), 200 + "...(100 bytes)".len(), "escapes count");
    }
}
