//! Planning a turn's broker before anything is created: its own, a shared one, or one in the
//! turn's own unit, as the backend places it; how the agent reaches it (the backend's
//! route); and the config line (with the real keys and logins) it gets on its stdin.

use super::refresh::expires_ms;
use std::collections::HashMap;

use super::{
    default_upstream, hex, url_path, Broker, Intercept, Shared, BROKER_PORT, INTERCEPT_PORT,
    LOADER, SCRIPT, SHARED_LABEL,
};
use crate::auth::inject::BrokeredLogin;
use crate::backend::{BrokerPlace, BrokerPlan, BrokerRoute, EgressRoute, NetworkPolicy};
use crate::dirs;
use crate::error::Result;
use crate::provider::ProviderKind;
use crate::session::store::names::{self, LabelSet};
use crate::session::store::record::{labels, roles, SessionRecord};

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
    let fresh = super::random_bytes::<32>().to_vec();
    dirs::write_private(&path, &fresh)?;
    Ok(fresh)
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

/// The vendor's token endpoint, unless `CAW_BOX_OAUTH_TOKEN_URL` names another (a stub in
/// tests, a gateway): said on stderr each time, since the login's refresh token goes there.
fn token_url(spec: &crate::auth::spec::OAuthSpec) -> String {
    match std::env::var("CAW_BOX_OAUTH_TOKEN_URL")
        .ok()
        .filter(|u| !u.is_empty())
    {
        Some(url) => {
            crate::output::eprintln(&token_url_warning(&url, &spec.token_url));
            url
        }
        None => spec.token_url.clone(),
    }
}

fn token_url_warning(url: &str, vendors: &str) -> String {
    format!(
        "warning: CAW_BOX_OAUTH_TOKEN_URL: the login's refresh token goes to {}, not to {vendors}",
        crate::endpoint::redact_userinfo(url)
    )
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

/// Where a turn's broker goes, as its backend says: its place, how the backend routes a
/// planned one, and the turn (and its egress) it serves.
pub(in crate::session) struct Site<'a> {
    pub place: BrokerPlace,
    pub route: &'a (dyn Fn(&BrokerPlan) -> BrokerRoute + Sync),
    pub turn: &'a str,
    pub egress: Option<&'a EgressRoute>,
}

/// The labels of a turn's broker and what is made for it; a shared one's (`hash`) are of
/// no session: `rm` of one leaves it to the others.
fn broker_labels(session: uuid::Uuid, hash: Option<&str>) -> HashMap<String, String> {
    match hash {
        None => LabelSet::new(session, roles::BROKER).finish(),
        Some(hash) => names::with_extra_labels(HashMap::from([
            (labels::MANAGED.to_string(), "true".to_string()),
            (labels::ROLE.to_string(), roles::BROKER.to_string()),
            (SHARED_LABEL.to_string(), hash.to_string()),
        ])),
    }
}

/// What the backend is asked to run for `record`'s turn: the broker's program in the
/// session's image as the agent's user, named `name` (and `beside` for what is made for
/// it).
fn backend_plan(
    record: &SessionRecord,
    site: &Site<'_>,
    (name, beside): (String, String),
    hash: Option<&str>,
) -> BrokerPlan {
    BrokerPlan {
        name,
        turn: site.turn.to_string(),
        program: LOADER.to_string(),
        image: record.settings.image.clone(),
        user: dirs::agent_ids(),
        labels: broker_labels(record.session_id, hash),
        network: NetworkPolicy::from_setting(&record.settings.network),
        egress: site.egress.cloned(),
        shared: hash.is_some(),
        beside,
    }
}

impl Broker {
    /// The broker for `record`'s turn with `keys` (placeholder, real key) and OAuth
    /// `logins`, where `site` says, or `None` when the turn cannot be brokered
    /// (`--network none|host`: nothing to put it on). A backend that keeps a broker for
    /// several turns ([`BrokerPlace::SharedContainer`]) gets a shared one where it can;
    /// else each turn has its own.
    pub(in crate::session) fn plan(
        record: &SessionRecord,
        site: &Site<'_>,
        keys: &[(String, crate::auth::Secret)],
        logins: &[BrokeredLogin],
    ) -> Option<Broker> {
        let salt = (site.place == BrokerPlace::SharedContainer).then_some(salt as fn() -> _);
        Self::plan_salted(record, site, keys, logins, salt)
    }

