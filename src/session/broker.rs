//! A turn's credential broker: a small node program (`src/auth/broker.js`) in a container of
//! its own, next to the agent's, that holds the real API keys. The agent's CLI gets a
//! placeholder key and the broker's URL as its base URL (the adapters' `--endpoint`
//! mechanism); the broker swaps the placeholder for the real key and forwards to the real
//! upstream: the `--endpoint` URL, else the vendor's API host over TLS.
//!
//! The keys travel on the broker container's stdin (with the program itself), never in its
//! config, environment, labels or logs. The broker is reached by its container name on a
//! user-defined network the agent is on: the session's `--network NAME`, the egress network
//! of `--allow-host` (the broker is also on the outer network: the way out for model traffic,
//! so the provider's host need not be allowed), or, on `--network open`, a network made for
//! the turn (Docker's default bridge has no names). It starts concurrently with the agent's
//! container; the agent's runtime files (and so its CLI) wait for its "ready" line.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use super::turn::image_hint_for;
use crate::backend::{Backend, HelperSpec, NetworkPolicy, OutputChunk};
use crate::dirs;
use crate::error::{Error, Result};
use crate::provider::ProviderKind;
use crate::session::names::{self, LabelSet};
use crate::session::record::{labels, roles, SessionRecord};

/// The port the broker listens on, inside the turn's network.
pub const BROKER_PORT: u16 = 8080;

/// How long the broker may take to say it listens.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Loads the program that follows on stdin: one JSON line `{"script", "config"}`.
const LOADER: &str = "const c=[];const on=(d)=>{c.push(d);const b=Buffer.concat(c);const i=b.indexOf(10);if(i<0)return;process.stdin.off('data',on);process.stdin.pause();const j=JSON.parse(b.subarray(0,i).toString());c.length=0;const m={exports:{}};new Function('module','require',j.script)(m,require);m.exports(j.config);};process.stdin.on('data',on);";

const SCRIPT: &str = include_str!("../auth/broker.js");

/// The vendor's API host when the session has no `--endpoint` (from its credential spec).
pub fn default_upstream(p: ProviderKind) -> String {
    crate::auth::spec::Spec::of(p).broker.upstream
}

/// The path of a base URL, without a trailing `/` (`""` for none).
fn url_path(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let path = rest.find('/').map_or("", |i| &rest[i..]);
    let path = path.split(['?', '#']).next().unwrap_or("");
    path.trim_end_matches('/').to_string()
}

/// One turn's broker, planned before anything is created.
pub(super) struct Broker {
    /// The container, also the broker's host name.
    pub(super) container: String,
    /// A network made for this turn (`--network open`), which the agent joins too.
    pub(super) own_network: Option<String>,
    /// The network the broker is created on, and the agent's network it joins after.
    first: NetworkPolicy,
    join: Option<String>,
    image: String,
    provider: ProviderKind,
    session: uuid::Uuid,
    /// The JSON line for stdin (holds the real keys).
    config: crate::auth::Secret,
    /// What the adapter gets as `--endpoint`.
    pub(super) url: String,
}

impl Broker {
    /// The broker for `record`'s turn with `keys` (placeholder, real key), or `None` when
    /// the turn cannot be brokered (`--network none|host`: nothing to put it on).
    pub(super) fn plan(
        record: &SessionRecord,
        egress_network: Option<&str>,
        keys: &[(String, crate::auth::Secret)],
    ) -> Option<Broker> {
        if keys.is_empty() {
            return None;
        }
        let outer = NetworkPolicy::from_setting(&record.settings.network);
        let (container, net) = names::broker_names(record.session_id, std::process::id());
        let (first, join, own_network) = match (egress_network, &outer) {
            (_, NetworkPolicy::None | NetworkPolicy::Host) => return None,
            (Some(e), _) => (outer.clone(), Some(e.to_string()), None),
            (None, NetworkPolicy::Named(_)) => (outer.clone(), None, None),
            (None, NetworkPolicy::Default) => (NetworkPolicy::Named(net.clone()), None, Some(net)),
        };
        let upstream = record
            .settings
            .endpoint
            .clone()
            .unwrap_or_else(|| default_upstream(record.provider));
        let places = crate::auth::spec::Spec::of(record.provider)
            .broker
            .key_places;
        let path = url_path(&upstream);
        let mut map = serde_json::Map::new();
        for (placeholder, real) in keys {
            let real = String::from_utf8_lossy(real.expose()).into_owned();
            map.insert(placeholder.clone(), serde_json::Value::String(real));
        }
        let line = serde_json::json!({
            "script": SCRIPT,
            "config": {"port": BROKER_PORT, "upstream": upstream, "places": places, "keys": map},
        });
        let mut bytes = serde_json::to_vec(&line).ok()?;
        bytes.push(b'\n');
        Some(Broker {
            url: format!("http://{container}:{BROKER_PORT}{path}"),
            container,
            own_network,
            first,
            join,
            image: record.settings.image.clone(),
            provider: record.provider,
            session: record.session_id,
            config: crate::auth::Secret::new(bytes),
        })
    }

