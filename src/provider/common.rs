//! Helpers the four adapters share: reading one JSON line cheaply, telling auth failures and
//! usage limits apart in vendor error text, normalising `--endpoint` URLs, and the end-of-turn
//! bookkeeping that turns what a parser saw into a [`TurnOutcome`].
//!
//! Nothing here knows a vendor's output shapes; those stay in the adapter modules.

use serde::Deserialize;

use super::TurnOutcome;
use crate::event::{Status, Usage};

/// Parses one output line into `T`, or `None` for blank lines, non-JSON and JSON of another
/// shape. Lines that cannot be a JSON object are rejected before serde sees them.
pub(super) fn parse_line<'a, T: Deserialize<'a>>(line: &'a str) -> Option<T> {
    let line = line.trim();
    if !line.starts_with('{') {
        return None;
    }
    serde_json::from_str(line).ok()
}

/// The endpoint without trailing slashes and without a trailing `/v1`: the form the Anthropic
/// and Gemini clients expect (they add their own versioned paths).
pub(super) fn endpoint_root(endpoint: &str) -> &str {
    let trimmed = endpoint.trim().trim_end_matches('/');
    trimmed.strip_suffix("/v1").unwrap_or(trimmed)
}

/// The endpoint with exactly one trailing `/v1`: the base URL OpenAI-style clients expect.
pub(super) fn endpoint_v1(endpoint: &str) -> String {
    format!("{}/v1", endpoint_root(endpoint))
}

/// The failure class an HTTP status stands for, when it stands for one.
pub(super) fn status_for_http(code: i64) -> Option<Status> {
    match code {
        401 => Some(Status::AuthError),
        429 => Some(Status::UsageLimit),
        _ => None,
    }
}

/// Classifies a vendor's error text: `AuthError` for rejected or missing credentials,
/// `UsageLimit` for rate and usage limits, `Error` for everything else.
pub(super) fn classify_failure(message: &str) -> Status {
    let lower = message.to_ascii_lowercase();
    const AUTH: &[&str] = &[
        "unauthorized",
        "unauthenticated",
        "invalid api key",
        "invalid x-api-key",
        "invalid_api_key",
        "incorrect api key",
        "api key not valid",
        "authentication_error",
        "authentication_failed",
        "authentication failed",
        "please run /login",
        "not logged in",
        "oauth token has expired",
        "refresh_token_reused",
    ];
    const LIMIT: &[&str] = &[
        "rate_limit",
        "rate limit",
        "ratelimit",
        "usage limit",
        "usage_limit",
        "hour limit",
        "weekly limit",
        "daily limit",
        "hit your limit",
        "too many requests",
        "quota",
        "resource_exhausted",
        "resource has been exhausted",
        "credit balance",
    ];
    if contains_code(&lower, "401") || AUTH.iter().any(|needle| lower.contains(needle)) {
        return Status::AuthError;
    }
    if contains_code(&lower, "429")
        || LIMIT.iter().any(|needle| lower.contains(needle))
        || (lower.contains("limit reached") && !lower.contains("context"))
    {
        return Status::UsageLimit;
    }
    Status::Error
}

/// Whether `haystack` holds `code` as a number of its own (not inside a longer number such as
/// a port or an id).
fn contains_code(haystack: &str, code: &str) -> bool {
    let bytes = haystack.as_bytes();
    haystack.match_indices(code).any(|(at, _)| {
        let before = at.checked_sub(1).map(|i| bytes[i]);
        let after = bytes.get(at + code.len()).copied();
        !before.is_some_and(|b| b.is_ascii_digit()) && !after.is_some_and(|b| b.is_ascii_digit())
    })
}

/// The agent's answer as it streams: text accumulates into the current segment; a tool call
/// closes the segment. The final answer is the last non-empty segment, i.e. what the agent
/// said after its last tool call (what `claude -p` and `codex exec` call the result).
#[derive(Debug, Default)]
pub(super) struct Answer {
    current: String,
    last: String,
}

impl Answer {
    /// Appends streamed text to the current segment.
    pub(super) fn push(&mut self, text: &str) {
        self.current.push_str(text);
    }

    /// Starts a new segment with a whole message.
    pub(super) fn message(&mut self, text: &str) {
        self.boundary();
        self.current.push_str(text);
    }

