//! Split GGUF: a model published as `name-00001-of-0000N.gguf` ... `name-0000N-of-0000N.gguf`
//! (llama.cpp's `gguf-split` layout) opens as one checkpoint from any of its shards. The names
//! make the set: the shards are looked for beside the file given, each is parsed and checked
//! on its own (`gguf::parse`), and their tensors join one table, each tensor's bytes in its own
//! shard's map. The metadata is shard 1's.
//!
//! The `split.*` keys, where a shard has them, must agree with the names: `split.count` the
//! number of shards, `split.no` the shard's place (from 0, as llama.cpp writes it), and shard
//! 1's `split.tensors.count` the number of tensors over all shards. A missing shard, a count
//! that disagrees, a tensor in two shards or a total that does not add up is a typed
//! `LoadError`. A file whose `split.count` says it has siblings but whose name does not say
//! where they are is one too.
//!
//! Must not: read tensor data, or look for shards anywhere but beside the file given.

use super::file::MappedFile;
use super::gguf::{self, GgufMetadata, GgufTensor};
use super::LoadError;
use std::path::{Path, PathBuf};

/// The key holding the number of shards.
pub const KEY_COUNT: &str = "split.count";
/// The key holding a shard's place in the set, from 0.
pub const KEY_NO: &str = "split.no";
/// The key (in shard 1) holding the number of tensors over all shards.
pub const KEY_TENSORS: &str = "split.tensors.count";

/// Where a split file's name puts it: the path before `-NNNNN-of-NNNNN.gguf`, its place (from
/// 1) and the count. `None` for a name that does not follow the pattern.
pub fn split_name(path: &Path) -> Option<(String, u32, u32)> {
    let s = path.to_str()?;
    let stem = s.strip_suffix(".gguf")?;
    // `-00001-of-00003`: 5 digits (or more, for sets beyond 99999), `-of-`, digits.
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let digits = |d: &str| d.len() >= 5 && d.bytes().all(|b| b.is_ascii_digit());
    if !digits(no) || !digits(count) || prefix.is_empty() || prefix.ends_with('/') {
        return None;
    }
    let (no, count) = (no.parse().ok()?, count.parse().ok()?);
    (no >= 1 && no <= count).then(|| (prefix.to_string(), no, count))
}

/// The path of shard `no` (from 1) of `count` after `prefix`, as llama.cpp names it.
pub fn shard_path(prefix: &str, no: u32, count: u32) -> PathBuf {
    PathBuf::from(format!("{prefix}-{no:05}-of-{count:05}.gguf"))
}

/// The shards of the set the GGUF file `path` (with metadata `meta`) belongs to, shard 1
/// first; `None` for a file that stands alone.
pub fn shard_set(path: &Path, meta: &GgufMetadata) -> Result<Option<Vec<PathBuf>>, LoadError> {
    let said = meta.get_u64(KEY_COUNT);
    let Some((prefix, _, count)) = split_name(path).filter(|&(_, _, n)| n > 1) else {
        return match said {
            Some(n) if n > 1 => Err(LoadError::SplitName { path: path.to_path_buf(), count: n }),
            _ => Ok(None),
        };
    };
    if let Some(n) = said.filter(|&n| n != count as u64) {
        return Err(LoadError::SplitCount { path: path.to_path_buf(), found: n, expected: count as u64 });
    }
    Ok(Some((1..=count).map(|no| shard_path(&prefix, no, count)).collect()))
}

/// One shard, opened and parsed.
pub struct Shard {
    pub map: MappedFile,
    pub meta: GgufMetadata,
    pub tensors: Vec<GgufTensor>,
}

