//! The library API: what the `caw-box` binary is a thin layer over.
//!
//! ```no_run
//! use caw_box::{Client, NewSession, ProviderKind, TurnOptions};
//!
//! # async fn demo() -> caw_box::Result<()> {
//! let client = Client::connect().await?;
//! let mut session = client
//!     .start_session(NewSession::new(ProviderKind::Codex, "/path/to/project"))
//!     .await?;
//! let result = session
//!     .send(TurnOptions::prompt("REMEMBER:blue"), |event| println!("{event:?}"))
//!     .await?;
//! let handle = session.handle().to_json();
//! // ... later, anywhere with the same Docker daemon:
//! let mut again = client.open(&handle).await?;
//! again.send(TurnOptions::prompt("RECALL"), |_| {}).await?;
//! // Sessions are stopped, waited for and removed from any process, too:
//! // `client.stop(id)`, `client.wait(id)`, `client.remove(id, force)`, `client.running()`.
//! // Forks of a session at a turn (new whole sessions, each resumable):
//! // `client.fork(id, &ForkRequest { at: Some(1), count: 3, ..Default::default() })`.
//! client.remove(&handle, false).await?;
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::time::Duration;

use uuid::Uuid;

use crate::backend::{Backend, Engine};
use crate::error::{Error, Result};
use crate::event::{Event, Status, TurnResult};
use crate::provider::ProviderKind;
use crate::session::handle::ResumeHandle;
use crate::session::lifecycle::fork::{ForkRequest, Forks};
use crate::session::lifecycle::Stopped;
use crate::session::names;
use crate::session::record::{now_secs, volume_labels, SessionRecord, SessionSettings};
use crate::session::runner::{self, TurnOptions};
use crate::session::{lifecycle, limits, target};

mod connect;
pub mod detach;

pub use connect::{backend_settings, chosen_backend, connect_backend, ClientBuilder};

/// A connection to the Docker daemon that sessions run on.
#[derive(Debug, Clone)]
pub struct Client {
    backend: Engine,
}

/// What a new session is started with.
#[derive(Debug, Clone)]
pub struct NewSession {
    pub provider: ProviderKind,
    pub name: Option<String>,
    pub group: Option<String>,
    pub settings: SessionSettings,
}

impl NewSession {
    /// A session of `provider` over the workspace directory `workspace`, default settings.
    pub fn new(provider: ProviderKind, workspace: impl Into<String>) -> Self {
        NewSession {
            provider,
            name: None,
            group: None,
            settings: SessionSettings {
                image: provider.default_image(),
                network: "open".into(),
                workspace: Some(workspace.into()),
                ..Default::default()
            },
        }
    }
}

impl TurnOptions {
    /// Options for a turn with just a prompt.
    pub fn prompt(prompt: impl Into<String>) -> Self {
        TurnOptions {
            prompt: prompt.into(),
            ..Default::default()
        }
    }
}

/// An open session: its record, ready for the next turn.
#[derive(Debug)]
pub struct Session {
    backend: Engine,
    record: SessionRecord,
}

impl Client {
    /// The settings to connect with, as values.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// Connects to the backend of this process's settings ([`backend_settings`]): those a
    /// [`ClientBuilder`] installed, else the variables and config files (Docker by default:
    /// DOCKER_CONTEXT, DOCKER_HOST, the current context or the local socket).
    pub async fn connect() -> Result<Self> {
        let backend = connect_backend().await?;
        // Queued turns whose driver died while they waited go on (`--per-account`).
        detach::adopt_orphaned_turns().await;
        Ok(Client { backend })
    }

    pub fn backend(&self) -> &Engine {
        &self.backend
    }

