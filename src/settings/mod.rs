//! Resolves command-line arguments (plus environment and stdin) into the settings and turn
//! options the commands act on. Every bad value is caught here, before anything is created.

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use crate::cli::{SettingsArgs, TurnArgs, WorkspaceModeArg};
pub use crate::endpoint::{endpoint_host, validate_endpoint};
use crate::error::{Error, Result};
use crate::provider::ProviderKind;
pub use crate::session::expand_allow_hosts;
use crate::session::record::{EgressPolicy, SessionSettings, WorkspaceMode};
use crate::session::runner::{check_prompt_size, MAX_TURN_PROMPT_BYTES};

mod limits;

use limits::apply_limits;
pub use limits::{check_cpus, check_max_cost, check_per_account, check_pids_limit, parse_memory};

/// The prompt of a turn: given, or absent (an interactive session). One over
/// [`MAX_TURN_PROMPT_BYTES`] is refused here, before anything is created (a file or stdin is read
/// no further than the cap, and only measured beyond it).
pub fn resolve_prompt(args: &TurnArgs) -> Result<Option<String>> {
    let prompt = if let Some(file) = &args.prompt_file {
        let cannot = |e: std::io::Error| {
            Error::usage(format!(
                "cannot read the prompt file '{}': {e}",
                file.display()
            ))
        };
        Some(read_prompt(std::fs::File::open(file).map_err(cannot)?).map_err(cannot)??)
    } else if args.prompt.as_deref() == Some("-") {
        Some(
            read_prompt(std::io::stdin().lock())
                .map_err(|e| Error::usage(format!("cannot read the prompt from stdin: {e}")))??,
        )
    } else {
        args.prompt.clone()
    };
    if let Some(p) = &prompt {
        check_prompt_size(p.len())?;
    }
    match prompt {
        Some(p) if p.trim().is_empty() => Err(Error::usage("the prompt is empty")
            .with_hint("pass the prompt as an argument, `-` for stdin, or --prompt-file FILE")),
        Some(p) => Ok(Some(p)),
        // No prompt: the vendor's TUI, which needs a terminal on both ends.
        None if crate::terminal::is_interactive() => Ok(None),
        None => Err(
            Error::usage("no prompt given, and no terminal for an interactive session")
                .with_hint("pass the prompt as an argument, `-` for stdin, or --prompt-file FILE"),
        ),
    }
}

/// A prompt from `input`, at most [`MAX_TURN_PROMPT_BYTES`] of it kept: a longer one is the cap's
/// refusal, with its whole size (the rest is read and counted, not kept). The outer error is
/// reading's, the inner the prompt's (over the cap, not UTF-8).
fn read_prompt(mut input: impl Read) -> std::io::Result<Result<String>> {
    let mut bytes = Vec::new();
    let cap = MAX_TURN_PROMPT_BYTES as u64;
    (&mut input).take(cap + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        let rest = std::io::copy(&mut input, &mut std::io::sink())?;
        let len = usize::try_from(bytes.len() as u64 + rest).unwrap_or(usize::MAX);
        return Ok(check_prompt_size(len).map(|()| String::new()));
    }
    Ok(String::from_utf8(bytes).map_err(|_| {
        Error::usage("the prompt is not UTF-8 text").with_hint("give the prompt as UTF-8 text")
    }))
}

/// `--env K=V` / `--env K` (the host's value) into pairs.
///
/// Errors name the argument by its position, never by its text: a mistyped `--env` is often
/// a secret (`--env $API_KEY` instead of `--env API_KEY`), and secrets stay out of errors.
/// The secret values of `--mcp-env` and `--mcp-header`, as the variables that carry them to
/// the CLI (whose MCP config names them): they travel like `--env` values.
pub fn resolve_mcp_env(args: &SettingsArgs) -> Result<Vec<(String, String)>> {
    let mut env = Vec::new();
    for value in &args.mcp_env {
        let (_, key, secret) = crate::agent_config::parse_mcp_secret(value, "--mcp-env")?;
        validate_env_name(&key, "--mcp-env")?;
        env.push((key, secret));
    }
    for value in &args.mcp_header {
        let (server, header, secret) =
            crate::agent_config::parse_mcp_secret(value, "--mcp-header")?;
        env.push((
            crate::agent_config::mcp_header_var(&server, &header),
            secret,
        ));
    }
    Ok(env)
}

pub fn resolve_env(values: &[String]) -> Result<Vec<(String, String)>> {
    values
        .iter()
        .enumerate()
        .map(|(i, kv)| {
            let which = format!("--env #{} (of {})", i + 1, values.len());
            match kv.split_once('=') {
                Some((k, v)) => {
                    validate_env_name(k, &which)?;
                    Ok((k.to_string(), v.to_string()))
                }
                None => {
                    validate_env_name(kv, &which)?;
                    let v = std::env::var(kv).map_err(|_| {
                        Error::usage(format!(
                            "{which} names a variable that is not set in this environment"
                        ))
                        .with_hint("set it, or pass --env NAME=VALUE")
                    })?;
                    Ok((kv.to_string(), v))
                }
            }
        })
        .collect()
}

