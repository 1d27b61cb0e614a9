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
//!
//! Where a backend runs a turn as a pod (Kubernetes, [`Backend::brokers_in_turn_pod`]), the
//! broker is a second container of the turn's pod ([`SIDECAR`]) instead, listening on the
//! pod's loopback: the agent reaches it at `127.0.0.1`, nothing else does. Its keys still
//! come on its stdin (through an attachment once the pod runs), so no Secret, env value,
//! label or annotation holds them; it exits when the agent's container leaves its end
//! marker ([`POD_END_DIR`]), so the pod completes.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use super::turn::image_hint_for;
use crate::auth::inject::BrokeredLogin;
use crate::backend::{Backend, HelperSpec, NetworkPolicy, OutputChunk};
use crate::dirs;
use crate::error::{Error, Result};
use crate::provider::ProviderKind;
use crate::session::names::{self, LabelSet};
use crate::session::record::{labels, roles, SessionRecord};

/// The port the broker listens on, inside the turn's network.
pub const BROKER_PORT: u16 = 8080;
/// The port the broker listens on with TLS for the hosts it intercepts (the hosts' own).
pub const INTERCEPT_PORT: u16 = 443;

/// How long the broker may take to say it listens.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Loads the program that follows on stdin: one JSON line `{"script", "config"}`.
const LOADER: &str = "const c=[];const on=(d)=>{c.push(d);const b=Buffer.concat(c);const i=b.indexOf(10);if(i<0)return;process.stdin.off('data',on);process.stdin.pause();const j=JSON.parse(b.subarray(0,i).toString());c.length=0;const m={exports:{}};new Function('module','require',j.script)(m,require);m.exports(j.config,b.subarray(i+1));};process.stdin.on('data',on);";

const SCRIPT: &str = include_str!("../../auth/broker.js");

/// The broker's container in a turn's pod (see the module docs).
pub const SIDECAR: &str = "broker";
/// A directory the agent's and the broker's containers of a turn's pod share (memory): the
/// agent's container leaves [`POD_END_FILE`] there when it ends, and the broker exits.
pub const POD_END_DIR: &str = "/caw-box-pod";
pub const POD_END_FILE: &str = "agent-ended";

/// The sidecar broker's command: [`LOADER`], and an exit once the agent's container ended.
pub fn sidecar_entrypoint() -> Vec<String> {
    sidecar_entrypoint_watching(&format!("{POD_END_DIR}/{POD_END_FILE}"))
}

/// [`sidecar_entrypoint`] with the end marker at `marker`.
fn sidecar_entrypoint_watching(marker: &str) -> Vec<String> {
    let watch = format!(
        "setInterval(()=>{{if(require('fs').existsSync({}))process.exit(0);}},300);",
        serde_json::Value::String(marker.to_string())
    );
    vec!["node".into(), "-e".into(), format!("{LOADER}{watch}")]
}

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
    /// A shared broker's lease for this turn; `None`: the broker is this turn's own.
    shared: Option<Shared>,
    /// The key the broker seals refreshed tokens with, and whether it holds logins.
    seal: [u8; 32],
    logins: bool,
    /// A sidecar in the turn's pod of this name ([`Broker::plan_in_pod`]).
    in_pod: Option<String>,
    /// The hosts this broker stands in for with TLS (a login's `intercept`), and the
    /// turn's CA certificate the agent's container trusts for them.
    intercept: Option<Intercept>,
}

/// What the agent's container of a turn whose broker intercepts needs: the hosts to
/// resolve to the broker, and the CA to trust (public; its key is gone).
pub(super) struct Intercept {
    pub(super) hosts: Vec<String>,
    pub(super) ca_pem: String,
}

/// This turn's part of a shared broker (see the module docs).
struct Shared {
    /// The broker's name hash: its network's, and the label that finds both.
    hash: String,
    /// The lease line's id and its `placeholder=slot` pairs.
    lease_id: String,
    pairs: String,
    /// The running lease: ended (released) by [`Broker::stop`].
    held: std::sync::Mutex<Option<Lease>>,
}

