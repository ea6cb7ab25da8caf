//! Command recording resources of one frame: a command pool with one primary command buffer,
//! descriptor pools that grow as sets are taken (unused where the device pushes descriptors),
//! the fence the submission signals, and a timestamp query pool when profiling. Frames reuse
//! them (`begin` resets everything), so a forward creates no Vulkan objects once warm.
//! Each frame owns its own pool, so frames can be recorded on different threads.
//!
//! Must not: submit (context.rs owns the queue) or decide what is recorded.

use super::error::{Result, VkResultExt};
use ash::vk;

const SETS_PER_POOL: u32 = 256;

/// Which earlier commands a barrier waits for (at least one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Waits {
    /// Compute dispatches.
    pub kernels: bool,
    /// Copy, fill and update commands.
    pub copies: bool,
}

impl Waits {
    pub const BOTH: Waits = Waits { kernels: true, copies: true };
}

pub(crate) struct Commands {
    pub pool: vk::CommandPool,
    pub cmd: vk::CommandBuffer,
    pub fence: vk::Fence,
    desc_pools: Vec<vk::DescriptorPool>,
    /// The descriptor pool sets are taken from now (pools before it are full).
    desc_current: usize,
    /// Timestamp queries (profiling), `query_cap` of them; null until asked for.
    pub queries: vk::QueryPool,
    pub query_cap: u32,
}

impl Commands {
    /// Creates the pool, the command buffer (not recording) and an unsignalled fence.
    ///
    /// # Safety
    /// `dev` must be live; the result must be `destroy`ed on the same device.
    pub unsafe fn new(dev: &ash::Device, family: u32) -> Result<Commands> {
        let pool = dev
            .create_command_pool(
                &vk::CommandPoolCreateInfo::default()
                    .queue_family_index(family)
                    .flags(vk::CommandPoolCreateFlags::TRANSIENT),
                None,
            )
            .ctx("vkCreateCommandPool")?;
        let mut c = Commands {
            pool,
            cmd: vk::CommandBuffer::null(),
            fence: vk::Fence::null(),
            desc_pools: Vec::new(),
            desc_current: 0,
            queries: vk::QueryPool::null(),
            query_cap: 0,
        };
        let r = (|| {
            let ai = vk::CommandBufferAllocateInfo::default()
                .command_pool(pool)
                .level(vk::CommandBufferLevel::PRIMARY)
                .command_buffer_count(1);
            c.cmd = dev.allocate_command_buffers(&ai).ctx("vkAllocateCommandBuffers")?[0];
            c.fence = dev.create_fence(&vk::FenceCreateInfo::default(), None).ctx("vkCreateFence")?;
            Ok(())
        })();
        match r {
            Ok(()) => Ok(c),
            Err(e) => {
                c.destroy(dev);
                Err(e)
            }
        }
    }

    /// Resets the command buffer and the descriptor pools and begins recording. `once`: the
    /// buffer is submitted once (else it may be submitted again, one submission at a time).
    ///
    /// # Safety
    /// No submission of this command buffer may be pending.
    pub unsafe fn begin(&mut self, dev: &ash::Device, once: bool) -> Result<()> {
        dev.reset_command_pool(self.pool, vk::CommandPoolResetFlags::empty()).ctx("vkResetCommandPool")?;
        for &p in &self.desc_pools {
            dev.reset_descriptor_pool(p, vk::DescriptorPoolResetFlags::empty()).ctx("vkResetDescriptorPool")?;
        }
        self.desc_current = 0;
        let flags =
            if once { vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT } else { vk::CommandBufferUsageFlags::empty() };
        dev.begin_command_buffer(self.cmd, &vk::CommandBufferBeginInfo::default().flags(flags))
            .ctx("vkBeginCommandBuffer")
    }