    /// [`Broker::plan`], with the salt of shared brokers' names from `salt` (`None`: none
    /// is shared).
    fn plan_salted(
        record: &SessionRecord,
        site: &Site<'_>,
        keys: &[(String, crate::auth::Secret)],
        logins: &[BrokeredLogin],
        salt: Option<fn() -> Result<Vec<u8>>>,
    ) -> Option<Broker> {
        if keys.is_empty() && logins.is_empty() {
            return None;
        }
        let in_turn = site.place == BrokerPlace::InTurn;
        let oauth_spec = crate::auth::spec::Spec::of(record.provider).oauth;
        if in_turn && !logins.is_empty() && oauth_spec.is_none() {
            return None;
        }
        let outer = NetworkPolicy::from_setting(&record.settings.network);
        if !in_turn && matches!(outer, NetworkPolicy::None | NetworkPolicy::Host) {
            return None;
        }
        // A login the broker intercepts for has the turn's own broker: its CA is the turn's.
        let hosts = match oauth_spec {
            Some(o) if !logins.is_empty() => o.intercept,
            _ => Vec::new(),
        };
        // A broker joined to a turn's own egress network is the turn's; to a shared one,
        // it is shared with the turns there.
        let egress_shared = site.egress.is_none_or(|e| e.shared);
        if let (true, Some(salt), true) = (egress_shared, salt, hosts.is_empty()) {
            return Self::plan_shared(record, site, keys, logins, salt);
        }
        let tls = if hosts.is_empty() {
            None
        } else {
            Some(crate::auth::intercept::intercept_tls(&hosts)?)
        };
        // In the turn's own unit it is the turn's; else a container of this driver's.
        let names = match in_turn {
            true => (site.turn.to_string(), site.turn.to_string()),
            false => names::broker_names(record.session_id, std::process::id()),
        };
        let plan = backend_plan(record, site, names, None);
        let route = (site.route)(&plan);
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
        // Beside the agent, whoever finishes the turn opens what it seals.
        let seal: [u8; 32] = match (in_turn, logins.is_empty()) {
            (false, _) => super::random_bytes(),
            (true, true) => [0; 32],
            (true, false) => turn_seal(site.turn)?,
        };
        let oauth = login_slots(record.provider, logins, |l| l.placeholder.clone());
        let places = with_login_places(places, record.provider, logins);
        let mut line = serde_json::json!({
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
        if let Some(listen) = &route.listen {
            line["config"]["host"] = listen.clone().into();
        }
        if in_turn {
            // It shares the agent's host names, which point the hosts it stands in for at it.
            line["config"]["direct_dns"] = hosts.clone().into();
        }
        let mut bytes = serde_json::to_vec(&line).ok()?;
        bytes.push(b'\n');
        Some(Broker {
            intercept: tls.map(|t| Intercept {
                hosts,
                ca_pem: t.ca_pem,
            }),
            seal,
            logins: !logins.is_empty(),
            url: format!("http://{}:{BROKER_PORT}{path}", route.host),
            container: route.shown.clone(),
            plan,
            route,
            provider: record.provider,
            session: record.session_id,
            config: crate::auth::Secret::new(bytes),
            shared: None,
            in_turn,
            watching: std::sync::Mutex::new(None),
        })
    }

    /// What names a shared broker and seals its reports: the turn's provider, upstream,
    /// network, labels and image, and its secrets, under this host's salt.
    fn shared_digest(
        record: &SessionRecord,
        site: &Site<'_>,
        upstream: &str,
        reals: &[&[u8]],
        logins: &[BrokeredLogin],
        salt: &[u8],
    ) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(salt);
        let egress = site
            .egress
            .and_then(|e| e.agent_network.as_deref())
            .unwrap_or("");
        for part in [
            record.provider.as_str(),
            upstream,
            &record.settings.network,
            &names::render_labels(&names::extra_labels()),
            &record.settings.image,
            egress,
        ] {
            h.update(part.as_bytes());
            h.update([0]);
        }
        for r in reals {
            h.update(r);
            h.update([0]);
        }
        for l in logins {
            h.update(b"login");
            h.update(l.real.expose());
            h.update([0]);
        }
        h.finalize().into()
    }

    /// A shared broker for `record`'s turn: one per network, upstream and key set, found or
    /// started by [`Broker::start`]. `None` when the salt cannot be had (the turn then has
    /// none: injected).
    fn plan_shared(
        record: &SessionRecord,
        site: &Site<'_>,
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
        let digest = Self::shared_digest(record, site, &upstream, &reals, logins, &salt);
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
        let names = (
            format!("caw-box-broker-{hash}"),
            format!("caw-box-brokernet-{hash}"),
        );
        let plan = backend_plan(record, site, names, Some(&hash));
        let route = (site.route)(&plan);
        Some(Broker {
            seal,
            logins: !logins.is_empty(),
            url: format!("http://{}:{BROKER_PORT}{path}", route.host),
            container: route.shown.clone(),
            plan,
            route,
            provider: record.provider,
            session: record.session_id,
            config: crate::auth::Secret::new(bytes),
            shared: Some(Shared {
                lease_id: uuid::Uuid::new_v4().simple().to_string(),
                pairs,
                held: std::sync::Mutex::new(None),
            }),
            in_turn: false,
            intercept: None,
            watching: std::sync::Mutex::new(None),
        })
    }
}

/// The seal key of the broker in turn `turn`'s own unit: of the data directory's private
/// salt and the turn's name, so every caw-box of this data directory (the turn's driver,
/// or a `wait` that finishes the turn without it) opens what that broker seals, and no
/// other.
pub(in crate::session) fn turn_seal(turn: &str) -> Option<[u8; 32]> {
    use sha2::{Digest, Sha256};
    let salt = salt().inspect_err(|e| tracing::warn!("{e}")).ok()?;
    Some(
        Sha256::new()
            .chain_update(b"caw-box-turn-seal")
            .chain_update(&salt)
            .chain_update([0])
            .chain_update(turn.as_bytes())
            .finalize()
            .into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Secret;
    use crate::session::store::record::{SessionSettings, WorkspaceMode};
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
            cli_version: None,
        }
    }

