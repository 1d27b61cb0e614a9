//! What the session layer plans for a turn beside its [`TurnSpec`](super::TurnSpec), once
//! for every backend (the broker, the egress proxy), and what a backend says of how it
//! realises a turn (where its broker runs, where its runtime directory is kept, how it sees
//! this host's directories, how the agent reaches the proxy), in caw-box's terms.

use super::HelperSpec;
use crate::error::Error;

/// The proxy sidecar's container in a turn pod that holds its own egress
/// ([`Backend::egress_route`](super::Backend::egress_route)); `<pod>/proxy` names its log.
pub const PROXY_SIDECAR: &str = "proxy";

/// The egress proxy's port, wherever it runs.
pub const PROXY_PORT: u16 = 3128;
/// The egress proxy's program in caw-box's images (images/base/caw-box-proxy.js).
pub const PROXY_SCRIPT: &str = "/usr/local/lib/caw-box/proxy.js";

/// The proxy's environment wherever it runs (a container of its own, a pod's sidecar):
/// the hosts it admits, and its port.
pub fn proxy_env(allow: &[String]) -> Vec<(&'static str, String)> {
    vec![
        ("CAW_BOX_ALLOW", allow.join(",")),
        ("CAW_BOX_PROXY_PORT", PROXY_PORT.to_string()),
    ]
}

/// The broker's container where it runs beside the agent in the turn's unit
/// ([`BrokerPlace::InTurn`]: a pod's second container).
pub const BROKER_SIDECAR: &str = "broker";
/// A directory the agent's and the broker's containers of a turn's unit share (memory): the
/// agent's container leaves [`TURN_END_FILE`] there when it ends, and the broker exits.
pub const TURN_END_DIR: &str = "/caw-box-pod";
pub const TURN_END_FILE: &str = "agent-ended";

/// Where a turn's runtime directory ([`TurnSpec::runtime`](super::TurnSpec::runtime)) is
/// kept ([`Backend::runtime_dir`](super::Backend::runtime_dir)).
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
/// ([`Backend::host_dirs`](super::Backend::host_dirs)).
#[derive(Debug)]
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
    /// turn's pod, [`TurnSpec::broker`](super::TurnSpec::broker)), reached on loopback: it
    /// lives as long as the turn, which outlives its driver. Keys only: a login is injected.
    InTurn,
}

/// A turn's credential broker, planned once by the session layer (`session::broker`: its
/// program, keys, placeholders and protocol are the same on every backend) and run by the
/// backend ([`Backend::open_broker`](super::Backend::open_broker),
/// [`Backend::start_broker`](super::Backend::start_broker)) where it says
/// ([`Backend::broker_place`](super::Backend::broker_place)).
#[derive(Debug, Clone, PartialEq)]
pub struct BrokerPlan {
    /// The broker's container, also its host name on the agent's network; in the turn's own
    /// unit ([`BrokerPlace::InTurn`]), the turn's.
    pub name: String,
    /// Its container where it runs as one of its own: the broker's loader, stdin open for
    /// its config, on the session's network or [`Self::network`] (and joined to a turn's
    /// egress network). In the turn's own unit it runs
    /// [`TurnSpec::broker`](super::TurnSpec::broker) instead.
    pub spec: HelperSpec,
    /// A network made for it that the agent joins too (`--network open`: the engine's
    /// default network resolves no names).
    pub network: Option<String>,
    /// Kept for the next turns that have the same keys ([`BrokerPlace::SharedContainer`]):
    /// its network is found or made once, and stays with it.
    pub shared: bool,
}

/// A turn's way out under `--allow-host`, planned once by the session layer
/// (`session::egress`) and realised by the backend ([`Backend::open_egress`](super::Backend::open_egress)).
#[derive(Debug, Clone, PartialEq)]
pub struct EgressPlan {
    /// The turn's container (a proxy held in the turn's own unit is named after it).
    pub turn: String,
    /// The proxy, where it runs as a container of its own: its spec (on the session's
    /// outer network), its name, and its alias and port as the agent reaches it.
    pub proxy: HelperSpec,
    pub proxy_name: String,
    pub alias: String,
    pub port: u16,
    /// The private network made for the agent, where the backend makes one.
    pub network: String,
}

/// How a backend realised a turn's egress, in caw-box's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressRoute {
    /// The proxy's URL as the agent sees it (`HTTPS_PROXY`).
    pub proxy_url: String,
    /// The network the agent (and a broker of its own) goes on; `None`: the turn's own unit
    /// holds its egress.
    pub agent_network: Option<String>,
    /// What to read the proxy's decisions from ([`Backend::follow_logs`](super::Backend::follow_logs)).
    pub proxy_log: String,
}
