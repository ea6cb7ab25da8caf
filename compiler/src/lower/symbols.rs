//! Binds a spec's symbols to a checkpoint: each symbol's value from the first configuration key
//! present for the checkpoint's naming scheme, else a tensor's dimension, else its default
//! expression (which may read other symbols). Also RoPE scaling parameters from the
//! configuration, which every family reads the same way.
//!
//! Errors (a symbol with no value, a key of the wrong JSON type, an Int a JSON float cannot hold
//! exactly) are diagnostics at the symbol's place in the spec. Each value remembers where it
//! came from (`Origin`), for messages and for a tied weight's rule. This module must not know
//! any model family.

use crate::bind::{Bindings, Naming};
use crate::diag::{Diagnostic, Diagnostics};
use crate::expr::{Type, Value};
use crate::ir::RopeScaling;
use crate::spec::Spec;
use serde_json::Value as Json;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;

/// Where a symbol's value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A configuration key of the checkpoint (`{arch}` substituted).
    Config(String),
    /// A dimension of a checkpoint tensor.
    Tensor(String, usize),
    /// The symbol's default expression.
    Default,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Config(k) => write!(f, "configuration key `{k}`"),
            Origin::Tensor(t, d) => write!(f, "dimension {d} of tensor `{t}`"),
            Origin::Default => f.write_str("its default"),
        }
    }
}

/// The symbols of one spec bound to one checkpoint; resolved on first use.
pub struct Symbols<'a> {
    spec: &'a Spec,
    bindings: &'a Bindings,
    memo: RefCell<BTreeMap<String, Option<Value>>>,
    origins: RefCell<BTreeMap<String, Origin>>,
    active: RefCell<Vec<String>>,
    diags: RefCell<Diagnostics>,
}

