//! Limits: the largest sizes and nestings the compiler accepts, named in one place.
//!
//! Each is generous for real models (the largest published checkpoints sit one or more orders of
//! magnitude below) and small enough that nothing sized by it (a `Vec` of layers, a loop over
//! experts, a row buffer of a value's width, a byte count of a product of them) can exhaust
//! memory or overflow. They are checked where a size first becomes known: when the required
//! symbols are bound, when an op's sizes are evaluated, when a value's width is, and while the
//! spec reader and the expression parser descend. A size past its limit is a located
//! diagnostic, never an allocation. This module must not decide where a limit is checked.

use std::fmt;

/// One limit: what it bounds (for messages) and the largest value accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    /// What is counted, plural (`layers`, `experts`).
    pub what: &'static str,
    pub max: usize,
}

impl Limit {
    /// `Ok(v)` when `v` is within the limit, else the message saying so.
    pub fn check(self, v: usize) -> Result<usize, String> {
        if v <= self.max {
            Ok(v)
        } else {
            Err(format!("{v} is past the limit of {} ({})", self.max, self.what))
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at most {} {}", self.max, self.what)
    }
}

/// A bound on the magnitude of a Float.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Magnitude {
    /// What is bounded (for messages).
    pub what: &'static str,
    pub max: f64,
}

impl Magnitude {
    /// `Ok(x)` when `|x| <= max`, else the message saying so.
    pub fn check(self, x: f64) -> Result<f64, String> {
        if x.abs() <= self.max {
            Ok(x)
        } else {
            Err(format!("{x:?} is past the limit of {} ({})", self.max, self.what))
        }
    }
}

/// A multiplier of activations (an attention, embedding, routing or value scale, a norm's
/// offset, a GLU's alpha): real ones lie within about 0.01..100; past the bound, activations
/// of ordinary size overflow f32.
pub const SCALE: Magnitude = Magnitude { what: "the magnitude of a scale", max: 65536.0 };

/// Layers of a model (the largest dense models have about 130).
pub const LAYERS: Limit = Limit { what: "layers", max: 4096 };
/// Routed experts of one MoE layer (DeepSeek-V3 has 256).
pub const EXPERTS: Limit = Limit { what: "experts", max: 1 << 16 };
/// Experts chosen per token.
pub const TOP_K: Limit = Limit { what: "experts chosen per token", max: 1 << 10 };
/// Attention (query, KV, key or value) heads of one mixer.
pub const HEADS: Limit = Limit { what: "heads", max: 1 << 12 };
/// Width of one head, and the latent ranks of MLA.
pub const HEAD_DIM: Limit = Limit { what: "columns per head or latent rank", max: 1 << 14 };
/// Entries of the vocabulary (the largest tokenizers have about 2^18).
pub const VOCAB: Limit = Limit { what: "tokens of vocabulary", max: 1 << 24 };
/// The residual stream's width (`hidden`; the largest models use about 2^14).
pub const HIDDEN: Limit = Limit { what: "columns of hidden width", max: 1 << 18 };
/// Width of any row buffer (the logits are `vocab` wide) and of an FFN.
pub const WIDTH: Limit = Limit { what: "columns of a row buffer", max: 1 << 24 };
/// Positions of context (`max_context`, a sliding window).
pub const CONTEXT: Limit = Limit { what: "positions of context", max: 1 << 24 };
/// Width of a causal convolution's kernel (Gated DeltaNet uses 4).
pub const CONV_KERNEL: Limit = Limit { what: "taps of a convolution kernel", max: 1 << 10 };
/// Streams of a multi-stream residual (DeepSeek V4's hyper-connections use 4).
pub const STREAMS: Limit = Limit { what: "streams of the residual", max: 64 };
/// Iterations of a fixed-point loop (hyper-connections' Sinkhorn projection uses 20).
pub const ITERATIONS: Limit = Limit { what: "iterations", max: 1 << 12 };
/// Nesting of values in a RON file (the specs nest about 8 deep).
pub const RON_DEPTH: Limit = Limit { what: "levels of nesting in a RON file", max: 128 };
/// Nesting of an expression (parentheses, operators, calls).
pub const EXPR_DEPTH: Limit = Limit { what: "levels of nesting in an expression", max: 256 };
/// Nesting of `Block`s in a layer body.
pub const BLOCK_DEPTH: Limit = Limit { what: "levels of nested blocks", max: 16 };

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_takes_its_maximum_and_refuses_one_more() {
        assert_eq!(LAYERS.check(4096), Ok(4096));
        let e = LAYERS.check(4097).unwrap_err();
        assert_eq!(e, "4097 is past the limit of 4096 (layers)");
        assert_eq!(LAYERS.to_string(), "at most 4096 layers");
        assert_eq!(SCALE.check(-65536.0), Ok(-65536.0));
        assert_eq!(SCALE.check(1e39).unwrap_err(), "1e39 is past the limit of 65536 (the magnitude of a scale)");
    }
}
