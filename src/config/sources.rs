//! What each source gives: the [`Layer`]s of flags and of `CAW_BOX_*` variables, and which
//! config files there are for a workspace (`file.rs` reads one).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{check, file, Key, Layer, McpEntry, Origin, Value, PROJECT_FILE};
use crate::cli::{SettingsArgs, WorkspaceModeArg};
use crate::error::{Error, Result};

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
        put(Key::Runtime, s(&args.runtime));
        put(Key::Egress, s(&args.egress));
        for (key, values) in [
            (Key::Protect, &args.protect),
            (Key::Unprotect, &args.unprotect),
        ] {
            put(
                key,
                (!values.is_empty()).then(|| Value::List(values.clone())),
            );
        }
        put(Key::Mcp, mcp_flags(args).map(Value::Mcp));
        put(
            Key::AllowHost,
            (!args.allow_host.is_empty()).then(|| Value::List(args.allow_host.clone())),
        );
        put(Key::Memory, s(&args.memory));
        put(Key::Cpus, args.cpus.map(Value::Float));
        put(Key::MaxCost, args.max_cost.map(Value::Float));
        put(Key::PidsLimit, args.pids_limit.map(Value::Int));
        put(Key::PerAccount, args.per_account.map(Value::Int));
        put(Key::Timeout, s(&args.timeout));
        put(Key::IdleTimeout, s(&args.idle_timeout));
        put(Key::KeepWarm, s(&args.keep_warm));
        put(Key::Checkpoints, args.checkpoints.map(Value::Bool));
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
                Key::AllowHost | Key::AllowTool | Key::DenyTool | Key::Protect | Key::Unprotect => {
                    Value::List(split_list(&raw))
                }
                Key::Labels => Value::Map(
                    crate::session::record::parse_labels(&raw)
                        .into_iter()
                        .collect(),
                ),
                Key::Cpus | Key::MaxCost => Value::Float(
                    raw.trim()
                        .parse()
                        .map_err(|_| Error::usage(format!("{var} '{raw}' is not a number")))?,
                ),
                Key::PidsLimit | Key::PerAccount => {
                    Value::Int(raw.trim().parse().map_err(|_| {
                        Error::usage(format!("{var} '{raw}' is not a whole number"))
                    })?)
                }
                Key::UserConfig => Value::Bool(match raw.trim() {
                    "1" | "true" | "yes" => true,
                    "0" | "false" | "no" => false,
                    _ => return Err(Error::usage(format!("{var} '{raw}' is not true or false"))),
                }),
                Key::Checkpoints => Value::Bool(
                    crate::cli::parse_on_off(&raw)
                        .map_err(|_| Error::usage(format!("{var} '{raw}' is not on or off")))?,
                ),
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

/// The process environment, with this process's connection settings (`--backend`,
/// `--image-repo`, a client's) over their variables.
pub(super) fn process_env(name: &str) -> Option<String> {
    crate::connection::var(name)
}

/// Where to look for the project file: the workspace given (absolute, so its parents are
/// searched too), else the current directory.
pub(super) fn workspace_dir(workspace: Option<&Path>) -> Result<PathBuf> {
    match workspace {
        Some(w) => Ok(std::path::absolute(w).unwrap_or_else(|_| w.to_path_buf())),
        None => std::env::current_dir()
            .map_err(|e| Error::usage(format!("cannot read the current directory: {e}"))),
    }
}

pub(super) fn read_layer(path: &Path, origin: fn(String) -> Origin) -> Result<Layer> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::usage(format!("cannot read config file '{}': {e}", path.display())))?;
    file::parse(path, &text, origin)
}