impl<'a> Symbols<'a> {
    pub fn new(spec: &'a Spec, bindings: &'a Bindings) -> Symbols<'a> {
        Symbols {
            spec,
            bindings,
            memo: RefCell::default(),
            origins: RefCell::default(),
            active: RefCell::default(),
            diags: RefCell::default(),
        }
    }

    /// The errors found while resolving.
    pub fn take_diagnostics(&self) -> Diagnostics {
        std::mem::take(&mut self.diags.borrow_mut())
    }

    /// The value of a symbol or built-in (`gguf`, `hf`); `None` when it has none (reported).
    pub fn get(&self, name: &str) -> Option<Value> {
        match name {
            "gguf" => return Some(Value::Bool(self.bindings.naming == Naming::Gguf)),
            "hf" => return Some(Value::Bool(self.bindings.naming == Naming::Hf)),
            _ => {}
        }
        if let Some(v) = self.memo.borrow().get(name) {
            return v.clone();
        }
        if self.active.borrow().iter().any(|a| a == name) {
            return None; // a cycle; the static check reports it
        }
        self.active.borrow_mut().push(name.to_string());
        let v = self.resolve(name);
        self.active.borrow_mut().pop();
        self.memo.borrow_mut().insert(name.to_string(), v.clone());
        v
    }

    /// Where the value of symbol `name` came from, once it has one.
    pub fn origin(&self, name: &str) -> Option<Origin> {
        self.origins.borrow().get(name).cloned()
    }

    fn note(&self, name: &str, origin: Origin) {
        self.origins.borrow_mut().insert(name.to_string(), origin);
    }

    fn report(&self, d: Diagnostic) {
        self.diags.borrow_mut().push(d);
    }

    fn resolve(&self, name: &str) -> Option<Value> {
        let (key, def) = self.spec.file.symbols.0.iter().find(|(k, _)| k.value == name)?;
        let ty = def.ty();
        // 1. Configuration keys of the naming scheme, in order.
        let keys = match self.bindings.naming {
            Naming::Hf => &def.hf,
            Naming::Gguf => &def.gguf,
        };
        for k in keys {
            if let Some(j) = config_value(self.bindings, &k.value) {
                let v = match (&def.indices_of, &def.equals) {
                    (Some(w), _) => indices_of(j, &w.value),
                    (None, Some(w)) => j.as_str().map(|s| Value::Bool(s == w.value)),
                    (None, None) => from_json(j, ty),
                };
                return match v {
                    Some(v) => {
                        self.note(name, Origin::Config(self.arch_key(&k.value)));
                        Some(v)
                    }
                    None => {
                        let want = match (&def.indices_of, &def.equals) {
                            (Some(_), _) => "a list of strings or of Bools".to_string(),
                            (None, Some(_)) => "a string".to_string(),
                            (None, None) if j.is_array() => {
                                format!("{} (one value, or a list of it repeated)", article(ty))
                            }
                            (None, None) => article(ty).to_string(),
                        };
                        self.report(self.spec.diag(
                            k.span,
                            format!(
                                "configuration key `{}` is `{j}`, the spec expects {want}",
                                self.arch_key(&k.value)
                            ),
                        ));
                        None
                    }
                };
            }
        }
        // 2. A dimension of a checkpoint tensor.
        if let (Some((w, dim)), Some(tensors)) = (&def.tensor, &self.bindings.tensors) {
            if let Some(pattern) = self.spec.weight(&w.value).and_then(|wd| match self.bindings.naming {
                Naming::Hf => wd.hf.as_ref(),
                Naming::Gguf => wd.gguf.as_ref(),
            }) {
                let tname = self.tensor_name(&pattern.value, 0);
                if let Some(d) = tensors.get(&tname).and_then(|t| t.shape.get(*dim)) {
                    self.note(name, Origin::Tensor(tname, *dim));
                    return Some(Value::Int(i64::try_from(*d).unwrap_or(i64::MAX)));
                }
            }
        }
        // 3. The default expression.
        if let Some(dflt) = &def.default {
            let e = match self.spec.expr(dflt) {
                Ok(e) => e,
                Err(d) => {
                    self.report(d);
                    return None;
                }
            };
            return match e.eval(&|n| self.get(n)) {
                Ok(v) => {
                    self.note(name, Origin::Default);
                    Some(coerce(v, ty))
                }
                Err(x) => {
                    self.report(self.spec.diag(x.span, format!("symbol `{name}`: {}", x.message)));
                    None
                }
            };
        }
        let tried: Vec<String> = keys.iter().map(|k| format!("`{}`", self.arch_key(&k.value))).collect();
        let scheme = match self.bindings.naming {
            Naming::Hf => "HF",
            Naming::Gguf => "GGUF",
        };
        let what = if tried.is_empty() {
            format!("the spec names no {scheme} configuration key")
        } else {
            format!("the configuration has none of {}", tried.join(", "))
        };
        self.report(self.spec.diag(key.span, format!("symbol `{name}` has no value: {what}, and it has no default")));
        None
    }

    /// `{arch}` replaced by the GGUF architecture.
    pub fn arch_key(&self, key: &str) -> String {
        key.replace("{arch}", self.bindings.architecture().unwrap_or("{arch}"))
    }

    /// A tensor name pattern with `{i}` and `{arch}` substituted (`{e}` kept).
    /// A wrapper checkpoint's names carry the wrapper's prefix (`Wrapper::rename`).
    pub fn tensor_name(&self, pattern: &str, layer: usize) -> String {
        let name = self.arch_key(pattern).replace("{i}", &layer.to_string());
        match self.bindings.architecture().and_then(|a| self.spec.wrapper(a)) {
            Some(w) => match name.strip_prefix(w.rename.0.as_str()) {
                Some(rest) => format!("{}{rest}", w.rename.1),
                None => name,
            },
            None => name,
        }
    }

    /// RoPE scaling as the configuration states it; `None` when it states none.
    /// The configuration's RoPE scaling, or that of the HF object at `at` (none for a GGUF
    /// file, whose scaling keys are not per object).
    pub fn rope_scaling(&self, at: Option<&str>) -> Result<RopeScaling, String> {
        match at {
            Some(_) if self.bindings.naming == Naming::Gguf => Ok(RopeScaling::None),
            Some(key) => rope_scaling_at(self.bindings, &[key]),
            None => rope_scaling(self.bindings),
        }
    }
}

fn article(t: Type) -> &'static str {
    match t {
        Type::Int => "an Int",
        Type::Float => "a Float",
        Type::Bool => "a Bool",
        Type::IntList => "an IntList",
    }
}

