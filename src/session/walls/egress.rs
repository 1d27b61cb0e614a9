//! A turn's way out under `--allow-host`, planned once for every backend: the hosts
//! admitted and the proxy that admits them; and what the proxy refused. How the agent is
//! held to the proxy (networks, a pod's firewall) is the backend's.

use std::time::Duration;

use futures_util::StreamExt;

use crate::backend::{Backend, CreateError, EgressPlan};
use crate::backend::{HelperSpec, NetworkPolicy, OutputChunk};
use crate::dirs;
use crate::endpoint::endpoint_host;
use crate::error::Result;
use crate::session::store::names::{self, LabelSet};
use crate::session::store::record::{labels, roles, SessionRecord, SessionSettings};
use crate::session::turn::{busy, image_hint};

/// The proxy's name on a turn's egress network, and its port.
pub const PROXY_ALIAS: &str = "caw-box-proxy";
pub use crate::backend::{proxy_env, PROXY_PORT, PROXY_SCRIPT};

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

/// The plan of a turn's way out under `--allow-host`, the same on every backend: the
/// hosts admitted, and the proxy (caw-box's `proxy.js` in the session's image) where it
/// runs as a container of its own. The backend realises it ([`Backend::open_egress`]):
/// Docker on networks of its own, Kubernetes in the turn's pod.
pub(in crate::session) fn plan(record: &SessionRecord, allow: &[String], turn: &str) -> EgressPlan {
    let id = record.session_id;
    // Named for this driver: a second caw-box that starts on a busy session sets up its
    // own, and then fails on the lock without touching the running turn's.
    let (network, proxy_name) = names::egress_names(id, std::process::id());
    let outer = match record.settings.network.as_str() {
        "open" | "" => "bridge".to_string(),
        other => other.to_string(),
    };
    let (uid, gid) = dirs::agent_ids();
    let proxy = HelperSpec {
        scratch: None,
        image: record.settings.image.clone(),
        entrypoint: vec!["node".into(), PROXY_SCRIPT.into()],
        argv: vec![],
        env: proxy_env(allow)
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect(),
        user: Some(format!("{uid}:{gid}")),
        labels: LabelSet::new(id, roles::PROXY).finish(),
        mounts: vec![],
        network: NetworkPolicy::Named(outer),
        read_only_root: true,
        drop_all_capabilities: true,
        add_capabilities: vec![],
        no_new_privileges: true,
        pids_limit: Some(128),
        tmp: None,
        stdin: false,
        auto_remove: false,
        join: None,
    };
    EgressPlan {
        turn: turn.to_string(),
        proxy,
        proxy_name,
        alias: PROXY_ALIAS.to_string(),
        port: PROXY_PORT,
        network,
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
    let keep = [plan.proxy_name.as_str(), plan.network.as_str()];
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
