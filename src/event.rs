//! The unified event vocabulary: what every provider's output is turned into, and what
//! `-o stream-json` prints one per line. Provider-specific shapes never leave the provider
//! modules; everything downstream (output, records, the library API) sees only these types.

use serde::{Deserialize, Serialize};

use crate::error::ErrorKind;
use crate::provider_kind::ProviderKind;

/// How a turn ended. Serialized in snake_case, as SPEC.md's `status` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    #[default]
    Success,
    Error,
    AuthError,
    UsageLimit,
    Timeout,
    Interrupted,
    /// The CLI could not reach its model (a wrong endpoint, a network with no route, an
    /// allowlist without the API host): the turn was stopped instead of retrying forever.
    Unreachable,
    /// The session's spend crossed its `--max-cost`: caw-box stopped the turn (or the CLI,
    /// which reports usage only at its end, had just answered). Its next turn is refused.
    Budget,
    /// A detached turn that has not ended yet (only in records and `-o json` of `--detach`).
    Running,
    /// A turn waiting for a slot of its account (`--per-account`): not started yet (only in
    /// `-o json` of `--detach`, `ls`, `show` and the MCP server's answers).
    Queued,
    /// A turn waiting for its account's usage limit to reset (`--on-limit park`): not
    /// started yet; it goes on then (only where `queued` is shown, with `resumes_at`).
    Parked,
}

impl Status {
    /// The process exit code SPEC.md assigns to a turn that ended this way.
    pub fn exit_code(self) -> i32 {
        self.error_kind().map_or(0, ErrorKind::exit_code)
    }

    /// The kind of failure a turn that ended this way is (`None`: not a failure).
    pub fn error_kind(self) -> Option<ErrorKind> {
        match self {
            Status::Success | Status::Running | Status::Queued | Status::Parked => None,
            Status::Error => Some(ErrorKind::Turn),
            Status::Unreachable => Some(ErrorKind::Environment),
            Status::AuthError => Some(ErrorKind::Credentials),
            Status::UsageLimit => Some(ErrorKind::UsageLimit),
            Status::Timeout => Some(ErrorKind::Timeout),
            Status::Interrupted => Some(ErrorKind::Interrupted),
            Status::Budget => Some(ErrorKind::Budget),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Success => "success",
            Status::Error => "error",
            Status::AuthError => "auth_error",
            Status::UsageLimit => "usage_limit",
            Status::Timeout => "timeout",
            Status::Interrupted => "interrupted",
            Status::Unreachable => "unreachable",
            Status::Budget => "budget",
            Status::Running => "running",
            Status::Queued => "queued",
            Status::Parked => "parked",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Token usage and cost of one turn (never cumulative over a session).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    /// Only some vendors report a cost; `null` when unknown.
    pub cost_usd: Option<f64>,
}

impl Usage {
    pub fn is_zero(&self) -> bool {
        self.input_tokens == 0
            && self.output_tokens == 0
            && self.cache_read_tokens == 0
            && self.cache_write_tokens == 0
            && self.cost_usd.is_none()
    }

    /// Adds another report into this one (vendors that report usage per step), saturating:
    /// the counts come from the CLI's output, which may say anything.
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cache_read_tokens = self
            .cache_read_tokens
            .saturating_add(other.cache_read_tokens);
        self.cache_write_tokens = self
            .cache_write_tokens
            .saturating_add(other.cache_write_tokens);
        self.cost_usd = match (self.cost_usd, other.cost_usd) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
        };
    }

    /// `self - earlier`, saturating: turns a vendor's cumulative counters into one turn's.
    pub fn since(&self, earlier: &Usage) -> Usage {
        Usage {
            input_tokens: self.input_tokens.saturating_sub(earlier.input_tokens),
            output_tokens: self.output_tokens.saturating_sub(earlier.output_tokens),
            cache_read_tokens: self
                .cache_read_tokens
                .saturating_sub(earlier.cache_read_tokens),
            cache_write_tokens: self
                .cache_write_tokens
                .saturating_sub(earlier.cache_write_tokens),
            cost_usd: match (self.cost_usd, earlier.cost_usd) {
                (Some(a), Some(b)) => Some((a - b).max(0.0)),
                (a, _) => a,
            },
        }
    }
}

/// The `json` output object, also carried by the final `result` event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnResult {
    pub session_id: String,
    pub name: Option<String>,
    pub provider: ProviderKind,
    pub turn: u32,
    pub status: Status,
    pub result: String,
    pub resume_handle: String,
    pub usage: Usage,
    /// Whether `usage.cost_usd` is known: `false` for tokens of a model neither the CLI, the
    /// price table nor the person's config prices (`[prices."MODEL"]`).
    #[serde(default = "priced_by_default")]
    pub priced: bool,
    pub duration_ms: u64,
    pub exit_code: i32,
    /// Protected paths the agent created (or replaced) in a bind-mode workspace, moved aside
    /// after the turn; absent when there were none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantined: Option<Quarantined>,
    /// What the turn's agent reached and was refused through its egress proxy; absent for
    /// turns with none (on the host's network, or run before caw-box recorded egress).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Box<EgressRecord>>,
}

/// `--egress`: what the agent may reach beyond its model, held by caw-box's egress proxy
/// (docs/walls.md). Ordered from the most open to the most closed: a tool call or a project
/// file may move a session only up this order, never down.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "snake_case")]
pub enum EgressPolicy {
    /// Anything, as before caw-box had policies; what goes through the proxy is recorded.
    Open,
    /// The model's API, plus the common package and source hosts (`egress-balanced.txt`).
    #[default]
    Balanced,
    /// The model's API and nothing else (and `--allow-host`'s hosts).
    Locked,
}

