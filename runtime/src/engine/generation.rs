//! What a checkpoint's `generation_config.json` asks of generation, as typed data
//! (`GenerationDefaults`): its `eos_token_id` (one id or a list), which joins the stop ids of
//! every generation the engine runs, and its sampling settings (`do_sample`, `temperature`,
//! `top_k`, `top_p`, `min_p`, `repetition_penalty`), which a front end takes as its defaults
//! when the user gives none (`GenerationDefaults::sampler`; the user's settings still win).
//!
//! The settings mean what they mean to transformers' `generate`: without `do_sample: true` the
//! choice is greedy (the file's temperature is not a reason to sample); with it, a setting the
//! file leaves out takes transformers' default (temperature 1, top-k 50, top-p 1, no min-p).
//! A repetition penalty applies either way.
//!
//! A file that is there but malformed (not JSON, a setting of the wrong type or out of range)
//! is an error at load, naming the file and the setting, as for the tokenizer's files: ignored,
//! a stop id would let the model run on past its answer. `null` counts as absent; keys this
//! module does not know are ignored. Must not: read any file but this one, or build samplers.

use crate::model::{read_text, LoadError, MAX_JSON};
use crate::sample::SamplerConfig;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// The name of the file, in a safetensors checkpoint's directory.
pub const FILE: &str = "generation_config.json";

/// transformers' defaults for what `do_sample: true` leaves out.
const HF_TEMPERATURE: f32 = 1.0;
const HF_TOP_K: usize = 50;

/// The defaults a checkpoint's `generation_config.json` gives (all empty without one).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationDefaults {
    /// The file read, when there was one.
    pub source: Option<PathBuf>,
    /// Ids that end a generation, beside the tokenizer's.
    pub eos_ids: Vec<u32>,
    pub do_sample: Option<bool>,
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
}

/// Why a `generation_config.json` was refused.
#[derive(Debug, thiserror::Error)]
pub enum GenerationConfigError {
    #[error(transparent)]
    Read(#[from] LoadError),
    #[error("{}: {msg}", path.display())]
    Bad { path: PathBuf, msg: String },
}

fn number(m: &Map<String, Value>, key: &str) -> Result<Option<f64>, String> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(v) => Err(format!("{key} is {v}, not a number")),
    }
}

/// A float setting that must satisfy `ok` (said as `range`).
fn float(m: &Map<String, Value>, key: &str, ok: impl Fn(f64) -> bool, range: &str) -> Result<Option<f32>, String> {
    match number(m, key)? {
        Some(x) if !x.is_finite() || !ok(x) => Err(format!("{key} is {x}; it must be {range}")),
        x => Ok(x.map(|x| x as f32)),
    }
}

fn eos_ids(v: Option<&Value>) -> Result<Vec<u32>, String> {
    let one = |x: &Value| x.as_u64().and_then(|n| u32::try_from(n).ok());
    let bad = |v: &Value| format!("eos_token_id is {v}, not a token id or a list of token ids");
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a.iter().map(|x| one(x).ok_or_else(|| bad(x))).collect(),
        Some(x) => one(x).map(|id| vec![id]).ok_or_else(|| bad(x)),
    }
}

impl GenerationDefaults {
    /// Reads `dir/generation_config.json`; without one, no defaults.
    pub fn read(dir: &Path) -> Result<GenerationDefaults, GenerationConfigError> {
        let path = dir.join(FILE);
        if !path.exists() {
            return Ok(GenerationDefaults::default());
        }
        let text = read_text(&path, MAX_JSON)?;
        let bad = |msg: String| GenerationConfigError::Bad { path: path.clone(), msg };
        let value: Value = serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let Value::Object(m) = value else {
            return Err(bad("not a JSON object".into()));
        };
        let mut d = Self::from_json(&m).map_err(bad)?;
        d.source = Some(path);
        Ok(d)
    }

    /// The defaults the object `m` gives, or what is wrong with it.
    pub fn from_json(m: &Map<String, Value>) -> Result<GenerationDefaults, String> {
        let do_sample = match m.get("do_sample") {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(v) => return Err(format!("do_sample is {v}, not true or false")),
        };
        let top_k = match number(m, "top_k")? {
            None => None,
            Some(k) if k >= 0.0 && k.fract() == 0.0 && k <= u32::MAX as f64 => Some(k as usize),
            Some(k) => return Err(format!("top_k is {k}; it must be a whole number >= 0")),
        };
        Ok(GenerationDefaults {
            source: None,
            eos_ids: eos_ids(m.get("eos_token_id"))?,
            do_sample,
            temperature: float(m, "temperature", |x| x >= 0.0, ">= 0")?,
            top_k,
            top_p: float(m, "top_p", |x| x > 0.0 && x <= 1.0, "in (0, 1]")?,
            min_p: float(m, "min_p", |x| (0.0..=1.0).contains(&x), "in [0, 1]")?,
            repetition_penalty: float(m, "repetition_penalty", |x| x > 0.0, "> 0")?,
        })
    }

