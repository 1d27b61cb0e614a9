//! A turn's broker while it runs: started (or a shared one found and leased), handed its
//! keys, its lease renewed, and stopped or removed when the turn ends.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use super::{Broker, Lease, Shared, LEASE_RENEW, READY_TIMEOUT};
use crate::backend::{Backend, BrokerPlace, OutputChunk};
use crate::dirs;
use crate::error::{Error, Result};
use crate::session::store::record::{labels, roles};
use crate::session::turn::image_hint_for;

/// The data directory's broker lock (finding or starting a shared broker).
async fn lock_brokers() -> Result<dirs::DataLock> {
    dirs::lock_data_file("broker.lock", "the brokers").await
}

impl Broker {
    /// Makes what the broker needs before the agent's container can be created (its
    /// network, where the backend makes one).
    pub(in crate::session) async fn prepare(&self, backend: &impl Backend) -> Result<()> {
        // What is made for a shared broker is kept with it: made once, under the lock.
        let _lock = match (&self.shared, &self.route.agent_network) {
            (Some(_), Some(_)) => Some(lock_brokers().await?),
            _ => None,
        };
        backend.open_broker(&self.plan).await
    }

    /// Returns once the turn's broker listens with its keys: a shared one found running and
    /// leased, else one started.
    pub(in crate::session) async fn start(&self, backend: &impl Backend) -> Result<()> {
        if self.in_turn {
            return self.start_in_turn(backend).await;
        }
        let Some(s) = &self.shared else {
            let attached = self.start_own(backend, None).await?;
            // Its refreshed logins and the account's windows, as it reports them.
            let (watch, to_broker) = self.watch(backend);
            tokio::spawn(follow(attached, watch, to_broker));
            return Ok(());
        };
        let _lock = lock_brokers().await?;
        for _ in 0..3 {
            match backend.inspect_container(&self.container).await? {
                Some(c) if c.running() => {
                    let mut attached = backend.attach(&self.container, true).await?;
                    if lease(&mut attached, s, Duration::from_secs(3))
                        .await
                        .is_ok()
                    {
                        tracing::debug!("leased the running broker {}", self.container);
                        self.keep(backend, attached);
                        return Ok(());
                    }
                    // On its way out: it answers no lease any more.
                    backend.remove_found(&c).await?;
                }
                Some(c) => backend.remove_found(&c).await?,
                None => {
                    let attached = self.start_own(backend, Some(s)).await?;
                    self.keep(backend, attached);
                    return Ok(());
                }
            }
        }
        Err(Error::environment(format!(
            "could not start or lease the credential broker {}",
            self.container
        )))
    }