impl EgressPolicy {
    pub const ALL: [EgressPolicy; 3] = [
        EgressPolicy::Open,
        EgressPolicy::Balanced,
        EgressPolicy::Locked,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EgressPolicy::Open => "open",
            EgressPolicy::Balanced => "balanced",
            EgressPolicy::Locked => "locked",
        }
    }

    /// `--egress NAME` (`what` names where it was written in the error).
    pub fn parse(text: &str, what: &str) -> crate::error::Result<EgressPolicy> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == text.trim().to_ascii_lowercase())
            .ok_or_else(|| {
                crate::error::Error::usage(format!(
                    "{what} '{text}' is not an egress policy: balanced, locked or open"
                ))
                .with_hint("balanced (the default): the model's API and package hosts; locked: the model's API only; open: anything")
            })
    }
}

impl std::fmt::Display for EgressPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A turn's egress, as its proxy saw it: each host and port the agent asked for, allowed or
/// refused, how many connections and bytes each way. Never a path, a query, a header or a
/// body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressRecord {
    /// The policy the turn ran under: `balanced`, `locked` or `open`.
    pub policy: String,
    pub allowed: Vec<EgressHost>,
    pub refused: Vec<EgressHost>,
}

/// One host and port of a turn's egress.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressHost {
    pub host: String,
    pub port: u16,
    /// Connections (and plain-HTTP requests) to it, or refused.
    pub connections: u64,
    /// Bytes from the agent to the host.
    pub bytes_out: u64,
    /// Bytes from the host to the agent.
    pub bytes_in: u64,
    /// Connections the proxy could not make to it (the host did not answer).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failed: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl EgressHost {
    /// `host:port`.
    pub fn target(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

impl EgressRecord {
    /// One line for `show`: the hosts reached and refused, with counts.
    pub fn line(&self) -> String {
        let list = |hosts: &[EgressHost], bytes: bool| {
            hosts
                .iter()
                .map(|h| match bytes {
                    true if h.failed > 0 => format!(
                        "{} ({}x, {} failed, {} out, {} in)",
                        h.target(),
                        h.connections,
                        h.failed,
                        human_bytes(h.bytes_out),
                        human_bytes(h.bytes_in)
                    ),
                    true => format!(
                        "{} ({}x, {} out, {} in)",
                        h.target(),
                        h.connections,
                        human_bytes(h.bytes_out),
                        human_bytes(h.bytes_in)
                    ),
                    false => format!("{} ({}x)", h.target(), h.connections),
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let allowed = match self.allowed.is_empty() {
            true => "nothing reached".to_string(),
            false => format!("reached {}", list(&self.allowed, true)),
        };
        match self.refused.is_empty() {
            true => format!("egress {}: {allowed}", self.policy),
            false => format!(
                "egress {}: {allowed}; refused {}",
                self.policy,
                list(&self.refused, false)
            ),
        }
    }
}

fn human_bytes(n: u64) -> String {
    match n {
        n if n >= 10 << 20 => format!("{} MB", n >> 20),
        n if n >= 10 << 10 => format!("{} kB", n >> 10),
        n => format!("{n} B"),
    }
}

fn priced_by_default() -> bool {
    true
}

/// Where a turn's quarantined protected paths went (see `session::quarantine`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quarantined {
    /// The directory under caw-box's data dir that holds them, at their workspace paths.
    pub dir: String,
    /// Their paths in the workspace, relative to its top.
    pub paths: Vec<String>,
}

impl Quarantined {
    /// The warning line for stderr.
    pub fn warning(&self) -> String {
        format!(
            "warning: the agent created protected paths in the workspace ({}); they were moved to {} (host tools run such files by themselves; `--unprotect PATH` lets the agent write one)",
            self.paths.join(", "),
            self.dir
        )
    }
}

/// One unified event. `-o stream-json` prints each as one JSON line with a `type` tag.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    Session {
        session_id: String,
        provider: ProviderKind,
        #[serde(skip_serializing_if = "Option::is_none")]
        resume_key: Option<String>,
    },
    Text {
        text: String,
    },
    Thinking {
        text: String,
    },
    ToolCall {
        id: String,
        /// The vendor's own tool name (`mcp__server__tool` for an MCP server's tool).
        name: String,
        input: serde_json::Value,
        /// The vendor-neutral group (`--tools`) the tool belongs to, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        group: Option<ToolGroup>,
    },
    ToolResult {
        id: String,
        output: String,
        is_error: bool,
    },
    Usage {
        #[serde(flatten)]
        usage: Usage,
    },
    Error {
        message: String,
    },
    /// The egress proxy refused a host the agent asked for (`--egress`), as it happened.
    EgressRefused {
        host: String,
        port: u16,
        /// The policy that refused it.
        policy: String,
    },
    Result {
        #[serde(flatten)]
        result: TurnResult,
    },
}

/// `--tools`: the vendor-neutral groups of tools an agent may be given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolGroup {
    /// Reading and searching files.
    Read,
    /// Writing and editing files.
    Edit,
    /// Running commands.
    Shell,
    /// Fetching pages and searching the web.
    Web,
    /// Tools of MCP servers.
    Mcp,
}

impl ToolGroup {
    pub const ALL: [ToolGroup; 5] = [
        ToolGroup::Read,
        ToolGroup::Edit,
        ToolGroup::Shell,
        ToolGroup::Web,
        ToolGroup::Mcp,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ToolGroup::Read => "read",
            ToolGroup::Edit => "edit",
            ToolGroup::Shell => "shell",
            ToolGroup::Web => "web",
            ToolGroup::Mcp => "mcp",
        }
    }
}

impl std::fmt::Display for ToolGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
