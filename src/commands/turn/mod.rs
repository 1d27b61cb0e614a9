//! `run`, `resume` (also detached, also for a whole group), `wait`, `stop`, `handle`, and
//! the hidden `__drive` that runs a detached turn.
//!
//! - `mod.rs`: `run`, `resume`, `wait`, `stop`, `handle`, and what a turn's flags become
//!   before anything is created
//! - `detach.rs`: `--detach` and the `__drive` process that runs such a turn
//! - `group.rs`: `resume --group`

use std::path::Path;
use std::time::Duration;

use crate::backend::{Backend, Engine};
use crate::cli::{OutputFormat, ResumeArgs, RunArgs, TurnArgs, WorkspaceModeArg};
use crate::client::{Client, NewSession, Session};
use crate::config::{Key, Layer, Resolved};
use crate::error::{Error, Result};
use crate::event::{Event, TurnResult};
use crate::output::{self, Printer};
use crate::provider::ProviderKind;
use crate::session::limits::{self, OnLimit};
use crate::session::models;
use crate::session::record::{self, SessionSettings, WorkspaceMode};
use crate::session::runner::{self, TurnOptions};
use crate::settings;

mod detach;
mod group;

pub use detach::detached_driver;
use detach::print_detached;
use group::resume_group;

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
        keep_warm_given: args.settings.keep_warm.is_some(),
    })
}

