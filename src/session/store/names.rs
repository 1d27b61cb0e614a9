//! The names and labels of everything caw-box creates, in one place (SPEC.md, "Docker
//! objects"): a backend stores sessions under these names, and finds them again by these
//! labels, so they must never change without a migration (old sessions must resume).

use std::collections::HashMap;

use uuid::Uuid;

use crate::provider_kind::ProviderKind;

pub use crate::labelling::{labels, roles};

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

/// The labels of a session whose state volume a pool made before it existed (`caw-box
/// pool`): an empty volume, role `state`, with the session's own labels (a volume's labels
/// cannot change), which is what `ls` and a TARGET find.
pub fn facts_volume(session_id: Uuid) -> String {
    format!("caw-box-{session_id}-facts")
}

/// A pool's ready box, before a session claims it: `caw-box-pool-<session id>` (the id its
/// session will have).
pub fn pool_box(session_id: Uuid) -> String {
    format!("caw-box-pool-{session_id}")
}

/// A copy-mode session's workspace volume.
pub fn workspace_volume(session_id: Uuid) -> String {
    format!("caw-box-{session_id}-workspace")
}

/// The turn-record volume of `session_id`'s turn `turn`.
pub fn turn_record_volume(session_id: Uuid, turn: u32) -> String {
    format!("caw-box-{session_id}-turn-{turn}")
}

/// The checkpoint volume of `session_id`'s turn `turn` (`session::checkpoint`).
pub fn checkpoint_volume(session_id: Uuid, turn: u32) -> String {
    format!("caw-box-{session_id}-checkpoint-{turn}")
}

/// The helper that takes a warm turn's checkpoint behind it (`checkpoint::arm`): one name
/// per session, so the next turn finds it with one question.
pub fn checkpoint_behind(session_id: Uuid) -> String {
    format!("caw-box-probe-{session_id}-checkpoint")
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
