//! How a caller shapes the agent the same way for every vendor: the system prompt (replaced or
//! appended to), the reasoning effort and the tools it may use. These are settings a session remembers; each
//! provider adapter maps them to its CLI's own mechanism, and one that has no such mechanism
//! is refused up front (exit 2, naming the provider), never silently ignored.
//!
//! Not here: the mapping itself (each adapter in `provider/`, which reads these settings:
//! this module never names an adapter, a caller hands it what one says, its [`Support`] or its
//! tool names), nor the flags (`cli.rs`).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
pub use crate::event::ToolGroup;
use crate::provider_kind::ProviderKind;

/// Where the texts go in the agent's HOME (relative to it): files the CLI reads, so a long
/// prompt stays out of the container's argv and environment (and `docker inspect`).
pub const SYSTEM_PROMPT_FILE: &str = ".caw-box/agent/system-prompt.md";
pub const APPEND_SYSTEM_PROMPT_FILE: &str = ".caw-box/agent/append-system-prompt.md";

/// The longest system prompt text taken (either kind): it is remembered in the session's
/// volume labels, which Docker keeps in memory for every `ls`.
pub const MAX_PROMPT_BYTES: usize = 64 * 1024;

/// `--effort`: how hard the model thinks, in the vocabulary every provider shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Effort {
    Low,
    Medium,
    High,
}

impl Effort {
    pub fn as_str(self) -> &'static str {
        match self {
            Effort::Low => "low",
            Effort::Medium => "medium",
            Effort::High => "high",
        }
    }

    pub fn parse(s: &str, what: &str) -> Result<Effort> {
        match s.trim().to_ascii_lowercase().as_str() {
            "low" => Ok(Effort::Low),
            "medium" => Ok(Effort::Medium),
            "high" => Ok(Effort::High),
            _ => Err(Error::usage(format!(
                "{what} '{s}' is not an effort: low, medium or high"
            ))),
        }
    }
}

/// What a provider's CLI can be told: checked before anything is created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Support {
    /// It can replace its default system prompt.
    pub replace: bool,
    /// It can add to its default system prompt.
    pub append: bool,
    /// It has a reasoning-effort knob.
    pub effort: bool,
    /// The tool groups it can take away from the agent (`--tools`).
    pub tool_groups: &'static [ToolGroup],
    /// It takes tool names to allow and deny (`--allow-tool`, `--deny-tool`).
    pub tool_names: bool,
}

/// Which tools a session's agent may use: remembered by the session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolPolicy {
    /// `--tools`: the groups the agent may use; `None`: every group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<Vec<ToolGroup>>,
    /// `--allow-tool`: vendor tool names kept although their group is not given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// `--deny-tool`: vendor tool names taken away.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
}

impl ToolPolicy {
    /// Nothing is taken away.
    pub fn is_unrestricted(&self) -> bool {
        self.groups.is_none() && self.deny.is_empty()
    }

    /// The groups not given to `--tools`.
    pub fn denied_groups(&self) -> Vec<ToolGroup> {
        match &self.groups {
            None => Vec::new(),
            Some(given) => ToolGroup::ALL
                .into_iter()
                .filter(|g| !given.contains(g))
                .collect(),
        }
    }

    /// The vendor tool names to take away, given a CLI's names per group: those of the
    /// denied groups and `--deny-tool`'s, less `--allow-tool`'s.
    pub fn denied_names(&self, table: &[(ToolGroup, &[&str])]) -> Vec<String> {
        let denied = self.denied_groups();
        let mut names: Vec<String> = table
            .iter()
            .filter(|(g, _)| denied.contains(g))
            .flat_map(|(_, names)| names.iter().map(|n| n.to_string()))
            .chain(self.deny.iter().cloned())
            .filter(|n| !self.allow.contains(n))
            .collect();
        names.dedup();
        names
    }