/// A lease renewed in the background while the turn runs.
struct Lease {
    end: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

/// The label that names a shared broker (and its network) by its hash.
const SHARED_LABEL: &str = "io.caw-box.broker";

/// How long a lease holds without renewal, and how often it is renewed.
const LEASE_TTL: Duration = Duration::from_secs(60);
const LEASE_RENEW: Duration = Duration::from_secs(20);

/// How long a shared broker without a lease stays (`CAW_BOX_BROKER_IDLE`, seconds).
fn idle_ms() -> u64 {
    std::env::var("CAW_BOX_BROKER_IDLE")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(300)
        .saturating_mul(1000)
}

/// The salt of shared brokers' names: random, private to this data directory, so a name
/// tells nothing about the keys behind it (and only caw-box runs that share the data
/// directory share brokers).
fn salt() -> Result<Vec<u8>> {
    let dir = dirs::data_dir()?;
    dirs::ensure_private_dir(&dir)?;
    let path = dir.join("broker-salt");
    if let Ok(s) = std::fs::read(&path) {
        if s.len() >= 32 {
            return Ok(s);
        }
    }
    let fresh: Vec<u8> = [uuid::Uuid::new_v4(), uuid::Uuid::new_v4()]
        .iter()
        .flat_map(|u| *u.as_bytes())
        .collect();
    dirs::write_private(&path, &fresh)?;
    Ok(fresh)
}

/// Holds the data directory's broker lock (finding or starting a shared broker) while alive.
struct BrokerLock(#[allow(dead_code)] std::fs::File);

async fn lock_brokers() -> Result<BrokerLock> {
    let path = dirs::data_dir()?.join("broker.lock");
    tokio::task::spawn_blocking(move || {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .and_then(|f| f.lock().map(|()| f))
            .map_err(|e| Error::environment(format!("failed to lock '{}': {e}", path.display())))?;
        Ok(BrokerLock(file))
    })
    .await
    .map_err(|e| Error::environment(format!("locking the brokers failed: {e}")))?
}

/// Where the broker forwards to: the `--endpoint` URL, else the vendor's API for a login
/// (with the path prefix the CLI puts before its paths there), else the API key's.
fn upstream_of(record: &SessionRecord, logins: &[BrokeredLogin]) -> (String, Option<String>) {
    if let Some(e) = &record.settings.endpoint {
        return (e.clone(), None);
    }
    let oauth = crate::auth::spec::Spec::of(record.provider).oauth;
    match oauth {
        Some(o) if !logins.is_empty() && o.upstream.is_some() => {
            (o.upstream.unwrap_or_default(), o.cli_prefix)
        }
        _ => (default_upstream(record.provider), None),
    }
}

/// How near its expiry a brokered login is refreshed (`CAW_BOX_BROKER_MARGIN`, seconds;
/// 300 by default, as the CLIs themselves do).
fn margin_ms() -> u64 {
    std::env::var("CAW_BOX_BROKER_MARGIN")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(300)
        .saturating_mul(1000)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The vendor's token endpoint, unless `CAW_BOX_OAUTH_TOKEN_URL` names another (a stub in
/// tests, a gateway).
fn token_url(spec: &crate::auth::spec::OAuthSpec) -> String {
    std::env::var("CAW_BOX_OAUTH_TOKEN_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| spec.token_url.clone())
}

/// When the access token of login `v` expires (epoch ms; 0 when it does not say).
fn expires_ms(o: &crate::auth::spec::OAuthSpec, v: &serde_json::Value) -> u64 {
    use crate::auth::inject::json_at;
    match o.expiry_unit.as_str() {
        "jwt" => {
            let token = json_at(v, &o.expiry).and_then(|x| x.as_str()).unwrap_or("");
            crate::auth::spec::jwt_exp(token).unwrap_or(0) * 1000
        }
        unit => {
            let n = json_at(v, &o.expiry)
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0);
            if unit == "ms" {
                n
            } else {
                n * 1000
            }
        }
    }
}

/// The stored login of `p` as the broker keeps its tokens (`access`, `refresh`,
/// `expires_ms`, `id_token`), for a refresh handoff.
fn stored_tokens(p: ProviderKind) -> Option<serde_json::Value> {
    use crate::auth::inject::json_at;
    let o = crate::auth::spec::Spec::of(p).oauth?;
    let store = crate::auth::store::Store::open().ok()?;
    let real = store.file(p, &o.target)?;
    let v: serde_json::Value = serde_json::from_slice(real.expose()).ok()?;
    let text = |path: &str| {
        json_at(&v, path)
            .and_then(|x| x.as_str())
            .map(str::to_string)
    };
    Some(serde_json::json!({
        "access": text(&o.access)?,
        "refresh": text(&o.refresh)?,
        "expires_ms": expires_ms(&o, &v),
        "id_token": o.id_token.as_deref().and_then(text),
    }))
}

/// The broker's `oauth` config: each login's real tokens and how to refresh them, under the
/// slot `name` gives it.
fn login_slots(
    p: ProviderKind,
    logins: &[BrokeredLogin],
    mut name: impl FnMut(&BrokeredLogin) -> String,
) -> serde_json::Value {
    use crate::auth::inject::json_at;
    let mut out = serde_json::Map::new();
    let Some(o) = crate::auth::spec::Spec::of(p).oauth else {
        return out.into();
    };
    for l in logins {
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(l.real.expose()) else {
            continue;
        };
        let text = |path: &str| json_at(&v, path).and_then(|x| x.as_str()).unwrap_or("");
        let expires_ms = expires_ms(&o, &v);
        let scope = o
            .scopes
            .as_deref()
            .and_then(|path| json_at(&v, path))
            .and_then(|s| s.as_array().cloned())
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .filter(|s| !s.is_empty())
            .or_else(|| o.default_scope.clone());
        out.insert(
            name(l),
            serde_json::json!({
                "access": text(&o.access),
                "refresh": text(&o.refresh),
                "expires_ms": expires_ms,
                "token_url": token_url(&o),
                "client_id": o.client_id,
                "client_secret": o.client_secret,
                "body": o.body,
                "scope": scope,
            }),
        );
    }
    out.into()
}

/// `places` and, with logins, where the CLI sends its access token.
fn with_login_places(
    mut places: Vec<String>,
    p: ProviderKind,
    logins: &[BrokeredLogin],
) -> Vec<String> {
    if let (false, Some(o)) = (logins.is_empty(), crate::auth::spec::Spec::of(p).oauth) {
        for place in o.places {
            if !places.contains(&place) {
                places.push(place);
            }
        }
    }
    places
}

/// Seals `value` with `key` as the broker's `seal` does (base64 of iv | ciphertext | tag).
fn seal_json(key: &[u8; 32], value: &serde_json::Value) -> Option<String> {
    use base64::Engine;
    let iv: [u8; 12] = uuid::Uuid::new_v4().as_bytes()[..12].try_into().ok()?;
    let mut tag = [0u8; 16];
    let ct = openssl::symm::encrypt_aead(
        openssl::symm::Cipher::aes_256_gcm(),
        key,
        Some(&iv),
        &[],
        value.to_string().as_bytes(),
        &mut tag,
    )
    .ok()?;
    let mut raw = iv.to_vec();
    raw.extend_from_slice(&ct);
    raw.extend_from_slice(&tag);
    Some(base64::engine::general_purpose::STANDARD.encode(raw))
}

/// Holds `p`'s refresh lock (a file under the data directory), waiting up to `limit`:
/// one broker at a time refreshes a login, across every network and process of this host.
fn lock_refresh(p: ProviderKind, limit: Duration) -> Option<std::fs::File> {
    let path = dirs::data_dir().ok()?.join(format!("refresh-{p}.lock"));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .ok()?;
    let deadline = std::time::Instant::now() + limit;
    loop {
        match file.try_lock() {
            Ok(()) => return Some(file),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(_) => return None,
        }
    }
}

/// How long a broker's refresh may hold the login's refresh lock, and how long another
/// waits for it.
const REFRESH_LOCK: Duration = Duration::from_secs(40);

/// Answers a broker's `caw-box-broker refresh? <slot> <id> <sealed>`: the stored login when
/// it is newer than the one the broker would refresh (another broker refreshed it: the
/// broker's refresh token is used up), else `go`, holding the login's refresh lock until
/// the broker reports `caw-box-broker refreshed` (its new tokens stored by then).
async fn answer_refresh(
    p: ProviderKind,
    seal: [u8; 32],
    id: String,
    sealed: String,
    answers: tokio::sync::mpsc::UnboundedSender<String>,
    refreshed: std::sync::Arc<tokio::sync::Notify>,
) {
    let Some(theirs) = open_sealed(&seal, &sealed).and_then(|v| {
        v.get("refresh")
            .and_then(|r| r.as_str())
            .map(str::to_string)
    }) else {
        return;
    };
    let held = tokio::task::spawn_blocking(move || {
        let lock = lock_refresh(p, REFRESH_LOCK);
        (lock, stored_tokens(p))
    })
    .await;
    let Ok((lock, stored)) = held else { return };
    let newer = stored.filter(|t| t["refresh"].as_str() != Some(theirs.as_str()));
    if let Some(sealed) = newer.and_then(|t| seal_json(&seal, &t)) {
        tracing::debug!("handed the credential broker the {p} login another one refreshed");
        let _ = answers.send(format!("handoff {id} {sealed}\n"));
        return;
    }
    let done = refreshed.notified();
    tokio::pin!(done);
    done.as_mut().enable();
    let _ = answers.send(format!("handoff {id} go\n"));
    if lock.is_some() {
        let _ = tokio::time::timeout(REFRESH_LOCK, done).await;
    }
}

/// Opens a `caw-box-broker login <slot> <sealed>` line with `key`: the refreshed tokens.
fn open_sealed(key: &[u8; 32], sealed: &str) -> Option<serde_json::Value> {
    use base64::Engine;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(sealed.trim())
        .ok()?;
    if raw.len() < 12 + 16 {
        return None;
    }
    let (iv, rest) = raw.split_at(12);
    let (ct, tag) = rest.split_at(rest.len() - 16);
    let plain = openssl::symm::decrypt_aead(
        openssl::symm::Cipher::aes_256_gcm(),
        key,
        Some(iv),
        &[],
        ct,
        tag,
    )
    .ok()?;
    serde_json::from_slice(&plain).ok()
}

/// Reads a broker's stdout for refreshed logins and stores each (under the store's lock;
/// only over the login it replaces, so every attached caw-box may try).
struct LoginWatch {
    provider: ProviderKind,
    seal: [u8; 32],
    seen: Vec<u8>,
    /// Lines for the broker's stdin (refresh handoff answers).
    answers: tokio::sync::mpsc::UnboundedSender<String>,
    /// Told when the broker reports a refresh done.
    refreshed: std::sync::Arc<tokio::sync::Notify>,
}

impl LoginWatch {
    async fn take(&mut self, bytes: &[u8]) {
        self.seen.extend_from_slice(bytes);
        while let Some(i) = self.seen.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.seen.drain(..=i).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim();
            if line.starts_with("caw-box-broker refreshed ") {
                self.refreshed.notify_waiters();
                continue;
            }
            if let Some(asked) = line.strip_prefix("caw-box-broker refresh? ") {
                if let [_slot, id, sealed] = asked.split(' ').collect::<Vec<_>>()[..] {
                    tokio::spawn(answer_refresh(
                        self.provider,
                        self.seal,
                        id.to_string(),
                        sealed.to_string(),
                        self.answers.clone(),
                        self.refreshed.clone(),
                    ));
                }
                continue;
            }
            let Some(rest) = line.strip_prefix("caw-box-broker login ") else {
                continue;
            };
            let Some((_, sealed)) = rest.split_once(' ') else {
                continue;
            };
            let Some(t) = open_sealed(&self.seal, sealed) else {
                tracing::warn!("the credential broker reported a login caw-box cannot open");
                continue;
            };
            let field = |k: &str| t.get(k).and_then(|v| v.as_str()).map(str::to_string);
            let previous = field("previous").unwrap_or_default();
            let tokens = crate::auth::inject::RefreshedTokens {
                access: field("access").unwrap_or_default(),
                refresh: field("refresh").unwrap_or_default(),
                id_token: field("id_token"),
                expires_ms: t
                    .get("expires_ms")
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(0),
            };
            let p = self.provider;
            let stored = tokio::task::spawn_blocking(move || {
                let store = crate::auth::store::Store::open()?;
                crate::auth::store::store_refresh(&store, p, &previous, &tokens)
            })
            .await;
            match stored {
                Ok(Ok(true)) => {
                    tracing::info!("stored the {p} login the credential broker refreshed")
                }
                Ok(Ok(false)) => tracing::debug!("a newer {p} login is stored already"),
                Ok(Err(e)) => tracing::warn!("could not store the refreshed {p} login: {e}"),
                Err(e) => tracing::warn!("could not store the refreshed {p} login: {e}"),
            }
        }
    }
}

impl Broker {
    /// The broker for `record`'s turn with `keys` (placeholder, real key) and OAuth `logins`, or `None` when
    /// the turn cannot be brokered (`--network none|host`: nothing to put it on).
    /// `shared`: whether the backend can keep a broker for several turns
    /// ([`Backend::keeps_stdin_across_attaches`]); else each turn has its own.
    pub(super) fn plan_logins(
        record: &SessionRecord,
        egress_network: Option<&str>,
        keys: &[(String, crate::auth::Secret)],
        logins: &[BrokeredLogin],
        shared: bool,
    ) -> Option<Broker> {
        Self::plan_salted_logins(record, egress_network, keys, logins, shared.then_some(salt))
    }

    /// [`Broker::plan_logins`], with the salt of shared brokers' names from `salt`.
    #[cfg(test)]
    fn plan_salted(
        record: &SessionRecord,
        egress_network: Option<&str>,
        keys: &[(String, crate::auth::Secret)],
        salt: Option<fn() -> Result<Vec<u8>>>,
    ) -> Option<Broker> {
        Self::plan_salted_logins(record, egress_network, keys, &[], salt)
    }

    fn plan_salted_logins(
        record: &SessionRecord,
        egress_network: Option<&str>,
        keys: &[(String, crate::auth::Secret)],
        logins: &[BrokeredLogin],
        salt: Option<fn() -> Result<Vec<u8>>>,
    ) -> Option<Broker> {
        if keys.is_empty() && logins.is_empty() {
            return None;
        }
        let outer = NetworkPolicy::from_setting(&record.settings.network);
        if matches!(outer, NetworkPolicy::None | NetworkPolicy::Host) {
            return None;
        }
        // A login the broker intercepts for has the turn's own broker: its CA is the turn's.
        let hosts = match crate::auth::spec::Spec::of(record.provider).oauth {
            Some(o) if !logins.is_empty() => o.intercept,
            _ => Vec::new(),
        };
        if let (None, Some(salt), true) = (egress_network, salt, hosts.is_empty()) {
            return Self::plan_shared(record, &outer, keys, logins, salt);
        }
        let tls = if hosts.is_empty() {
            None
        } else {
            Some(crate::auth::intercept::intercept_tls(&hosts)?)
        };
        let (container, net) = names::broker_names(record.session_id, std::process::id());
        let (first, join, own_network) = match (egress_network, &outer) {
            (_, NetworkPolicy::None | NetworkPolicy::Host) => return None,
            (Some(e), _) => (outer.clone(), Some(e.to_string()), None),
            (None, NetworkPolicy::Named(_)) => (outer.clone(), None, None),
            (None, NetworkPolicy::Default) => (NetworkPolicy::Named(net.clone()), None, Some(net)),
        };
        let (upstream, cli_prefix) = upstream_of(record, logins);
        let places = crate::auth::spec::Spec::of(record.provider)
            .broker
            .key_places;
        let path = if cli_prefix.is_some() {
            String::new()
        } else {
            url_path(&upstream)
        };
        let mut map = serde_json::Map::new();
        for (placeholder, real) in keys {
            let real = String::from_utf8_lossy(real.expose()).into_owned();
            map.insert(placeholder.clone(), serde_json::Value::String(real));
        }
        let seal: [u8; 32] = {
            let mut k = [0u8; 32];
            k[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
            k[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
            k
        };
        let oauth = login_slots(record.provider, logins, |l| l.placeholder.clone());
        let places = with_login_places(places, record.provider, logins);
        let line = serde_json::json!({
            "script": SCRIPT,
            "config": {"port": BROKER_PORT, "upstream": upstream, "places": places, "keys": map,
                       "oauth": oauth, "seal": hex(&seal), "margin_ms": margin_ms(),
                       "cli_prefix": cli_prefix, "handoff": !logins.is_empty(),
                       "tls": tls.as_ref().map(|t| serde_json::json!({
                           "cert": t.cert_pem,
                           "key": String::from_utf8_lossy(t.key_pem.expose()),
                       })),
                       "tls_port": INTERCEPT_PORT},
        });
        let mut bytes = serde_json::to_vec(&line).ok()?;
        bytes.push(b'\n');
        Some(Broker {
            intercept: tls.map(|t| Intercept {
                hosts,
                ca_pem: t.ca_pem,
            }),
            seal,
            logins: !logins.is_empty(),
            url: format!("http://{container}:{BROKER_PORT}{path}"),
            container,
            own_network,
            first,
            join,
            image: record.settings.image.clone(),
            provider: record.provider,
            session: record.session_id,
            config: crate::auth::Secret::new(bytes),
            shared: None,
            in_pod: None,
        })
    }

    /// A shared broker for `record`'s turn: one per network, upstream and key set, found or
    /// started by [`Broker::start`]. `None` when the salt cannot be had (the turn then has
    /// none: injected).
    fn plan_shared(
        record: &SessionRecord,
        outer: &NetworkPolicy,
        keys: &[(String, crate::auth::Secret)],
        logins: &[BrokeredLogin],
        salt: fn() -> Result<Vec<u8>>,
    ) -> Option<Broker> {
        use sha2::{Digest, Sha256};
        let (upstream, cli_prefix) = upstream_of(record, logins);
        let mut reals: Vec<&[u8]> = keys.iter().map(|(_, r)| r.expose()).collect();
        reals.sort();
        reals.dedup();
        let salt = match salt() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("{e}");
                return None;
            }
        };
        let mut h = Sha256::new();
        h.update(&salt);
        for part in [
            record.provider.as_str(),
            &upstream,
            &record.settings.network,
            &names::render_labels(&names::extra_labels()),
            &record.settings.image,
        ] {
            h.update(part.as_bytes());
            h.update([0]);
        }
        for r in &reals {
            h.update(r);
            h.update([0]);
        }
        for l in logins {
            h.update(b"login");
            h.update(l.real.expose());
            h.update([0]);
        }
        let digest = h.finalize();
        let hash: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        // Every caw-box that shares this broker (same salt, same secrets) knows its seal key.
        let seal: [u8; 32] = Sha256::new()
            .chain_update(b"caw-box-broker-seal")
            .chain_update(digest)
            .finalize()
            .into();
        let slot =
            |real: &[u8]| format!("slot{}", reals.iter().position(|r| *r == real).unwrap_or(0));
        let pairs = keys
            .iter()
            .map(|(placeholder, real)| format!("{placeholder}={}", slot(real.expose())))
            .chain(
                logins
                    .iter()
                    .enumerate()
                    .map(|(i, l)| format!("{}=login{i}", l.placeholder)),
            )
            .collect::<Vec<_>>()
            .join(" ");
        let mut map = serde_json::Map::new();
        for r in &reals {
            map.insert(
                slot(r),
                serde_json::Value::String(String::from_utf8_lossy(r).into_owned()),
            );
        }
        let places = crate::auth::spec::Spec::of(record.provider)
            .broker
            .key_places;
        let path = if cli_prefix.is_some() {
            String::new()
        } else {
            url_path(&upstream)
        };
        let mut n = 0;
        let oauth = login_slots(record.provider, logins, |_| {
            n += 1;
            format!("login{}", n - 1)
        });
        let places = with_login_places(places, record.provider, logins);
        let line = serde_json::json!({
            "script": SCRIPT,
            "config": {"port": BROKER_PORT, "upstream": upstream, "places": places, "keys": map,
                       "shared": true, "idle_ms": idle_ms(),
                       "oauth": oauth, "seal": hex(&seal), "margin_ms": margin_ms(),
                       "cli_prefix": cli_prefix, "handoff": !logins.is_empty()},
        });
        let mut bytes = serde_json::to_vec(&line).ok()?;
        bytes.push(b'\n');
        let container = format!("caw-box-broker-{hash}");
        let (first, own_network) = match outer {
            NetworkPolicy::Named(_) => (outer.clone(), None),
            _ => {
                let net = format!("caw-box-brokernet-{hash}");
                (NetworkPolicy::Named(net.clone()), Some(net))
            }
        };
        Some(Broker {
            seal,
            logins: !logins.is_empty(),
            url: format!("http://{container}:{BROKER_PORT}{path}"),
            container,
            own_network,
            first,
            join: None,
            image: record.settings.image.clone(),
            provider: record.provider,
            session: record.session_id,
            config: crate::auth::Secret::new(bytes),
            shared: Some(Shared {
                hash,
                lease_id: uuid::Uuid::new_v4().simple().to_string(),
                pairs,
                held: std::sync::Mutex::new(None),
            }),
            in_pod: None,
            intercept: None,
        })
    }

    /// The broker of `record`'s turn as a sidecar of its pod `pod` (the backend runs one:
    /// [`Backend::brokers_in_turn_pod`]), listening on the pod's loopback; `None` when
    /// there is nothing to broker.
    pub(super) fn plan_in_pod(
        record: &SessionRecord,
        keys: &[(String, crate::auth::Secret)],
        pod: &str,
    ) -> Option<Broker> {
        if keys.is_empty() {
            return None;
        }
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
            "config": {"port": BROKER_PORT, "host": "127.0.0.1", "upstream": upstream,
                       "places": places, "keys": map},
        });
        let mut bytes = serde_json::to_vec(&line).ok()?;
        bytes.push(b'\n');
        Some(Broker {
            url: format!("http://127.0.0.1:{BROKER_PORT}{path}"),
            container: format!("{pod}/{SIDECAR}"),
            own_network: None,
            first: NetworkPolicy::Default,
            join: None,
            image: record.settings.image.clone(),
            provider: record.provider,
            session: record.session_id,
            config: crate::auth::Secret::new(bytes),
            shared: None,
            // Keys only: a pod's logins are injected (no caw-box stays attached to store
            // what a sidecar would refresh).
            seal: [0; 32],
            logins: false,
            in_pod: Some(pod.to_string()),
            intercept: None,
        })
    }