    /// The sampler settings a front end starts from: its own defaults `front`, with the file's
    /// over them (see the module doc for what `do_sample` changes). The user's settings go on
    /// top of these.
    pub fn sampler(&self, front: SamplerConfig) -> SamplerConfig {
        let mut c = front;
        match self.do_sample {
            Some(true) => {
                c.temperature = self.temperature.unwrap_or(HF_TEMPERATURE);
                c.top_k = self.top_k.unwrap_or(HF_TOP_K);
                c.top_p = self.top_p.unwrap_or(1.0);
                c.min_p = self.min_p.unwrap_or(0.0);
            }
            Some(false) | None => {
                if self.do_sample == Some(false) {
                    c.temperature = 0.0;
                }
                c.top_k = self.top_k.unwrap_or(c.top_k);
                c.top_p = self.top_p.unwrap_or(c.top_p);
                c.min_p = self.min_p.unwrap_or(c.min_p);
            }
        }
        c.repetition_penalty = self.repetition_penalty.unwrap_or(c.repetition_penalty);
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn of(v: Value) -> Result<GenerationDefaults, String> {
        GenerationDefaults::from_json(v.as_object().unwrap())
    }

    #[test]
    fn settings_and_stop_ids() {
        let qwen3 = of(json!({"bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643],
            "pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95}))
        .unwrap();
        assert_eq!(qwen3.eos_ids, [151645, 151643]);
        let front = SamplerConfig::greedy();
        let c = qwen3.sampler(front);
        assert_eq!((c.temperature, c.top_k, c.top_p, c.min_p), (0.6, 20, 0.95, 0.0));
        // do_sample alone: transformers' defaults for the rest.
        let c = of(json!({"do_sample": true, "eos_token_id": 2})).unwrap().sampler(front);
        assert_eq!((c.temperature, c.top_k, c.top_p), (1.0, 50, 1.0));
        // No do_sample: greedy stays greedy; the file's other settings are the defaults.
        let d = of(json!({"temperature": 0.7, "top_p": 0.8, "repetition_penalty": 1.1})).unwrap();
        let c = d.sampler(SamplerConfig { temperature: 0.0, ..SamplerConfig::default() });
        assert_eq!((c.temperature, c.top_p, c.top_k, c.repetition_penalty), (0.0, 0.8, 40, 1.1));
        // do_sample false turns a sampling front end greedy.
        assert_eq!(of(json!({"do_sample": false})).unwrap().sampler(SamplerConfig::default()).temperature, 0.0);
        // null is absent; an empty file changes nothing.
        assert_eq!(of(json!({"eos_token_id": null, "temperature": null})).unwrap(), GenerationDefaults::default());
        assert_eq!(GenerationDefaults::default().sampler(SamplerConfig::default()), SamplerConfig::default());
    }

    #[test]
    fn malformed_settings_are_named() {
        for (v, needle) in [
            (json!({"eos_token_id": "</s>"}), "eos_token_id is \"</s>\""),
            (json!({"eos_token_id": [2, -1]}), "eos_token_id is -1"),
            (json!({"temperature": "hot"}), "temperature is \"hot\", not a number"),
            (json!({"temperature": -1}), "temperature is -1; it must be >= 0"),
            (json!({"top_p": 1.5}), "top_p is 1.5; it must be in (0, 1]"),
            (json!({"top_k": 2.5}), "top_k is 2.5"),
            (json!({"repetition_penalty": 0}), "repetition_penalty is 0"),
            (json!({"do_sample": "yes"}), "do_sample is \"yes\""),
        ] {
            let e = of(v).unwrap_err();
            assert!(e.contains(needle), "{e} lacks {needle}");
        }
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(FILE), "{\"eos_token_id\": 2,").unwrap();
        let e = GenerationDefaults::read(d.path()).unwrap_err().to_string();
        assert!(e.contains("generation_config.json: not valid JSON"), "{e}");
        assert_eq!(GenerationDefaults::read(&d.path().join("none")).unwrap(), GenerationDefaults::default());
    }
}