    /// Creates a session's state volume. Checks first (image present, name free, the
    /// `runtime` one the backend has), so a refused session leaves nothing behind.
    pub async fn start_session(&self, new: NewSession) -> Result<Session> {
        new.settings.check_agent_config(new.provider)?;
        let image = &new.settings.image;
        // Both checks at once: they are independent, and each is a round trip.
        let name_check = async {
            match &new.name {
                Some(name) => target::name_taken(&self.backend, name).await,
                None => Ok(false),
            }
        };
        let runtime_check = async {
            match &new.settings.runtime {
                Some(runtime) => self.backend.check_runtime(runtime).await,
                None => Ok(()),
            }
        };
        let (inspected, name_taken, runtime) =
            tokio::join!(self.backend.inspect_image(image), name_check, runtime_check);
        runtime?;
        let Some(image_info) = inspected? else {
            return Err(Error::missing_image(image, new.provider));
        };
        if name_taken? {
            let name = new.name.as_deref().unwrap_or_default();
            return Err(
                Error::usage(format!("a session named '{name}' exists already"))
                    .with_hint("pick another --name, or resume that session"),
            );
        }
        // A ready box of a pool made for these settings, if there is one: its id is the
        // session's, and its first turn runs in it (`lifecycle::pool`).
        let pool =
            lifecycle::pool::claim(&self.backend, new.provider, &new.settings, &image_info.id)
                .await
                .unwrap_or_else(|e| {
                    tracing::debug!("no box claimed: {e}");
                    None
                });
        let session_id = pool.unwrap_or_else(Uuid::new_v4);
        let created_at = now_secs();
        let labels = self.session_labels(&new, session_id, created_at).await;
        // A claimed box's state volume was made before its session: the session's labels go
        // on a facts volume beside it (a volume's labels cannot change).
        let labelled = match pool {
            Some(_) => names::facts_volume(session_id),
            None => names::state_volume(session_id),
        };
        if let Err(e) = self.backend.create_volume(&labelled, labels).await {
            if pool.is_some() {
                lifecycle::pool::remove_claimed(&self.backend, session_id).await;
            }
            return Err(e);
        }
        if pool.is_some() {
            lifecycle::pool::refill_after_claim(&lifecycle::pool::key_of(
                &lifecycle::pool::scope_of(&self.backend),
                new.provider,
                &new.settings,
            ));
        }
        if new.settings.workspace_mode == crate::session::WorkspaceMode::Copy {
            let dir = new.settings.workspace.clone().unwrap_or_default();
            let populated = crate::session::workspace::populate(
                &self.backend,
                session_id,
                new.provider,
                image,
                std::path::Path::new(&dir),
                crate::session::owner::turn_ids(&new.settings),
            )
            .await;
            if let Err(e) = populated {
                // Nothing half-made stays behind.
                let _ = self
                    .backend
                    .remove_volume(&names::workspace_volume(session_id))
                    .await;
                let _ = self
                    .backend
                    .remove_volume(&names::state_volume(session_id))
                    .await;
                if pool.is_some() {
                    lifecycle::pool::remove_claimed(&self.backend, session_id).await;
                }
                return Err(e);
            }
        }
        let mut record =
            lifecycle::pool::new_record(session_id, new.provider, &new.settings, created_at);
        record.name = new.name;
        record.group = new.group;
        // A box's volumes were handed to the user its settings give.
        record.owner = pool.map(|_| crate::session::owner::turn_ids(&new.settings));
        Ok(Session {
            backend: self.backend.clone(),
            record,
        })
    }

    /// The labels of a new session's state volume (of a claimed box's facts volume): who
    /// it is, its settings, and a bind-mode git workspace's base.
    async fn session_labels(
        &self,
        new: &NewSession,
        session_id: Uuid,
        created_at: u64,
    ) -> HashMap<String, String> {
        let mut labels = volume_labels(
            session_id,
            new.provider,
            new.name.as_deref(),
            new.group.as_deref(),
            created_at,
            &new.settings,
        );
        if new.settings.workspace_mode == crate::session::WorkspaceMode::Bind {
            let dir = new.settings.workspace.as_deref().unwrap_or_default();
            let image = &new.settings.image;
            let base =
                crate::session::patch::record_bind_base(&self.backend, session_id, image, dir);
            if let Some(base) = base.await {
                labels.insert(
                    crate::session::names::labels::WORKSPACE_BASE.to_string(),
                    serde_json::to_string(&base).expect("bases serialize"),
                );
            }
        }
        labels
    }

    /// Opens an existing session by handle, id, unique id prefix or name.
    pub async fn open(&self, target: &str) -> Result<Session> {
        Ok(Session {
            backend: self.backend.clone(),
            record: target::resolve(&self.backend, target).await?,
        })
    }

