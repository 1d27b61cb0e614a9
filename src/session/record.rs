//! What caw-box remembers about a session, and where.
//!
//! The truth lives in Docker, so a session survives the loss of the host's data directory:
//! immutable facts (provider, creation time, name, group, the settings it was started with)
//! are labels on the state volume; what changes per turn (the vendor resume key, the turn
//! records) is a JSON file inside the volume, at [`RECORD_PATH`] under HOME. The host's data
//! directory only caches that file.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::event::{Status, Usage};
use crate::provider::ProviderKind;

/// Labels on everything caw-box creates (SPEC.md, "Docker objects").
pub mod labels {
    pub const MANAGED: &str = "io.caw-box.managed";
    pub const SESSION: &str = "io.caw-box.session";
    pub const PROVIDER: &str = "io.caw-box.provider";
    pub const NAME: &str = "io.caw-box.name";
    pub const GROUP: &str = "io.caw-box.group";
    pub const CREATED: &str = "io.caw-box.created";
    pub const SETTINGS: &str = "io.caw-box.settings";
    pub const ROLE: &str = "io.caw-box.role";
    pub const TURN: &str = "io.caw-box.turn";
    pub const CLI_VERSION: &str = "io.caw-box.cli-version";
    /// On a turn container: the process that drives the turn, and its host.
    pub const DRIVER_PID: &str = "io.caw-box.driver-pid";
    pub const DRIVER_HOST: &str = "io.caw-box.driver-host";
    /// On a turn-record volume: the [`super::TurnSummary`] of the session's latest turn.
    pub const SUMMARY: &str = "io.caw-box.summary";
    /// On an image: a hash of everything it was built from; `image build` skips an image
    /// whose hash is current.
    pub const INPUTS: &str = "io.caw-box.inputs";
    /// On a builder-stage image (set by the Dockerfile): the stage, and the `image build`
    /// run that made it, which removes it when it ends.
    pub const STAGE: &str = "io.caw-box.stage";
    pub const BUILD_ID: &str = "io.caw-box.build-id";
}

/// Roles of the objects caw-box creates (label `io.caw-box.role`).
pub mod roles {
    /// The state volume, mounted at HOME.
    pub const STATE: &str = "state";
    /// The container of a running turn; its name is the session's lock.
    pub const TURN: &str = "turn";
    /// A never-started container that reads files out of a state volume.
    pub const PROBE: &str = "probe";
    /// An empty volume whose labels summarise the session's latest turn (labels cannot be
    /// changed, so each turn replaces it): lets `ls` and `resume` learn the state of every
    /// session from one Docker call, without reading any volume.
    pub const TURN_RECORD: &str = "turn-record";
    /// A turn's egress proxy (`--allow-host`) and its internal network.
    pub const PROXY: &str = "proxy";
    /// A copy-mode session's workspace, mounted at /workspace.
    pub const WORKSPACE: &str = "workspace";
}

/// Extra labels for every object caw-box creates, from `CAW_BOX_LABELS` (`k=v,k=v`):
/// lets CI systems tag and sweep what their jobs made. caw-box's own labels always win.
pub fn extra_labels() -> Vec<(String, String)> {
    std::env::var("CAW_BOX_LABELS")
        .unwrap_or_default()
        .split(',')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            let k = k.trim();
            (!k.is_empty() && !k.starts_with("io.caw-box.managed"))
                .then(|| (k.to_string(), v.trim().to_string()))
        })
        .collect()
}

/// Adds [`extra_labels`] to `labels` without overriding any.
pub fn with_extra_labels(mut labels: HashMap<String, String>) -> HashMap<String, String> {
    for (k, v) in extra_labels() {
        labels.entry(k).or_insert(v);
    }
    labels
}

/// The directory under HOME where caw-box keeps its own record in the state volume.
pub const RECORD_DIR: &str = ".caw-box";
/// The session record, relative to HOME.
pub const RECORD_PATH: &str = ".caw-box/session.json";

/// How the workspace reaches /workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum WorkspaceMode {
    #[default]
    Bind,
    Copy,
    None,
}

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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_limit: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// `--idle-timeout` in seconds; 0: off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_secs: Option<u64>,
    /// `--connect-timeout` in seconds; 0: off; `None`: the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout_secs: Option<u64>,
    /// `--allow-host`: egress only to these hosts, through caw-box's proxy (`@provider`
    /// stands for the provider's API host, or the `--endpoint` host).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_hosts: Vec<String>,
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
    /// The uid:gid HOME (and a copy-mode workspace) belong to; `None`: the image's 1000:1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<(u32, u32)>,
    /// The turn ran in the vendor's TUI.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interactive: bool,
}

impl TurnSummary {
    /// The name of the turn-record volume of `session_id`'s turn `turn`.
    pub fn volume_name(session_id: Uuid, turn: u32) -> String {
        format!("caw-box-{session_id}-turn-{turn}")
    }

    /// The labels of the turn-record volume.
    pub fn labels(&self, session_id: Uuid, provider: ProviderKind) -> HashMap<String, String> {
        let mut l = HashMap::new();
        l.insert(labels::MANAGED.into(), "true".into());
        l.insert(labels::SESSION.into(), session_id.to_string());
        l.insert(labels::PROVIDER.into(), provider.as_str().into());
        l.insert(labels::ROLE.into(), roles::TURN_RECORD.into());
        l.insert(labels::TURN.into(), self.turn.to_string());
        l.insert(
            labels::SUMMARY.into(),
            serde_json::to_string(self).expect("summaries serialize"),
        );
        with_extra_labels(l)
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
    /// Whether a turn run by this process got as far as starting its container (not
    /// stored): a new session whose first turn then failed holds the agent's work, and is
    /// not discarded.
    #[serde(skip)]
    pub turn_started: bool,
}

impl SessionRecord {
    /// Whether `turns` holds every turn before `turn`, so no history is missing (a record
    /// rebuilt from labels alone knows only the latest turn).
    pub fn has_every_turn_before(&self, turn: u32) -> bool {
        self.turns.iter().map(|t| t.turn).eq(1..turn)
    }

    pub fn next_turn(&self) -> u32 {
        self.turns.last().map_or(1, |t| t.turn + 1)
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
    let mut l = HashMap::new();
    l.insert(labels::MANAGED.into(), "true".into());
    l.insert(labels::SESSION.into(), session_id.to_string());
    l.insert(labels::PROVIDER.into(), provider.as_str().into());
    l.insert(labels::ROLE.into(), roles::STATE.into());
    l.insert(labels::CREATED.into(), created_at.to_string());
    l.insert(
        labels::SETTINGS.into(),
        serde_json::to_string(settings).expect("settings serialize"),
    );
    if let Some(name) = name {
        l.insert(labels::NAME.into(), name.into());
    }
    if let Some(group) = group {
        l.insert(labels::GROUP.into(), group.into());
    }
    with_extra_labels(l)
}

/// Seconds since the Unix epoch.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
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
                .map(|&turn| TurnRecord {
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
                })
                .collect(),
            turn_started: false,
        }
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
