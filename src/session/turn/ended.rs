//! How a headless turn ended: the entrypoint's markers of how its CLI ended, why a turn
//! ended before its CLI did, and the result texts of turns that ended otherwise than by the CLI's own answer. Not
//! here: reading the turn's output (`reading.rs`), classifying and recording its end
//! (`headless.rs`).

use std::time::Duration;

use crate::event::Status;
use crate::session::store::record::SessionRecord;
use crate::session::turn::TurnOptions;

/// The line the entrypoint prints on stdout after the CLI ended on its own, with its exit
/// code, before it waits for the turn's record (the record hand-off, see `caw-box-entry`).
pub(crate) const EXIT_MARKER: &str = "\u{1e}caw-box-exit ";

/// The line the entrypoint prints instead when the CLI ended after a signal the container
/// got ("TERM 143"): from outside the turn unless caw-box stopped it (`docker stop`, the
/// daemon stopping or restarting, a deleted pod).
pub(crate) const SIGNAL_MARKER: &str = "\u{1e}caw-box-signalled ";

/// Whether a line of a turn container's stdout is one of the entrypoint's markers, not the
/// CLI's.
pub(crate) fn is_marker(line: &str) -> bool {
    line.starts_with(EXIT_MARKER) || line.starts_with(SIGNAL_MARKER)
}

/// The result text of a turn whose container was stopped from outside caw-box: the
/// environment interrupted it, not the agent or its CLI.
pub(in crate::session) fn stopped_outside_result(signal: &str, engine: &str) -> String {
    format!(
        "the turn was interrupted by its environment: its container got SIG{signal} from \
         outside caw-box ({engine} stopped it on a shutdown or restart, or it was stopped \
         directly); the session stays resumable"
    )
}

/// The result text of a turn whose CLI could not reach its model: which host, for how
/// long, in the CLI's own words, and what the egress proxy refused.
pub(in crate::session) fn unreachable_result(
    record: &SessionRecord,
    waited: Option<Duration>,
    words: &str,
    refused: &[String],
) -> String {
    let cli = record.provider.executable();
    let host = model_host(record);
    let mut text = match waited {
        Some(w) => format!(
            "{cli} could not reach its model at {host}: no answer for {} (--connect-timeout)",
            humantime::format_duration(w)
        ),
        None => format!("{cli} could not reach its model at {host}"),
    };
    let words = words.trim();
    if !words.is_empty() {
        let words: String = words.chars().take(300).collect();
        text.push_str(&format!("; it said: {words}"));
    }
    if !refused.is_empty() {
        text.push_str(&format!(
            " (the egress proxy refused {}: not in --allow-host)",
            refused.join(", ")
        ));
    }
    text
}

/// The host a session's model traffic goes to: the `--endpoint` host, else the vendor's.
pub fn model_host(record: &SessionRecord) -> String {
    match record.settings.endpoint.as_deref() {
        Some(url) => {
            let rest = url.split_once("://").map_or(url, |(_, r)| r);
            let authority = rest.split('/').next().unwrap_or(rest);
            authority
                .rsplit('@')
                .next()
                .unwrap_or(authority)
                .to_string()
        }
        None => record
            .provider
            .api_hosts()
            .first()
            .map(|h| h.trim_end_matches(":443").to_string())
            .unwrap_or_default(),
    }
}

pub(in crate::session) fn last_line(bytes: &[u8]) -> Option<String> {
    String::from_utf8_lossy(bytes)
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(|l| l.chars().take(500).collect())
}

/// Why a headless turn ended before its CLI did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::session) enum EndedEarly {
    /// `--timeout`.
    Timeout,
    /// `--idle-timeout`: no output for that long.
    Idle,
    /// The CLI kept reporting that it could not reach its model (`--connect-timeout`).
    Unreachable,
    /// Not early: the CLI itself gave up after failing to reach its model.
    GaveUp,
    /// Ctrl-C, SIGTERM, SIGHUP or `caw-box stop`.
    Interrupted,
    /// The CLI's usage so far took the session over its `--max-cost`.
    Budget,
}

impl EndedEarly {
    /// The status and result text of a turn that ended so.
    pub fn status_and_result(
        self,
        record: &SessionRecord,
        options: &TurnOptions,
        stop_requested: bool,
        waited: Option<Duration>,
        words: &str,
        refused: &[String],
    ) -> (Status, String) {
        match self {
            EndedEarly::Timeout => (
                Status::Timeout,
                format!(
                    "the turn timed out after {} (--timeout)",
                    humantime::format_duration(options.timeout.unwrap_or_default())
                ),
            ),
            EndedEarly::Idle => (
                Status::Timeout,
                format!(
                    "the CLI printed nothing for {} (--idle-timeout)",
                    humantime::format_duration(options.idle_timeout.unwrap_or_default())
                ),
            ),
            EndedEarly::Unreachable | EndedEarly::GaveUp => (
                Status::Unreachable,
                unreachable_result(record, waited, words, refused),
            ),
            EndedEarly::Budget => (
                Status::Budget,
                "the session's spend crossed its --max-cost during the turn: caw-box stopped it"
                    .to_string(),
            ),
            EndedEarly::Interrupted if stop_requested => (
                Status::Interrupted,
                "the turn was stopped with `caw-box stop`".to_string(),
            ),
            EndedEarly::Interrupted => {
                (Status::Interrupted, "the turn was interrupted".to_string())
            }
        }
    }
}
