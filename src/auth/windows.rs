//! What an account has left, as its vendor's responses say: the limit headers the credential
//! broker sees on each model response (it reports their names and values, which hold no
//! secret, as `caw-box-broker limits <json>`), kept per account in
//! `<data dir>/accounts/<account>/windows.json`, newest values per window.
//!
//! Per vendor (their documented header names; the stub model sends them in these shapes):
//! - Anthropic: `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,
//!   remaining,reset}` (reset: RFC 3339) for an API key; a claude.ai login's unified limits
//!   `anthropic-ratelimit-unified-{5h,7d,…}-{utilization,reset}` (0–1, Unix seconds) and
//!   `anthropic-ratelimit-unified-status` (`allowed`, `allowed_warning`, `rejected`).
//! - OpenAI: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` (reset: a duration,
//!   `6m0s`); codex's usage windows `x-codex-{primary,secondary}-{used-percent,
//!   window-minutes,reset-after-seconds}`.
//! - Google sends none: a Gemini account's windows stay unknown.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::dirs;
use crate::error::Result;
use crate::provider::ProviderKind;

/// One limit window of an account.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Window {
    /// `requests`, `tokens`, `input_tokens`, `output_tokens` (an API's per-minute limits),
    /// `5h`, `7d`, … (a subscription's), `primary`, `secondary` (codex's).
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining: Option<u64>,
    /// The share used, 0–100 (what a subscription's window says instead of counts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_percent: Option<f64>,
    /// The window's length, where the vendor says it (codex), in minutes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_minutes: Option<u64>,
    /// When it starts afresh, Unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resets_at: Option<u64>,
}

/// An account's windows as its latest responses left them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Standing {
    pub account: String,
    pub provider: String,
    /// The latest response's time (Unix seconds) and HTTP status.
    pub updated_at: u64,
    pub last_status: u16,
    /// Anthropic's unified status, where it sends one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    pub windows: Vec<Window>,
}

/// What the broker reports of one response.
#[derive(Debug, Deserialize)]
struct Report {
    status: u16,
    /// Unix milliseconds.
    at: u64,
    headers: BTreeMap<String, String>,
}

fn path_of(account: &str) -> Result<PathBuf> {
    Ok(dirs::data_dir()?
        .join("accounts")
        .join(account)
        .join("windows.json"))
}

impl Standing {
    /// When the account's spent windows start afresh (Unix seconds), as its latest response
    /// said, if that response came at or after `since` and says a window is spent (none
    /// remaining, or all of it used): the latest such reset after `now`.
    pub fn spent_until(&self, since: u64, now: u64) -> Option<u64> {
        if self.updated_at < since {
            return None;
        }
        self.windows
            .iter()
            .filter(|w| w.remaining == Some(0) || w.used_percent.is_some_and(|p| p >= 100.0))
            .filter_map(|w| w.resets_at)
            .filter(|&at| at > now)
            .max()
    }
}

/// The windows `account`'s responses reported last, if any.
pub fn read(account: &str) -> Option<Standing> {
    serde_json::from_slice(&std::fs::read(path_of(account).ok()?).ok()?).ok()
}

/// Keeps what a broker's `caw-box-broker limits <json>` line says of `account`'s windows:
/// each window it names replaced, the others kept. A report older than the one kept is
/// dropped (brokers of one account report in any order).
pub fn record(account: &str, provider: ProviderKind, json: &str) -> Result<()> {
    let Ok(report) = serde_json::from_str::<Report>(json) else {
        return Ok(());
    };
    let at = report.at / 1000;
    let (status, windows) = parse(&report.headers, at);
    let mut standing = read(account).unwrap_or_default();
    if standing.updated_at > at {
        return Ok(());
    }
    standing.account = account.to_string();
    standing.provider = provider.to_string();
    standing.updated_at = at;
    standing.last_status = report.status;
    if status.is_some() {
        standing.status = status;
    }
    for w in windows {
        match standing.windows.iter_mut().find(|k| k.name == w.name) {
            Some(kept) => *kept = w,
            None => standing.windows.push(w),
        }
    }
    standing.windows.sort_by(|a, b| a.name.cmp(&b.name));
    dirs::write_private_unsynced(
        &path_of(account)?,
        &serde_json::to_vec_pretty(&standing).expect("windows serialize"),
    )
}

