//! `STUB_ACCOUNT_REQUESTS`: the account behind the stub allows that many model requests per
//! window (`STUB_ACCOUNT_WINDOW` seconds, default 60; a window starts with its first request),
//! and every model response says what is left in the vendor's own rate-limit headers, so a
//! client that reads them (a credential broker choosing an account) can be tested. The stub
//! only reports (it still answers a request past the limit; `FAIL:429`, `LIMIT:` and `QUOTA:`
//! refuse one) unless `STUB_ACCOUNT_ENFORCE=1`: then a request past the limit gets the
//! vendor's usage-limit answer (as `QUOTA:`'s), resetting at the window's end.

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The limit of `STUB_ACCOUNT_REQUESTS` and `STUB_ACCOUNT_WINDOW`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AccountLimit {
    pub requests: u64,
    pub window: Duration,
    /// `STUB_ACCOUNT_ENFORCE=1`: a request past the limit is refused as the vendor's usage
    /// limit, not answered.
    pub enforce: bool,
}

impl AccountLimit {
    /// The limit the environment sets, `None` when `STUB_ACCOUNT_REQUESTS` is unset or empty.
    pub fn from_env() -> Result<Option<Self>, String> {
        let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        let Some(requests) = var("STUB_ACCOUNT_REQUESTS") else {
            return Ok(None);
        };
        let requests = requests
            .trim()
            .parse()
            .map_err(|_| format!("STUB_ACCOUNT_REQUESTS is not a count: {requests:?}"))?;
        let window = match var("STUB_ACCOUNT_WINDOW") {
            None => Duration::from_secs(60),
            Some(secs) => secs
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s > 0.0)
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .ok_or_else(|| {
                    format!("STUB_ACCOUNT_WINDOW is not a number of seconds: {secs:?}")
                })?,
        };
        let enforce = match var("STUB_ACCOUNT_ENFORCE").as_deref().map(str::trim) {
            None | Some("0") => false,
            Some("1") => true,
            Some(other) => return Err(format!("STUB_ACCOUNT_ENFORCE is 0 or 1, not {other:?}")),
        };
        Ok(Some(AccountLimit {
            requests,
            window,
            enforce,
        }))
    }
}

/// The account's model requests in the current window.
#[derive(Debug)]
pub struct Account {
    limit: AccountLimit,
    window: Mutex<Option<Window>>,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    ends: Instant,
    ends_at: SystemTime,
    used: u64,
}

/// What one response tells of the account: the limit, the requests used in the window
/// (the one answered included) and when the window ends.
#[derive(Debug, Clone, Copy)]
pub struct Standing {
    pub limit: u64,
    pub used: u64,
    enforce: bool,
    window: Duration,
    ends: Instant,
    ends_at: SystemTime,
}

impl Account {
    pub fn new(limit: AccountLimit) -> Self {
        Account {
            limit,
            window: Mutex::new(None),
        }
    }

    /// Counts one model request (a new window when none is running); where that leaves the
    /// account.
    pub fn count(&self) -> Standing {
        let now = Instant::now();
        let mut window = self.window.lock().unwrap_or_else(|e| e.into_inner());
        let current = match *window {
            Some(w) if now < w.ends => window.insert(w),
            _ => window.insert(Window {
                ends: now + self.limit.window,
                ends_at: SystemTime::now() + self.limit.window,
                used: 0,
            }),
        };
        current.used += 1;
        Standing {
            limit: self.limit.requests,
            used: current.used,
            enforce: self.limit.enforce,
            window: self.limit.window,
            ends: current.ends,
            ends_at: current.ends_at,
        }
    }
}

impl Standing {
    /// With `STUB_ACCOUNT_ENFORCE`, for a request past the limit: how long until the window
    /// ends (at least 1 s).
    pub fn refused_for(&self, now: Instant) -> Option<Duration> {
        (self.enforce && self.used > self.limit).then(|| {
            self.ends
                .saturating_duration_since(now)
                .max(Duration::from_secs(1))
        })
    }