    /// Hands the broker in the running turn's own unit its keys and waits for it to
    /// listen. The attachment goes after: the broker read its one line, and lives until the
    /// agent's container ended.
    async fn start_in_turn(&self, backend: &impl Backend) -> Result<()> {
        let mut attached = backend.start_broker(&self.plan).await?;
        attached
            .input
            .write_all(self.config.expose())
            .await
            .map_err(|e| Error::environment(format!("could not hand the broker its keys: {e}")))?;
        attached.input.flush().await.ok();
        match tokio::time::timeout(READY_TIMEOUT, until_ready(&mut attached, None)).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(Error::environment(
                    "the credential broker did not start listening within 30 s",
                ))
            }
        }
        if self.logins {
            // Attached while the turn runs: the refresh handoff's answers, and the
            // refreshed logins to store.
            let (watch, to_broker) = self.watch(backend);
            let task = tokio::spawn(follow(attached, watch, to_broker));
            *self.watching.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        }
        Ok(())
    }

    /// Takes over the running broker in the own unit of turn `turn` whose driver is gone (a
    /// `wait` finishing its turn), where the backend runs one there
    /// ([`BrokerPlace::InTurn`]; elsewhere a broker is not the turn's alone): answers its
    /// refresh handoffs and stores the logins it refreshed, those of before this attachment
    /// included (`report`). `None` when it has none to report or does not run. Await the
    /// task after the turn (it ends with the turn).
    pub(in crate::session) async fn take_over(
        backend: &impl Backend,
        provider: crate::provider::ProviderKind,
        turn: &str,
    ) -> Option<tokio::task::JoinHandle<()>> {
        if backend.capabilities().broker_place != BrokerPlace::InTurn {
            return None;
        }
        crate::auth::spec::Spec::of(provider).oauth?;
        let seal = super::plan::turn_seal(turn)?;
        let mut attached = backend.attach_broker(turn).await.ok()?;
        attached.input.write_all(b"report\n").await.ok()?;
        attached.input.flush().await.ok();
        let (watch, to_broker) = super::refresh::LoginWatch::new(backend, provider, seal);
        Some(tokio::spawn(follow(attached, watch, to_broker)))
    }

    /// Renews this turn's lease on `attached` until [`Broker::stop`] (and, with logins,
    /// stores the tokens the broker refreshes meanwhile).
    fn keep(&self, backend: &impl Backend, mut attached: crate::backend::Attached) {
        let Some(s) = &self.shared else { return };
        let (end, mut ended) = tokio::sync::oneshot::channel::<()>();
        let (renew, release) = (Self::lease_line(s), format!("release {}\n", s.lease_id));
        let (watch, to_broker) = self.watch(backend);
        let watch = watch.for_lease(&s.lease_id);
        let (mut watch, mut to_broker) = (Some(watch), Some(to_broker));
        let mut pace = tokio::time::interval(super::pace::PACE_EVERY);
        let task = tokio::spawn(async move {
            // A deadline apart from the output: the broker's answers to other turns' leases
            // must not postpone this one's renewal.
            let mut renewal =
                tokio::time::interval_at(tokio::time::Instant::now() + LEASE_RENEW, LEASE_RENEW);
            loop {
                tokio::select! {
                    _ = &mut ended => break,
                    chunk = attached.output.next(), if watch.is_some() => match (chunk, watch.as_mut()) {
                        (Some(Ok(OutputChunk::Stdout(b))), Some(w)) => w.take(&b).await,
                        (None, _) => watch = None,
                        _ => {}
                    },
                    Some(line) = async { to_broker.as_mut()?.recv().await }, if to_broker.is_some() => {
                        let _ = attached.input.write_all(line.as_bytes()).await;
                        let _ = attached.input.flush().await;
                    }
                    _ = pace.tick(), if watch.is_some() => {
                        if let Some(line) = watch.as_mut().and_then(|w| w.pace()) {
                            let _ = attached.input.write_all(line.as_bytes()).await;
                            let _ = attached.input.flush().await;
                        }
                    }
                    _ = renewal.tick() => {
                        if attached.input.write_all(renew.as_bytes()).await.is_err() {
                            tracing::warn!("lost the credential broker's lease channel");
                        }
                        let _ = attached.input.flush().await;
                    }
                }
            }
            let _ = attached.input.write_all(release.as_bytes()).await;
            let _ = attached.input.flush().await;
        });
        *s.held.lock().unwrap_or_else(|e| e.into_inner()) = Some(Lease { end, task });
    }

    /// Creates and starts a broker, hands it its keys (and a shared one this turn's lease),
    /// and returns its attachment once it listens.
    async fn start_own(
        &self,
        backend: &impl Backend,
        shared: Option<&Shared>,
    ) -> Result<crate::backend::Attached> {
        let mut attached = backend
            .start_broker(&self.plan)
            .await
            .map_err(|e| image_hint_for(e, &self.plan.image, self.provider))?;
        let mut first = self.config.expose().to_vec();
        if let Some(s) = shared {
            first.extend_from_slice(Self::lease_line(s).as_bytes());
        }
        attached
            .input
            .write_all(&first)
            .await
            .map_err(|e| Error::environment(format!("could not hand the broker its keys: {e}")))?;
        attached.input.flush().await.ok();
        let leased = shared.map(|s| format!("caw-box-broker ok {}", s.lease_id));
        let ready = tokio::time::timeout(READY_TIMEOUT, until_ready(&mut attached, leased)).await;
        match ready {
            Ok(r) => r.map(|()| attached),
            Err(_) => Err(Error::environment(
                "the credential broker did not start listening within 30 s",
            )),
        }
    }

    /// Ends the turn's use of its broker: a shared one's lease is released (the broker
    /// stays for the next turns), a turn's own broker is removed.
    pub(in crate::session) async fn stop(&self, backend: &impl Backend) {
        if self.in_turn {
            // It ends with the agent's container (and goes with the turn's unit); what it
            // reported is stored first.
            let watching = self
                .watching
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            if let Some(task) = watching {
                let _ = tokio::time::timeout(WATCH_END, task).await;
            }
            return;
        }
        if let Some(s) = &self.shared {
            let held = s.held.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(l) = held {
                let _ = l.end.send(());
                let _ = tokio::time::timeout(Duration::from_secs(2), l.task).await;
            }
            return;
        }
        backend.close_broker(&self.plan).await;
    }

    /// Removes the session's other brokers and what was made for them: once this turn holds
    /// the session's lock, they are leftovers of turns whose caw-box was killed.
    pub(in crate::session) async fn remove_leftovers(&self, backend: &impl Backend) {
        if self.shared.is_some() {
            // Not this session's alone (a per-turn leftover goes with `rm`/`gc`).
            return;
        }
        let filter = [
            format!("{}={}", labels::SESSION, self.session),
            format!("{}={}", labels::ROLE, roles::BROKER),
        ];
        let keep = [self.plan.name.as_str(), self.plan.beside.as_str()];
        let _ = backend.sweep(&filter, &keep).await;
    }
}

