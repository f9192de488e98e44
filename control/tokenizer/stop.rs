//! Stop strings, matched and trimmed by the gateway.
//!
//! Engines without a tokenizer reject string stops (they see only ids), so
//! the gateway watches the detokenized text itself. A stop string may arrive
//! split across many chunks, so text that could still be the start of a stop
//! is held back until it either completes the stop or cannot anymore;
//! everything else is released at once, keeping streaming latency unchanged
//! for text that is nowhere near a stop.

/// What one [`StopMatcher::push`] releases.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopOutcome {
    /// Text safe to send to the client now.
    pub text: String,
    /// The stop string that ended the sequence, if one did. Text after it is
    /// discarded.
    pub matched_stop: Option<String>,
}

/// Watches one sequence's text for stop strings.
///
/// When several stops are present, the one that completes first in the text
/// wins (on a tie, the longer one), so the outcome does not depend on how
/// the text was chunked.
#[derive(Debug)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Keep the stop string in the output instead of trimming it.
    no_stop_trim: bool,
    /// Text received but not yet released: a suffix that may begin a stop.
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// Empty strings in `stops` are ignored.
    pub fn new<S: Into<String>>(stops: impl IntoIterator<Item = S>, no_stop_trim: bool) -> Self {
        Self {
            stops: stops
                .into_iter()
                .map(Into::into)
                .filter(|stop: &String| !stop.is_empty())
                .collect(),
            no_stop_trim,
            held: String::new(),
            stopped: false,
        }
    }

    /// Adds newly decoded text. Once a stop matched, every later push
    /// releases nothing.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        if self.stopped {
            return StopOutcome::default();
        }
        if self.stops.is_empty() {
            return StopOutcome {
                text: text.to_owned(),
                matched_stop: None,
            };
        }
        self.held.push_str(text);
        if let Some((stop_index, start)) = self.first_completed_stop() {
            let stop = &self.stops[stop_index];
            let mut released = std::mem::take(&mut self.held);
            released.truncate(if self.no_stop_trim {
                start + stop.len()
            } else {
                start
            });
            self.stopped = true;
            return StopOutcome {
                text: released,
                matched_stop: Some(stop.clone()),
            };
        }
        let release_len = self.held.len() - self.partial_stop_len();
        let still_held = self.held.split_off(release_len);
        StopOutcome {
            text: std::mem::replace(&mut self.held, still_held),
            matched_stop: None,
        }
    }

    /// The sequence ended without a stop string: releases the held-back text.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// The index and byte offset in `held` of the stop that ends first.
    fn first_completed_stop(&self) -> Option<(usize, usize)> {
        self.stops
            .iter()
            .enumerate()
            .filter_map(|(index, stop)| {
                let start = self.held.find(stop.as_str())?;
                Some((index, start, start + stop.len()))
            })
            .min_by_key(|&(_, start, end)| (end, start))
            .map(|(index, start, _)| (index, start))
    }

    /// The length of the longest suffix of `held` that begins some stop.
    fn partial_stop_len(&self) -> usize {
        self.stops
            .iter()
            .map(|stop| longest_suffix_starting(&self.held, stop))
            .max()
            .unwrap_or(0)
    }
}

