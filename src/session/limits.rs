//! What to do when a turn hits a vendor's usage or rate limit (`--on-limit`, `--max-wait`),
//! and when the limit resets, read from the words the CLI printed. It decides; the caller
//! (the CLI's `run`/`resume`, or a library user through [`crate::client::Session`]) waits
//! and sends again.
//!
//! The reset wordings understood, each as a CLI passes it on:
//! - OpenAI's API (codex, opencode): `Please try again in 1m30s.` / `in 20ms` / `in 5s`
//! - Google's API (gemini): `Please retry in 5.2s.`, or a `"retryDelay": "5s"` it quotes
//! - codex's own: `try again in 2 days 3 hours`
//! - any CLI quoting the response headers: `"retry-after":"5"` (opencode's error events)

use std::time::Duration;

use crate::error::{Error, Result};
use crate::provider::ProviderKind;

/// `--on-limit`: what a turn that ends in `usage_limit` leads to.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum OnLimit {
    /// End with exit 5 (the default).
    #[default]
    Fail,
    /// Wait for the reset the vendor named, then send the same prompt again in the same
    /// session; exit 5 when no reset is named or it is beyond `--max-wait`.
    Wait,
    /// Send the same prompt to a new session of the next provider in the list.
    Fallback(Vec<ProviderKind>),
}

impl std::str::FromStr for OnLimit {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::usage(format!("--on-limit '{s}' is not understood"))
                .with_hint("use fail, wait or fallback=PROVIDER[,PROVIDER]")
        };
        match s.trim() {
            "fail" => Ok(OnLimit::Fail),
            "wait" => Ok(OnLimit::Wait),
            other => {
                let list = other.strip_prefix("fallback=").ok_or_else(bad)?;
                let providers = list
                    .split(',')
                    .map(|p| p.trim().parse::<ProviderKind>().map_err(Error::from))
                    .collect::<Result<Vec<_>>>()?;
                if providers.is_empty() {
                    return Err(bad());
                }
                Ok(OnLimit::Fallback(providers))
            }
        }
    }
}

/// The default bound of `--on-limit wait` when `--max-wait` is not given.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(6 * 3600);

/// How long until the limit the CLI reported resets, from its words; `None` when they name
/// no reset. The longest wait found wins (a message may quote several windows).
pub fn reset_after(text: &str) -> Option<Duration> {
    let lower = text.to_lowercase();
    let mut found: Vec<Duration> = Vec::new();
    for marker in [
        "try again in ",
        "retry in ",
        "\"retrydelay\":\"",
        "\"retrydelay\": \"",
    ] {
        let mut rest = lower.as_str();
        while let Some(at) = rest.find(marker) {
            rest = &rest[at + marker.len()..];
            if let Some(d) = parse_spoken_duration(rest) {
                found.push(d);
            }
        }
    }
    for marker in ["\"retry-after\":\"", "\"retry-after\": \"", "retry-after: "] {
        let mut rest = lower.as_str();
        while let Some(at) = rest.find(marker) {
            rest = &rest[at + marker.len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            if let Ok(secs) = digits.parse::<u64>() {
                found.push(Duration::from_secs(secs));
            }
        }
    }
    found.into_iter().max()
}

/// `5s`, `1.5s`, `20ms`, `1m30s`, `6m0s`, `2 days 3 hours`, `5 seconds`: the leading
/// duration of `s`, `None` when it starts with none.
fn parse_spoken_duration(s: &str) -> Option<Duration> {
    let mut total = 0f64;
    let mut any = false;
    let mut rest = s;
    loop {
        let trimmed = rest
            .trim_start_matches([' ', ','])
            .trim_start_matches("and ");
        let number: String = trimmed
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        let Ok(value) = number.parse::<f64>() else {
            break;
        };
        let after = trimmed[number.len()..].trim_start();
        let unit: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphabetic())
            .collect();
        let secs = match unit.as_str() {
            "ms" | "millisecond" | "milliseconds" => 0.001,
            "s" | "sec" | "secs" | "second" | "seconds" => 1.0,
            "m" | "min" | "mins" | "minute" | "minutes" => 60.0,
            "h" | "hr" | "hrs" | "hour" | "hours" => 3600.0,
            "d" | "day" | "days" => 86400.0,
            _ => break,
        };
        total += value * secs;
        any = true;
        rest = &after[unit.len()..];
    }
    any.then(|| Duration::from_secs_f64(total))
}