    fn test_salt() -> Result<Vec<u8>> {
        Ok(vec![7; 32])
    }

    /// Where a backend of `place` puts a turn's broker (Docker's routes, or Kubernetes' for
    /// one in the turn's unit), under `--allow-host` on the network `egress`.
    fn with_site<T>(place: BrokerPlace, egress: Option<&str>, f: impl FnOnce(&Site<'_>) -> T) -> T {
        let route: &(dyn Fn(&BrokerPlan) -> BrokerRoute + Sync) = match place {
            BrokerPlace::InTurn => &crate::backend::kubernetes::broker_route,
            _ => &crate::backend::docker::broker_route,
        };
        let egress = egress.map(|n| EgressRoute {
            proxy_url: "http://caw-box-proxy:3128".into(),
            direct: vec![],
            agent_network: Some(n.to_string()),
            proxy_log: "proxy".into(),
            shared: false,
        });
        f(&Site {
            place,
            route,
            turn: "caw-box-x",
            egress: egress.as_ref(),
        })
    }

    fn plan_logins(
        r: &SessionRecord,
        egress: Option<&str>,
        keys: &[(String, Secret)],
        logins: &[BrokeredLogin],
        salt: Option<fn() -> Result<Vec<u8>>>,
    ) -> Option<Broker> {
        let place = match salt {
            Some(_) => BrokerPlace::SharedContainer,
            None => BrokerPlace::OwnContainer,
        };
        with_site(place, egress, |site| {
            Broker::plan_salted(r, site, keys, logins, salt)
        })
    }

    fn plan(r: &SessionRecord, egress: Option<&str>, keys: &[(String, Secret)]) -> Option<Broker> {
        plan_logins(r, egress, keys, &[], Some(test_salt))
    }

    fn keys() -> Vec<(String, Secret)> {
        vec![(
            "sk-ant-api03-cawbox-placeholder-x".into(),
            Secret::new("real-key"),
        )]
    }

    /// The backend is asked for a broker on the session's network (and the turn's egress),
    /// and says how the agent reaches it (Docker's answers here: `backend::docker`'s tests
    /// hold where its container goes).
    #[test]
    fn the_broker_sits_where_the_agent_can_name_it() {
        // --network open: a network made for it, which the agent joins.
        let b = plan(&record("open", None), None, &keys()).unwrap();
        assert_eq!(b.plan.network, NetworkPolicy::Default);
        let own = b.route.agent_network.clone().unwrap();
        assert_eq!(own, b.plan.beside);
        assert_eq!(b.agent_network(), Some(NetworkPolicy::Named(own)));
        assert_eq!(b.url, format!("http://{}:{BROKER_PORT}", b.container));
        assert_eq!(
            (b.host(), b.plan.program.as_str()),
            (b.container.as_str(), LOADER)
        );
        // --network NAME: on it, under its own name (not a shared alias).
        let b = plan(&record("gw-net", None), None, &keys()).unwrap();
        assert_eq!(b.plan.network, NetworkPolicy::Named("gw-net".into()));
        assert_eq!((b.plan.egress.as_ref(), b.agent_network()), (None, None));
        // --allow-host: the turn's own, beside the agent's egress.
        let b = plan(&record("open", None), Some("egress-net"), &keys()).unwrap();
        assert!(b.shared.is_none());
        assert_eq!(b.plan.network, NetworkPolicy::Default);
        let egress = b
            .plan
            .egress
            .as_ref()
            .and_then(|e| e.agent_network.as_deref());
        assert_eq!(egress, Some("egress-net"));
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
            plan_logins(&record("n", None), None, &keys(), &[], Some(salt))
                .unwrap()
                .container
        };
        assert_ne!(salted(test_salt), salted(|| Ok(vec![8; 32])));
        // A backend that cannot share one (Podman): the turn's own, on its own network.
        let own = plan_logins(&record("open", None), None, &keys(), &[], None).unwrap();
        assert!(own.shared.is_none());
        assert!(
            own.container.contains(&own.session.to_string()),
            "{}",
            own.container
        );
        assert!(own.route.agent_network.is_some());
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
        let b = plan_logins(&record("n", None), None, &[], &[login()], Some(test_salt)).unwrap();
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
        let b2 = plan_logins(&record("n", None), None, &[], &[other], Some(test_salt)).unwrap();
        assert_ne!(b.container, b2.container);
        assert_ne!(b.seal, b2.seal);
    }