    /// Whether this broker is a sidecar of the turn's pod (started once the pod runs).
    /// The hosts this broker stands in for with TLS, and the CA the agent trusts for them.
    pub(super) fn intercept(&self) -> Option<&Intercept> {
        self.intercept.as_ref()
    }

    /// The broker's address on the agent's network, once it runs (for the agent's
    /// container to resolve the intercepted hosts to).
    pub(super) async fn address(&self, backend: &impl Backend) -> Result<Option<String>> {
        let network = match (&self.own_network, &self.join, &self.first) {
            (Some(n), _, _) | (None, Some(n), _) | (None, None, NetworkPolicy::Named(n)) => n,
            _ => return Ok(None),
        };
        backend.container_address(&self.container, network).await
    }

    pub(super) fn in_pod(&self) -> bool {
        self.in_pod.is_some()
    }

    /// The labels of this turn's broker and the network made for it.
    fn labels(&self) -> std::collections::HashMap<String, String> {
        match &self.shared {
            None => LabelSet::new(self.session, roles::BROKER).finish(),
            // Of no session: `rm` of one leaves it to the others.
            Some(s) => names::with_extra_labels(std::collections::HashMap::from([
                (labels::MANAGED.to_string(), "true".to_string()),
                (labels::ROLE.to_string(), roles::BROKER.to_string()),
                (SHARED_LABEL.to_string(), s.hash.clone()),
            ])),
        }
    }

