//! Runs one turn of a session in a fresh container: the orchestration between a provider
//! adapter (what to run, how to read it) and the Docker backend (running it).
//!
//! The container name `caw-box-<session_id>` is the session's lock: Docker refuses a second
//! container of the same name atomically, so two racing turns cannot both start. Whatever
//! way the turn ends (answer, CLI crash, timeout, Ctrl-C), the container is removed and the
//! session's record in its state volume is brought up to date, so it stays resumable.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::signal::unix::{signal, SignalKind};

use crate::backend::docker::{CreateError, DockerBackend};
use crate::backend::TarFile;
use crate::backend::{
    ContainerInfo, ContainerState, HelperSpec, Limits, MountSpec, NetworkPolicy, OutputChunk,
    TurnSpec,
};
use crate::dirs;
use crate::error::{Error, Result};
use crate::event::{Event, Status, TurnResult};
use crate::lines::LineBuffer;
use crate::provider::{ParseContext, TurnRequest, AGENT_HOME, WORKSPACE_DIR};
use crate::session::files;
use crate::session::handle::ResumeHandle;
use crate::session::names::{self, LabelSet};
use crate::session::record::{
    labels, now_secs, roles, SessionRecord, TurnRecord, TurnSummary, WorkspaceMode,
};

/// How long a stopped container gets between SIGTERM and SIGKILL. The entrypoint kills the
/// CLI after [`ENTRY_GRACE_SECS`], so its credential clean-up still runs before Docker's
/// SIGKILL, and Ctrl-C ends a turn well within 10 s.
pub(super) const STOP_GRACE: Duration = Duration::from_secs(8);
const ENTRY_GRACE_SECS: u64 = 5;
/// Where the per-turn runtime directory appears in the container (env file, stdin).
pub const RUNTIME_MOUNT: &str = "/run/caw-box";
/// The line the entrypoint prints on stdout after the CLI ended on its own, with its exit
/// code, before it waits for the turn's record (the record hand-off, see `caw-box-entry`).
const EXIT_MARKER: &str = "\u{1e}caw-box-exit ";
/// Where the record hand-off puts files for the entrypoint to copy into HOME, and what it
/// leaves once it did.
const HANDOFF_DIR: &str = "record";
const HANDOFF_DONE: &str = "record-copied";
/// The FIFO on which the entrypoint waits for the record.
const HANDOFF_FIFO: &str = "handoff";

/// A file that tells the entrypoint to kill the CLI at the stop signal, without grace.
const STOP_NOW: &str = "stop-now";

/// A file `caw-box stop` puts in the turn's runtime directory before stopping its
/// container, so the process driving the turn records it as interrupted, not as a crash.
pub const STOP_REQUEST: &str = "stop-requested";

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
}

/// The container name that is also the session's lock.
pub fn container_name(record: &SessionRecord) -> String {
    crate::session::names::turn_container(record.session_id)
}

/// The handle for a session's current state.
pub fn handle_of(record: &SessionRecord) -> ResumeHandle {
    ResumeHandle::new(
        record.provider,
        record.session_id,
        record.resume_key.clone(),
    )
}

/// A per-turn directory on the host, removed when dropped.
struct RuntimeDir(PathBuf);

impl RuntimeDir {
    fn create(record: &SessionRecord, turn: u32) -> Result<Self> {
        let base = dirs::runtime_dir()?;
        dirs::ensure_private_dir(&base)?;
        dirs::sweep_runtime_dirs();
        let dir = base.join(format!(
            "{}-{turn}-{}",
            record.session_id,
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dirs::ensure_private_dir(&dir)?;
        // The CLI runs as the agent user, which must read what we put here.
        dirs::hand_to_agent(&dir)?;
        Ok(RuntimeDir(dir))
    }

    fn make_fifo(&self, name: &str) -> Result<()> {
        let path = self.0.join(name);
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .map_err(|e| Error::environment(format!("cannot create {}: {e}", path.display())))?;
        dirs::hand_to_agent(&path)
    }

    fn write(&self, name: &str, contents: &[u8]) -> Result<()> {
        let path = self.0.join(name);
        dirs::write_private_unsynced(&path, contents)?;
        dirs::hand_to_agent(&path)
    }
}

impl Drop for RuntimeDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Signals that end a turn early: Ctrl-C, SIGTERM, and SIGHUP (the terminal went away).
pub(super) struct Interrupts {
    pub(super) int: tokio::signal::unix::Signal,
    pub(super) term: tokio::signal::unix::Signal,
    pub(super) hup: tokio::signal::unix::Signal,
}

impl Interrupts {
    fn install() -> Result<Self> {
        let err = |e| Error::environment(format!("failed to install signal handlers: {e}"));
        Ok(Interrupts {
            int: signal(SignalKind::interrupt()).map_err(err)?,
            term: signal(SignalKind::terminate()).map_err(err)?,
            hup: signal(SignalKind::hangup()).map_err(err)?,
        })
    }

    /// Any of the three.
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {},
            _ = self.term.recv() => {},
            _ = self.hup.recv() => {},
        }
    }
}