    /// Closes the current segment (a tool call happened).
    pub(super) fn boundary(&mut self) {
        if !self.current.trim().is_empty() {
            self.last = std::mem::take(&mut self.current);
        } else {
            self.current.clear();
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.current.trim().is_empty() && self.last.trim().is_empty()
    }

    /// The final answer: the last non-empty segment.
    pub(super) fn take(&mut self) -> String {
        self.boundary();
        std::mem::take(&mut self.last)
    }
}

/// What a parser knows about the turn so far, in vendor-neutral terms.
#[derive(Debug, Default)]
pub(super) struct TurnState {
    pub(super) answer: Answer,
    /// The final answer as the vendor itself reported it (claude's `result`), if it did.
    pub(super) reported_answer: Option<String>,
    /// The vendor's own verdict on the turn: `Some(true)` it completed, `Some(false)` it
    /// failed, `None` it never said (the CLI died or was cut off).
    pub(super) verdict: Option<bool>,
    /// The most recent error message seen.
    pub(super) error: Option<String>,
    /// A failure class taken from structured data (an HTTP status, an error kind), which
    /// beats classifying the message text.
    pub(super) failure: Option<Status>,
    /// This turn's usage so far.
    pub(super) usage: Usage,
}

impl TurnState {
    /// Records an error message, keeping a structured failure class when one is known.
    pub(super) fn record_error(&mut self, message: String, failure: Option<Status>) {
        if failure.is_some() {
            self.failure = failure;
        }
        self.error = Some(message);
    }

