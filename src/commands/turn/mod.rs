//! `run`, `resume` (also detached, also for a whole group), `wait`, `stop`, `handle`, and
//! the hidden `__drive` that runs a detached turn.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::backend::{Backend, Engine};
use crate::cli::{OutputFormat, ResumeArgs, RunArgs, TurnArgs, WorkspaceModeArg};
use crate::client::{Client, NewSession, Session};
use crate::config::{Key, Layer, Resolved};
use crate::error::{Error, ErrorKind, Result};
use crate::event::{Event, Status, TurnResult};
use crate::output::{self, Printer};
use crate::provider::ProviderKind;
use crate::session::limits::{self, OnLimit};
use crate::session::record::{self, labels, SessionSettings, WorkspaceMode};
use crate::session::runner::{self, TurnOptions};
use crate::session::{models, target};
use crate::settings;

/// The secrets of a config file's MCP servers that the session's own servers take, added to
/// a turn's variables unless a flag gave them (see [`Resolved::mcp_env_for`]).
fn add_config_mcp_env(
    options: &mut TurnOptions,
    config: &Resolved,
    settings: &SessionSettings,
) -> Result<()> {
    for (k, v) in config.mcp_env_for(&settings.mcp)? {
        if !options.env.iter().any(|(have, _)| *have == k) {
            options.env.push((k, v));
        }
    }
    Ok(())
}

/// Everything about a turn that can be checked before Docker is touched; `config` gives the
/// turn-level keys (`env_pass`, `labels`).
fn turn_options(args: &TurnArgs, config: &Resolved) -> Result<TurnOptions> {
    let prompt = settings::resolve_prompt(args)?;
    let interactive = prompt.is_none();
    if interactive && args.detach {
        return Err(Error::usage(
            "--detach needs a PROMPT: an interactive session runs in this terminal",
        ));
    }
    let mut env = settings::resolve_env(&args.env)?;
    env.extend(settings::resolve_mcp_env(&args.settings)?);
    settings::add_passed_env(&mut env, &config.env_pass());
    record::set_extra_labels(config.labels());
    let timeout = args
        .settings
        .timeout
        .as_deref()
        .map(|t| settings::parse_duration(t, "--timeout"))
        .transpose()?;
    Ok(TurnOptions {
        prompt: prompt.unwrap_or_default(),
        env,
        timeout,
        interactive,
        // From the session's settings (`--idle-timeout`, `--connect-timeout` are remembered).
        idle_timeout: None,
        connect_timeout: None,
        user_files: Vec::new(),
        inject_credentials: args.credentials == Some(crate::cli::CredentialsArg::Inject),
    })
}

