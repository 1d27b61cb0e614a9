//! What the session layer asks for a turn beside its [`TurnSpec`](super::TurnSpec), once
//! for every backend (a broker for its keys and logins, egress held to its hosts), and what
//! a backend says of how it realises a turn (where its broker runs and how the agent
//! reaches it, where its runtime directory is kept, how it sees this host's directories,
//! how the agent reaches the proxy), in caw-box's terms: never where (networks, pods).

use std::collections::HashMap;

use super::NetworkPolicy;
use crate::error::Error;
use crate::event::EgressPolicy;

/// What node runs (`node -e`) to load a program shipped on its stdin (the credential
/// broker's, a shared egress proxy's), so it always matches the caw-box that started it:
/// one JSON line `{"script", "config"}`, then the rest of stdin is the program's.
pub const LOADER: &str = "const c=[];const on=(d)=>{c.push(d);const b=Buffer.concat(c);const i=b.indexOf(10);if(i<0)return;process.stdin.off('data',on);process.stdin.pause();const j=JSON.parse(b.subarray(0,i).toString());c.length=0;const m={exports:{}};new Function('module','require',j.script)(m,require);m.exports(j.config,b.subarray(i+1));};process.stdin.on('data',on);";

/// The egress proxy's port, wherever it runs.
pub const PROXY_PORT: u16 = 3128;
/// The variables that route a turn's web traffic through its egress proxy: the proxy's
/// address (the first four), then the hosts reached directly.
pub const PROXY_VARS: [&str; 6] = [
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "https_proxy",
    "http_proxy",
    "NO_PROXY",
    "no_proxy",
];
/// The egress proxy's program in caw-box's images (images/base/caw-box-proxy.js).
pub const PROXY_SCRIPT: &str = "/usr/local/lib/caw-box/proxy.js";

/// The proxy's environment where it runs from the image's file (a turn's or a login's own
/// proxy, a pod's sidecar): its policy, the hosts it admits, and its port.
pub fn proxy_env(policy: EgressPolicy, allow: &[String]) -> Vec<(&'static str, String)> {
    vec![
        ("CAW_BOX_EGRESS_POLICY", policy.as_str().to_string()),
        ("CAW_BOX_ALLOW", allow.join(",")),
        ("CAW_BOX_PROXY_PORT", PROXY_PORT.to_string()),
    ]
}

/// Where a turn's runtime directory ([`TurnSpec::runtime`](super::TurnSpec::runtime)) is
/// kept ([`Capabilities::runtime_dir`](super::Capabilities::runtime_dir)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeDir {
    /// With the turn's container, readable once the container ended (Docker): what the
    /// entrypoint hands back there (refreshed credentials, the resume key) is read after.
    KeptWithContainer,
    /// Gone with the turn's unit when it ends (Kubernetes: the pod's memory): what the
    /// session needs of it is read from the state volume, before the record is handed in.
    GoesWithTurn,
}

/// How a backend's containers see the directories of the host that runs caw-box
/// ([`Capabilities::host_dirs`](super::Capabilities::host_dirs)).
#[derive(Debug, Clone)]
pub enum HostDirs {
    /// As they are: a mount of one shows that directory, and this host's tools may read it
    /// in the container's stead (a local Docker daemon, caw-box not in a job's container).
    Shared,
    /// Maybe, maybe not (a daemon behind a socket mounted into a CI job's container, a
    /// remote `DOCKER_HOST`): a directory is checked before it is bound
    /// (`session::workspace::daemon_sees`).
    Unknown,
    /// Never (a cluster): `--workspace-mode bind` is refused with this error, `auto` copies.
    Never(Error),
}

/// Where a backend runs a turn's credential broker (`session::broker`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerPlace {
    /// A container on a network the agent shares, reached by its name, that the session's
    /// turns with the same keys share (Docker): each turn leases it through an attachment
    /// of its own, as the container's stdin stays open across several attachments, one
    /// after the other and at once. It idles out when no turn holds a lease.
    SharedContainer,
    /// A container of the turn's own on a network the agent shares, reached by its name
    /// (Podman: 4.3 ends a container when an attachment to its stdin ends); it ends with
    /// the turn's driver, as this backend's turns do.
    OwnContainer,
    /// Beside the agent in the turn's own unit (Kubernetes: a second container of the
    /// turn's pod, [`TurnSpec::broker`](super::TurnSpec::broker)), reached where
    /// [`Backend::broker_route`](super::Backend::broker_route) says: it lives as long as
    /// the turn, which outlives its driver, and ends with the agent. It shares the agent's
    /// host names: the hosts it stands in for are resolved by it directly.
    InTurn,
}