/// Runs one turn of `record`'s session and updates `record` with it.
///
/// `sink` sees every unified event as it happens, ending with the `result` event.
/// Returns the turn's result; an `Err` means the turn could not be run at all (bad
/// environment, busy session), in which case nothing about the session changed.
pub async fn run_turn(
    backend: &DockerBackend,
    record: &mut SessionRecord,
    options: &TurnOptions,
    sink: &mut dyn FnMut(&Event),
) -> Result<TurnResult> {
    let provider = record.provider.adapter();
    let turn = record.next_turn();
    let name = container_name(record);
    let mut interrupts = Interrupts::install()?;

    let image = record.settings.image.clone();
    // (A missing image shows when the turn's container is created: no inspect per turn.)

    // A new vendor conversation until the vendor has confirmed a key in its output.
    let first_turn = !record.key_confirmed || record.resume_key.is_empty();
    let mut new_key = None;
    if first_turn && provider.chooses_key_up_front() {
        if record.resume_key.is_empty() {
            record.resume_key = uuid::Uuid::new_v4().to_string();
        }
        new_key = Some(record.resume_key.clone());
    }
    let request = TurnRequest {
        prompt: &options.prompt,
        resume_key: if first_turn {
            None
        } else {
            Some(record.resume_key.as_str())
        },
        new_session_key: new_key.as_deref(),
        model: record.settings.model.as_deref(),
        endpoint: record.settings.endpoint.as_deref(),
        interactive: options.interactive,
        credential_env: &[],
    };
    let runtime = RuntimeDir::create(record, turn)?;
    let credential_env = crate::auth::inject::prepare(record.provider, &runtime.0, &options.env)?;
    let command = provider.turn_command(&TurnRequest {
        credential_env: &credential_env,
        ..request
    });
    let mut env_file = Vec::new();
    for (k, v) in &options.env {
        env_file.extend_from_slice(k.as_bytes());
        env_file.push(b'=');
        env_file.extend_from_slice(v.as_bytes());
        env_file.push(0);
    }
    runtime.write("env", &env_file)?;
    let mut env: Vec<String> = command
        .env
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    env.push(format!("HOME={AGENT_HOME}"));
    env.push(format!("CAW_BOX_STOP_GRACE={ENTRY_GRACE_SECS}"));
    if !options.interactive {
        runtime.make_fifo(HANDOFF_FIFO)?;
        env.push("CAW_BOX_HANDOFF=1".to_string());
    }
    if let Some(stdin) = &command.stdin {
        runtime.write("stdin", stdin)?;
        env.push(format!("CAW_BOX_STDIN_FILE={RUNTIME_MOUNT}/stdin"));
    }
    if options.interactive {
        env.push(format!("TERM={}", crate::terminal::term()));
        if let Ok(colorterm) = std::env::var("COLORTERM") {
            env.push(format!("COLORTERM={colorterm}"));
        }
        env.push(format!(
            "{}={}",
            crate::provider::KEY_SCRIPT_ENV,
            provider.latest_key_script()
        ));
    }

    ensure_owner(backend, record).await?;
    let allow = crate::settings::expand_allow_hosts(record.provider, &record.settings);
    let egress = if allow.is_empty() {
        None
    } else {
        Some(Egress::start(backend, record, &allow).await?)
    };
    if let Some(e) = &egress {
        let proxy = format!("http://{PROXY_ALIAS}:{PROXY_PORT}");
        for var in ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"] {
            env.push(format!("{var}={proxy}"));
        }
        env.push("NO_PROXY=localhost,127.0.0.1".to_string());
        env.push("no_proxy=localhost,127.0.0.1".to_string());
        tracing::debug!("egress through {} on {}", e.proxy, e.network);
    }
    // Files an adapter merges into HOME (gemini's settings.json) come with its image and
    // stay in the volume: only a custom image's first turn, or a turn after one in the TUI
    // (where they may have been changed), pays the download and upload of a merge.
    let merge_due = options.interactive
        || match record.turns.last() {
            Some(last) => last.interactive,
            None => image != record.provider.default_image(),
        };
    let home_files: Vec<_> = command
        .home_files
        .iter()
        .filter(|f| merge_due || !f.merge_json)
        .cloned()
        .collect();
    let mut spec = turn_spec(record, turn, &image, command.argv.clone(), env, &runtime.0)?;
    if options.interactive {
        spec.interactive = Some(crate::terminal::size());
    }
    if let Some(e) = &egress {
        spec.network = NetworkPolicy::Named(e.network.clone());
    }
    if let Err(err) = create_turn_container(backend, record, &name, &spec).await {
        if let Some(e) = &egress {
            e.stop(backend).await;
        }
        return Err(err);
    }
    if let Some(e) = &egress {
        e.remove_leftovers(backend, record).await;
    }
    // From here on the container exists: every path out must remove it.
    let ctx = TurnContext {
        backend,
        name: &name,
        turn,
        options,
        home_files: &home_files,
        runtime_dir: &runtime.0,
        proxy: egress.as_ref().map(|e| e.proxy.as_str()),
    };
    let outcome = if options.interactive {
        super::interactive::drive(&ctx, record, &mut interrupts, sink).await
    } else {
        drive_turn(&ctx, record, &mut interrupts, sink).await
    };
    if outcome.is_err() {
        // A recorded turn's container is gone already (save_record released the lock);
        // removing it again could remove the next turn's.
        // A stop first, not a kill: the entrypoint then removes the credentials it put in
        // HOME, and writes back refreshed ones.
        let _ = backend.stop_container(&name, STOP_GRACE).await;
        let _ = backend.remove_container(&name, true).await;
    }
    if let Some(e) = &egress {
        e.stop(backend).await;
    }
    match crate::auth::inject::finish(record.provider, &runtime.0) {
        Ok(updated) if !updated.is_empty() => {
            tracing::info!("saved refreshed credentials: {}", updated.join(", "))
        }
        Ok(_) => {}
        Err(e) => tracing::warn!("could not save refreshed credentials: {e}"),
    }
    drop(runtime);
    outcome
}

/// A missing image when creating any of a turn's containers (the turn's, the volume owner
/// fix-up, the egress proxy: all run the session's image) as the missing-image error.
fn image_hint(e: CreateError, record: &SessionRecord) -> Error {
    image_hint_for(e, &record.settings.image, record.provider)
}

/// [`image_hint`] for a container of `provider`'s `image` before a session exists.
pub fn image_hint_for(
    e: CreateError,
    image: &str,
    provider: crate::provider::ProviderKind,
) -> Error {
    match e {
        CreateError::ImageMissing(_) => Error::missing_image(image, provider),
        other => other.into(),
    }
}

/// The turn as the backend runs it: the session's image, volumes and limits.
fn turn_spec(
    record: &SessionRecord,
    turn: u32,
    image: &str,
    argv: Vec<String>,
    env: Vec<String>,
    runtime_dir: &std::path::Path,
) -> Result<TurnSpec> {
    let settings = &record.settings;
    let workspace = match settings.workspace_mode {
        WorkspaceMode::Copy => Some(MountSpec::volume(
            names::workspace_volume(record.session_id),
            WORKSPACE_DIR,
        )),
        WorkspaceMode::Bind => match &settings.workspace {
            Some(ws) => {
                if !std::path::Path::new(ws).is_dir() {
                    return Err(Error::environment(format!(
                        "the session's workspace '{ws}' does not exist"
                    ))
                    .with_hint("recreate it, or pass --workspace DIR"));
                }
                Some(MountSpec::host_dir(ws.clone(), WORKSPACE_DIR))
            }
            None => None,
        },
        WorkspaceMode::None => None,
    };
    let mut labels = LabelSet::new(record.session_id, roles::TURN)
        .provider(record.provider)
        .with(labels::TURN, turn.to_string())
        .with(labels::DRIVER_PID, std::process::id().to_string())
        .with(labels::DRIVER_HOST, dirs::host_name());
    if let Some(name) = &record.name {
        labels = labels.with(labels::NAME, name.clone());
    }
    Ok(TurnSpec {
        image: image.to_string(),
        argv,
        env,
        user: dirs::agent_ids(),
        working_dir: WORKSPACE_DIR.to_string(),
        labels: labels.finish(),
        home: MountSpec::volume(names::state_volume(record.session_id), AGENT_HOME),
        workspace,
        runtime: MountSpec::host_dir(runtime_dir.display().to_string(), RUNTIME_MOUNT),
        limits: Limits {
            memory: settings.memory,
            cpus: settings.cpus,
            pids: settings.pids_limit.unwrap_or(512),
        },
        network: NetworkPolicy::from_setting(&settings.network),
        interactive: None,
    })
}

