//! Config files and the layering of settings: flags > `CAW_BOX_*` variables > the project
//! file (`.caw-box.toml`, from the workspace up to the repository root) > the user file
//! (`$CAW_BOX_CONFIG`, else `$XDG_CONFIG_HOME/caw-box/config.toml`) > built-in defaults.
//!
//! This module finds and reads the files and says, per setting, which layer won and where
//! it came from. It does not decide what a value means: `settings` checks and applies the
//! winning values exactly as it does flags, so a value means the same in a file and on the
//! command line. Config files shape new sessions; a resumed session keeps the settings it
//! remembers, and only its turn-level keys (`env_pass`, `labels`) come from the files.
//!
//! - `mod.rs`: the vocabulary: keys, values, origins, layers
//! - `sources.rs`: the layers of flags and variables, and which files there are
//! - `file.rs`: a config file read into a layer (`secrets.rs`: what must not be in one)
//! - `validate.rs`: a value from a file or a variable checked as its flag is
//! - `resolve.rs`: the layers resolved into the settings a command uses

mod file;
mod resolve;
pub mod secrets;
mod sources;
mod validate;

use std::collections::BTreeMap;

use serde::Serialize;

pub use resolve::Resolved;

/// The `backend` setting as the variables and config files give it (`CAW_BOX_BACKEND`, then
/// the project file, then the user file), unresolved; `None` where none gives one, or the
/// files cannot be read (the command reading them says why). Where the backend is chosen
/// ([`crate::client::chosen_backend`]), a flag or a client's setting comes first.
pub fn configured_backend() -> Option<String> {
    Resolved::load(Layer::default(), None)
        .ok()
        .and_then(|c| c.str(Key::Backend))
}
pub use sources::{files, files_here, project_candidates, user_file, ConfigFile};
use validate::check;

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
    Egress,
    Memory,
    Cpus,
    PidsLimit,
    PerAccount,
    Timeout,
    IdleTimeout,
    KeepWarm,
    Checkpoints,
    ConnectTimeout,
    MaxCost,
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
    Runtime,
    Protect,
    Unprotect,
    Prices,
}

impl Key {
    pub const ALL: [Key; 35] = [
        Key::Provider,
        Key::Model,
        Key::Image,
        Key::Endpoint,
        Key::Network,
        Key::AllowHost,
        Key::Egress,
        Key::Memory,
        Key::Cpus,
        Key::PidsLimit,
        Key::PerAccount,
        Key::Timeout,
        Key::IdleTimeout,
        Key::KeepWarm,
        Key::Checkpoints,
        Key::ConnectTimeout,
        Key::MaxCost,
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
        Key::Runtime,
        Key::Protect,
        Key::Unprotect,
        Key::Prices,
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
            Key::Egress => "egress",
            Key::Memory => "memory",
            Key::Cpus => "cpus",
            Key::PidsLimit => "pids_limit",
            Key::PerAccount => "per_account",
            Key::Timeout => "timeout",
            Key::IdleTimeout => "idle_timeout",
            Key::KeepWarm => "keep_warm",
            Key::Checkpoints => "checkpoints",
            Key::ConnectTimeout => "connect_timeout",
            Key::MaxCost => "max_cost",
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
            Key::Runtime => "runtime",
            Key::Protect => "protect",
            Key::Unprotect => "unprotect",
            Key::Prices => "prices",
        }
    }

    /// Its flag, if it has one (`labels`, `env_pass` and `prices` are config-only; `--env`
    /// adds).
    pub fn flag(self) -> Option<String> {
        match self {
            Key::Labels | Key::EnvPass | Key::Prices => None,
            k => Some(format!("--{}", k.name().replace('_', "-"))),
        }
    }

    /// The `CAW_BOX_*` variable that sets it: each key but `env_pass` (a variable naming
    /// variables would only hide where a value came from), `mcp` and `prices` (tables).
    /// Lists are comma-separated, labels `k=v,k=v` (the variable caw-box always had).
    pub fn env_var(self) -> Option<String> {
        match self {
            Key::EnvPass | Key::Mcp | Key::Prices => None,
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
    /// `prices`: USD per million tokens, by model id.
    Prices(crate::provider::pricing::PriceBook),
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
            Value::Prices(book) => book
                .iter()
                .map(|(model, p)| {
                    let mut s = format!("{model}: in {} out {}", p.input, p.output);
                    if let Some(r) = p.cache_read {
                        s.push_str(&format!(" cache read {r}"));
                    }
                    if let Some(w) = p.cache_write {
                        s.push_str(&format!(" cache write {w}"));
                    }
                    s
                })
                .collect::<Vec<_>>()
                .join("; "),
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

#[cfg(test)]
mod tests;