pub async fn run(mut args: RunArgs, quiet: bool, verbose: bool) -> Result<i32> {
    let mut flags = Layer::from_flags(
        args.provider.as_deref(),
        args.group.as_deref(),
        &args.turn.settings,
    );
    flags.user_config_flag(args.user_config);
    let config = Resolved::load(flags, args.turn.settings.workspace.as_deref())?;
    let provider: ProviderKind = config
        .str(Key::Provider)
        .ok_or_else(|| {
            Error::usage("say which provider: --provider P").with_hint(
                "claude_code, codex, opencode or gemini; or set `provider` in a config file (`caw-box config show`)",
            )
        })?
        .parse()?;
    if let Some(name) = &args.name {
        settings::validate_name(name, "--name")?;
    }
    args.group = config.str(Key::Group);
    if let Some(group) = &args.group {
        settings::validate_name(group, "--group")?;
    }
    args.turn.settings = config.settings_args(&args.turn.settings)?;
    let mut session_settings = settings::new_session_settings(provider, &args.turn.settings)?;
    session_settings.check_agent_config(provider)?;
    let mut options = turn_options(&args.turn, &config)?;
    add_config_mcp_env(&mut options, &config, &session_settings)?;
    let limit = limit_args(&args.turn)?;
    if config.yes(Key::UserConfig) {
        options.user_files = user_config(provider, quiet)?;
    }
    let mut printer = Printer::new(args.turn.output, quiet, verbose);

    let client = Client::connect().await?;
    if session_settings.workspace_mode == WorkspaceMode::Bind {
        place_workspace(
            client.backend(),
            &mut session_settings,
            args.turn.settings.workspace_mode,
            quiet,
        )
        .await?;
    }
    refuse_unsupported(client.backend(), &session_settings)?;
    if models::needs_discovery(provider, &session_settings) {
        let (model, how) =
            models::discover(client.backend(), provider, &session_settings, &options.env).await?;
        printer.progress(&format!(
            "no --model given: using {model}, {how} (pass --model to choose)"
        ));
        session_settings.model = Some(model);
    }
    let mut session = client
        .start_session(NewSession {
            provider,
            name: args.name.clone(),
            group: args.group.clone(),
            settings: session_settings,
        })
        .await?;
    if args.turn.detach {
        let started = detach(client.backend(), &session, &options).await;
        // This process's record never has a turn; Docker's says whether the driver ran one.
        if started.is_err() && !turn_recorded(client.backend(), &session).await {
            let _ = session.discard_if_unused().await;
        }
        return started.map(|()| print_detached(&session, args.turn.output));
    }
    // Announced once the turn runs (its first event), so a refusal stays one line.
    let announce = format!("started {provider} session {}", session.id());
    let mut announced = false;
    let on_event = |e: &Event| {
        if !std::mem::replace(&mut announced, true) {
            printer.progress(&announce);
        }
        printer.event(e)
    };
    match send(
        &client,
        &mut session,
        options,
        &limit,
        &printer_progress(quiet),
        on_event,
    )
    .await
    {
        Ok(result) => finish(&result),
        Err(e) => {
            // The first turn never ran: take the session back, so nothing half-made stays.
            let _ = session.discard_if_unused().await;
            Err(e)
        }
    }
}

pub async fn resume(args: ResumeArgs, quiet: bool, verbose: bool) -> Result<i32> {
    if let Some(group) = args.group.clone() {
        if args.turn.on_limit.is_some() || args.turn.max_wait.is_some() {
            return Err(Error::usage(
                "--on-limit and --max-wait take one session, not a --group",
            ));
        }
        return resume_group(args, &group, quiet).await;
    }
    let target = args.target.clone().ok_or_else(|| {
        Error::usage("say which session to resume: TARGET (or --group G)")
            .with_hint("`caw-box ls` lists sessions")
    })?;
    let config = Resolved::load(Layer::default(), args.turn.settings.workspace.as_deref())?;
    let mut options = turn_options(&args.turn, &config)?;
    let limit = limit_args(&args.turn)?;
    let mut printer = Printer::new(args.turn.output, quiet, verbose);
    let client = Client::connect().await?;
    let mut session = client.open(&target).await?;
    settings::apply_resume_overrides(session.settings_mut(), &args.turn.settings)?;
    refuse_unsupported(client.backend(), session.settings_mut())?;
    add_config_mcp_env(&mut options, &config, session.settings_mut())?;
    if args.turn.detach {
        detach(client.backend(), &session, &options).await?;
        return Ok(print_detached(&session, args.turn.output));
    }
    let announce = format!(
        "resuming {} session {} (turn {})",
        session.record().provider,
        session.id(),
        session.record().next_turn()
    );
    let mut announced = false;
    let on_event = |e: &Event| {
        if !std::mem::replace(&mut announced, true) {
            printer.progress(&announce);
        }
        printer.event(e)
    };
    let result = send(
        &client,
        &mut session,
        options,
        &limit,
        &printer_progress(quiet),
        on_event,
    )
    .await?;
    finish(&result)
}

/// `--on-limit` and `--max-wait`, checked before anything runs.
#[derive(Debug)]
struct LimitArgs {
    on_limit: OnLimit,
    max_wait: Duration,
}

