//! [`StopMatcher`]: watches streamed text for stop strings. Text that could still turn out to
//! be the start of a stop string is held back, so a stop string is never printed, not even in
//! part; when one completes, the text before it is released and the stream is over.
//!
//! It works on text (after `StreamDecoder`), not on ids, so a stop string may span tokens.
//! It does not know about EOS ids, and it never splits a UTF-8 character.

/// What one call to [`StopMatcher::push`] produced.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopStep {
    /// Text that is now safe to show.
    pub text: String,
    /// A stop string appeared: `text` ends just before it and generation should end.
    pub stopped: bool,
}

/// Stop-string watcher over a text stream.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// Watches for each of `stops`; empty strings are ignored.
    pub fn new<S: Into<String>>(stops: impl IntoIterator<Item = S>) -> Self {
        let stops = stops.into_iter().map(Into::into).filter(|s: &String| !s.is_empty()).collect();
        StopMatcher { stops, held: String::new(), stopped: false }
    }

    /// Feeds the next piece of text. After a stop, everything further is swallowed.
    pub fn push(&mut self, text: &str) -> StopStep {
        if self.stopped {
            return StopStep { text: String::new(), stopped: true };
        }
        self.held.push_str(text);
        // The earliest stop string wins (the longest, if two start at the same place).
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, std::cmp::Reverse(s.len()))))
            .min();
        if let Some((at, _)) = hit {
            self.stopped = true;
            let mut out = std::mem::take(&mut self.held);
            out.truncate(at);
            return StopStep { text: out, stopped: true };
        }
        let keep = self.partial_suffix_start();
        let out = self.held[..keep].to_string();
        self.held.drain(..keep);
        StopStep { text: out, stopped: false }
    }

    /// Ends the stream: held text (a stop string's prefix that never completed) is released.
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        std::mem::take(&mut self.held)
    }

    /// Whether a stop string has appeared.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Where the longest suffix of the held text that is a proper prefix of a stop string
    /// begins (the held text's length when there is none).
    fn partial_suffix_start(&self) -> usize {
        let held = self.held.as_str();
        held.char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &held[i..];
                self.stops.iter().any(|s| s.len() > tail.len() && s.starts_with(tail))
            })
            .unwrap_or(held.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().copied());
        let mut out = String::new();
        for p in pieces {
            let step = m.push(p);
            out += &step.text;
            if step.stopped {
                return (out, true);
            }
        }
        out += &m.finish();
        (out, false)
    }

    #[test]
    fn stops_across_pieces_and_never_prints_the_stop() {
        let mut m = StopMatcher::new(["\nUser:"]);
        assert_eq!(m.push("Hello"), StopStep { text: "Hello".into(), stopped: false });
        assert_eq!(m.push(" there\nUs").text, " there");
        let s = m.push("er: hi");
        assert_eq!(s, StopStep { text: String::new(), stopped: true });
        assert!(m.stopped());
        assert_eq!(m.push("more").text, "");
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn releases_a_prefix_that_did_not_complete() {
        assert_eq!(run(&["</s>"], &["a </", "b"]), ("a </b".into(), false));
        assert_eq!(run(&["</s>"], &["a </"]), ("a </".into(), false));
        assert_eq!(run(&["</s>"], &["x</s", ">y"]), ("x".into(), true));
    }

    #[test]
    fn earliest_stop_wins_and_unicode_is_kept_whole() {
        assert_eq!(run(&["bb", "ab"], &["xab", "b"]), ("x".into(), true));
        assert_eq!(run(&["é!"], &["caf", "é", "?"]), ("café?".into(), false));
        assert_eq!(run(&["é!"], &["café", "!"]), ("caf".into(), true));
        assert_eq!(run(&[""], &["text"]), ("text".into(), false));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
    }
}
