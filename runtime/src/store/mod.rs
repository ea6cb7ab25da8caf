//! What the op libraries read and write beside the row buffers: a model's weights as the
//! checkpoint holds them (`weights::WeightStore`; `unread` the tensors it leaves) and a sequence's KV cache and recurrent
//! states (`kv::KvCache`). Below the CPU library, the executor and the expert tier, so each of
//! them depends on it and it on none of them.

pub mod kv;
pub mod unread;
pub mod weights;