fn limit_args(args: &TurnArgs) -> Result<LimitArgs> {
    let on_limit = match &args.on_limit {
        Some(s) => s.parse::<OnLimit>()?,
        None => OnLimit::Fail,
    };
    let max_wait = match &args.max_wait {
        Some(s) => settings::parse_duration(s, "--max-wait")?,
        None => limits::DEFAULT_MAX_WAIT,
    };
    if args.max_wait.is_some() && on_limit != OnLimit::Wait {
        return Err(Error::usage("--max-wait needs --on-limit wait"));
    }
    if on_limit != OnLimit::Fail && args.detach {
        return Err(Error::usage(
            "--on-limit needs a turn in the foreground, not --detach",
        ));
    }
    Ok(LimitArgs { on_limit, max_wait })
}

/// A progress line on stderr (unless `--quiet`).
fn printer_progress(quiet: bool) -> impl Fn(&str) {
    move |line: &str| {
        if !quiet {
            output::eprintln(line);
        }
    }
}

/// One turn as `--on-limit` says.
async fn send(
    client: &Client,
    session: &mut Session,
    options: TurnOptions,
    limit: &LimitArgs,
    progress: &impl Fn(&str),
    mut on_event: impl FnMut(&Event),
) -> Result<TurnResult> {
    match &limit.on_limit {
        OnLimit::Wait => {
            session
                .send_waiting(options, limit.max_wait, progress, on_event)
                .await
        }
        OnLimit::Fallback(providers) => {
            client
                .send_falling_back(session, options, providers, progress, on_event)
                .await
        }
        OnLimit::Fail => session.send(options, &mut on_event).await,
    }
}

/// `resume --group G PROMPT`: every session of the group, in parallel, each with its own
/// vendor resume; one result per session.
async fn resume_group(args: ResumeArgs, group: &str, quiet: bool) -> Result<i32> {
    let mut turn_args = args.turn.clone();
    match (&args.target, &turn_args.prompt) {
        (Some(_), Some(_)) => {
            return Err(Error::usage(
                "with --group, give only the prompt (the group names the sessions)",
            ))
        }
        (Some(p), None) => turn_args.prompt = Some(p.clone()),
        _ => {}
    }
    if turn_args.detach {
        return Err(Error::usage("--detach does not combine with --group"));
    }
    if turn_args.prompt.is_none() && turn_args.prompt_file.is_none() {
        return Err(Error::usage(
            "--group needs a PROMPT: a group's sessions cannot share one terminal",
        )
        .with_hint("resume one session in its TUI: `caw-box resume TARGET`"));
    }
    let config = Resolved::load(Layer::default(), turn_args.settings.workspace.as_deref())?;
    let options = turn_options(&turn_args, &config)?;
    let client = Client::connect().await?;
    let members: Vec<_> = target::list_sessions(client.backend())
        .await?
        .into_iter()
        .filter(|v| v.facts.group.as_deref() == Some(group))
        .collect();
    if members.is_empty() {
        return Err(Error::usage(format!("no session is in group '{group}'"))
            .with_hint("start sessions with `caw-box run --group G ...`"));
    }
    let mut sessions = Vec::new();
    for view in &members {
        let mut session = client.open(&view.facts.session_id.to_string()).await?;
        settings::apply_resume_overrides(session.settings_mut(), &turn_args.settings)?;
        refuse_unsupported(client.backend(), session.settings_mut())?;
        sessions.push(session);
    }
    if !quiet && turn_args.output == OutputFormat::Text {
        output::eprintln(&format!(
            "resuming {} sessions of group {group}",
            sessions.len()
        ));
    }
    let mut each = Vec::new();
    for s in &mut sessions {
        let mut options = options.clone();
        add_config_mcp_env(&mut options, &config, s.settings_mut())?;
        each.push(options);
    }
    let runs = sessions
        .iter_mut()
        .zip(each)
        .map(|(s, options)| async move {
            let id = s.id();
            (id, s.send(options, |_| {}).await)
        });
    let outcomes = futures_util::future::join_all(runs).await;
    let mut exit = 0;
    let mut failed = 0;
    let mut results = Vec::new();
    for (id, outcome) in outcomes {
        match outcome {
            Ok(r) => {
                if r.exit_code != 0 {
                    failed += 1;
                }
                if exit == 0 {
                    exit = r.exit_code;
                }
                results.push(r);
            }
            Err(e) => {
                // A session whose turn never ran (busy, image missing) failed too.
                failed += 1;
                if exit == 0 {
                    exit = e.exit_code();
                }
                output::eprintln(&format!("caw-box: error: session {id}: {e}"));
            }
        }
    }
    match turn_args.output {
        OutputFormat::Json => output::print_json(&results),
        OutputFormat::StreamJson => {
            for r in &results {
                if let Ok(json) = serde_json::to_string(&Event::Result { result: r.clone() }) {
                    output::println(&json);
                }
            }
        }
        OutputFormat::Text => {
            for r in &results {
                let who = r
                    .name
                    .clone()
                    .unwrap_or_else(|| r.session_id[..8].to_string());
                output::println(&format!(
                    "{who} ({}): {}: {}",
                    r.provider,
                    r.status,
                    r.result.trim()
                ));
            }
        }
    }
    // Not silenced by -q ("only errors on stderr"): it is this exit's one error line.
    if exit != 0 {
        output::eprintln(&format!(
            "caw-box: error: {failed} of {} sessions of group {group} did not succeed",
            members.len()
        ));
    }
    Ok(exit)
}

