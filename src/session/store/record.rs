//! What caw-box remembers about a session, and where.
//!
//! The truth lives in the backend (Docker, or the cluster), so a session survives the loss of
//! the host's data directory: immutable facts (provider, creation time, name, group, the
//! settings it was started with) are labels on the state volume (a PVC on Kubernetes); what changes per turn (the vendor resume key, the turn
//! records) is a JSON file inside the volume, at [`RECORD_PATH`] under HOME. The host's data
//! directory only caches that file.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::event::{Status, Usage};
use crate::provider::ProviderKind;

use crate::session::store::names::LabelSet;
pub use crate::session::store::names::{
    extra_labels, labels, parse_labels, render_labels, roles, set_extra_labels, with_extra_labels,
};

/// The directory under HOME where caw-box keeps its own record in the state volume.
pub const RECORD_DIR: &str = ".caw-box";
/// The session record, relative to HOME.
pub const RECORD_PATH: &str = ".caw-box/session.json";
/// A fork's handoff from a session of another vendor (`SessionSettings::handoff`),
/// relative to HOME.
pub const HANDOFF_PATH: &str = ".caw-box/handoff.md";

/// The uid:gid of the images' own non-root user, `agent`, whom a fresh volume belongs to.
pub const IMAGE_IDS: (u32, u32) = (1000, 1000);

/// How the workspace reaches /workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum WorkspaceMode {
    #[default]
    Bind,
    Copy,
    None,
}

pub use crate::event::EgressPolicy;

/// The settings a session was started with; `resume` reuses them unless overridden.
/// Never holds secrets (`--env` values are not remembered).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct SessionSettings {
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// `open` (the default bridge), `none`, `host`, or a network name.
    #[serde(default = "default_network")]
    pub network: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    #[serde(default)]
    pub workspace_mode: WorkspaceMode,
    /// `--on-limit fallback`: the session whose usage limit this one took the prompt over
    /// from (the other side of the link is found by listing: labels are fixed at creation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_of: Option<Uuid>,
    /// `caw-box fork`: the session and turn whose checkpoint this session was made from
    /// (its conversation and workspace as they were at the end of that turn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkedFrom>,
    /// `caw-box fork --provider`: a fork in another vendor's CLI, which the source's
    /// conversation cannot move to. Its first conversation turn gets the handoff
    /// ([`HANDOFF_PATH`] in its HOME: the source's prompts and answers, the files it
    /// changed) ahead of its prompt, until the vendor confirmed a conversation.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub handoff: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_limit: Option<i64>,
    /// `--per-account`: at most this many turns of the session's account in flight at once
    /// on this host (`session::turn::admission`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_account: Option<u32>,
    /// `--on-limit park`: a turn the account's usage limit stops is parked until the limit
    /// resets, then goes on in its conversation; the session's turns wait while its account
    /// is parked (`session::turn::park`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub park: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// `--idle-timeout` in seconds; 0: off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_secs: Option<u64>,
    /// `--connect-timeout` in seconds; 0: off; `None`: the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout_secs: Option<u64>,
    /// `--max-cost` in USD: what the session may spend over all its turns (priced as
    /// `total_cost_usd`); a resume's flag raises or lowers it. `None`: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    /// `--keep-warm` in seconds: how long the session's container stays idle after a
    /// headless turn for the next one to run in (`session::warm`); 0 or `None`: off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_warm_secs: Option<u64>,
    /// `--checkpoints off`: no checkpoint is kept of the session's turns
    /// (`session::checkpoint`); a resume's flag applies to its turn.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_checkpoints: bool,
    /// `--allow-host`: egress only to these hosts, through caw-box's proxy (`@provider`
    /// stands for the provider's API host, or the `--endpoint` host).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_hosts: Vec<String>,
    /// `--egress`; `None` in the records of sessions started before caw-box had policies:
    /// see [`SessionSettings::egress`].
    #[serde(default, rename = "egress", skip_serializing_if = "Option::is_none")]
    pub egress_policy: Option<EgressPolicy>,
    /// `[prices."MODEL"]` of the person's config file when the session started (a resume
    /// takes the file's again): its turns' costs where the CLI reports none, before the
    /// price table's (`provider::pricing`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub prices: crate::provider::pricing::PriceBook,
    /// `--system-prompt`: replaces the CLI's default system prompt (see `agent_config`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    /// `--append-system-prompt`: added to the CLI's system prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub append_system_prompt: Option<String>,
    /// `--effort`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effort: Option<crate::agent_config::Effort>,
    /// `--tools`, `--allow-tool`, `--deny-tool`: the tools the agent may use; `None`: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<crate::agent_config::ToolPolicy>,
    /// `--mcp`: the MCP servers the CLI is given (no secret values: those travel per turn).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp: Vec<crate::agent_config::McpServer>,
    /// `--protect`: workspace paths made read-only to the agent beyond the defaults
    /// (see [`crate::session::walls::protect`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub protect: Vec<String>,
    /// `--unprotect`: default protected paths the agent may write in this session.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unprotect: Vec<String>,
    /// `--runtime`: the OCI runtime of the agent's container (`runsc`: gVisor); on
    /// Kubernetes, the pod's `runtimeClassName`. `None`: the engine's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
}

