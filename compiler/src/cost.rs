//! Sizes: the bytes of a matrix in a weight format, of a layer's weights, of one expert, of KV
//! rows and recurrent state. Placement decides with these numbers and plans print them.
//!
//! This module must not decide anything; it only counts.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A storage format of weights (the checkpoint's or the one they go up to a device in).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Format {
    F32,
    F16,
    Bf16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    Iq4Nl,
    Iq4Xs,
    Iq2Xxs,
    Iq2Xs,
    Iq2S,
    Iq3Xxs,
    Iq3S,
    Iq1S,
    Iq1M,
    Mxfp4,
    /// coli's block form of FP8 checkpoints: 128 E4M3 codes after their tile's f32 scale.
    Fp8E4m3,
    /// coli's: per row an f32 scale, then one i8 per element.
    I8Row,
    /// coli's: groups of 64 elements in 36 bytes (f16 scale, f16 min, 4-bit values).
    I4G64,
}

impl Format {
    /// `(elements per block, bytes per block)`.
    pub fn block(self) -> (u64, u64) {
        use Format::*;
        match self {
            F32 => (1, 4),
            F16 | Bf16 => (1, 2),
            Q8_0 => (32, 34),
            Q4_0 => (32, 18),
            Q4_1 => (32, 20),
            Q5_0 => (32, 22),
            Q5_1 => (32, 24),
            Q2K => (256, 84),
            Q3K => (256, 110),
            Q4K => (256, 144),
            Q5K => (256, 176),
            Q6K => (256, 210),
            Q8K => (256, 292),
            Iq4Nl => (32, 18),
            Iq4Xs => (256, 136),
            Iq2Xxs => (256, 66),
            Iq2Xs => (256, 74),
            Iq2S => (256, 82),
            Iq3Xxs => (256, 98),
            Iq3S => (256, 110),
            Iq1S => (256, 50),
            Iq1M => (256, 56),
            Mxfp4 => (32, 17),
            Fp8E4m3 => (128, 132),
            I8Row => (1, 1),
            I4G64 => (64, 36),
        }
    }

    /// Bytes of `elements` values, rows of `cols` each (blocks do not span rows).
    pub fn bytes(self, rows: u64, cols: u64) -> u64 {
        let (n, b) = self.block();
        let header = if self == Format::I8Row { 4 } else { 0 };
        rows.saturating_mul(cols.div_ceil(n).saturating_mul(b).saturating_add(header))
    }

    /// The format a checkpoint's storage type names (`BF16`, `Q4_K`, `F32`, ...).
    pub fn from_dtype(dtype: &str) -> Option<Format> {
        use Format::*;
        Some(match dtype.to_ascii_uppercase().as_str() {
            "F32" | "FLOAT32" => F32,
            "F16" | "FLOAT16" => F16,
            "BF16" | "BFLOAT16" => Bf16,
            "Q8_0" => Q8_0,
            "Q4_0" => Q4_0,
            "Q4_1" => Q4_1,
            "Q5_0" => Q5_0,
            "Q5_1" => Q5_1,
            "Q2_K" => Q2K,
            "Q3_K" => Q3K,
            "Q4_K" => Q4K,
            "Q5_K" => Q5K,
            "Q6_K" => Q6K,
            "Q8_K" => Q8K,
            "IQ4_NL" => Iq4Nl,
            "IQ4_XS" => Iq4Xs,
            "IQ2_XXS" => Iq2Xxs,
            "IQ2_XS" => Iq2Xs,
            "IQ2_S" => Iq2S,
            "IQ3_XXS" => Iq3Xxs,
            "IQ3_S" => Iq3S,
            "IQ1_S" => Iq1S,
            "IQ1_M" => Iq1M,
            "MXFP4" => Mxfp4,
            "FP8_E4M3" => Fp8E4m3,
            "I8ROW" => I8Row,
            "I4G64" => I4G64,
            _ => return None,
        })
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Format::*;
        f.write_str(match self {
            F32 => "f32",
            F16 => "f16",
            Bf16 => "bf16",
            Q8_0 => "q8_0",
            Q4_0 => "q4_0",
            Q4_1 => "q4_1",
            Q5_0 => "q5_0",
            Q5_1 => "q5_1",
            Q2K => "q2_k",
            Q3K => "q3_k",
            Q4K => "q4_k",
            Q5K => "q5_k",
            Q6K => "q6_k",
            Q8K => "q8_k",
            Iq4Nl => "iq4_nl",
            Iq4Xs => "iq4_xs",
            Iq2Xxs => "iq2_xxs",
            Iq2Xs => "iq2_xs",
            Iq2S => "iq2_s",
            Iq3Xxs => "iq3_xxs",
            Iq3S => "iq3_s",
            Iq1S => "iq1_s",
            Iq1M => "iq1_m",
            Mxfp4 => "mxfp4",
            Fp8E4m3 => "fp8_e4m3",
            I8Row => "i8row",
            I4G64 => "i4g64",
        })
    }
}

impl std::str::FromStr for Format {
    type Err = String;
    /// Reads the printed name (`bf16`, `q4_k`) or the checkpoint spelling (`BF16`, `Q4_K`).
    fn from_str(s: &str) -> Result<Format, String> {
        Format::from_dtype(s).ok_or_else(|| format!("unknown weight format `{s}` (known: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q3_k q4_k q5_k q6_k q8_k iq1_s iq1_m iq2_xxs iq2_xs iq2_s iq3_xxs iq3_s iq4_nl iq4_xs mxfp4 fp8_e4m3 i8row i4g64)"))
    }
}

/// `12.3 MiB`-style size for plans.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_formats_round_up_per_row() {
        assert_eq!(Format::Bf16.bytes(576, 576), 576 * 576 * 2);
        assert_eq!(Format::Q4_1.bytes(1, 576), 18 * 20);
        assert_eq!(Format::Q4K.bytes(2, 300), 2 * 2 * 144);
        assert_eq!(Format::from_dtype("q4_k"), Some(Format::Q4K));
        assert_eq!(Format::I8Row.bytes(3, 10), 3 * 14);
        assert_eq!(Format::I4G64.bytes(1, 128), 72);
        // The IQ1 grid formats by their real block sizes (1.5625 and 1.75 bits a weight).
        assert_eq!(
            (Format::from_dtype("IQ1_S"), Format::from_dtype("iq1_m")),
            (Some(Format::Iq1S), Some(Format::Iq1M))
        );
        assert_eq!((Format::Iq1S.bytes(3, 512), Format::Iq1M.bytes(3, 512)), (3 * 2 * 50, 3 * 2 * 56));
        // FP8 checkpoints are sized as stored after the load-time repack: 1 byte an element
        // and an f32 scale per 128 (not as the bf16 a device profile assumes for unknown types).
        assert_eq!(Format::from_dtype("FP8_E4M3"), Some(Format::Fp8E4m3));
        assert_eq!(Format::Fp8E4m3.bytes(7168, 2048), 7168 * 16 * 132);
        assert_eq!(human(1536), "1.5 KiB");
    }
}
