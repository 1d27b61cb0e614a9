//! What to do when a turn hits a vendor's usage or rate limit (`--on-limit`, `--max-wait`),
//! and when the limit resets, read from what the CLI printed. It decides; the caller
//! (the CLI's `run`/`resume`, or a library user through [`crate::client::Session`]) waits
//! and sends again.
//!
//! The reset wordings understood, each as a CLI passes it on (tests/fixtures/README.md,
//! "Usage limits", has the recorded turns):
//! - OpenAI's API (codex, opencode): `Please try again in 1m30s.` / `in 20ms` / `in 5s`
//! - Google's API (gemini): `Please retry in 5.2s.`, `Suggested retry after 5s.`, or a
//!   `"retryDelay": "5s"` it quotes
//! - codex's own: `try again in 2 days 3 hours`; its subscription limit (ChatGPT's
//!   `usage_limit_reached`): `… or try again at 2:09 PM.` / `at Nov 25th, 2026 2:09 PM.`
//! - claude's subscription limit: `You've hit your session limit · resets 2:14pm (UTC)`
//!   (`3pm`, `Nov 26, 3pm`), with the exact time in its `rate_limit_event`
//!   (`"resetsAt":1795529654`); the older `Claude AI usage limit reached|1795529654`
//! - an API body quoted whole (opencode): `"resets_at":1795529389`, `"resets_in_seconds":111`
//! - any CLI quoting the response headers: `"retry-after":"5"` (opencode's error events)
//!
//! A clock time names a minute of the container's clock, which is UTC (caw-box sets no
//! `TZ`): the reset is taken as the end of that minute. A time in another zone is not read.

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
    /// Park the session (and every parking session of its account) until the limit resets,
    /// then go on in its conversation (`session::turn::park`); remembered by the session.
    Park,
}

impl std::str::FromStr for OnLimit {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::usage(format!("--on-limit '{s}' is not understood"))
                .with_hint("use fail, wait, park or fallback=PROVIDER[,PROVIDER]")
        };
        match s.trim() {
            "fail" => Ok(OnLimit::Fail),
            "wait" => Ok(OnLimit::Wait),
            "park" => Ok(OnLimit::Park),
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

/// `--on-limit` where only the session's own behaviour may be set (background turns, a
/// family of forks, a library session, the MCP server): `Some(true)` for `park`,
/// `Some(false)` for `fail`, `None` when not given; `wait` and `fallback` get `refused`.
pub fn parks(on_limit: Option<&str>, refused: impl FnOnce() -> Error) -> Result<Option<bool>> {
    match on_limit.map(str::parse::<OnLimit>).transpose()? {
        None => Ok(None),
        Some(OnLimit::Fail) => Ok(Some(false)),
        Some(OnLimit::Park) => Ok(Some(true)),
        Some(_) => Err(refused()),
    }
}

/// The default bound of `--on-limit wait` when `--max-wait` is not given.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(6 * 3600);

/// How long until the limit the CLI reported resets, from its words; `None` when they name
/// no reset. See [`reset_at`].
pub fn reset_after(text: &str) -> Option<Duration> {
    let now = now_unix();
    let found = Resets::read(text, now);
    let until = |at: f64| Duration::from_secs_f64((at - now).max(0.0));
    let exact = found.at.iter().map(|&at| until(at)).chain(found.within);
    exact
        .max()
        .or_else(|| found.clock.into_iter().reduce(f64::max).map(until))
}

/// Seconds since the Unix epoch, now.
pub fn now_unix() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// When (Unix seconds) the limit the CLI reported resets, from its words (the result text,
/// or its whole raw output), `now` being the current Unix time; `None` when they name no
/// reset. The latest reset found wins (a message may quote several windows); a time to the
/// second (a delay, a Unix time) wins over a clock time to the minute.
pub fn reset_at(text: &str, now: f64) -> Option<f64> {
    let found = Resets::read(text, now);
    let exact = found
        .at
        .into_iter()
        .chain(found.within.into_iter().map(|d| now + d.as_secs_f64()));
    exact
        .reduce(f64::max)
        .or_else(|| found.clock.into_iter().reduce(f64::max))
}

/// Every reset a text names, by kind.
#[derive(Default)]
struct Resets {
    /// Delays (`try again in 5s`, `retry-after`, `resets_in_seconds`).
    within: Vec<Duration>,
    /// Unix times (`resets_at`, claude's `resetsAt`).
    at: Vec<f64>,
    /// Ends of the minutes clock times name (`try again at 2:09 PM`).
    clock: Vec<f64>,
}

impl Resets {
    fn read(text: &str, now: f64) -> Resets {
        // A body quoted inside a JSON string has its quotes escaped.
        let lower = text.to_lowercase().replace("\\\"", "\"");
        let mut found = Resets::default();
        for marker in [
            "try again in ",
            "retry in ",
            "suggested retry after ",
            "\"retrydelay\":\"",
            "\"retrydelay\": \"",
        ] {
            found
                .within
                .extend(after_each(&lower, marker).filter_map(parse_spoken_duration));
        }
        for marker in [
            "\"retry-after\":\"",
            "\"retry-after\": \"",
            "retry-after: ",
            "\"resets_in_seconds\":",
            "\"resets_in_seconds\": ",
        ] {
            found.within.extend(
                after_each(&lower, marker)
                    .filter_map(leading_number)
                    .map(Duration::from_secs_f64),
            );
        }
        for marker in [
            "\"resets_at\":",
            "\"resets_at\": ",
            "\"resetsat\":",
            "\"resetsat\": ",
            "usage limit reached|",
        ] {
            // A Unix time in seconds (claude's, codex's) or, when that large, milliseconds.
            found.at.extend(
                after_each(&lower, marker)
                    .filter_map(leading_number)
                    .filter(|&n| n > 1e9)
                    .map(|at| if at > 1e11 { at / 1000.0 } else { at }),
            );
        }
        for marker in ["try again at ", "resets "] {
            found
                .clock
                .extend(after_each(&lower, marker).filter_map(|rest| parse_clock_time(rest, now)));
        }
        found
    }
}

/// The text after each occurrence of `marker` in `text`.
fn after_each<'a>(text: &'a str, marker: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    text.match_indices(marker)
        .map(move |(at, _)| &text[at + marker.len()..])
}