    /// The sessions that run a turn right now: session id -> turn number.
    pub async fn running(&self) -> Result<HashMap<Uuid, u32>> {
        lifecycle::running_turns(&self.backend).await
    }

    /// Stops the running turn of the session `target` names (whichever process drives it)
    /// and returns its id once the turn is recorded as interrupted; the session stays
    /// resumable. Where no turn runs but the session is warm, its idle container goes
    /// ([`Stopped::Warm`]). An error if there is neither.
    pub async fn stop(&self, target: &str) -> Result<(Uuid, Stopped)> {
        let facts = target::resolve_view(&self.backend, target).await?.facts;
        let id = facts.session_id;
        let stopped = lifecycle::stop(&self.backend, id, &facts.settings).await?;
        Ok((id, stopped))
    }

    /// Waits until the running turn (if any) of the session `target` names is recorded,
    /// then returns the result of its latest turn.
    pub async fn wait(&self, target: &str) -> Result<TurnResult> {
        let view = target::resolve_view(&self.backend, target).await?;
        waiting(lifecycle::wait(&self.backend, &view.facts)).await
    }

    /// Removes the session `target` names, with everything it has in Docker and its host
    /// cache; returns its id. A session with a running turn is refused unless `force`
    /// (which kills the turn).
    pub async fn remove(&self, target: &str, force: bool) -> Result<Uuid> {
        let id = target::resolve_view(&self.backend, target)
            .await?
            .facts
            .session_id;
        if !force {
            if let Some(&turn) = self.running().await?.get(&id) {
                return Err(lifecycle::running_refusal(id, turn));
            }
        }
        lifecycle::remove(&self.backend, id).await?;
        Ok(id)
    }

    /// Makes `request.count` forks of the session `target` names: new whole sessions whose
    /// conversation and workspace are that session's at the end of turn `request.at` (its
    /// latest by default), each resumable as any session ([`Client::open`]); the source is
    /// only read. Refused before anything is made: a count outside 1 to
    /// [`lifecycle::fork::MAX_FORKS`], a name or group `run` would refuse, a session running a
    /// turn, a turn it does not have or has no checkpoint of (`caw-box fork`, `caw-box mcp`'s
    /// `fork` and the Python package's `Session.fork` all come here).
    pub async fn fork(&self, target: &str, request: &ForkRequest) -> Result<Forks> {
        request.check()?;
        if let Some(name) = &request.name {
            crate::settings::validate_name(name, "--name")?;
        }
        if let Some(group) = &request.group {
            crate::settings::validate_name(group, "--group")?;
        }
        lifecycle::fork::fork(&self.backend, target, request).await
    }

    /// [`Session::send`], falling back as `--on-limit fallback=P,...` does: a turn stopped
    /// by a usage limit goes, with the same prompt and settings (the model aside: it is the
    /// vendor's), to a new session of each of `providers` in turn until one is not limited.
    /// Each new session records the one it took over from (`SessionSettings::fallback_of`;
    /// `show` and `ls` give both sides). The `result` event of a limited turn that is
    /// handed on is held back: `on_event` sees one result. `progress` is told which
    /// provider answered.
    pub async fn send_falling_back(
        &self,
        session: &mut Session,
        options: TurnOptions,
        providers: &[ProviderKind],
        progress: impl Fn(&str),
        mut on_event: impl FnMut(&Event) + Send,
    ) -> Result<TurnResult> {
        let mut from = session.record().clone();
        let mut next = providers.iter();
        let mut held: Option<Event> = None;
        let mut result = session
            .send(options.clone(), |e| {
                hold_limited(e, &mut held, &mut on_event)
            })
            .await?;
        while result.status == Status::UsageLimit {
            let Some(&provider) = next.next() else { break };
            let mut settings = from.settings.clone();
            settings.image = provider.default_image();
            settings.model = None;
            settings.fallback_of = Some(from.session_id);
            if let Err(e) = settings.check_agent_config(provider) {
                progress(&format!("usage limit: cannot fall back to {provider}: {e}"));
                continue;
            }
            let mut fallback = self
                .start_session(NewSession {
                    provider,
                    name: None,
                    group: from.group.clone(),
                    settings,
                })
                .await?;
            progress(&format!(
                "usage limit on {} session {}: falling back to {provider}, session {}",
                from.provider,
                from.session_id,
                fallback.id()
            ));
            held = None;
            result = match fallback
                .send(options.clone(), |e| {
                    hold_limited(e, &mut held, &mut on_event)
                })
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    let _ = fallback.discard_if_unused().await;
                    return Err(e);
                }
            };
            if result.status != Status::UsageLimit {
                progress(&format!(
                    "answered by {provider} (session {})",
                    fallback.id()
                ));
            }
            from = fallback.record().clone();
        }
        if let Some(e) = held {
            on_event(&e);
        }
        Ok(result)
    }
}

