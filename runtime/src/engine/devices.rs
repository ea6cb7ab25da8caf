//! Step 1 of a load: open the devices asked for (the primary, then a second one beside it),
//! and the profile the plan is compiled for (the given one, else the devices' probed profile,
//! else CPU only), with one line saying where the model runs and why.
//!
//! Must not: compile or upload anything; a device that cannot be opened is an error only when
//! one was required (`DeviceRequest::Vulkan`).

use super::{DeviceRequest, EngineError, EngineOptions};
use crate::exec::probe::profile_of_devices;
use crate::vk::{Context, DeviceKind, DeviceRole, KvType, VkOptions};
use coli_compiler::DeviceProfile;

/// The devices opened for a load.
pub(super) struct Opened {
    /// The primary first; empty: the CPU runs everything.
    pub ctxs: Vec<Context>,
    pub profile: DeviceProfile,
    /// Where the model runs and why.
    pub note: String,
    /// A device was opened for the model: a load that ends on the CPU says so.
    pub opened: bool,
}

/// Opens what `opts.device` and `opts.second_device` ask for.
pub(super) fn open(opts: &EngineOptions) -> Result<Opened, EngineError> {
    let cpu = |note: String| Opened {
        ctxs: Vec::new(),
        profile: opts.profile.clone().unwrap_or_else(DeviceProfile::cpu_only),
        note,
        opened: false,
    };
    let required = opts.device.required();
    // 1. The primary device.
    let (primary, primary_opts) = match &opts.device {
        DeviceRequest::Cpu => return Ok(cpu("running on the CPU".to_string())),
        DeviceRequest::Vulkan(o) | DeviceRequest::Auto(o) => match Context::new(o) {
            // A CPU Vulkan device (Lavapipe) is slower than the CPU op library: `Auto` takes
            // GPUs only.
            Ok(c) if !required && c.caps().kind == DeviceKind::Cpu => {
                return Ok(cpu(format!(
                    "the only Vulkan device is a CPU device ({}); running on the CPU",
                    c.caps().name
                )));
            }
            Ok(c) => (c, o),
            Err(e) if required => return Err(EngineError::NoDevice(e)),
            Err(e) => return Ok(cpu(format!("no Vulkan device ({e}); running on the CPU"))),
        },
    };
    // 2. A second device beside it, when asked for.
    let mut second_note = None;
    let second = match &opts.second_device {
        Some(s) => {
            let o =
                VkOptions { role: DeviceRole::Second { primary_name: primary_opts.device_name.clone() }, ..s.clone() };
            match Context::new(&o) {
                Ok(c) => Some((c, o.memory_cap)),
                Err(e) if required => return Err(EngineError::SecondDevice(e)),
                Err(e) => {
                    second_note = Some(format!("no second device ({e})"));
                    None
                }
            }
        }
        None => None,
    };
    let mut ctxs = vec![(primary, primary_opts.memory_cap)];
    ctxs.extend(second);
    // 3. The profile, and the note.
    let profile = match &opts.profile {
        Some(p) => p.clone(),
        None => profile_of_devices(&ctxs.iter().map(|(c, cap)| (c, *cap)).collect::<Vec<_>>()),
    };
    let mut note = match ctxs.as_slice() {
        [(c, _), (s, _), ..] => {
            let same = if c.physical_index() == s.physical_index() {
                " (a second logical device of the same physical device)"
            } else {
                ""
            };
            format!("running on {} and {}{same}", c.describe(), s.describe())
        }
        [(c, _)] => format!("running on {}", c.describe()),
        [] => "running on the CPU".to_string(),
    };
    if let Some(n) = second_note {
        note = format!("{note}; {n}");
    }
    // The K/V mirrors' type when asked for f16 (a device without 16-bit storage keeps f32).
    if primary_opts.kv_mirror == KvType::F16 {
        let f32s = ctxs.iter().filter(|(c, _)| c.kv_mirror() == KvType::F32).count();
        note = match f32s {
            0 => format!("{note}; K/V cache on the device in f16"),
            n => {
                format!("{note}; K/V cache in f32 on {n} of {} devices (f16 needs 16-bit storage buffers)", ctxs.len())
            }
        };
    }
    Ok(Opened { ctxs: ctxs.into_iter().map(|(c, _)| c).collect(), profile, note, opened: true })
}