/// How long a turn's end waits for the last reports of its broker in its own unit to be
/// stored.
pub(in crate::session) const WATCH_END: Duration = Duration::from_secs(5);

/// Follows a broker on `attached` until its output ends: stores the logins it reports, hands
/// it the answers to its refresh handoffs, and paces it with its account's back-off.
async fn follow<B: Backend>(
    attached: crate::backend::Attached,
    mut watch: super::refresh::LoginWatch<B>,
    mut to_broker: tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let (mut output, mut input) = (attached.output, attached.input);
    let mut pace = tokio::time::interval(super::pace::PACE_EVERY);
    loop {
        let line = tokio::select! {
            chunk = output.next() => match chunk {
                Some(Ok(OutputChunk::Stdout(b))) => {
                    watch.take(&b).await;
                    continue;
                }
                Some(_) => continue,
                None => break,
            },
            Some(line) = to_broker.recv() => line,
            _ = pace.tick() => match watch.pace() {
                Some(line) => line,
                None => continue,
            },
        };
        let _ = input.write_all(line.as_bytes()).await;
        let _ = input.flush().await;
    }
}

/// Reads a broker's output until it says it listens (and, with `leased`, holds the lease).
async fn until_ready(
    attached: &mut crate::backend::Attached,
    leased: Option<String>,
) -> Result<()> {
    let mut seen = Vec::new();
    while let Some(chunk) = attached.output.next().await {
        match chunk {
            Ok(OutputChunk::Stdout(b)) => {
                seen.extend_from_slice(&b);
                let text = String::from_utf8_lossy(&seen);
                if text.contains("caw-box-broker ready")
                    && leased.as_ref().is_none_or(|l| text.contains(l.as_str()))
                {
                    return Ok(());
                }
            }
            Ok(OutputChunk::Stderr(b)) => {
                tracing::warn!("broker: {}", String::from_utf8_lossy(&b).trim_end());
            }
            Ok(_) => {}
            Err(e) => return Err(e),
        }
    }
    Err(Error::environment(
        "the credential broker exited before it listened",
    ))
}

/// Sends this turn's lease to a running shared broker and waits for its answer (sent
/// again every 500 ms: a line may arrive before the broker reads its stdin).
async fn lease(attached: &mut crate::backend::Attached, s: &Shared, limit: Duration) -> Result<()> {
    let want = format!("caw-box-broker ok {}", s.lease_id);
    let line = Broker::lease_line(s);
    let answered = async {
        let mut seen = Vec::new();
        loop {
            attached
                .input
                .write_all(line.as_bytes())
                .await
                .map_err(|e| Error::environment(format!("could not lease the broker: {e}")))?;
            attached.input.flush().await.ok();
            let wait = tokio::time::sleep(Duration::from_millis(500));
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    () = &mut wait => break,
                    chunk = attached.output.next() => match chunk {
                        Some(Ok(OutputChunk::Stdout(b))) => {
                            seen.extend_from_slice(&b);
                            if String::from_utf8_lossy(&seen).contains(&want) {
                                return Ok(());
                            }
                        }
                        Some(_) => {}
                        None => return Err(Error::environment("the credential broker is gone")),
                    }
                }
            }
        }
    };
    tokio::time::timeout(limit, answered)
        .await
        .unwrap_or_else(|_| Err(Error::environment("the credential broker answers no lease")))
}