/// Opens every shard of `set` (shard 1 first; `given` is the file the caller named, whose
/// parsed form `given_shard` is reused), checking each one's `split.*` keys. Tensors in two
/// shards and the tensor total are checked by the caller as it builds the table
/// (`check_total`).
pub fn open_shards(given: &Path, given_shard: Shard, set: &[PathBuf]) -> Result<Vec<Shard>, LoadError> {
    let count = set.len() as u64;
    let mut given_shard = Some(given_shard);
    let mut shards = Vec::with_capacity(set.len());
    for (i, p) in set.iter().enumerate() {
        let shard = match given_shard.take_if(|_| p == given) {
            Some(s) => s,
            None => {
                if !super::file::regular_if_present(p)? {
                    return Err(LoadError::SplitShardMissing {
                        path: given.to_path_buf(),
                        shard: p.clone(),
                        no: i + 1,
                        count: set.len(),
                    });
                }
                let map = MappedFile::open(p)?;
                let (meta, tensors) = gguf::parse(p, map.bytes())?;
                Shard { map, meta, tensors }
            }
        };
        if let Some(n) = shard.meta.get_u64(KEY_COUNT).filter(|&n| n != count) {
            return Err(LoadError::SplitCount { path: p.clone(), found: n, expected: count });
        }
        if let Some(no) = shard.meta.get_u64(KEY_NO).filter(|&no| no != i as u64) {
            let msg = format!("{KEY_NO} is {no}, but the file's name makes it shard {} (split.no {i})", i + 1);
            return Err(LoadError::BadHeader { path: p.clone(), msg });
        }
        shards.push(shard);
    }
    Ok(shards)
}

/// Checks shard 1's `split.tensors.count` (when it has one) against the `found` tensors of
/// every shard.
pub fn check_total(first: &Path, meta: &GgufMetadata, found: usize, shards: usize) -> Result<(), LoadError> {
    match meta.get_u64(KEY_TENSORS) {
        Some(expected) if expected != found as u64 => {
            Err(LoadError::SplitTensorCount { path: first.to_path_buf(), expected, found, shards })
        }
        _ => Ok(()),
    }
}

/// The error for tensor `name`, found in shard `second` after shard `first`.
pub fn duplicate(name: &str, first: &Path, second: &Path) -> LoadError {
    LoadError::SplitDuplicateTensor { path: second.to_path_buf(), name: name.to_string(), other: first.to_path_buf() }
}

/// The one checkpoint among the `.gguf` files of a directory: the one file, or shard 1 of
/// the one split set they all belong to. `None` when they are several things.
pub fn single_in(ggufs: &[PathBuf]) -> Option<PathBuf> {
    if let [one] = ggufs {
        return Some(one.clone());
    }
    let names: Vec<(String, u32, u32)> = ggufs.iter().map(|p| split_name(p)).collect::<Option<_>>()?;
    let (prefix, _, count) = names.first()?.clone();
    names.iter().all(|(p, _, n)| *p == prefix && *n == count).then(|| shard_path(&prefix, 1, count))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let p = Path::new("/m/Kimi-K2-Q4_K_M-00002-of-00013.gguf");
        assert_eq!(split_name(p), Some(("/m/Kimi-K2-Q4_K_M".into(), 2, 13)));
        assert_eq!(shard_path("/m/Kimi-K2-Q4_K_M", 1, 13), Path::new("/m/Kimi-K2-Q4_K_M-00001-of-00013.gguf"));
        for bad in
            ["m.gguf", "m-1-of-3.gguf", "m-00004-of-00003.gguf", "m-00000-of-00003.gguf", "/-00001-of-00002.gguf"]
        {
            assert_eq!(split_name(Path::new(bad)), None, "{bad}");
        }
        let set = ["a-00002-of-00002.gguf", "a-00001-of-00002.gguf"].map(PathBuf::from);
        assert_eq!(single_in(&set), Some(PathBuf::from("a-00001-of-00002.gguf")));
        assert_eq!(single_in(&["a.gguf", "b.gguf"].map(PathBuf::from)), None);
        assert_eq!(single_in(&["a-00001-of-00002.gguf", "b-00001-of-00002.gguf"].map(PathBuf::from)), None);
    }
}
