//! A `caw-box mcp` server's settings as ceilings: for each setting a tool call (or the
//! repository a call names, through its `.caw-box.toml`) can change, what "no wider than the
//! server's" means, and the `forbidden` refusal that names the server flag which would allow
//! more. Pure: it compares settings, it reads and makes nothing. The table in docs/mcp.md
//! ("Ceilings") says the same per argument.
//!
//! Not here: places (workspace roots, `@FILE`s, bind mode) and scopes ([`super::policy`]).

use std::fmt::Display;
use std::time::Duration;

use crate::agent_config::ToolPolicy;
use crate::error::{Error, Result};
use crate::provider::ProviderKind;
use crate::session::record::{EgressPolicy, SessionSettings};

/// The widest a sub-agent of this server may get: the settings a session started with the
/// server's own flags, `CAW_BOX_*` variables and config files would have.
#[derive(Debug, Clone)]
pub struct Ceilings {
    pub server: SessionSettings,
    /// `--image` (or config `image`), if the server names one: else each provider's own.
    pub image: Option<String>,
    /// The variables a turn may carry: the server's `--env` names, its config's `env_pass`
    /// and its `--mcp-env`/`--mcp-header` variables.
    pub env_names: Vec<String>,
}

/// The refusal of a setting wider than the server's.
pub fn wider(arg: &str, asked: impl Display, allowed: impl Display, flag: &str) -> Error {
    Error::forbidden(format!(
        "{arg} {asked} is wider than this server allows ({allowed})"
    ))
    .with_hint(format!(
        "a tool call may narrow a sub-agent's box, never widen it; the person running the server can allow more with `caw-box mcp {flag} …`"
    ))
}

fn secs(s: u64) -> String {
    humantime::format_duration(Duration::from_secs(s)).to_string()
}

pub use crate::session::host_covered;

impl Ceilings {
    /// `--allow-host`: the server's hosts, `@provider` also spelled out (a call may name the
    /// provider's API host itself); empty: any host.
    fn allowed_hosts(&self, provider: ProviderKind) -> Vec<String> {
        let mut hosts = self.server.allow_hosts.clone();
        hosts.extend(crate::session::expand_allow_hosts(provider, &self.server));
        hosts
    }

    /// The server's egress as its flags say it: `--egress P` and its `--allow-host` hosts.
    fn egress_shown(&self) -> String {
        match self.server.allow_hosts.is_empty() {
            true => format!("--egress {}", self.server.egress()),
            false => format!(
                "--egress {} --allow-host {}",
                self.server.egress(),
                self.server.allow_hosts.join(", ")
            ),
        }
    }

    /// A call's (or a session's) hosts added to its egress policy: each one the server's
    /// sessions reach already (its `--allow-host` hosts, the model's, and under `balanced`
    /// the package hosts). A server under `--egress open` admits any.
    pub fn hosts(&self, provider: ProviderKind, asked: &[String]) -> Result<()> {
        let policy = self.server.egress();
        if policy == EgressPolicy::Open {
            return Ok(());
        }
        let mut allowed = self.allowed_hosts(provider);
        allowed.push("@provider".to_string());
        if policy == EgressPolicy::Balanced {
            allowed.extend(crate::session::balanced_hosts());
        }
        match asked
            .iter()
            .find(|h| !allowed.iter().any(|a| host_covered(h, a)))
        {
            Some(h) => Err(wider(
                "allow_host",
                format!("'{h}'"),
                self.egress_shown(),
                &format!("--allow-host {h}"),
            )),
            None => Ok(()),
        }
    }

    /// `--egress`: a call may close a session's egress further, never open it.
    pub fn egress(&self, asked: EgressPolicy) -> Result<()> {
        let server = self.server.egress();
        match asked < server {
            true => Err(wider(
                "egress",
                format!("'{asked}'"),
                self.egress_shown(),
                &format!("--egress {asked}"),
            )),
            false => Ok(()),
        }
    }

    /// `--runtime R` admits only R; a server without one admits any.
    pub fn runtime(&self, asked: Option<&str>) -> Result<()> {
        match &self.server.runtime {
            Some(r) if asked != Some(r.as_str()) => Err(wider(
                "runtime",
                format!("'{}'", asked.unwrap_or("default")),
                format!("--runtime {r}"),
                "--runtime NAME",
            )),
            _ => Ok(()),
        }
    }