/// Adds the host's value of each variable `env_pass` names (config files) that is set and
/// not already given with `--env`; an unset one is skipped, as a user file may name the keys
/// of several vendors.
pub fn add_passed_env(env: &mut Vec<(String, String)>, names: &[String]) {
    for name in names {
        if env.iter().any(|(k, _)| k == name) {
            continue;
        }
        match std::env::var(name) {
            Ok(v) => env.push((name.clone(), v)),
            Err(_) => tracing::debug!("env_pass: {name} is not set here; not passed"),
        }
    }
}

pub fn validate_env_name(k: &str, which: &str) -> Result<()> {
    let ok = !k.is_empty()
        && !k.starts_with(|c: char| c.is_ascii_digit())
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(Error::usage(format!(
            "{which} is not NAME=VALUE or NAME: a name is letters, digits and '_', not starting with a digit (the value is not shown: it may be a secret)"
        )))
    }
}

/// The longest duration any flag takes: 100 years. Longer ones overflow a deadline
/// (`now + d`) and mean "never" anyway.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 31_557_600);

pub fn parse_duration(s: &str, flag: &str) -> Result<Duration> {
    let d = humantime::parse_duration(s).map_err(|e| {
        Error::usage(format!("{flag} '{s}': {e}"))
            .with_hint("use a duration such as 90s, 30m or 2h")
    })?;
    if d.is_zero() {
        return Err(Error::usage(format!("{flag} must be longer than zero")));
    }
    if d > MAX_DURATION {
        return Err(Error::usage(format!(
            "{flag} '{s}' is longer than the maximum of 100 years"
        )));
    }
    Ok(d)
}

/// A limit that can be switched off: a duration in whole seconds (at least 1), or 0 for
/// `off`.
pub fn parse_limit(s: &str, flag: &str) -> Result<u64> {
    if matches!(s.trim(), "off" | "none" | "0") {
        return Ok(0);
    }
    Ok(parse_duration(s, flag)?.as_secs().max(1))
}

/// `HOST[:PORT]`, `*.example.com[:PORT]` or `@provider`.
pub fn validate_allow_host(host: &str, what: &str) -> Result<()> {
    if host == "@provider" {
        return Ok(());
    }
    let (name, port) = match host.rsplit_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (host, None),
    };
    // Dot-separated labels (none empty), with at most one leading `*.`; the port in plain
    // digits, as the egress proxy reads it (`+80` would parse here and not there).
    let name_ok = name.len() <= 253
        && name
            .strip_prefix("*.")
            .unwrap_or(name)
            .split('.')
            .all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    let port_ok = port.is_none_or(|p| {
        p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().is_ok_and(|n| n > 0)
    });
    if name_ok && port_ok {
        Ok(())
    } else {
        Err(Error::usage(format!("{what} '{host}' is not HOST[:PORT]"))
            .with_hint("e.g. --allow-host api.example.com:443, --allow-host '*.example.com' or --allow-host @provider"))
    }
}

/// Session names: short, shell-friendly, and never confusable with an id or a handle.
pub fn validate_name(name: &str, flag: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Error::usage(format!(
            "{flag} '{name}' is not valid: use up to 64 letters, digits, '-', '_' or '.', starting with a letter"
        )))
    }
}

/// The mode a flag sets; `auto` sets none: a new session starts in bind mode until
/// `session::workspace::placement` finds the backend cannot see the directory, and a
/// resumed one keeps its own.
fn workspace_mode(arg: Option<WorkspaceModeArg>) -> Option<WorkspaceMode> {
    arg.and_then(|m| match m {
        WorkspaceModeArg::Auto => None,
        WorkspaceModeArg::Bind => Some(WorkspaceMode::Bind),
        WorkspaceModeArg::Copy => Some(WorkspaceMode::Copy),
        WorkspaceModeArg::None => Some(WorkspaceMode::None),
    })
}

fn resolve_workspace(dir: &Path) -> Result<String> {
    let canonical = dir.canonicalize().map_err(|e| {
        Error::usage(format!("workspace '{}' cannot be used: {e}", dir.display()))
            .with_hint("pass an existing directory with --workspace DIR")
    })?;
    if !canonical.is_dir() {
        return Err(Error::usage(format!(
            "workspace '{}' is not a directory",
            dir.display()
        )));
    }
    Ok(canonical.display().to_string())
}