/// The exit of a turn whose result was printed: its failure, if any, is already on stdout.
fn finish(result: &TurnResult) -> Result<i32> {
    match runner::turn_error(result) {
        None => Ok(0),
        Some(e) => Err(e.with_result_printed()),
    }
}

/// Settings a backend cannot honour are refused before anything is made, never ignored:
/// Kubernetes has no per-pod process limit (a node's kubelet sets `podPidsLimit` for all
/// its pods, or none); and a pod cannot be put on a Docker network or the host's
/// (`--allow-host` is held inside the turn's pod: firewall rules in its network namespace
/// and a proxy sidecar; `--network none` is refused for every backend, by the settings).
fn refuse_unsupported(backend: &Engine, settings: &SessionSettings) -> Result<()> {
    let Engine::Kubernetes(_) = backend else {
        return Ok(());
    };
    if !matches!(settings.network.as_str(), "open" | "") {
        return Err(Error::usage(format!(
            "--network {} is not available with the kubernetes backend: pods use the cluster's network",
            settings.network
        ))
        .with_hint("drop --network (and `network` from config files); --allow-host holds a turn's egress to a list"));
    }
    if let Some(limit) = settings.pids_limit {
        return Err(Error::usage(format!(
            "--pids-limit {limit} is not available with the kubernetes backend: a pod spec has no process limit (a node's kubelet sets one for all its pods, `podPidsLimit`)"
        ))
        .with_hint("drop --pids-limit (and `pids_limit` from config files); ask the cluster's admin for a kubelet podPidsLimit"));
    }
    Ok(())
}

/// `--workspace-mode auto` (the default): bind when the daemon sees the directory, else
/// copy, saying so once; an explicit `bind` it cannot see is a usage error.
async fn place_workspace(
    backend: &Engine,
    settings: &mut SessionSettings,
    asked: Option<WorkspaceModeArg>,
    quiet: bool,
) -> Result<()> {
    let Some(dir) = settings.workspace.clone() else {
        return Ok(());
    };
    if let Engine::Kubernetes(_) = backend {
        // A cluster has no host directories: the workspace is always copied in.
        if asked == Some(WorkspaceModeArg::Bind) {
            return Err(Error::usage(
                "--workspace-mode bind is not available with the kubernetes backend: a pod cannot mount a directory of this host",
            )
            .with_hint("use --workspace-mode copy (the default there) or none"));
        }
        if settings.workspace_mode == WorkspaceMode::Bind {
            settings.workspace_mode = WorkspaceMode::Copy;
        }
        return Ok(());
    }
    let Err(reason) =
        crate::session::workspace::daemon_sees(backend, &settings.image, Path::new(&dir)).await
    else {
        return Ok(());
    };
    if asked == Some(WorkspaceModeArg::Bind) {
        return Err(Error::usage(format!(
            "--workspace-mode bind: the Docker daemon cannot mount {dir}: {reason}"
        ))
        .with_hint("use --workspace-mode copy (or auto), or run caw-box where the daemon sees the directory"));
    }
    settings.workspace_mode = WorkspaceMode::Copy;
    if !quiet {
        output::eprintln(&format!(
            "copying the workspace into the session: the Docker daemon cannot mount {dir} ({reason})"
        ));
    }
    Ok(())
}

