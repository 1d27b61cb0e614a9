//! Driving one turn: planned once in caw-box's terms ([`plan`]), its container made and run
//! ([`runner`]) and driven to its recorded end, headless ([`headless`], [`ended`]) or in the
//! vendor's TUI ([`interactive`]), in a warm container ([`warm`]), with its runtime files
//! ([`runtime`]), the model a session runs ([`models`]), usage limits ([`limits`]), the
//! session's spend limit ([`budget`]), the cap on a prompt ([`prompt`]) and its checkpoint
//! around it ([`checkpoints`]).
//! Not here: storing sessions (`store`), the walls around the agent (`walls`), the
//! credential broker (`broker`), existing sessions' lifecycle (`lifecycle`).
//!
//! This file: what a turn's life and its two drivers share: the turn's options, the
//! context a driver works with, the signals that end a turn early, and how a finished turn
//! maps to an error. Not the drive loops themselves.

pub mod admission;
mod admit;
pub mod budget;
mod checkpoints;
pub(in crate::session) mod ended;
pub(in crate::session) mod headless;
pub(in crate::session) mod interactive;
pub mod limits;
pub mod models;
pub mod park;
pub(in crate::session) mod plan;
pub mod prompt;
pub(in crate::session) mod reading;
pub mod runner;
pub(in crate::session) mod runtime;
pub(in crate::session) mod warm;

use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};

use crate::backend::TarFile;
use crate::backend::{Backend, CreateError};
use crate::error::{Error, ErrorKind, Result};
use crate::event::{Event, Status, TurnResult};
use crate::provider::AGENT_HOME;
use crate::session::store::files;
use crate::session::store::handle::ResumeHandle;
use crate::session::store::record::{SessionRecord, TurnRecord};

/// How long a stopped container gets between SIGTERM and SIGKILL. The entrypoint kills the
/// CLI after [`ENTRY_GRACE_SECS`], so its credential clean-up still runs before Docker's
/// SIGKILL, and Ctrl-C ends a turn well within 10 s.
pub(in crate::session) const STOP_GRACE: Duration = Duration::from_secs(8);

pub(in crate::session) const ENTRY_GRACE_SECS: u64 = 5;

/// How long a CLI may report that it cannot reach its model before the turn is stopped.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// What one turn needs beyond the session itself.
#[derive(Debug, Clone, Default)]
pub struct TurnOptions {
    pub prompt: String,
    /// `--env` values. Treated as secrets: they reach the CLI through the entrypoint's env
    /// file, never through the container's config (which `docker inspect` shows).
    pub env: Vec<(String, String)>,
    pub timeout: Option<Duration>,
    /// Stop a headless turn whose CLI printed nothing (no line on stdout or stderr) for
    /// this long; status `timeout`. `None`: no limit.
    pub idle_timeout: Option<Duration>,
    /// Stop a headless turn once its CLI has reported that it cannot reach its model and no
    /// model response has arrived for this long; status `unreachable`. `None`: the
    /// session's setting, else [`DEFAULT_CONNECT_TIMEOUT`]; zero: no limit.
    pub connect_timeout: Option<Duration>,
    /// The vendor's TUI attached to this process's terminal instead of a headless turn
    /// (`prompt` is then unused).
    pub interactive: bool,
    /// Files put in HOME before this turn, before the adapter's own (which win where both
    /// set a JSON key): the user's CLI setup of `--user-config` (`auth::user_config`).
    pub user_files: Vec<crate::provider::HomeFile>,
    /// `--credentials inject`: the real credentials reach the CLI (through a private file).
    /// Unset (the default), collected API keys are brokered where the turn can have a broker
    /// (Docker, a network other than `none`/`host`): the CLI gets a placeholder key, and a
    /// credential broker outside its container adds the real one.
    pub inject_credentials: bool,
    /// `--keep-warm` was given for this turn (a flag or a config file): the session's
    /// setting holds even where an idle container of another duration waits (`caw-box
    /// warm --for`), which a turn that says nothing runs in, for its duration.
    pub keep_warm_given: bool,
}

/// The container name that is also the session's lock.
pub fn container_name(record: &SessionRecord) -> String {
    crate::session::store::names::turn_container(record.session_id)
}

/// The handle for a session's current state, on the backend `scope` (where it lives:
/// the connected backend's, [`crate::backend::Capabilities::scope`]).
pub fn handle_of(record: &SessionRecord, scope: &crate::backend::Scope) -> ResumeHandle {
    ResumeHandle::in_scope(
        record.provider,
        record.session_id,
        record.resume_key.clone(),
        scope,
    )
    .forked(record.settings.forked_from)
}

