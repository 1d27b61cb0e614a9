//! Config files and the layering of settings: flags > `CAW_BOX_*` variables > the project
//! file (`.caw-box.toml`, from the workspace up to the repository root) > the user file
//! (`$CAW_BOX_CONFIG`, else `$XDG_CONFIG_HOME/caw-box/config.toml`) > built-in defaults.
//!
//! This module finds and reads the files and says, per setting, which layer won and where
//! it came from. It does not decide what a value means: `settings` checks and applies the
//! winning values exactly as it does flags, so a value means the same in a file and on the
//! command line. Config files shape new sessions; a resumed session keeps the settings it
//! remembers, and only its turn-level keys (`env_pass`, `labels`) come from the files.

mod file;
pub mod secrets;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::cli::{SettingsArgs, WorkspaceModeArg};
use crate::error::{Error, Result};
use crate::provider::ProviderKind;
use crate::settings;

/// The project file's name, looked for in the workspace and its parents.
pub const PROJECT_FILE: &str = ".caw-box.toml";

/// One setting a config file, a variable or a flag can give.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Key {
    Provider,
    Model,
    Image,
    Endpoint,
    Network,
    AllowHost,
    Memory,
    Cpus,
    PidsLimit,
    Timeout,
    IdleTimeout,
    ConnectTimeout,
    WorkspaceMode,
    Group,
    Labels,
    EnvPass,
    UserConfig,
    ImageRepo,
    Backend,
    SystemPrompt,
    AppendSystemPrompt,
    Effort,
    Tools,
    AllowTool,
    DenyTool,
    Mcp,
}

impl Key {
    pub const ALL: [Key; 26] = [
        Key::Provider,
        Key::Model,
        Key::Image,
        Key::Endpoint,
        Key::Network,
        Key::AllowHost,
        Key::Memory,
        Key::Cpus,
        Key::PidsLimit,
        Key::Timeout,
        Key::IdleTimeout,
        Key::ConnectTimeout,
        Key::WorkspaceMode,
        Key::Group,
        Key::Labels,
        Key::EnvPass,
        Key::UserConfig,
        Key::ImageRepo,
        Key::Backend,
        Key::SystemPrompt,
        Key::AppendSystemPrompt,
        Key::Effort,
        Key::Tools,
        Key::AllowTool,
        Key::DenyTool,
        Key::Mcp,
    ];

    /// Its name in a config file.
    pub fn name(self) -> &'static str {
        match self {
            Key::Provider => "provider",
            Key::Model => "model",
            Key::Image => "image",
            Key::Endpoint => "endpoint",
            Key::Network => "network",
            Key::AllowHost => "allow_host",
            Key::Memory => "memory",
            Key::Cpus => "cpus",
            Key::PidsLimit => "pids_limit",
            Key::Timeout => "timeout",
            Key::IdleTimeout => "idle_timeout",
            Key::ConnectTimeout => "connect_timeout",
            Key::WorkspaceMode => "workspace_mode",
            Key::Group => "group",
            Key::Labels => "labels",
            Key::EnvPass => "env_pass",
            Key::UserConfig => "user_config",
            Key::ImageRepo => "image_repo",
            Key::Backend => "backend",
            Key::SystemPrompt => "system_prompt",
            Key::AppendSystemPrompt => "append_system_prompt",
            Key::Effort => "effort",
            Key::Tools => "tools",
            Key::AllowTool => "allow_tool",
            Key::DenyTool => "deny_tool",
            Key::Mcp => "mcp",
        }
    }

    /// Its flag, if it has one (`labels` and `env_pass` are config-only; `--env` adds).
    pub fn flag(self) -> Option<String> {
        match self {
            Key::Labels | Key::EnvPass => None,
            k => Some(format!("--{}", k.name().replace('_', "-"))),
        }
    }

    /// The `CAW_BOX_*` variable that sets it: each key but `env_pass` (a variable naming
    /// variables would only hide where a value came from) and `mcp` (a table). Lists are
    /// comma-separated, labels `k=v,k=v` (the variable caw-box always had).
    pub fn env_var(self) -> Option<String> {
        match self {
            Key::EnvPass | Key::Mcp => None,
            k => Some(format!("CAW_BOX_{}", k.name().to_ascii_uppercase())),
        }
    }
}

