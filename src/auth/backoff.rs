//! Backing off together: a burst 429 (rate limited) or 529 (overloaded) answer that any
//! credential broker of an account sees lowers how many of the account's turns on this host
//! may send model requests, for a while, and raises it back one step at a time (additive
//! increase, multiplicative decrease), so that N boxes of one account do not each retry on
//! their own, N times over.
//!
//! The host's caw-box processes agree through two kinds of files under
//! `<data dir>/accounts/<account>/`:
//! - `flight-<k>`: held (`flock`) by each brokered turn of the account while its broker runs.
//!   A turn's *rank* is the count of flights held below its own: the oldest turns rank first.
//! - `backoff.json` ([`Backoff`]): the schedule, written under `backoff.lock`.
//!
//! The schedule, all times in Unix milliseconds:
//! - until `until`, no turn of the account sends a model request (its broker holds it);
//! - from then, the turns of rank below `cap(t) = cap + (t - until) / step` send: one more
//!   turn every `step`, until every turn sends and the back-off is over.
//!
//! A refusal seen at `t` (its wait: the answer's `retry-after`, else [`DEFAULT_WAIT`],
//! within 1–60 s):
//! - with no back-off running, or from a request sent under it (`t >= until`): the cap is
//!   halved (`max(1, cap(t) / 2)`; the first time, half the turns in flight), `until = t +
//!   wait`, `step = wait`;
//! - from a request sent before the back-off was known (`t < until`): only `until` is put
//!   off to `t + wait` if later. So N boxes refused at once halve the cap once, not N times.
//!
//! A broker also holds its own requests for the wait of each refusal it sees (`broker.js`),
//! at once: a turn never meets its refusal's wait twice. The turn's driver hands its broker
//! the time its rank opens (`pace <ms>`), as the schedule changes.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::dirs;
use crate::error::{Error, Result};

/// How long a refusal that names no wait holds the account's requests.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(5);
/// The shortest and longest wait a refusal holds the account's requests for.
const WAIT_RANGE: (u64, u64) = (1_000, 60_000);
/// A cap this high lets every turn send: the back-off is over.
const OPEN: u64 = 64;

/// An account's back-off schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backoff {
    /// When the refusal that set the cap came.
    pub refused_at: u64,
    /// No request before.
    pub until: u64,
    /// How many turns send at `until`.
    pub cap: u64,
    /// One more turn sends every `step` after `until`.
    pub step: u64,
}

impl Backoff {
    /// How many of the account's turns may send at `now`.
    pub fn cap_at(&self, now: u64) -> u64 {
        if now < self.until {
            return 0;
        }
        self.cap
            .saturating_add((now - self.until) / self.step.max(1))
            .min(OPEN)
    }

    /// Whether it still holds any turn at `now` (`flights`: the turns in flight).
    pub fn holds(&self, now: u64, flights: u64) -> bool {
        now < self.until || self.cap_at(now) < flights.min(OPEN)
    }

    /// When the turn of `rank` (0: the oldest) may send.
    pub fn opens_at(&self, rank: u64) -> u64 {
        let behind = (rank + 1).saturating_sub(self.cap);
        self.until.saturating_add(behind.saturating_mul(self.step))
    }

    /// The schedule after a refusal seen at `now` that asks to wait `wait` ms, `flights`
    /// turns in flight; `self`: the one running, if any.
    pub fn refused(running: Option<Backoff>, now: u64, wait: u64, flights: u64) -> Backoff {
        let wait = wait.clamp(WAIT_RANGE.0, WAIT_RANGE.1);
        match running {
            Some(b) if now < b.until => Backoff {
                until: b.until.max(now + wait),
                ..b
            },
            Some(b) if b.holds(now, flights) => Backoff {
                refused_at: now,
                until: now + wait,
                cap: (b.cap_at(now) / 2).max(1),
                step: wait,
            },
            _ => Backoff {
                refused_at: now,
                until: now + wait,
                cap: (flights / 2).max(1),
                step: wait,
            },
        }
    }
}