    /// `--tools`: at most the server's groups; `--allow-tool` names no more than the
    /// server's, `--deny-tool` at least the server's.
    pub fn tools(&self, asked: Option<&ToolPolicy>) -> Result<()> {
        let server = self.server.tools.clone().unwrap_or_default();
        let asked = asked.cloned().unwrap_or_default();
        if let Some(allowed) = &server.groups {
            let shown = || {
                let names: Vec<&str> = allowed.iter().map(|g| g.as_str()).collect();
                format!(
                    "--tools {}",
                    if names.is_empty() {
                        "none".into()
                    } else {
                        names.join(",")
                    }
                )
            };
            match &asked.groups {
                None => return Err(wider("tools", "'all'", shown(), "--tools GROUPS")),
                Some(groups) => {
                    if let Some(g) = groups.iter().find(|g| !allowed.contains(g)) {
                        return Err(wider(
                            "tools",
                            format!("'{}'", g.as_str()),
                            shown(),
                            "--tools GROUPS",
                        ));
                    }
                }
            }
        }
        if let Some(name) = asked.allow.iter().find(|n| !server.allow.contains(n)) {
            return Err(wider(
                "allow_tool",
                format!("'{name}'"),
                "its --allow-tool names",
                &format!("--allow-tool {name}"),
            ));
        }
        if let Some(name) = server.deny.iter().find(|n| !asked.deny.contains(n)) {
            return Err(wider(
                "tools",
                format!("without --deny-tool {name}"),
                format!("--deny-tool {name}"),
                "(no --deny-tool)",
            ));
        }
        Ok(())
    }

    /// A limit the server sets (`Some`) that a call may only lower.
    fn at_most<T: PartialOrd + Copy>(
        arg: &str,
        asked: Option<T>,
        server: Option<T>,
        flag: &str,
        show: impl Fn(T) -> String,
    ) -> Result<()> {
        match (asked, server) {
            (_, None) => Ok(()),
            (Some(a), Some(s)) if a <= s => Ok(()),
            (a, Some(s)) => Err(wider(
                arg,
                a.map_or_else(|| "(no limit)".to_string(), &show),
                format!("{flag} {}", show(s)),
                flag,
            )),
        }
    }

    pub fn max_cost(&self, asked: Option<f64>) -> Result<()> {
        Self::at_most(
            "max_cost_usd",
            asked,
            self.server.max_cost_usd,
            "--max-cost",
            |c| format!("{c}"),
        )
    }

    pub fn timeout(&self, asked: Option<u64>) -> Result<()> {
        Self::at_most(
            "timeout",
            asked,
            self.server.timeout_secs,
            "--timeout",
            secs,
        )
    }

    /// `--keep-warm`: a server without it keeps no sub-agent's container idle (0).
    pub fn keep_warm(&self, asked: u64) -> Result<()> {
        let server = self.server.keep_warm_secs.unwrap_or(0);
        if asked <= server {
            return Ok(());
        }
        Err(wider(
            "keep_warm",
            secs(asked),
            if server == 0 {
                "no --keep-warm".to_string()
            } else {
                format!("--keep-warm {}", secs(server))
            },
            "--keep-warm DURATION",
        ))
    }

    pub fn memory(&self, asked: Option<i64>) -> Result<()> {
        Self::at_most("memory", asked, self.server.memory, "--memory", |m| {
            format!("{}m", m >> 20)
        })
    }

    pub fn cpus(&self, asked: Option<f64>) -> Result<()> {
        Self::at_most("cpus", asked, self.server.cpus, "--cpus", |c| {
            format!("{c}")
        })
    }