    /// Reads `--tools`: `all`, `none`, or groups separated by commas.
    pub fn parse_groups(value: &str, what: &str) -> Result<Option<Vec<ToolGroup>>> {
        let value = value.trim().to_ascii_lowercase();
        match value.as_str() {
            "all" => return Ok(None),
            "none" => return Ok(Some(Vec::new())),
            _ => {}
        }
        let mut groups = Vec::new();
        for word in value.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            let group = ToolGroup::ALL
                .into_iter()
                .find(|g| g.as_str() == word)
                .ok_or_else(|| {
                    Error::usage(format!(
                        "{what}: '{word}' is not a tool group: read, edit, shell, web, mcp \
                         (or all, none)"
                    ))
                })?;
            if !groups.contains(&group) {
                groups.push(group);
            }
        }
        if groups.is_empty() {
            return Err(Error::usage(format!(
                "{what} is empty: give groups (read,edit,shell,web,mcp), all or none"
            )));
        }
        groups.sort();
        Ok(Some(groups))
    }

    /// Reads one `--allow-tool` / `--deny-tool` name.
    pub fn check_name(name: &str, what: &str) -> Result<String> {
        let name = name.trim();
        if name.is_empty() || name.len() > 200 || name.chars().any(char::is_control) {
            return Err(Error::usage(format!("{what} '{name}' is not a tool name")));
        }
        Ok(name.to_string())
    }

    /// `show`'s line.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        match &self.groups {
            None => parts.push("all".to_string()),
            Some(g) if g.is_empty() => parts.push("none".to_string()),
            Some(g) => parts.push(g.iter().map(|g| g.as_str()).collect::<Vec<_>>().join(",")),
        }
        if !self.allow.is_empty() {
            parts.push(format!("allow {}", self.allow.join(",")));
        }
        if !self.deny.is_empty() {
            parts.push(format!("deny {}", self.deny.join(",")));
        }
        parts.join("; ")
    }
}

/// The group of a vendor tool name, from a CLI's table; `mcp__…` names are MCP tools.
pub fn group_of(table: &[(ToolGroup, &[&str])], name: &str) -> Option<ToolGroup> {
    if name.starts_with("mcp__") {
        return Some(ToolGroup::Mcp);
    }
    table
        .iter()
        .find(|(_, names)| names.contains(&name))
        .map(|(g, _)| *g)
}

/// Adds the tool group to each `tool_call` event that has none, from the CLI's `table` (its
/// adapter's `tool_names`), and names the tools of the session's MCP servers (`mcp_servers`)
/// `mcp__server__tool`.
pub fn tag_tool_groups(
    table: &[(ToolGroup, &[&str])],
    mcp_servers: &[String],
    events: &mut [crate::event::Event],
) {
    for e in events {
        if let crate::event::Event::ToolCall { name, group, .. } = e {
            if let Some(unified) = unified_mcp_name(mcp_servers, name) {
                *name = unified;
            }
            if group.is_none() {
                *group = group_of(table, name);
            }
        }
    }
}

/// `--mcp`: an MCP server the agent's CLI starts (stdio, inside the agent's container) or
/// connects to (HTTP). Remembered by the session; secret values never are (see
/// [`mcp_header_var`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpServer {
    pub name: String,
    #[serde(flatten)]
    pub transport: McpTransport,
    /// Names of the variables the server gets (`--mcp-env NAME:KEY=VALUE`; values travel
    /// like `--env` values, under the name KEY).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Names of the headers sent to an HTTP server (`--mcp-header NAME:HEADER=VALUE`; values
    /// travel like `--env` values, in [`mcp_header_var`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "transport", rename_all = "lowercase")]
pub enum McpTransport {
    /// A command (program and arguments) run in the agent's container.
    Stdio { command: Vec<String> },
    /// A streamable-HTTP server's URL.
    Http { url: String },
}

impl McpServer {
    /// Reads `--mcp NAME=COMMAND...` or `--mcp NAME=URL`.
    pub fn parse(value: &str, what: &str) -> Result<McpServer> {
        let (name, rest) = value.split_once('=').ok_or_else(|| {
            Error::usage(format!("{what} '{value}' is not NAME=COMMAND or NAME=URL"))
        })?;
        let name = check_mcp_name(name.trim(), what)?;
        let rest = rest.trim();
        let transport = if rest.starts_with("http://") || rest.starts_with("https://") {
            let url = crate::endpoint::validate_endpoint(rest, &format!("{what} {name}"))?;
            if crate::endpoint::endpoint_host(&url).is_none() {
                return Err(Error::usage(format!("{what} {name}: the URL has no host")));
            }
            McpTransport::Http { url }
        } else {
            let command = shlex::split(rest)
                .filter(|c| !c.is_empty())
                .ok_or_else(|| Error::usage(format!("{what} {name}: no command given")))?;
            McpTransport::Stdio { command }
        };
        Ok(McpServer {
            name,
            transport,
            env: Vec::new(),
            headers: Vec::new(),
        })
    }

    /// The URL's `host[:port]`, for `--allow-host`.
    pub fn http_host(&self) -> Option<String> {
        let McpTransport::Http { url } = &self.transport else {
            return None;
        };
        crate::endpoint::endpoint_host(url)
    }
}