    /// The agent's network when the broker made one.
    pub(super) fn agent_network(&self) -> Option<NetworkPolicy> {
        self.own_network.clone().map(NetworkPolicy::Named)
    }

    /// Makes the network the broker needs before the agent's container can be created.
    pub(super) async fn prepare(&self, backend: &impl Backend) -> Result<()> {
        if let Some(n) = &self.own_network {
            let labels = LabelSet::new(self.session, roles::BROKER).finish();
            backend.create_network(n, false, labels).await?;
        }
        Ok(())
    }

    /// Creates and starts the broker, hands it its keys, and returns once it listens.
    pub(super) async fn start(&self, backend: &impl Backend) -> Result<()> {
        let (uid, gid) = dirs::agent_ids();
        let spec = HelperSpec {
            scratch: None,
            image: self.image.clone(),
            entrypoint: vec!["node".into(), "-e".into(), LOADER.into()],
            argv: vec![],
            env: vec![],
            user: Some(format!("{uid}:{gid}")),
            labels: LabelSet::new(self.session, roles::BROKER).finish(),
            mounts: vec![],
            network: self.first.clone(),
            read_only_root: true,
            drop_all_capabilities: true,
            add_capabilities: vec![],
            no_new_privileges: true,
            pids_limit: Some(64),
            tmp: None,
            stdin: true,
        };
        backend
            .create_helper(&self.container, &spec)
            .await
            .map_err(|e| image_hint_for(e, &self.image, self.provider))?;
        if let Some(n) = &self.join {
            backend
                .connect_network(n, &self.container, &self.container)
                .await?;
        }
        let mut attached = backend.attach(&self.container, true).await?;
        backend.start_container(&self.container).await?;
        attached
            .input
            .write_all(self.config.expose())
            .await
            .map_err(|e| Error::environment(format!("could not hand the broker its keys: {e}")))?;
        attached.input.flush().await.ok();
        let ready = async {
            let mut seen = Vec::new();
            while let Some(chunk) = attached.output.next().await {
                match chunk {
                    Ok(OutputChunk::Stdout(b)) => {
                        seen.extend_from_slice(&b);
                        if String::from_utf8_lossy(&seen).contains("caw-box-broker ready") {
                            return Ok(());
                        }
                    }
                    Ok(OutputChunk::Stderr(b)) => {
                        tracing::warn!("broker: {}", String::from_utf8_lossy(&b).trim_end());
                    }
                    Ok(_) => {}
                    Err(e) => return Err(e),
                }
            }
            Err(Error::environment(
                "the credential broker exited before it listened",
            ))
        };
        match tokio::time::timeout(READY_TIMEOUT, ready).await {
            Ok(r) => r,
            Err(_) => Err(Error::environment(
                "the credential broker did not start listening within 30 s",
            )),
        }
    }

    pub(super) async fn stop(&self, backend: &impl Backend) {
        let _ = backend.remove_container(&self.container, true).await;
        if let Some(n) = &self.own_network {
            let _ = backend.remove_network(n).await;
        }
    }