/// The wait a refusal's headers ask for, in ms: `retry-after-ms`, else `retry-after` (seconds,
/// or an HTTP date, as of `now`).
pub fn wait_of(headers: &std::collections::BTreeMap<String, String>, now: u64) -> Option<u64> {
    let get = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim())
    };
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        return Some(ms.max(0.0) as u64);
    }
    let v = get("retry-after")?;
    if let Ok(secs) = v.parse::<f64>() {
        return Some((secs.max(0.0) * 1000.0) as u64);
    }
    let at = httpdate::parse_http_date(v).ok()?;
    let at = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as u64;
    Some(at.saturating_sub(now))
}

/// What a broker's `caw-box-broker limits <json>` line says of a refusal: its wait (ms), if
/// the answer was a 429 or 529.
pub fn refusal_in(json: &str, now: u64) -> Option<u64> {
    #[derive(Deserialize)]
    struct Report {
        status: u16,
        #[serde(default)]
        headers: std::collections::BTreeMap<String, String>,
    }
    let r: Report = serde_json::from_str(json).ok()?;
    matches!(r.status, 429 | 529)
        .then(|| wait_of(&r.headers, now).unwrap_or(DEFAULT_WAIT.as_millis() as u64))
}

/// An account's back-off as it holds its turns now, for `auth status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Holding {
    /// No turn of the account sends before (Unix ms); in the past once the wait is over.
    pub until: u64,
    /// How many of its turns may send now (0 before `until`).
    pub may_send: u64,
    /// Its turns in flight on this host.
    pub in_flight: u64,
    /// One more may send every `step` ms.
    pub step: u64,
}

/// How `account`'s back-off holds its turns at `now`, if it does.
pub fn holding(account: &str, now: u64) -> Option<Holding> {
    let a = Account::here(account).ok()?;
    let b = a.schedule()?;
    let in_flight = a.in_flight();
    b.holds(now, in_flight).then_some(Holding {
        until: b.until,
        may_send: b.cap_at(now),
        in_flight,
        step: b.step,
    })
}

/// "backing off after a 429/529: none of its turns sends for 2s" or "… 2 of its 6 turns in
/// flight send, one more every 3s".
pub fn summary(h: &Holding, now: u64) -> String {
    let secs = |ms: u64| humantime::format_duration(Duration::from_secs(ms.div_ceil(1000)));
    if now < h.until {
        return format!(
            "backing off after a 429/529: none of its turns sends for {}",
            secs(h.until - now)
        );
    }
    format!(
        "backing off after a 429/529: {} of its {} turn(s) in flight send, one more every {}",
        h.may_send,
        h.in_flight,
        secs(h.step)
    )
}

/// One account's files, under `<data dir>/accounts/<account>/`.
#[derive(Debug)]
pub struct Account {
    dir: PathBuf,
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::environment(format!("could not {what} '{}': {e}", path.display()))
}

fn open_lock(path: &Path) -> Result<File> {
    if let Some(dir) = path.parent() {
        dirs::ensure_private_dir(dir)?;
    }
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| io_err("open", path, e))
}

/// Whether a process holds the `flock` of the file at `path` (trying it takes it a moment
/// when free; no file: not held). Admission's slots are counted so too.
pub fn is_held(path: &Path) -> bool {
    File::open(path).is_ok_and(|f| matches!(f.try_lock(), Err(TryLockError::WouldBlock)))
}

/// A turn in flight, holding `flight-<k>` until dropped.
#[derive(Debug)]
pub struct Flight {
    _file: File,
    index: u64,
}

impl Account {
    /// `account`'s, in this host's data directory.
    pub fn here(account: &str) -> Result<Account> {
        Ok(Account::at(
            dirs::data_dir()?.join("accounts").join(account),
        ))
    }

    /// The account whose files are in `dir`.
    pub fn at(dir: PathBuf) -> Account {
        Account { dir }
    }

    fn flight_path(&self, k: u64) -> PathBuf {
        self.dir.join(format!("flight-{k}"))
    }