/// The MCP servers a turn's CLI gets: none when `--tools` takes the `mcp` group away.
pub fn mcp_for_turn<'a>(servers: &'a [McpServer], tools: Option<&ToolPolicy>) -> &'a [McpServer] {
    match tools {
        Some(t) if t.denied_groups().contains(&ToolGroup::Mcp) => &[],
        _ => servers,
    }
}

/// The `mcpServers` JSON most CLIs read (claude, gemini): secret values as references to
/// the variables that carry them, in the CLI's own syntax (`ref_of(VAR)`).
pub fn mcp_servers_json(
    servers: &[McpServer],
    url_key: &str,
    ref_of: impl Fn(&str) -> String,
) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for m in servers {
        let mut entry = serde_json::Map::new();
        match &m.transport {
            McpTransport::Stdio { command } => {
                entry.insert("type".into(), "stdio".into());
                entry.insert("command".into(), command[0].clone().into());
                entry.insert("args".into(), command[1..].to_vec().into());
                let env: serde_json::Map<String, serde_json::Value> = m
                    .env
                    .iter()
                    .map(|k| (k.clone(), ref_of(k).into()))
                    .collect();
                entry.insert("env".into(), env.into());
            }
            McpTransport::Http { url } => {
                entry.insert("type".into(), "http".into());
                entry.insert(url_key.into(), url.clone().into());
                let headers: serde_json::Map<String, serde_json::Value> = m
                    .headers
                    .iter()
                    .map(|h| (h.clone(), ref_of(&mcp_header_var(&m.name, h)).into()))
                    .collect();
                entry.insert("headers".into(), headers.into());
            }
        }
        out.insert(m.name.clone(), entry.into());
    }
    out.into()
}

/// A server name: letters, digits and `-` (it becomes part of tool names, `mcp__NAME__tool`).
fn check_mcp_name(name: &str, what: &str) -> Result<String> {
    if name.is_empty()
        || name.len() > 40
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    {
        return Err(Error::usage(format!(
            "{what}: '{name}' is not a server name (letters, digits and '-')"
        )));
    }
    Ok(name.to_string())
}

/// Reads `--mcp-env` / `--mcp-header`: `NAME:KEY=VALUE`, into (server, key, value).
pub fn parse_mcp_secret(value: &str, what: &str) -> Result<(String, String, String)> {
    let bad = || {
        Error::usage(format!(
            "{what} takes NAME:KEY=VALUE (NAME: an --mcp server)"
        ))
    };
    let (server, kv) = value.split_once(':').ok_or_else(bad)?;
    let (key, secret) = kv.split_once('=').ok_or_else(bad)?;
    let server = check_mcp_name(server.trim(), what)?;
    let key = key.trim();
    if key.is_empty()
        || !key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(Error::usage(format!(
            "{what}: '{key}' is not a variable or header name"
        )));
    }
    Ok((server, key.to_string(), secret.to_string()))
}

/// The variable that carries an MCP header's value to the CLI (whose config names it).
pub fn mcp_header_var(server: &str, header: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_uppercase()
                } else {
                    '_'
                }
            })
            .collect()
    };
    format!("CAW_BOX_MCP_{}_{}", clean(server), clean(header))
}

/// A vendor's name of an MCP tool (`srv_echo`, `mcp_srv_echo`, `srv__echo`) as
/// `mcp__srv__echo`, for the servers a session has.
pub fn unified_mcp_name(servers: &[String], name: &str) -> Option<String> {
    if name.starts_with("mcp__") {
        return None;
    }
    let bare = name.strip_prefix("mcp_").unwrap_or(name);
    servers.iter().find_map(|s| {
        let tool = bare
            .strip_prefix(s.as_str())
            .and_then(|r| r.strip_prefix("__").or_else(|| r.strip_prefix('_')))?;
        (!tool.is_empty()).then(|| format!("mcp__{s}__{tool}"))
    })
}

/// Refuses (exit 2) a tool restriction `provider`'s CLI cannot make, naming the provider;
/// `support`: what it can (its adapter's).
pub fn check_tools(provider: ProviderKind, support: Support, tools: &ToolPolicy) -> Result<()> {
    for group in tools.denied_groups() {
        if !support.tool_groups.contains(&group) {
            let can: Vec<&str> = support.tool_groups.iter().map(|g| g.as_str()).collect();
            return Err(Error::usage(format!(
                "--tools: the {provider} CLI cannot take away its '{group}' tools"
            ))
            .with_hint(format!(
                "give --tools a list that includes {group} (the {provider} CLI can restrict: {})",
                if can.is_empty() {
                    "none".to_string()
                } else {
                    can.join(", ")
                }
            )));
        }
    }
    if !support.tool_names && (!tools.allow.is_empty() || !tools.deny.is_empty()) {
        let flag = if tools.deny.is_empty() {
            "--allow-tool"
        } else {
            "--deny-tool"
        };
        return Err(Error::usage(format!(
            "{flag} is not supported by the {provider} CLI: it has no list of tool names to \
             allow or deny"
        ))
        .with_hint("use --tools with groups instead".to_string()));
    }
    Ok(())
}