/// A configuration value: HF keys may be dotted paths (`rope_parameters.rope_theta`); GGUF
/// keys are literal (`llama.rope.freq_base`) after `{arch}` is substituted. `null` is absent.
pub fn config_value<'b>(b: &'b Bindings, key: &str) -> Option<&'b Json> {
    let key = key.replace("{arch}", b.architecture().unwrap_or("{arch}"));
    let v = match b.config.get(&key) {
        Some(v) => Some(v),
        None if b.naming == Naming::Hf && key.contains('.') => {
            let mut parts = key.split('.');
            let mut cur = b.config.get(parts.next()?)?;
            for p in parts {
                cur = cur.as_object()?.get(p)?;
            }
            Some(cur)
        }
        None => None,
    };
    v.filter(|v| !v.is_null())
}

/// An `IntList` symbol with `indices_of`: the indices of the entries of a list of strings
/// equal to `wanted` (gpt-oss's `layer_types`), or of a list of Bools written `"true"` /
/// `"false"` (GGUF's per-layer flags, `attention.indexer.types`).
pub fn indices_of(j: &Json, wanted: &str) -> Option<Value> {
    fn word(x: &Json) -> Option<&str> {
        x.as_str().or_else(|| x.as_bool().map(|b| if b { "true" } else { "false" }))
    }
    let items = j.as_array()?.iter().map(word).collect::<Option<Vec<_>>>()?;
    Some(Value::IntList(items.iter().enumerate().filter(|(_, s)| **s == wanted).map(|(i, _)| i as i64).collect()))
}

/// A JSON value as a value of type `ty`; an Int written as a float must be whole and within
/// ±2^53 (past that a float does not hold an integer exactly, and `1e30` would saturate). An
/// Int or a Float may be written as a list of one value repeated (GGUF's per-layer keys, such
/// as llama.cpp's `swiglu_clamp_exp`, one entry per layer); a list of differing values is not
/// one.
fn from_json(j: &Json, ty: Type) -> Option<Value> {
    if let (Some(items), Type::Int | Type::Float) = (j.as_array(), ty) {
        let first = items.first()?;
        return items.iter().all(|x| x == first).then(|| from_json(first, ty)).flatten();
    }
    match ty {
        Type::Int => j
            .as_i64()
            .or_else(|| j.as_f64().filter(|f| f.fract() == 0.0 && f.abs() <= 9_007_199_254_740_992.0).map(|f| f as i64))
            .map(Value::Int),
        Type::Float => j.as_f64().map(Value::Float),
        Type::Bool => j.as_bool().map(Value::Bool),
        Type::IntList => j.as_array()?.iter().map(|x| x.as_i64()).collect::<Option<Vec<_>>>().map(Value::IntList),
    }
}

/// An Int where a Float is declared becomes a Float.
fn coerce(v: Value, ty: Type) -> Value {
    match (v, ty) {
        (Value::Int(i), Type::Float) => Value::Float(i as f64),
        (v, _) => v,
    }
}

fn b_key(b: &Bindings, key: &str) -> String {
    key.replace("{arch}", b.architecture().unwrap_or("{arch}"))
}

fn f(b: &Bindings, keys: &[&str]) -> Option<f64> {
    keys.iter().find_map(|k| config_value(b, k)?.as_f64())
}

/// RoPE scaling from HF `rope_scaling` / `rope_parameters` or GGUF `{arch}.rope.scaling.*`.
pub fn rope_scaling(b: &Bindings) -> Result<RopeScaling, String> {
    rope_scaling_at(b, &["rope_scaling", "rope_parameters"])
}