    /// This turn's lease line: its placeholders, valid for [`LEASE_TTL`].
    fn lease_line(s: &Shared) -> String {
        format!(
            "lease {} {} {}\n",
            s.lease_id,
            LEASE_TTL.as_millis(),
            s.pairs
        )
    }

    /// The agent's network when the broker made one.
    pub(super) fn agent_network(&self) -> Option<NetworkPolicy> {
        self.own_network.clone().map(NetworkPolicy::Named)
    }

    /// Makes the network the broker needs before the agent's container can be created.
    pub(super) async fn prepare(&self, backend: &impl Backend) -> Result<()> {
        let Some(n) = &self.own_network else {
            return Ok(());
        };
        if let Some(s) = &self.shared {
            // Kept with the broker: made once, under the lock (Docker may allow two of a name).
            let _lock = lock_brokers().await?;
            let filter = [format!("{SHARED_LABEL}={}", s.hash)];
            if backend.list_networks(&filter).await?.contains(n) {
                return Ok(());
            }
            return backend.create_network(n, false, self.labels()).await;
        }
        backend.create_network(n, false, self.labels()).await
    }

    /// Returns once the turn's broker listens with its keys: a shared one found running and
    /// leased, else one started.
    pub(super) async fn start(&self, backend: &impl Backend) -> Result<()> {
        if let Some(pod) = &self.in_pod {
            return self.start_in_pod(backend, pod).await;
        }
        let Some(s) = &self.shared else {
            let attached = self.start_own(backend, None).await?;
            if self.logins {
                let (mut watch, mut to_broker) = self.watch();
                tokio::spawn(async move {
                    let (mut output, mut input) = (attached.output, attached.input);
                    loop {
                        tokio::select! {
                            chunk = output.next() => match chunk {
                                Some(Ok(OutputChunk::Stdout(b))) => watch.take(&b).await,
                                Some(_) => {}
                                None => break,
                            },
                            Some(line) = to_broker.recv() => {
                                let _ = input.write_all(line.as_bytes()).await;
                                let _ = input.flush().await;
                            }
                        }
                    }
                });
            }
            return Ok(());
        };
        let _lock = lock_brokers().await?;
        for _ in 0..3 {
            match backend.inspect_container(&self.container).await? {
                Some(c) if c.running() => {
                    let mut attached = backend.attach(&self.container, true).await?;
                    if lease(&mut attached, s, Duration::from_secs(3))
                        .await
                        .is_ok()
                    {
                        tracing::debug!("leased the running broker {}", self.container);
                        self.keep(attached);
                        return Ok(());
                    }
                    // On its way out: it answers no lease any more.
                    backend.remove_found(&c).await?;
                }
                Some(c) => backend.remove_found(&c).await?,
                None => {
                    let attached = self.start_own(backend, Some(s)).await?;
                    self.keep(attached);
                    return Ok(());
                }
            }
        }
        Err(Error::environment(format!(
            "could not start or lease the credential broker {}",
            self.container
        )))
    }