impl SessionSettings {
    /// The session's egress policy. A session started before caw-box had policies keeps
    /// what it had: open, or only its `--allow-host` hosts (locked, with them).
    pub fn egress(&self) -> EgressPolicy {
        self.egress_policy
            .unwrap_or(match self.allow_hosts.is_empty() {
                true => EgressPolicy::Open,
                false => EgressPolicy::Locked,
            })
    }

    /// The workspace paths protected from the agent in this session (relative, `/`-separated).
    pub fn protected_paths(&self) -> Vec<String> {
        crate::session::walls::protect::effective(&self.protect, &self.unprotect)
    }
}

impl SessionSettings {
    /// The names of the session's MCP servers.
    pub fn mcp_names(&self) -> Vec<String> {
        self.mcp.iter().map(|m| m.name.clone()).collect()
    }

    /// Refuses (exit 2) an agent setting that `provider`'s CLI cannot take.
    pub fn check_agent_config(&self, provider: ProviderKind) -> crate::error::Result<()> {
        let support = provider.adapter().support();
        crate::agent_config::check_support(
            provider,
            support,
            [
                self.system_prompt.is_some(),
                self.append_system_prompt.is_some(),
                self.effort.is_some(),
            ],
        )?;
        match &self.tools {
            Some(tools) => crate::agent_config::check_tools(provider, support, tools),
            None => Ok(()),
        }
    }
}

/// A fork's lineage: the session it was forked from, and at the end of which turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkedFrom {
    pub session: Uuid,
    pub turn: u32,
}

fn default_network() -> String {
    "open".to_string()
}

/// One finished (or running) turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnRecord {
    pub turn: u32,
    pub prompt: String,
    pub status: Status,
    pub result: String,
    pub usage: Usage,
    pub started_at: u64,
    pub duration_ms: u64,
    pub exit_code: i32,
    /// The vendor's cumulative counters after this turn (codex), for the next turn's math.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cumulative_usage: Option<Usage>,
    /// A turn in the vendor's TUI (no prompt: what was typed is in the vendor's own state).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interactive: bool,
    /// The account the turn spent (`auth::account`: a fingerprint, never the secret), as
    /// its admission and a park counted it; `None` in records older than that.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// A `usage_limit` turn: when (Unix seconds) the vendor said the limit resets, read from
    /// the CLI's whole output (`session::limits::reset_at`), for `--on-limit wait`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_resets_at: Option<u64>,
    /// A turn a fork inherited from its source (`caw-box fork`): in its conversation and
    /// history, but not its own spend (the source's cost, counted there).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inherited: bool,
    /// The vendor's key of the conversation after this turn: what a fork at this turn
    /// resumes (`caw-box fork`). Empty in records of turns run before caw-box kept it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resume_key: String,
    /// What the turn's agent reached and was refused through its egress proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::event::EgressRecord>,
}