    /// The outcome once the CLI exited with `exit_code`.
    ///
    /// The vendor's own verdict wins over the exit code: a turn the CLI reported as complete
    /// is a success, one it reported as failed is a failure. Without a verdict the turn
    /// failed, with the last error message or a message naming the exit code.
    pub(super) fn outcome(&mut self, exit_code: i64, cumulative: Option<Usage>) -> TurnOutcome {
        let usage = self.usage;
        if self.verdict == Some(true) {
            let result = match self.reported_answer.take() {
                Some(answer) => answer,
                None => self.answer.take(),
            };
            return TurnOutcome {
                status: Status::Success,
                result,
                usage,
                cumulative_usage: cumulative,
            };
        }
        let message = match self.error.take() {
            Some(message) => message,
            None if self.verdict == Some(false) => "the turn failed".to_string(),
            None if exit_code == 0 => {
                "the CLI exited with code 0 without finishing the turn".to_string()
            }
            None => exited_with(exit_code),
        };
        let status = self.failure.unwrap_or_else(|| classify_failure(&message));
        TurnOutcome {
            status,
            result: message,
            usage,
            cumulative_usage: cumulative,
        }
    }
}

/// Merges `overlay` into `base` (JSON objects, recursively); `overlay` wins on conflicts.
pub fn merge_json(base: &mut serde_json::Value, overlay: &serde_json::Value) {
    match (base, overlay) {
        (serde_json::Value::Object(b), serde_json::Value::Object(o)) => {
            for (k, v) in o {
                // `null` removes the key: a setting an earlier turn wrote is taken back.
                if v.is_null() {
                    b.remove(k);
                    continue;
                }
                merge_json(b.entry(k.clone()).or_insert(serde_json::Value::Null), v);
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// A failed turn's result when its CLI said nothing of why: its exit code.
pub(crate) fn exited_with(exit_code: i64) -> String {
    format!("the CLI exited with code {exit_code}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_get_exactly_one_v1() {
        assert_eq!(endpoint_v1("http://stub:8080"), "http://stub:8080/v1");
        assert_eq!(endpoint_v1("http://stub:8080/"), "http://stub:8080/v1");
        assert_eq!(endpoint_v1("http://stub:8080/v1"), "http://stub:8080/v1");
        assert_eq!(endpoint_v1("http://stub:8080/v1/"), "http://stub:8080/v1");
        assert_eq!(endpoint_v1("https://gw/openai"), "https://gw/openai/v1");
        assert_eq!(endpoint_root("http://stub:8080/v1/"), "http://stub:8080");
        assert_eq!(
            endpoint_root("https://gw/anthropic/"),
            "https://gw/anthropic"
        );
    }

    #[test]
    fn failures_are_classified() {
        assert_eq!(
            classify_failure("Invalid API key · Please run /login"),
            Status::AuthError
        );
        assert_eq!(
            classify_failure("unexpected status 401 Unauthorized: missing bearer"),
            Status::AuthError
        );
        assert_eq!(
            classify_failure("API key not valid. Please pass a valid API key."),
            Status::AuthError
        );
        assert_eq!(
            classify_failure("API Error: 429 {\"type\":\"error\"}"),
            Status::UsageLimit
        );
        assert_eq!(
            classify_failure("Claude AI usage limit reached|1767225600"),
            Status::UsageLimit
        );
        assert_eq!(
            classify_failure("5-hour limit reached ∙ resets 3pm"),
            Status::UsageLimit
        );
        assert_eq!(
            classify_failure("Quota exceeded for metric"),
            Status::UsageLimit
        );
        assert_eq!(classify_failure("context limit reached"), Status::Error);
        assert_eq!(
            classify_failure("connection refused to 10.0.0.1:4010"),
            Status::Error
        );
        assert_eq!(classify_failure("request id 14290 failed"), Status::Error);
        assert_eq!(classify_failure("stream disconnected"), Status::Error);
    }

    #[test]
    fn answer_is_the_last_non_empty_segment() {
        let mut answer = Answer::default();
        answer.push("Let me ");
        answer.push("look.");
        answer.boundary();
        answer.push("  ");
        answer.boundary();
        assert_eq!(answer.take(), "Let me look.");
        answer.message("first");
        answer.message("second");
        assert_eq!(answer.take(), "second");
        assert!(answer.is_empty());
    }

    #[test]
    fn no_verdict_is_a_failure_naming_the_exit_code() {
        let mut state = TurnState::default();
        let outcome = state.outcome(137, None);
        assert_eq!(outcome.status, Status::Error);
        assert_eq!(outcome.result, "the CLI exited with code 137");
        let mut state = TurnState::default();
        state.answer.push("partial");
        let outcome = state.outcome(0, None);
        assert_eq!(outcome.status, Status::Error);
        assert!(outcome.result.contains("code 0"), "{}", outcome.result);
    }

    #[test]
    fn lines_that_are_not_objects_are_skipped_before_serde() {
        assert_eq!(parse_line::<serde_json::Value>(""), None);
        assert_eq!(parse_line::<serde_json::Value>("   "), None);
        assert_eq!(parse_line::<serde_json::Value>("Loading…"), None);
        assert_eq!(parse_line::<serde_json::Value>("[1,2]"), None);
        assert_eq!(parse_line::<serde_json::Value>("{\"a\":"), None);
        assert!(parse_line::<serde_json::Value>(" {\"a\":1}\r").is_some());
    }
}

/// Whether a CLI's words say that it could not connect to its model at all (no name, no
/// route, refused, reset, timed out), as opposed to an answer that carried an error.
pub(super) fn is_connection_failure(text: &str) -> bool {
    const NEEDLES: &[&str] = &[
        "connection failed",
        "connection refused",
        "connection error",
        "connection reset",
        "error sending request",
        "waiting for network",
        "fetch failed",
        "unable to connect",
        "cannot connect to api",
        "failed to connect",
        "dns error",
        "getaddrinfo",
        "enotfound",
        "eai_again",
        "econnrefused",
        "econnreset",
        "etimedout",
        "ehostunreach",
        "enetunreach",
        "connect timeout",
        "und_err_connect_timeout",
    ];
    let lower = text.to_ascii_lowercase();
    NEEDLES.iter().any(|n| lower.contains(n))
}

/// What a parser knows of the CLI's link to its model: failing (in the CLI's words) from a
/// connection failure it reported until the model's next answer.
#[derive(Debug, Default)]
pub(super) struct Link {
    failing: Option<String>,
}

impl Link {
    /// The CLI reported that it could not reach its model.
    pub(super) fn failing(&mut self, words: &str) {
        let words: String = words.trim().chars().take(300).collect();
        self.failing = Some(words);
    }

    /// Called with the events of each line: anything the model produced means it answered.
    pub(super) fn saw(&mut self, events: &[crate::event::Event]) {
        use crate::event::Event;
        if events.iter().any(|e| {
            matches!(
                e,
                Event::Text { .. }
                    | Event::Thinking { .. }
                    | Event::ToolCall { .. }
                    | Event::Usage { .. }
            )
        }) {
            self.failing = None;
        }
    }

    /// The CLI reached its model after all (e.g. an error status came back).
    pub(super) fn reached(&mut self) {
        self.failing = None;
    }

    pub(super) fn get(&self) -> Option<&str> {
        self.failing.as_deref()
    }
}

#[cfg(test)]
mod merge_tests {
    use super::*;

    #[test]
    fn merge_keeps_existing_keys() {
        let mut base = serde_json::json!({"a": 1, "security": {"x": true}});
        merge_json(
            &mut base,
            &serde_json::json!({"security": {"auth": {"selectedType": "k"}}}),
        );
        assert_eq!(
            base,
            serde_json::json!({"a": 1, "security": {"x": true, "auth": {"selectedType": "k"}}})
        );
    }
}
