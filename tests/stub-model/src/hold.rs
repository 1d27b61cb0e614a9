//! `HOLD:<name>`: a model request that gets no answer until the test releases `<name>`
//! (`POST /_stub/release/<name>`), so a test keeps a turn running exactly as long as its own
//! work takes, instead of a fixed `SLEEP:`. A release is for good: one given before the
//! request arrives counts too (no race), and every later request holding on that name passes
//! at once. [`Holds::status`] tells which requests are held right now, so a test can wait
//! until the CLI is mid-turn.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::watch;

/// An upper bound for a hold, as for `SLEEP:`: a forgotten release cannot hang a test run.
pub const MAX_HOLD: Duration = Duration::from_secs(600);

/// Every hold of one server: the names released and the requests waiting.
#[derive(Debug)]
pub struct Holds {
    inner: Mutex<Inner>,
    /// Bumped on every change, so waiters look again.
    changed: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct Inner {
    released: BTreeSet<String>,
    /// Requests waiting per name (none: no entry).
    waiting: BTreeMap<String, usize>,
}

/// How a hold ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Released,
    /// [`MAX_HOLD`] (or the cap given) passed first.
    TimedOut,
}

impl Default for Holds {
    fn default() -> Self {
        Holds {
            inner: Mutex::default(),
            changed: watch::Sender::new(0),
        }
    }
}

/// Counts a request as waiting on its name while it lives.
struct Waiting<'a> {
    holds: &'a Holds,
    name: &'a str,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.holds.update(|inner| {
            if let Some(n) = inner.waiting.get_mut(self.name) {
                *n -= 1;
                if *n == 0 {
                    inner.waiting.remove(self.name);
                }
            }
        });
    }
}

impl Holds {
    fn update<T>(&self, change: impl FnOnce(&mut Inner) -> T) -> T {
        let out = change(&mut self.inner.lock().unwrap_or_else(|e| e.into_inner()));
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
        out
    }

    fn read<T>(&self, look: impl FnOnce(&Inner) -> T) -> T {
        look(&self.inner.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Waits until `name` is released or `cap` passes. The request counts as waiting
    /// meanwhile (also when the future is dropped early: its client went away).
    pub async fn hold(&self, name: &str, cap: Duration) -> Ended {
        let mut changed = self.changed.subscribe();
        // A released name holds nothing: its requests never count as waiting.
        let counted = self.update(|inner| {
            let held = !inner.released.contains(name);
            if held {
                *inner.waiting.entry(name.to_string()).or_default() += 1;
            }
            held
        });
        if !counted {
            return Ended::Released;
        }
        let _waiting = Waiting { holds: self, name };
        let deadline = tokio::time::Instant::now() + cap;
        loop {
            if self.read(|inner| inner.released.contains(name)) {
                return Ended::Released;
            }
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return Ended::TimedOut,
            }
        }
    }

    /// Releases `name` for good; how many requests were waiting on it. They count as
    /// waiting no more from now, also before each one's task wakes to answer, so a test that
    /// releases what it sees held never sees a released request again.
    pub fn release(&self, name: &str) -> usize {
        self.update(|inner| {
            inner.released.insert(name.to_string());
            inner.waiting.remove(name).unwrap_or(0)
        })
    }

    /// How many requests wait on `name` now.
    pub fn waiting(&self, name: &str) -> usize {
        self.read(|inner| inner.waiting.get(name).copied().unwrap_or(0))
    }

    /// Waits up to `limit` until at least `at_least` requests wait on `name`; how many do.
    pub async fn until_waiting(&self, name: &str, at_least: usize, limit: Duration) -> usize {
        let mut changed = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let n = self.waiting(name);
            if n >= at_least {
                return n;
            }
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return self.waiting(name),
            }
        }
    }

    /// `{"waiting": {"<name>": <requests>, ...}, "released": ["<name>", ...]}`.
    pub fn status(&self) -> Value {
        self.read(|inner| json!({"waiting": inner.waiting, "released": inner.released}))
    }

    /// One name's state: `{"name", "waiting", "released"}`.
    pub fn status_of(&self, name: &str) -> Value {
        self.read(|inner| {
            json!({
                "name": name,
                "waiting": inner.waiting.get(name).copied().unwrap_or(0),
                "released": inner.released.contains(name),
            })
        })
    }
}