pub async fn run(mut args: RunArgs, quiet: bool, verbose: bool) -> Result<i32> {
    let printer = Printer::new(args.turn.output, quiet, verbose);
    let limit = limit_args(&args.turn)?;
    let NewTurn {
        client,
        mut session,
        options,
    } = new_session(&mut args, quiet, &|line| printer.progress(line)).await?;
    let mut printer = printer;
    session.settings_mut().park = limit.on_limit == OnLimit::Park;
    if args.turn.detach {
        let started = session.start_detached(&options).await;
        // This process's record never has a turn; Docker's says whether the driver ran one.
        if started.is_err() {
            session.discard_unless_recorded().await;
        }
        return started.map(|()| print_detached(&session, args.turn.output));
    }
    // Announced once the turn runs (its first event), so a refusal stays one line.
    let announce = format!(
        "started {} session {}",
        session.record().provider,
        session.id()
    );
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

/// A session ready for its first turn (or a resumed one ready for its next), and that turn's
/// options (the prompt aside for a caller that sends several): what `run` and `resume` do
/// before the turn, shared with the library's [`crate::embed`].
pub(crate) struct NewTurn {
    pub client: Client,
    pub session: Session,
    pub options: TurnOptions,
}

/// `run` up to its first turn: the flags, config files and variables resolved, the session's
/// checks and its state volume made; `progress` hears what it decided (a model discovered).
pub(crate) async fn new_session(
    args: &mut RunArgs,
    quiet: bool,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<NewTurn> {
    new_session_admitted(args, quiet, progress, &|_, _, _| Ok(())).await
}

/// What a caller with walls of its own (`caw-box mcp`) checks of a new session's settings and
/// its turn's variables, once the flags, config files (the workspace's `.caw-box.toml`
/// among them) and variables are resolved and before anything is made or run; it may also
/// add to the settings (a server's system prompt).
pub(crate) type Admit<'a> =
    dyn Fn(ProviderKind, &mut SessionSettings, &TurnOptions) -> Result<()> + Sync + 'a;

/// [`new_session`], with `admit` asked before anything is made.
pub(crate) async fn new_session_admitted(
    args: &mut RunArgs,
    quiet: bool,
    progress: &(dyn Fn(&str) + Sync),
    admit: &Admit<'_>,
) -> Result<NewTurn> {
    let Settled {
        client,
        provider,
        settings: session_settings,
        options,
        egress_news,
    } = settle_new(args, quiet, progress, admit).await?;
    let session = client
        .start_session(NewSession {
            provider,
            name: args.name.clone(),
            group: args.group.clone(),
            settings: session_settings,
        })
        .await?;
    if args.turn.settings.egress.is_none() {
        say_egress_default_once(egress_news && !quiet);
    }
    Ok(NewTurn {
        client,
        session,
        options,
    })
}

/// A new session's settings and first turn's options, as `run`'s flags, the config files
/// and variables settle them, checked, before anything is made (`caw-box pool start` makes
/// its boxes for exactly these).
pub(crate) struct Settled {
    pub client: Client,
    pub provider: ProviderKind,
    pub settings: SessionSettings,
    pub options: TurnOptions,
    egress_news: bool,
}

/// [`Settled`] of `run`'s flags `args`.
pub(crate) async fn settle_new(
    args: &mut RunArgs,
    quiet: bool,
    progress: &(dyn Fn(&str) + Sync),
    admit: &Admit<'_>,
) -> Result<Settled> {
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
    // (Looked at before anything is made; said once the session is.)
    let egress_news = args.turn.settings.egress.is_none() && data_dir_was_used();
    let mut session_settings = settings::new_session_settings(provider, &args.turn.settings)?;
    session_settings.prices = config.prices();
    session_settings.check_agent_config(provider)?;
    let mut options = turn_options(&args.turn, &config)?;
    add_config_mcp_env(&mut options, &config, &session_settings)?;
    if config.yes(Key::UserConfig) {
        options.user_files = user_config(provider, quiet)?;
    }
    admit(provider, &mut session_settings, &options)?;
    let client = Client::connect().await?;
    check_runtime(client.backend(), &session_settings).await?;
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
    warn_if_workspace_unwritable(&session_settings);
    if models::needs_discovery(provider, &session_settings) {
        let (model, how) =
            models::discover(client.backend(), provider, &session_settings, &options.env).await?;
        progress(&format!(
            "no --model given: using {model}, {how} (pass --model to choose)"
        ));
        session_settings.model = Some(model);
    }
    Ok(Settled {
        client,
        provider,
        settings: session_settings,
        options,
        egress_news,
    })
}

/// The marker of [`say_egress_default_once`] in the data directory.
const EGRESS_NEWS: &str = "egress-default-said";

/// Whether an older caw-box used the data directory and the change of the default egress
/// was not said yet.
fn data_dir_was_used() -> bool {
    crate::dirs::data_dir().is_ok_and(|dir| {
        !dir.join(EGRESS_NEWS).exists()
            && std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_some())
    })
}

/// Says once (`say`), on the first new session after the upgrade that made `balanced` the
/// default egress, what changed and how to go back; marks the data directory said.
fn say_egress_default_once(say: bool) {
    let Ok(dir) = crate::dirs::data_dir() else {
        return;
    };
    let marker = dir.join(EGRESS_NEWS);
    if marker.exists()
        || std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(&marker, b""))
            .is_err()
    {
        return;
    }
    if say {
        output::eprintln(
            "note: new sessions' egress is now `balanced` (was open): the agent reaches its model and the common package and source hosts, nothing else; `--egress open` (or `egress = \"open\"` in your config) for anything (docs/walls.md)",
        );
    }
}