impl Session {
    pub fn id(&self) -> Uuid {
        self.record.session_id
    }

    pub fn record(&self) -> &SessionRecord {
        &self.record
    }

    /// Overrides settings for this and later turns of this process (not remembered).
    pub fn settings_mut(&mut self) -> &mut SessionSettings {
        &mut self.record.settings
    }

    /// The resume handle as of now.
    pub fn handle(&self) -> ResumeHandle {
        runner::handle_of(&self.record, &self.backend.capabilities().scope)
    }

    /// Makes the session's warm container ahead of its next turn (`caw-box warm`), idle for
    /// `for_secs` after each turn (else the session's `--keep-warm`): `false` when one was
    /// warm already. An error where its next turn would run cold anyway.
    pub async fn warm(&mut self, for_secs: Option<u64>) -> Result<bool> {
        runner::warm_ahead(&self.backend, &mut self.record, for_secs).await
    }

    /// Runs one turn; `on_event` sees each unified event as it happens.
    pub async fn send(
        &mut self,
        mut options: TurnOptions,
        mut on_event: impl FnMut(&Event) + Send,
    ) -> Result<TurnResult> {
        let settings = &self.record.settings;
        if options.timeout.is_none() {
            options.timeout = settings.timeout_secs.map(Duration::from_secs);
        }
        if options.idle_timeout.is_none() {
            options.idle_timeout = settings
                .idle_timeout_secs
                .filter(|&s| s > 0)
                .map(Duration::from_secs);
        }
        if options.connect_timeout.is_none() {
            options.connect_timeout = settings.connect_timeout_secs.map(Duration::from_secs);
        }
        if !self.record.settings.park || options.interactive {
            return runner::run_turn(&self.backend, &mut self.record, &options, &mut on_event)
                .await;
        }
        // `--on-limit park`: a turn the account's usage limit stopped goes on, once the
        // limit resets, with a turn of its own in the same conversation (its admission
        // waits for the reset). Only the last turn's `result` event is passed on.
        let mut options = options;
        let mut kept = None;
        loop {
            let mut held = None;
            let result =
                runner::run_turn(
                    &self.backend,
                    &mut self.record,
                    &options,
                    &mut |e| match e {
                        Event::Result { result } if result.status == Status::UsageLimit => {
                            held = Some(e.clone())
                        }
                        _ => on_event(e),
                    },
                )
                .await?;
            if result.status != Status::UsageLimit
                || !crate::session::admission::carried_on(self.id())
            {
                if let Some(e) = held {
                    on_event(&e);
                }
                return Ok(result);
            }
            options.prompt = crate::session::park::CONTINUE_PROMPT.to_string();
            // Kept until it is admitted: if this process goes first, the next caw-box
            // starts the turn in its place.
            drop(kept.take());
            kept = detach::keep_job(self, &options);
        }
    }

