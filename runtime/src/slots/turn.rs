//! One request's generation, a token at a time: what it asked for (`Request`), its sampler,
//! its text stream (UTF-8 safe, stop strings held back) and the tokens it produced. `Turn::take`
//! consumes the logits of the last position and says what came of them (`Taken`): text to show,
//! and the token to run next or why the generation ended.
//!
//! Must not: run forwards (the slot that owns the turn does), or know about other requests.

use crate::generate::StopReason;
use crate::sample::{SampleError, Sampler, SamplerConfig};
use crate::speculate::Speculation;
use crate::text::{StopMatcher, StreamDecoder, Tokenizer};

/// What a request asks for.
#[derive(Clone, Debug)]
pub struct Request {
    /// The prompt's ids (at least one).
    pub prompt: Vec<u32>,
    pub sampler: SamplerConfig,
    /// Tokens to generate at most; 0 runs the prompt and ends.
    pub max_new_tokens: usize,
    /// Text at which the generation ends (not shown).
    pub stop_strings: Vec<String>,
    /// End at the tokenizer's EOS ids and the checkpoint's generation config's.
    pub stop_at_eos: bool,
    /// How many recent tokens the repetition penalty looks at.
    pub penalty_window: usize,
    /// Drafted tokens checked by a decode forward the request runs alone (a batched step of
    /// several requests runs one token each).
    pub speculation: Speculation,
    /// Positions of the prompt where a later request may leave it (the end of a shared system
    /// prompt: `Engine::branch_points`): a prompt chunk ends there, so a model with a recurrent
    /// state keeps its state at exactly that position (`Session::snapshot_states`).
    pub marks: Vec<usize>,
}

impl Request {
    /// A greedy request for `prompt` with the usual stops.
    pub fn greedy(prompt: Vec<u32>, max_new_tokens: usize) -> Request {
        Request {
            prompt,
            sampler: SamplerConfig::greedy(),
            max_new_tokens,
            stop_strings: Vec::new(),
            stop_at_eos: true,
            penalty_window: 64,
            speculation: Speculation::Off,
            marks: Vec::new(),
        }
    }
}

/// What one set of logits gave.
#[derive(Debug, PartialEq)]
pub(super) struct Taken {
    /// Text now safe to show (may be empty).
    pub text: String,
    /// `Ok(id)`: run `id` next; `Err(reason)`: the generation is over.
    pub next: Result<u32, StopReason>,
}

/// A request being generated.
pub(super) struct Turn<'t> {
    pub req: Request,
    sampler: Sampler,
    stream: Option<StreamDecoder<'t>>,
    stops: StopMatcher,
    tokenizer: Option<&'t Tokenizer>,
    /// Ids that end the generation beside the tokenizer's EOS (the checkpoint's generation config).
    eos: &'t [u32],
    pub generated: Vec<u32>,
}

impl<'t> Turn<'t> {
    pub fn new(req: Request, tokenizer: Option<&'t Tokenizer>, eos: &'t [u32]) -> Result<Turn<'t>, SampleError> {
        let sampler = Sampler::new(req.sampler)?;
        let stops = StopMatcher::new(req.stop_strings.iter().cloned());
        let stream = tokenizer.map(|t| t.stream_decoder(true));
        Ok(Turn { req, sampler, stream, stops, tokenizer, eos, generated: Vec::new() })
    }

    /// Samples from the last position's `logits`; `room` says whether the context holds one
    /// more position.
    pub fn take(&mut self, logits: &[f32], room: bool) -> Result<Taken, SampleError> {
        if self.generated.len() >= self.req.max_new_tokens {
            return Ok(Taken { text: self.finish(), next: Err(StopReason::MaxTokens) });
        }
        let id = {
            let window = self.req.penalty_window;
            let p = &self.req.prompt;
            let g = &self.generated;
            // The last `window` ids of prompt ++ generated.
            let from_gen = g.len().min(window);
            let from_prompt = (window - from_gen).min(p.len());
            let mut recent = Vec::with_capacity(from_prompt + from_gen);
            recent.extend_from_slice(&p[p.len() - from_prompt..]);
            recent.extend_from_slice(&g[g.len() - from_gen..]);
            self.sampler.sample(logits, &recent)?
        };
        self.generated.push(id);
        if self.req.stop_at_eos && (self.tokenizer.is_some_and(|t| t.is_eos(id)) || self.eos.contains(&id)) {
            return Ok(Taken { text: self.finish(), next: Err(StopReason::Eos) });
        }
        let mut text = String::new();
        if let Some(s) = self.stream.as_mut() {
            let step = self.stops.push(&s.push(id));
            text = step.text;
            if step.stopped {
                return Ok(Taken { text, next: Err(StopReason::StopString) });
            }
        }
        if self.generated.len() >= self.req.max_new_tokens {
            text.push_str(&self.finish());
            return Ok(Taken { text, next: Err(StopReason::MaxTokens) });
        }
        if !room {
            text.push_str(&self.finish());
            return Ok(Taken { text, next: Err(StopReason::ContextFull) });
        }
        Ok(Taken { text, next: Ok(id) })
    }

    /// The text held back at the end (an unfinished character, a stop string's prefix).
    fn finish(&mut self) -> String {
        let Some(s) = self.stream.as_mut() else { return String::new() };
        if self.stops.stopped() {
            return String::new();
        }
        let mut tail = self.stops.push(&s.finish()).text;
        tail.push_str(&self.stops.finish());
        tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits_for(id: usize) -> Vec<f32> {
        let mut l = vec![0.0; 8];
        l[id] = 1.0;
        l
    }

    #[test]
    fn a_generation_config_eos_id_ends_the_turn_without_a_tokenizer() {
        let mut t = Turn::new(Request::greedy(vec![1, 2], 10), None, &[5]).unwrap();
        assert_eq!(t.take(&logits_for(3), true).unwrap().next, Ok(3));
        assert_eq!(t.take(&logits_for(5), true).unwrap().next, Err(StopReason::Eos));
        assert_eq!(t.generated, vec![3, 5]);
        let mut r = Request::greedy(vec![1], 10);
        r.stop_at_eos = false;
        let mut t = Turn::new(r, None, &[5]).unwrap();
        assert_eq!(t.take(&logits_for(5), true).unwrap().next, Ok(5));
    }

    #[test]
    fn the_budget_and_the_context_end_a_turn() {
        let mut t = Turn::new(Request::greedy(vec![1], 2), None, &[]).unwrap();
        assert_eq!(t.take(&logits_for(1), true).unwrap().next, Ok(1));
        assert_eq!(t.take(&logits_for(1), true).unwrap().next, Err(StopReason::MaxTokens));
        let mut t = Turn::new(Request::greedy(vec![1], 5), None, &[]).unwrap();
        assert_eq!(t.take(&logits_for(4), false).unwrap().next, Err(StopReason::ContextFull));
        let mut t = Turn::new(Request::greedy(vec![1], 0), None, &[]).unwrap();
        assert_eq!(t.take(&logits_for(4), true).unwrap().next, Err(StopReason::MaxTokens));
        assert!(t.generated.is_empty());
    }
}
