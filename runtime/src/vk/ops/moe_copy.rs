//! Copies of experts between two stacks of slots of one shape (`Frame::copy_experts`): a big
//! step's experts from the tier's host pool into a device page before the expert kernels read
//! them, so each crosses the bus once, in copy commands, instead of in the kernels' own reads.
//!
//! Must not: copy between stacks whose slots differ in format, shape or biases.

use super::moe::DeviceExperts;
use crate::vk::error::{Result, VkError};
use crate::vk::frame::Frame;

impl<'a> Frame<'a> {
    /// Copies slot `src` of `from` into slot `dst` of `to` for each `(src, dst)` of `slots`,
    /// a region per role and run of slots neighbouring on both sides.
    pub fn copy_experts(
        &mut self,
        from: &'a DeviceExperts,
        to: &'a DeviceExperts,
        slots: &[(usize, usize)],
    ) -> Result<()> {
        let mut slots = slots.to_vec();
        slots.sort_unstable();
        let out = slots.iter().find(|&&(s, d)| s >= from.experts || d >= to.experts);
        if from.units != to.units || from.bias.is_some() != to.bias.is_some() || out.is_some() {
            return Err(VkError::BadArgument {
                op: "copy_experts",
                msg: format!("{out:?} from {} slots into {}, or slots of another shape", from.experts, to.experts),
            });
        }
        let [(_, _, _, gq, gs), (_, _, _, dq, ds)] = from.units;
        let (f, h) = (from.ffn, from.hidden);
        let mut i = 0;
        while i < slots.len() {
            let mut j = i + 1;
            while j < slots.len() && slots[j] == (slots[j - 1].0 + 1, slots[j - 1].1 + 1) {
                j += 1;
            }
            let ((a, b), n) = (slots[i], j - i);
            self.copy_bytes(&from.gate_up.q, 2 * a * gq, &to.gate_up.q, 2 * b * gq, 2 * n * gq)?;
            if gs > 0 {
                self.copy_bytes(&from.gate_up.s, 2 * a * gs, &to.gate_up.s, 2 * b * gs, 2 * n * gs)?;
            }
            self.copy_bytes(&from.down.q, a * dq, &to.down.q, b * dq, n * dq)?;
            if ds > 0 {
                self.copy_bytes(&from.down.s, a * ds, &to.down.s, b * ds, n * ds)?;
            }
            if let (Some(fb), Some(tb)) = (&from.bias, &to.bias) {
                // Gate and up biases by slot, then the downs' after every slot's gate and up.
                self.copy_bytes(fb, a * 2 * f * 4, tb, b * 2 * f * 4, n * 2 * f * 4)?;
                let (fd, td) = ((from.experts * 2 * f + a * h) * 4, (to.experts * 2 * f + b * h) * 4);
                self.copy_bytes(fb, fd, tb, td, n * h * 4)?;
            }
            i = j;
        }
        Ok(())
    }
}
