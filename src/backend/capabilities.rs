//! What a backend is and can do, answered in one value ([`Capabilities`],
//! [`Backend::capabilities`](super::Backend::capabilities)) that the backend works out once,
//! when it connects: the session layer reads its fields instead of asking one question at a
//! time, and never branches on which backend it has. What a backend does, or says of one
//! object (a container, a plan, a setting), stays a method of [`Backend`](super::Backend).

use super::{BrokerPlace, HostDirs, RuntimeDir, Scope};

/// What a backend can do, and how it is named, for as long as it is connected.
#[derive(Debug, Clone)]
pub struct Capabilities {
    /// Where its sessions live: the backend, and on Kubernetes the namespace and the
    /// kubeconfig context. A resume handle names it; a handle of another scope is refused.
    pub scope: Scope,
    /// How it is named in backend-neutral messages.
    pub words: Words,
    /// How its containers see this host's directories (a bind-mode workspace): `Shared`
    /// on a local Docker daemon, `Unknown` on one that may be remote (checked per
    /// directory), `Never` on a cluster (`--workspace-mode bind` refused).
    pub host_dirs: HostDirs,
    /// Where a turn's runtime directory is kept, and so when the driver reads what the
    /// entrypoint hands back there.
    pub runtime_dir: RuntimeDir,
    /// Where a turn's credential broker runs (a container shared by turns with the same
    /// keys, one of the turn's own, or beside the agent in the turn's own unit).
    pub broker_place: BrokerPlace,
    /// Whether it keeps a session's container warm between turns (`--keep-warm`,
    /// [`warm`](super::warm)); `false`: every turn starts cold.
    pub keeps_warm: bool,
    /// Whether a turn's own container hands the session's volumes
    /// ([`TurnSpec::hand_over`](super::TurnSpec::hand_over)) to a turn user of uid 0
    /// before its CLI starts: only root keeps the capabilities chown needs (Docker). For
    /// any other user, and where `false`, the session runs a helper to do it first
    /// ([`Self::hands_over_to`]).
    pub hands_over_to_root: bool,
    /// Whether a new state volume takes the image's HOME only when a container that mounts
    /// it first starts, and only if it is still empty then (Podman): the session runs one
    /// on it (exiting at once) before it puts anything in it. `false`: the backend fills
    /// it anyway (Docker, when a container that mounts it is created; Kubernetes, from the
    /// turn pod's init container).
    pub fill_volume_first: bool,
    /// Whether every turn's end is kept as a checkpoint (`session::checkpoint`), which
    /// `caw-box fork` starts from: Docker's engine and a cluster (a claim per checkpoint).
    /// Not yet Podman's (its turns keep none, and `fork` says so).
    pub checkpoints: bool,
    /// Whether a `--keep-warm` turn (its container made before the turn, so it cannot write
    /// its own checkpoint) gets one from a helper started after it and not waited for
    /// (`checkpoint::take_behind`): Docker's. Not a
    /// cluster's: a helper pod costs seconds, which a warm turn is there to save; the next
    /// cold turn's checkpoint then holds what the warm turns changed.
    pub warm_checkpoints: bool,
    /// Whether a cold headless turn may end before its container does: once the
    /// entrypoint says the record is in and nothing of the agent runs
    /// (`CAW_BOX_HANDOFF_ACK`), the container is renamed to the session's
    /// checkpoint-behind name and finishes its checkpoint and exit behind the turn, waited
    /// for by the session's next command ([`checkpoint::settle`]) and removed by a
    /// `caw-box __settle` started in the background: Docker's. Not Podman's (no stdin kept
    /// across attaches) nor a cluster's (a pod's end is not on the turn's path there).
    ///
    /// [`checkpoint::settle`]: crate::session::checkpoint::settle
    pub finishes_behind: bool,
    /// Whether a fork of a session's latest turn copies the session's own volumes (a `cp`
    /// the kernel does in place, where a checkpoint's layers are unpacked), checked after
    /// the copy for a turn that began meanwhile: Docker's. Not a cluster's: a pod holding the
    /// source's claims would hold a turn pod back.
    pub forks_from_volumes: bool,
    /// Whether `caw-box pool` keeps boxes ready here (`session::lifecycle::pool`): Docker's
    /// engine, and a cluster (warm pods with their claims bound). Not Podman's service.
    pub pools: bool,
    /// Whether a turn's egress proxy is one kept for the turns of every session with the
    /// same egress ([`EgressPlan::shared`](super::EgressPlan::shared)), so a turn pays no
    /// proxy start: Docker's (a container on a network kept for it). Not a cluster's: the
    /// proxy is a sidecar of the turn's pod.
    pub shared_proxy: bool,
    /// Whether a turn's egress proxy is in the turn's own unit (a sidecar of its pod), so
    /// that a warm unit keeps it and it records even an `open` turn at no cost: a cluster's.
    /// `false`, where not shared: a container and network of the turn's own (Podman's),
    /// which go with the turn; under `open` there is none.
    pub proxy_in_turn: bool,
}

impl Capabilities {
    /// Whether a turn's own container hands the session's volumes to the turn user `user`
    /// (uid, gid) before its CLI starts ([`Self::hands_over_to_root`]); `false`: the
    /// session runs a helper to do it first.
    pub fn hands_over_to(&self, user: (u32, u32)) -> bool {
        self.hands_over_to_root && user.0 == 0
    }
}

/// A backend's words for backend-neutral messages of the session layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Words {
    /// Where this process's sessions live ("this Docker host").
    pub here: String,
    /// Where else a session may live ("another Docker host").
    pub elsewhere: String,
    /// What runs the containers and mounts their directories ("the Docker daemon").
    pub engine: String,
}