/// RoPE scaling from the first of the HF objects `keys` the configuration has (GGUF:
/// `{arch}.rope.scaling.*`).
pub fn rope_scaling_at(b: &Bindings, keys: &[&str]) -> Result<RopeScaling, String> {
    let (kind, prefix) = match b.naming {
        Naming::Hf => {
            let obj = keys.iter().find_map(|&k| config_value(b, k).filter(|v| v.is_object()).map(|v| (k, v)));
            let Some((k, obj)) = obj else { return Ok(RopeScaling::None) };
            let t = obj.get("rope_type").or_else(|| obj.get("type")).and_then(Json::as_str).unwrap_or("default");
            (t.to_string(), format!("{k}."))
        }
        Naming::Gguf => {
            let t = config_value(b, "{arch}.rope.scaling.type").and_then(Json::as_str).unwrap_or("none");
            (t.to_string(), "{arch}.rope.scaling.".to_string())
        }
    };
    let key = |s: &str| format!("{prefix}{s}");
    let factor = f(b, &[&key("factor")]).unwrap_or(1.0);
    if !(factor > 0.0 && (factor as f32).is_finite()) {
        return Err(format!("the RoPE scaling factor `{}` is {factor}; it must be above 0", b_key(b, &key("factor"))));
    }
    let original = f(b, &[&key("original_max_position_embeddings"), &key("original_context_length")]);
    match kind.as_str() {
        "default" | "none" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear { factor: factor as f32 }),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: factor as f32,
            low_freq_factor: f(b, &[&key("low_freq_factor")]).unwrap_or(1.0) as f32,
            high_freq_factor: f(b, &[&key("high_freq_factor")]).unwrap_or(4.0) as f32,
            original_max_position: original.unwrap_or(8192.0) as u32,
        }),
        "yarn" => {
            let mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
            let attention_factor = match b.naming {
                Naming::Hf => {
                    match (f(b, &[&key("attention_factor")]), f(b, &[&key("mscale")]), f(b, &[&key("mscale_all_dim")]))
                    {
                        (Some(a), _, _) => a,
                        (None, Some(m), Some(all)) => mscale(factor, m) / mscale(factor, all),
                        _ => mscale(factor, 1.0),
                    }
                }
                // llama.cpp: a file with a `yarn_log_multiplier` (DeepSeek's `mscale_all_dim`)
                // has no `mscale`, which it takes equal to `mscale_all_dim`: their ratio, 1;
                // otherwise mscale(factor, 1). Times `attn_factor` when the file has one.
                Naming::Gguf => {
                    let log_mul = f(b, &[&key("yarn_log_multiplier")]).unwrap_or(0.0);
                    let base = if log_mul != 0.0 { 1.0 } else { mscale(factor, 1.0) };
                    base * f(b, &[&key("attn_factor")]).unwrap_or(1.0)
                }
            };
            Ok(RopeScaling::Yarn {
                factor: factor as f32,
                original_max_position: original.unwrap_or(4096.0) as u32,
                beta_fast: f(b, &[&key("beta_fast"), &key("yarn_beta_fast")]).unwrap_or(32.0) as f32,
                beta_slow: f(b, &[&key("beta_slow"), &key("yarn_beta_slow")]).unwrap_or(1.0) as f32,
                attention_factor: attention_factor as f32,
                truncate: config_value(b, &key("truncate")).and_then(Json::as_bool).unwrap_or(true),
            })
        }
        other => Err(format!("RoPE scaling `{other}` is not supported (supported: linear, llama3, yarn)")),
    }
}

/// A wrapper checkpoint's bindings with its text model's keys at the top level
/// (`Wrapper::config`); `None` for a checkpoint of one of the spec's own classes.
pub fn unwrap_wrapper(spec: &Spec, b: &Bindings) -> Result<Option<Bindings>, Diagnostics> {
    let Some(w) = b.architecture().and_then(|a| spec.wrapper(a)) else {
        return Ok(None);
    };
    b.unwrapped(&w.config).map(Some).map_err(|m| {
        let mut d = Diagnostics::new();
        d.push(Diagnostic::whole(&b.source, m));
        d
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_of_reads_strings_and_bools() {
        let strings = serde_json::json!(["full", "shared", "full"]);
        assert_eq!(indices_of(&strings, "shared"), Some(Value::IntList(vec![1])));
        let flags = serde_json::json!([true, false, true, false]);
        assert_eq!(indices_of(&flags, "false"), Some(Value::IntList(vec![1, 3])));
        assert_eq!(indices_of(&serde_json::json!([1, 2]), "1"), None);
    }
}
