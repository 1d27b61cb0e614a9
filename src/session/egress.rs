//! A turn's way out under `--allow-host`: an internal network for the agent and a proxy
//! container that admits only the allowed hosts; and what the proxy refused.

use std::time::Duration;

use futures_util::StreamExt;

use super::turn::{busy, image_hint};
use crate::backend::{Backend, CreateError};
use crate::backend::{HelperSpec, NetworkPolicy, OutputChunk};
use crate::dirs;
use crate::error::Result;
use crate::session::names::{self, LabelSet};
use crate::session::record::{labels, roles, SessionRecord};

/// The proxy's name on a turn's egress network, and its port.
pub const PROXY_ALIAS: &str = "caw-box-proxy";
pub const PROXY_PORT: u16 = 3128;

/// A turn's way out under `--allow-host`: an internal network for the agent, and a proxy
/// container on it and on the session's network that admits only the allowed hosts.
pub(super) struct Egress {
    pub(super) network: String,
    pub(super) proxy: String,
}

impl Egress {
    pub(super) async fn start(
        backend: &impl Backend,
        record: &SessionRecord,
        allow: &[String],
    ) -> Result<Egress> {
        let id = record.session_id;
        // Named for this driver: a second caw-box that starts on a busy session sets up its
        // own, and then fails on the lock without touching the running turn's.
        let pid = std::process::id();
        let (network, proxy) = names::egress_names(id, pid);
        let e = Egress { network, proxy };
        let labels = LabelSet::new(id, roles::PROXY).finish();
        backend
            .create_network(&e.network, true, labels.clone())
            .await?;
        let outer = match record.settings.network.as_str() {
            "open" | "" => "bridge".to_string(),
            other => other.to_string(),
        };
        let (uid, gid) = dirs::agent_ids();
        let spec = HelperSpec {
            scratch: None,
            image: record.settings.image.clone(),
            entrypoint: vec!["node".into(), "/usr/local/lib/caw-box/proxy.js".into()],
            argv: vec![],
            env: vec![
                format!("CAW_BOX_ALLOW={}", allow.join(",")),
                format!("CAW_BOX_PROXY_PORT={PROXY_PORT}"),
            ],
            user: Some(format!("{uid}:{gid}")),
            labels,
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
        };
        let started = async {
            match backend.create_helper(&e.proxy, &spec).await {
                Ok(_) => {}
                Err(CreateError::NameTaken) => {
                    return Err(busy(record, "?"));
                }
                Err(err) => return Err(image_hint(err, record)),
            }
            backend
                .connect_network(&e.network, &e.proxy, PROXY_ALIAS)
                .await?;
            backend.start_container(&e.proxy).await
        }
        .await;
        if let Err(err) = started {
            e.stop(backend).await;
            return Err(err);
        }
        Ok(e)
    }

    pub(super) async fn stop(&self, backend: &impl Backend) {
        let _ = backend.remove_container(&self.proxy, true).await;
        let _ = backend.remove_network(&self.network).await;
    }

    /// Removes the session's other proxies and egress networks: once this turn holds the
    /// session's lock, they are leftovers of turns whose caw-box was killed.
    pub(super) async fn remove_leftovers(&self, backend: &impl Backend, record: &SessionRecord) {
        let filter = [
            format!("{}={}", labels::SESSION, record.session_id),
            format!("{}={}", labels::ROLE, roles::PROXY),
        ];
        for c in backend.list_containers(&filter).await.unwrap_or_default() {
            if c.name != self.proxy && !c.id.is_empty() {
                let _ = backend.remove_container(&c.id, true).await;
            }
        }
        for n in backend.list_networks(&filter).await.unwrap_or_default() {
            if n != self.network {
                let _ = backend.remove_network(&n).await;
            }
        }
    }
}

/// The targets the proxy refused during the turn, from its JSON log lines.
pub(super) async fn refused_by_proxy(backend: &impl Backend, proxy: &str) -> Vec<String> {
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