    pub fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.used)
    }

    /// The share of the limit used, 0..1 (1 for a limit of 0).
    fn utilization(&self) -> f64 {
        if self.limit == 0 {
            return 1.0;
        }
        (self.used as f64 / self.limit as f64).min(1.0)
    }

    /// The window's end as Unix seconds (rounded up).
    fn reset_unix(&self) -> u64 {
        ceil_secs(self.ends_at.duration_since(UNIX_EPOCH).unwrap_or_default())
    }

    /// The headers a response on `wire` (`anthropic`, `openai`, `google`) carries, their
    /// times as of `now`. Google sends none.
    pub fn headers(&self, wire: &str, now: Instant) -> Vec<(&'static str, String)> {
        let left = self.ends.saturating_duration_since(now);
        let remaining = self.remaining();
        match wire {
            "anthropic" => {
                let reset = self.reset_unix();
                let status = if remaining == 0 {
                    "rejected"
                } else {
                    "allowed"
                };
                vec![
                    ("anthropic-ratelimit-requests-limit", self.limit.to_string()),
                    (
                        "anthropic-ratelimit-requests-remaining",
                        remaining.to_string(),
                    ),
                    ("anthropic-ratelimit-requests-reset", rfc3339(reset)),
                    ("anthropic-ratelimit-unified-status", status.into()),
                    (
                        "anthropic-ratelimit-unified-5h-utilization",
                        decimal(self.utilization()),
                    ),
                    ("anthropic-ratelimit-unified-5h-reset", reset.to_string()),
                    ("anthropic-ratelimit-unified-reset", reset.to_string()),
                ]
            }
            "openai" => {
                let minutes = (self.window.as_secs_f64() / 60.0).ceil() as u64;
                vec![
                    ("x-ratelimit-limit-requests", self.limit.to_string()),
                    ("x-ratelimit-remaining-requests", remaining.to_string()),
                    ("x-ratelimit-reset-requests", go_duration(left)),
                    (
                        "x-codex-primary-used-percent",
                        decimal(self.utilization() * 100.0),
                    ),
                    ("x-codex-primary-window-minutes", minutes.to_string()),
                    (
                        "x-codex-primary-reset-after-seconds",
                        ceil_secs(left).to_string(),
                    ),
                ]
            }
            _ => Vec::new(),
        }
    }
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// A number with up to 4 decimals and at least one: `1.0`, `0.3333`, `66.6667`.
pub fn decimal(x: f64) -> String {
    let text = format!("{x:.4}");
    let trimmed = text.trim_end_matches('0');
    if trimmed.ends_with('.') {
        format!("{trimmed}0")
    } else {
        trimmed.to_string()
    }
}

/// A duration as OpenAI's rate-limit headers write it (Go's format, to the millisecond, rounded
/// up): `6m0s`, `12.5s`, `1h0m0s`, `20ms`, `0s`.
pub fn go_duration(d: Duration) -> String {
    let millis = d.as_nanos().div_ceil(1_000_000) as u64;
    if millis < 1000 {
        return if millis == 0 {
            "0s".into()
        } else {
            format!("{millis}ms")
        };
    }
    let (secs, frac) = (millis / 1000, millis % 1000);
    let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if h > 0 || m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if frac == 0 {
        out.push_str(&format!("{s}s"));
    } else {
        let frac = format!("{frac:03}");
        out.push_str(&format!("{s}.{}s", frac.trim_end_matches('0')));
    }
    out
}