    /// Whether flight `k` is held by a turn (trying it takes it a moment when free).
    fn held(&self, k: u64) -> bool {
        is_held(&self.flight_path(k))
    }

    /// Takes the lowest free flight: a turn of the account in flight until it is dropped.
    pub fn fly(&self) -> Result<Flight> {
        for index in 0.. {
            let path = self.flight_path(index);
            let file = open_lock(&path)?;
            match file.try_lock() {
                Ok(()) => return Ok(Flight { _file: file, index }),
                Err(TryLockError::WouldBlock) => continue,
                Err(TryLockError::Error(e)) => return Err(io_err("lock", &path, e)),
            }
        }
        unreachable!("a flight is free below u64::MAX")
    }

    /// The flights held, `flight-<k>` files being numbered from 0 without gaps past the
    /// highest ever taken.
    fn flights(&self) -> Vec<u64> {
        (0..)
            .take_while(|&k| self.flight_path(k).exists())
            .filter(|&k| self.held(k))
            .collect()
    }

    /// `flight`'s rank: the flights held below it.
    pub fn rank(&self, flight: &Flight) -> u64 {
        (0..flight.index).filter(|&k| self.held(k)).count() as u64
    }

    /// The turns of the account in flight.
    pub fn in_flight(&self) -> u64 {
        self.flights().len() as u64
    }

    fn schedule_path(&self) -> PathBuf {
        self.dir.join("backoff.json")
    }

    /// The schedule running, if one was ever set (it may be over: [`Backoff::holds`]).
    pub fn schedule(&self) -> Option<Backoff> {
        serde_json::from_slice(&std::fs::read(self.schedule_path()).ok()?).ok()
    }

    /// Records a refusal seen at `now` asking to wait `wait` ms: the new schedule.
    pub fn refused(&self, now: u64, wait: u64) -> Result<Backoff> {
        let lock_path = self.dir.join("backoff.lock");
        let lock = open_lock(&lock_path)?;
        lock.lock().map_err(|e| io_err("lock", &lock_path, e))?;
        let next = Backoff::refused(self.schedule(), now, wait, self.in_flight().max(1));
        dirs::write_private_unsynced(
            &self.schedule_path(),
            &serde_json::to_vec_pretty(&next).expect("a schedule serializes"),
        )?;
        Ok(next)
    }

