//! Copies of experts between two stacks of slots of one shape (`Frame::copy_experts`): a big
//! step's experts from the tier's host pool into a device page before the expert kernels read
//! them, so each crosses the bus once, in copy commands, instead of in the kernels' own reads.
//!
//! Must not: copy between stacks whose slots differ in format, shape or biases.

use super::moe::DeviceExperts;
use crate::vk::error::{Result, VkError};
use crate::vk::frame::Frame;

impl<'a> Frame<'a> {
    /// Copies slots `slots` of `from` into the same slots of `to`, a region per run of
    /// neighbouring slots and role.
    pub fn copy_experts(&mut self, from: &'a DeviceExperts, to: &'a DeviceExperts, slots: &[usize]) -> Result<()> {
        let mut slots = slots.to_vec();
        slots.sort_unstable();
        slots.dedup();
        let last = slots.last().copied().unwrap_or(0);
        if from.units != to.units || from.bias.is_some() != to.bias.is_some() || last >= from.experts.min(to.experts) {
            return Err(VkError::BadArgument {
                op: "copy_experts",
                msg: format!("slot {last} from {} slots into {}, or slots of another shape", from.experts, to.experts),
            });
        }
        let [(_, _, _, gq, gs), (_, _, _, dq, ds)] = from.units;
        let (f, h) = (from.ffn, from.hidden);
        let mut i = 0;
        while i < slots.len() {
            let mut j = i + 1;
            while j < slots.len() && slots[j] == slots[j - 1] + 1 {
                j += 1;
            }
            let (a, n) = (slots[i], j - i);
            self.copy_bytes(&from.gate_up.q, 2 * a * gq, &to.gate_up.q, 2 * a * gq, 2 * n * gq)?;
            if gs > 0 {
                self.copy_bytes(&from.gate_up.s, 2 * a * gs, &to.gate_up.s, 2 * a * gs, 2 * n * gs)?;
            }
            self.copy_bytes(&from.down.q, a * dq, &to.down.q, a * dq, n * dq)?;
            if ds > 0 {
                self.copy_bytes(&from.down.s, a * ds, &to.down.s, a * ds, n * ds)?;
            }
            if let (Some(fb), Some(tb)) = (&from.bias, &to.bias) {
                // Gate and up biases by slot, then the downs' after every slot's gate and up.
                self.copy_bytes(fb, a * 2 * f * 4, tb, a * 2 * f * 4, n * 2 * f * 4)?;
                let (fd, td) = ((from.experts * 2 * f + a * h) * 4, (to.experts * 2 * f + a * h) * 4);
                self.copy_bytes(fb, fd, tb, td, n * h * 4)?;
            }
            i = j;
        }
        Ok(())
    }
}