/// Creates the turn's container, which is also the session's lock.
async fn create_turn_container(
    backend: &DockerBackend,
    record: &SessionRecord,
    name: &str,
    spec: &TurnSpec,
) -> Result<()> {
    for _ in 0..2 {
        match backend.create_turn(name, spec).await {
            Ok(_) => return Ok(()),
            Err(e @ (CreateError::Other(_) | CreateError::ImageMissing(_))) => {
                return Err(image_hint(e, record))
            }
            Err(CreateError::NameTaken) => {
                let existing = backend.inspect_container(name).await?;
                let turn = existing
                    .as_ref()
                    .and_then(|c| c.label(labels::TURN))
                    .unwrap_or("?")
                    .to_string();
                let running = existing.as_ref().is_some_and(|c| c.running());
                // Not found right after a taken name is a container still being registered
                // (Docker reserves the name first): busy, never a leftover to remove.
                if running || !existing.as_ref().is_some_and(driver_is_gone) {
                    return Err(busy(record, &turn));
                }
                // A leftover of a turn whose caw-box was killed: it holds nothing we need.
                backend.remove_container(name, true).await?;
            }
        }
    }
    Err(busy(record, "?"))
}

/// The proxy's name on a turn's egress network, and its port.
pub const PROXY_ALIAS: &str = "caw-box-proxy";
pub const PROXY_PORT: u16 = 3128;

/// A turn's way out under `--allow-host`: an internal network for the agent, and a proxy
/// container on it and on the session's network that admits only the allowed hosts.
struct Egress {
    network: String,
    proxy: String,
}

impl Egress {
    async fn start(
        backend: &DockerBackend,
        record: &SessionRecord,
        allow: &[String],
    ) -> Result<Egress> {
        let id = record.session_id;
        // Named for this driver: a second caw-box that starts on a busy session sets up its
        // own, and then fails on the lock without touching the running turn's.
        let pid = std::process::id();
        let (network, proxy) = names::egress_names(id, pid);
        let e = Egress { network, proxy };
        let labels = LabelSet::new(id, roles::PROXY).finish();
        backend
            .create_network(&e.network, true, labels.clone())
            .await?;
        let outer = match record.settings.network.as_str() {
            "open" | "" => "bridge".to_string(),
            other => other.to_string(),
        };
        let (uid, gid) = dirs::agent_ids();
        let spec = HelperSpec {
            image: record.settings.image.clone(),
            entrypoint: vec!["node".into(), "/usr/local/lib/caw-box/proxy.js".into()],
            argv: vec![],
            env: vec![
                format!("CAW_BOX_ALLOW={}", allow.join(",")),
                format!("CAW_BOX_PROXY_PORT={PROXY_PORT}"),
            ],
            user: Some(format!("{uid}:{gid}")),
            labels,
            mounts: vec![],
            network: NetworkPolicy::Named(outer),
            read_only_root: true,
            drop_all_capabilities: true,
            add_capabilities: vec![],
            no_new_privileges: true,
            pids_limit: Some(128),
            tmp: None,
        };
        let started = async {
            match backend.create_helper(&e.proxy, &spec).await {
                Ok(_) => {}
                Err(CreateError::NameTaken) => {
                    return Err(busy(record, "?"));
                }
                Err(err) => return Err(image_hint(err, record)),
            }
            backend
                .connect_network(&e.network, &e.proxy, PROXY_ALIAS)
                .await?;
            backend.start_container(&e.proxy).await
        }
        .await;
        if let Err(err) = started {
            e.stop(backend).await;
            return Err(err);
        }
        Ok(e)
    }

    async fn stop(&self, backend: &DockerBackend) {
        let _ = backend.remove_container(&self.proxy, true).await;
        let _ = backend.remove_network(&self.network).await;
    }

    /// Removes the session's other proxies and egress networks: once this turn holds the
    /// session's lock, they are leftovers of turns whose caw-box was killed.
    async fn remove_leftovers(&self, backend: &DockerBackend, record: &SessionRecord) {
        let filter = [
            format!("{}={}", labels::SESSION, record.session_id),
            format!("{}={}", labels::ROLE, roles::PROXY),
        ];
        for c in backend.list_containers(&filter).await.unwrap_or_default() {
            if c.name != self.proxy && !c.id.is_empty() {
                let _ = backend.remove_container(&c.id, true).await;
            }
        }
        for n in backend.list_networks(&filter).await.unwrap_or_default() {
            if n != self.network {
                let _ = backend.remove_network(&n).await;
            }
        }
    }
}

/// The targets the proxy refused during the turn, from its JSON log lines.
async fn refused_by_proxy(backend: &DockerBackend, proxy: &str) -> Vec<String> {
    let mut logs = backend.follow_logs(proxy);
    let mut text = Vec::new();
    let read = async {
        while let Some(Ok(chunk)) = logs.next().await {
            if let OutputChunk::Stdout(message) = chunk {
                text.extend_from_slice(&message);
            }
        }
    };
    // The proxy still runs: take what it logged so far, don't wait for more.
    let _ = tokio::time::timeout(Duration::from_millis(300), read).await;
    let mut refused: Vec<String> = String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["decision"] == "refused")
        .filter_map(|v| v["target"].as_str().map(str::to_string))
        .collect();
    refused.dedup();
    refused
}

