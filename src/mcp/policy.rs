//! What a `caw-box mcp` server lets its tool calls do. The orchestrating model reads untrusted
//! text all day, so a tool call is never stronger than the person who started the server
//! (the confused-deputy problem): the server's settings are ceilings ([`super::ceilings`]);
//! a call's places (its `workspace`, an `@FILE` in a prompt argument) resolve, symlinks
//! followed, inside a `--workspace-root`; bind mode needs `--allow-bind`; and the server sees
//! and touches only the sessions of its `--scope`.
//!
//! Built once, when the server starts, from its flags, `CAW_BOX_*` variables and config
//! files; a bad one stops the server (exit 2) before it serves.

use std::path::{Path, PathBuf};

use super::ceilings::{self, Ceilings};
use crate::cli::{SettingsArgs, WorkspaceModeArg};
use crate::config::{Key, Layer, Resolved};
use crate::error::{Error, Result};
use crate::provider::ProviderKind;
use crate::session::record::{SessionSettings, WorkspaceMode};

/// The scope a server has when none is given.
pub const DEFAULT_SCOPE: &str = "mcp";

/// A server's walls, as the person who started it set them.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The sessions this server may see and touch (label `io.caw-box.scope`).
    pub scope: String,
    /// Canonical directories a workspace or an `@FILE` must resolve inside.
    roots: Vec<PathBuf>,
    /// `--allow-bind`, or a server whose own workspace mode is bind.
    allow_bind: bool,
    /// `--on-limit park`: the server's sessions park at their account's usage limit.
    park: bool,
    pub ceilings: Ceilings,
}

/// What the server was started with, for [`Policy::new`].
#[derive(Debug)]
pub struct PolicyArgs<'a> {
    pub settings: &'a SettingsArgs,
    pub env: &'a [String],
    pub workspace_roots: &'a [PathBuf],
    pub allow_bind: bool,
    pub scope: Option<&'a str>,
    /// `--on-limit park`.
    pub park: bool,
}

impl Policy {
    pub fn new(a: PolicyArgs<'_>) -> Result<Policy> {
        let scope = a.scope.unwrap_or(DEFAULT_SCOPE).to_string();
        crate::settings::validate_name(&scope, "--scope")?;
        let flags = Layer::from_flags(None, None, a.settings);
        let config = Resolved::load(flags, a.settings.workspace.as_deref())?;
        let resolved = config.settings_args(a.settings)?;
        // The provider only picks the default image, which the ceilings keep per provider.
        let server = crate::settings::new_session_settings(ProviderKind::Codex, &resolved)?;
        let mut env_names: Vec<String> = a
            .env
            .iter()
            .map(|kv| {
                kv.split_once('=')
                    .map_or(kv.as_str(), |(k, _)| k)
                    .to_string()
            })
            .collect();
        env_names.extend(config.env_pass());
        env_names.extend(
            crate::settings::resolve_mcp_env(&resolved)?
                .into_iter()
                .map(|(k, _)| k),
        );
        let roots = roots(a.workspace_roots, &server)?;
        Ok(Policy {
            scope,
            roots,
            // A server whose own mode is bind (a flag or a config file said so) has allowed it.
            allow_bind: a.allow_bind || resolved.workspace_mode == Some(WorkspaceModeArg::Bind),
            park: a.park,
            ceilings: Ceilings {
                image: config.str(Key::Image),
                server,
                env_names,
            },
        })
    }

    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    /// Whether a sub-agent may edit a directory in place (`workspace_mode: bind`).
    pub fn allows_bind(&self) -> bool {
        self.allow_bind
    }

    fn roots_shown(&self) -> String {
        let shown: Vec<String> = self.roots.iter().map(|r| r.display().to_string()).collect();
        shown.join(", ")
    }