/// The settings of a new session.
pub fn new_session_settings(
    provider: ProviderKind,
    args: &SettingsArgs,
) -> Result<SessionSettings> {
    let mut settings = SessionSettings {
        image: provider.default_image(),
        network: "open".to_string(),
        egress_policy: Some(EgressPolicy::default()),
        ..Default::default()
    };
    apply_overrides(&mut settings, args)?;
    if settings.workspace.is_none() && settings.workspace_mode != WorkspaceMode::None {
        let cwd = std::env::current_dir()
            .map_err(|e| Error::usage(format!("cannot read the current directory: {e}")))?;
        settings.workspace = Some(resolve_workspace(&cwd)?);
    }
    Ok(settings)
}

/// Applies `resume` flags on top of a session's remembered settings. The workspace mode is
/// fixed when a session starts (a copy-mode workspace lives in its own volume).
pub fn apply_resume_overrides(settings: &mut SessionSettings, args: &SettingsArgs) -> Result<()> {
    if let Some(mode) = workspace_mode(args.workspace_mode) {
        if mode != settings.workspace_mode {
            return Err(Error::usage(
                format!(
                    "this session's workspace mode is {:?}; it is fixed when a session starts",
                    settings.workspace_mode
                )
                .to_lowercase(),
            )
            .with_hint("start a new session with `caw-box run --workspace-mode ...`"));
        }
    }
    if args.workspace.is_some() && settings.workspace_mode == WorkspaceMode::Copy {
        return Err(Error::usage(
            "--workspace does not apply to a copy-mode session: its workspace is a copy taken when it started",
        )
        .with_hint("`caw-box export` writes the copy out"));
    }
    apply_overrides(settings, args)
}

/// Applies `run`/`resume` flags on top of settings (a resumed session's remembered ones).
/// Every field of [`SettingsArgs`] is named below, without `..`: a new flag does not compile
/// until it is given its place (and `every_run_flag_reaches_the_settings` checks it gets there).
pub fn apply_overrides(settings: &mut SessionSettings, args: &SettingsArgs) -> Result<()> {
    let SettingsArgs {
        workspace,
        workspace_mode,
        image,
        model,
        timeout,
        idle_timeout,
        connect_timeout,
        keep_warm,
        checkpoints,
        memory,
        cpus,
        max_cost,
        pids_limit,
        per_account,
        network,
        allow_host,
        egress,
        protect,
        unprotect,
        endpoint,
        runtime,
        system_prompt,
        append_system_prompt,
        effort,
        tools,
        allow_tool,
        deny_tool,
        mcp,
        mcp_env,
        mcp_header,
    } = args;
    if let Some(image) = image {
        settings.image = image.clone();
    }
    settings.model = model.clone().or(settings.model.take());
    if let Some(endpoint) = endpoint {
        settings.endpoint = Some(validate_endpoint(endpoint, "--endpoint")?);
    }
    if let Some(text) = system_prompt {
        settings.system_prompt = Some(crate::agent_config::read_prompt_arg(
            text,
            "--system-prompt",
        )?);
    }
    if let Some(text) = append_system_prompt {
        settings.append_system_prompt = Some(crate::agent_config::read_prompt_arg(
            text,
            "--append-system-prompt",
        )?);
    }
    if let Some(effort) = effort {
        settings.effort = Some(crate::agent_config::Effort::parse(effort, "--effort")?);
    }
    apply_tool_flags(settings, tools.as_deref(), allow_tool, deny_tool)?;
    apply_mcp_flags(settings, mcp, mcp_env, mcp_header)?;
    if let Some(network) = network {
        if network.trim().is_empty() {
            return Err(Error::usage(
                "--network needs a value: open, none, host or a network name",
            ));
        }
        settings.network = network.clone();
    }
    if let Some(runtime) = runtime {
        settings.runtime = parse_runtime(runtime, "--runtime")?;
    }
    if let Some(mode) = self::workspace_mode(*workspace_mode) {
        settings.workspace_mode = mode;
    }
    if let Some(ws) = workspace {
        settings.workspace = Some(resolve_workspace(ws)?);
    }
    apply_protect_flags(settings, protect, unprotect)?;
    if let Some(on) = *checkpoints {
        settings.no_checkpoints = !on;
    }
    if let Some(m) = memory {
        settings.memory = Some(parse_memory(m, "--memory")?);
    }
    apply_limits(settings, *cpus, *max_cost, *pids_limit, *per_account)?;
    apply_egress_flags(settings, allow_host, egress.as_deref())?;
    apply_timeout_flags(
        settings,
        timeout.as_deref(),
        idle_timeout.as_deref(),
        connect_timeout.as_deref(),
        keep_warm.as_deref(),
    )
}