/// Makes the session's volumes belong to the uid:gid this turn runs as, when they belong to
/// someone else (a fresh volume is the image's 1000:1000): a short root helper container
/// with only the capabilities chown needs, no network.
async fn ensure_owner(backend: &DockerBackend, record: &mut SessionRecord) -> Result<()> {
    let ids = dirs::agent_ids();
    if record.owner.unwrap_or((1000, 1000)) == ids {
        return Ok(());
    }
    let id = record.session_id;
    let mut mounts = vec![MountSpec::volume(names::state_volume(id), AGENT_HOME)];
    let mut paths = vec![AGENT_HOME.to_string()];
    if record.settings.workspace_mode == WorkspaceMode::Copy {
        mounts.push(MountSpec::volume(
            names::workspace_volume(id),
            WORKSPACE_DIR,
        ));
        paths.push(WORKSPACE_DIR.to_string());
    }
    let mut argv = vec!["-R".to_string(), format!("{}:{}", ids.0, ids.1)];
    argv.extend(paths);
    let spec = HelperSpec {
        image: record.settings.image.clone(),
        entrypoint: vec!["chown".into()],
        argv,
        user: Some("0:0".into()),
        labels: LabelSet::new(id, roles::PROBE).finish(),
        mounts,
        network: NetworkPolicy::None,
        drop_all_capabilities: true,
        add_capabilities: vec![
            "CHOWN".into(),
            "DAC_OVERRIDE".into(),
            "DAC_READ_SEARCH".into(),
            "FOWNER".into(),
        ],
        no_new_privileges: true,
        ..Default::default()
    };
    let name = names::helper_container(id, "chown");
    let (code, _, err) = backend
        .run_to_completion(&name, &spec)
        .await
        .map_err(|e| image_hint(e, record))?;
    if code != 0 {
        return Err(Error::environment(format!(
            "failed to hand session {id}'s volumes to uid {}:{}: {}",
            ids.0,
            ids.1,
            err.trim()
        )));
    }
    record.owner = Some(ids);
    Ok(())
}

/// This host's name, to tell whose driver process a turn container names.
/// Whether the process that drives a (not running) turn container is certainly gone: a
/// container between create and start, or between exit and being recorded, belongs to a
/// live turn and must not be taken for a leftover.
fn driver_is_gone(container: &ContainerInfo) -> bool {
    let pid = container.label(labels::DRIVER_PID);
    let host = container.label(labels::DRIVER_HOST);
    if let (Some(pid), Some(host)) = (pid, host) {
        if host == dirs::host_name() {
            return !pid.parse().is_ok_and(is_a_caw_box);
        }
    }
    // Another host's driver (a shared daemon): only a long-idle container is a leftover.
    container
        .created
        .is_some_and(|t| t.elapsed().unwrap_or_default() > Duration::from_secs(600))
}

/// Whether process `pid` lives and runs the same program as this one (where /proc tells):
/// a dead driver's pid reused by another program must not keep its session busy for good.
fn is_a_caw_box(pid: u32) -> bool {
    let comm = |p: &str| std::fs::read_to_string(format!("/proc/{p}/comm"));
    dirs::process_is_alive(pid)
        && match (comm(&pid.to_string()), comm("self")) {
            (Ok(theirs), Ok(ours)) => theirs == ours,
            _ => true,
        }
}

fn busy(record: &SessionRecord, turn: &str) -> Error {
    let id = record.session_id;
    Error::usage(format!(
        "session {id} is busy: turn {turn} is running right now (container caw-box-{id})"
    ))
    .with_hint(format!(
        "wait for it to end, or stop it with `caw-box stop {id}`"
    ))
}

/// What a turn's driver works with, once the turn's container exists.
pub(super) struct TurnContext<'a> {
    pub backend: &'a DockerBackend,
    /// The container's name (the session's lock).
    pub name: &'a str,
    pub turn: u32,
    pub options: &'a TurnOptions,
    /// Files to put in HOME before the start.
    pub home_files: &'a [crate::provider::HomeFile],
    /// The host side of /run/caw-box.
    pub runtime_dir: &'a std::path::Path,
    /// The egress proxy's container, when the turn's network is restricted.
    pub proxy: Option<&'a str>,
}