/// `TEXT` as is, or `@FILE`'s contents; `what` names the flag or key in errors.
pub fn read_prompt_arg(value: &str, what: &str) -> Result<String> {
    let text = match value.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| Error::usage(format!("{what}: cannot read the file '{path}': {e}")))?,
        None => value.to_string(),
    };
    if text.trim().is_empty() {
        return Err(Error::usage(format!("{what} is empty"))
            .with_hint("give the text, or @FILE to read it from a file"));
    }
    if text.len() > MAX_PROMPT_BYTES {
        return Err(Error::usage(format!(
            "{what} is {} bytes; at most {MAX_PROMPT_BYTES} are taken",
            text.len()
        )));
    }
    Ok(text)
}

/// Refuses (exit 2) what `provider`'s CLI cannot do, naming the provider; `support`: what it
/// can (its adapter's); `wanted`: system prompt, appended prompt, effort.
pub fn check_support(provider: ProviderKind, support: Support, wanted: [bool; 3]) -> Result<()> {
    let [system_prompt, append_system_prompt, effort] = wanted;
    let refuse = |what: &str, hint: &str| {
        Err(
            Error::usage(format!("{what} is not supported by the {provider} CLI"))
                .with_hint(hint.to_string()),
        )
    };
    if system_prompt && !support.replace {
        return refuse(
            "--system-prompt (replacing the default system prompt)",
            "use --append-system-prompt, or another provider",
        );
    }
    if append_system_prompt && !support.append {
        return refuse(
            "--append-system-prompt",
            "use --system-prompt with the whole prompt, or another provider",
        );
    }
    if effort && !support.effort {
        return refuse("--effort", "leave --effort out for this provider");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_args_read_text_or_a_file_and_refuse_empty_ones() {
        assert_eq!(
            read_prompt_arg("be brief", "--system-prompt").unwrap(),
            "be brief"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.md");
        std::fs::write(&file, "from a file\n").unwrap();
        let arg = format!("@{}", file.display());
        assert_eq!(read_prompt_arg(&arg, "x").unwrap(), "from a file\n");
        let missing = read_prompt_arg("@/nonexistent/p.md", "--system-prompt").unwrap_err();
        assert!(
            missing.message.contains("/nonexistent/p.md"),
            "{}",
            missing.message
        );
        assert!(read_prompt_arg("  \n", "--system-prompt").is_err());
        let long = "x".repeat(MAX_PROMPT_BYTES + 1);
        assert!(read_prompt_arg(&long, "x").is_err());
    }

    #[test]
    fn efforts_parse_case_insensitively() {
        assert_eq!(Effort::parse("HIGH", "x").unwrap(), Effort::High);
        assert!(Effort::parse("max", "--effort")
            .unwrap_err()
            .message
            .contains("low, medium or high"));
    }

    /// What a CLI cannot take is refused, naming it (every pinned CLI takes all three today:
    /// `provider`'s tests; the refusal is for a CLI, or version, that does not).
    #[test]
    fn what_a_cli_cannot_take_is_refused_naming_it() {
        let none = Support::default();
        for wanted in [
            [true, false, false],
            [false, true, false],
            [false, false, true],
        ] {
            let e = check_support(ProviderKind::Gemini, none, wanted).unwrap_err();
            assert_eq!(e.exit_code(), 2);
            assert!(e.message.contains("gemini CLI"), "{}", e.message);
        }
        assert!(check_support(ProviderKind::Gemini, none, [false; 3]).is_ok());
    }

    fn policy(groups: &str, allow: &[&str], deny: &[&str]) -> ToolPolicy {
        ToolPolicy {
            groups: ToolPolicy::parse_groups(groups, "--tools").unwrap(),
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn tool_groups_parse() {
        assert_eq!(ToolPolicy::parse_groups("all", "x").unwrap(), None);
        assert_eq!(ToolPolicy::parse_groups("none", "x").unwrap(), Some(vec![]));
        assert_eq!(
            ToolPolicy::parse_groups(" Web,read , web", "x").unwrap(),
            Some(vec![ToolGroup::Read, ToolGroup::Web])
        );
        let e = ToolPolicy::parse_groups("read,files", "--tools").unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.message.contains("'files'"), "{}", e.message);
        assert!(ToolPolicy::parse_groups(" , ", "--tools").is_err());
        assert!(ToolPolicy::check_name("", "--deny-tool").is_err());
        assert!(ToolPolicy::check_name("a\nb", "--deny-tool").is_err());
        assert_eq!(ToolPolicy::check_name(" Bash ", "x").unwrap(), "Bash");
    }

    #[test]
    fn denied_names_are_the_denied_groups_and_deny_tool_less_allow_tool() {
        const TABLE: &[(ToolGroup, &[&str])] = &[
            (ToolGroup::Read, &["Read", "Grep"]),
            (ToolGroup::Shell, &["Bash"]),
            (ToolGroup::Web, &["WebFetch"]),
        ];
        let p = policy("read,edit", &["WebFetch"], &["Grep"]);
        assert_eq!(
            p.denied_groups(),
            [ToolGroup::Shell, ToolGroup::Web, ToolGroup::Mcp]
        );
        assert_eq!(p.denied_names(TABLE), ["Bash", "Grep"]);
        assert_eq!(group_of(TABLE, "Grep"), Some(ToolGroup::Read));
        assert_eq!(group_of(TABLE, "mcp__srv__echo"), Some(ToolGroup::Mcp));
        assert_eq!(group_of(TABLE, "Task"), None);
        assert!(policy("all", &[], &[]).is_unrestricted());
        assert_eq!(p.describe(), "read,edit; allow WebFetch; deny Grep");
    }

    /// A group a CLI cannot take away: exit 2 naming it (what each pinned CLI can take away:
    /// `provider`'s tests).
    #[test]
    fn a_tool_restriction_a_cli_cannot_make_is_refused_naming_it() {
        let none = Support::default();
        let e = check_tools(
            ProviderKind::Gemini,
            none,
            &policy("read,edit,shell,mcp", &[], &[]),
        )
        .unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(
            e.message.contains("gemini CLI") && e.message.contains("'web'"),
            "{}",
            e.message
        );
        assert!(check_tools(ProviderKind::Gemini, none, &policy("all", &[], &[])).is_ok());
        let e = check_tools(ProviderKind::Gemini, none, &policy("all", &[], &["x"])).unwrap_err();
        assert!(e.message.contains("--deny-tool"), "{}", e.message);
    }

    #[test]
    fn mcp_servers_parse_as_commands_or_urls() {
        let stdio = McpServer::parse("docs=node '/work space/mcp.js' --flag", "--mcp").unwrap();
        assert_eq!(stdio.name, "docs");
        assert_eq!(
            stdio.transport,
            McpTransport::Stdio {
                command: vec!["node".into(), "/work space/mcp.js".into(), "--flag".into()]
            }
        );
        let http = McpServer::parse("search=https://mcp.example.com/v1/", "--mcp").unwrap();
        assert_eq!(
            http.transport,
            McpTransport::Http {
                url: "https://mcp.example.com/v1".into()
            }
        );
        assert_eq!(http.http_host().as_deref(), Some("mcp.example.com:443"));
        assert_eq!(stdio.http_host(), None);
        for bad in ["docs", "=node x", "my_docs=node", "docs=", "docs='unclosed"] {
            let e = McpServer::parse(bad, "--mcp").unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad}");
        }
        assert_eq!(
            parse_mcp_secret("docs:Authorization=Bearer a=b", "--mcp-header").unwrap(),
            ("docs".into(), "Authorization".into(), "Bearer a=b".into())
        );
        assert!(parse_mcp_secret("docs=x", "--mcp-env").is_err());
        assert!(parse_mcp_secret("docs:A B=x", "--mcp-env").is_err());
        assert_eq!(
            mcp_header_var("my-docs", "X-Api-Key"),
            "CAW_BOX_MCP_MY_DOCS_X_API_KEY"
        );
    }

    #[test]
    fn mcp_tool_names_become_mcp_server_tool() {
        let servers = ["caw".to_string(), "my-docs".to_string()];
        for (vendor, unified) in [
            ("caw_echo", Some("mcp__caw__echo")),
            ("mcp_caw_echo", Some("mcp__caw__echo")),
            ("caw__echo", Some("mcp__caw__echo")),
            ("my-docs_find_page", Some("mcp__my-docs__find_page")),
            ("mcp__caw__echo", None),
            ("bash", None),
            ("caw_", None),
        ] {
            assert_eq!(
                unified_mcp_name(&servers, vendor).as_deref(),
                unified,
                "{vendor}"
            );
        }
    }
}
