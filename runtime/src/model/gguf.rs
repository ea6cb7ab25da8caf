//! GGUF reader (versions 2 and 3, little-endian): the header, every metadata value type
//! (including arrays of arrays), the tensor table, `general.alignment` and the data section.
//! It parses from the memory map and checks every tensor against the file: offsets aligned,
//! rows a whole number of blocks, no tensor running into the next or past the end of the file.
//!
//! Layout: magic `GGUF`, u32 version, u64 tensor count, u64 metadata count; metadata entries
//! (string key, u32 value type, value); tensor infos (string name, u32 dims, u64 per dim with
//! the innermost first, u32 `ggml_type`, u64 offset into the data section); padding to the
//! alignment; the data section. Strings are a u64 length and bytes.
//!
//! Every count is checked against the bytes left in the file before anything is allocated for
//! it (a tensor count of 2^60 in a small file is an error, not an allocation); keys and tensor
//! names have length limits, so no error message carries megabytes of misread bytes.
//!
//! Must not: copy tensor data, trust any count or offset before checking it against the file.

use super::{shown, LoadError};
use crate::format::WeightFormat;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// Longest metadata key: the GGUF specification's limit (2^16 - 1 bytes).
const MAX_KEY: u64 = u16::MAX as u64;
/// Longest tensor name. The specification says 64 bytes and llama.cpp refuses 64 or more;
/// coli allows some slack, and no more: a name is only ever short.
const MAX_TENSOR_NAME: u64 = 256;
/// Fewest bytes a metadata entry takes (key length, an empty key, value type, a one-byte value).
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Fewest bytes a tensor info takes (name length, an empty name, no dimensions, type, offset).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(GgufArray),
}

/// A metadata array: homogeneous, so stored unboxed; arrays may nest.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<GgufArray>),
}

impl GgufArray {
    pub fn len(&self) -> usize {
        match self {
            GgufArray::U8(v) => v.len(),
            GgufArray::I8(v) => v.len(),
            GgufArray::U16(v) => v.len(),
            GgufArray::I16(v) => v.len(),
            GgufArray::U32(v) => v.len(),
            GgufArray::I32(v) => v.len(),
            GgufArray::U64(v) => v.len(),
            GgufArray::I64(v) => v.len(),
            GgufArray::F32(v) => v.len(),
            GgufArray::F64(v) => v.len(),
            GgufArray::Bool(v) => v.len(),
            GgufArray::String(v) => v.len(),
            GgufArray::Array(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Integer elements as i64 (`None` for non-integer arrays or a u64 beyond i64).
    fn ints(&self) -> Option<Vec<i64>> {
        Some(match self {
            GgufArray::U8(v) => v.iter().map(|&x| x as i64).collect(),
            GgufArray::I8(v) => v.iter().map(|&x| x as i64).collect(),
            GgufArray::U16(v) => v.iter().map(|&x| x as i64).collect(),
            GgufArray::I16(v) => v.iter().map(|&x| x as i64).collect(),
            GgufArray::U32(v) => v.iter().map(|&x| x as i64).collect(),
            GgufArray::I32(v) => v.iter().map(|&x| x as i64).collect(),
            GgufArray::I64(v) => v.clone(),
            GgufArray::U64(v) => v.iter().map(|&x| i64::try_from(x).ok()).collect::<Option<_>>()?,
            _ => return None,
        })
    }

    fn to_json(&self) -> Value {
        fn nums<T: Copy>(v: &[T], f: impl Fn(T) -> Value) -> Value {
            Value::Array(v.iter().map(|&x| f(x)).collect())
        }
        match self {
            GgufArray::U8(v) => nums(v, |x| x.into()),
            GgufArray::I8(v) => nums(v, |x| x.into()),
            GgufArray::U16(v) => nums(v, |x| x.into()),
            GgufArray::I16(v) => nums(v, |x| x.into()),
            GgufArray::U32(v) => nums(v, |x| x.into()),
            GgufArray::I32(v) => nums(v, |x| x.into()),
            GgufArray::U64(v) => nums(v, |x| x.into()),
            GgufArray::I64(v) => nums(v, |x| x.into()),
            GgufArray::F32(v) => nums(v, |x| float_json(x as f64)),
            GgufArray::F64(v) => nums(v, float_json),
            GgufArray::Bool(v) => nums(v, Value::Bool),
            GgufArray::String(v) => Value::Array(v.iter().map(|s| Value::String(s.clone())).collect()),
            GgufArray::Array(v) => Value::Array(v.iter().map(GgufArray::to_json).collect()),
        }
    }
}

fn float_json(x: f64) -> Value {
    serde_json::Number::from_f64(x).map(Value::Number).unwrap_or(Value::Null)
}

impl GgufValue {
    /// The value as JSON (non-finite floats become `null`).
    pub fn to_json(&self) -> Value {
        match self {
            GgufValue::U8(x) => (*x).into(),
            GgufValue::I8(x) => (*x).into(),
            GgufValue::U16(x) => (*x).into(),
            GgufValue::I16(x) => (*x).into(),
            GgufValue::U32(x) => (*x).into(),
            GgufValue::I32(x) => (*x).into(),
            GgufValue::U64(x) => (*x).into(),
            GgufValue::I64(x) => (*x).into(),
            GgufValue::F32(x) => float_json(*x as f64),
            GgufValue::F64(x) => float_json(*x),
            GgufValue::Bool(x) => Value::Bool(*x),
            GgufValue::String(s) => Value::String(s.clone()),
            GgufValue::Array(a) => a.to_json(),
        }
    }

    /// Any integer value as i64 (`None` for other types or a u64 beyond i64).
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::U8(x) => Some(x as i64),
            GgufValue::I8(x) => Some(x as i64),
            GgufValue::U16(x) => Some(x as i64),
            GgufValue::I16(x) => Some(x as i64),
            GgufValue::U32(x) => Some(x as i64),
            GgufValue::I32(x) => Some(x as i64),
            GgufValue::U64(x) => i64::try_from(x).ok(),
            GgufValue::I64(x) => Some(x),
            _ => None,
        }
    }
}

/// The metadata of a GGUF file, in file order, with typed accessors.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GgufMetadata {
    pub version: u32,
    entries: Vec<(String, GgufValue)>,
    index: HashMap<String, usize>,
}

