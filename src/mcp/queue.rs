//! `caw-box mcp --max-parallel N`: turns this server starts beyond N running at once wait,
//! in the order they were asked for, and start as running ones end.
//!
//! The one thing the server holds itself: a queued turn has its session (made by `start`,
//! or an existing one for `reply`) but no container yet; it lives in this process until it
//! starts, so a server that ends takes its queued turns with it (the sessions stay, with
//! the turns they ran). Running turns are counted from the backend, not from memory; what it
//! keeps costs O(turns running or queued), not O(sessions it ever started): a session drops
//! out of its count once its turn is seen ended. One task on the server's runtime starts the
//! queued turns, with one connection to the backend for as long as it has work.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use uuid::Uuid;

use crate::client::{Client, Session};
use crate::error::{Error, Result};
use crate::session::record::SessionSettings;
use crate::session::runner::TurnOptions;

/// How often queued turns look for a free slot.
const POLL: Duration = Duration::from_millis(300);

#[derive(Debug)]
struct Queued {
    id: Uuid,
    /// The settings the turn runs with (the session's own and the call's overrides), and
    /// whether it is the session's first turn (a session it could not start is discarded).
    settings: SessionSettings,
    options: TurnOptions,
    first: bool,
}

#[derive(Debug, Default)]
struct State {
    waiting: VecDeque<Queued>,
    /// Turns being started (no container seen running yet): they take a slot.
    starting: HashSet<Uuid>,
    /// The sessions whose turns this server started and that may still run: the ones that
    /// count against N (pruned each time the running turns are read).
    mine: HashSet<Uuid>,
    /// Queued turns that could not start, and why (`wait` and `status` tell).
    failed: HashMap<Uuid, Error>,
    dispatching: bool,
}

/// The queue of turns beyond `--max-parallel`.
#[derive(Debug)]
pub struct Queue {
    max: usize,
    state: Mutex<State>,
}

impl Queue {
    pub fn new(max: usize) -> Arc<Queue> {
        Arc::new(Queue {
            max: max.max(1),
            state: Mutex::new(State::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts `session`'s turn now if a slot is free and nothing queued is before it, else
    /// queues it; `true` when queued.
    pub async fn start_or_queue(
        self: &Arc<Self>,
        client: &Client,
        session: &Session,
        options: &TurnOptions,
        first: bool,
    ) -> Result<bool> {
        let id = session.id();
        let running = client.running().await?;
        {
            let mut st = self.lock();
            st.failed.remove(&id);
            let busy = st.busy(&running);
            st.mine.insert(id);
            if !st.waiting.is_empty() || busy >= self.max {
                st.waiting.push_back(Queued {
                    id,
                    settings: session.record().settings.clone(),
                    options: options.clone(),
                    first,
                });
                if !std::mem::replace(&mut st.dispatching, true) {
                    tokio::spawn(Arc::clone(self).dispatch(client.clone()));
                }
                return Ok(true);
            }
            st.starting.insert(id);
        }
        let started = session.start_detached(options).await;
        self.lock().starting.remove(&id);
        started.map(|()| false)
    }

    /// Whether session `id` has a turn queued or being started by this server.
    pub fn holds(&self, id: Uuid) -> bool {
        let st = self.lock();
        st.starting.contains(&id) || st.waiting.iter().any(|q| q.id == id)
    }

    /// Where session `id`'s turn is in the queue (0: next), if it is queued.
    pub fn position(&self, id: Uuid) -> Option<usize> {
        self.lock().waiting.iter().position(|q| q.id == id)
    }

    /// Why session `id`'s queued turn could not start, if it could not.
    pub fn failure(&self, id: Uuid) -> Option<Error> {
        self.lock().failed.get(&id).cloned()
    }

    /// Waits while session `id` has a turn queued or starting; the error of one that could
    /// not start.
    pub async fn until_started(&self, id: Uuid) -> Result<()> {
        while self.holds(id) {
            tokio::time::sleep(POLL).await;
        }
        match self.failure(id) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The dispatcher: starts queued turns in order as slots free up, until the queue is
    /// empty.
    async fn dispatch(self: Arc<Self>, client: Client) {
        loop {
            tokio::time::sleep(POLL).await;
            let running = match client.running().await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!("--max-parallel: cannot read the running turns: {e}");
                    continue;
                }
            };
            let next = {
                let mut st = self.lock();
                if st.waiting.is_empty() {
                    st.dispatching = false;
                    return;
                }
                if st.busy(&running) >= self.max {
                    continue;
                }
                let next = st.waiting.pop_front().expect("not empty");
                st.starting.insert(next.id);
                next
            };
            let id = next.id;
            if let Err(e) = start_queued(&client, next).await {
                tracing::warn!("a queued turn of session {id} could not start: {e}");
                self.lock().failed.insert(id, e);
            }
            self.lock().starting.remove(&id);
        }
    }
}

impl State {
    /// The turns of this server that hold a slot: running (in `running`, the backend's
    /// running turns) or being started. Sessions seen not running and not starting leave
    /// `mine`, so the count stays as small as what runs.
    fn busy(&mut self, running: &HashMap<Uuid, u32>) -> usize {
        let starting = &self.starting;
        let waiting = &self.waiting;
        self.mine.retain(|m| {
            running.contains_key(m) || starting.contains(m) || waiting.iter().any(|q| q.id == *m)
        });
        self.mine.iter().filter(|m| running.contains_key(m)).count() + self.starting.len()
    }
}

async fn start_queued(client: &Client, q: Queued) -> Result<()> {
    let mut session = client.open(&q.id.to_string()).await?;
    *session.settings_mut() = q.settings;
    let started = session.start_detached(&q.options).await;
    if started.is_err() && q.first {
        session.discard_unless_recorded().await;
    }
    started
}