/// Unix seconds as an RFC 3339 UTC time: `2023-11-14T22:13:20Z`.
pub fn rfc3339(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let secs = unix_secs % 86_400;
    // Days to a civil date (Howard Hinnant's algorithm), from 1970-01-01.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header<'a>(headers: &'a [(&str, String)], name: &str) -> Option<&'a str> {
        headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn counts_down_within_a_window_and_starts_a_new_one_after_it() {
        let account = Account::new(AccountLimit {
            requests: 2,
            window: Duration::from_millis(100),
            enforce: false,
        });
        let first = account.count();
        assert_eq!((first.used, first.remaining()), (1, 1));
        let second = account.count();
        assert_eq!((second.used, second.remaining()), (2, 0));
        assert_eq!(
            second.ends, first.ends,
            "the window starts at its first request"
        );
        assert_eq!(account.count().remaining(), 0, "never below 0");
        std::thread::sleep(Duration::from_millis(120));
        let fresh = account.count();
        assert_eq!((fresh.used, fresh.remaining()), (1, 1));
        assert!(fresh.ends > first.ends);
    }

    #[test]
    fn each_wire_gets_its_vendors_headers() {
        let account = Account::new(AccountLimit {
            requests: 3,
            window: Duration::from_secs(360),
            enforce: false,
        });
        let standing = account.count();
        let now = Instant::now();
        let anthropic = standing.headers("anthropic", now);
        assert_eq!(
            header(&anthropic, "anthropic-ratelimit-requests-limit"),
            Some("3")
        );
        assert_eq!(
            header(&anthropic, "anthropic-ratelimit-requests-remaining"),
            Some("2")
        );
        assert_eq!(
            header(&anthropic, "anthropic-ratelimit-unified-status"),
            Some("allowed")
        );
        assert_eq!(
            header(&anthropic, "anthropic-ratelimit-unified-5h-utilization"),
            Some("0.3333")
        );
        let reset = standing.reset_unix();
        assert_eq!(
            header(&anthropic, "anthropic-ratelimit-requests-reset"),
            Some(rfc3339(reset).as_str())
        );
        assert_eq!(
            header(&anthropic, "anthropic-ratelimit-unified-reset"),
            Some(reset.to_string().as_str())
        );
        let openai = standing.headers("openai", now);
        assert_eq!(header(&openai, "x-ratelimit-limit-requests"), Some("3"));
        assert_eq!(header(&openai, "x-ratelimit-remaining-requests"), Some("2"));
        assert_eq!(
            header(&openai, "x-codex-primary-used-percent"),
            Some("33.3333")
        );
        assert_eq!(header(&openai, "x-codex-primary-window-minutes"), Some("6"));
        assert_eq!(
            header(&openai, "x-ratelimit-reset-requests"),
            Some(go_duration(standing.ends - now).as_str())
        );
        assert!(standing.headers("google", now).is_empty());
        // At the window's end: nothing left to wait.
        let late = standing.headers("openai", standing.ends + Duration::from_secs(1));
        assert_eq!(header(&late, "x-ratelimit-reset-requests"), Some("0s"));
        assert_eq!(
            header(&late, "x-codex-primary-reset-after-seconds"),
            Some("0")
        );
    }

    #[test]
    fn formats_as_the_vendors_do() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(4_102_444_800), "2100-01-01T00:00:00Z");
        assert_eq!(go_duration(Duration::from_secs(360)), "6m0s");
        assert_eq!(go_duration(Duration::from_millis(12_500)), "12.5s");
        assert_eq!(go_duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(go_duration(Duration::from_millis(90_250)), "1m30.25s");
        assert_eq!(go_duration(Duration::from_micros(19_001)), "20ms");
        assert_eq!(go_duration(Duration::ZERO), "0s");
        assert_eq!(decimal(1.0), "1.0");
        assert_eq!(decimal(0.0), "0.0");
        assert_eq!(decimal(2.0 / 3.0), "0.6667");
        assert_eq!(decimal(50.0), "50.0");
    }

    #[test]
    fn a_limit_of_zero_is_used_up() {
        let account = Account::new(AccountLimit {
            requests: 0,
            window: Duration::from_secs(60),
            enforce: false,
        });
        let standing = account.count();
        assert_eq!(standing.remaining(), 0);
        assert_eq!(standing.utilization(), 1.0);
    }
}