    /// When `flight`'s turn may send, if the account's schedule holds it at `now`.
    pub fn opens_at(&self, flight: &Flight, now: u64) -> Option<u64> {
        let b = self.schedule()?;
        // Open to every rank up to its own index (a rank is at most the index): no need to
        // count.
        if now >= b.until && b.cap_at(now) > flight.index {
            return None;
        }
        let at = b.opens_at(self.rank(flight));
        (at > now).then_some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000;

    /// Six turns refused at once halve the cap once; the next refusal, of a request sent
    /// under the back-off, halves it again; then one more turn sends every step.
    #[test]
    fn refusals_halve_the_cap_once_per_wait_and_it_grows_back_a_turn_a_step() {
        let t0 = 1_000_000;
        let first = Backoff::refused(None, t0, 2 * S, 6);
        assert_eq!(
            first,
            Backoff {
                refused_at: t0,
                until: t0 + 2 * S,
                cap: 3,
                step: 2 * S
            }
        );
        // The other five, sent before the first refusal was known: no more halving.
        let mut b = first;
        for i in 1..6 {
            b = Backoff::refused(Some(b), t0 + i * 100, 2 * S, 6);
        }
        assert_eq!((b.cap, b.until), (3, t0 + 100 * 5 + 2 * S));
        // Ranks 0–2 open at `until`, rank 3 a step later, rank 5 three steps later.
        assert_eq!(b.opens_at(0), b.until);
        assert_eq!(b.opens_at(2), b.until);
        assert_eq!(b.opens_at(3), b.until + 2 * S);
        assert_eq!(b.opens_at(5), b.until + 6 * S);
        assert_eq!(b.cap_at(b.until - 1), 0);
        assert_eq!(b.cap_at(b.until + 2 * S), 4);
        // A probe refused at `until`: the cap halves again, down to 1 at least.
        let again = Backoff::refused(Some(b), b.until + 10, 3 * S, 6);
        assert_eq!(
            (again.cap, again.until, again.step),
            (1, b.until + 10 + 3 * S, 3 * S)
        );
        let last = Backoff::refused(Some(again), again.until, 3 * S, 6);
        assert_eq!(last.cap, 1);
        // Grown back: it holds no turn, and a refusal then starts afresh from the flights.
        let over = last.until + 6 * 3 * S;
        assert!(!last.holds(over, 6));
        assert_eq!(Backoff::refused(Some(last), over, 0, 4).cap, 2);
        // Waits are kept within 1–60 s.
        assert_eq!(Backoff::refused(None, 0, 10, 1).until, S);
        assert_eq!(Backoff::refused(None, 0, 3_600 * S, 1).until, 60 * S);
    }

    #[test]
    fn a_refusals_wait_comes_from_retry_after_in_ms_seconds_or_a_date() {
        let h = |k: &str, v: &str| {
            std::iter::once((k.to_string(), v.to_string()))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        assert_eq!(wait_of(&h("retry-after", "2"), 0), Some(2_000));
        assert_eq!(wait_of(&h("retry-after", "0.5"), 0), Some(500));
        assert_eq!(wait_of(&h("retry-after-ms", "750"), 0), Some(750));
        let now = 1_700_000_000_000;
        assert_eq!(
            wait_of(&h("retry-after", "Tue, 14 Nov 2023 22:13:30 GMT"), now),
            Some(10_000)
        );
        assert_eq!(wait_of(&h("x-ratelimit-remaining-requests", "0"), 0), None);
        // A broker's report: a 429 or 529 is a refusal, its wait named or 5 s.
        let line = r#"{"status":429,"at":1,"headers":{"retry-after":"3"}}"#;
        assert_eq!(refusal_in(line, 0), Some(3_000));
        assert_eq!(
            refusal_in(r#"{"status":529,"at":1,"headers":{}}"#, 0),
            Some(5_000)
        );
        assert_eq!(refusal_in(r#"{"status":200,"at":1,"headers":{}}"#, 0), None);
    }

    #[test]
    fn a_holding_back_off_says_what_it_holds() {
        let h = Holding {
            until: 10_000,
            may_send: 0,
            in_flight: 6,
            step: 3_000,
        };
        assert_eq!(
            summary(&h, 8_500),
            "backing off after a 429/529: none of its turns sends for 2s"
        );
        let h = Holding { may_send: 2, ..h };
        assert_eq!(
            summary(&h, 11_000),
            "backing off after a 429/529: 2 of its 6 turn(s) in flight send, one more every 3s"
        );
    }

    /// Flights are held until dropped; a turn's rank counts those held below its own.
    #[test]
    fn a_turns_rank_is_the_flights_held_below_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let a = Account::at(dir.path().join("acct"));
        let (f0, f1, f2) = (a.fly().unwrap(), a.fly().unwrap(), a.fly().unwrap());
        assert_eq!((a.rank(&f0), a.rank(&f1), a.rank(&f2)), (0, 1, 2));
        assert_eq!(a.in_flight(), 3);
        drop(f0);
        assert_eq!((a.rank(&f1), a.rank(&f2), a.in_flight()), (0, 1, 2));
        // The freed flight goes to the next turn, which ranks by its place.
        let f3 = a.fly().unwrap();
        assert_eq!((a.rank(&f3), a.rank(&f2)), (0, 2));
        // A refusal with three in flight: ranks 0 and 1 wait for `until`, rank 2 a step more.
        let b = a.refused(10_000, 2_000).unwrap();
        assert_eq!(b.cap, 1);
        assert_eq!(a.opens_at(&f3, 10_000), Some(12_000));
        assert_eq!(a.opens_at(&f1, 10_000), Some(14_000));
        assert_eq!(a.opens_at(&f2, 10_000), Some(16_000));
        assert_eq!(a.opens_at(&f3, 12_000), None);
    }
}