    /// `path` (relative to the server's directory) resolved, symlinks followed, and inside a
    /// root; `what` names it in the refusal.
    pub fn inside_roots(&self, path: &Path, what: &str) -> Result<PathBuf> {
        let canonical = path.canonicalize().map_err(|e| {
            Error::usage(format!("{what} '{}' cannot be used: {e}", path.display()))
        })?;
        if self.roots.iter().any(|r| canonical.starts_with(r)) {
            return Ok(canonical);
        }
        Err(Error::forbidden(format!(
            "{what} '{}' is outside this server's workspace roots ({})",
            path.display(),
            self.roots_shown()
        ))
        .with_hint(format!(
            "a tool call may only name places under a root; the person running the server can add one with `caw-box mcp --workspace-root {}`",
            canonical.display()
        )))
    }

    /// A call's `workspace`, as the canonical directory it names.
    pub fn workspace(&self, asked: &str) -> Result<PathBuf> {
        self.inside_roots(Path::new(asked), "workspace")
    }

    /// A call's `workspace_mode`: bind only where the server allows it.
    pub fn workspace_mode(&self, asked: WorkspaceModeArg) -> Result<()> {
        if matches!(asked, WorkspaceModeArg::Bind | WorkspaceModeArg::Auto) && !self.allow_bind {
            return Err(bind_forbidden());
        }
        Ok(())
    }

    /// A prompt argument's text: `@FILE` read from a file inside a root, else the text.
    pub fn prompt_arg(&self, value: &str, what: &str) -> Result<String> {
        let text = match value.strip_prefix('@') {
            Some(path) => {
                let file = self.inside_roots(Path::new(path), &format!("{what} @FILE"))?;
                std::fs::read_to_string(&file).map_err(|e| {
                    Error::usage(format!("{what}: cannot read the file '{path}': {e}"))
                })?
            }
            None => value.to_string(),
        };
        if text.trim().is_empty() {
            return Err(Error::usage(format!("{what} is empty")));
        }
        if text.len() > crate::agent_config::MAX_PROMPT_BYTES {
            return Err(Error::usage(format!(
                "{what} is {} bytes; at most {} are taken",
                text.len(),
                crate::agent_config::MAX_PROMPT_BYTES
            )));
        }
        Ok(text)
    }

    /// What a turn will run with, checked last, before anything is made: within every
    /// ceiling (whatever the call, the workspace's `.caw-box.toml` or the session's
    /// remembered settings asked for), its workspace inside a root, bind mode only where
    /// allowed.
    pub fn admit(
        &self,
        provider: ProviderKind,
        settings: &SessionSettings,
        env_names: &[String],
    ) -> Result<()> {
        self.ceilings.effective(provider, settings, env_names)?;
        if settings.workspace_mode == WorkspaceMode::Bind && !self.allow_bind {
            return Err(bind_forbidden());
        }
        if settings.workspace_mode != WorkspaceMode::None {
            if let Some(ws) = &settings.workspace {
                self.inside_roots(Path::new(ws), "workspace")?;
            }
        }
        Ok(())
    }

    /// Whether the server's sessions park at their account's usage limit (`--on-limit park`).
    pub fn parks(&self) -> bool {
        self.park
    }

    /// The system prompts of a turn: the server's, with the call's added after them.
    pub fn compose_prompts(
        &self,
        settings: &mut SessionSettings,
        system: Option<String>,
        append: Option<String>,
    ) {
        let server = &self.ceilings.server;
        if system.is_some() {
            settings.system_prompt = ceilings::added_to(server.system_prompt.as_deref(), system);
        }
        if append.is_some() {
            settings.append_system_prompt =
                ceilings::added_to(server.append_system_prompt.as_deref(), append);
        }
    }
}

fn bind_forbidden() -> Error {
    Error::forbidden(
        "workspace_mode 'bind' is wider than this server allows: a sub-agent would write into the directory itself",
    )
    .with_hint("use `copy` (its changes come back by `diff` and `apply`); the person running the server can allow bind mode with `caw-box mcp --allow-bind`")
}

