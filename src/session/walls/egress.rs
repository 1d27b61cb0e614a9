//! A turn's way out under `--allow-host`, asked for once for every backend: the hosts
//! admitted; and what the proxy refused. How the agent is held to them (a proxy and its
//! container, its networks or firewall) is the backend's.

use std::time::Duration;

use futures_util::StreamExt;

use crate::backend::{Backend, CreateError, EgressPlan, NetworkPolicy, OutputChunk};
use crate::dirs;
use crate::endpoint::endpoint_host;
use crate::error::Result;
use crate::session::store::names::{self, LabelSet};
use crate::session::store::record::{labels, roles, SessionRecord, SessionSettings};
use crate::session::turn::{busy, image_hint};

/// The hosts of `--allow-host` with `@provider` spelled out.
pub fn expand_allow_hosts(
    provider: crate::provider::ProviderKind,
    settings: &SessionSettings,
) -> Vec<String> {
    let mut out = Vec::new();
    for h in &settings.allow_hosts {
        if h == "@provider" {
            match settings.endpoint.as_deref().and_then(endpoint_host) {
                Some(e) => out.push(e),
                None => out.extend(provider.api_hosts().iter().map(|s| s.to_string())),
            }
        } else {
            out.push(h.to_lowercase());
        }
    }
    out.sort();
    out.dedup();
    out
}

/// What a turn's way out under `--allow-host` is, the same on every backend: the hosts
/// admitted, for the turn `turn`, by the proxy program in the session's image. The backend
/// realises it ([`Backend::open_egress`]).
pub(in crate::session) fn plan(record: &SessionRecord, allow: &[String], turn: &str) -> EgressPlan {
    let id = record.session_id;
    // Named for this driver: a second caw-box that starts on a busy session sets up its
    // own, and then fails on the lock without touching the running turn's.
    let (network, proxy_name) = names::egress_names(id, std::process::id());
    EgressPlan {
        turn: turn.to_string(),
        allow: allow.to_vec(),
        image: record.settings.image.clone(),
        user: dirs::agent_ids(),
        network: NetworkPolicy::from_setting(&record.settings.network),
        labels: LabelSet::new(id, roles::PROXY).finish(),
        names: [network, proxy_name],
    }
}

/// Makes what the turn's egress needs before its container; a taken proxy name is a busy
/// session.
pub(in crate::session) async fn open(
    backend: &impl Backend,
    record: &SessionRecord,
    plan: &EgressPlan,
) -> Result<()> {
    match backend.open_egress(plan).await {
        Ok(()) => Ok(()),
        Err(CreateError::NameTaken) => Err(busy(record, "?")),
        Err(err) => Err(image_hint(err, record)),
    }
}

/// Removes the session's other proxies and egress networks: once this turn holds the
/// session's lock, they are leftovers of turns whose caw-box was killed.
pub(in crate::session) async fn remove_leftovers(
    backend: &impl Backend,
    record: &SessionRecord,
    plan: &EgressPlan,
) {
    let filter = [
        format!("{}={}", labels::SESSION, record.session_id),
        format!("{}={}", labels::ROLE, roles::PROXY),
    ];
    let keep = [plan.names[0].as_str(), plan.names[1].as_str()];
    let _ = backend.sweep(&filter, &keep).await;
}

/// The targets the proxy refused during the turn, from its JSON log lines.
pub(in crate::session) async fn refused_by_proxy(
    backend: &impl Backend,
    proxy: &str,
) -> Vec<String> {
    let mut logs = backend.follow_logs(proxy);
    let mut text = Vec::new();
    let read = async {
        while let Some(Ok(chunk)) = logs.next().await {
            if let OutputChunk::Stdout(message) = chunk {
                text.extend_from_slice(&message);
            }
        }
    };
    // The proxy still runs: take what it logged so far, don't wait for more.
    let _ = tokio::time::timeout(Duration::from_millis(300), read).await;
    let mut refused: Vec<String> = String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["decision"] == "refused")
        .filter_map(|v| v["target"].as_str().map(str::to_string))
        .collect();
    refused.dedup();
    refused
}