    /// Hands the sidecar of the running pod `pod` its keys and waits for it to listen. The
    /// attachment goes after: the broker read its one line, and lives until the agent's
    /// container ended.
    async fn start_in_pod(&self, backend: &impl Backend, pod: &str) -> Result<()> {
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        let mut attached = loop {
            // The agent's container runs; the sidecar may start a moment later.
            match backend.attach_sidecar(pod, SIDECAR).await {
                Ok(a) => break a,
                Err(e) if tokio::time::Instant::now() > deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        attached
            .input
            .write_all(self.config.expose())
            .await
            .map_err(|e| Error::environment(format!("could not hand the broker its keys: {e}")))?;
        attached.input.flush().await.ok();
        match tokio::time::timeout(READY_TIMEOUT, until_ready(&mut attached, None)).await {
            Ok(r) => r,
            Err(_) => Err(Error::environment(
                "the credential broker did not start listening within 30 s",
            )),
        }
    }

    /// The reader of the broker's stdout for logins, and the lines it answers with.
    fn watch(&self) -> (LoginWatch, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let (answers, to_broker) = tokio::sync::mpsc::unbounded_channel();
        let watch = LoginWatch {
            provider: self.provider,
            seal: self.seal,
            seen: Vec::new(),
            answers,
            refreshed: std::sync::Arc::new(tokio::sync::Notify::new()),
        };
        (watch, to_broker)
    }

    /// Renews this turn's lease on `attached` until [`Broker::stop`] (and, with logins,
    /// stores the tokens the broker refreshes meanwhile).
    fn keep(&self, mut attached: crate::backend::Attached) {
        let Some(s) = &self.shared else { return };
        let (end, mut ended) = tokio::sync::oneshot::channel::<()>();
        let (renew, release) = (Self::lease_line(s), format!("release {}\n", s.lease_id));
        let (mut watch, mut to_broker) = match self.logins.then(|| self.watch()) {
            Some((w, rx)) => (Some(w), Some(rx)),
            None => (None, None),
        };
        let task = tokio::spawn(async move {
            // A deadline apart from the output: the broker's answers to other turns' leases
            // must not postpone this one's renewal.
            let mut renewal =
                tokio::time::interval_at(tokio::time::Instant::now() + LEASE_RENEW, LEASE_RENEW);
            loop {
                tokio::select! {
                    _ = &mut ended => break,
                    chunk = attached.output.next(), if watch.is_some() => match (chunk, watch.as_mut()) {
                        (Some(Ok(OutputChunk::Stdout(b))), Some(w)) => w.take(&b).await,
                        (None, _) => watch = None,
                        _ => {}
                    },
                    Some(line) = async { to_broker.as_mut()?.recv().await }, if to_broker.is_some() => {
                        let _ = attached.input.write_all(line.as_bytes()).await;
                        let _ = attached.input.flush().await;
                    }
                    _ = renewal.tick() => {
                        if attached.input.write_all(renew.as_bytes()).await.is_err() {
                            tracing::warn!("lost the credential broker's lease channel");
                        }
                        let _ = attached.input.flush().await;
                    }
                }
            }
            let _ = attached.input.write_all(release.as_bytes()).await;
            let _ = attached.input.flush().await;
        });
        *s.held.lock().unwrap_or_else(|e| e.into_inner()) = Some(Lease { end, task });
    }

    /// Creates and starts a broker, hands it its keys (and a shared one this turn's lease),
    /// and returns its attachment once it listens.
    async fn start_own(
        &self,
        backend: &impl Backend,
        shared: Option<&Shared>,
    ) -> Result<crate::backend::Attached> {
        let (uid, gid) = dirs::agent_ids();
        let spec = HelperSpec {
            scratch: None,
            image: self.image.clone(),
            entrypoint: vec!["node".into(), "-e".into(), LOADER.into()],
            argv: vec![],
            env: vec![],
            user: Some(format!("{uid}:{gid}")),
            labels: self.labels(),
            mounts: vec![],
            network: self.first.clone(),
            read_only_root: true,
            drop_all_capabilities: true,
            add_capabilities: vec![],
            no_new_privileges: true,
            pids_limit: Some(64),
            tmp: None,
            stdin: true,
            auto_remove: shared.is_some(),
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
        let mut first = self.config.expose().to_vec();
        if let Some(s) = shared {
            first.extend_from_slice(Self::lease_line(s).as_bytes());
        }
        attached
            .input
            .write_all(&first)
            .await
            .map_err(|e| Error::environment(format!("could not hand the broker its keys: {e}")))?;
        attached.input.flush().await.ok();
        let leased = shared.map(|s| format!("caw-box-broker ok {}", s.lease_id));
        let ready = tokio::time::timeout(READY_TIMEOUT, until_ready(&mut attached, leased)).await;
        match ready {
            Ok(r) => r.map(|()| attached),
            Err(_) => Err(Error::environment(
                "the credential broker did not start listening within 30 s",
            )),
        }
    }

    /// Ends the turn's use of its broker: a shared one's lease is released (the broker
    /// stays for the next turns), a turn's own broker is removed.
    pub(super) async fn stop(&self, backend: &impl Backend) {
        if self.in_pod.is_some() {
            // It ends with the agent's container (and goes with the pod).
            return;
        }
        if let Some(s) = &self.shared {
            let held = s.held.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(l) = held {
                let _ = l.end.send(());
                let _ = tokio::time::timeout(Duration::from_secs(2), l.task).await;
            }
            return;
        }
        let _ = backend.remove_container(&self.container, true).await;
        if let Some(n) = &self.own_network {
            let _ = backend.remove_network(n).await;
        }
    }

    /// Removes the session's other brokers and their networks: once this turn holds the
    /// session's lock, they are leftovers of turns whose caw-box was killed.
    pub(super) async fn remove_leftovers(&self, backend: &impl Backend) {
        if self.shared.is_some() || self.in_pod.is_some() {
            // Shared: not this session's alone (a per-turn leftover goes with `rm`/`gc`).
            return;
        }
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

/// Reads a broker's output until it says it listens (and, with `leased`, holds the lease).
async fn until_ready(
    attached: &mut crate::backend::Attached,
    leased: Option<String>,
) -> Result<()> {
    let mut seen = Vec::new();
    while let Some(chunk) = attached.output.next().await {
        match chunk {
            Ok(OutputChunk::Stdout(b)) => {
                seen.extend_from_slice(&b);
                let text = String::from_utf8_lossy(&seen);
                if text.contains("caw-box-broker ready")
                    && leased.as_ref().is_none_or(|l| text.contains(l.as_str()))
                {
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
}

/// Sends this turn's lease to a running shared broker and waits for its answer (sent
/// again every 500 ms: a line may arrive before the broker reads its stdin).
async fn lease(attached: &mut crate::backend::Attached, s: &Shared, limit: Duration) -> Result<()> {
    let want = format!("caw-box-broker ok {}", s.lease_id);
    let line = Broker::lease_line(s);
    let answered = async {
        let mut seen = Vec::new();
        loop {
            attached
                .input
                .write_all(line.as_bytes())
                .await
                .map_err(|e| Error::environment(format!("could not lease the broker: {e}")))?;
            attached.input.flush().await.ok();
            let wait = tokio::time::sleep(Duration::from_millis(500));
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    () = &mut wait => break,
                    chunk = attached.output.next() => match chunk {
                        Some(Ok(OutputChunk::Stdout(b))) => {
                            seen.extend_from_slice(&b);
                            if String::from_utf8_lossy(&seen).contains(&want) {
                                return Ok(());
                            }
                        }
                        Some(_) => {}
                        None => return Err(Error::environment("the credential broker is gone")),
                    }
                }
            }
        }
    };
    tokio::time::timeout(limit, answered)
        .await
        .unwrap_or_else(|_| Err(Error::environment("the credential broker answers no lease")))
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
            home_unlike_image: false,
            turn_started: false,
            summary_only: false,
        }
    }

    fn test_salt() -> Result<Vec<u8>> {
        Ok(vec![7; 32])
    }

    fn plan(r: &SessionRecord, egress: Option<&str>, keys: &[(String, Secret)]) -> Option<Broker> {
        Broker::plan_salted(r, egress, keys, Some(test_salt))
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
        let b = plan(&record("open", None), None, &keys()).unwrap();
        let own = b.own_network.clone().unwrap();
        assert_eq!(b.first, NetworkPolicy::Named(own.clone()));
        assert_eq!(b.agent_network(), Some(NetworkPolicy::Named(own)));
        assert_eq!(b.url, format!("http://{}:{BROKER_PORT}", b.container));
        // --network NAME: on it, under its own name (not a shared alias).
        let b = plan(&record("gw-net", None), None, &keys()).unwrap();
        assert_eq!(b.first, NetworkPolicy::Named("gw-net".into()));
        assert_eq!((b.join.as_deref(), b.agent_network()), (None, None));
        // --allow-host: on the outer network, and joins the agent's egress network.
        let b = plan(&record("open", None), Some("egress-net"), &keys()).unwrap();
        assert_eq!(b.first, NetworkPolicy::Default);
        assert_eq!(b.join.as_deref(), Some("egress-net"));
        assert_eq!(b.agent_network(), None);
        // Nowhere to put it, or nothing to broker.
        assert!(plan(&record("none", None), None, &keys()).is_none());
        assert!(plan(&record("host", None), None, &keys()).is_none());
        assert!(plan(&record("open", None), None, &[]).is_none());
    }

    #[test]
    fn the_upstream_is_the_endpoint_else_the_vendor_and_keys_go_only_to_stdin() {
        // A turn's own broker (--allow-host): the placeholder is the key's name.
        let b = plan(
            &record("n", Some("https://gw.example/anthropic/")),
            Some("egress"),
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
        // A shared one: slots, and the turn's placeholder only in its lease line.
        let b = plan(&record("n", None), None, &keys()).unwrap();
        let line: serde_json::Value = serde_json::from_slice(b.config.expose()).unwrap();
        assert_eq!(line["config"]["upstream"], "https://api.anthropic.com");
        assert_eq!(line["config"]["shared"], true);
        assert_eq!(
            line["config"]["keys"],
            serde_json::json!({"slot0": "real-key"})
        );
        let lease = Broker::lease_line(b.shared.as_ref().unwrap());
        assert!(
            lease.ends_with(" sk-ant-api03-cawbox-placeholder-x=slot0\n"),
            "{lease}"
        );
        assert!(!lease.contains("real-key"));
        assert!(!LOADER.contains("real-key") && !b.url.contains("real-key"));
        assert!(!b.container.contains("real-key"));
    }

    /// Turns with the same network, upstream, labels and key share a broker; any difference
    /// gives another (another key: never a broker holding the old one).
    #[test]
    fn a_shared_broker_is_named_by_what_it_holds() {
        let name = |network: &str, key: &str| {
            let k = vec![(
                "sk-ant-api03-cawbox-placeholder-y".to_string(),
                Secret::new(key),
            )];
            plan(&record(network, None), None, &k).unwrap().container
        };
        assert_eq!(name("n", "k1"), name("n", "k1"));
        assert_ne!(name("n", "k1"), name("n", "k2"));
        assert_ne!(name("n", "k1"), name("m", "k1"));
        assert_ne!(name("n", "k1"), name("open", "k1"));
        let salted = |salt: fn() -> Result<Vec<u8>>| {
            Broker::plan_salted(&record("n", None), None, &keys(), Some(salt))
                .unwrap()
                .container
        };
        assert_ne!(salted(test_salt), salted(|| Ok(vec![8; 32])));
        // A backend that cannot share one (Podman): the turn's own, on its own network.
        let own = Broker::plan_salted(&record("open", None), None, &keys(), None).unwrap();
        assert!(own.shared.is_none());
        assert!(
            own.container.contains(&own.session.to_string()),
            "{}",
            own.container
        );
        assert!(own.own_network.is_some());
    }

    fn login() -> BrokeredLogin {
        BrokeredLogin {
            placeholder: "sk-ant-oat01-cawbox-placeholder-z".into(),
            target: ".claude/.credentials.json".into(),
            real: Secret::new(
                r#"{"claudeAiOauth":{"accessToken":"real-a","refreshToken":"real-r","expiresAt":1700000000000,"scopes":["user:inference","user:profile"]}}"#,
            ),
        }
    }

    #[test]
    fn a_login_goes_to_the_broker_as_a_slot_and_its_placeholder_in_the_lease() {
        let b =
            Broker::plan_salted_logins(&record("n", None), None, &[], &[login()], Some(test_salt))
                .unwrap();
        let line: serde_json::Value = serde_json::from_slice(b.config.expose()).unwrap();
        let slot = &line["config"]["oauth"]["login0"];
        assert_eq!(slot["access"], "real-a");
        assert_eq!(slot["refresh"], "real-r");
        assert_eq!(slot["expires_ms"], 1_700_000_000_000u64);
        assert_eq!(slot["client_id"], "9d1c250a-e61b-44d9-88ed-5944d1962f5e");
        assert_eq!(slot["scope"], "user:inference user:profile");
        assert_eq!(line["config"]["seal"].as_str().unwrap().len(), 64);
        let lease = Broker::lease_line(b.shared.as_ref().unwrap());
        assert!(
            lease.ends_with(" sk-ant-oat01-cawbox-placeholder-z=login0\n"),
            "{lease}"
        );
        assert!(!lease.contains("real-"));
        // Another login (a refresh stored meanwhile): another broker.
        let mut other = login();
        other.real = Secret::new(
            r#"{"claudeAiOauth":{"accessToken":"a2","refreshToken":"r2","expiresAt":1}}"#,
        );
        let b2 =
            Broker::plan_salted_logins(&record("n", None), None, &[], &[other], Some(test_salt))
                .unwrap();
        assert_ne!(b.container, b2.container);
        assert_ne!(b.seal, b2.seal);
    }

    /// opencode's ChatGPT login: the turn's own broker (even where brokers are shared), which
    /// gets a certificate for chatgpt.com and its key on stdin; the agent gets the CA only.
    #[test]
    fn an_intercepted_login_has_a_broker_of_its_own_with_the_turns_tls() {
        let mut r = record("open", None);
        r.provider = ProviderKind::Opencode;
        let l = BrokeredLogin {
            placeholder: "cawbox-placeholder-z".into(),
            target: ".local/share/opencode/auth.json".into(),
            real: Secret::new(
                r#"{"openai":{"type":"oauth","access":"real-a","refresh":"real-r","expires":1700000000000,"accountId":"acct"}}"#,
            ),
        };
        let b = Broker::plan_salted_logins(&r, None, &[], &[l], Some(test_salt)).unwrap();
        assert!(b.shared.is_none());
        assert!(b.own_network.is_some());
        let i = b.intercept().unwrap();
        assert_eq!(i.hosts, ["chatgpt.com"]);
        assert!(i.ca_pem.contains("BEGIN CERTIFICATE"));
        assert!(!i.ca_pem.contains("PRIVATE"));
        let line: serde_json::Value = serde_json::from_slice(b.config.expose()).unwrap();
        let c = &line["config"];
        assert_eq!(c["upstream"], "https://chatgpt.com");
        assert_eq!(c["tls_port"], INTERCEPT_PORT);
        assert!(c["tls"]["key"].as_str().unwrap().contains("PRIVATE KEY"));
        assert!(c["tls"]["cert"]
            .as_str()
            .unwrap()
            .contains("BEGIN CERTIFICATE"));
        assert_eq!(c["oauth"]["cawbox-placeholder-z"]["body"], "form");
        assert_eq!(c["oauth"]["cawbox-placeholder-z"]["access"], "real-a");
        // Nothing of the key in what the backend sees of the broker.
        let labels = format!("{:?}", b.labels());
        assert!(!labels.contains("PRIVATE") && !labels.contains("real-"));
        // API keys alone: no interception, shared as before.
        let keyed = Broker::plan_salted(&r, None, &keys(), Some(test_salt)).unwrap();
        assert!(keyed.intercept().is_none() && keyed.shared.is_some());
    }

    /// A sealed report (broker.js's layout: iv, ciphertext, tag) opens with the seal key only
    /// (the e2e oauth test opens those node sealed).
    #[test]
    fn a_sealed_login_opens_with_the_seal_key_only() {
        let key = [9u8; 32];
        let iv = [1u8; 12];
        let mut tag = [0u8; 16];
        let plain = br#"{"previous":"r1","access":"a2","refresh":"r2","expires_ms":5}"#;
        let ct = openssl::symm::encrypt_aead(
            openssl::symm::Cipher::aes_256_gcm(),
            &key,
            Some(&iv),
            &[],
            plain,
            &mut tag,
        )
        .unwrap();
        use base64::Engine;
        let sealed =
            base64::engine::general_purpose::STANDARD.encode([&iv[..], &ct, &tag].concat());
        let opened = open_sealed(&key, &sealed).unwrap();
        assert_eq!(opened["refresh"], "r2");
        assert!(open_sealed(&[8u8; 32], &sealed).is_none());
        assert!(open_sealed(&key, "bm90IHNlYWxlZA==").is_none());
        // What caw-box hands a broker (a refresh handoff) opens the same way.
        let handed = seal_json(&key, &serde_json::json!({"access": "a3", "refresh": "r3"}));
        let handed = handed.unwrap();
        assert_eq!(open_sealed(&key, &handed).unwrap()["refresh"], "r3");
        assert!(!handed.contains("r3"));
        assert!(open_sealed(&[8u8; 32], &handed).is_none());
    }

    #[test]
    fn a_sidecar_broker_listens_on_the_pods_loopback_and_its_keys_go_only_to_stdin() {
        let b = Broker::plan_in_pod(
            &record("open", Some("http://10.0.0.5:8080/v1")),
            &keys(),
            "caw-box-x",
        )
        .unwrap();
        assert!(b.in_pod());
        assert_eq!(b.url, format!("http://127.0.0.1:{BROKER_PORT}/v1"));
        let line: serde_json::Value = serde_json::from_slice(b.config.expose()).unwrap();
        assert_eq!(line["config"]["host"], "127.0.0.1");
        assert_eq!(line["config"]["upstream"], "http://10.0.0.5:8080/v1");
        assert_eq!(
            line["config"]["keys"]["sk-ant-api03-cawbox-placeholder-x"],
            "real-key"
        );
        let command = sidecar_entrypoint().join(" ");
        assert!(!command.contains("real-key"));
        assert!(command.contains(&format!("{POD_END_DIR}/{POD_END_FILE}")));
        assert!(Broker::plan_in_pod(&record("open", None), &[], "caw-box-x").is_none());
    }

    /// The sidecar's command (run by the host's node here, as in the pod): it takes its
    /// keys on stdin, listens on loopback only, and exits 0 once the end marker appears.
    /// Runs `command` (a broker loader), hands it `line` and waits for its ready line; its
    /// stdin stays open while the returned handle lives.
    fn started_broker(
        command: &[String],
        line: &serde_json::Value,
    ) -> (std::process::Child, std::process::ChildStdin) {
        use std::io::{BufRead, Write};
        let mut child = std::process::Command::new(&command[0])
            .args(&command[1..])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("node");
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "{line}").unwrap();
        let mut ready = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut ready)
            .unwrap();
        assert_eq!(ready.trim(), "caw-box-broker ready");
        (child, stdin)
    }

    #[test]
    fn the_sidecar_listens_on_loopback_and_exits_on_the_end_marker() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("agent-ended");
        let command = sidecar_entrypoint_watching(&marker.to_string_lossy());
        let port = 20000 + (std::process::id() % 20000) as u16;
        let line = serde_json::json!({
            "script": SCRIPT,
            "config": {"port": port, "host": "127.0.0.1", "upstream": "http://127.0.0.1:9",
                       "keys": {"p": "real"}},
        });
        let (mut child, _stdin) = started_broker(&command, &line);
        let listening = std::fs::read_to_string("/proc/net/tcp").unwrap();
        let local = format!("0100007F:{port:04X}");
        assert!(
            listening.lines().any(|l| l.contains(&local)),
            "not on 127.0.0.1:{port}"
        );
        let any = format!("00000000:{port:04X}");
        assert!(!listening.lines().any(|l| l.contains(&any)), "on 0.0.0.0");
        // Still there without the marker; gone with it.
        std::thread::sleep(Duration::from_millis(700));
        assert!(
            child.try_wait().unwrap().is_none(),
            "exited without the marker"
        );
        std::fs::write(&marker, b"").unwrap();
        let code = (0..50).find_map(|_| {
            std::thread::sleep(Duration::from_millis(100));
            child.try_wait().unwrap().map(|s| s.code())
        });
        if code.is_none() {
            let _ = child.kill();
        }
        assert_eq!(code, Some(Some(0)), "did not exit on the end marker");
    }

    /// broker.js with `tls`: a client that trusts only the turn's CA reaches it as
    /// chatgpt.com; the login's placeholder becomes the real access token, the path stays.
    #[test]
    fn the_broker_stands_in_for_an_intercepted_host_with_the_turns_certificate() {
        use std::io::{Read, Write};
        let upstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let up_port = upstream.local_addr().unwrap().port();
        let seen = std::thread::spawn(move || {
            let (mut s, _) = upstream.accept().unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).unwrap();
                head.extend_from_slice(&buf[..n]);
            }
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
                .unwrap();
            String::from_utf8_lossy(&head).into_owned()
        });
        let tls = crate::auth::intercept::intercept_tls(&["chatgpt.com".to_string()]).unwrap();
        let free = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        };
        let (port, tls_port) = (free(), free());
        let line = serde_json::json!({
            "script": SCRIPT,
            "config": {"port": port, "tls_port": tls_port, "host": "127.0.0.1",
                       "upstream": format!("http://127.0.0.1:{up_port}"),
                       "places": ["authorization"], "keys": {}, "seal": hex(&[1u8; 32]),
                       "oauth": {"cawbox-placeholder-z": {
                           "access": "real-a", "refresh": "real-r",
                           "expires_ms": 4_102_444_800_000u64,
                           "token_url": "http://127.0.0.1:9/oauth/token",
                           "client_id": "c", "body": "form"}},
                       "tls": {"cert": tls.cert_pem,
                               "key": String::from_utf8_lossy(tls.key_pem.expose())}},
        });
        let command = ["node".to_string(), "-e".into(), LOADER.into()];
        let (mut child, _stdin) = started_broker(&command, &line);
        let mut connector =
            openssl::ssl::SslConnector::builder(openssl::ssl::SslMethod::tls()).unwrap();
        // The turn's CA only: not the system's.
        let mut store = openssl::x509::store::X509StoreBuilder::new().unwrap();
        store
            .add_cert(openssl::x509::X509::from_pem(tls.ca_pem.as_bytes()).unwrap())
            .unwrap();
        connector.set_verify_cert_store(store.build()).unwrap();
        let connector = connector.build();
        let tcp = std::net::TcpStream::connect(("127.0.0.1", tls_port)).unwrap();
        let mut s = connector
            .connect("chatgpt.com", tcp)
            .expect("TLS as chatgpt.com");
        s.write_all(
            b"POST /backend-api/codex/responses HTTP/1.1\r\nhost: chatgpt.com\r\n\
              authorization: Bearer cawbox-placeholder-z\r\ncontent-length: 2\r\n\
              connection: close\r\n\r\n{}",
        )
        .unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        let _ = child.kill();
        let _ = child.wait();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let head = seen.join().unwrap().to_lowercase();
        assert!(
            head.starts_with("post /backend-api/codex/responses http/1.1"),
            "{head}"
        );
        assert!(head.contains("authorization: bearer real-a"), "{head}");
        assert!(!head.contains("placeholder"), "{head}");
        // Another turn's CA does not vouch for this broker.
        let other = crate::auth::intercept::intercept_tls(&["chatgpt.com".to_string()]).unwrap();
        let leaf = openssl::x509::X509::from_pem(tls.cert_pem.as_bytes()).unwrap();
        let other_ca = openssl::x509::X509::from_pem(other.ca_pem.as_bytes()).unwrap();
        assert!(!leaf.verify(&other_ca.public_key().unwrap()).unwrap());
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
        assert!(SCRIPT.contains("module.exports = function broker(config, rest)"));
    }
}