/// Runs a headless turn in its created container, to its recorded end.
async fn drive_turn(
    ctx: &TurnContext<'_>,
    record: &mut SessionRecord,
    interrupts: &mut Interrupts,
    sink: &mut dyn FnMut(&Event),
) -> Result<TurnResult> {
    let &TurnContext {
        backend,
        name,
        turn,
        options,
        home_files,
        runtime_dir,
        proxy,
    } = ctx;
    place_home_files(backend, name, home_files).await?;

    let started = Instant::now();
    let started_at = now_secs();
    let attach = backend.attach(name, false).await?;
    backend.start_container(name).await?;
    record.turn_started = true;
    let history = StoredHistory::fetch(backend, name, record, turn);

    let mut reader = TurnReader {
        parser: record.provider.adapter().parser(ParseContext {
            previous_cumulative_usage: record.last_cumulative_usage(),
        }),
        sink,
        session_id: record.session_id.to_string(),
        provider: record.provider,
        session_announced: false,
        raw: Vec::new(),
        events_log: Vec::new(),
        events: Vec::new(),
        model_alive: false,
    };
    if !record.resume_key.is_empty() {
        reader.announce(Some(record.resume_key.clone()));
    }

    let mut stderr_tail = Vec::new();
    let mut lines = LineBuffer::default();
    let mut stderr_lines = LineBuffer::default();
    let mut ended_early = None;
    let now = tokio::time::Instant::now;
    let deadline = options.timeout.map(|t| now() + t);
    // Reset by every line the CLI prints.
    let mut idle_deadline = options.idle_timeout.map(|t| now() + t);
    // Armed while the CLI reports that it cannot reach its model: `--connect-timeout`
    // after the model's last sign of life (an answer, or a tool's result it asked for).
    let connect_timeout = options.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
    let mut alive_at = now();
    let mut link_deadline: Option<tokio::time::Instant> = None;
    let mut output = attach.output;
    // The CLI's exit code, as the entrypoint reports it right after the CLI's last output.
    let mut cli_exit: Option<i64> = None;

    loop {
        let printed = tokio::select! {
            chunk = output.next() => match chunk {
                Some(Ok(OutputChunk::Stdout(message))) => {
                    lines.feed(&message, |l| match l.strip_prefix(EXIT_MARKER) {
                        Some(code) => cli_exit = code.trim().parse().ok(),
                        None => reader.stdout_line(l),
                    });
                    if let Some(code) = cli_exit {
                        // The CLI is done; the entrypoint waits for the record.
                        tracing::debug!("the CLI exited with {code}; handing off the record");
                        break;
                    }
                    true
                }
                Some(Ok(OutputChunk::Stderr(message))) => {
                    stderr_lines.feed(&message, |l| reader.parser.parse_stderr_line(l));
                    stderr_tail.extend_from_slice(&message);
                    if stderr_tail.len() > 64 * 1024 {
                        stderr_tail.drain(..stderr_tail.len() - 32 * 1024);
                    }
                    true
                }
                Some(Ok(_)) => false,
                Some(Err(e)) => {
                    tracing::warn!("reading the CLI's output failed: {e}");
                    break;
                }
                None => break,
            },
            _ = sleep_until(deadline) => {
                ended_early = Some(EndedEarly::Timeout);
                break;
            }
            _ = sleep_until(idle_deadline) => {
                ended_early = Some(EndedEarly::Idle);
                break;
            }
            _ = sleep_until(link_deadline) => {
                ended_early = Some(EndedEarly::Unreachable);
                break;
            }
            _ = interrupts.recv() => {
                ended_early = Some(EndedEarly::Interrupted);
                break;
            }
        };
        if printed {
            idle_deadline = options.idle_timeout.map(|t| now() + t);
            if std::mem::take(&mut reader.model_alive) {
                alive_at = now();
            }
            link_deadline = match reader.parser.unreachable() {
                Some(_) if !connect_timeout.is_zero() => Some(alive_at + connect_timeout),
                _ => None,
            };
        }
    }
    if let Some(early) = ended_early {
        if matches!(early, EndedEarly::Unreachable | EndedEarly::Idle) {
            // A stuck CLI gets no grace: the entrypoint kills it at once (and still takes
            // the credentials out of HOME).
            let _ = dirs::write_private_unsynced(&runtime_dir.join(STOP_NOW), b"");
        }
        backend.stop_container(name, STOP_GRACE).await?;
        // Whatever the CLI printed while stopping still counts.
        let drain = async {
            while let Some(Ok(chunk)) = output.next().await {
                if let OutputChunk::Stdout(message) = chunk {
                    lines.feed(&message, |l| reader.stdout_line(l));
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
    }
    lines.finish(|l| reader.stdout_line(l));
    stderr_lines.finish(|l| reader.parser.parse_stderr_line(l));
    let exit_code = match cli_exit {
        Some(code) => code,
        None => backend.wait_container(name).await?,
    };
    let refused = match proxy {
        Some(proxy) => refused_by_proxy(backend, proxy).await,
        None => Vec::new(),
    };
    for target in &refused {
        reader.emit(&Event::Error {
            message: format!("egress to {target} was refused: it is not in --allow-host"),
        });
    }
    if ended_early.is_none() && runtime_dir.join(STOP_REQUEST).exists() {
        ended_early = Some(EndedEarly::Interrupted);
    }

    let mut outcome = reader.parser.finish(exit_code);
    // A CLI that gave up on its own after failing to reach its model, and said so last.
    let mut unreachable_words = reader.parser.unreachable().map(str::to_string);
    let failed = outcome.status != Status::Success || exit_code != 0;
    // The egress proxy turned the model's host away (`--allow-host` without it): whatever
    // the CLI made of the proxy's 403, it could not reach its model.
    let model_refused = {
        let model = model_host(record);
        let host = |t: &str| t.split(':').next().unwrap_or(t).to_ascii_lowercase();
        refused.iter().any(|t| host(t) == host(&model))
    };
    if ended_early.is_none()
        && failed
        && ((unreachable_words.is_some() && outcome.status == Status::Error) || model_refused)
    {
        ended_early = Some(EndedEarly::GaveUp);
        if unreachable_words.is_none() {
            unreachable_words = Some(outcome.result.clone());
        }
    }
    if let Some(key) = reader.parser.resume_key() {
        record.resume_key = key.to_string();
        record.key_confirmed = true;
    }
    if let Some(early) = ended_early {
        (outcome.status, outcome.result) = match early {
            EndedEarly::Timeout => (
                Status::Timeout,
                format!(
                    "the turn timed out after {} (--timeout)",
                    humantime::format_duration(options.timeout.unwrap_or_default())
                ),
            ),
            EndedEarly::Idle => (
                Status::Timeout,
                format!(
                    "the CLI printed nothing for {} (--idle-timeout)",
                    humantime::format_duration(options.idle_timeout.unwrap_or_default())
                ),
            ),
            EndedEarly::Unreachable | EndedEarly::GaveUp => (
                Status::Unreachable,
                unreachable_result(
                    record,
                    (early == EndedEarly::Unreachable)
                        .then(|| Duration::from_secs(alive_at.elapsed().as_secs())),
                    unreachable_words.as_deref().unwrap_or(""),
                    &refused,
                ),
            ),
            EndedEarly::Interrupted if runtime_dir.join(STOP_REQUEST).exists() => (
                Status::Interrupted,
                "the turn was stopped with `caw-box stop`".to_string(),
            ),
            EndedEarly::Interrupted => {
                (Status::Interrupted, "the turn was interrupted".to_string())
            }
        };
    } else if outcome.status != Status::Success && outcome.result.trim().is_empty() {
        outcome.result = last_line(&stderr_tail)
            .unwrap_or_else(|| format!("the CLI exited with code {exit_code}"));
    }
    if outcome.status == Status::Success && exit_code != 0 {
        outcome.status = Status::Error;
    }
    let TurnReader {
        raw,
        mut events_log,
        session_announced,
        sink,
        ..
    } = reader;

    let duration_ms = started.elapsed().as_millis() as u64;
    let turn_record = TurnRecord {
        turn,
        prompt: options.prompt.clone(),
        status: outcome.status,
        result: outcome.result.clone(),
        usage: outcome.usage,
        started_at,
        duration_ms,
        exit_code: outcome.status.exit_code(),
        cumulative_usage: outcome.cumulative_usage,
        interactive: false,
    };
    record.turns.push(turn_record);
    let result = TurnResult {
        session_id: record.session_id.to_string(),
        name: record.name.clone(),
        provider: record.provider,
        turn,
        status: outcome.status,
        result: outcome.result,
        resume_handle: handle_of(record).to_json(),
        usage: outcome.usage,
        duration_ms,
        exit_code: outcome.status.exit_code(),
    };
    if !session_announced {
        sink(&Event::Session {
            session_id: record.session_id.to_string(),
            provider: record.provider,
            resume_key: (!record.resume_key.is_empty()).then(|| record.resume_key.clone()),
        });
    }
    let result_event = Event::Result {
        result: result.clone(),
    };
    append_event(&mut events_log, &result_event);

    let logs = TurnLogs {
        raw: &raw,
        events: &events_log,
        stderr: &stderr_tail,
    };
    let handoff = cli_exit.is_some().then_some(runtime_dir);
    save_record(backend, name, record, turn, history, logs, handoff).await?;
    sink(&result_event);
    Ok(result)
}

/// Why a headless turn ended before its CLI did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EndedEarly {
    /// `--timeout`.
    Timeout,
    /// `--idle-timeout`: no output for that long.
    Idle,
    /// The CLI kept reporting that it could not reach its model (`--connect-timeout`).
    Unreachable,
    /// Not early: the CLI itself gave up after failing to reach its model.
    GaveUp,
    /// Ctrl-C, SIGTERM, SIGHUP or `caw-box stop`.
    Interrupted,
}

/// Reads a headless turn's output: each stdout line becomes unified events for the sink
/// and the turn's logs; stderr lines only inform the parser.
struct TurnReader<'s> {
    parser: Box<dyn crate::provider::StreamParser>,
    sink: &'s mut dyn FnMut(&Event),
    session_id: String,
    provider: crate::provider::ProviderKind,
    session_announced: bool,
    /// The CLI's stdout, line by line (`logs --raw`).
    raw: Vec<u8>,
    /// The unified events, one JSON line each (`logs`).
    events_log: Vec<u8>,
    events: Vec<Event>,
    /// Set when a line showed the model at work (an answer, or a result of a tool it called).
    model_alive: bool,
}

impl TurnReader<'_> {
    fn announce(&mut self, resume_key: Option<String>) {
        (self.sink)(&Event::Session {
            session_id: self.session_id.clone(),
            provider: self.provider,
            resume_key,
        });
        self.session_announced = true;
    }

    fn emit(&mut self, e: &Event) {
        append_event(&mut self.events_log, e);
        (self.sink)(e);
    }

    fn stdout_line(&mut self, line: &str) {
        self.raw.extend_from_slice(line.as_bytes());
        self.raw.push(b'\n');
        let mut events = std::mem::take(&mut self.events);
        events.clear();
        self.parser.parse_line(line, &mut events);
        if !self.session_announced {
            if let Some(key) = self.parser.resume_key().map(str::to_string) {
                self.announce(Some(key));
            }
        }
        for e in &events {
            self.model_alive |= matches!(
                e,
                Event::Text { .. }
                    | Event::Thinking { .. }
                    | Event::ToolCall { .. }
                    | Event::ToolResult { .. }
                    | Event::Usage { .. }
            );
            self.emit(e);
        }
        self.events = events;
    }
}

