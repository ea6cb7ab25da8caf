//! The bridge from the checkpoint reader's GGUF metadata to the tokenizer's `GgufKv` view, so
//! neither `model` nor `text` depends on the other.

use crate::model::gguf::GgufMetadata;
use crate::text::GgufKv;

impl GgufKv for GgufMetadata {
    fn get_str(&self, key: &str) -> Option<String> {
        GgufMetadata::get_str(self, key).map(str::to_string)
    }
    fn get_u64(&self, key: &str) -> Option<u64> {
        GgufMetadata::get_u64(self, key)
    }
    fn get_bool(&self, key: &str) -> Option<bool> {
        GgufMetadata::get_bool(self, key)
    }
    fn get_str_array(&self, key: &str) -> Option<Vec<String>> {
        GgufMetadata::get_str_array(self, key).map(|a| a.to_vec())
    }
    fn get_i64_array(&self, key: &str) -> Option<Vec<i64>> {
        GgufMetadata::get_i32_array(self, key).map(|a| a.into_iter().map(i64::from).collect())
    }
    fn get_f32_array(&self, key: &str) -> Option<Vec<f32>> {
        GgufMetadata::get_f32_array(self, key)
    }
}
