//! The host KV cache: per attention layer, the K and V rows of every position so far. The
//! host's copy is canonical; a device mirror (later) follows it behind a watermark. An MLA
//! layer (DeepSeek) keeps its normalized latent in the `k` rows and its rotated shared rope
//! key in the `v` rows (`cpu::mla`).

/// K and V rows of one layer, position-major (`len x width`).
#[derive(Clone, Debug, Default)]
pub struct LayerKv {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub k_width: usize,
    pub v_width: usize,
}

impl LayerKv {
    pub fn len(&self) -> usize {
        if self.k_width == 0 {
            0
        } else {
            self.k.len() / self.k_width
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `n` rows at the end; they must be the rows of positions `len .. len + n`.
    pub fn append(&mut self, k: &[f32], v: &[f32]) {
        self.k.extend_from_slice(k);
        self.v.extend_from_slice(v);
    }

    /// Forgets every position from `len` on.
    pub fn truncate(&mut self, len: usize) {
        self.k.truncate(len * self.k_width);
        self.v.truncate(len * self.v_width);
    }
}

/// The KV rows of every layer (layers without attention keep an empty entry).
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    pub layers: Vec<LayerKv>,
}

impl KvCache {
    pub fn new(widths: &[(usize, usize)]) -> KvCache {
        KvCache { layers: widths.iter().map(|&(k_width, v_width)| LayerKv { k_width, v_width, ..Default::default() }).collect() }
    }

    pub fn truncate(&mut self, len: usize) {
        self.layers.iter_mut().for_each(|l| l.truncate(len));
    }

    /// Bytes held by the cache.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|l| (l.k.len() + l.v.len()) * 4).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_and_truncate_track_positions() {
        let mut c = KvCache::new(&[(2, 3)]);
        c.layers[0].append(&[1.0, 2.0, 3.0, 4.0], &[0.0; 6]);
        assert_eq!(c.layers[0].len(), 2);
        c.truncate(1);
        assert_eq!(c.layers[0].k, vec![1.0, 2.0]);
        assert_eq!(c.layers[0].v.len(), 3);
    }
}