/// The latest turn of a session, as carried by its turn-record volume's labels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnSummary {
    pub turn: u32,
    pub status: Status,
    pub started_at: u64,
    pub ended_at: u64,
    #[serde(default)]
    pub resume_key: String,
    #[serde(default)]
    pub key_confirmed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cumulative_usage: Option<Usage>,
    /// The session's cost so far: the sum over its turns of those with a known cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_cost_usd: Option<f64>,
    /// The uid:gid HOME (and a copy-mode workspace) belong to; `None`: the image's 1000:1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<(u32, u32)>,
    /// The turn ran in the vendor's TUI.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interactive: bool,
    /// [`SessionRecord::home_unlike_image`] after the turn.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub home_unlike_image: bool,
    /// The turn's `--keep-warm` (0: off), which the session's next turns keep unless they
    /// say otherwise: the state volume's labels hold only the settings it started with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_warm_secs: Option<u64>,
    /// The session's `--max-cost` after the turn (a resume may have changed it since the
    /// settings of the state volume's labels).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
}

impl TurnSummary {
    /// The labels of the turn-record volume.
    pub fn labels(&self, session_id: Uuid, provider: ProviderKind) -> HashMap<String, String> {
        LabelSet::new(session_id, roles::TURN_RECORD)
            .provider(provider)
            .with(labels::TURN, self.turn.to_string())
            .with(
                labels::SUMMARY,
                serde_json::to_string(self).expect("summaries serialize"),
            )
            .finish()
    }

    /// Reads a summary back from a turn-record volume's labels.
    pub fn from_labels(l: &HashMap<String, String>) -> Option<(Uuid, TurnSummary)> {
        if l.get(labels::ROLE).map(String::as_str) != Some(roles::TURN_RECORD) {
            return None;
        }
        let id = Uuid::parse_str(l.get(labels::SESSION)?).ok()?;
        Some((id, serde_json::from_str(l.get(labels::SUMMARY)?).ok()?))
    }
}

/// The per-session record kept in the state volume (and cached on the host).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    pub version: u32,
    pub session_id: Uuid,
    pub provider: ProviderKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The vendor resume key; empty until the first turn revealed it.
    #[serde(default)]
    pub resume_key: String,
    /// Whether the vendor has shown `resume_key` in its output (a conversation exists).
    /// A key chosen up front (claude) is unconfirmed until then.
    #[serde(default)]
    pub key_confirmed: bool,
    /// The uid:gid the session's volumes belong to; `None`: the image's 1000:1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<(u32, u32)>,
    pub created_at: u64,
    pub settings: SessionSettings,
    #[serde(default)]
    pub turns: Vec<TurnRecord>,
    /// Whether the files the latest turn merged into HOME differ from the image's own (a
    /// gemini Google login's choice in its settings): the next turn merges its files again,
    /// even where the image's would suit it (an API key, since).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub home_unlike_image: bool,
    /// Whether a turn run by this process got as far as starting its container (not
    /// stored): a new session whose first turn then failed holds the agent's work, and is
    /// not discarded.
    #[serde(skip)]
    pub turn_started: bool,
    /// Whether the latest turn is known only from the turn-record volume's labels, without
    /// its prompt and result (not stored): the full history is then in the state volume.
    #[serde(skip)]
    pub summary_only: bool,
    /// The CLI version of the image this process's turn runs on (its label; not stored):
    /// what the adapter passes and the pricing's default model follow it.
    #[serde(skip)]
    pub cli_version: Option<String>,
}

impl SessionRecord {
    /// Whether `turns` holds every turn before `turn`, so no history is missing (a record
    /// rebuilt from labels alone knows only the latest turn).
    pub fn has_every_turn_before(&self, turn: u32) -> bool {
        !self.summary_only && self.turns.iter().map(|t| t.turn).eq(1..turn)
    }

    /// The uid:gid the session's volumes belong to; during a turn (after its
    /// `ensure_owner`), the uid:gid the turn runs as.
    pub fn owner_ids(&self) -> (u32, u32) {
        self.owner.unwrap_or(IMAGE_IDS)
    }

