//! A burst of refusals on demand, as an account meets when many clients send at once (a
//! rate limit of the moment, not a usage limit): `POST /_stub/burst?seconds=W&retry_after=R`
//! refuses every model request for W seconds from the first one that comes after it, with
//! a 429 in the vendor's shape (`status=529`: an overload) and `retry-after: R`. `GET
//! /_stub/burst` says how many it refused: a test counts what its clients sent while
//! refused, the clients' start-up not counted in the window.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The burst running or last run.
#[derive(Debug, Default)]
pub struct Burst {
    current: Mutex<Option<Current>>,
}

#[derive(Debug, Clone, Copy)]
struct Current {
    /// Set by the first request refused.
    ends: Option<Instant>,
    seconds: f64,
    retry_after: u64,
    status: u16,
    refused: usize,
}

impl Burst {
    fn with<T>(&self, f: impl FnOnce(&mut Option<Current>) -> T) -> T {
        f(&mut self.current.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Starts a burst as `query` says (`seconds`, `retry_after` (default 1), `status`
    /// (429 or 529, default 429)); its state, or what is wrong with the query.
    pub fn start(&self, query: Option<&str>) -> Result<Value, String> {
        let param = |key: &str| {
            query?
                .split('&')
                .filter_map(|pair| pair.split_once('='))
                .find_map(|(k, v)| (k == key).then_some(v))
        };
        let seconds = param("seconds")
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0 && *s <= 600.0)
            .ok_or("seconds: a number of seconds up to 600")?;
        let retry_after = match param("retry_after") {
            None => 1,
            Some(v) => v.parse().map_err(|_| "retry_after: whole seconds")?,
        };
        let status = match param("status") {
            None | Some("429") => 429,
            Some("529") => 529,
            Some(_) => return Err("status: 429 or 529".into()),
        };
        self.with(|c| {
            *c = Some(Current {
                ends: None,
                seconds,
                retry_after,
                status,
                refused: 0,
            })
        });
        Ok(self.status())
    }

    /// `{"active", "refused", "seconds", "retry_after", "status"}` of the burst running or
    /// last run (`{"active": false, "refused": 0}` before any).
    pub fn status(&self) -> Value {
        self.with(|c| match c {
            Some(c) => json!({
                "active": c.ends.is_none_or(|e| Instant::now() < e),
                "refused": c.refused,
                "seconds": c.seconds,
                "retry_after": c.retry_after,
                "status": c.status,
            }),
            None => json!({"active": false, "refused": 0}),
        })
    }

    /// A model request arriving now: refused (and counted) while a burst runs, with the
    /// status and `retry-after` to answer.
    pub fn refuse(&self) -> Option<(u16, u64)> {
        self.with(|c| {
            let now = Instant::now();
            let c = c.as_mut().filter(|c| c.ends.is_none_or(|e| now < e))?;
            c.ends
                .get_or_insert(now + Duration::from_secs_f64(c.seconds));
            c.refused += 1;
            Some((c.status, c.retry_after))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_refuses_and_counts_until_it_ends() {
        let b = Burst::default();
        assert_eq!(b.refuse(), None);
        assert_eq!(b.status()["refused"], 0);
        assert!(b
            .start(Some("seconds=0.2&retry_after=3&status=529"))
            .is_ok());
        // Armed until the first request: the window starts there.
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(b.status()["active"], true);
        assert_eq!(b.refuse(), Some((529, 3)));
        assert_eq!(b.refuse(), Some((529, 3)));
        assert_eq!(b.status()["active"], true);
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(b.refuse(), None);
        assert_eq!(
            (b.status()["active"].clone(), b.status()["refused"].clone()),
            (json!(false), json!(2))
        );
        assert!(b.start(Some("retry_after=3")).is_err());
        assert!(b.start(Some("seconds=1&status=500")).is_err());
        assert_eq!(b.start(Some("seconds=1")).unwrap()["retry_after"], 1);
    }
}