/// `--user-config`: the user's own setup of `provider`'s CLI, for the session's HOME.
fn user_config(provider: ProviderKind, quiet: bool) -> Result<Vec<crate::provider::HomeFile>> {
    let secrets = crate::auth::known_secrets(provider);
    let found = crate::auth::user_config::gather(provider, &|v| std::env::var(v).ok(), &secrets)?;
    for w in &found.warnings {
        output::eprintln(&format!("warning: --user-config: {w}"));
    }
    if !quiet {
        if found.copied.is_empty() {
            output::eprintln(&format!(
                "--user-config: no {provider} setup found on this host"
            ));
        }
        for line in &found.copied {
            output::eprintln(&format!("--user-config: {line}"));
        }
    }
    Ok(found.files)
}

/// What a detached turn's driver process is told, on its stdin (it may hold secrets).
#[derive(Debug, Serialize, Deserialize)]
struct DriveJob {
    session_id: String,
    settings: SessionSettings,
    prompt: String,
    env: Vec<(String, String)>,
    /// Milliseconds, not seconds: `--timeout 500ms` must not become zero.
    timeout_ms: Option<u64>,
    #[serde(default)]
    user_files: Vec<crate::provider::HomeFile>,
    #[serde(default)]
    inject_credentials: bool,
}

impl DriveJob {
    fn new(session_id: String, settings: SessionSettings, options: &TurnOptions) -> Self {
        DriveJob {
            session_id,
            settings,
            prompt: options.prompt.clone(),
            env: options.env.clone(),
            timeout_ms: options
                .timeout
                .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            user_files: options.user_files.clone(),
            inject_credentials: options.inject_credentials,
        }
    }

    /// The turn the driver runs (the job's settings and session are applied separately).
    fn turn_options(&self) -> TurnOptions {
        TurnOptions {
            prompt: self.prompt.clone(),
            env: self.env.clone(),
            timeout: self.timeout_ms.map(Duration::from_millis),
            interactive: false,
            idle_timeout: None,
            connect_timeout: None,
            user_files: self.user_files.clone(),
            inject_credentials: self.inject_credentials,
        }
    }
}

