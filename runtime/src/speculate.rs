//! Drafts for speculative decoding: guesses of the next few tokens that one forward of the
//! model then checks together (`generate::generate` verifies them). The n-gram draft (prompt
//! lookup) finds the longest recent suffix of the text that occurred before and proposes what
//! followed it there; it needs no model, so it works for every model, and it pays off where
//! text repeats (code, quoting, structured output, a loop of a small model).
//!
//! Verifying a draft keeps the target model's distribution exactly: the draft is one token per
//! position with probability 1, for which the standard rejection rule (accept `d` with
//! probability `p(d)`, else sample from `p` with `d` removed) is the same as sampling `p` and
//! comparing with `d`. So the generator samples each row as it would without a draft, with the
//! same random draws in the same order: with equal logits the output is the same token for token,
//! greedy or not.
//!
//! The other draft is a model the checkpoint carries (multi-token prediction layers): the
//! session runs it (`exec::draft`), so here it is only a name and a length.
//!
//! Must not: run the model or know about devices; it sees token ids only.

/// Whether and how `generate` drafts tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Speculation {
    #[default]
    Off,
    /// Prompt lookup over the prompt and what has been generated.
    Ngram(NgramOptions),
    /// The checkpoint's own draft model (multi-token prediction layers), attached to the
    /// session (`exec::Session::attach_draft`); it guesses at most `max_draft` tokens.
    Mtp { max_draft: usize },
}

impl Speculation {
    /// The draft model's default: the one guess it was trained for (later ones chain its own
    /// guesses, and were right less often than they cost in docs/BENCHMARKS.md's MTP section).
    pub const MTP_DRAFT: usize = 1;
}

/// The n-gram draft's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramOptions {
    /// Tokens drafted at most per verifying forward.
    pub max_draft: usize,
    /// The shortest suffix that counts as a match (shorter ones guess too often wrong).
    pub min_match: usize,
    /// The longest suffix looked for (longer matches are tried first).
    pub max_match: usize,
}

impl Default for NgramOptions {
    fn default() -> Self {
        NgramOptions { max_draft: 6, min_match: 2, max_match: 4 }
    }
}

impl Speculation {
    /// Up to `cap` (and the draft's own limit) tokens guessed to follow `history`; empty when
    /// there is no guess, and for a draft model (the session guesses: `Session::draft_tokens`).
    pub fn draft(&self, history: &[u32], cap: usize) -> Vec<u32> {
        match self {
            Speculation::Off | Speculation::Mtp { .. } => Vec::new(),
            Speculation::Ngram(o) => ngram_draft(history, o, cap.min(o.max_draft)),
        }
    }

    /// Tokens drafted at most per forward (0 when off).
    pub fn max_draft(&self) -> usize {
        match self {
            Speculation::Off => 0,
            Speculation::Ngram(o) => o.max_draft,
            Speculation::Mtp { max_draft } => *max_draft,
        }
    }

    /// The draft's name for the per-run line.
    pub fn name(&self) -> &'static str {
        match self {
            Speculation::Off => "off",
            Speculation::Ngram(_) => "ngram",
            Speculation::Mtp { .. } => "mtp",
        }
    }
}

/// Prompt lookup: for suffix lengths from `max_match` down to `min_match`, the most recent
/// earlier occurrence of `history`'s suffix, and the `cap` tokens that followed it (the
/// continuation read as if the draft were already in the history).
pub fn ngram_draft(history: &[u32], o: &NgramOptions, cap: usize) -> Vec<u32> {
    if cap == 0 {
        return Vec::new();
    }
    let len = history.len();
    for n in (o.min_match.max(1)..=o.max_match).rev() {
        if n >= len {
            continue;
        }
        let suffix = &history[len - n..];
        // Occurrences starting at `j` end before the suffix's own start, so a token follows.
        if let Some(j) = (0..len - n).rev().find(|&j| &history[j..j + n] == suffix) {
            // What followed, read on into the draft itself where it runs past the end: a loop
            // of period `p` drafts itself round and round, not only its last `p` tokens.
            let from = j + n;
            let mut draft = Vec::with_capacity(cap);
            for k in from..from + cap {
                draft.push(if k < len { history[k] } else { draft[k - len] });
            }
            return draft;
        }
    }
    Vec::new()
}

/// How long the next draft may be: rows are not free (on a CPU a forward of 7 rows costs
/// several of one), so the length follows how the last drafts fared. All right: it doubles
/// (up to the draft's limit); partly right: one past what was right; wrong at length 1: no
/// draft for a pause that doubles (up to 16 steps) while the drafts stay wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pacer {
    max: usize,
    len: usize,
    rest: usize,
    pause: usize,
}

impl Pacer {
    const LONGEST_PAUSE: usize = 16;

    pub fn new(max: usize) -> Pacer {
        Pacer { max, len: max, rest: 0, pause: 0 }
    }

    /// Tokens the next forward may draft (0: a step without a draft).
    pub fn allowance(&mut self) -> usize {
        if self.rest > 0 {
            self.rest -= 1;
            return 0;
        }
        self.len
    }