    /// [`Session::send`], waiting out a usage limit as `--on-limit wait` does: when the
    /// turn ends in `usage_limit` and the CLI's words name a reset within `max_wait` in all
    /// ([`limits::reset_after`]), `progress` is told how long, this waits (Ctrl-C ends the
    /// wait: exit 130, the session stays resumable), and the same prompt is sent again in
    /// this session as the same turn, which replaces the limited one in the session's
    /// record (the session records one turn). The `result` event of a turn that is sent
    /// again is held back, so `on_event` sees one. When it does not wait (no reset named, or one beyond
    /// `max_wait`), `progress` says why and the `usage_limit` result is returned as is.
    pub async fn send_waiting(
        &mut self,
        options: TurnOptions,
        max_wait: Duration,
        mut progress: impl FnMut(&str),
        mut on_event: impl FnMut(&Event) + Send,
    ) -> Result<TurnResult> {
        let mut waited = Duration::ZERO;
        loop {
            let mut held = None;
            let result = self
                .send(options.clone(), |e: &Event| match e {
                    Event::Result { result } if result.status == Status::UsageLimit => {
                        held = Some(e.clone())
                    }
                    _ => on_event(e),
                })
                .await?;
            let what = format!("the {} turn", self.record.provider);
            let wait = (result.status == Status::UsageLimit).then(|| {
                // What the CLI's whole output named (recorded with the turn), else its words.
                let recorded = self
                    .record
                    .turns
                    .last()
                    .filter(|t| t.turn == result.turn)
                    .and_then(|t| t.limit_resets_at)
                    .map(|at| Duration::from_secs_f64((at as f64 - limits::now_unix()).max(0.0)));
                // A reset just passed but still limited: a second before asking again.
                let reset = recorded
                    .or_else(|| limits::reset_after(&result.result))
                    .map(|d| d.max(Duration::from_secs(1)));
                limits::check_wait(reset, max_wait.saturating_sub(waited), &what)
            });
            let wait = match wait {
                Some(Ok(wait)) => wait,
                Some(Err(why)) => {
                    progress(&why.to_string());
                    if let Some(e) = held {
                        on_event(&e);
                    }
                    return Ok(result);
                }
                None => return Ok(result),
            };
            progress(&format!(
                "usage limit: waiting {} for it to reset, then sending the prompt again (Ctrl-C to stop)",
                humantime::format_duration(Duration::from_secs(wait.as_secs_f64().ceil() as u64))
            ));
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = tokio::signal::ctrl_c() => {
                    return Err(Error::new(
                        crate::error::ErrorKind::Interrupted,
                        "interrupted while waiting for a usage limit to reset",
                    )
                    .with_hint(format!("the session stays resumable: caw-box resume {}", self.id())));
                }
            }
            waited += wait;
            // The prompt goes again as the same turn: the session records one turn, the
            // one that answered, in place of the limited one.
            // (Unless the record lacks the turn before it: then it is sent as the next one.)
            if let Some(limited) = self.record.turns.pop() {
                if limited.turn == result.turn && self.record.next_turn() == limited.turn {
                    tracing::debug!("turn {} is sent again after its usage limit", limited.turn);
                } else {
                    self.record.turns.push(limited);
                }
            }
        }
    }

    /// Stops this session's running turn, wherever it runs (see [`Client::stop`]).
    pub async fn stop(&self) -> Result<Stopped> {
        lifecycle::stop(&self.backend, self.id(), &self.record.settings).await
    }

    /// Waits for this session's running turn, wherever it runs, to be recorded; returns the
    /// result of its latest turn (see [`Client::wait`]).
    pub async fn wait(&self) -> Result<TurnResult> {
        let view = target::resolve_view(&self.backend, &self.id().to_string()).await?;
        waiting(lifecycle::wait(&self.backend, &view.facts)).await
    }

    /// Deletes the session's volumes, for a session whose first turn never ran (a turn that
    /// started and then failed may have left the agent's work there: kept).
    pub async fn discard_if_unused(&self) -> Result<()> {
        if self.record.turns.is_empty() && !self.record.turn_started {
            let id = self.record.session_id;
            self.backend
                .remove_volume(&names::workspace_volume(id))
                .await?;
            self.backend.remove_volume(&names::state_volume(id)).await?;
        }
        Ok(())
    }
}

/// `wait` itself, while which a queued turn whose driver dies is started again (its own
/// or another's: whoever waits keeps the queue going).
async fn waiting(
    wait: impl std::future::Future<Output = Result<TurnResult>>,
) -> Result<TurnResult> {
    let adopting = async {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            detach::adopt_orphaned_turns().await;
        }
    };
    tokio::select! {
        r = wait => r,
        () = adopting => unreachable!("adopting never ends"),
    }
}

/// Passes `e` on, except a `usage_limit` result, which waits in `held`.
fn hold_limited(e: &Event, held: &mut Option<Event>, on_event: &mut (impl FnMut(&Event) + Send)) {
    match e {
        Event::Result { result } if result.status == Status::UsageLimit => *held = Some(e.clone()),
        _ => on_event(e),
    }
}