/// Set by a program that embeds caw-box and keeps its own signals (the Python package: its
/// Ctrl-C is Python's `KeyboardInterrupt`, its SIGTERM still ends it): turns then install no
/// handlers (which would outlive the turn and swallow SIGTERM and SIGHUP), and the caller
/// stops a turn itself (`Session::stop`).
static CALLER_HANDLES_SIGNALS: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Turns of this process leave SIGINT, SIGTERM and SIGHUP to the caller (see
/// [`CALLER_HANDLES_SIGNALS`]).
pub fn leave_signals_to_the_caller() {
    CALLER_HANDLES_SIGNALS.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Signals that end a turn early: Ctrl-C, SIGTERM, and SIGHUP (the terminal went away);
/// none where the caller handles signals.
pub(in crate::session) struct Interrupts {
    pub(in crate::session) int: Option<tokio::signal::unix::Signal>,
    pub(in crate::session) term: Option<tokio::signal::unix::Signal>,
    pub(in crate::session) hup: Option<tokio::signal::unix::Signal>,
}

impl Interrupts {
    pub(in crate::session) fn install() -> Result<Self> {
        if CALLER_HANDLES_SIGNALS.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(Interrupts {
                int: None,
                term: None,
                hup: None,
            });
        }
        let err = |e| Error::environment(format!("failed to install signal handlers: {e}"));
        Ok(Interrupts {
            int: Some(signal(SignalKind::interrupt()).map_err(err)?),
            term: Some(signal(SignalKind::terminate()).map_err(err)?),
            hup: Some(signal(SignalKind::hangup()).map_err(err)?),
        })
    }

    /// Any of the three.
    pub(in crate::session) async fn recv(&mut self) {
        tokio::select! {
            _ = next(&mut self.int) => {},
            _ = next(&mut self.term) => {},
            _ = next(&mut self.hup) => {},
        }
    }
}

/// The next delivery of `signal`; never, where it has no handler.
pub(in crate::session) async fn next(signal: &mut Option<tokio::signal::unix::Signal>) {
    match signal {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// A missing image when creating any of a turn's containers (the turn's, the volume owner
/// fix-up, the egress proxy: all run the session's image) as the missing-image error.
pub(in crate::session) fn image_hint(e: CreateError, record: &SessionRecord) -> Error {
    image_hint_for(e, &record.settings.image, record.provider)
}

/// [`image_hint`] for a container of `provider`'s `image` before a session exists.
pub use crate::backend::image_hint_for;

pub(in crate::session) fn busy(record: &SessionRecord, turn: &str) -> Error {
    let id = record.session_id;
    Error::busy(format!(
        "session {id} is busy: turn {turn} is running right now (container caw-box-{id})"
    ))
    .with_hint(format!(
        "wait for it to end, or stop it with `caw-box stop {id}`"
    ))
}

/// What a turn's driver works with, once the turn's container exists.
pub(in crate::session) struct TurnContext<'a, B> {
    pub backend: &'a B,
    /// The container's name (the session's lock).
    pub name: &'a str,
    pub turn: u32,
    pub options: &'a TurnOptions,
    /// Files to put in HOME before the start.
    pub home_files: &'a [crate::provider::HomeFile],
    /// Where the credential files the CLI refreshed go, read from the runtime directory
    /// before the container is removed; `None`: the turn got no credential files.
    pub home_out: Option<&'a std::sync::Mutex<Option<Vec<u8>>>>,
    /// What a headless turn's driver writes on the container's stdin first (the runtime
    /// files, `runtime::Runtime::payload`).
    pub runtime_payload: Option<&'a [u8]>,
    /// The turn's egress (its proxy and what it saw); `None` on the host's network.
    pub egress: Option<&'a crate::session::walls::egress::Egress>,
    /// Of a turn whose driver is gone, adopted: its proxy's log, read for its egress record.
    pub adopted_egress: Option<crate::session::walls::refusals::Watch>,
    /// `Some(true)` once the turn's credential broker listens (`Some(false)`: it failed),
    /// `Some(true)` from the start when there is none: the runtime files wait for it.
    pub broker_ready: tokio::sync::watch::Receiver<Option<bool>>,
    /// A bind-mode workspace's protected paths, swept before the container goes.
    pub guard: Option<&'a crate::session::walls::quarantine::Guard>,
    /// The uid:gid the container runs as (`owner::turn_ids`): files caw-box puts in its HOME
    /// and runtime directory belong to it.
    pub user: (u32, u32),
    /// A warm turn's checkpoint, armed beside it (`checkpoint::arm`).
    pub armed: Option<&'a crate::session::store::behind::Arming>,
}

pub(in crate::session) fn append_event(log: &mut Vec<u8>, e: &Event) {
    if let Ok(json) = serde_json::to_vec(e) {
        log.extend_from_slice(&json);
        log.push(b'\n');
    }
}

pub(in crate::session) async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Writes the adapter's config files into HOME (in the state volume), merging JSON files
/// with what the CLI already keeps there.
pub(in crate::session) async fn place_home_files(
    backend: &impl Backend,
    name: &str,
    home_files: &[crate::provider::HomeFile],
    owner: (u32, u32),
) -> Result<()> {
    let mut contents: Vec<(String, Vec<u8>)> = Vec::new();
    for f in home_files {
        let mut bytes = f.contents.clone();
        if f.merge_json {
            // Onto what an earlier file of the same path gave, else what HOME has.
            let earlier = contents.iter().position(|(p, _)| *p == f.path);
            let existing = match earlier {
                Some(i) => Some(contents.remove(i).1),
                None => {
                    backend
                        .download_file(name, &format!("{AGENT_HOME}/{}", f.path))
                        .await?
                }
            }
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            // Nothing there yet: merged onto nothing, so that its `null`s (keys to remove)
            // are not written.
            .or_else(|| Some(serde_json::json!({})));
            if let (Some(mut base), Ok(overlay)) = (
                existing,
                serde_json::from_slice::<serde_json::Value>(&f.contents),
            ) {
                files::merge_json(&mut base, &overlay);
                bytes = serde_json::to_vec_pretty(&base).unwrap_or(bytes);
            }
        }
        contents.push((f.path.clone(), bytes));
    }
    if contents.is_empty() {
        return Ok(());
    }
    let tar_files: Vec<TarFile<'_>> = contents
        .iter()
        .map(|(p, c)| TarFile {
            path: p,
            contents: c,
            mode: 0o600,
        })
        .collect();
    backend
        .upload_files(name, AGENT_HOME, &tar_files, owner)
        .await
}

/// The exit status a finished turn maps to, as an error for `main` to print (or `None` on
/// success).
pub fn turn_error(result: &TurnResult) -> Option<Error> {
    let kind = result.status.error_kind()?;
    // A turn's exit code can name the failure better than its status: an `error` turn
    // whose pod ran out of memory is the environment's (exit 3).
    let kind = ErrorKind::from_exit_code(result.exit_code).unwrap_or(kind);
    let summary = result.result.lines().next().unwrap_or("").trim();
    let mut e = Error::new(
        kind,
        format!(
            "turn {} of session {} ended with {}: {summary}",
            result.turn, result.session_id, result.status
        ),
    );
    e = e.with_hint(match result.status {
        Status::AuthError => format!(
            "collect credentials with `caw-box auth collect --provider {}`, then resume",
            result.provider
        ),
        Status::UsageLimit => "wait for the vendor's limit to reset, then resume".to_string(),
        Status::Budget => format!(
            "the session has spent its --max-cost; resume it with a higher one: `caw-box resume {} --max-cost USD`",
            result.session_id
        ),
        Status::Unreachable => format!(
            "check that --endpoint names a server that answers, that --network has a route to it, and that --allow-host lists it (@provider); the session is kept: `caw-box resume {}` once it is reachable",
            result.session_id
        ),
        _ => format!(
            "the session is kept: resume it with `caw-box resume {}`",
            result.session_id
        ),
    });
    Some(e)
}

/// The result object of a recorded turn of a session on the backend `scope`.
pub fn result_of(
    record: &SessionRecord,
    t: &TurnRecord,
    scope: &crate::backend::Scope,
) -> TurnResult {
    TurnResult {
        session_id: record.session_id.to_string(),
        name: record.name.clone(),
        provider: record.provider,
        turn: t.turn,
        status: t.status,
        result: t.result.clone(),
        resume_handle: handle_of(record, scope).to_json(),
        usage: t.usage,
        priced: crate::provider::pricing::is_priced(&t.usage),
        duration_ms: t.duration_ms,
        exit_code: t.exit_code,
        quarantined: None,
        egress: t.egress.clone().map(Box::new),
    }
}