    /// What a turn will run with, after everything (the call's arguments, the workspace's
    /// `.caw-box.toml`, the session's remembered settings) was applied: within every ceiling,
    /// and the server's own choices (image, endpoint, network, MCP servers, protected paths,
    /// system prompts) kept. This is what holds when a repository's config file, not the
    /// call, asks for more.
    pub fn effective(
        &self,
        provider: ProviderKind,
        s: &SessionSettings,
        env_names: &[String],
    ) -> Result<()> {
        self.egress(s.egress())?;
        self.hosts(provider, &s.allow_hosts)?;
        self.runtime(s.runtime.as_deref())?;
        self.tools(s.tools.as_ref())?;
        self.max_cost(s.max_cost_usd)?;
        self.timeout(s.timeout_secs)?;
        self.keep_warm(s.keep_warm_secs.unwrap_or(0))?;
        self.memory(s.memory)?;
        self.cpus(s.cpus)?;
        Self::at_most(
            "pids_limit",
            s.pids_limit,
            self.server.pids_limit,
            "--pids-limit",
            |p| p.to_string(),
        )?;
        // The server's cap on its account's turns in flight holds for every turn it runs.
        Self::at_most(
            "per_account",
            s.per_account,
            self.server.per_account,
            "--per-account",
            |n| n.to_string(),
        )?;
        self.kept(provider, s, env_names)
    }

    /// The server's own choices, which no call or repository changes: the image, the model's
    /// endpoint, the network, the MCP servers, the protected paths, the system prompts (the
    /// server's first) and the variables a turn carries.
    fn kept(
        &self,
        provider: ProviderKind,
        s: &SessionSettings,
        env_names: &[String],
    ) -> Result<()> {
        let image = self
            .image
            .clone()
            .unwrap_or_else(|| provider.default_image());
        if s.image != image {
            return Err(wider(
                "image",
                format!("'{}'", s.image),
                format!("image {image}"),
                "--image",
            ));
        }
        if s.endpoint != self.server.endpoint {
            return Err(wider(
                "endpoint",
                format!("'{}'", s.endpoint.as_deref().unwrap_or("(the vendor's)")),
                format!(
                    "endpoint {}",
                    self.server.endpoint.as_deref().unwrap_or("(the vendor's)")
                ),
                "--endpoint URL",
            ));
        }
        if s.network != self.server.network {
            return Err(wider(
                "network",
                format!("'{}'", s.network),
                format!("--network {}", self.server.network),
                "--network NAME",
            ));
        }
        if let Some(m) = s.mcp.iter().find(|m| !self.server.mcp.contains(m)) {
            return Err(wider(
                "mcp server",
                format!("'{}'", m.name),
                "its --mcp servers",
                &format!("--mcp {}=…", m.name),
            ));
        }
        if let Some(p) = self.server.protect.iter().find(|p| !s.protect.contains(p)) {
            return Err(wider(
                "protect",
                format!("without {p}"),
                format!("--protect {p}"),
                "(no --protect)",
            ));
        }
        if let Some(p) = s
            .unprotect
            .iter()
            .find(|p| !self.server.unprotect.contains(p))
        {
            return Err(wider(
                "unprotect",
                format!("'{p}'"),
                "its --unprotect paths",
                &format!("--unprotect {p}"),
            ));
        }
        for (arg, server, asked) in [
            (
                "system_prompt",
                &self.server.system_prompt,
                &s.system_prompt,
            ),
            (
                "append_system_prompt",
                &self.server.append_system_prompt,
                &s.append_system_prompt,
            ),
        ] {
            if let Some(server) = server {
                if !asked
                    .as_deref()
                    .is_some_and(|a| a.starts_with(server.as_str()))
                {
                    return Err(wider(
                        arg,
                        "(one that drops the server's)",
                        format!("--{} as the start of it", arg.replace('_', "-")),
                        &format!("--{}", arg.replace('_', "-")),
                    ));
                }
            }
        }
        if let Some(name) = env_names.iter().find(|n| !self.env_names.contains(n)) {
            return Err(wider(
                "env",
                format!("'{name}'"),
                "its --env names and env_pass",
                &format!("--env {name}"),
            ));
        }
        Ok(())
    }
}

