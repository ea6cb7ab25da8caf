//! The speculative-decoding flags of `coli exec` and what they become
//! (`coli_runtime::speculate::Speculation`). This file only maps flags to options; drafting
//! and verifying are the runtime's.

use crate::engine_args::heading;
use coli_runtime::speculate::{NgramOptions, Speculation};

/// Which draft guesses tokens for a decode forward to check.
#[derive(clap::ValueEnum, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DraftKind {
    /// One token a forward.
    #[default]
    Off,
    /// Prompt lookup: what followed the text's latest suffix where it occurred before.
    Ngram,
    /// The checkpoint's multi-token prediction layer (DeepSeek-V3, V3.2, GLM-5), loaded as a
    /// draft model beside it.
    Mtp,
}

#[derive(clap::Args, Debug, Clone, Default)]
pub struct SpeculateArgs {
    /// Draft tokens and check them in one forward: the output is the same as without.
    #[arg(long, value_enum, default_value_t = DraftKind::Off, help_heading = heading::GENERATION)]
    pub speculate: DraftKind,
    /// Drafted tokens a forward checks at most (with --speculate; ngram 6, mtp 1 by default).
    #[arg(long, value_name = "N", value_parser = draft_tokens, help_heading = heading::GENERATION)]
    pub draft_tokens: Option<usize>,
}

/// 1 to 32 tokens (a longer draft is rarely all right and costs rows every forward).
fn draft_tokens(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n @ 1..=32) => Ok(n),
        Ok(_) => Err("between 1 and 32 tokens".into()),
        Err(e) => Err(e.to_string()),
    }
}

impl SpeculateArgs {
    pub fn speculation(&self) -> Speculation {
        let base = NgramOptions::default();
        match self.speculate {
            DraftKind::Off => Speculation::Off,
            DraftKind::Ngram => {
                Speculation::Ngram(NgramOptions { max_draft: self.draft_tokens.unwrap_or(base.max_draft), ..base })
            }
            DraftKind::Mtp => Speculation::Mtp { max_draft: self.draft_tokens.unwrap_or(Speculation::MTP_DRAFT) },
        }
    }

    /// Whether the engine must load the checkpoint's draft model.
    pub fn wants_draft(&self) -> bool {
        self.speculate == DraftKind::Mtp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        s: SpeculateArgs,
    }

    fn parse(args: &[&str]) -> Result<Speculation, String> {
        let argv = std::iter::once("coli").chain(args.iter().copied());
        Cli::try_parse_from(argv).map(|c| c.s.speculation()).map_err(|e| e.to_string())
    }

    #[test]
    fn flags_become_the_draft() {
        assert_eq!(parse(&[]).unwrap(), Speculation::Off);
        assert_eq!(parse(&["--speculate", "ngram"]).unwrap(), Speculation::Ngram(NgramOptions::default()));
        let Speculation::Ngram(o) = parse(&["--speculate", "ngram", "--draft-tokens", "3"]).unwrap() else {
            panic!("ngram")
        };
        assert_eq!(o.max_draft, 3);
        assert!(parse(&["--speculate", "ngram", "--draft-tokens", "0"]).unwrap_err().contains("between 1 and 32"));
        assert_eq!(parse(&["--speculate", "mtp"]).unwrap(), Speculation::Mtp { max_draft: 1 });
        assert_eq!(parse(&["--speculate", "mtp", "--draft-tokens", "2"]).unwrap(), Speculation::Mtp { max_draft: 2 });
        assert!(parse(&["--speculate", "eagle"]).is_err());
    }
}