/// A setting's value, as typed in a file (durations and sizes stay text, like flags).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Value {
    Str(String),
    List(Vec<String>),
    Float(f64),
    Int(i64),
    Map(BTreeMap<String, String>),
    Bool(bool),
    /// `mcp`: the MCP servers by name.
    Mcp(BTreeMap<String, McpEntry>),
}

/// One MCP server of a config file's `mcp` table (or of `--mcp` flags, for `config show`):
/// what `--mcp NAME=...` takes, and the NAMES of the host variables that hold its secrets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct McpEntry {
    /// A command (run in the agent's container) or an `http(s)://` URL, as `--mcp` takes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Host variables the server gets, each under its own name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// `HEADER=VARIABLE`: the header sent to an HTTP server holds the host variable's value.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<String>,
}

impl McpEntry {
    /// What `--mcp NAME=` takes.
    fn spec(&self) -> &str {
        self.command
            .as_deref()
            .or(self.url.as_deref())
            .unwrap_or_default()
    }

    /// The (header, variable) pairs of `headers`.
    fn header_vars(&self) -> impl Iterator<Item = (&str, &str)> {
        self.headers
            .iter()
            .filter_map(|h| h.split_once('='))
            .map(|(h, v)| (h.trim(), v.trim()))
    }
}

impl Value {
    fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// For the table of `config show`.
    pub fn display(&self) -> String {
        match self {
            Value::Str(s) => s.clone(),
            Value::List(l) => l.join(","),
            Value::Float(f) => f.to_string(),
            Value::Int(i) => i.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Map(m) => m
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(","),
            Value::Mcp(servers) => servers
                .iter()
                .map(|(name, e)| {
                    let mut s = format!("{name}={}", e.spec());
                    if !e.env.is_empty() {
                        s.push_str(&format!(" (env {})", e.env.join(",")));
                    }
                    if !e.headers.is_empty() {
                        s.push_str(&format!(" (headers {})", e.headers.join(",")));
                    }
                    s
                })
                .collect::<Vec<_>>()
                .join("; "),
        }
    }
}

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "source", content = "origin", rename_all = "snake_case")]
pub enum Origin {
    /// The flag, e.g. `--model`.
    Flag(String),
    /// The variable, e.g. `CAW_BOX_MODEL`.
    Env(String),
    /// `FILE:LINE` of the project file.
    Project(String),
    /// `FILE:LINE` of the user file.
    User(String),
    /// caw-box's own default.
    Default,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Flag(s) => write!(f, "flag {s}"),
            Origin::Env(s) => write!(f, "env {s}"),
            Origin::Project(s) => write!(f, "project {s}"),
            Origin::User(s) => write!(f, "user {s}"),
            Origin::Default => write!(f, "default"),
        }
    }
}

/// The settings one source gives, with where each came from.
#[derive(Debug, Default, Clone)]
pub struct Layer(BTreeMap<Key, (Value, Origin)>);