/// The number `s` starts with (`111`, `"5"`, `5.5`).
fn leading_number(s: &str) -> Option<f64> {
    let s = s.trim_start_matches('"');
    let number: String = s
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    number.parse().ok()
}

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];

/// `2:09 pm.`, `3pm (utc)`, `nov 26, 3pm (utc)`, `jan 2, 2027, 3:05pm`,
/// `nov 25th, 2026 2:09 pm`: the end (Unix seconds) of the minute it names on a UTC clock;
/// with no date, the occurrence of that time nearest to `now`. `None` when `s` does not
/// start with such a time, or names a zone other than UTC.
fn parse_clock_time(s: &str, now: f64) -> Option<f64> {
    let line = s.lines().next().unwrap_or("");
    let mut words = line
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|w| !w.is_empty())
        .peekable();
    let (mut month, mut day, mut year) = (None, None, None);
    if let Some(m) = words
        .peek()
        .and_then(|w| MONTHS.iter().position(|m| w.starts_with(m)))
    {
        month = Some(m as u32 + 1);
        words.next();
        let d = words.next()?;
        let digits: String = d.chars().take_while(char::is_ascii_digit).collect();
        day = Some(
            digits
                .parse::<u32>()
                .ok()
                .filter(|d| (1..=31).contains(d))?,
        );
        if let Some(y) = words
            .peek()
            .filter(|w| w.len() == 4 && w.chars().all(|c| c.is_ascii_digit()))
        {
            year = y.parse::<i64>().ok();
            words.next();
        }
    }
    // `2:09`, `pm.` / `2:09pm` / `3pm`
    let bare = |w: &str| {
        w.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '/')
            .to_string()
    };
    let mut time = bare(words.next()?);
    if !(time.ends_with("am") || time.ends_with("pm")) {
        time.push_str(&bare(words.next().unwrap_or("")));
    }
    let time = time.as_str();
    let (clock, pm) = match (time.strip_suffix("am"), time.strip_suffix("pm")) {
        (Some(c), _) => (c, false),
        (_, Some(c)) => (c, true),
        _ => return None,
    };
    let (hour, minute) = match clock.split_once(':') {
        Some((h, m)) => (h.parse::<u32>().ok()?, m.parse::<u32>().ok()?),
        None => (clock.parse::<u32>().ok()?, 0),
    };
    if !(1..=12).contains(&hour) || minute > 59 {
        return None;
    }
    if let Some(zone) = words.next().filter(|w| w.starts_with('(')) {
        if !matches!(bare(zone).as_str(), "utc" | "gmt" | "etc/utc" | "z") {
            return None;
        }
    }
    let hour = hour % 12 + if pm { 12 } else { 0 };
    let of_day = f64::from(hour * 3600 + minute * 60);
    let named = match (month, day) {
        (Some(month), Some(day)) => {
            let this_year = civil_from_days((now / 86400.0).floor() as i64).0;
            let at = |y: i64| (days_from_civil(y, month, day) * 86400) as f64 + of_day;
            match year {
                Some(y) => at(y),
                // A date without a year is within the next months: this year's or next.
                None if at(this_year) + 86400.0 < now => at(this_year + 1),
                None => at(this_year),
            }
        }
        _ => {
            let midnight = (now / 86400.0).floor() * 86400.0;
            [midnight - 86400.0, midnight, midnight + 86400.0]
                .into_iter()
                .map(|d| d + of_day)
                .min_by(|a, b| (a - now).abs().total_cmp(&(b - now).abs()))?
        }
    };
    Some(named + 60.0)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