/// A call's prompt text added to the server's: the server's first, never replaced.
pub fn added_to(server: Option<&str>, call: Option<String>) -> Option<String> {
    match (server, call) {
        (Some(s), Some(c)) => Some(format!("{s}\n\n{c}")),
        (Some(s), None) => Some(s.to_string()),
        (None, c) => c,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent_config::ToolGroup;

    fn ceilings(f: impl FnOnce(&mut SessionSettings)) -> Ceilings {
        let mut server = SessionSettings {
            image: ProviderKind::Codex.default_image(),
            network: "open".into(),
            ..Default::default()
        };
        f(&mut server);
        Ceilings {
            server,
            image: None,
            env_names: vec!["OPENAI_API_KEY".into()],
        }
    }

    fn forbidden(r: Result<()>, names: &str) {
        let e = r.unwrap_err();
        assert_eq!(e.kind, crate::error::ErrorKind::Forbidden, "{e}");
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains(names), "{e} lacks {names}");
    }

    #[test]
    fn a_host_is_covered_by_itself_its_wildcard_and_a_portless_entry() {
        assert!(host_covered("pypi.org", "pypi.org"));
        assert!(host_covered("PyPI.org:443", "pypi.org"));
        assert!(host_covered("a.example.com", "*.example.com"));
        assert!(host_covered("*.a.example.com", "*.example.com"));
        assert!(host_covered("*.example.com", "*.example.com"));
        assert!(host_covered("api.x.io:443", "api.x.io:443"));
        assert!(host_covered("@provider", "@provider"));
        for (asked, allowed) in [
            ("example.com", "*.example.com"),
            ("evil-example.com", "*.example.com"),
            ("api.x.io", "api.x.io:443"),
            ("api.x.io:80", "api.x.io:443"),
            ("anything.example", "@provider"),
            ("@provider", "api.openai.com"),
            ("*.com", "*.example.com"),
        ] {
            assert!(!host_covered(asked, allowed), "{asked} under {allowed}");
        }
    }

    #[test]
    fn hosts_narrow_under_allow_host_and_anything_goes_without_it() {
        let open = ceilings(|_| {});
        assert!(open
            .hosts(ProviderKind::Codex, &["anything.example".into()])
            .is_ok());
        assert!(open.hosts(ProviderKind::Codex, &[]).is_ok());
        let locked = ceilings(|s| s.allow_hosts = vec!["@provider".into(), "pypi.org".into()]);
        assert!(locked
            .hosts(ProviderKind::Codex, &["@provider".into()])
            .is_ok());
        assert!(locked
            .hosts(ProviderKind::Codex, &["pypi.org:443".into()])
            .is_ok());
        // The provider's API host spelled out is the same host as `@provider`, on its port.
        assert!(locked
            .hosts(ProviderKind::Codex, &["api.openai.com:443".into()])
            .is_ok());
        forbidden(
            locked.hosts(ProviderKind::Codex, &["api.openai.com".into()]),
            "'api.openai.com'",
        );
        forbidden(
            locked.hosts(
                ProviderKind::Codex,
                &["@provider".into(), "anything.example".into()],
            ),
            "--allow-host anything.example",
        );
        // No host beyond the policy's is no wider than the server.
        assert!(locked.hosts(ProviderKind::Codex, &[]).is_ok());
    }

    /// The policy only closes; hosts added under `balanced` must be the server's already
    /// (its own, the model's, or the package hosts of `balanced`).
    #[test]
    fn egress_may_only_close() {
        let balanced = ceilings(|s| s.egress_policy = Some(EgressPolicy::Balanced));
        assert!(balanced.egress(EgressPolicy::Locked).is_ok());
        assert!(balanced.egress(EgressPolicy::Balanced).is_ok());
        forbidden(balanced.egress(EgressPolicy::Open), "'open'");
        assert!(balanced
            .hosts(ProviderKind::Codex, &["pypi.org:443".into()])
            .is_ok());
        // Any port of it is more than balanced's 80 and 443.
        forbidden(
            balanced.hosts(ProviderKind::Codex, &["pypi.org".into()]),
            "'pypi.org'",
        );
        assert!(balanced
            .hosts(ProviderKind::Codex, &["@provider".into()])
            .is_ok());
        forbidden(
            balanced.hosts(ProviderKind::Codex, &["evil.example.com".into()]),
            "--egress balanced",
        );
        let locked = ceilings(|s| s.egress_policy = Some(EgressPolicy::Locked));
        forbidden(locked.egress(EgressPolicy::Balanced), "'balanced'");
        forbidden(
            locked.hosts(ProviderKind::Codex, &["pypi.org:443".into()]),
            "--egress locked",
        );
        let open = ceilings(|s| s.egress_policy = Some(EgressPolicy::Open));
        assert!(open.egress(EgressPolicy::Open).is_ok());
        assert!(open
            .hosts(ProviderKind::Codex, &["evil.example.com".into()])
            .is_ok());
    }

    #[test]
    fn runtime_tools_and_limits_may_only_narrow() {
        let c = ceilings(|s| {
            s.runtime = Some("runsc".into());
            s.tools = Some(ToolPolicy {
                groups: Some(vec![ToolGroup::Read, ToolGroup::Edit]),
                allow: vec![],
                deny: vec!["WebFetch".into()],
            });
            s.max_cost_usd = Some(1.0);
            s.timeout_secs = Some(600);
            s.memory = Some(2 << 30);
        });
        assert!(c.runtime(Some("runsc")).is_ok());
        forbidden(c.runtime(None), "--runtime runsc");
        forbidden(c.runtime(Some("runc")), "'runc'");
        let read_only = ToolPolicy {
            groups: Some(vec![ToolGroup::Read]),
            allow: vec![],
            deny: vec!["WebFetch".into()],
        };
        assert!(c.tools(Some(&read_only)).is_ok());
        let shell = ToolPolicy {
            groups: Some(vec![ToolGroup::Read, ToolGroup::Shell]),
            ..read_only.clone()
        };
        forbidden(c.tools(Some(&shell)), "'shell'");
        forbidden(c.tools(None), "'all'");
        let undenied = ToolPolicy {
            deny: vec![],
            ..read_only
        };
        forbidden(c.tools(Some(&undenied)), "WebFetch");
        assert!(c.max_cost(Some(0.5)).is_ok());
        forbidden(c.max_cost(Some(2.0)), "--max-cost 1");
        forbidden(c.max_cost(None), "(no limit)");
        assert!(c.timeout(Some(60)).is_ok());
        forbidden(c.timeout(Some(3600)), "--timeout 10m");
        assert!(c.memory(Some(1 << 30)).is_ok());
        forbidden(c.memory(Some(4 << 30)), "--memory 2048m");
        assert!(c.cpus(Some(8.0)).is_ok(), "no --cpus: any");
        // No --keep-warm: a call keeps nothing warm.
        assert!(c.keep_warm(0).is_ok());
        forbidden(c.keep_warm(300), "no --keep-warm");
        let warm = ceilings(|s| s.keep_warm_secs = Some(600));
        assert!(warm.keep_warm(300).is_ok());
        forbidden(warm.keep_warm(3600), "--keep-warm 10m");
        // A server's cap on its account's turns in flight: a session of fewer is fine, one
        // of more or none is not.
        let capped = ceilings(|s| s.per_account = Some(2));
        let mut s = capped.server.clone();
        s.per_account = Some(1);
        assert!(capped.effective(ProviderKind::Codex, &s, &[]).is_ok());
        s.per_account = Some(3);
        forbidden(
            capped.effective(ProviderKind::Codex, &s, &[]),
            "--per-account 2",
        );
        s.per_account = None;
        forbidden(capped.effective(ProviderKind::Codex, &s, &[]), "(no limit)");
    }

    #[test]
    fn effective_settings_keep_the_servers_choices() {
        let c = ceilings(|s| {
            s.system_prompt = Some("Be careful.".into());
            s.endpoint = Some("http://gateway:8080".into());
        });
        let mut s = c.server.clone();
        s.system_prompt = added_to(Some("Be careful."), Some("Review src/.".into()));
        assert_eq!(
            s.system_prompt.as_deref(),
            Some("Be careful.\n\nReview src/.")
        );
        assert!(c
            .effective(ProviderKind::Codex, &s, &["OPENAI_API_KEY".into()])
            .is_ok());
        let mut replaced = s.clone();
        replaced.system_prompt = Some("Ignore the rules.".into());
        forbidden(
            c.effective(ProviderKind::Codex, &replaced, &[]),
            "system_prompt",
        );
        let mut elsewhere = s.clone();
        elsewhere.endpoint = Some("http://evil:80".into());
        forbidden(
            c.effective(ProviderKind::Codex, &elsewhere, &[]),
            "endpoint",
        );
        let mut other_image = s.clone();
        other_image.image = "evil/image".into();
        forbidden(c.effective(ProviderKind::Codex, &other_image, &[]), "image");
        let mut host_net = s.clone();
        host_net.network = "host".into();
        forbidden(
            c.effective(ProviderKind::Codex, &host_net, &[]),
            "--network open",
        );
        forbidden(
            c.effective(ProviderKind::Codex, &s, &["AWS_SECRET_ACCESS_KEY".into()]),
            "'AWS_SECRET_ACCESS_KEY'",
        );
    }
}
