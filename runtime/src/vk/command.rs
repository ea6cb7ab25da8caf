//! Command recording resources of one frame: a command pool with one primary command buffer,
//! descriptor pools that grow as sets are taken, and the fence the submission signals.
//! Each frame owns its own pool, so frames can be recorded on different threads.
//!
//! Must not: submit (context.rs owns the queue) or decide what is recorded.

use super::error::{Result, VkResultExt};
use ash::vk;

const SETS_PER_POOL: u32 = 256;

pub(crate) struct Commands {
    pub pool: vk::CommandPool,
    pub cmd: vk::CommandBuffer,
    pub fence: vk::Fence,
    desc_pools: Vec<vk::DescriptorPool>,
}

impl Commands {
    /// Creates the pool, the command buffer (recording begun) and an unsignalled fence.
    ///
    /// # Safety
    /// `dev` must be live; the result must be `destroy`ed on the same device.
    pub unsafe fn new(dev: &ash::Device, family: u32) -> Result<Commands> {
        let pool = dev
            .create_command_pool(&vk::CommandPoolCreateInfo::default().queue_family_index(family).flags(vk::CommandPoolCreateFlags::TRANSIENT), None)
            .ctx("vkCreateCommandPool")?;
        let mut c = Commands { pool, cmd: vk::CommandBuffer::null(), fence: vk::Fence::null(), desc_pools: Vec::new() };
        let r = (|| {
            let ai = vk::CommandBufferAllocateInfo::default().command_pool(pool).level(vk::CommandBufferLevel::PRIMARY).command_buffer_count(1);
            c.cmd = dev.allocate_command_buffers(&ai).ctx("vkAllocateCommandBuffers")?[0];
            c.fence = dev.create_fence(&vk::FenceCreateInfo::default(), None).ctx("vkCreateFence")?;
            let bi = vk::CommandBufferBeginInfo::default().flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
            dev.begin_command_buffer(c.cmd, &bi).ctx("vkBeginCommandBuffer")
        })();
        match r {
            Ok(()) => Ok(c),
            Err(e) => {
                c.destroy(dev);
                Err(e)
            }
        }
    }

    /// A descriptor set of `layout` from the frame's pools.
    ///
    /// # Safety
    /// `layout` must be live on `dev`.
    pub unsafe fn descriptor_set(&mut self, dev: &ash::Device, layout: vk::DescriptorSetLayout) -> Result<vk::DescriptorSet> {
        let layouts = [layout];
        if let Some(&pool) = self.desc_pools.last() {
            let ai = vk::DescriptorSetAllocateInfo::default().descriptor_pool(pool).set_layouts(&layouts);
            match dev.allocate_descriptor_sets(&ai) {
                Ok(s) => return Ok(s[0]),
                Err(vk::Result::ERROR_OUT_OF_POOL_MEMORY) | Err(vk::Result::ERROR_FRAGMENTED_POOL) => {}
                Err(r) => return Err(super::error::VkError::from_vk("vkAllocateDescriptorSets", r)),
            }
        }
        let sizes = [vk::DescriptorPoolSize::default().ty(vk::DescriptorType::STORAGE_BUFFER).descriptor_count(SETS_PER_POOL * 8)];
        let pool = dev
            .create_descriptor_pool(&vk::DescriptorPoolCreateInfo::default().max_sets(SETS_PER_POOL).pool_sizes(&sizes), None)
            .ctx("vkCreateDescriptorPool")?;
        self.desc_pools.push(pool);
        let ai = vk::DescriptorSetAllocateInfo::default().descriptor_pool(pool).set_layouts(&layouts);
        Ok(dev.allocate_descriptor_sets(&ai).ctx("vkAllocateDescriptorSets")?[0])
    }

    /// A full memory barrier between consecutive commands (compute and transfer), and toward
    /// host reads at the end of the frame.
    ///
    /// # Safety
    /// The command buffer must be recording.
    pub unsafe fn barrier(&self, dev: &ash::Device, to_host: bool) {
        let all = vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_READ | vk::AccessFlags::TRANSFER_WRITE;
        let (dst_stage, dst_access) = if to_host {
            (vk::PipelineStageFlags::HOST, vk::AccessFlags::HOST_READ)
        } else {
            (vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER, all)
        };
        let mb = [vk::MemoryBarrier::default().src_access_mask(vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE).dst_access_mask(dst_access)];
        dev.cmd_pipeline_barrier(
            self.cmd,
            vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER,
            dst_stage,
            vk::DependencyFlags::empty(),
            &mb,
            &[],
            &[],
        );
    }

    /// # Safety
    /// The command buffer must not be pending on the device.
    pub unsafe fn destroy(&mut self, dev: &ash::Device) {
        for p in self.desc_pools.drain(..) {
            dev.destroy_descriptor_pool(p, None);
        }
        if self.fence != vk::Fence::null() {
            dev.destroy_fence(self.fence, None);
        }
        dev.destroy_command_pool(self.pool, None);
    }
}