impl GgufMetadata {
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// Every entry in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &GgufValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        match self.get(key)? {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// A non-negative integer of any integer type.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        match self.get(key)? {
            GgufValue::U64(x) => Some(*x),
            v => u64::try_from(v.as_i64()?).ok(),
        }
    }

    /// An integer of any integer type.
    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.get(key)?.as_i64()
    }

    /// A float (f32 or f64) or an integer, as f32.
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        match self.get(key)? {
            GgufValue::F32(x) => Some(*x),
            GgufValue::F64(x) => Some(*x as f32),
            v => v.as_i64().map(|x| x as f32),
        }
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        match self.get(key)? {
            GgufValue::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn get_array(&self, key: &str) -> Option<&GgufArray> {
        match self.get(key)? {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A string array (`tokenizer.ggml.tokens`, `tokenizer.ggml.merges`).
    pub fn get_str_array(&self, key: &str) -> Option<&[String]> {
        match self.get_array(key)? {
            GgufArray::String(v) => Some(v),
            _ => None,
        }
    }

    /// An integer array of any integer type whose values fit i32 (`tokenizer.ggml.token_type`).
    pub fn get_i32_array(&self, key: &str) -> Option<Vec<i32>> {
        self.get_array(key)?.ints()?.into_iter().map(|x| i32::try_from(x).ok()).collect()
    }

    /// A float array (`tokenizer.ggml.scores`); f64 arrays are narrowed.
    pub fn get_f32_array(&self, key: &str) -> Option<Vec<f32>> {
        match self.get_array(key)? {
            GgufArray::F32(v) => Some(v.clone()),
            GgufArray::F64(v) => Some(v.iter().map(|&x| x as f32).collect()),
            _ => None,
        }
    }

    /// The metadata as JSON values, without the tokenizer's arrays (`tokenizer.ggml.*` arrays).
    pub fn to_config_json(&self) -> Map<String, Value> {
        self.iter()
            .filter(|(k, v)| !(k.starts_with("tokenizer.ggml.") && matches!(v, GgufValue::Array(_))))
            .map(|(k, v)| (k.to_string(), v.to_json()))
            .collect()
    }
}

/// What a GGUF tensor info says, checked against the file.
#[derive(Clone, Debug)]
pub struct GgufTensor {
    pub name: String,
    /// Outermost first (GGUF's dimension order reversed).
    pub shape: Vec<usize>,
    pub type_id: u32,
    /// The type's name (`Q4_K`), also for types coli does not compute with.
    pub dtype: &'static str,
    /// `None` when coli has no kernels for the type.
    pub format: Option<WeightFormat>,
    /// Absolute byte range in the file.
    pub start: u64,
    pub len: u64,
}

/// `ggml_type` ids: name, elements per block, bytes per block.
fn ggml_type(id: u32) -> Option<(&'static str, u64, u64)> {
    Some(match id {
        0 => ("F32", 1, 4),
        1 => ("F16", 1, 2),
        2 => ("Q4_0", 32, 18),
        3 => ("Q4_1", 32, 20),
        6 => ("Q5_0", 32, 22),
        7 => ("Q5_1", 32, 24),
        8 => ("Q8_0", 32, 34),
        9 => ("Q8_1", 32, 40),
        10 => ("Q2_K", 256, 84),
        11 => ("Q3_K", 256, 110),
        12 => ("Q4_K", 256, 144),
        13 => ("Q5_K", 256, 176),
        14 => ("Q6_K", 256, 210),
        15 => ("Q8_K", 256, 292),
        16 => ("IQ2_XXS", 256, 66),
        17 => ("IQ2_XS", 256, 74),
        18 => ("IQ3_XXS", 256, 98),
        19 => ("IQ1_S", 256, 50),
        20 => ("IQ4_NL", 32, 18),
        21 => ("IQ3_S", 256, 110),
        22 => ("IQ2_S", 256, 82),
        23 => ("IQ4_XS", 256, 136),
        24 => ("I8", 1, 1),
        25 => ("I16", 1, 2),
        26 => ("I32", 1, 4),
        27 => ("I64", 1, 8),
        28 => ("F64", 1, 8),
        29 => ("IQ1_M", 256, 56),
        30 => ("BF16", 1, 2),
        34 => ("TQ1_0", 256, 54),
        35 => ("TQ2_0", 256, 66),
        39 => ("MXFP4", 32, 17),
        _ => return None,
    })
}

/// The capacity reserved up front for `count` items the file says it holds: the count has been
/// checked against the bytes left, and beyond 2^16 a vector grows as the items are read.
fn initial(count: u64) -> usize {
    count.min(1 << 16) as usize
}

/// A bounds-checked reader over the header.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], LoadError> {
        let end = usize::try_from(n).ok().and_then(|n| self.pos.checked_add(n)).filter(|&e| e <= self.buf.len());
        let Some(end) = end else {
            return Err(LoadError::TruncatedHeader {
                path: self.path.to_path_buf(),
                offset: self.pos as u64,
                what: what.to_string(),
            });
        };
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn arr<const N: usize>(&mut self, what: &str) -> Result<[u8; N], LoadError> {
        Ok(self.take(N as u64, what)?.try_into().unwrap())
    }

    fn u32(&mut self, what: &str) -> Result<u32, LoadError> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, LoadError> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String, LoadError> {
        let n = self.u64(what)?;
        self.string_of(n, what)
    }

    /// A string of at most `max` bytes (a key or a tensor name), refused before it is read.
    fn name(&mut self, max: u64, what: &str) -> Result<String, LoadError> {
        let at = self.pos;
        let n = self.u64(what)?;
        if n > max {
            return Err(self.bad(format!("{what} at byte {at} is {n} bytes long, more than the {max} allowed")));
        }
        self.string_of(n, what)
    }

    fn string_of(&mut self, n: u64, what: &str) -> Result<String, LoadError> {
        Ok(String::from_utf8_lossy(self.take(n, what)?).into_owned())
    }

    fn left(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    /// Checks that `count` items of at least `min_size` bytes each can fit in what is left of
    /// the file, before anything is allocated for them.
    fn fits(&self, count: u64, min_size: u64, what: &str) -> Result<(), LoadError> {
        if count.checked_mul(min_size).is_some_and(|n| n <= self.left()) {
            return Ok(());
        }
        Err(self.bad(format!(
            "{what}: {count} items of at least {min_size} bytes each cannot fit in the {} bytes left after byte {}",
            self.left(),
            self.pos
        )))
    }

    fn bad(&self, msg: String) -> LoadError {
        LoadError::BadHeader { path: self.path.to_path_buf(), msg }
    }

    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<GgufValue, LoadError> {
        Ok(match ty {
            0 => GgufValue::U8(self.arr::<1>(key)?[0]),
            1 => GgufValue::I8(self.arr::<1>(key)?[0] as i8),
            2 => GgufValue::U16(u16::from_le_bytes(self.arr(key)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.arr(key)?)),
            4 => GgufValue::U32(self.u32(key)?),
            5 => GgufValue::I32(i32::from_le_bytes(self.arr(key)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.arr(key)?)),
            7 => GgufValue::Bool(self.arr::<1>(key)?[0] != 0),
            8 => GgufValue::String(self.string(key)?),
            9 => GgufValue::Array(self.array(key, depth)?),
            10 => GgufValue::U64(self.u64(key)?),
            11 => GgufValue::I64(i64::from_le_bytes(self.arr(key)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.arr(key)?)),
            _ => return Err(self.bad(format!("metadata {} has unknown value type {ty}", shown(key)))),
        })
    }

    fn array(&mut self, key: &str, depth: u32) -> Result<GgufArray, LoadError> {
        if depth > 8 {
            return Err(self.bad(format!("metadata {} nests arrays more than 8 deep", shown(key))));
        }
        let ty = self.u32(key)?;
        let n = self.u64(key)?;
        // Strings take at least their length; arrays their type and length.
        let min_size = match ty {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 | 10..=12 => 8,
            9 => 12,
            _ => 0,
        };
        self.fits(n, min_size, &format!("metadata {} (an array)", shown(key)))?;
        macro_rules! fixed {
            ($variant:ident, $t:ty) => {{
                let size = std::mem::size_of::<$t>();
                let bytes = self.take(n * size as u64, key)?;
                GgufArray::$variant(
                    bytes.chunks_exact(size).map(|c| <$t>::from_le_bytes(c.try_into().unwrap())).collect(),
                )
            }};
        }
        Ok(match ty {
            0 => fixed!(U8, u8),
            1 => fixed!(I8, i8),
            2 => fixed!(U16, u16),
            3 => fixed!(I16, i16),
            4 => fixed!(U32, u32),
            5 => fixed!(I32, i32),
            6 => fixed!(F32, f32),
            7 => GgufArray::Bool(self.take(n, key)?.iter().map(|&b| b != 0).collect()),
            10 => fixed!(U64, u64),
            11 => fixed!(I64, i64),
            12 => fixed!(F64, f64),
            8 => {
                let mut v = Vec::with_capacity(initial(n));
                for _ in 0..n {
                    v.push(self.string(key)?);
                }
                GgufArray::String(v)
            }
            9 => {
                let mut v = Vec::with_capacity(initial(n));
                for _ in 0..n {
                    v.push(self.array(key, depth + 1)?);
                }
                GgufArray::Array(v)
            }
            _ => return Err(self.bad(format!("metadata {} is an array of unknown value type {ty}", shown(key)))),
        })
    }
}

/// Parses the header of the GGUF file `path` whose bytes are `buf` (the whole file).
pub fn parse(path: &Path, buf: &[u8]) -> Result<(GgufMetadata, Vec<GgufTensor>), LoadError> {
    let mut r = Reader { buf, pos: 0, path };
    let magic: [u8; 4] = r.arr("magic")?;
    if &magic != MAGIC {
        return Err(LoadError::BadMagic { path: path.to_path_buf(), found: magic, expected: *MAGIC });
    }
    let version = r.u32("version")?;
    if version != 2 && version != 3 {
        return Err(LoadError::UnsupportedVersion { path: path.to_path_buf(), version });
    }
    let n_tensors = r.u64("tensor count")?;
    let n_kv = r.u64("metadata count")?;
    r.fits(n_kv, MIN_KV_BYTES, "the metadata count")?;
    r.fits(n_tensors, MIN_TENSOR_INFO_BYTES, "the tensor count")?;
    let mut meta = GgufMetadata { version, entries: Vec::with_capacity(initial(n_kv)), index: HashMap::new() };
    for i in 0..n_kv {
        let key = r.name(MAX_KEY, &format!("metadata key {i}"))?;
        let ty = r.u32(&key)?;
        let value = r.value(ty, &key, 0)?;
        if meta.index.insert(key.clone(), meta.entries.len()).is_some() {
            return Err(r.bad(format!("metadata key {} appears twice", shown(&key))));
        }
        meta.entries.push((key, value));
    }
    let alignment = match meta.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_i64() {
            Some(a) if a > 0 && (a as u64).is_power_of_two() => a as u64,
            _ => return Err(r.bad(format!("general.alignment {v:?} is not a positive power of two"))),
        },
    };
    r.fits(n_tensors, MIN_TENSOR_INFO_BYTES, "the tensor count")?;
    let mut infos = Vec::with_capacity(initial(n_tensors));
    for i in 0..n_tensors {
        let name = r.name(MAX_TENSOR_NAME, &format!("the name of tensor info {i}"))?;
        let n_dims = r.u32(&name)?;
        if n_dims > 8 {
            return Err(r.bad(format!("tensor {} has {n_dims} dimensions (at most 8)", shown(&name))));
        }
        let mut shape = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            let d = r.u64(&name)?;
            let d = usize::try_from(d).map_err(|_| r.bad(format!("tensor {} has dimension {d}", shown(&name))))?;
            shape.push(d);
        }
        shape.reverse();
        let type_id = r.u32(&name)?;
        let offset = r.u64(&name)?;
        infos.push(TensorInfo { name, shape, type_id, offset });
    }
    let data_start = (r.pos as u64).div_ceil(alignment) * alignment;
    let data = DataSection { start: data_start, alignment, file_len: buf.len() as u64 };
    let mut tensors = Vec::with_capacity(infos.len());
    for info in infos {
        tensors.push(check_tensor(path, info, &data)?);
    }
    check_overlaps(path, &mut tensors)?;
    Ok((meta, tensors))
}