/// The length of the longest suffix of `text` that is a proper prefix of
/// `stop` (ending on a character boundary of both).
fn longest_suffix_starting(text: &str, stop: &str) -> usize {
    let longest = stop.len().saturating_sub(1).min(text.len());
    (1..=longest)
        .rev()
        .find(|&len| stop.is_char_boundary(len) && text.ends_with(&stop[..len]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pushes each piece and returns the outcomes.
    fn push_all(matcher: &mut StopMatcher, pieces: &[&str]) -> Vec<StopOutcome> {
        pieces.iter().map(|piece| matcher.push(piece)).collect()
    }

    fn released(text: &str) -> StopOutcome {
        StopOutcome {
            text: text.to_owned(),
            matched_stop: None,
        }
    }

    fn stopped(text: &str, stop: &str) -> StopOutcome {
        StopOutcome {
            text: text.to_owned(),
            matched_stop: Some(stop.to_owned()),
        }
    }

    #[test]
    fn a_stop_split_across_many_pushes_is_trimmed() {
        let mut matcher = StopMatcher::new(["</answer>"], false);
        let outcomes = push_all(
            &mut matcher,
            &["The result is 42<", "/an", "sw", "er", ">after", "more"],
        );
        assert_eq!(
            outcomes,
            [
                released("The result is 42"),
                released(""),
                released(""),
                released(""),
                stopped("", "</answer>"),
                released(""),
            ]
        );
        assert_eq!(matcher.finish(), "");
    }

    #[test]
    fn no_stop_trim_keeps_the_stop_and_drops_what_follows() {
        let mut matcher = StopMatcher::new(["</answer>"], true);
        let outcomes = push_all(&mut matcher, &["42</ans", "wer> and more"]);
        assert_eq!(
            outcomes,
            [released("42"), stopped("</answer>", "</answer>")]
        );
    }

    #[test]
    fn overlapping_candidates_hold_back_only_what_can_still_match() {
        let mut matcher = StopMatcher::new(["abcd"], false);
        let outcomes = push_all(&mut matcher, &["a", "b", "a", "b", "c", "x"]);
        let texts: Vec<&str> = outcomes
            .iter()
            .map(|outcome| outcome.text.as_str())
            .collect();
        assert_eq!(texts, ["", "", "ab", "", "", "abcx"]);

        let mut matcher = StopMatcher::new(["aab"], false);
        let outcomes = push_all(&mut matcher, &["a", "a", "a", "b"]);
        assert_eq!(
            outcomes,
            [
                released(""),
                released(""),
                released("a"),
                stopped("", "aab")
            ]
        );
    }

    #[test]
    fn the_stop_that_completes_first_wins() {
        let stops = ["world", "lo w", "STOP"];
        let mut whole = StopMatcher::new(stops, false);
        assert_eq!(whole.push("hello world STOP"), stopped("hel", "lo w"));

        // Chunking does not change the winner.
        let mut by_char = StopMatcher::new(stops, false);
        let mut text = String::new();
        let mut matched = None;
        for character in "hello world STOP".chars() {
            let outcome = by_char.push(&character.to_string());
            text.push_str(&outcome.text);
            matched = matched.or(outcome.matched_stop);
        }
        assert_eq!((text.as_str(), matched.as_deref()), ("hel", Some("lo w")));
    }

    #[test]
    fn on_a_tie_the_longer_stop_wins() {
        let mut matcher = StopMatcher::new(["bc", "abc"], false);
        assert_eq!(matcher.push("xabc"), stopped("x", "abc"));
    }

    #[test]
    fn a_stop_that_never_completes_is_released_at_finish() {
        let mut matcher = StopMatcher::new(["</s>"], false);
        assert_eq!(matcher.push("the end </"), released("the end "));
        assert_eq!(matcher.push("s"), released(""));
        assert_eq!(matcher.finish(), "</s");
        assert_eq!(matcher.finish(), "", "finish releases once");
    }

    #[test]
    fn no_stops_pass_everything_through() {
        let mut matcher = StopMatcher::new(Vec::<String>::new(), false);
        assert_eq!(
            matcher.push("anything </s> at all"),
            released("anything </s> at all")
        );
        assert_eq!(matcher.finish(), "");
        let mut only_empty = StopMatcher::new([""], false);
        assert_eq!(only_empty.push("abc"), released("abc"));
    }

    #[test]
    fn unicode_stops_are_held_and_cut_on_character_boundaries() {
        let mut matcher = StopMatcher::new(["。終わり", "éa"], false);
        assert_eq!(matcher.push("こんにちは。終"), released("こんにちは"));
        assert_eq!(matcher.push("わり、残り"), stopped("", "。終わり"));

        let mut matcher = StopMatcher::new(["éa"], false);
        assert_eq!(matcher.push("café"), released("caf"));
        assert_eq!(matcher.push("s 🛑"), released("és 🛑"));
    }

    #[test]
    fn longest_suffix_starting_is_a_proper_prefix() {
        assert_eq!(longest_suffix_starting("xxab", "abc"), 2);
        assert_eq!(
            longest_suffix_starting("abc", "abc"),
            0,
            "a whole stop is a match, not a prefix"
        );
        assert_eq!(longest_suffix_starting("zé", "éa"), "é".len());
        assert_eq!(longest_suffix_starting("", "abc"), 0);
    }
}