    /// The override's line names where the refresh token goes, never a password in it.
    #[test]
    fn the_token_url_override_is_said_without_a_password() {
        assert_eq!(
            token_url_warning("http://u:pw@gw:8080/oauth/token", "https://vendor/token"),
            "warning: CAW_BOX_OAUTH_TOKEN_URL: the login's refresh token goes to \
             http://***@gw:8080/oauth/token, not to https://vendor/token"
        );
    }

    /// A turn's own broker (here: on an `--allow-host` network) seals with a key from the
    /// OS's CSPRNG: never UUIDs' bytes, whose version and variant bits are fixed.
    #[test]
    fn an_own_brokers_seal_key_is_random_bytes_not_uuids() {
        let keys: Vec<[u8; 32]> = (0..16)
            .map(|_| {
                let b = plan_logins(
                    &record("n", None),
                    Some("egress"),
                    &[],
                    &[login()],
                    Some(test_salt),
                )
                .unwrap();
                assert!(b.shared.is_none());
                b.seal
            })
            .collect();
        let shaped = |k: &[u8; 32]| {
            super::super::uuid_shaped(&k[..16]) && super::super::uuid_shaped(&k[16..])
        };
        assert!(!keys.iter().all(shaped), "{keys:?}");
        assert!(keys.iter().skip(1).all(|k| *k != keys[0]));
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
        let b = plan_logins(&r, None, &[], &[l], Some(test_salt)).unwrap();
        assert!(b.shared.is_none());
        assert!(b.route.agent_network.is_some());
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
        let labels = format!("{:?}", b.plan);
        assert!(!labels.contains("PRIVATE") && !labels.contains("real-"));
        // API keys alone: no interception, shared as before.
        let keyed = plan(&r, None, &keys()).unwrap();
        assert!(keyed.intercept().is_none() && keyed.shared.is_some());
    }

    /// Where the backend runs the broker beside the agent in the turn's own unit, it listens
    /// only where the backend's route says, the agent reaches it there, and its keys go
    /// only to its stdin: the program the unit runs holds none.
    #[test]
    fn a_broker_in_the_turns_unit_listens_where_its_route_says_and_its_keys_go_only_to_stdin() {
        let b = with_site(BrokerPlace::InTurn, None, |site| {
            let r = record("open", Some("http://10.0.0.5:8080/v1"));
            Broker::plan(&r, site, &keys(), &[])
        })
        .unwrap();
        assert!(b.in_turn() && b.shared.is_none());
        assert_eq!(
            (b.plan.name.as_str(), b.plan.turn.as_str()),
            ("caw-box-x", "caw-box-x")
        );
        assert_eq!(b.url, format!("http://{}:{BROKER_PORT}/v1", b.route.host));
        let line: serde_json::Value = serde_json::from_slice(b.config.expose()).unwrap();
        let listen = b.route.listen.clone().unwrap();
        assert_eq!(listen, b.route.host);
        assert_eq!(line["config"]["host"], listen);
        assert_eq!(line["config"]["direct_dns"], serde_json::json!([]));
        assert_eq!(line["config"]["upstream"], "http://10.0.0.5:8080/v1");
        assert_eq!(
            line["config"]["keys"]["sk-ant-api03-cawbox-placeholder-x"],
            "real-key"
        );
        assert!(!b.plan.program.contains("real-key"));
        // Its own container's on Docker: no `host`, so every address of its container.
        let own = plan(&record("n", None), Some("egress"), &keys()).unwrap();
        let line: serde_json::Value = serde_json::from_slice(own.config.expose()).unwrap();
        assert_eq!(line["config"].get("host"), None);
        assert_eq!(line["config"].get("direct_dns"), None);
        let none = with_site(BrokerPlace::InTurn, None, |site| {
            Broker::plan(&record("open", None), site, &[], &[])
        });
        assert!(none.is_none());
    }
}
