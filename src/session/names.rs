//! The names and labels of everything caw-box creates, in one place (SPEC.md, "Docker
//! objects"): a backend stores sessions under these names, and finds them again by these
//! labels, so they must never change without a migration (old sessions must resume).

use std::collections::HashMap;

use uuid::Uuid;

use crate::provider_kind::ProviderKind;

/// Labels on everything caw-box creates (SPEC.md, "Docker objects").
pub mod labels {
    pub const MANAGED: &str = "io.caw-box.managed";
    pub const SESSION: &str = "io.caw-box.session";
    pub const PROVIDER: &str = "io.caw-box.provider";
    pub const NAME: &str = "io.caw-box.name";
    pub const GROUP: &str = "io.caw-box.group";
    pub const CREATED: &str = "io.caw-box.created";
    pub const SETTINGS: &str = "io.caw-box.settings";
    /// On a bind-mode state volume: the git workspace at session start
    /// ([`crate::session::patch::GitBase`]), for `diff --patch`.
    pub const WORKSPACE_BASE: &str = "io.caw-box.workspace-base";
    pub const ROLE: &str = "io.caw-box.role";
    pub const TURN: &str = "io.caw-box.turn";
    pub const CLI_VERSION: &str = "io.caw-box.cli-version";
    /// On a turn container: the process that drives the turn, and its host.
    pub const DRIVER_PID: &str = "io.caw-box.driver-pid";
    pub const DRIVER_HOST: &str = "io.caw-box.driver-host";
    /// On a turn pod (Kubernetes): `caw-box stop` ended it (its runtime directory, where
    /// Docker's stop request goes, is gone with the pod).
    pub const STOP_REQUESTED: &str = "io.caw-box.stop-requested";
    /// On a headless turn's container, set by the backend that made it so (Docker, Kubernetes):
    /// it runs on when its driver is gone, and any caw-box can record it
    /// (`session::headless::adopt`): `wait`, `stop`, `show`, `logs`, `ls` and the session's
    /// next turn do.
    pub const ADOPTABLE: &str = "io.caw-box.adoptable";
    /// On a turn-record volume: the [`crate::session::record::TurnSummary`] of the session's latest turn.
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
    /// A turn's credential broker, and the network made for it on `--network open`.
    pub const BROKER: &str = "broker";
    /// A copy-mode session's workspace, mounted at /workspace.
    pub const WORKSPACE: &str = "workspace";
}

/// The extra labels of this process's objects when config resolved them (`labels` in a
/// config file, or `CAW_BOX_LABELS`): set once by `run`/`resume`, before anything is made.
static RESOLVED_LABELS: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();

/// Fixes the extra labels of every object this process creates (the first call wins).
pub fn set_extra_labels(labels: Vec<(String, String)>) {
    let _ = RESOLVED_LABELS.set(labels);
}

/// Extra labels for every object caw-box creates: those config resolved (see
/// [`set_extra_labels`]), else `CAW_BOX_LABELS` (`k=v,k=v`): lets CI systems tag and sweep
/// what their jobs made. caw-box's own labels always win.
pub fn extra_labels() -> Vec<(String, String)> {
    match RESOLVED_LABELS.get() {
        Some(labels) => labels.clone(),
        None => parse_labels(&std::env::var("CAW_BOX_LABELS").unwrap_or_default()),
    }
}

/// `k=v,k=v` into pairs, without caw-box's own `io.caw-box.managed`.
pub fn parse_labels(text: &str) -> Vec<(String, String)> {
    text.split(',')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            let k = k.trim();
            (!k.is_empty() && !k.starts_with("io.caw-box.managed"))
                .then(|| (k.to_string(), v.trim().to_string()))
        })
        .collect()
}

/// `k=v,k=v`, as `CAW_BOX_LABELS` takes them (for a detached turn's own process).
pub fn render_labels(labels: &[(String, String)]) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Adds [`extra_labels`] to `labels` without overriding any.
pub fn with_extra_labels(mut labels: HashMap<String, String>) -> HashMap<String, String> {
    for (k, v) in extra_labels() {
        labels.entry(k).or_insert(v);
    }
    labels
}

/// The name of a session's turn container, which is also the session's lock:
/// `caw-box-<session_id>` (the same as its state volume's: containers and volumes have
/// separate namespaces).
pub fn turn_container(session_id: Uuid) -> String {
    format!("caw-box-{session_id}")
}

/// The state volume's name for a session, mounted at HOME.
pub fn state_volume(session_id: Uuid) -> String {
    format!("caw-box-{session_id}")
}

/// A copy-mode session's workspace volume.
pub fn workspace_volume(session_id: Uuid) -> String {
    format!("caw-box-{session_id}-workspace")
}

/// The turn-record volume of `session_id`'s turn `turn`.
pub fn turn_record_volume(session_id: Uuid, turn: u32) -> String {
    format!("caw-box-{session_id}-turn-{turn}")
}

/// A fresh name for one of caw-box's short-lived helper containers of a session
/// (`what`: "chown", "diff", ...; empty for a plain volume reader).
pub fn helper_container(session_id: Uuid, what: &str) -> String {
    let unique = Uuid::new_v4().simple();
    if what.is_empty() {
        format!("caw-box-probe-{session_id}-{unique}")
    } else {
        format!("caw-box-probe-{session_id}-{what}-{unique}")
    }
}

/// The egress network and proxy container of a turn driven by process `pid`.
pub fn egress_names(session_id: Uuid, pid: u32) -> (String, String) {
    (
        format!("caw-box-{session_id}-egress-{pid}"),
        format!("caw-box-{session_id}-proxy-{pid}"),
    )
}

/// The credential broker's container (also its host name on the agent's network) and the
/// network made for it on `--network open`, of a turn driven by process `pid`.
pub fn broker_names(session_id: Uuid, pid: u32) -> (String, String) {
    (
        format!("caw-box-{session_id}-broker-{pid}"),
        format!("caw-box-{session_id}-brokernet-{pid}"),
    )
}

/// The labels of one object of a session: managed, session and role, plus whatever else
/// the object carries; [`LabelSet::finish`] adds the `CAW_BOX_LABELS` extras.
#[derive(Debug, Clone)]
pub struct LabelSet(HashMap<String, String>);

impl LabelSet {
    pub fn new(session_id: Uuid, role: &str) -> Self {
        LabelSet(HashMap::from([
            (labels::MANAGED.to_string(), "true".to_string()),
            (labels::SESSION.to_string(), session_id.to_string()),
            (labels::ROLE.to_string(), role.to_string()),
        ]))
    }

    pub fn provider(self, provider: ProviderKind) -> Self {
        self.with(labels::PROVIDER, provider.as_str())
    }

    pub fn with(mut self, key: &str, value: impl Into<String>) -> Self {
        self.0.insert(key.to_string(), value.into());
        self
    }

    pub fn finish(self) -> HashMap<String, String> {
        with_extra_labels(self.0)
    }
}

/// A label filter: objects carrying every one of these `key=value` pairs.
pub fn filter(pairs: &[(&str, &str)]) -> Vec<String> {
    pairs.iter().map(|(k, v)| format!("{k}={v}")).collect()
}