/// Whether to wait `reset` under `max_wait`; the error (exit 5) says why not.
pub fn check_wait(reset: Option<Duration>, max_wait: Duration, what: &str) -> Result<Duration> {
    match reset {
        None => Err(Error::new(
            crate::error::ErrorKind::UsageLimit,
            format!("{what} hit a usage limit and named no reset time to wait for"),
        )
        .with_hint("try again later, or use --on-limit fallback=PROVIDER")),
        Some(d) if d > max_wait => Err(Error::new(
            crate::error::ErrorKind::UsageLimit,
            format!(
                "{what} hit a usage limit that resets in {}, beyond --max-wait {}",
                humantime::format_duration(Duration::from_secs(d.as_secs().max(1))),
                humantime::format_duration(max_wait)
            ),
        )
        .with_hint("raise --max-wait, or use --on-limit fallback=PROVIDER")),
        Some(d) => Ok(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_limit_parses() {
        assert_eq!("fail".parse::<OnLimit>().unwrap(), OnLimit::Fail);
        assert_eq!("wait".parse::<OnLimit>().unwrap(), OnLimit::Wait);
        assert_eq!(
            "fallback=claude,gemini".parse::<OnLimit>().unwrap(),
            OnLimit::Fallback(vec![ProviderKind::ClaudeCode, ProviderKind::Gemini])
        );
        for bad in ["", "later", "fallback=", "fallback=nope"] {
            assert_eq!(bad.parse::<OnLimit>().unwrap_err().exit_code(), 2, "{bad}");
        }
    }

    #[test]
    fn openai_and_google_wordings() {
        let s = |secs: f64| Some(Duration::from_secs_f64(secs));
        assert_eq!(
            reset_after(
                "Rate limit reached for gpt-5.5 on tokens per min (TPM). Please try again in 5s."
            ),
            s(5.0)
        );
        assert_eq!(reset_after("Please try again in 1m30s."), s(90.0));
        assert_eq!(reset_after("Please try again in 20ms."), s(0.02));
        assert_eq!(
            reset_after("[API Error: Quota exceeded. Please retry in 5.5s.]"),
            s(5.5)
        );
        assert_eq!(
            reset_after(
                r#"{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"7s"}"#
            ),
            s(7.0)
        );
    }

    #[test]
    fn codex_and_header_wordings() {
        // tests/fixtures/codex/hand-usage-limit.jsonl
        let fixture = include_str!("../../tests/fixtures/codex/hand-usage-limit.jsonl");
        assert_eq!(
            reset_after(fixture),
            Some(Duration::from_secs(2 * 86400 + 3 * 3600))
        );
        assert_eq!(
            reset_after(r#""responseHeaders":{"retry-after":"12","content-type":"x"}"#),
            Some(Duration::from_secs(12))
        );
    }

    #[test]
    fn recorded_limit_turns() {
        // tests/fixtures/README.md, "Usage limits": the stub's LIMIT:60 through the real CLIs.
        let opencode = include_str!("../../tests/fixtures/opencode/limit-429.jsonl");
        assert_eq!(reset_after(opencode), Some(Duration::from_secs(60)));
        let codex = include_str!("../../tests/fixtures/codex/limit-429.jsonl");
        assert_eq!(reset_after(codex), None);
    }

    #[test]
    fn no_reset_named() {
        // The recorded 429s of the stub's FAIL:429 (`retry-after: 0`) name none but zero.
        assert_eq!(reset_after("exceeded retry limit, last status: 429"), None);
        assert_eq!(reset_after("try again in a while"), None);
        let claude = include_str!("../../tests/fixtures/claude_code/error-429.jsonl");
        assert_eq!(reset_after(claude), None);
    }

    #[test]
    fn max_wait_bounds_the_wait() {
        let five = Duration::from_secs(5);
        assert_eq!(check_wait(Some(five), five, "x").unwrap(), five);
        let e = check_wait(Some(five), Duration::from_secs(1), "the codex turn").unwrap_err();
        assert_eq!(e.exit_code(), 5);
        assert!(e.to_string().contains("beyond --max-wait 1s"), "{e}");
        assert_eq!(check_wait(None, five, "x").unwrap_err().exit_code(), 5);
    }
}
