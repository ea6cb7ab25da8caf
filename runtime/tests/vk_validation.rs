//! `Validation::On`: the Khronos layer's messages are counted per context and process-wide, an
//! error fails the context's next submission with `VkError::Validation`, and a test that
//! provokes one on purpose takes it (`take_validation_errors`), so it fails neither later
//! submissions nor the process. Skips, saying why, where the layer is not installed.
//!
//! The process's exit status is checked in a child: this binary run again on one test
//! (`untaken_error_child`, which does its work only with `CHILD` set) that leaves an error
//! untaken.
//!
//! Must not: leave an error untaken in this process (it would exit with status 1).

mod vk_common;

use ash::vk;
use coli_runtime::vk::{validation_counts, Context, Validation, VkError, VkOptions};

/// The error the provoking call makes: a buffer created with no usage bit.
const VUID: &str = "VUID-VkBufferCreateInfo-usage-requiredbitmask";

/// Set in the child process of `an_untaken_error_fails_the_process`.
const CHILD: &str = "COLI_VK_VALIDATION_TEST_CHILD";

/// A context under the layer, or `None` (printed) where the layer or Vulkan is missing.
fn validated() -> Option<Context> {
    match Context::new(&VkOptions { validation: Validation::On, ..Default::default() }) {
        Ok(c) => Some(c),
        Err(VkError::NoValidationLayer) => {
            eprintln!("skipping: the validation layer is not installed (apt-get install vulkan-validationlayers)");
            None
        }
        // No Vulkan at all: the suite's rule (fail, unless COLI_VK_TESTS=skip).
        Err(_) => vk_common::open(&VkOptions::default()).and(None),
    }
}

/// Creates (and destroys) a buffer with no usage bit: error `VUID`.
fn provoke(ctx: &Context) {
    let dev = ctx.ash_device();
    let bad = vk::BufferCreateInfo::default()
        .size(256)
        .usage(vk::BufferUsageFlags::empty())
        .sharing_mode(vk::SharingMode::EXCLUSIVE);
    // SAFETY: the device is live; the buffer (if the driver makes one) is destroyed at once and
    // never bound or used.
    unsafe {
        if let Ok(b) = dev.create_buffer(&bad, None) {
            dev.destroy_buffer(b, None);
        }
    }
}

/// A frame with one copy, run.
fn run_copy(ctx: &Context) -> Result<(), VkError> {
    let src = ctx.upload_f32(&[1.0, 2.0, 3.0, 4.0])?;
    let dst = ctx.f32_buffer(4)?;
    let mut f = ctx.frame()?;
    f.copy(src.all(), dst.all())?;
    f.run()?;
    assert_eq!(ctx.download_f32(dst.all())?, [1.0, 2.0, 3.0, 4.0]);
    Ok(())
}

#[test]
fn clean_work_reports_no_error() {
    let Some(ctx) = validated() else { return };
    run_copy(&ctx).unwrap();
    let counts = ctx.validation_counts().expect("validation is on");
    assert_eq!(counts.errors, 0, "{:?}", ctx.take_validation_errors());
}

#[test]
fn a_provoked_error_is_counted_and_fails_the_next_submission() {
    let Some(ctx) = validated() else { return };
    let before = validation_counts();
    provoke(&ctx);
    let counts = ctx.validation_counts().expect("validation is on");
    assert!(counts.errors >= 1, "the layer reported nothing for a buffer with no usage");
    assert!(validation_counts().errors > before.errors, "the process-wide count did not move");

    match run_copy(&ctx) {
        Err(VkError::Validation { errors, first }) => {
            assert!(errors >= 1);
            assert!(first.contains(VUID), "the first error is not the provoked one: {first}");
        }
        other => panic!("the submission after the error gave {other:?}"),
    }
    let taken = ctx.take_validation_errors();
    assert!(taken.iter().any(|t| t.contains(VUID)), "{taken:?}");
    assert!(ctx.take_validation_errors().is_empty(), "taken twice");
    run_copy(&ctx).expect("a clean submission after the errors were taken");
}

/// Synchronization validation is on: two fills of one range with no barrier between them, in a
/// command buffer of the test's own (recorded, never submitted), are a write-after-write hazard.
#[test]
fn a_missing_barrier_is_a_synchronization_error() {
    let Some(ctx) = validated() else { return };
    let dev = ctx.ash_device();
    let bci = vk::BufferCreateInfo::default()
        .size(256)
        .usage(vk::BufferUsageFlags::TRANSFER_DST)
        .sharing_mode(vk::SharingMode::EXCLUSIVE);
    let pci = vk::CommandPoolCreateInfo::default().queue_family_index(ctx.caps().compute_family);
    // SAFETY: every object is made on the live device, recorded into a command buffer that is
    // never submitted, and destroyed before the test ends.
    unsafe {
        let buf = dev.create_buffer(&bci, None).unwrap();
        let req = dev.get_buffer_memory_requirements(buf);
        let mai = vk::MemoryAllocateInfo::default()
            .allocation_size(req.size)
            .memory_type_index(req.memory_type_bits.trailing_zeros());
        let mem = dev.allocate_memory(&mai, None).unwrap();
        dev.bind_buffer_memory(buf, mem, 0).unwrap();
        let pool = dev.create_command_pool(&pci, None).unwrap();
        let cai = vk::CommandBufferAllocateInfo::default()
            .command_pool(pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        let cmd = dev.allocate_command_buffers(&cai).unwrap()[0];
        dev.begin_command_buffer(cmd, &vk::CommandBufferBeginInfo::default()).unwrap();
        dev.cmd_fill_buffer(cmd, buf, 0, 256, 1);
        dev.cmd_fill_buffer(cmd, buf, 0, 256, 2);
        dev.end_command_buffer(cmd).unwrap();
        dev.destroy_command_pool(pool, None);
        dev.destroy_buffer(buf, None);
        dev.free_memory(mem, None);
    }
    let taken = ctx.take_validation_errors();
    assert!(taken.iter().any(|t| t.contains("SYNC-HAZARD-WRITE-AFTER-WRITE")), "{taken:?}");
}

/// The child's work: an error nobody takes (the test itself passes).
#[test]
fn untaken_error_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let Some(ctx) = validated() else { return };
    provoke(&ctx);
}

#[test]
fn an_untaken_error_fails_the_process() {
    if std::env::var_os(CHILD).is_some() || validated().is_none() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args(["--exact", "untaken_error_child", "--nocapture"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "child: {stderr}");
    assert!(stderr.contains("vulkan validation: 1 error(s) in this process") && stderr.contains(VUID), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"), "the child's test itself passes");
}

#[test]
fn a_bad_environment_value_is_a_typed_error() {
    let opts = VkOptions { validation: Validation::BadEnv("yes".into()), ..Default::default() };
    match Context::new(&opts) {
        Err(e @ VkError::BadEnvironment { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("COLI_VK_VALIDATION") && msg.contains("yes"), "{msg}");
        }
        other => panic!("expected BadEnvironment, got {other:?}"),
    }
}