impl Layer {
    /// The flags of `run` (or `config show`).
    pub fn from_flags(provider: Option<&str>, group: Option<&str>, args: &SettingsArgs) -> Layer {
        let mut layer = Layer::default();
        let mut put = |key: Key, value: Option<Value>| {
            if let (Some(v), Some(flag)) = (value, key.flag()) {
                layer.0.insert(key, (v, Origin::Flag(flag)));
            }
        };
        let s = |v: &Option<String>| v.clone().map(Value::Str);
        put(Key::Provider, provider.map(|p| Value::Str(p.to_string())));
        put(Key::Group, group.map(|g| Value::Str(g.to_string())));
        put(Key::Model, s(&args.model));
        put(Key::Image, s(&args.image));
        put(Key::Endpoint, s(&args.endpoint));
        put(Key::SystemPrompt, s(&args.system_prompt));
        put(Key::AppendSystemPrompt, s(&args.append_system_prompt));
        put(Key::Effort, s(&args.effort));
        put(Key::Tools, s(&args.tools));
        put(
            Key::AllowTool,
            (!args.allow_tool.is_empty()).then(|| Value::List(args.allow_tool.clone())),
        );
        put(
            Key::DenyTool,
            (!args.deny_tool.is_empty()).then(|| Value::List(args.deny_tool.clone())),
        );
        put(Key::Network, s(&args.network));
        put(Key::Mcp, mcp_flags(args).map(Value::Mcp));
        put(
            Key::AllowHost,
            (!args.allow_host.is_empty()).then(|| Value::List(args.allow_host.clone())),
        );
        put(Key::Memory, s(&args.memory));
        put(Key::Cpus, args.cpus.map(Value::Float));
        put(Key::PidsLimit, args.pids_limit.map(Value::Int));
        put(Key::Timeout, s(&args.timeout));
        put(Key::IdleTimeout, s(&args.idle_timeout));
        put(Key::ConnectTimeout, s(&args.connect_timeout));
        put(
            Key::WorkspaceMode,
            args.workspace_mode
                .map(|m| Value::Str(workspace_mode_name(m).into())),
        );
        layer
    }

    /// `run --user-config` (a flag of `run` alone, not of the settings every command shares).
    pub fn user_config_flag(&mut self, on: bool) {
        if on {
            self.0.insert(
                Key::UserConfig,
                (Value::Bool(true), Origin::Flag("--user-config".into())),
            );
        }
    }

    /// The `CAW_BOX_*` variables that are set (and not empty), each checked like its flag.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Layer> {
        let mut layer = Layer::default();
        for key in Key::ALL {
            let Some(var) = key.env_var() else { continue };
            let Some(raw) = get(&var).filter(|v| !v.trim().is_empty()) else {
                continue;
            };
            let value = match key {
                Key::AllowHost | Key::AllowTool | Key::DenyTool => Value::List(split_list(&raw)),
                Key::Labels => Value::Map(
                    crate::session::record::parse_labels(&raw)
                        .into_iter()
                        .collect(),
                ),
                Key::Cpus => Value::Float(
                    raw.trim()
                        .parse()
                        .map_err(|_| Error::usage(format!("{var} '{raw}' is not a number")))?,
                ),
                Key::PidsLimit => {
                    Value::Int(raw.trim().parse().map_err(|_| {
                        Error::usage(format!("{var} '{raw}' is not a whole number"))
                    })?)
                }
                Key::UserConfig => Value::Bool(match raw.trim() {
                    "1" | "true" | "yes" => true,
                    "0" | "false" | "no" => false,
                    _ => return Err(Error::usage(format!("{var} '{raw}' is not true or false"))),
                }),
                _ => Value::Str(raw.trim().to_string()),
            };
            let value = check(key, value, &var)?;
            layer.0.insert(key, (value, Origin::Env(var)));
        }
        Ok(layer)
    }
}

/// `--mcp`, `--mcp-env` and `--mcp-header` as a value of the `mcp` key (names only: the
/// flags' secret values stay out of it); `None` without `--mcp`.
fn mcp_flags(args: &SettingsArgs) -> Option<BTreeMap<String, McpEntry>> {
    let mut servers = BTreeMap::new();
    for flag in &args.mcp {
        let (name, spec) = flag.split_once('=').unwrap_or((flag, ""));
        let spec = spec.trim().to_string();
        let http = spec.starts_with("http://") || spec.starts_with("https://");
        servers.insert(
            name.trim().to_string(),
            McpEntry {
                command: (!http).then(|| spec.clone()),
                url: http.then_some(spec),
                env: Vec::new(),
                headers: Vec::new(),
            },
        );
    }
    for (values, header) in [(&args.mcp_env, false), (&args.mcp_header, true)] {
        for v in values {
            let Some((name, kv)) = v.split_once(':') else {
                continue;
            };
            let key = kv.split_once('=').map_or(kv, |(k, _)| k).trim().to_string();
            if let Some(e) = servers.get_mut(name.trim()) {
                if header {
                    e.headers.push(format!("{key}=(--mcp-header)"));
                } else {
                    e.env.push(key);
                }
            }
        }
    }
    (!servers.is_empty()).then_some(servers)
}