    /// A descriptor set of `layout` from the frame's pools.
    ///
    /// # Safety
    /// `layout` must be live on `dev`.
    pub unsafe fn descriptor_set(
        &mut self,
        dev: &ash::Device,
        layout: vk::DescriptorSetLayout,
    ) -> Result<vk::DescriptorSet> {
        let layouts = [layout];
        while let Some(&pool) = self.desc_pools.get(self.desc_current) {
            let ai = vk::DescriptorSetAllocateInfo::default().descriptor_pool(pool).set_layouts(&layouts);
            match dev.allocate_descriptor_sets(&ai) {
                Ok(s) => return Ok(s[0]),
                Err(vk::Result::ERROR_OUT_OF_POOL_MEMORY) | Err(vk::Result::ERROR_FRAGMENTED_POOL) => {
                    self.desc_current += 1
                }
                Err(r) => return Err(super::error::VkError::from_vk("vkAllocateDescriptorSets", r)),
            }
        }
        let sizes = [vk::DescriptorPoolSize::default()
            .ty(vk::DescriptorType::STORAGE_BUFFER)
            .descriptor_count(SETS_PER_POOL * 8)];
        let pool = dev
            .create_descriptor_pool(
                &vk::DescriptorPoolCreateInfo::default().max_sets(SETS_PER_POOL).pool_sizes(&sizes),
                None,
            )
            .ctx("vkCreateDescriptorPool")?;
        self.desc_pools.push(pool);
        self.desc_current = self.desc_pools.len() - 1;
        let ai = vk::DescriptorSetAllocateInfo::default().descriptor_pool(pool).set_layouts(&layouts);
        Ok(dev.allocate_descriptor_sets(&ai).ctx("vkAllocateDescriptorSets")?[0])
    }

    /// Makes room for `n` timestamp queries (a new pool when the current one is smaller).
    ///
    /// # Safety
    /// No submission using the current query pool may be pending, and the command buffer
    /// must not be recording yet.
    pub unsafe fn ensure_queries(&mut self, dev: &ash::Device, n: u32) -> Result<()> {
        if self.query_cap >= n {
            return Ok(());
        }
        if self.queries != vk::QueryPool::null() {
            dev.destroy_query_pool(self.queries, None);
            self.queries = vk::QueryPool::null();
            self.query_cap = 0;
        }
        let qi = vk::QueryPoolCreateInfo::default().query_type(vk::QueryType::TIMESTAMP).query_count(n);
        self.queries = dev.create_query_pool(&qi, None).ctx("vkCreateQueryPool")?;
        self.query_cap = n;
        Ok(())
    }

    /// A barrier toward host reads at the end of the frame, after every earlier command.
    ///
    /// # Safety
    /// The command buffer must be recording.
    pub unsafe fn barrier_to_host(&self, dev: &ash::Device) {
        self.barrier_to(dev, Waits::BOTH, (vk::PipelineStageFlags::HOST, vk::AccessFlags::HOST_READ));
    }

    /// A memory barrier before later kernels and copy commands that waits only for the earlier
    /// commands `waits` names: a copy still running is not waited for by a barrier between two
    /// kernels that do not touch its ranges (the frame's hazards say which).
    ///
    /// # Safety
    /// The command buffer must be recording.
    pub unsafe fn barrier_after(&self, dev: &ash::Device, waits: Waits) {
        let all = vk::AccessFlags::SHADER_READ
            | vk::AccessFlags::SHADER_WRITE
            | vk::AccessFlags::TRANSFER_READ
            | vk::AccessFlags::TRANSFER_WRITE;
        let dst = vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER;
        self.barrier_to(dev, waits, (dst, all));
    }

    unsafe fn barrier_to(&self, dev: &ash::Device, waits: Waits, dst: (vk::PipelineStageFlags, vk::AccessFlags)) {
        let (mut src_stage, mut src_access) = (vk::PipelineStageFlags::empty(), vk::AccessFlags::empty());
        if waits.kernels {
            src_stage |= vk::PipelineStageFlags::COMPUTE_SHADER;
            src_access |= vk::AccessFlags::SHADER_WRITE;
        }
        if waits.copies {
            src_stage |= vk::PipelineStageFlags::TRANSFER;
            src_access |= vk::AccessFlags::TRANSFER_WRITE;
        }
        let mb = [vk::MemoryBarrier::default().src_access_mask(src_access).dst_access_mask(dst.1)];
        dev.cmd_pipeline_barrier(self.cmd, src_stage, dst.0, vk::DependencyFlags::empty(), &mb, &[], &[]);
    }

    /// # Safety
    /// The command buffer must not be pending on the device.
    pub unsafe fn destroy(&mut self, dev: &ash::Device) {
        for p in self.desc_pools.drain(..) {
            dev.destroy_descriptor_pool(p, None);
        }
        if self.queries != vk::QueryPool::null() {
            dev.destroy_query_pool(self.queries, None);
        }
        if self.fence != vk::Fence::null() {
            dev.destroy_fence(self.fence, None);
        }
        dev.destroy_command_pool(self.pool, None);
    }
}