    pub fn next_turn(&self) -> u32 {
        self.turns.last().map_or(1, |t| t.turn + 1)
    }

    /// The sum of the turns' costs; `None` when no turn has a known cost. A fork's inherited
    /// turns count for its source only.
    pub fn total_cost_usd(&self) -> Option<f64> {
        self.turns
            .iter()
            .filter(|t| !t.inherited)
            .filter_map(|t| t.usage.cost_usd)
            .fold(None, |sum, c| Some(sum.unwrap_or(0.0) + c))
    }

    pub fn last_cumulative_usage(&self) -> Option<Usage> {
        self.turns.iter().rev().find_map(|t| t.cumulative_usage)
    }
}

/// The labels of a session's state volume.
pub fn volume_labels(
    session_id: Uuid,
    provider: ProviderKind,
    name: Option<&str>,
    group: Option<&str>,
    created_at: u64,
    settings: &SessionSettings,
) -> HashMap<String, String> {
    let mut l = LabelSet::new(session_id, roles::STATE)
        .provider(provider)
        .with(labels::CREATED, created_at.to_string())
        .with(
            labels::SETTINGS,
            serde_json::to_string(settings).expect("settings serialize"),
        );
    if let Some(name) = name {
        l = l.with(labels::NAME, name);
    }
    if let Some(group) = group {
        l = l.with(labels::GROUP, group);
    }
    l.finish()
}

pub use crate::clock::now_secs;

/// A bind-mode git workspace at session start: the volume label
/// [`labels::WORKSPACE_BASE`], as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GitBase {
    /// HEAD's commit; `None` in a repository without commits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// The working tree (tracked and untracked, not ignored files) as a git tree.
    pub tree: String,
}

#[cfg(test)]
impl TurnRecord {
    /// A successful turn `turn` with nothing in it: tests fill in what they look at.
    pub(crate) fn succeeded(turn: u32) -> Self {
        Self {
            turn,
            prompt: String::new(),
            status: Status::Success,
            result: String::new(),
            usage: Usage::default(),
            started_at: 0,
            duration_ms: 0,
            exit_code: 0,
            cumulative_usage: None,
            interactive: false,
            limit_resets_at: None,
            account: None,
            inherited: false,
            resume_key: String::new(),
            egress: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_turns(turns: &[u32]) -> SessionRecord {
        SessionRecord {
            version: 1,
            session_id: uuid::Uuid::new_v4(),
            provider: crate::provider::ProviderKind::Codex,
            name: None,
            group: None,
            resume_key: String::new(),
            key_confirmed: false,
            owner: None,
            created_at: 0,
            settings: SessionSettings::default(),
            turns: turns
                .iter()
                .map(|&turn| TurnRecord::succeeded(turn))
                .collect(),
            home_unlike_image: false,
            turn_started: false,
            summary_only: false,
            cli_version: None,
        }
    }

    /// A fork's inherited turns are its source's spend, not its own.
    #[test]
    fn inherited_turns_cost_the_fork_nothing() {
        let mut r = with_turns(&[1, 2, 3]);
        for (t, cost) in r.turns.iter_mut().zip([0.5, 0.25, 0.125]) {
            t.usage.cost_usd = Some(cost);
        }
        assert_eq!(r.total_cost_usd(), Some(0.875));
        r.turns[0].inherited = true;
        r.turns[1].inherited = true;
        assert_eq!(r.total_cost_usd(), Some(0.125));
        r.turns[2].inherited = true;
        assert_eq!(r.total_cost_usd(), None);
    }

    /// A record rebuilt from labels knows only the latest turn: its history must be read.
    #[test]
    fn only_a_gapless_history_counts_as_complete() {
        assert!(with_turns(&[]).has_every_turn_before(1));
        assert!(with_turns(&[1, 2, 3]).has_every_turn_before(4));
        assert!(!with_turns(&[3]).has_every_turn_before(4));
        assert!(!with_turns(&[1, 3]).has_every_turn_before(4));
        assert!(!with_turns(&[1, 2]).has_every_turn_before(4));
    }
}
