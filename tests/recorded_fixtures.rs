//! The provider parsers over REAL output of each pinned vendor CLI, recorded against the stub
//! model in the caw-box images (exact command lines: tests/fixtures/README.md): turn 1, a
//! resumed turn that recalls turn 1, a tool call, a rate limit (HTTP 429) and a wrong key
//! (HTTP 401, a real key rejection by the stub).

use caw_box::event::{Event, Status};
use caw_box::provider::{ParseContext, ProviderKind, TurnOutcome};

struct Parsed {
    events: Vec<Event>,
    resume_key: Option<String>,
    outcome: TurnOutcome,
}

fn parse(provider: ProviderKind, file: &str, exit_code: i64) -> Parsed {
    let path = format!(
        "{}/tests/fixtures/{}/{file}",
        env!("CARGO_MANIFEST_DIR"),
        provider.as_str()
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut parser = provider.adapter().parser(ParseContext::default());
    let mut events = Vec::new();
    for line in text.lines() {
        parser.parse_line(line, &mut events);
    }
    let resume_key = parser.resume_key().map(str::to_string);
    let outcome = parser.finish(exit_code);
    Parsed {
        events,
        resume_key,
        outcome,
    }
}

#[test]
fn recorded_turns_parse_for_every_provider() {
    for p in ProviderKind::ALL {
        let t1 = parse(p, "turn1.jsonl", 0);
        assert!(
            t1.resume_key.as_deref().is_some_and(|k| !k.is_empty()),
            "{p}: no resume key"
        );
        assert_eq!(t1.outcome.status, Status::Success, "{p}: {:?}", t1.outcome);
        assert!(
            t1.outcome.result.contains("Noted: walrus."),
            "{p}: {:?}",
            t1.outcome
        );
        assert!(
            t1.outcome.usage.input_tokens > 0,
            "{p}: no usage {:?}",
            t1.outcome
        );
        assert!(
            t1.events
                .iter()
                .any(|e| matches!(e, Event::Text { text } if text.contains("Noted"))),
            "{p}: no text event"
        );

        let tool = parse(p, "tool-call.jsonl", 0);
        assert_eq!(
            tool.outcome.status,
            Status::Success,
            "{p}: {:?}",
            tool.outcome
        );
        let call_id = tool
            .events
            .iter()
            .find_map(|e| match e {
                Event::ToolCall { id, .. } => Some(id.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{p}: no tool_call in {:?}", tool.events));
        assert!(
            tool.events.iter().any(|e| matches!(e,
                Event::ToolResult { id, output, is_error: false }
                    if *id == call_id && output.trim() == "hi")),
            "{p}: no matching tool_result in {:?}",
            tool.events
        );
        assert_eq!(
            tool.resume_key, t1.resume_key,
            "{p}: the key changed on resume"
        );

        let resumed = parse(p, "resume.jsonl", 0);
        assert!(
            resumed
                .outcome
                .result
                .contains("You told me to remember walrus."),
            "{p}: {:?}",
            resumed.outcome
        );
        assert_eq!(
            resumed.resume_key, t1.resume_key,
            "{p}: the key changed on resume"
        );
    }
}

#[test]
fn recorded_failures_are_classified() {
    for p in ProviderKind::ALL {
        for (file, status) in [
            ("error-429.jsonl", Status::UsageLimit),
            ("error-401.jsonl", Status::AuthError),
        ] {
            let parsed = parse(p, file, 1);
            assert_eq!(
                parsed.outcome.status, status,
                "{p} {file}: {:?}",
                parsed.outcome
            );
            assert!(!parsed.outcome.result.is_empty(), "{p} {file}: no message");
            assert!(
                parsed.resume_key.is_some(),
                "{p} {file}: the key is known even on failure"
            );
        }
    }
}

/// Feeds a recorded connection failure (stdout, then stderr) to `provider`'s parser.
fn unreachable_parser(provider: ProviderKind) -> Box<dyn caw_box::provider::StreamParser> {
    let dir = format!(
        "{}/tests/fixtures/{}",
        env!("CARGO_MANIFEST_DIR"),
        provider.as_str()
    );
    let mut parser = provider.adapter().parser(ParseContext::default());
    let mut events = Vec::new();
    let stdout = std::fs::read_to_string(format!("{dir}/unreachable.jsonl")).unwrap();
    for line in stdout.lines() {
        parser.parse_line(line, &mut events);
    }
    if let Ok(stderr) = std::fs::read_to_string(format!("{dir}/unreachable.stderr.log")) {
        for line in stderr.lines() {
            parser.parse_stderr_line(line);
        }
    }
    parser
}

/// Each CLI's own words for "cannot reach the model" (recorded: no name, refused) are read
/// as such, so the runner stops the turn instead of waiting forever.
#[test]
fn recorded_connection_failures_read_as_unreachable() {
    for p in ProviderKind::ALL {
        let parser = unreachable_parser(p);
        let words = parser.unreachable();
        assert!(words.is_some_and(|w| !w.is_empty()), "{p}: {words:?}");
        // The conversation can be resumed later: its key is known (opencode names it in
        // its logs only).
        assert!(parser.resume_key().is_some(), "{p}: no resume key");
    }
}

/// A model that answers after the failures (the link came back) is no longer unreachable;
/// an answer alone never was.
#[test]
fn an_answer_after_connection_failures_clears_them() {
    for p in ProviderKind::ALL {
        let mut parser = unreachable_parser(p);
        let turn1 = std::fs::read_to_string(format!(
            "{}/tests/fixtures/{}/turn1.jsonl",
            env!("CARGO_MANIFEST_DIR"),
            p.as_str()
        ))
        .unwrap();
        let mut events = Vec::new();
        for line in turn1.lines() {
            parser.parse_line(line, &mut events);
        }
        assert_eq!(parser.unreachable(), None, "{p}");
        assert_eq!(parser.finish(0).status, Status::Success, "{p}");

        let answered_only = parse(p, "turn1.jsonl", 0);
        assert_eq!(answered_only.outcome.status, Status::Success, "{p}");
    }
}

/// An HTTP error status is an answer: a rate limit or a rejected key is never "unreachable".
#[test]
fn error_statuses_are_not_connection_failures() {
    for p in ProviderKind::ALL {
        for file in ["error-429.jsonl", "error-401.jsonl"] {
            let path = format!(
                "{}/tests/fixtures/{}/{file}",
                env!("CARGO_MANIFEST_DIR"),
                p.as_str()
            );
            let text = std::fs::read_to_string(&path).unwrap();
            let mut parser = p.adapter().parser(ParseContext::default());
            let mut events = Vec::new();
            for line in text.lines() {
                parser.parse_line(line, &mut events);
            }
            assert_eq!(parser.unreachable(), None, "{p} {file}");
        }
    }
}
