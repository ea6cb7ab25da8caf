//! A draft model the checkpoint carries (DeepSeek's and GLM's multi-token prediction layers)
//! as speculative decoding's draft. Its row at position `p` reads the target model's residual
//! at `p` and the token at `p + 1`, and guesses the token at `p + 2`; its own layer keeps a KV
//! cache of those rows.
//!
//! The target session owns its `Draft` and tells it what every forward kept: the residual rows
//! the target exported (`Program::export`) wait here (`pending`) until the token after each is
//! known, which is when a guess is asked for. A guess runs the pending rows through the draft
//! (its exact rows), then feeds each guessed token back with the draft's own residual for
//! further guesses, and forgets those chained rows again: the draft's cache holds exact rows
//! only, one position behind the target's. Cutting the target cuts both.
//!
//! A long prompt does not pile up: past `FOLLOW_ROWS` waiting rows, all but the last run
//! through the draft as they arrive (their next tokens are known), so the draft holds at most a
//! prompt chunk's rows beside its cache.
//!
//! Invariant: `session.pos() + pending rows == the target's position`, and `tokens` holds the
//! tokens at the pending rows' positions.
//!
//! Must not: sample (a guess is the draft's most likely token) or decide how many tokens to
//! guess (the generation loop's pacer does).

use super::{ExecError, LogitRows, Session};
use coli_compiler::ir::Program;

pub struct Draft<'m> {
    session: Session<'m>,
    /// The target's residual rows at positions `session.pos()..` (the target's position).
    pending: Vec<f32>,
    /// The tokens at those positions.
    tokens: Vec<u32>,
    hidden: usize,
}

/// Waiting rows past which `follow` runs them through the draft at once.
const FOLLOW_ROWS: usize = 64;

impl<'m> Draft<'m> {
    /// A draft for a session of `target`, running on `session` (fresh).
    pub(super) fn new(target: &Program, session: Session<'m>) -> Result<Draft<'m>, ExecError> {
        let Some(export) = target.export else {
            return Err(ExecError::Draft(
                "the model's plan does not export its residual (compile it as a draft's target)",
            ));
        };
        let hidden = target.value(export).width;
        let input = session.model.program.prologue.iter().find_map(|op| match op {
            coli_compiler::ir::Op::Input { out } => Some(session.model.program.value(*out).width),
            _ => None,
        });
        if input != Some(hidden) {
            return Err(ExecError::Draft("the draft's input rows are not as wide as the model's residual"));
        }
        if session.model.program.export.is_none() {
            return Err(ExecError::Draft("the draft's plan does not export its residual"));
        }
        if session.pos() != 0 {
            return Err(ExecError::Draft("the draft's session is not fresh"));
        }
        Ok(Draft { session, pending: Vec::new(), tokens: Vec::new(), hidden })
    }

    fn pending_rows(&self) -> usize {
        self.pending.len() / self.hidden
    }

    /// After a target forward of `tokens` from position `start` that exported `rows`. A draft
    /// forward that fails here leaves its rows waiting (the next guess runs them).
    pub(super) fn follow(&mut self, start: usize, tokens: &[u32], rows: &[f32]) {
        if self.session.pos() + self.pending_rows() != start || rows.len() != tokens.len() * self.hidden {
            // Not contiguous (cannot happen through `Session`): start again from here.
            self.session.truncate(0);
            self.pending.clear();
            self.tokens.clear();
            return;
        }
        self.pending.extend_from_slice(rows);
        self.tokens.extend_from_slice(tokens);
        let n = self.pending_rows();
        if n > FOLLOW_ROWS {
            // Row `p` holds the token at `p + 1`: all but the last row can run.
            let run = n - 1;
            let fed = self.tokens[1..=run].to_vec();
            if self.session.forward_from(&fed, &self.pending[..run * self.hidden], LogitRows::Last).is_ok() {
                self.pending.drain(..run * self.hidden);
                self.tokens.drain(..run);
            }
        }
    }

    /// The target went back to position `pos`.
    pub(super) fn cut(&mut self, pos: usize) {
        if self.session.pos() > pos {
            self.session.truncate(pos);
            self.pending.clear();
            self.tokens.clear();
        } else {
            let keep = pos - self.session.pos();
            self.pending.truncate(keep * self.hidden);
            self.tokens.truncate(keep);
        }
    }

    /// Up to `cap` tokens to follow `next`, the token the target (at `pos`) feeds next.
    pub(super) fn guess(&mut self, next: u32, pos: usize, cap: usize) -> Result<Vec<u32>, ExecError> {
        let from = self.session.pos();
        if cap == 0 || from + self.pending_rows() != pos || from == pos || self.tokens.len() != pos - from {
            return Ok(Vec::new());
        }
        // The exact rows: positions `from..pos`, each with the token after it.
        let pending = std::mem::take(&mut self.pending);
        let mut fed = std::mem::take(&mut self.tokens);
        fed.remove(0);
        fed.push(next);
        let logits = self.session.forward_from(&fed, &pending, LogitRows::Last)?;
        let mut out = vec![argmax(&logits)];
        // Chained rows: each guess with the draft's own residual before it, forgotten after.
        let chained = self.chain(&mut out, cap);
        self.session.truncate(pos);
        chained.map(|()| out)
    }

    /// Guesses after the last of `out` until it holds `cap` (fewer where the draft's context
    /// is full).
    fn chain(&mut self, out: &mut Vec<u32>, cap: usize) -> Result<(), ExecError> {
        while out.len() < cap {
            let h = self.session.exported();
            let last = h[h.len() - self.hidden..].to_vec();
            let prev = out[out.len() - 1];
            match self.session.forward_from(&[prev], &last, LogitRows::Last) {
                Ok(l) => out.push(argmax(&l)),
                Err(ExecError::ContextFull { .. }) => break,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The index of the largest logit (the first of equals).
fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::argmax;

    #[test]
    fn argmax_takes_the_first_of_equals() {
        assert_eq!(argmax(&[0.5, 2.0, 2.0, -1.0]), 1);
        assert_eq!(argmax(&[3.0]), 0);
    }
}
