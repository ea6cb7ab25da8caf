//! The numbers of lowering: a spec expression evaluated for the layer being expanded, as the
//! kind of number its place wants. A size is a non-negative Int within its `limits` entry; a
//! Float is finite as an f32 (a scale within `limits::SCALE`, an epsilon or a RoPE base above
//! 0); each refusal is located at the expression and names the configuration key a symbol came
//! from. Must not: allocate or iterate by a size it returns (its callers do, after the check).

use super::program::Lowerer;
use super::symbols::Origin;
use crate::expr::Value;
use crate::limits::{self, Limit};
use crate::spec::Text;

impl<'a> Lowerer<'a> {
    pub(super) fn eval(&mut self, t: &Text) -> Option<Value> {
        let e = match self.spec.expr(t) {
            Ok(e) => e,
            Err(d) => {
                self.diags.push(d);
                return None;
            }
        };
        let layer = self.index_i();
        let r = e.eval(&|n| if n == "i" { layer.map(|i| Value::Int(i as i64)) } else { self.syms.get(n) });
        match r {
            Ok(v) => Some(v),
            Err(x) => {
                // A symbol without a value was reported where it is declared.
                if !x.message.contains("has no value") {
                    self.err(x.span, x.message);
                }
                None
            }
        }
    }

    /// A non-negative Int expression, at most 2^32 (a size past that is a mistake, and
    /// products of two sizes then cannot overflow).
    pub(super) fn int(&mut self, t: &Text) -> Option<usize> {
        match self.eval(t)? {
            Value::Int(i) if (0..=1 << 32).contains(&i) => Some(i as usize),
            Value::Int(i) if i > 0 => {
                self.err(t.span, format!("`{}` is {i}, too large for a size (at most 2^32)", t.value));
                None
            }
            v => {
                self.err(t.span, format!("expected a non-negative Int, `{}` is {v}", t.value));
                None
            }
        }
    }

    /// A size within `limit`.
    pub(super) fn sized(&mut self, t: &Text, limit: Limit) -> Option<usize> {
        let v = self.int(t)?;
        match limit.check(v) {
            Ok(v) => Some(v),
            Err(m) => {
                let from = self.origin_of(t);
                self.err(t.span, format!("`{}`{from}: {m}", t.value));
                None
            }
        }
    }

    /// ` (from configuration key `k`)` when `t` is a symbol the configuration gave, else empty.
    pub(super) fn origin_of(&self, t: &Text) -> String {
        match self.syms.origin(t.value.trim()) {
            Some(o @ (Origin::Config(_) | Origin::Tensor(..))) => format!(" (from {o})"),
            _ => String::new(),
        }
    }

    /// A finite f32 (a Float past f32's range is refused, not made infinite).
    pub(super) fn float(&mut self, t: &Text) -> Option<f32> {
        self.number(t, None)
    }

    /// A finite f32, within `limit` when one is given.
    fn number(&mut self, t: &Text, limit: Option<limits::Magnitude>) -> Option<f32> {
        let x = match self.eval(t)? {
            v @ (Value::Int(_) | Value::Float(_)) => v.as_f64().unwrap_or(f64::NAN),
            v => {
                self.err(t.span, format!("expected a number, `{}` is {v}", t.value));
                return None;
            }
        };
        let from = self.origin_of(t);
        if let Some(Err(m)) = limit.map(|l| l.check(x)) {
            self.err(t.span, format!("`{}`{from}: {m}", t.value));
            return None;
        }
        if !(x as f32).is_finite() {
            self.err(t.span, format!("`{}` is {x:?}{from}, not a finite 32-bit float", t.value));
            return None;
        }
        Some(x as f32)
    }

    /// A finite f32 multiplier within `limits::SCALE`.
    pub(super) fn scale(&mut self, t: &Text) -> Option<f32> {
        self.number(t, Some(limits::SCALE))
    }

    pub(super) fn scale_or(&mut self, t: &Option<Text>, dflt: f32) -> Option<f32> {
        match t {
            Some(t) => self.scale(t),
            None => Some(dflt),
        }
    }

    /// A finite f32 above 0: an epsilon, a RoPE base (`what` names it in the message).
    pub(super) fn positive(&mut self, t: &Text, what: &str) -> Option<f32> {
        let x = self.float(t)?;
        if x > 0.0 {
            return Some(x);
        }
        let from = self.origin_of(t);
        self.err(t.span, format!("{what} `{}` is {x}{from}; it must be above 0", t.value));
        None
    }

    pub(super) fn positive_or(&mut self, t: &Option<Text>, dflt: f32, what: &str) -> Option<f32> {
        match t {
            Some(t) => self.positive(t, what),
            None => Some(dflt),
        }
    }

    pub(super) fn boolean(&mut self, t: &Text) -> Option<bool> {
        match self.eval(t)? {
            Value::Bool(b) => Some(b),
            v => {
                self.err(t.span, format!("expected a Bool, `{}` is {v}", t.value));
                None
            }
        }
    }
}

impl Lowerer<'_> {
    /// The rotary width and base a RoPE op keeps: `odd_rotary`.
    pub(super) fn rotary(&self, rotary_dim: usize, theta: f32, scaling: crate::ir::RopeScaling) -> (usize, f32) {
        odd_rotary(rotary_dim, theta, scaling)
    }
}

/// An odd rotary width `d` as transformers' RoPE computes it: `int(head_dim * partial)` may be
/// odd, and then `ceil(d / 2)` pairs rotate (`d + 1` columns) at the frequencies
/// `theta^(-2i / d)`. The same frequencies are `theta'^(-2i / (d + 1))` with
/// `theta' = theta^((d + 1) / d)`, so the op keeps an even width and a base of its own; YaRN's
/// correction range is the same under that change (it depends on `d / ln theta` only). An even
/// width, or a width that is the whole head, is returned as it is (the latter to be refused).
fn odd_rotary(rotary_dim: usize, theta: f32, scaling: crate::ir::RopeScaling) -> (usize, f32) {
    if rotary_dim.is_multiple_of(2) || matches!(scaling, crate::ir::RopeScaling::NoPe) {
        return (rotary_dim, theta);
    }
    let d = rotary_dim as f64;
    (rotary_dim + 1, (theta as f64).powf((d + 1.0) / d) as f32)
}

#[cfg(test)]
mod tests {
    use super::odd_rotary;
    use crate::ir::RopeScaling;

    #[test]
    fn an_odd_rotary_width_rotates_one_more_column_at_the_same_frequencies() {
        let (d, theta) = (5usize, 10000f32);
        let (w, t) = odd_rotary(d, theta, RopeScaling::None);
        assert_eq!(w, 6);
        for i in 0..3 {
            let want = (theta as f64).powf(-2.0 * i as f64 / d as f64);
            let got = (t as f64).powf(-2.0 * i as f64 / w as f64);
            assert!((got - want).abs() <= 1e-6 * want, "pair {i}: {got} vs {want}");
        }
        assert_eq!(odd_rotary(8, theta, RopeScaling::None), (8, theta));
    }
}