/// Whether `name` can be a hold's name (what `HOLD:` takes: `[A-Za-z0-9_-]+`).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn a_hold_waits_for_its_release_and_counts_as_waiting_meanwhile() {
        let holds = Arc::new(Holds::default());
        let held = tokio::spawn({
            let holds = Arc::clone(&holds);
            async move { holds.hold("a", MAX_HOLD).await }
        });
        assert_eq!(holds.until_waiting("a", 1, MAX_HOLD).await, 1);
        assert_eq!(holds.status()["waiting"], json!({"a": 1}));
        // Another name's release does not end it.
        assert_eq!(holds.release("b"), 0);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!held.is_finished());
        assert_eq!(holds.release("a"), 1);
        assert_eq!(held.await.unwrap(), Ended::Released);
        assert_eq!(holds.waiting("a"), 0);
        assert_eq!(
            holds.status(),
            json!({"waiting": {}, "released": ["a", "b"]})
        );
    }

    #[tokio::test]
    async fn a_release_before_the_request_counts_and_lasts() {
        let holds = Holds::default();
        holds.release("early");
        for _ in 0..2 {
            let ended = tokio::time::timeout(MAX_HOLD, holds.hold("early", MAX_HOLD)).await;
            assert_eq!(ended, Ok(Ended::Released));
        }
        assert_eq!(
            holds.status_of("early"),
            json!({"name": "early", "waiting": 0, "released": true})
        );
    }

    #[tokio::test]
    async fn a_hold_ends_at_its_cap_and_a_dropped_one_stops_counting() {
        let holds = Holds::default();
        let ended = holds.hold("x", Duration::from_millis(30)).await;
        assert_eq!(ended, Ended::TimedOut);
        assert_eq!(holds.waiting("x"), 0);
        // A request whose client went away: its future is dropped.
        let dropped = tokio::time::timeout(Duration::from_millis(30), holds.hold("y", MAX_HOLD));
        assert!(dropped.await.is_err());
        assert_eq!(holds.status()["waiting"], json!({}));
    }

    #[tokio::test]
    async fn waiting_for_several_holds_returns_once_they_are_all_there() {
        let holds = Arc::new(Holds::default());
        assert_eq!(
            holds.until_waiting("n", 1, Duration::from_millis(20)).await,
            0
        );
        let mut tasks = Vec::new();
        for _ in 0..3 {
            let holds = Arc::clone(&holds);
            tasks.push(tokio::spawn(async move { holds.hold("n", MAX_HOLD).await }));
        }
        assert_eq!(holds.until_waiting("n", 3, MAX_HOLD).await, 3);
        assert_eq!(holds.release("n"), 3);
        for t in tasks {
            assert_eq!(t.await.unwrap(), Ended::Released);
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_released_request_is_not_held_even_before_it_wakes() {
        let holds = Arc::new(Holds::default());
        let held = tokio::spawn({
            let holds = Arc::clone(&holds);
            async move { holds.hold("r", MAX_HOLD).await }
        });
        assert_eq!(holds.until_waiting("r", 1, MAX_HOLD).await, 1);
        // One thread: the held task cannot run between the release and the look.
        assert_eq!(holds.release("r"), 1);
        assert_eq!(holds.status()["waiting"], json!({}));
        assert_eq!(held.await.unwrap(), Ended::Released);
        assert_eq!(holds.status()["waiting"], json!({}));
    }

    #[test]
    fn names_are_words() {
        assert!(valid_name("scan-claude_code2"));
        assert!(!valid_name(""));
        assert!(!valid_name("a/b"));
        assert!(!valid_name("a b"));
    }
}