/// `--tools` replaces the remembered groups; `--allow-tool`/`--deny-tool` names add to the
/// remembered ones.
fn apply_tool_flags(
    settings: &mut SessionSettings,
    groups: Option<&str>,
    allow_tool: &[String],
    deny_tool: &[String],
) -> Result<()> {
    use crate::agent_config::ToolPolicy;
    if groups.is_none() && allow_tool.is_empty() && deny_tool.is_empty() {
        return Ok(());
    }
    let mut tools = settings.tools.take().unwrap_or_default();
    if let Some(groups) = groups {
        tools.groups = ToolPolicy::parse_groups(groups, "--tools")?;
    }
    for (names, list, what) in [
        (allow_tool, &mut tools.allow, "--allow-tool"),
        (deny_tool, &mut tools.deny, "--deny-tool"),
    ] {
        for name in names {
            let name = ToolPolicy::check_name(name, what)?;
            if !list.contains(&name) {
                list.push(name);
            }
        }
    }
    // A name given now wins over the same name on the other list from before.
    tools
        .allow
        .retain(|n| !deny_tool.iter().any(|d| d.trim() == n));
    tools
        .deny
        .retain(|n| !allow_tool.iter().any(|a| a.trim() == n));
    settings.tools = (tools != ToolPolicy::default()).then_some(tools);
    Ok(())
}