/// The windows `headers` state, and Anthropic's unified status; `at`: the response's
/// time (Unix seconds), from which relative resets count.
pub fn parse(headers: &BTreeMap<String, String>, at: u64) -> (Option<String>, Vec<Window>) {
    let mut windows: BTreeMap<String, Window> = BTreeMap::new();
    fn window<'w>(windows: &'w mut BTreeMap<String, Window>, name: &str) -> &'w mut Window {
        windows.entry(name.to_string()).or_insert_with(|| Window {
            name: name.to_string(),
            ..Window::default()
        })
    }
    let mut status = None;
    for (k, v) in headers {
        let k = k.to_ascii_lowercase();
        let v = v.trim();
        if let Some(rest) = k.strip_prefix("anthropic-ratelimit-unified-") {
            match rest {
                "status" => status = Some(v.to_string()),
                _ => {
                    if let Some(name) = rest.strip_suffix("-utilization") {
                        window(&mut windows, name).used_percent =
                            v.parse::<f64>().ok().map(|u| u * 100.0);
                    } else if let Some(name) = rest.strip_suffix("-reset") {
                        window(&mut windows, name).resets_at = v.parse().ok();
                    }
                }
            }
        } else if let Some(rest) = k.strip_prefix("anthropic-ratelimit-") {
            let Some((name, field)) = rest.rsplit_once('-') else {
                continue;
            };
            let w = window(&mut windows, &name.replace('-', "_"));
            match field {
                "limit" => w.limit = v.parse().ok(),
                "remaining" => w.remaining = v.parse().ok(),
                "reset" => {
                    w.resets_at = humantime::parse_rfc3339_weak(v)
                        .ok()
                        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                        .map(|d| d.as_secs());
                }
                _ => {}
            }
        } else if let Some(rest) = k.strip_prefix("x-ratelimit-") {
            let Some((field, name)) = rest.split_once('-') else {
                continue;
            };
            let w = window(&mut windows, name);
            match field {
                "limit" => w.limit = v.parse().ok(),
                "remaining" => w.remaining = v.parse().ok(),
                "reset" => w.resets_at = go_duration_secs(v).map(|s| at + s.ceil() as u64),
                _ => {}
            }
        } else if let Some(rest) = k.strip_prefix("x-codex-") {
            for name in ["primary", "secondary"] {
                let Some(field) = rest.strip_prefix(name).and_then(|r| r.strip_prefix('-')) else {
                    continue;
                };
                let w = window(&mut windows, name);
                match field {
                    "used-percent" => w.used_percent = v.parse().ok(),
                    "window-minutes" => w.window_minutes = v.parse().ok(),
                    "reset-after-seconds" => w.resets_at = v.parse::<u64>().ok().map(|s| at + s),
                    _ => {}
                }
            }
        }
    }
    (status, windows.into_values().collect())
}

/// A Go duration as OpenAI sends its resets (`6m0s`, `1h2m3.5s`, `20ms`), in seconds.
fn go_duration_secs(s: &str) -> Option<f64> {
    let mut total = 0.0;
    let mut rest = s;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let scale = match &rest[..u] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += value * scale;
        rest = &rest[u..];
    }
    Some(total)
}

/// "requests 7/10 left, resets in 52s · 5h 40% used, resets in 3h": one line of an
/// account's windows, as of `now`.
pub fn summary(s: &Standing, now: u64) -> String {
    let mut parts: Vec<String> = s
        .windows
        .iter()
        .map(|w| {
            let mut t = w.name.clone();
            match (w.remaining, w.limit, w.used_percent) {
                (Some(r), Some(l), _) => t.push_str(&format!(" {r}/{l} left")),
                (Some(r), None, _) => t.push_str(&format!(" {r} left")),
                (_, _, Some(p)) => t.push_str(&format!(" {p:.0}% used")),
                _ => {}
            }
            if let Some(at) = w.resets_at {
                let d = std::time::Duration::from_secs(at.saturating_sub(now));
                t.push_str(&format!(", resets in {}", humantime::format_duration(d)));
            }
            t
        })
        .collect();
    if let Some(status) = &s.status {
        parts.insert(0, status.clone());
    }
    if parts.is_empty() {
        parts.push("no limits named in its responses".to_string());
    }
    parts.join(" · ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn anthropics_key_and_subscription_headers() {
        let (status, w) = parse(
            &headers(&[
                ("anthropic-ratelimit-requests-limit", "50"),
                ("anthropic-ratelimit-requests-remaining", "49"),
                ("anthropic-ratelimit-requests-reset", "2026-11-30T12:00:30Z"),
                ("anthropic-ratelimit-input-tokens-remaining", "39000"),
                ("anthropic-ratelimit-unified-status", "allowed_warning"),
                ("anthropic-ratelimit-unified-5h-utilization", "0.82"),
                ("anthropic-ratelimit-unified-5h-reset", "1796040000"),
            ]),
            0,
        );
        assert_eq!(status.as_deref(), Some("allowed_warning"));
        let by = |n: &str| w.iter().find(|w| w.name == n).cloned().unwrap();
        let r = by("requests");
        assert_eq!((r.limit, r.remaining), (Some(50), Some(49)));
        assert_eq!(r.resets_at, Some(1796040030));
        assert_eq!(by("input_tokens").remaining, Some(39000));
        let five = by("5h");
        assert_eq!(five.resets_at, Some(1_796_040_000));
        assert!((five.used_percent.unwrap() - 82.0).abs() < 1e-9);
    }

    #[test]
    fn openais_and_codexs_headers() {
        let (status, w) = parse(
            &headers(&[
                ("x-ratelimit-limit-requests", "10"),
                ("x-ratelimit-remaining-requests", "7"),
                ("x-ratelimit-reset-requests", "6m0s"),
                ("x-ratelimit-reset-tokens", "20ms"),
                ("x-codex-primary-used-percent", "33.5"),
                ("x-codex-primary-window-minutes", "300"),
                ("x-codex-primary-reset-after-seconds", "120"),
            ]),
            1000,
        );
        assert_eq!(status, None);
        let by = |n: &str| w.iter().find(|w| w.name == n).cloned().unwrap();
        let r = by("requests");
        assert_eq!(
            (r.limit, r.remaining, r.resets_at),
            (Some(10), Some(7), Some(1360))
        );
        assert_eq!(by("tokens").resets_at, Some(1001));
        let p = by("primary");
        assert_eq!((p.window_minutes, p.resets_at), (Some(300), Some(1120)));
        assert_eq!(p.used_percent, Some(33.5));
        assert!(summary(
            &Standing {
                windows: w,
                ..Standing::default()
            },
            1000
        )
        .contains("requests 7/10 left, resets in 6m"));
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration_secs("6m0s"), Some(360.0));
        assert_eq!(go_duration_secs("1h2m3.5s"), Some(3723.5));
        assert_eq!(go_duration_secs("12.5s"), Some(12.5));
        assert_eq!(go_duration_secs("soon"), None);
    }
}