/// A turn's credential broker as the session layer asks for it (`session::broker`: its
/// program, keys, placeholders and protocol are the same on every backend): what it runs
/// and for whom, not where. The backend says how the agent reaches it
/// ([`Backend::broker_route`](super::Backend::broker_route)) and runs it where
/// [`Capabilities::broker_place`](super::Capabilities::broker_place) says
/// ([`Backend::open_broker`](super::Backend::open_broker),
/// [`Backend::start_broker`](super::Backend::start_broker)).
#[derive(Debug, Clone, PartialEq)]
pub struct BrokerPlan {
    /// The broker's own name where it is a unit of its own (the session's naming: of the
    /// turn's driver, or of what a shared one holds); in the turn's own unit, the turn's.
    pub name: String,
    /// The turn it serves (its name, the session's lock).
    pub turn: String,
    /// Its program, run by node in `image` as `user`: it reads its config (the keys) from
    /// its first line of stdin, which stays open for its protocol.
    pub program: String,
    pub image: String,
    pub user: (u32, u32),
    /// The labels of what is made for it.
    pub labels: HashMap<String, String>,
    /// The session's `--network`, where the agent is.
    pub network: NetworkPolicy,
    /// How the backend realised the turn's `--allow-host`, if it has one: the broker stays
    /// reachable to the agent held to it, and reaches its upstream itself.
    pub egress: Option<EgressRoute>,
    /// Kept for the next turns that have the same keys ([`BrokerPlace::SharedContainer`]):
    /// what is made for it stays with it, and it goes when it idled out.
    pub shared: bool,
    /// A name for what the backend makes beside it where it makes anything (the session's
    /// naming, so its sweep of leftovers knows it).
    pub beside: String,
}

/// How the agent reaches a turn's broker, as the backend realises its [`BrokerPlan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerRoute {
    /// The host in the broker's URL as the agent sees it.
    pub host: String,
    /// The one address the broker listens on; `None`: every address of its own unit.
    pub listen: Option<String>,
    /// Its address, where known before it runs (for the hosts it stands in for); `None`:
    /// asked once it runs ([`Backend::broker_address`](super::Backend::broker_address)).
    pub address: Option<String>,
    /// The network the agent joins to reach it (one made for it).
    pub agent_network: Option<String>,
    /// What names it in messages and logs.
    pub shown: String,
}

/// A turn's way out under `--allow-host`, as the session layer asks for it
/// (`session::egress`): the hosts it may reach, all else refused. The backend decides how
/// ([`Backend::egress_route`](super::Backend::egress_route),
/// [`Backend::open_egress`](super::Backend::open_egress)): Docker as a proxy container and
/// a network of the turn's own, Kubernetes in the turn's pod (from
/// [`TurnSpec::egress_allow`](super::TurnSpec::egress_allow)).
#[derive(Debug, Clone, PartialEq)]
pub struct EgressPlan {
    /// The turn (its name, the session's lock).
    pub turn: String,
    /// The policy: what a refusal says, and `open` admits every host.
    pub policy: EgressPolicy,
    /// The hosts admitted (under `open`, none need be named).
    pub allow: Vec<String>,
    /// The image whose proxy program ([`PROXY_SCRIPT`]) admits them, run as `user`.
    pub image: String,
    pub user: (u32, u32),
    /// The session's `--network`: the way out to the allowed hosts.
    pub network: NetworkPolicy,
    /// The labels of what is made for it.
    pub labels: HashMap<String, String>,
    /// Names for what the backend makes for it, this driver's own (a second caw-box that
    /// starts on a busy session makes its own, and fails on the lock): the session's
    /// naming, so its sweep of leftovers keeps them. A shared proxy's: of its settings.
    pub names: [String; 2],
    /// A proxy kept for the turns of every session with the same egress (the backend's
    /// [`Capabilities::shared_proxy`](super::Capabilities::shared_proxy)): run as
    /// `program` (its config and leases on stdin, [`Backend::start_proxy`](super::Backend::start_proxy)),
    /// it goes when it idled out. `false`: the turn's own, from the image's file.
    pub shared: bool,
    /// The program a shared proxy runs with `node -e`.
    pub program: String,
}

/// How a backend realised a turn's egress, in caw-box's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressRoute {
    /// The proxy's URL as the agent sees it (`HTTPS_PROXY`).
    pub proxy_url: String,
    /// The hosts the agent reaches without the proxy (its own unit's), for `NO_PROXY`.
    pub direct: Vec<String>,
    /// The network the agent (and a broker of its own) goes on; `None`: the turn's own unit
    /// holds its egress.
    pub agent_network: Option<String>,
    /// What to read the proxy's decisions from ([`Backend::follow_logs`](super::Backend::follow_logs)).
    pub proxy_log: String,
    /// The proxy serves the turns of other sessions too: its decisions are this turn's
    /// where they come from the agent's address.
    pub shared: bool,
}