fn split_list(raw: &str) -> Vec<String> {
    raw.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

fn workspace_mode_name(m: WorkspaceModeArg) -> &'static str {
    match m {
        WorkspaceModeArg::Auto => "auto",
        WorkspaceModeArg::Bind => "bind",
        WorkspaceModeArg::Copy => "copy",
        WorkspaceModeArg::None => "none",
    }
}

/// Checks a value from a file or a variable (`what` names it in the error) the way its flag
/// is checked, so a bad one is refused where it was written, not later.
fn check(key: Key, value: Value, what: &str) -> Result<Value> {
    let text = value.as_str().unwrap_or_default();
    match (key, &value) {
        (Key::Provider, _) => {
            text.parse::<ProviderKind>()?;
        }
        (Key::Endpoint, _) => {
            settings::validate_endpoint(text, what)?;
        }
        (Key::Network, _) if text == "none" || text.trim().is_empty() => {
            return Err(Error::usage(format!(
                "{what} '{text}': the CLI needs a network to reach its model (open, host or a network name)"
            )))
        }
        (Key::AllowHost, Value::List(hosts)) => {
            for h in hosts {
                settings::validate_allow_host(h, what)?;
            }
        }
        (Key::Memory, _) => {
            settings::parse_memory(text, what)?;
        }
        (Key::Cpus, Value::Float(c)) => settings::check_cpus(*c, what)?,
        (Key::PidsLimit, Value::Int(p)) => settings::check_pids_limit(*p, what)?,
        (Key::Timeout, _) => {
            settings::parse_duration(text, what)?;
        }
        (Key::IdleTimeout | Key::ConnectTimeout, _) => {
            settings::parse_limit(text, what)?;
        }
        (Key::WorkspaceMode, _) if !matches!(text, "auto" | "bind" | "copy" | "none") => {
            return Err(Error::usage(format!(
                "{what} '{text}' is not a workspace mode: auto, bind, copy or none"
            )))
        }
        (Key::Group, _) => settings::validate_name(text, what)?,
        (Key::Effort, _) => {
            crate::agent_config::Effort::parse(text, what)?;
        }
        (Key::Tools, _) => {
            crate::agent_config::ToolPolicy::parse_groups(text, what)?;
        }
        (Key::AllowTool | Key::DenyTool, Value::List(names)) => {
            for n in names {
                crate::agent_config::ToolPolicy::check_name(n, what)?;
            }
        }
        (Key::SystemPrompt | Key::AppendSystemPrompt, _) if text.trim().is_empty() => {
            return Err(Error::usage(format!(
                "{what} is empty: give the text, or @FILE to read it from a file"
            )))
        }
        (Key::ImageRepo, _) => settings::validate_image_repo(text, what)?,
        (Key::Backend, _) => {
            crate::backend::BackendKind::parse(text)
                .map_err(|e| Error::usage(format!("{what}: {}", e.message)))?;
        }
        (Key::EnvPass, Value::List(names)) => {
            for n in names {
                settings::validate_env_name(n, what)?;
            }
        }
        (Key::Mcp, Value::Mcp(servers)) => {
            for (name, e) in servers {
                let here = format!("{what}.{name}");
                let (http, spec) = match (&e.command, &e.url) {
                    (Some(c), None) => (false, c),
                    (None, Some(u)) => (true, u),
                    _ => {
                        return Err(Error::usage(format!(
                            "{here}: give either command or url"
                        )))
                    }
                };
                let server =
                    crate::agent_config::McpServer::parse(&format!("{name}={spec}"), &here)?;
                let is_http = matches!(server.transport, crate::agent_config::McpTransport::Http { .. });
                if is_http != http {
                    return Err(Error::usage(format!(
                        "{here}: {} ",
                        if http { "url is not an http(s):// URL" } else { "command is a URL: give it as url" }
                    ).trim_end().to_string()));
                }
                for n in &e.env {
                    settings::validate_env_name(n, &format!("{here}.env"))?;
                }
                if is_http && !e.env.is_empty() {
                    return Err(Error::usage(format!(
                        "{here}: env is for a command; an HTTP server takes headers"
                    )));
                }
                if !is_http && !e.headers.is_empty() {
                    return Err(Error::usage(format!(
                        "{here}: headers are for an HTTP server; a command takes env"
                    )));
                }
                for h in &e.headers {
                    let bad = || {
                        Error::usage(format!(
                            "{here}.headers: each is HEADER=VARIABLE (the host variable that holds the value)"
                        ))
                    };
                    let (header, var) = h.split_once('=').ok_or_else(bad)?;
                    crate::agent_config::parse_mcp_secret(
                        &format!("{name}:{}=x", header.trim()),
                        &format!("{here}.headers"),
                    )?;
                    settings::validate_env_name(var.trim(), &format!("{here}.headers"))?;
                }
            }
        }
        _ => {}
    }
    Ok(value)
}