/// Starts the turn in a background `caw-box __drive` process that outlives this one, and
/// returns once its container runs (or with the error that kept it from starting).
async fn detach(backend: &Engine, session: &Session, options: &TurnOptions) -> Result<()> {
    let job = DriveJob::new(
        session.id().to_string(),
        session.record().settings.clone(),
        options,
    );
    let exe = std::env::current_exe()
        .map_err(|e| Error::environment(format!("cannot find caw-box's own executable: {e}")))?;
    let mut child = {
        use std::os::unix::process::CommandExt;
        Command::new(exe)
            .args(["-q", "__drive"])
            // The labels config resolved for this turn's objects.
            .env(
                "CAW_BOX_LABELS",
                record::render_labels(&record::extra_labels()),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            // Its own process group: a Ctrl-C meant for this terminal does not reach it.
            .process_group(0)
            .spawn()
            .map_err(|e| Error::environment(format!("cannot start the background turn: {e}")))?
    };
    if let Some(mut stdin) = child.stdin.take() {
        let json = serde_json::to_vec(&job).expect("jobs serialize");
        stdin.write_all(&json).map_err(|e| {
            Error::environment(format!("cannot hand the turn to the background: {e}"))
        })?;
    }
    let container = runner::container_name(session.record());
    let turn = session.record().next_turn().to_string();
    let driver_pid = child.id().to_string();
    loop {
        if let Some(status) = child
            .try_wait()
            .map_err(|e| Error::environment(format!("lost the background turn: {e}")))?
        {
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = pipe.read_to_string(&mut stderr);
            }
            return driver_ended(status.code(), &stderr);
        }
        // Our turn's container, not any turn N: a turn N already running (this session is
        // busy) carries the same turn label, but another driver's pid.
        let started = backend
            .inspect_container(&container)
            .await?
            .filter(|c| {
                c.label(labels::TURN) == Some(turn.as_str())
                    && c.label(labels::DRIVER_PID) == Some(driver_pid.as_str())
            })
            .is_some_and(|c| c.running() || c.finished);
        if started {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What a detached turn's driver said by exiting before its container was seen running:
/// `Ok` if it ran the turn (a quick one, or one that failed fast), else why it could not.
///
/// The exit code alone cannot tell: 1, 4, 5, 124 and 130 are both turn statuses and error
/// kinds (exit 4 is an `auth_error` turn, or no credentials at all). What tells is how
/// `__drive` ends: after a turn it prints nothing (it runs with `-q` and returns the
/// turn's exit code), while an error is always its last stderr line, `caw-box: error: …`.
fn driver_ended(code: Option<i32>, stderr: &str) -> Result<()> {
    let last = stderr
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    let error = last.strip_prefix("caw-box: error: ");
    let turn_status_code = matches!(code, Some(0 | 1 | 4 | 5 | 124 | 130));
    if error.is_none() && turn_status_code {
        // The turn ran and is recorded: `wait` reports how it ended.
        return Ok(());
    }
    let kind = code
        .and_then(ErrorKind::from_exit_code)
        .unwrap_or(ErrorKind::Environment);
    let message = match (error, code) {
        (Some(line), _) => line.to_string(),
        // Not one of ours (a panic, say): its own last words say the most.
        _ if !last.is_empty() => last.to_string(),
        (None, Some(c)) => {
            format!("the background turn ended before it started (its caw-box exited with {c})")
        }
        (None, None) => {
            "the background turn ended before it started (its caw-box was killed)".to_string()
        }
    };
    Err(Error::new(kind, message))
}

/// Whether Docker holds a recorded turn of `session`; when it cannot tell, yes (so nothing
/// is deleted on a guess).
async fn turn_recorded(backend: &Engine, session: &Session) -> bool {
    match target::resolve_view(backend, &session.id().to_string()).await {
        Ok(view) => view.last.is_some(),
        Err(_) => true,
    }
}

fn print_detached(session: &Session, format: OutputFormat) -> i32 {
    let record = session.record();
    match format {
        OutputFormat::Text => output::println(&record.session_id.to_string()),
        _ => {
            let result = TurnResult {
                session_id: record.session_id.to_string(),
                name: record.name.clone(),
                provider: record.provider,
                turn: record.next_turn(),
                status: Status::Running,
                result: String::new(),
                resume_handle: session.handle().to_json(),
                usage: Default::default(),
                duration_ms: 0,
                exit_code: 0,
            };
            if format == OutputFormat::Json {
                output::print_json_line(&result);
            } else {
                output::print_json_line(&Event::Result { result });
            }
        }
    }
    0
}

/// `__drive`: runs one detached turn to its end, recording it in the session's volume.
pub async fn detached_driver() -> Result<i32> {
    let mut input = Vec::new();
    std::io::stdin()
        .read_to_end(&mut input)
        .map_err(|e| Error::usage(format!("__drive: cannot read the job: {e}")))?;
    let job: DriveJob = serde_json::from_slice(&input)
        .map_err(|e| Error::usage(format!("__drive: malformed job: {e}")))?;
    let client = Client::connect().await?;
    let mut session = client.open(&job.session_id).await?;
    let options = job.turn_options();
    *session.settings_mut() = job.settings;
    let result = session.send(options, |_| {}).await?;
    Ok(result.exit_code)
}

/// `wait`: blocks until the session's running turn ended and was recorded, then prints its
/// result like a foreground turn, with the same exit code.
pub async fn wait(target_arg: &str, format: OutputFormat, quiet: bool) -> Result<i32> {
    let result = Client::connect().await?.wait(target_arg).await?;
    let mut printer = Printer::new(format, quiet, false);
    if format == OutputFormat::Text {
        output::println(result.result.trim_end());
    }
    printer.event(&Event::Result {
        result: result.clone(),
    });
    finish(&result)
}

/// `stop`: ends the session's running turn; the session stays resumable.
pub async fn stop(target_arg: &str, quiet: bool) -> Result<i32> {
    let id = Client::connect().await?.stop(target_arg).await?;
    if !quiet {
        output::eprintln(&format!("stopped the running turn of session {id}"));
    }
    Ok(0)
}

pub async fn handle(target: &str) -> Result<i32> {
    let client = Client::connect().await?;
    let session = client.open(target).await?;
    if session.record().resume_key.is_empty() {
        return Err(crate::Error::usage(format!(
            "session {} has no vendor conversation yet (its first turn never started one)",
            session.id()
        ))
        .with_hint(format!(
            "run a turn: `caw-box resume {} PROMPT`",
            session.id()
        )));
    }
    output::println(&session.handle().to_json());
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(timeout: Option<Duration>) -> TurnOptions {
        TurnOptions {
            prompt: "hi".into(),
            env: vec![("K".into(), "V".into())],
            timeout,
            interactive: false,
            ..Default::default()
        }
    }

    /// What `__drive` reads back from what `--detach` wrote.
    fn through_the_pipe(options: &TurnOptions) -> TurnOptions {
        let job = DriveJob::new("id".into(), SessionSettings::default(), options);
        let json = serde_json::to_vec(&job).unwrap();
        serde_json::from_slice::<DriveJob>(&json)
            .unwrap()
            .turn_options()
    }

    #[test]
    fn a_driver_that_ran_its_turn_is_told_from_one_that_could_not() {
        // A turn that ran and ended (fast) before its container was seen: started.
        for code in [0, 1, 4, 5, 124, 130] {
            assert!(driver_ended(Some(code), "").is_ok(), "{code}");
        }
        // Log lines of a turn that ran are not an error.
        assert!(driver_ended(Some(1), "ERROR caw_box::session: cli crashed\n").is_ok());
        // The driver's own error line: refused, with its message and exit code.
        let busy = driver_ended(
            Some(2),
            "caw-box: error: session x is busy: turn 3 is running right now\n",
        )
        .unwrap_err();
        assert_eq!(busy.exit_code(), 2);
        assert_eq!(
            busy.message,
            "session x is busy: turn 3 is running right now"
        );
        // Exit 4 with an error line is missing credentials, not an auth_error turn.
        let creds =
            driver_ended(Some(4), "caw-box: error: no credentials for codex\n").unwrap_err();
        assert_eq!(creds.exit_code(), 4);
        // Anything else never started the turn.
        assert_eq!(driver_ended(Some(3), "").unwrap_err().exit_code(), 3);
        assert_eq!(driver_ended(None, "").unwrap_err().exit_code(), 3);
        let panic = driver_ended(Some(101), "thread 'main' panicked at x\n").unwrap_err();
        assert_eq!(panic.exit_code(), 3);
        assert!(panic.message.contains("panicked"), "{}", panic.message);
    }

    #[test]
    fn a_detached_turn_keeps_a_sub_second_timeout() {
        for t in [
            Duration::from_millis(500),
            Duration::from_millis(1500),
            Duration::from_secs(1800),
        ] {
            assert_eq!(through_the_pipe(&options(Some(t))).timeout, Some(t));
        }
        assert_eq!(through_the_pipe(&options(None)).timeout, None);
        let back = through_the_pipe(&options(None));
        assert_eq!(back.prompt, "hi");
        assert_eq!(back.env, vec![("K".to_string(), "V".to_string())]);
        assert!(!back.interactive);
    }
}
