//! Helpers shared by the adapters' unit tests.

use super::{ParseContext, Provider, TurnOutcome, TurnRequest};
use crate::event::Event;

/// A first-turn request with just a prompt.
pub fn request(prompt: &str) -> TurnRequest<'_> {
    TurnRequest {
        prompt,
        ..TurnRequest::default()
    }
}

/// Feeds a recorded stream to `provider`'s parser: the events, the resume key it found and
/// the outcome for `exit_code`.
pub fn parse_with(
    provider: &dyn Provider,
    context: ParseContext,
    fixture: &str,
    exit_code: i64,
) -> (Vec<Event>, Option<String>, TurnOutcome) {
    let mut parser = provider.parser(context);
    let mut events = Vec::new();
    for line in fixture.lines() {
        parser.parse_line(line, &mut events);
    }
    let key = parser.resume_key().map(str::to_string);
    (events, key, parser.finish(exit_code))
}