/// `--mcp` servers replace the remembered ones of the same name; `--mcp-env` and
/// `--mcp-header` add a secret's key name (never its value) to a command or an HTTP server.
fn apply_mcp_flags(
    settings: &mut SessionSettings,
    mcp: &[String],
    mcp_env: &[String],
    mcp_header: &[String],
) -> Result<()> {
    for value in mcp {
        let server = crate::agent_config::McpServer::parse(value, "--mcp")?;
        settings.mcp.retain(|m| m.name != server.name);
        settings.mcp.push(server);
    }
    for (values, what, header) in [
        (mcp_env, "--mcp-env", false),
        (mcp_header, "--mcp-header", true),
    ] {
        for value in values {
            let (name, key, _) = crate::agent_config::parse_mcp_secret(value, what)?;
            let server = settings
                .mcp
                .iter_mut()
                .find(|m| m.name == name)
                .ok_or_else(|| {
                    Error::usage(format!("{what}: this session has no MCP server '{name}'"))
                        .with_hint("add it with --mcp NAME=COMMAND or --mcp NAME=URL")
                })?;
            let is_http = matches!(
                server.transport,
                crate::agent_config::McpTransport::Http { .. }
            );
            if header != is_http {
                return Err(Error::usage(format!(
                    "{what}: MCP server '{name}' is {}",
                    if is_http {
                        "an HTTP server: give it --mcp-header"
                    } else {
                        "a command: give it --mcp-env"
                    }
                )));
            }
            let keys = if header {
                &mut server.headers
            } else {
                &mut server.env
            };
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
    }
    Ok(())
}

/// A host path names a protected path inside the workspace (the current directory's for a
/// new session that names none).
fn apply_protect_flags(
    settings: &mut SessionSettings,
    protect: &[String],
    unprotect: &[String],
) -> Result<()> {
    let here = std::env::current_dir()
        .ok()
        .and_then(|d| d.canonicalize().ok())
        .map(|d| d.display().to_string());
    crate::session::protect::apply(
        &mut settings.protect,
        &mut settings.unprotect,
        protect,
        unprotect,
        settings.workspace.as_deref().or(here.as_deref()),
    )
}

/// `--allow-host` adds to the remembered allowlist, then the network the settings end with
/// is checked against it.
fn apply_egress_flags(
    settings: &mut SessionSettings,
    allow_host: &[String],
    egress: Option<&str>,
) -> Result<()> {
    if let Some(policy) = egress {
        settings.egress_policy = Some(EgressPolicy::parse(policy, "--egress")?);
    } else if settings.egress_policy.is_none() && !allow_host.is_empty() {
        // A session from before policies, open: --allow-host held it to its hosts then.
        settings.egress_policy = Some(EgressPolicy::Locked);
    }
    let policy = settings.egress();
    if policy == EgressPolicy::Open && !allow_host.is_empty() {
        return Err(Error::usage(
            "--allow-host adds hosts to --egress balanced or locked; under --egress open every host is reachable already",
        )
        .with_hint("drop --allow-host, or choose --egress balanced or locked"));
    }
    for host in allow_host {
        validate_allow_host(host, "--allow-host")?;
        if !settings.allow_hosts.contains(host) {
            settings.allow_hosts.push(host.clone());
        }
    }
    // An HTTP MCP server's host is admitted where egress is limited to named hosts.
    if policy != EgressPolicy::Open {
        for host in settings.mcp.iter().filter_map(|m| m.http_host()) {
            if !settings.allow_hosts.contains(&host) {
                settings.allow_hosts.push(host);
            }
        }
    }
    if settings.network == "none" {
        return Err(Error::usage(
            "--network none leaves the CLI no way to reach its model: the turn could only hang",
        )
        .with_hint("for the tightest egress, use --egress locked (only the model's API is reachable) or a --network NAME with a model gateway on it"));
    }
    if policy != EgressPolicy::Open && settings.network == "host" {
        return Err(Error::usage(format!(
            "--egress {policy} does not combine with --network host: on the host's network nothing holds the agent to a policy"
        ))
        .with_hint("add --egress open to run on the host's network, or use --network open or a network name"));
    }
    Ok(())
}

fn apply_timeout_flags(
    settings: &mut SessionSettings,
    timeout: Option<&str>,
    idle_timeout: Option<&str>,
    connect_timeout: Option<&str>,
    keep_warm: Option<&str>,
) -> Result<()> {
    if let Some(t) = timeout {
        settings.timeout_secs = Some(parse_duration(t, "--timeout")?.as_secs().max(1));
    }
    if let Some(t) = idle_timeout {
        settings.idle_timeout_secs = Some(parse_limit(t, "--idle-timeout")?);
    }
    if let Some(t) = connect_timeout {
        settings.connect_timeout_secs = Some(parse_limit(t, "--connect-timeout")?);
    }
    if let Some(t) = keep_warm {
        let secs = parse_limit(t, "--keep-warm")?;
        // `off` is kept only where it turns a warm session off: its next turn removes the
        // idle container (`session::warm`); a session never warm pays nothing for it.
        if secs > 0 || settings.keep_warm_secs.is_some() {
            settings.keep_warm_secs = Some(secs);
        }
    }
    Ok(())
}

/// `--runtime NAME`: an OCI runtime's name as a daemon lists it (`runsc`,
/// `io.containerd.runc.v2`) or a Kubernetes RuntimeClass's; `default` (`None`): the
/// engine's default. Whether the engine has it is asked before a turn
/// ([`crate::backend::Backend::check_runtime`]).
pub fn parse_runtime(name: &str, what: &str) -> Result<Option<String>> {
    let name = name.trim();
    if name == "default" {
        return Ok(None);
    }
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    if ok {
        Ok(Some(name.to_string()))
    } else {
        Err(Error::usage(format!(
            "{what} '{name}' is not a runtime name: letters, digits, '.', '-' and '_'"
        ))
        .with_hint("e.g. --runtime runsc (gVisor), or `default`; `caw-box doctor` lists the daemon's runtimes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prompt read from a file or stdin: whole up to the cap; over it, refused with its
    /// whole size (kept no further than the cap).
    #[test]
    fn prompts_are_read_up_to_the_cap() {
        let at_cap = "p".repeat(MAX_TURN_PROMPT_BYTES);
        let read = read_prompt(at_cap.as_bytes()).unwrap().unwrap();
        assert_eq!(read.len(), MAX_TURN_PROMPT_BYTES);
        let over = "p".repeat(MAX_TURN_PROMPT_BYTES + 1000);
        let e = read_prompt(over.as_bytes()).unwrap().unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.message.contains("1049576 bytes"), "{}", e.message);
        let e = read_prompt(&b"caf\xe9"[..]).unwrap().unwrap_err();
        assert_eq!(
            (e.exit_code(), e.message.as_str()),
            (2, "the prompt is not UTF-8 text")
        );
        // An argument (the MCP server's, a library caller's flags) is held to the cap too.
        let args = TurnArgs {
            prompt: Some("p".repeat(MAX_TURN_PROMPT_BYTES + 1)),
            ..Default::default()
        };
        assert_eq!(resolve_prompt(&args).unwrap_err().exit_code(), 2);
        let args = TurnArgs {
            prompt: Some(at_cap),
            ..Default::default()
        };
        assert_eq!(
            resolve_prompt(&args).unwrap().unwrap().len(),
            MAX_TURN_PROMPT_BYTES
        );
    }

    #[test]
    fn memory_sizes() {
        assert_eq!(parse_memory("2g", "--memory").unwrap(), 2 << 30);
        assert_eq!(parse_memory("512m", "--memory").unwrap(), 512 << 20);
        assert_eq!(parse_memory("512MB", "--memory").unwrap(), 512 << 20);
        assert!(parse_memory("lots", "--memory").is_err());
        assert!(parse_memory("1k", "--memory").is_err());
    }

    #[test]
    fn env_pairs_and_names() {
        assert_eq!(
            resolve_env(&["A=1=2".into()]).unwrap(),
            vec![("A".to_string(), "1=2".to_string())]
        );
        assert_eq!(resolve_env(&["1A=x".into()]).unwrap_err().exit_code(), 2);
        assert!(resolve_env(&["CAW_BOX_SURELY_UNSET_VAR".into()]).is_err());
    }

    #[test]
    fn names_and_endpoints() {
        assert!(validate_name("fixer-1", "--name").is_ok());
        assert!(validate_name("5b0c", "--name").is_err());
        assert!(validate_name("a b", "--name").is_err());
        assert_eq!(
            validate_endpoint("http://stub:8080/", "--endpoint").unwrap(),
            "http://stub:8080"
        );
        assert!(validate_endpoint("stub:8080", "--endpoint").is_err());
    }

    #[test]
    fn runtime_names() {
        assert_eq!(
            parse_runtime("runsc", "--runtime").unwrap().as_deref(),
            Some("runsc")
        );
        assert_eq!(
            parse_runtime("io.containerd.runc.v2", "--runtime")
                .unwrap()
                .as_deref(),
            Some("io.containerd.runc.v2")
        );
        assert_eq!(parse_runtime("default", "--runtime").unwrap(), None);
        for bad in ["", "-x", "run sc", "/usr/bin/runsc", "a;b"] {
            assert_eq!(
                parse_runtime(bad, "--runtime").unwrap_err().exit_code(),
                2,
                "{bad}"
            );
        }
        // Remembered by a session; a resume's flag replaces it, `default` clears it.
        let mut s = SessionSettings::default();
        let flag = |r: &str| SettingsArgs {
            runtime: Some(r.into()),
            ..Default::default()
        };
        apply_overrides(&mut s, &flag("runsc")).unwrap();
        assert_eq!(s.runtime.as_deref(), Some("runsc"));
        apply_overrides(&mut s, &SettingsArgs::default()).unwrap();
        assert_eq!(s.runtime.as_deref(), Some("runsc"));
        apply_overrides(&mut s, &flag("default")).unwrap();
        assert_eq!(s.runtime, None);
    }

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("30m", "--timeout").unwrap(),
            Duration::from_secs(1800)
        );
        assert_eq!(
            parse_duration("soon", "--timeout").unwrap_err().exit_code(),
            2
        );
    }
}

#[cfg(test)]
mod allow_host_tests {
    use super::*;
    use crate::provider::ProviderKind;

    #[test]
    fn provider_expands_to_the_endpoint_or_the_vendor_hosts() {
        let mut s = SessionSettings {
            allow_hosts: vec!["@provider".into(), "Extra.Example.com:8443".into()],
            ..Default::default()
        };
        assert_eq!(
            expand_allow_hosts(ProviderKind::ClaudeCode, &s),
            vec!["api.anthropic.com:443", "extra.example.com:8443"]
        );
        s.endpoint = Some("http://gateway:8080".into());
        assert_eq!(
            expand_allow_hosts(ProviderKind::Gemini, &s),
            vec!["extra.example.com:8443", "gateway:8080"]
        );
        s.endpoint = Some("https://llm.corp".into());
        assert_eq!(
            expand_allow_hosts(ProviderKind::Codex, &s)[1],
            "llm.corp:443"
        );
    }

    #[test]
    fn allow_host_values_are_checked() {
        for ok in [
            "api.example.com",
            "api.example.com:443",
            "*.example.com",
            "@provider",
        ] {
            assert!(validate_allow_host(ok, "--allow-host").is_ok(), "{ok}");
        }
        for bad in ["", "a b", "host:0", "host:99999", "http://host", "@nobody"] {
            assert_eq!(
                validate_allow_host(bad, "--allow-host")
                    .unwrap_err()
                    .exit_code(),
                2,
                "{bad}"
            );
        }
    }
}

/// An image repository (`ghcr.io/owner/caw-box`, `localhost:5000/x`, `caw-box`): what
/// `REPO/<image>:latest` can be made of. `what` names the flag, variable or key.
pub fn validate_image_repo(repo: &str, what: &str) -> Result<()> {
    let repo = repo.trim_end_matches('/');
    let ok = !repo.is_empty()
        && !repo.starts_with('/')
        && !repo.contains("//")
        && repo
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-/:".contains(c))
        && !repo.rsplit('/').next().unwrap_or("").contains(':');
    if ok {
        Ok(())
    } else {
        Err(Error::usage(format!(
            "{what} '{repo}' is not an image repository (e.g. ghcr.io/owner/caw-box, without a tag)"
        )))
    }
}

#[cfg(test)]
mod egress_tests {
    use super::*;

    fn apply(s: &mut SessionSettings, egress: Option<&str>, allow: &[&str]) -> Result<()> {
        let args = SettingsArgs {
            egress: egress.map(str::to_string),
            allow_host: allow.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        apply_overrides(s, &args)
    }

    /// A new session is balanced; an old record keeps what it had (open, or locked to its
    /// hosts); a resume's flag changes it; --allow-host adds to balanced and locked only.
    #[test]
    fn the_egress_policy_of_new_old_and_resumed_sessions() {
        let new = new_session_settings(ProviderKind::Codex, &SettingsArgs::default()).unwrap();
        assert_eq!(new.egress(), EgressPolicy::Balanced);
        let old: SessionSettings = serde_json::from_str(r#"{"image":"i"}"#).unwrap();
        assert_eq!(old.egress(), EgressPolicy::Open);
        let old: SessionSettings =
            serde_json::from_str(r#"{"image":"i","allow_hosts":["@provider"]}"#).unwrap();
        assert_eq!(old.egress(), EgressPolicy::Locked);

        let mut s = new.clone();
        apply(&mut s, None, &["pkg.example.com"]).unwrap();
        assert_eq!(s.egress(), EgressPolicy::Balanced);
        assert_eq!(s.allow_hosts, ["pkg.example.com"]);
        apply(&mut s, Some("locked"), &[]).unwrap();
        assert_eq!(s.egress(), EgressPolicy::Locked);
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["egress"], "locked");

        let mut open = new.clone();
        let e = apply(&mut open, Some("open"), &["x.example.com"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.message.contains("--egress open"), "{}", e.message);
        let e = apply(&mut new.clone(), Some("closed"), &[]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(
            e.message.contains("balanced, locked or open"),
            "{}",
            e.message
        );
    }

    /// The host's network holds no proxy: only `open` runs there, and says so.
    #[test]
    fn the_hosts_network_takes_only_open_egress() {
        let mut s = new_session_settings(ProviderKind::Codex, &SettingsArgs::default()).unwrap();
        let args = SettingsArgs {
            network: Some("host".into()),
            ..Default::default()
        };
        let e = apply_overrides(&mut s.clone(), &args).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(
            e.hint.as_deref().unwrap_or("").contains("--egress open"),
            "{e:?}"
        );
        let args = SettingsArgs {
            network: Some("host".into()),
            egress: Some("open".into()),
            ..Default::default()
        };
        apply_overrides(&mut s, &args).unwrap();
        assert_eq!(s.egress(), EgressPolicy::Open);
    }
}

#[cfg(test)]
mod mcp_tests {
    use super::*;

    fn args(mcp: &[&str], env: &[&str], header: &[&str], allow: &[&str]) -> SettingsArgs {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        SettingsArgs {
            mcp: v(mcp),
            mcp_env: v(env),
            mcp_header: v(header),
            allow_host: v(allow),
            ..Default::default()
        }
    }

    /// Servers are remembered by name (a resume's `--mcp` replaces one), their secrets by key
    /// name only, and an HTTP server's host is admitted where egress is limited.
    #[test]
    fn mcp_flags_resolve_into_remembered_settings() {
        let mut s = SessionSettings::default();
        let a = args(
            &["caw=node /workspace/e.js", "docs=http://docs:8080/mcp"],
            &["caw:TOKEN=s3cret"],
            &["docs:X-Api-Key=k3y"],
            &["@provider"],
        );
        apply_overrides(&mut s, &a).unwrap();
        assert_eq!(s.mcp.len(), 2);
        assert_eq!(s.mcp[0].env, ["TOKEN"]);
        assert_eq!(s.mcp[1].headers, ["X-Api-Key"]);
        assert!(
            s.allow_hosts.contains(&"docs:8080".to_string()),
            "{:?}",
            s.allow_hosts
        );
        let json = serde_json::to_string(&s).unwrap();
        assert!(!json.contains("s3cret") && !json.contains("k3y"), "{json}");
        assert_eq!(
            resolve_mcp_env(&a).unwrap(),
            [
                ("TOKEN".to_string(), "s3cret".to_string()),
                ("CAW_BOX_MCP_DOCS_X_API_KEY".to_string(), "k3y".to_string())
            ]
        );

        apply_overrides(&mut s, &args(&["caw=python3 e.py"], &[], &[], &[])).unwrap();
        assert_eq!(s.mcp.len(), 2);
        assert_eq!(s.mcp_names(), ["docs", "caw"]);

        for bad in [
            args(&[], &["nope:K=v"], &[], &[]),
            args(&[], &["docs:K=v"], &[], &[]),
            args(&[], &[], &["caw:H=v"], &[]),
        ] {
            let e = apply_overrides(&mut s.clone(), &bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{}", e.message);
        }
    }
}

#[cfg(test)]
mod flag_tests {
    use clap::{CommandFactory, Parser};

    use super::*;
    use crate::cli::{Cli, Command};

    /// The flags of `run` that are a turn's, not its session's: they never reach
    /// [`SessionSettings`].
    const TURN_ONLY: &[&str] = &[
        "prompt",
        "prompt_file",
        "env",
        "output",
        "detach",
        "credentials",
        "on_limit",
        "max_wait",
        "provider",
        "name",
        "group",
        "user_config",
        "help",
    ];

    /// For each session flag of `run` (by clap id): what a test sets it to, and what must be
    /// given first for that value to make sense (an MCP server for its secret's key).
    fn flag_values(workspace: &str) -> Vec<(&'static str, Vec<String>, Vec<String>)> {
        let unprotected = crate::session::protect::DEFAULT_PROTECTED[0].0;
        let v = |args: &[&str]| args.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        vec![
            ("workspace", v(&["--workspace", workspace]), v(&[])),
            ("workspace_mode", v(&["--workspace-mode", "copy"]), v(&[])),
            ("image", v(&["--image", "other:1"]), v(&[])),
            ("model", v(&["--model", "m-1"]), v(&[])),
            ("timeout", v(&["--timeout", "5m"]), v(&[])),
            ("idle_timeout", v(&["--idle-timeout", "90s"]), v(&[])),
            ("connect_timeout", v(&["--connect-timeout", "20s"]), v(&[])),
            ("keep_warm", v(&["--keep-warm", "10m"]), v(&[])),
            ("checkpoints", v(&["--checkpoints", "off"]), v(&[])),
            ("memory", v(&["--memory", "2g"]), v(&[])),
            ("cpus", v(&["--cpus", "1.5"]), v(&[])),
            ("max_cost", v(&["--max-cost", "2.5"]), v(&[])),
            ("pids_limit", v(&["--pids-limit", "300"]), v(&[])),
            ("per_account", v(&["--per-account", "2"]), v(&[])),
            ("network", v(&["--network", "lab"]), v(&[])),
            ("allow_host", v(&["--allow-host", "example.com"]), v(&[])),
            ("egress", v(&["--egress", "locked"]), v(&[])),
            ("protect", v(&["--protect", "Makefile"]), v(&[])),
            ("unprotect", v(&["--unprotect", unprotected]), v(&[])),
            ("endpoint", v(&["--endpoint", "http://gw:8080"]), v(&[])),
            ("runtime", v(&["--runtime", "runsc"]), v(&[])),
            ("system_prompt", v(&["--system-prompt", "be brief"]), v(&[])),
            (
                "append_system_prompt",
                v(&["--append-system-prompt", "and kind"]),
                v(&[]),
            ),
            ("effort", v(&["--effort", "high"]), v(&[])),
            ("tools", v(&["--tools", "read,edit"]), v(&[])),
            ("allow_tool", v(&["--allow-tool", "Bash"]), v(&[])),
            ("deny_tool", v(&["--deny-tool", "WebFetch"]), v(&[])),
            ("mcp", v(&["--mcp", "caw=node e.js"]), v(&[])),
            (
                "mcp_env",
                v(&["--mcp-env", "caw:TOKEN=t"]),
                v(&["--mcp", "caw=node e.js"]),
            ),
            (
                "mcp_header",
                v(&["--mcp-header", "docs:X-Key=k"]),
                v(&["--mcp", "docs=http://docs:8080/mcp"]),
            ),
        ]
    }

    /// The settings `caw-box run ARGS` resolves to, on top of a new session's.
    fn settings_of(args: &[String]) -> SessionSettings {
        let argv = ["caw-box", "run"].into_iter().map(String::from);
        let cli = Cli::try_parse_from(argv.chain(args.iter().cloned()))
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        let Command::Run(run) = cli.command else {
            panic!("not a run command: {args:?}")
        };
        let mut settings = SessionSettings {
            network: "open".to_string(),
            ..Default::default()
        };
        apply_overrides(&mut settings, &run.turn.settings)
            .unwrap_or_else(|e| panic!("{args:?}: {}", e.message));
        settings
    }

    /// Every flag of `run` is either a turn's own or changes the session's settings when
    /// given alone on its command line: a new flag fails here until it has a value above and
    /// reaches the settings.
    #[test]
    fn every_run_flag_reaches_the_settings() {
        let dir = tempfile::tempdir().unwrap();
        let values = flag_values(dir.path().to_str().unwrap());
        let cli = Cli::command();
        let run = cli.find_subcommand("run").expect("a run command");
        let mut checked = Vec::new();
        for arg in run.get_arguments() {
            let id = arg.get_id().as_str();
            if TURN_ONLY.contains(&id) {
                continue;
            }
            let (_, flag, before) = values
                .iter()
                .find(|(known, _, _)| *known == id)
                .unwrap_or_else(|| panic!("`run --{id}` has no value in flag_values"));
            let with_flag: Vec<String> = before.iter().chain(flag).cloned().collect();
            assert_ne!(
                settings_of(before),
                settings_of(&with_flag),
                "`run {}` did not reach the session's settings",
                flag.join(" ")
            );
            checked.push(id);
        }
        let named: Vec<&str> = values.iter().map(|(id, _, _)| *id).collect();
        assert_eq!(
            checked, named,
            "flag_values names a flag `run` does not have"
        );
    }
}
