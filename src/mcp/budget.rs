//! `caw-box mcp --max-cost-usd X`: what this server's sessions may spend together. Each
//! turn the server starts gets a session limit (`--max-cost`) that the turns' own stops
//! hold: the session's spend so far plus its share of what is left. What is left counts
//! a session with a turn running or queued at the limit it was given (it may spend up to
//! it), and every other session at what it spent. The ledger lives in the server process:
//! a new server counts from zero (its sessions' own limits stay with them). A grant reads
//! the spend of the sessions whose turns may still run, not of every session the server ever
//! started: one whose turn is seen ended is settled at what it spent then (a later turn of it
//! is granted anew).

use std::collections::HashMap;

use uuid::Uuid;

use crate::client::Client;
use crate::error::{Error, ErrorKind, Result};
use crate::session::budget::usd;

#[derive(Debug)]
pub struct ServerBudget {
    max: f64,
    ledger: tokio::sync::Mutex<Ledger>,
}

#[derive(Debug, Default)]
struct Ledger {
    /// Each session with a turn of this server that may still run: the limit that turn was
    /// given, and its spend when last read.
    active: HashMap<Uuid, (f64, f64)>,
    /// Each session whose turn was seen ended: what it had spent then.
    settled: HashMap<Uuid, f64>,
}

/// A turn's share of the server's budget, held while it starts: [`Grant::limit`] is its
/// session's `--max-cost`; [`Grant::keep`] notes the session once its turn started.
pub struct Grant<'a> {
    ledger: tokio::sync::MutexGuard<'a, Ledger>,
    spent: f64,
    limit: f64,
}

impl Grant<'_> {
    pub fn limit(&self) -> f64 {
        self.limit
    }

    pub fn keep(&mut self, session: Uuid) {
        self.ledger.settled.remove(&session);
        self.ledger.active.insert(session, (self.limit, self.spent));
    }
}

impl ServerBudget {
    pub fn new(max: f64) -> Result<Self> {
        crate::settings::check_max_cost(max, "--max-cost-usd")?;
        Ok(ServerBudget {
            max,
            ledger: Default::default(),
        })
    }

    /// The limit for the next turn of each of `n` sessions that have spent `spent` so far
    /// (`own`: a limit asked for, which the share may only lower); refused when nothing is
    /// left. Starts of turns wait for each other while the grant is held.
    pub async fn grant(
        &self,
        client: &Client,
        busy: &(dyn Fn(Uuid) -> bool + Sync),
        spent: f64,
        n: u32,
        own: Option<f64>,
    ) -> Result<Grant<'_>> {
        let mut ledger = self.ledger.lock().await;
        let running = client.running().await?;
        let mut committed: f64 = ledger.settled.values().sum();
        let mut ended = Vec::new();
        for (id, (granted, seen)) in ledger.active.iter_mut() {
            if let Some(now) = session_spent(client, *id).await {
                *seen = now;
            }
            if running.contains_key(id) || busy(*id) {
                committed += seen.max(*granted);
            } else {
                committed += *seen;
                ended.push((*id, *seen));
            }
        }
        for (id, seen) in ended {
            ledger.active.remove(&id);
            ledger.settled.insert(id, seen);
        }
        let sessions = ledger.active.len() + ledger.settled.len();
        let left = self.max - committed;
        if left <= 0.0 {
            return Err(Error::new(
                ErrorKind::Budget,
                format!(
                    "this server's --max-cost-usd {} is spent: its {} sessions spent or hold {}",
                    usd(self.max),
                    sessions,
                    usd(committed)
                ),
            )
            .with_hint("start a server with a higher --max-cost-usd"));
        }
        let share = spent + left / f64::from(n.max(1));
        Ok(Grant {
            ledger,
            spent,
            limit: own.map_or(share, |own| own.min(share)),
        })
    }
}

/// What session `id` has spent; `None` when it cannot be read (removed since).
async fn session_spent(client: &Client, id: Uuid) -> Option<f64> {
    match crate::session::target::resolve(client.backend(), &id.to_string()).await {
        Ok(record) => Some(record.total_cost_usd().unwrap_or(0.0)),
        Err(e) => {
            tracing::debug!("the spend of session {id} is not known: {e}");
            None
        }
    }
}