/// The result text of a turn whose CLI could not reach its model: which host, for how
/// long, in the CLI's own words, and what the egress proxy refused.
fn unreachable_result(
    record: &SessionRecord,
    waited: Option<Duration>,
    words: &str,
    refused: &[String],
) -> String {
    let cli = record.provider.executable();
    let host = model_host(record);
    let mut text = match waited {
        Some(w) => format!(
            "{cli} could not reach its model at {host}: no answer for {} (--connect-timeout)",
            humantime::format_duration(w)
        ),
        None => format!("{cli} could not reach its model at {host}"),
    };
    let words = words.trim();
    if !words.is_empty() {
        let words: String = words.chars().take(300).collect();
        text.push_str(&format!("; it said: {words}"));
    }
    if !refused.is_empty() {
        text.push_str(&format!(
            " (the egress proxy refused {}: not in --allow-host)",
            refused.join(", ")
        ));
    }
    text
}

/// The host a session's model traffic goes to: the `--endpoint` host, else the vendor's.
pub fn model_host(record: &SessionRecord) -> String {
    match record.settings.endpoint.as_deref() {
        Some(url) => {
            let rest = url.split_once("://").map_or(url, |(_, r)| r);
            let authority = rest.split('/').next().unwrap_or(rest);
            authority
                .rsplit('@')
                .next()
                .unwrap_or(authority)
                .to_string()
        }
        None => record
            .provider
            .api_hosts()
            .first()
            .map(|h| h.trim_end_matches(":443").to_string())
            .unwrap_or_default(),
    }
}

pub(super) fn append_event(log: &mut Vec<u8>, e: &Event) {
    if let Ok(json) = serde_json::to_vec(e) {
        log.extend_from_slice(&json);
        log.push(b'\n');
    }
}

pub(super) async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

fn last_line(bytes: &[u8]) -> Option<String> {
    String::from_utf8_lossy(bytes)
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(|l| l.chars().take(500).collect())
}