    /// Removes the session's other brokers and their networks: once this turn holds the
    /// session's lock, they are leftovers of turns whose caw-box was killed.
    pub(super) async fn remove_leftovers(&self, backend: &impl Backend) {
        let filter = [
            format!("{}={}", labels::SESSION, self.session),
            format!("{}={}", labels::ROLE, roles::BROKER),
        ];
        for c in backend.list_containers(&filter).await.unwrap_or_default() {
            if c.name != self.container && !c.id.is_empty() {
                let _ = backend.remove_container(&c.id, true).await;
            }
        }
        for n in backend.list_networks(&filter).await.unwrap_or_default() {
            if Some(&n) != self.own_network.as_ref() {
                let _ = backend.remove_network(&n).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Secret;
    use crate::session::record::{SessionSettings, WorkspaceMode};

    fn record(network: &str, endpoint: Option<&str>) -> SessionRecord {
        SessionRecord {
            version: 1,
            session_id: uuid::Uuid::new_v4(),
            provider: ProviderKind::ClaudeCode,
            name: None,
            group: None,
            resume_key: String::new(),
            key_confirmed: false,
            owner: None,
            created_at: 0,
            settings: SessionSettings {
                image: "caw-box/claude-code:latest".into(),
                network: network.into(),
                workspace_mode: WorkspaceMode::None,
                endpoint: endpoint.map(str::to_string),
                ..Default::default()
            },
            turns: Vec::new(),
            turn_started: false,
            summary_only: false,
        }
    }

    fn keys() -> Vec<(String, Secret)> {
        vec![(
            "sk-ant-api03-cawbox-placeholder-x".into(),
            Secret::new("real-key"),
        )]
    }

    #[test]
    fn the_broker_sits_where_the_agent_can_name_it() {
        // --network open: a network of its own, which the agent joins.
        let b = Broker::plan(&record("open", None), None, &keys()).unwrap();
        let own = b.own_network.clone().unwrap();
        assert_eq!(b.first, NetworkPolicy::Named(own.clone()));
        assert_eq!(b.agent_network(), Some(NetworkPolicy::Named(own)));
        assert_eq!(b.url, format!("http://{}:{BROKER_PORT}", b.container));
        // --network NAME: on it, under its own name (not a shared alias).
        let b = Broker::plan(&record("gw-net", None), None, &keys()).unwrap();
        assert_eq!(b.first, NetworkPolicy::Named("gw-net".into()));
        assert_eq!((b.join.as_deref(), b.agent_network()), (None, None));
        // --allow-host: on the outer network, and joins the agent's egress network.
        let b = Broker::plan(&record("open", None), Some("egress-net"), &keys()).unwrap();
        assert_eq!(b.first, NetworkPolicy::Default);
        assert_eq!(b.join.as_deref(), Some("egress-net"));
        assert_eq!(b.agent_network(), None);
        // Nowhere to put it, or nothing to broker.
        assert!(Broker::plan(&record("none", None), None, &keys()).is_none());
        assert!(Broker::plan(&record("host", None), None, &keys()).is_none());
        assert!(Broker::plan(&record("open", None), None, &[]).is_none());
    }

    #[test]
    fn the_upstream_is_the_endpoint_else_the_vendor_and_keys_go_only_to_stdin() {
        let b = Broker::plan(
            &record("n", Some("https://gw.example/anthropic/")),
            None,
            &keys(),
        )
        .unwrap();
        assert!(b.url.ends_with(":8080/anthropic"), "{}", b.url);
        let line: serde_json::Value = serde_json::from_slice(b.config.expose()).unwrap();
        assert_eq!(line["config"]["upstream"], "https://gw.example/anthropic/");
        assert_eq!(
            line["config"]["keys"]["sk-ant-api03-cawbox-placeholder-x"],
            "real-key"
        );
        let b = Broker::plan(&record("n", None), None, &keys()).unwrap();
        let line: serde_json::Value = serde_json::from_slice(b.config.expose()).unwrap();
        assert_eq!(line["config"]["upstream"], "https://api.anthropic.com");
        assert!(!LOADER.contains("real-key") && !b.url.contains("real-key"));
    }

    #[test]
    fn the_broker_url_keeps_the_endpoint_path() {
        assert_eq!(url_path("http://stub:8080"), "");
        assert_eq!(url_path("http://stub:8080/"), "");
        assert_eq!(url_path("https://gw.example/openai/v1/?x=1"), "/openai/v1");
    }

    #[test]
    fn the_loader_reads_one_line_and_the_script_exports_a_function() {
        assert!(LOADER.contains("indexOf(10)") && !LOADER.contains('\n'));
        assert!(SCRIPT.contains("module.exports = function broker(config)"));
    }
}