/// A config file caw-box considers, and whether it is there.
#[derive(Debug, Clone, Serialize)]
pub struct ConfigFile {
    /// `user` or `project`.
    pub kind: &'static str,
    pub path: PathBuf,
    pub exists: bool,
}

/// The user file: `$CAW_BOX_CONFIG`, else `$XDG_CONFIG_HOME/caw-box/config.toml`, else
/// `~/.config/caw-box/config.toml` (on macOS too: where CLI users look for it).
pub fn user_file(get: &impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    if let Some(p) = get("CAW_BOX_CONFIG").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let base = get("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| get("HOME").map(|h| Path::new(&h).join(".config")))?;
    Some(base.join("caw-box").join("config.toml"))
}

/// The project files considered from `workspace` upward: each directory's `.caw-box.toml`
/// until one exists, the repository root (a directory holding `.git`), or `/`.
pub fn project_candidates(workspace: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dir = Some(workspace);
    while let Some(d) = dir {
        let candidate = d.join(PROJECT_FILE);
        let found = candidate.is_file();
        out.push(candidate);
        if found || d.join(".git").exists() {
            break;
        }
        dir = d.parent();
    }
    out
}

/// The files considered for `workspace` (the user file first), for `config path`.
pub fn files(workspace: &Path, get: &impl Fn(&str) -> Option<String>) -> Vec<ConfigFile> {
    let user = user_file(get).map(|path| ConfigFile {
        kind: "user",
        exists: path.is_file(),
        path,
    });
    let project = project_candidates(workspace)
        .into_iter()
        .map(|path| ConfigFile {
            kind: "project",
            exists: path.is_file(),
            path,
        });
    user.into_iter().chain(project).collect()
}

/// The files considered for `workspace` (else the current directory), with this process's
/// environment.
pub fn files_here(workspace: Option<&Path>) -> Result<Vec<ConfigFile>> {
    Ok(files(&workspace_dir(workspace)?, &process_env))
}

fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Where to look for the project file: the workspace given (absolute, so its parents are
/// searched too), else the current directory.
fn workspace_dir(workspace: Option<&Path>) -> Result<PathBuf> {
    match workspace {
        Some(w) => Ok(std::path::absolute(w).unwrap_or_else(|_| w.to_path_buf())),
        None => std::env::current_dir()
            .map_err(|e| Error::usage(format!("cannot read the current directory: {e}"))),
    }
}

fn read_layer(path: &Path, origin: fn(String) -> Origin) -> Result<Layer> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::usage(format!("cannot read config file '{}': {e}", path.display())))?;
    file::parse(path, &text, origin)
}