/// Writes the adapter's config files into HOME (in the state volume), merging JSON files
/// with what the CLI already keeps there.
pub(super) async fn place_home_files(
    backend: &DockerBackend,
    name: &str,
    home_files: &[crate::provider::HomeFile],
) -> Result<()> {
    let mut contents = Vec::new();
    for f in home_files {
        let mut bytes = f.contents.clone();
        if f.merge_json {
            let existing = backend
                .download_file(name, &format!("{AGENT_HOME}/{}", f.path))
                .await?
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
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
        .upload_files(name, AGENT_HOME, &tar_files, dirs::agent_ids())
        .await
}

/// The session record stored in the state volume before this turn, read through the turn's
/// container while the CLI runs (the CLI never touches it), so saving the turn does not wait
/// for it.
pub(super) struct StoredHistory(Option<tokio::task::JoinHandle<Result<Option<Vec<u8>>>>>);

impl StoredHistory {
    /// Starts reading; call once the container runs (a read holds Docker's lock on the
    /// container, which would hold up its start). Nothing to read when `record` already
    /// holds every earlier turn (turn 1, or a record completed from the host cache).
    pub(super) fn fetch(
        backend: &DockerBackend,
        name: &str,
        record: &SessionRecord,
        turn: u32,
    ) -> StoredHistory {
        if record.has_every_turn_before(turn) {
            return StoredHistory(None);
        }
        let (backend, name) = (backend.clone(), name.to_string());
        StoredHistory(Some(tokio::spawn(async move {
            backend
                .download_file(
                    &name,
                    &format!("{AGENT_HOME}/{}", crate::session::record::RECORD_PATH),
                )
                .await
        })))
    }

    async fn get(self) -> Result<Option<SessionRecord>> {
        let Some(read) = self.0 else {
            return Ok(None);
        };
        let bytes = read.await.map_err(|e| {
            Error::environment(format!("reading the stored session record failed: {e}"))
        })??;
        Ok(bytes.and_then(|b| serde_json::from_slice(&b).ok()))
    }
}

/// A turn's output as it goes into the state volume.
pub(super) struct TurnLogs<'a> {
    pub(super) raw: &'a [u8],
    pub(super) events: &'a [u8],
    pub(super) stderr: &'a [u8],
}

/// Writes the session record and this turn's logs into the state volume (through the
/// stopped turn container), replaces the session's turn-record volume, and caches the
/// record on the host.
///
/// The record stored in the volume ([`StoredHistory`]) is merged in here, so an in-memory
/// record that only knows the latest turn (a session resumed from Docker labels alone) never
/// loses the history of earlier turns.
pub(super) async fn save_record(
    backend: &DockerBackend,
    name: &str,
    record: &mut SessionRecord,
    turn: u32,
    history: StoredHistory,
    logs: TurnLogs<'_>,
    handoff: Option<&std::path::Path>,
) -> Result<()> {
    if let Some(stored) = history.get().await? {
        let mut turns: Vec<TurnRecord> =
            stored.turns.into_iter().filter(|t| t.turn < turn).collect();
        turns.extend(record.turns.iter().filter(|t| t.turn >= turn).cloned());
        record.turns = turns;
    }
    let json = serde_json::to_vec_pretty(&*record).expect("records serialize");
    let record_id = record.session_id;
    let raw_path = format!(".caw-box/turns/{turn}.raw.jsonl");
    let events_path = format!(".caw-box/turns/{turn}.events.jsonl");
    let stderr_path = format!(".caw-box/turns/{turn}.stderr.log");
    let files = [
        TarFile {
            path: crate::session::record::RECORD_PATH,
            contents: &json,
            mode: 0o600,
        },
        TarFile {
            path: &raw_path,
            contents: logs.raw,
            mode: 0o600,
        },
        TarFile {
            path: &events_path,
            contents: logs.events,
            mode: 0o600,
        },
        TarFile {
            path: &stderr_path,
            contents: logs.stderr,
            mode: 0o600,
        },
    ];
    let write_record = async {
        if let Some(dir) = handoff {
            match hand_off(backend, name, dir, &files).await {
                Ok(true) => return Ok(()),
                Ok(false) => tracing::debug!("the record hand-off did not happen; uploading"),
                Err(e) => tracing::debug!("the record hand-off failed ({e}); uploading"),
            }
        }
        match backend
            .upload_files(name, AGENT_HOME, &files, dirs::agent_ids())
            .await
        {
            Err(e) if being_removed(backend, name).await => {
                tracing::debug!("{e}");
                Err(Error::environment(format!(
                    "the turn's container '{name}' was removed while the turn ran (`docker rm`, a prune?), so the turn is not recorded"
                ))
                .with_hint(format!(
                    "the session's state is kept: `caw-box resume {}` continues it",
                    record_id
                )))
            }
            other => other,
        }
    };
    // The record goes into the volume while the new turn-record volume is made: independent.
    let record_now: &SessionRecord = record;
    let ((), stale) = tokio::try_join!(write_record, write_turn_summary(backend, record_now))?;
    // The turn is recorded: release the session's lock (the container) while the older
    // turn-record volumes go. A listing meanwhile finds the new one, the latest.
    let remove_stale = futures_util::future::join_all(stale.iter().map(|v| async move {
        if let Err(e) = backend.remove_volume(v).await {
            // Harmless: the latest turn-record volume wins, and the next turn removes it.
            tracing::warn!("could not remove an old turn-record volume: {e}");
        }
    }));
    let (removed, _) = tokio::join!(backend.remove_container(name, true), remove_stale);
    removed?;
    cache_record(record);
    Ok(())
}

/// Whether a turn's container is gone, or on its way (removed from outside: it no longer
/// has its volumes).
async fn being_removed(backend: &DockerBackend, name: &str) -> bool {
    match backend.inspect_container(name).await {
        Ok(None) => true,
        Ok(Some(c)) => matches!(c.state, ContainerState::Removing | ContainerState::Dead),
        Err(_) => false,
    }
}

/// Gives the turn's record files to the entrypoint, which waits for them after the CLI
/// ended, copies them into HOME and exits; returns whether it did. Cheaper than an upload
/// through Docker's archive API after the container stopped.
async fn hand_off(
    backend: &DockerBackend,
    name: &str,
    runtime_dir: &std::path::Path,
    files: &[TarFile<'_>],
) -> Result<bool> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;

    // The layout the entrypoint expects: session.json and turns/*, from ~/.caw-box.
    let base = runtime_dir.join(HANDOFF_DIR);
    for d in [base.clone(), base.join("turns")] {
        dirs::ensure_private_dir(&d)?;
        dirs::hand_to_agent(&d)?;
    }
    for f in files {
        let Some(rel) = f.path.strip_prefix(".caw-box/") else {
            return Ok(false);
        };
        let path = base.join(rel);
        dirs::write_private_unsynced(&path, f.contents)?;
        dirs::hand_to_agent(&path)?;
    }
    tracing::debug!("the record is in the runtime dir");
    // Non-blocking: no reader (an entrypoint that does not wait) is an error, not a hang.
    let fifo = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(runtime_dir.join(HANDOFF_FIFO));
    match fifo.and_then(|mut f| f.write_all(b"go\n")) {
        Ok(()) => {}
        Err(e) => {
            tracing::debug!("the entrypoint does not wait for the record: {e}");
            return Ok(false);
        }
    }
    backend.wait_container(name).await?;
    let copied = runtime_dir.join(HANDOFF_DONE).exists();
    tracing::debug!("the container exited; record copied: {copied}");
    Ok(copied)
}

/// Creates the session's turn-record volume for its latest turn; returns the names of the
/// older ones, for the caller to remove: the new one exists before the old ones go, so a
/// listing never finds none.
async fn write_turn_summary(
    backend: &DockerBackend,
    record: &SessionRecord,
) -> Result<Vec<String>> {
    let Some(last) = record.turns.last() else {
        return Ok(Vec::new());
    };
    let summary = TurnSummary {
        turn: last.turn,
        status: last.status,
        started_at: last.started_at,
        ended_at: last.started_at + last.duration_ms / 1000,
        resume_key: record.resume_key.clone(),
        key_confirmed: record.key_confirmed,
        cumulative_usage: record.last_cumulative_usage(),
        owner: record.owner,
        interactive: last.interactive,
    };
    let id = record.session_id;
    let fresh = TurnSummary::volume_name(id, last.turn);
    let filter = [
        format!("{}={id}", labels::SESSION),
        format!("{}={}", labels::ROLE, roles::TURN_RECORD),
    ];
    // A leftover of the same name goes first: Docker's create is idempotent by name and
    // would keep its stale labels.
    let (_, old) = tokio::join!(backend.remove_volume(&fresh), backend.list_volumes(&filter));
    backend
        .create_volume(&fresh, summary.labels(id, record.provider))
        .await?;
    Ok(old?
        .into_iter()
        .map(|v| v.name)
        .filter(|n| *n != fresh)
        .collect())
}

/// Caches a record on the host; failures only cost speed later, so they are not errors.
pub fn cache_record(record: &SessionRecord) {
    let Ok(dir) = dirs::sessions_dir() else {
        return;
    };
    let path = dir.join(format!("{}.json", record.session_id));
    if let Ok(json) = serde_json::to_vec_pretty(record) {
        if let Err(e) = dirs::write_private_unsynced(&path, &json) {
            tracing::debug!("could not cache the session record: {e}");
        }
    }
}

/// The exit status a finished turn maps to, as an error for `main` to print (or `None` on
/// success).
pub fn turn_error(result: &TurnResult) -> Option<Error> {
    let kind = result.status.error_kind()?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::ProviderKind;
    use crate::session::record::SessionSettings;

    fn record(network: &str) -> SessionRecord {
        SessionRecord {
            version: 1,
            session_id: uuid::Uuid::new_v4(),
            provider: ProviderKind::Codex,
            name: None,
            group: None,
            resume_key: String::new(),
            key_confirmed: false,
            owner: None,
            created_at: 0,
            settings: SessionSettings {
                image: "caw-box/codex:latest".into(),
                network: network.into(),
                workspace_mode: WorkspaceMode::None,
                memory: Some(512 << 20),
                cpus: Some(1.5),
                pids_limit: Some(300),
                ..Default::default()
            },
            turns: Vec::new(),
            turn_started: false,
        }
    }

    /// The turn as the backend gets it: the session's settings in caw-box's terms.
    #[test]
    fn the_turn_spec_carries_the_sessions_settings() {
        let dir = std::path::Path::new("/tmp");
        let r = record("team-gateway");
        let spec = turn_spec(&r, 3, "img", vec!["codex".into()], vec!["A=1".into()], dir).unwrap();
        assert_eq!(spec.network, NetworkPolicy::Named("team-gateway".into()));
        assert_eq!(
            spec.limits,
            Limits {
                memory: Some(512 << 20),
                cpus: Some(1.5),
                pids: 300
            }
        );
        assert_eq!(
            spec.home,
            MountSpec::volume(format!("caw-box-{}", r.session_id), AGENT_HOME)
        );
        assert_eq!(spec.runtime, MountSpec::host_dir("/tmp", RUNTIME_MOUNT));
        assert_eq!(spec.workspace, None, "workspace mode none");
        assert_eq!(spec.interactive, None);
        assert_eq!(spec.working_dir, WORKSPACE_DIR);
        let label = |k: &str| spec.labels.get(k).map(String::as_str);
        assert_eq!(label(labels::MANAGED), Some("true"));
        assert_eq!(label(labels::ROLE), Some(roles::TURN));
        assert_eq!(label(labels::TURN), Some("3"));
        assert_eq!(label(labels::PROVIDER), Some("codex"));
        let session = r.session_id.to_string();
        assert_eq!(label(labels::SESSION), Some(session.as_str()));
        let pid = std::process::id().to_string();
        assert_eq!(label(labels::DRIVER_PID), Some(pid.as_str()));
        for (setting, policy) in [
            ("open", NetworkPolicy::Default),
            ("none", NetworkPolicy::None),
            ("host", NetworkPolicy::Host),
        ] {
            let spec = turn_spec(&record(setting), 1, "img", vec![], vec![], dir).unwrap();
            assert_eq!(spec.network, policy, "{setting}");
        }
    }

    #[test]
    fn the_workspace_mount_follows_the_workspace_mode() {
        let dir = std::path::Path::new("/tmp");
        let mut r = record("none");
        r.settings.pids_limit = None;
        r.settings.workspace_mode = WorkspaceMode::Copy;
        let spec = turn_spec(&r, 1, "img", vec![], vec![], dir).unwrap();
        assert_eq!(spec.limits.pids, 512, "the default pids limit");
        assert_eq!(
            spec.workspace,
            Some(MountSpec::volume(
                format!("caw-box-{}-workspace", r.session_id),
                WORKSPACE_DIR
            ))
        );
        let host = tempfile::tempdir().unwrap();
        r.settings.workspace_mode = WorkspaceMode::Bind;
        r.settings.workspace = Some(host.path().display().to_string());
        let spec = turn_spec(&r, 1, "img", vec![], vec![], dir).unwrap();
        assert_eq!(
            spec.workspace,
            Some(MountSpec::host_dir(
                host.path().display().to_string(),
                WORKSPACE_DIR
            ))
        );
        // A bind workspace that is gone refuses the turn, with what to do.
        r.settings.workspace = Some(host.path().join("gone").display().to_string());
        let e = turn_spec(&r, 1, "img", vec![], vec![], dir).unwrap_err();
        assert_eq!(e.exit_code(), 3);
        assert!(e.message.contains("does not exist"), "{}", e.message);
    }

    #[test]
    fn a_driver_is_a_live_process_of_the_same_program() {
        assert!(is_a_caw_box(std::process::id()));
        let mut other = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = other.id();
        // Alive, but another program (a dead driver's pid, reused).
        assert!(!is_a_caw_box(pid));
        other.kill().unwrap();
        other.wait().unwrap();
        assert!(!is_a_caw_box(pid));
    }
}
