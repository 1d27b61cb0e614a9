//! The layering: per key, the first layer that gives it wins ([`Resolved`]); what a
//! resolved setting becomes for `run`, `resume` and `config show`.

use std::collections::BTreeMap;
use std::path::Path;

use super::sources::{files, process_env, read_layer, workspace_dir};
use super::{ConfigFile, Key, Layer, Origin, Value};
use crate::cli::{SettingsArgs, WorkspaceModeArg};
use crate::error::{Error, Result};
use crate::provider::ProviderKind;

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

    /// `prices` (the user file's): the person's prices, before the price table's.
    pub fn prices(&self) -> crate::provider::pricing::PriceBook {
        match self.get(Key::Prices) {
            Some(Value::Prices(book)) => book.clone(),
            _ => Default::default(),
        }
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
        out.protect = self.list(Key::Protect);
        out.unprotect = self.list(Key::Unprotect);
        out.network = self.str(Key::Network);
        out.runtime = self.str(Key::Runtime);
        out.allow_host = self.list(Key::AllowHost);
        out.egress = self.str(Key::Egress);
        out.memory = self.str(Key::Memory);
        out.cpus = match self.get(Key::Cpus) {
            Some(Value::Float(c)) => Some(*c),
            _ => None,
        };
        out.max_cost = match self.get(Key::MaxCost) {
            Some(Value::Float(c)) => Some(*c),
            _ => None,
        };
        out.pids_limit = match self.get(Key::PidsLimit) {
            Some(Value::Int(p)) => Some(*p),
            _ => None,
        };
        out.per_account = match self.get(Key::PerAccount) {
            Some(Value::Int(n)) => Some(*n),
            _ => None,
        };
        out.timeout = self.str(Key::Timeout);
        out.idle_timeout = self.str(Key::IdleTimeout);
        out.keep_warm = self.str(Key::KeepWarm);
        out.checkpoints = match self.get(Key::Checkpoints) {
            Some(Value::Bool(on)) => Some(*on),
            _ => None,
        };
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
    ///
    /// [`settings::resolve_mcp_env`]: crate::settings::resolve_mcp_env
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
        Key::Egress => s("balanced"),
        Key::WorkspaceMode => s("auto"),
        Key::ConnectTimeout => s("60s"),
        Key::IdleTimeout | Key::KeepWarm => s("off"),
        Key::PidsLimit => Some(Value::Int(crate::session::runner::DEFAULT_PIDS_LIMIT)),
        Key::UserConfig => Some(Value::Bool(false)),
        Key::Checkpoints => Some(Value::Bool(true)),
        Key::Backend => s("docker"),
        _ => None,
    }
}