/// `--workspace-root DIR`s, canonical; none given: the server's `--workspace`, else the
/// directory it was started in.
fn roots(given: &[PathBuf], server: &SessionSettings) -> Result<Vec<PathBuf>> {
    if given.is_empty() {
        let dir = match &server.workspace {
            Some(ws) => PathBuf::from(ws),
            None => std::env::current_dir()
                .map_err(|e| Error::usage(format!("cannot read the current directory: {e}")))?,
        };
        return Ok(vec![dir.canonicalize().unwrap_or(dir)]);
    }
    given
        .iter()
        .map(|r| {
            let c = r.canonicalize().map_err(|e| {
                Error::usage(format!(
                    "--workspace-root '{}' cannot be used: {e}",
                    r.display()
                ))
            })?;
            if !c.is_dir() {
                return Err(Error::usage(format!(
                    "--workspace-root '{}' is not a directory",
                    r.display()
                )));
            }
            Ok(c)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(root: &Path, allow_bind: bool) -> Policy {
        let settings = SettingsArgs {
            workspace: Some(root.to_path_buf()),
            ..Default::default()
        };
        Policy::new(PolicyArgs {
            park: false,
            settings: &settings,
            env: &[],
            workspace_roots: &[root.to_path_buf()],
            allow_bind,
            scope: None,
        })
        .unwrap()
    }

    #[test]
    fn places_resolve_inside_a_root_with_symlinks_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir_all(root.join("repo")).unwrap();
        std::fs::write(tmp.path().join("secret.txt"), "the key").unwrap();
        std::fs::write(root.join("prompt.md"), "Review carefully.").unwrap();
        std::os::unix::fs::symlink(tmp.path(), root.join("out")).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("secret.txt"), root.join("leak.md")).unwrap();
        let p = policy(&root, false);
        assert_eq!(p.scope, "mcp");
        let inside = p.workspace(root.join("repo").to_str().unwrap()).unwrap();
        assert_eq!(inside, root.join("repo").canonicalize().unwrap());
        for outside in [
            tmp.path().to_path_buf(),
            root.join(".."),
            root.join("out"),
            PathBuf::from("/etc"),
        ] {
            let e = p.workspace(outside.to_str().unwrap()).unwrap_err();
            assert_eq!(e.kind, crate::error::ErrorKind::Forbidden, "{e}");
            assert!(e.to_string().contains("--workspace-root"), "{e}");
        }
        let prompt = format!("@{}", root.join("prompt.md").display());
        assert_eq!(
            p.prompt_arg(&prompt, "system_prompt").unwrap(),
            "Review carefully."
        );
        assert_eq!(
            p.prompt_arg("plain text", "system_prompt").unwrap(),
            "plain text"
        );
        for leak in [
            "@/etc/hostname".to_string(),
            format!("@{}", root.join("leak.md").display()),
        ] {
            let e = p.prompt_arg(&leak, "system_prompt").unwrap_err();
            assert_eq!(e.kind, crate::error::ErrorKind::Forbidden, "{e}");
            assert!(!e.to_string().contains("the key"), "{e}");
        }
    }

    #[test]
    fn bind_mode_needs_allow_bind() {
        let tmp = tempfile::tempdir().unwrap();
        let p = policy(tmp.path(), false);
        assert!(p.workspace_mode(WorkspaceModeArg::Copy).is_ok());
        assert!(p.workspace_mode(WorkspaceModeArg::None).is_ok());
        let e = p.workspace_mode(WorkspaceModeArg::Bind).unwrap_err();
        assert_eq!(e.kind, crate::error::ErrorKind::Forbidden);
        assert!(e.to_string().contains("--allow-bind"), "{e}");
        assert!(policy(tmp.path(), true)
            .workspace_mode(WorkspaceModeArg::Bind)
            .is_ok());
    }

    #[test]
    fn a_scope_is_a_name() {
        let settings = SettingsArgs::default();
        let bad = Policy::new(PolicyArgs {
            park: false,
            settings: &settings,
            env: &[],
            workspace_roots: &[],
            allow_bind: false,
            scope: Some("no spaces"),
        });
        assert_eq!(bad.unwrap_err().exit_code(), 2);
    }
}