/// Every setting, resolved: the winning value (if any) and its origin, per key.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub files: Vec<ConfigFile>,
    values: BTreeMap<Key, (Value, Origin)>,
}

impl Resolved {
    /// Resolves `flags` over the process environment and the files for `workspace` (the
    /// `--workspace` given, else the current directory).
    pub fn load(flags: Layer, workspace: Option<&Path>) -> Result<Resolved> {
        Resolved::from_sources(flags, &workspace_dir(workspace)?, &process_env)
    }

    /// [`Resolved::load`] with the environment given, for tests.
    pub fn from_sources(
        flags: Layer,
        workspace: &Path,
        get: &impl Fn(&str) -> Option<String>,
    ) -> Result<Resolved> {
        let files = files(workspace, get);
        let mut layers = vec![flags, Layer::from_env(get)?];
        for f in files.iter().rev().filter(|f| f.exists) {
            let origin = if f.kind == "user" {
                Origin::User
            } else {
                Origin::Project
            };
            layers.push(read_layer(&f.path, origin)?);
        }
        let mut values = BTreeMap::new();
        for layer in layers {
            for (key, entry) in layer.0 {
                values.entry(key).or_insert(entry);
            }
        }
        Ok(Resolved { files, values })
    }

    pub fn get(&self, key: Key) -> Option<&Value> {
        self.values.get(&key).map(|(v, _)| v)
    }

    /// A yes/no setting (`user_config`); unset is no.
    pub fn yes(&self, key: Key) -> bool {
        matches!(self.get(key), Some(Value::Bool(true)))
    }

    pub fn str(&self, key: Key) -> Option<String> {
        self.get(key).and_then(Value::as_str).map(String::from)
    }

    fn list(&self, key: Key) -> Vec<String> {
        match self.get(key) {
            Some(Value::List(l)) => l.clone(),
            _ => Vec::new(),
        }
    }

    /// `env_pass`: the names of host variables to pass to the CLI.
    pub fn env_pass(&self) -> Vec<String> {
        self.list(Key::EnvPass)
    }

    /// `labels` (or `CAW_BOX_LABELS`): extra labels for every object of the command.
    pub fn labels(&self) -> Vec<(String, String)> {
        match self.get(Key::Labels) {
            Some(Value::Map(m)) => m.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            _ => Vec::new(),
        }
    }

    /// The session flags with every unset one filled from the winning layer: what
    /// `settings` then checks and applies as if typed.
    pub fn settings_args(&self, flags: &SettingsArgs) -> Result<SettingsArgs> {
        let mut out = flags.clone();
        if let Some((Value::Mcp(servers), origin)) = self.values.get(&Key::Mcp) {
            if !matches!(origin, Origin::Flag(_)) {
                // The file's servers, as if given by --mcp; their secrets come from the
                // host variables the file names, as --mcp-env / --mcp-header values.
                out.mcp = servers
                    .iter()
                    .map(|(name, e)| format!("{name}={}", e.spec()))
                    .collect();
                out.mcp_env.clear();
                out.mcp_header.clear();
                for (name, e) in servers {
                    for var in &e.env {
                        out.mcp_env
                            .push(format!("{name}:{var}={}", host_var(var, name, origin)?));
                    }
                    for (header, var) in e.header_vars() {
                        out.mcp_header
                            .push(format!("{name}:{header}={}", host_var(var, name, origin)?));
                    }
                }
            }
        }
        out.model = self.str(Key::Model);
        out.image = self.str(Key::Image);
        out.endpoint = self.str(Key::Endpoint);
        out.system_prompt = self.str(Key::SystemPrompt);
        out.append_system_prompt = self.str(Key::AppendSystemPrompt);
        out.effort = self.str(Key::Effort);
        out.tools = self.str(Key::Tools);
        out.allow_tool = self.list(Key::AllowTool);
        out.deny_tool = self.list(Key::DenyTool);
        out.network = self.str(Key::Network);
        out.allow_host = self.list(Key::AllowHost);
        out.memory = self.str(Key::Memory);
        out.cpus = match self.get(Key::Cpus) {
            Some(Value::Float(c)) => Some(*c),
            _ => None,
        };
        out.pids_limit = match self.get(Key::PidsLimit) {
            Some(Value::Int(p)) => Some(*p),
            _ => None,
        };
        out.timeout = self.str(Key::Timeout);
        out.idle_timeout = self.str(Key::IdleTimeout);
        out.connect_timeout = self.str(Key::ConnectTimeout);
        out.workspace_mode = self.str(Key::WorkspaceMode).and_then(|m| match m.as_str() {
            "auto" => Some(WorkspaceModeArg::Auto),
            "bind" => Some(WorkspaceModeArg::Bind),
            "copy" => Some(WorkspaceModeArg::Copy),
            "none" => Some(WorkspaceModeArg::None),
            _ => None,
        });
        Ok(out)
    }

