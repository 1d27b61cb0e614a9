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

/// Asserts that `provider` hands a headless turn's prompt to its CLI on stdin, whole, on a
/// first turn and on a resumed one, and never on its command line (where Linux takes at most
/// 128 KiB in one argument): a prompt's size or look (an option, a subcommand's name, `-`)
/// changes nothing in argv (but opencode's short title).
pub fn assert_prompt_only_on_stdin(provider: &dyn Provider) {
    // The first line is plain: opencode titles a session with it.
    let large = format!(
        "Read all of this.\nMARKER {} MARKER",
        "0123456789".repeat(30_000)
    );
    let argv_of = |prompt: &str, resume_key: Option<&str>| {
        let command = provider.turn_command(&TurnRequest {
            resume_key,
            new_session_key: Some("new-key"),
            model: Some("a-model"),
            ..request(prompt)
        });
        assert_eq!(
            command.stdin.as_deref(),
            Some(prompt.as_bytes()),
            "{:?}: the prompt is not the CLI's stdin",
            provider.kind()
        );
        let argv: Vec<String> = command
            .argv
            .into_iter()
            .filter(|a| !a.starts_with("--title="))
            .collect();
        argv
    };
    for resume_key in [None, Some("a-key")] {
        let plain = argv_of("hello", resume_key);
        assert!(!plain.iter().any(|a| a == "hello"), "{plain:?}");
        let argv = argv_of(&large, resume_key);
        assert!(
            !argv.iter().any(|a| a.contains("MARKER")),
            "{:?}: the prompt is in argv",
            provider.kind()
        );
        assert_eq!(argv, plain, "{:?}", provider.kind());
        for odd in [
            "update",
            "mcp",
            "--help me",
            "-v is broken",
            "-",
            "resume",
            "a\n- b",
        ] {
            assert_eq!(
                argv_of(odd, resume_key),
                plain,
                "{:?}: {odd:?}",
                provider.kind()
            );
        }
    }
    // The TUI opens with no prompt at all.
    let tui = provider.turn_command(&TurnRequest {
        interactive: true,
        ..request("")
    });
    assert_eq!(tui.stdin, None, "{:?}", provider.kind());
}