/// The (year, month, day) of a day since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
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
        assert_eq!("park".parse::<OnLimit>().unwrap(), OnLimit::Park);
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
        let fixture = include_str!("../../../tests/fixtures/codex/hand-usage-limit.jsonl");
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
        let opencode = include_str!("../../../tests/fixtures/opencode/limit-429.jsonl");
        assert_eq!(reset_after(opencode), Some(Duration::from_secs(60)));
        let codex = include_str!("../../../tests/fixtures/codex/limit-429.jsonl");
        assert_eq!(reset_after(codex), None);
    }

    /// 2026-11-24 14:07:52 UTC, when the quota fixtures were recorded.
    const RECORDED_AT: f64 = 1_795_529_272.0;

    #[test]
    fn subscription_limits_as_each_cli_passes_them_on() {
        // tests/fixtures/README.md, "Usage limits": the stub's QUOTA: through the real CLIs.
        // claude (a claude.ai login): the exact time of its rate_limit_event.
        let claude =
            include_str!("../../../tests/fixtures/claude_code/quota-429-subscription.jsonl");
        assert_eq!(reset_at(claude, RECORDED_AT), Some(1_795_529_654.0));
        // codex: only a clock time to the minute; the reset is taken at the minute's end.
        let codex = include_str!("../../../tests/fixtures/codex/quota-429.jsonl");
        let at = reset_at(codex, RECORDED_AT).unwrap();
        assert_eq!(
            at,
            (days_from_civil(2026, 11, 24) * 86400 + 14 * 3600 + 10 * 60) as f64
        );
        // opencode quotes the API's body: resets_at is the latest time it names.
        let opencode = include_str!("../../../tests/fixtures/opencode/quota-429.jsonl");
        assert_eq!(reset_at(opencode, RECORDED_AT), Some(1_795_529_389.0));
        // gemini, a retry delay beyond what it waits out itself (300 s).
        let gemini = include_str!("../../../tests/fixtures/gemini/quota-429.jsonl");
        assert_eq!(reset_at(gemini, RECORDED_AT), Some(RECORDED_AT + 598.0));
        // claude with an API key retries the 429 and then names no reset.
        let claude = include_str!("../../../tests/fixtures/claude_code/quota-429-api-key.jsonl");
        assert_eq!(reset_at(claude, RECORDED_AT), None);
    }

    #[test]
    fn clock_times() {
        let now = (days_from_civil(2026, 11, 24) * 86400 + 14 * 3600 + 7 * 60 + 52) as f64;
        let at = |h: i64, m: i64| {
            (days_from_civil(2026, 11, 24) * 86400 + h * 3600 + m * 60 + 60) as f64
        };
        let r = |s: &str| reset_at(s, now);
        assert_eq!(
            r("You've hit your session limit · resets 2:14pm (UTC)"),
            Some(at(14, 14))
        );
        assert_eq!(
            r("You've hit your weekly limit · resets 3pm (UTC)"),
            Some(at(15, 0))
        );
        // Within its named minute still: the end of that minute.
        assert_eq!(r("… or try again at 2:07 PM."), Some(at(14, 7)));
        // Past midnight: the nearest 1:05 AM is tomorrow's.
        assert_eq!(r("try again at 1:05 AM."), Some(at(24 + 1, 5)));
        assert_eq!(
            r("You've hit your weekly limit · resets Nov 26, 3pm (UTC)"),
            Some(at(48 + 15, 0))
        );
        assert_eq!(
            r("You’ve hit your usage limit. … try again at Nov 25th, 2026 2:09 PM."),
            Some(at(24 + 14, 9))
        );
        assert_eq!(
            r("resets Jan 2, 2027, 3:05pm (UTC)"),
            Some((days_from_civil(2027, 1, 2) * 86400 + 15 * 3600 + 5 * 60 + 60) as f64)
        );
        // A zone caw-box cannot convert, or no time at all: not read.
        assert_eq!(r("resets 2:14pm (Europe/Berlin)"), None);
        assert_eq!(r("this resets the counter"), None);
        // The older claude wording, a Unix time.
        assert_eq!(
            r("Claude AI usage limit reached|1795529654"),
            Some(1_795_529_654.0)
        );
        assert_eq!(civil_from_days(days_from_civil(2024, 2, 29)), (2024, 2, 29));
    }

    #[test]
    fn no_reset_named() {
        // The recorded 429s of the stub's FAIL:429 (`retry-after: 0`) name none but zero.
        assert_eq!(reset_after("exceeded retry limit, last status: 429"), None);
        assert_eq!(reset_after("try again in a while"), None);
        let claude = include_str!("../../../tests/fixtures/claude_code/error-429.jsonl");
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