/// A tensor's entry in the header, as read: its name, its shape (outermost first), its ggml
/// type and its offset into the data section.
struct TensorInfo {
    name: String,
    shape: Vec<usize>,
    type_id: u32,
    offset: u64,
}

/// Where the tensors' data lies: the data section's start in the file and its alignment, and
/// the file's length.
struct DataSection {
    start: u64,
    alignment: u64,
    file_len: u64,
}

fn check_tensor(path: &Path, info: TensorInfo, data: &DataSection) -> Result<GgufTensor, LoadError> {
    let TensorInfo { name, shape, type_id, offset } = info;
    let DataSection { start: data_start, alignment, file_len } = *data;
    let p = || path.to_path_buf();
    let Some((dtype, block, block_bytes)) = ggml_type(type_id) else {
        return Err(LoadError::UnknownGgufType { path: p(), name, id: type_id });
    };
    if !offset.is_multiple_of(alignment) {
        return Err(LoadError::BadHeader {
            path: p(),
            msg: format!("tensor {} offset {offset} is not a multiple of the alignment {alignment}", shown(&name)),
        });
    }
    let cols = shape.last().copied().unwrap_or(1) as u64;
    let numel = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d as u64));
    let len = match numel {
        Some(numel) if cols.is_multiple_of(block) => (numel / block).checked_mul(block_bytes),
        _ => None,
    };
    let Some(len) = len else {
        return Err(LoadError::RaggedTensor { path: p(), name, shape, dtype: dtype.to_string() });
    };
    let start = data_start.checked_add(offset).filter(|s| s.checked_add(len).is_some());
    let Some(start) = start.filter(|s| s + len <= file_len) else {
        let end = data_start as u128 + offset as u128 + len as u128;
        return Err(LoadError::TensorPastEnd { path: p(), name, end, file_len });
    };
    let format = WeightFormat::from_gguf_type(type_id).ok();
    Ok(GgufTensor { name, shape, type_id, dtype, format, start, len })
}

/// Each tensor must end before the next one (by offset) starts: a tensor whose shape and type
/// claim more bytes than lie before its neighbour disagrees with the file's layout.
fn check_overlaps(path: &Path, tensors: &mut [GgufTensor]) -> Result<(), LoadError> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| tensors[i].start);
    for w in order.windows(2) {
        let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
        if a.start + a.len > b.start {
            return Err(LoadError::TensorSize {
                path: PathBuf::from(path),
                name: a.name.clone(),
                shape: a.shape.clone(),
                dtype: a.dtype.to_string(),
                expected: a.len,
                found: b.start - a.start,
            });
        }
    }
    Ok(())
}