    /// The secret values a session's MCP servers (`servers`) take from a config file's
    /// servers of the same name, as the variables that carry them to the CLI (what
    /// [`settings::resolve_mcp_env`] gives for the flags): on `run`, and on `resume` where no
    /// flag names them. A session that does not use a file's server gets none of its secrets,
    /// and an unset variable of such a server is no error.
    pub fn mcp_env_for(
        &self,
        servers: &[crate::agent_config::McpServer],
    ) -> Result<Vec<(String, String)>> {
        let mut env = Vec::new();
        if let Some((Value::Mcp(file), origin)) = self.values.get(&Key::Mcp) {
            if matches!(origin, Origin::Flag(_)) {
                return Ok(env);
            }
            for (name, e) in file {
                let Some(used) = servers.iter().find(|s| s.name == *name) else {
                    continue;
                };
                for var in e.env.iter().filter(|v| used.env.contains(v)) {
                    env.push((var.clone(), host_var(var, name, origin)?));
                }
                for (header, var) in e.header_vars() {
                    if used.headers.iter().any(|h| h == header) {
                        env.push((
                            crate::agent_config::mcp_header_var(name, header),
                            host_var(var, name, origin)?,
                        ));
                    }
                }
            }
        }
        Ok(env)
    }

    /// Every key with its value and origin, built-in defaults filled in: `config show`.
    pub fn table(&self) -> Vec<(Key, Option<Value>, Origin)> {
        let provider = self
            .str(Key::Provider)
            .and_then(|p| p.parse::<ProviderKind>().ok());
        Key::ALL
            .iter()
            .map(|&key| match self.values.get(&key) {
                Some((v, o)) => (key, Some(v.clone()), o.clone()),
                None => (key, default_value(key, provider), Origin::Default),
            })
            .collect()
    }
}

/// The value of host variable `var`, which MCP server `server` of the file at `origin`
/// names; unset is an error (the server would run without its credential).
fn host_var(var: &str, server: &str, origin: &Origin) -> Result<String> {
    std::env::var(var).map_err(|_| {
        Error::usage(format!(
            "MCP server '{server}' ({origin}) needs host variable {var}, which is not set"
        ))
        .with_hint(format!(
            "export {var}=..., or remove it from the config file"
        ))
    })
}

/// caw-box's own default for `key` (none where the CLI's own default applies).
fn default_value(key: Key, provider: Option<ProviderKind>) -> Option<Value> {
    let s = |v: &str| Some(Value::Str(v.to_string()));
    match key {
        Key::Image => provider.map(|p| Value::Str(p.default_image())),
        Key::ImageRepo => s(&crate::provider::image_repo()),
        Key::Network => s("open"),
        Key::WorkspaceMode => s("auto"),
        Key::ConnectTimeout => s("60s"),
        Key::IdleTimeout => s("off"),
        Key::PidsLimit => Some(Value::Int(crate::session::runner::DEFAULT_PIDS_LIMIT)),
        Key::UserConfig => Some(Value::Bool(false)),
        Key::Backend => s("docker"),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