    /// The fate of a draft of `drafted` tokens, `accepted` of them right.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if accepted >= drafted {
            self.len = self.len.saturating_mul(2).clamp(1, self.max.max(1));
            self.pause = 0;
        } else if accepted == 0 && self.len <= 1 {
            self.pause = (self.pause * 2).clamp(1, Self::LONGEST_PAUSE);
            self.rest = self.pause;
        } else {
            self.len = (accepted + 1).min(self.max);
        }
    }
}

/// What speculation did in one generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Forwards that checked a draft.
    pub verifies: usize,
    /// Tokens drafted, and of them those the model's own choice agreed with.
    pub drafted: usize,
    pub accepted: usize,
    /// Forwards re-run after a partly accepted draft because a recurrent layer's state cannot
    /// step back to the accepted position (only back to the forward's start).
    pub replays: usize,
}

impl SpecStats {
    /// Accepted drafted tokens over drafted ones (0 with none drafted).
    pub fn acceptance(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }

    /// The per-run line: `None` when nothing was drafted.
    pub fn summary(&self, spec: &Speculation) -> Option<String> {
        (self.verifies > 0).then(|| {
            let replays = if self.replays > 0 { format!(", {} replayed", self.replays) } else { String::new() };
            format!(
                "speculation ({}): {} drafted tokens in {} forwards, {} accepted ({:.1}%){replays}",
                spec.name(),
                self.drafted,
                self.verifies,
                self.accepted,
                100.0 * self.acceptance()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draft(h: &[u32], cap: usize) -> Vec<u32> {
        ngram_draft(h, &NgramOptions::default(), cap)
    }

    #[test]
    fn the_longest_suffix_seen_before_gives_what_followed_it() {
        // "1 2 3" occurred with "4 5" after it.
        assert_eq!(draft(&[1, 2, 3, 4, 5, 9, 1, 2, 3], 6), [4, 5, 9, 1, 2, 3]);
        assert_eq!(draft(&[1, 2, 3, 4, 5, 9, 1, 2, 3], 8), [4, 5, 9, 1, 2, 3, 4, 5]);
        assert_eq!(draft(&[1, 2, 3, 4, 5, 9, 1, 2, 3], 2), [4, 5]);
        // The longer match wins over a more recent shorter one: "7 2 3" -> 8; "2 3" alone -> 6.
        assert_eq!(draft(&[7, 2, 3, 8, 0, 2, 3, 6, 7, 2, 3], 1), [8]);
        // Of equal lengths, the most recent occurrence.
        assert_eq!(draft(&[5, 6, 1, 5, 6, 2, 5, 6], 1), [2]);
    }

    #[test]
    fn no_match_no_draft() {
        assert!(draft(&[], 4).is_empty());
        assert!(draft(&[1], 4).is_empty());
        assert!(draft(&[1, 2, 3, 4], 4).is_empty());
        // One token in common is below the shortest match.
        assert!(draft(&[1, 2, 9, 2], 4).is_empty());
        assert!(draft(&[1, 2, 1, 2], 0).is_empty());
        assert!(Speculation::Off.draft(&[1, 2, 1, 2], 4).is_empty());
    }

    #[test]
    fn a_repeating_run_drafts_its_continuation() {
        // "1 1 1 1": the suffix "1 1 1" occurred at 0, followed by "1", and so on.
        assert_eq!(draft(&[1, 1, 1, 1], 4), [1, 1, 1, 1]);
        // A loop of period 3 drafts itself beyond its last turn.
        assert_eq!(draft(&[9, 4, 5, 6, 4, 5, 6], 5), [4, 5, 6, 4, 5]);
        let s = Speculation::Ngram(NgramOptions { max_draft: 3, ..NgramOptions::default() });
        assert_eq!(s.draft(&[4, 5, 6, 7, 8, 4, 5], 10), [6, 7, 8]);
    }

    #[test]
    fn the_pacer_follows_the_drafts() {
        let mut p = Pacer::new(8);
        assert_eq!(p.allowance(), 8);
        p.record(8, 2);
        assert_eq!(p.allowance(), 3);
        p.record(3, 3);
        assert_eq!(p.allowance(), 6);
        p.record(6, 0);
        assert_eq!(p.allowance(), 1);
        // Wrong at length 1: pauses of 1, then 2 steps.
        p.record(1, 0);
        assert_eq!([p.allowance(), p.allowance()], [0, 1]);
        p.record(1, 0);
        assert_eq!([p.allowance(), p.allowance(), p.allowance()], [0, 0, 1]);
        // Right again: the pause resets, the length grows back.
        p.record(1, 1);
        assert_eq!(p.allowance(), 2);
        for _ in 0..10 {
            p.record(1, 0);
            p.record(1, 0);
            while p.allowance() == 0 {}
        }
        assert!(p.pause <= Pacer::LONGEST_PAUSE);
    }

    #[test]
    fn the_summary_counts_acceptance() {
        let st = SpecStats { verifies: 4, drafted: 10, accepted: 7, replays: 0 };
        assert_eq!(
            st.summary(&Speculation::Ngram(NgramOptions::default())).unwrap(),
            "speculation (ngram): 10 drafted tokens in 4 forwards, 7 accepted (70.0%)"
        );
        assert!(SpecStats::default().summary(&Speculation::Off).is_none());
    }
}
