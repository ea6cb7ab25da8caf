//! A K/V mirror's rows as the host writes and reads them (`KvType`): f32 as they are, or 16-bit
//! floats rounded to nearest even on the way up and widened to f32 on the way back.
//!
//! Must not: decide which layers keep 16-bit rows (the executor does, `exec::device::kv_rows`).

use super::context::{Context, DeviceBuffer};
use super::error::Result;
use super::kv_type::KvType;
use crate::bytes::as_bytes;

impl Context {
    /// Appends `count` elements of `kv` read at byte `offset` of `buf` to `out`, widened to f32
    /// (a K/V mirror's read-back rows); on an error `out` is as it was.
    pub fn read_append_kv(
        &self,
        buf: &DeviceBuffer,
        offset: usize,
        count: usize,
        kv: KvType,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        match kv {
            KvType::F32 => self.read_append_f32(buf, offset, count, out),
            KvType::F16 => {
                let mut bits = vec![0u16; count];
                // SAFETY: `bits` is `count` u16 of writable memory.
                unsafe { self.read_raw(buf, offset, bits.as_mut_ptr().cast(), count * 2)? };
                let at = out.len();
                out.resize(at + count, 0.0);
                half::slice::HalfFloatSliceExt::convert_to_f32_slice(
                    half::slice::HalfBitsSliceExt::reinterpret_cast::<half::f16>(bits.as_slice()),
                    &mut out[at..],
                );
                Ok(())
            }
        }
    }

    /// Writes `data` as elements of `kv` (f16: each rounded to nearest even) at byte `offset`
    /// of `buf` (a K/V mirror's rows).
    pub fn write_kv(&self, buf: &DeviceBuffer, offset: usize, data: &[f32], kv: KvType) -> Result<()> {
        match kv {
            KvType::F32 => self.write(buf, offset, as_bytes(data)),
            KvType::F16 => {
                let mut bits = vec![half::f16::ZERO; data.len()];
                half::slice::HalfFloatSliceExt::convert_from_f32_slice(bits.as_mut_slice(), data);
                let bits: &[u16] = half::slice::HalfFloatSliceExt::reinterpret_cast(bits.as_slice());
                self.write(buf, offset, as_bytes(bits))
            }
        }
    }
}
