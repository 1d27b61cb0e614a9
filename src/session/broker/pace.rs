//! A brokered turn's part in its account's back-off ([`crate::auth::backoff`]): it holds a
//! flight of the account while its broker runs, records the refusals its broker reports,
//! and hands the broker the time its rank may send again (`pace <ms> [<lease>]`, a delay:
//! the broker's clock need not be the host's).

use std::time::Duration;

use crate::auth::backoff::{self, Account, Flight};
use crate::clock::now_ms;

/// How often a turn looks at its account's schedule.
pub(super) const PACE_EVERY: Duration = Duration::from_millis(250);

/// A turn in flight on its account, and what it told its broker last.
pub(super) struct Pacer {
    account: Account,
    flight: Flight,
    /// The shared broker's lease of this turn (its pace is the lease's); `None`: the
    /// broker is the turn's own.
    lease: Option<String>,
    /// When the broker was told the turn may send (`None`: now).
    told: Option<u64>,
}

impl Pacer {
    /// A turn of `account` in flight from now (none where the account is unknown, or its
    /// directory cannot be written: the turn then only backs off on its own refusals).
    pub(super) fn fly(account: Option<&str>) -> Option<Pacer> {
        let account = Account::here(account?).ok()?;
        let flight = account
            .fly()
            .map_err(|e| tracing::debug!("not pacing with the account: {e}"))
            .ok()?;
        Some(Pacer {
            account,
            flight,
            lease: None,
            told: None,
        })
    }

    /// Its pace is `lease`'s in a shared broker.
    pub(super) fn for_lease(&mut self, lease: &str) {
        self.lease = Some(lease.to_string());
    }

    /// Records a refusal the broker reported (`limits` `json`).
    pub(super) fn seen(&self, json: &str) {
        let now = now_ms();
        if let Some(wait) = backoff::refusal_in(json, now) {
            match self.account.refused(now, wait) {
                Ok(b) => tracing::info!(
                    "the account was refused (429/529): its turns wait {} ms, then {} of them send, one more every {} ms",
                    b.until.saturating_sub(now),
                    b.cap,
                    b.step
                ),
                Err(e) => tracing::debug!("could not record the refusal: {e}"),
            }
        }
    }

    /// The line for the broker, where the time its turn may send changed.
    pub(super) fn tick(&mut self) -> Option<String> {
        let now = now_ms();
        let opens = self.account.opens_at(&self.flight, now);
        let changed = match (self.told, opens) {
            (None, None) => false,
            (Some(a), Some(b)) => a.abs_diff(b) > 50,
            _ => true,
        };
        if !changed {
            return None;
        }
        self.told = opens;
        let delay = opens.map_or(0, |at| at.saturating_sub(now));
        Some(match &self.lease {
            Some(id) => format!("pace {delay} {id}\n"),
            None => format!("pace {delay}\n"),
        })
    }
}