pub async fn resume(args: ResumeArgs, quiet: bool, verbose: bool) -> Result<i32> {
    // Refused before anything is looked up, as on `run` (the sessions' settings come later).
    if let Some(endpoint) = &args.turn.settings.endpoint {
        settings::validate_endpoint(endpoint, "--endpoint")?;
    }
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
    let limit = limit_args(&args.turn)?;
    let mut printer = Printer::new(args.turn.output, quiet, verbose);
    let NewTurn {
        client,
        mut session,
        options,
    } = open_session(&target, &args.turn).await?;
    // `--on-limit` given: it replaces the session's remembered park (or its absence).
    if args.turn.on_limit.is_some() {
        session.settings_mut().park = limit.on_limit == OnLimit::Park;
    }
    if args.turn.detach {
        session.start_detached(&options).await?;
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

/// `resume` of one session up to its turn: the session `target` names opened, the flags
/// applied over its remembered settings (of the config files, only the turn-level keys).
pub(crate) async fn open_session(target: &str, turn: &TurnArgs) -> Result<NewTurn> {
    let config = Resolved::load(Layer::default(), turn.settings.workspace.as_deref())?;
    let mut options = turn_options(turn, &config)?;
    let client = Client::connect().await?;
    let mut session = client.open(target).await?;
    settings::apply_resume_overrides(session.settings_mut(), &turn.settings)?;
    // The person's prices as their config file says now, over those the session started with.
    session.settings_mut().prices.extend(config.prices());
    refuse_unsupported(client.backend(), session.settings_mut())?;
    check_runtime(client.backend(), session.settings_mut()).await?;
    warn_if_workspace_unwritable(session.settings_mut());
    add_config_mcp_env(&mut options, &config, session.settings_mut())?;
    Ok(NewTurn {
        client,
        session,
        options,
    })
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
    if matches!(on_limit, OnLimit::Wait | OnLimit::Fallback(_)) && args.detach {
        return Err(Error::usage(
            "--on-limit wait and fallback need a turn in the foreground, not --detach",
        )
        .with_hint("--on-limit park works detached: the session goes on when the limit resets"));
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
    mut on_event: impl FnMut(&Event) + Send,
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
        // A parking session's `send` parks and goes on (`Session::send`).
        OnLimit::Fail | OnLimit::Park => session.send(options, &mut on_event).await,
    }
}

/// The exit of a turn whose result was printed: its failure, if any, is already on stdout.
fn finish(result: &TurnResult) -> Result<i32> {
    match runner::turn_error(result) {
        None => Ok(0),
        Some(e) => Err(e.with_result_printed()),
    }
}

/// Settings a backend cannot honour are refused before anything is made, never ignored
/// (the backend says which and why).
fn refuse_unsupported(backend: &Engine, settings: &SessionSettings) -> Result<()> {
    backend.refuse_settings(&settings.network, settings.pids_limit)
}

/// `--runtime`: one the backend does not have is refused (exit 3, naming it) before
/// anything is created (`Client::start_session` asks too; Docker's answer is kept).
async fn check_runtime(backend: &Engine, settings: &SessionSettings) -> Result<()> {
    match &settings.runtime {
        Some(name) => backend.check_runtime(name).await,
        None => Ok(()),
    }
}

/// A bound workspace the agent could not write, said before its turn (which still runs:
/// it may only need to read).
pub(super) fn warn_if_workspace_unwritable(settings: &SessionSettings) {
    if let Some(w) = crate::session::owner::workspace_warning(settings) {
        output::eprintln(&format!("warning: {w}"));
    }
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
    if let crate::backend::HostDirs::Never(refusal) = &backend.capabilities().host_dirs {
        if asked == Some(WorkspaceModeArg::Bind) {
            return Err(refusal.clone());
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
        let engine = &backend.capabilities().words.engine;
        return Err(Error::usage(format!(
            "--workspace-mode bind: {engine} cannot mount {dir}: {reason}"
        ))
        .with_hint("use --workspace-mode copy (or auto), or run caw-box where the daemon sees the directory"));
    }
    settings.workspace_mode = WorkspaceMode::Copy;
    if !quiet {
        output::eprintln(&format!(
            "copying the workspace into the session: {} cannot mount {dir} ({reason})",
            backend.capabilities().words.engine
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
    let (id, stopped) = Client::connect().await?.stop(target_arg).await?;
    if !quiet {
        output::eprintln(&match stopped {
            crate::Stopped::Turn => format!("stopped the running turn of session {id}"),
            crate::Stopped::Warm => {
                format!("session {id} ran no turn: its warm container is removed")
            }
            crate::Stopped::Queued => {
                format!(
                    "the turn of session {id} that waited for a slot of its account will not run"
                )
            }
        });
    }
    Ok(0)
}

/// `caw-box warm TARGET [--for DURATION]`.
pub async fn warm(target: &str, for_: Option<&str>, quiet: bool) -> Result<i32> {
    let secs = for_
        .map(|d| settings::parse_duration(d, "--for").map(|d| d.as_secs().max(1)))
        .transpose()?;
    let client = Client::connect().await?;
    let mut session = client.open(target).await?;
    let made = session.warm(secs).await?;
    if !quiet {
        let id = session.id();
        output::eprintln(&if made {
            format!("session {id} is warm: its next turn runs in its container")
        } else {
            format!("session {id} was warm already")
        });
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
