//! The fit: how many layers of a chain a device holds. A pure function of byte counts, so
//! that its properties (monotone in the budget, never over it, all layers exactly when all
//! fit) are tested on their own.
//!
//! This module must not know about ops, formats or devices: numbers in, numbers out.

/// What a device takes of a chain of layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainFit {
    /// Layers taken, from the first: the most that fit.
    pub layers: usize,
    /// Whether the tail (the head) goes up too: only when every layer does and it fits beside.
    pub tail: bool,
    /// Bytes placed: the fixed bytes, the layers' and the tail's; 0 when no layer is taken.
    pub bytes: u64,
}

/// Fits a chain on a device with `usable` bytes.
///
/// 1. Nothing is placed unless the fixed bytes (scratch shared by every layer) fit.
/// 2. Layers go up in order, from the first, while the running total fits.
/// 3. The tail goes up only when every layer did and it fits beside them.
///
/// Post: `bytes <= usable`; `layers == layer_bytes.len()` exactly when
/// `fixed + sum(layer_bytes) <= usable` (for a non-empty chain).
pub fn fit_chain(fixed: u64, layer_bytes: &[u64], tail: u64, usable: u64) -> ChainFit {
    let mut total = fixed;
    if total > usable {
        return ChainFit { layers: 0, tail: false, bytes: 0 };
    }
    let mut n = 0;
    for &b in layer_bytes {
        match total.checked_add(b) {
            Some(t) if t <= usable => {
                total = t;
                n += 1;
            }
            _ => break,
        }
    }
    if n == 0 {
        return ChainFit { layers: 0, tail: false, bytes: 0 };
    }
    let tail_up = n == layer_bytes.len() && total.checked_add(tail).is_some_and(|t| t <= usable);
    if tail_up {
        total += tail;
    }
    ChainFit { layers: n, tail: tail_up, bytes: total }
}

/// Bytes of a forced chain of `n` layers (`--device-layers`), with the tail when `n` is every
/// layer and it fits; `None` when the `n` layers themselves do not fit.
pub fn forced_chain(fixed: u64, layer_bytes: &[u64], tail: u64, usable: u64, n: usize) -> Option<ChainFit> {
    let n = n.min(layer_bytes.len());
    if n == 0 {
        return Some(ChainFit { layers: 0, tail: false, bytes: 0 });
    }
    let total = layer_bytes[..n].iter().try_fold(fixed, |acc, &b| acc.checked_add(b))?;
    if total > usable {
        return None;
    }
    let tail_up = n == layer_bytes.len() && total.checked_add(tail).is_some_and(|t| t <= usable);
    Some(ChainFit { layers: n, tail: tail_up, bytes: total + if tail_up { tail } else { 0 } })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_the_most_layers_that_fit() {
        assert_eq!(fit_chain(10, &[5, 5, 5], 3, 22), ChainFit { layers: 2, tail: false, bytes: 20 });
        assert_eq!(fit_chain(10, &[5, 5, 5], 3, 25), ChainFit { layers: 3, tail: false, bytes: 25 });
        assert_eq!(fit_chain(10, &[5, 5, 5], 3, 28), ChainFit { layers: 3, tail: true, bytes: 28 });
        assert_eq!(fit_chain(10, &[5, 5, 5], 3, 9), ChainFit { layers: 0, tail: false, bytes: 0 });
        assert_eq!(forced_chain(10, &[5, 5, 5], 3, 22, 2), Some(ChainFit { layers: 2, tail: false, bytes: 20 }));
        assert_eq!(forced_chain(10, &[5, 5, 5], 3, 22, 3), None);
    }
}
