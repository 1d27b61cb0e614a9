//! Backends run what the session layer describes: Docker (through bollard) in `docker/`,
//! Kubernetes (through kube) in `kubernetes/`; nothing outside those folders names their
//! client crates' types. The session layer
//! (`crate::session`) takes any [`Backend`] and never names Docker; [`crate::Client`] is
//! where the backend is chosen. It speaks to a backend in caw-box's own terms: a [`TurnSpec`] for a turn, a [`HelperSpec`]
//! for caw-box's short-lived helpers, [`VolumeInfo`] / [`ContainerInfo`] for what exists,
//! [`OutputChunk`]s for what a container prints.
//!
//! # The backend contract
//!
//! What the session layer relies on, and so what a second backend (Kubernetes) must keep:
//!
//! - **The lock is atomic.** Creating a turn under the session's turn name
//!   ([`crate::session::names::turn_container`]) either succeeds or reports
//!   `NameTaken`; two racing creators never both succeed. The turn holds the lock from
//!   its creation until its driver removes it, after the turn is recorded.
//! - **Labels are the index.** Everything created carries the labels of
//!   [`crate::session::names`] (plus `CAW_BOX_LABELS` extras), and listing by label filter
//!   (`key=value`, all must match) is how sessions, turns and leftovers are found: there is
//!   no other database. Labels never change after creation (a turn replaces its turn-record
//!   volume instead).
//! - **"Gone" means not found.** Inspecting or removing something that does not exist is
//!   `Ok(None)` / `Ok(())`, not an error; a container being removed from outside reports
//!   [`ContainerState::Removing`] or [`ContainerState::Dead`] until it is gone.
//! - **What survives a daemon restart:** volumes (a session's state, copy-mode workspace,
//!   turn records) and their labels, so every session stays resumable. Running turns do
//!   not survive (their driver records them as failed or they are cleared by the next turn
//!   as leftovers); images survive.
//! - **Files move through the turn's container**, created or stopped: files written under
//!   HOME land in the state volume; a file that does not exist reads as `None`.
//! - **Errors say what was done to what** and carry the backend's own error as their
//!   source; an unreachable backend is an environment error (exit 3) with what to do.
//! - **A missing image is typed** (`CreateError::ImageMissing`), never recognised from text
//!   outside the backend.
//! - **Plans are realised, not refused.** What the session layer asks for beside a turn
//!   (its broker, [`BrokerPlan`]; its egress, [`EgressPlan`]: what the turn needs, never
//!   where) every backend routes ([`Backend::broker_route`], [`Backend::egress_route`]) and
//!   realises its own way (`plan.rs`); a backend that cannot honour a setting refuses it
//!   before anything is made ([`Backend::refuse_settings`], [`HostDirs::Never`]).
//! - **What a backend can do is one value** ([`Capabilities`], worked out when it connects):
//!   the session layer reads it, never which backend it has.

pub mod docker;
pub mod kubernetes;

/// A tar archive of files (parent directories included), owned by uid:gid.
pub use docker::build_tar;
pub use docker::DockerBackend;
pub use kubernetes::KubeBackend;

mod capabilities;
pub mod doctor;
mod engine;
mod found;
pub mod images;
mod plan;
pub mod refresh_lock;
mod scratch;
pub mod warm;
pub use capabilities::{Capabilities, Words};
pub use engine::{checkup, connect, BackendKind, BackendSettings, ClusterSettings, Engine, Scope};
pub use found::{ContainerInfo, ContainerState, ImageInfo, VolumeInfo};
pub use plan::{
    proxy_env, BrokerPlace, BrokerPlan, BrokerRoute, EgressPlan, EgressRoute, HostDirs, RuntimeDir,
    LOADER, PROXY_PORT, PROXY_SCRIPT, PROXY_VARS,
};
pub use refresh_lock::Hold;
pub use scratch::{Scratch, ScratchFile};

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use crate::error::{Error, Result};

/// What the session layer asks of a backend, in caw-box's terms (see the contract above).
/// The session layer (`crate::session`) takes any `impl Backend`; [`crate::Client`] is
/// where one is chosen (Docker today). Containers are named by caw-box (the turn's name is
/// the session's lock); labels are `key=value` filters that must all match.
pub trait Backend: Clone + Send + Sync + 'static {
    /// What this backend is and can do, worked out when it connected ([`Capabilities`]).
    fn capabilities(&self) -> &Capabilities;
    /// Containers (running or not) carrying all of `labels`.
    fn list_containers(
        &self,
        labels: &[String],
    ) -> impl Future<Output = Result<Vec<ContainerInfo>>> + Send;
    /// Creates a turn's container; a taken name is [`CreateError::NameTaken`], atomically.
    fn create_turn(
        &self,
        name: &str,
        spec: &TurnSpec,
    ) -> impl Future<Output = std::result::Result<String, CreateError>> + Send;
    /// Creates (does not start) one of caw-box's helper containers.
    fn create_helper(
        &self,
        name: &str,
        spec: &HelperSpec,
    ) -> impl Future<Output = std::result::Result<String, CreateError>> + Send;
    /// A container by name or id; `None` when it does not exist.
    fn inspect_container(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<ContainerInfo>>> + Send;
    /// Attaches to a created container's output (and input, with `stdin`) before its start.
    fn attach(&self, name: &str, stdin: bool) -> impl Future<Output = Result<Attached>> + Send;
    /// Resizes an interactive turn's terminal.
    fn resize_tty(
        &self,
        name: &str,
        columns: u16,
        rows: u16,
    ) -> impl Future<Output = Result<()>> + Send;
    fn start_container(&self, name: &str) -> impl Future<Output = Result<()>> + Send;
    /// Waits for a container to end; its exit code.
    fn wait_container(&self, name: &str) -> impl Future<Output = Result<i64>> + Send;
    /// Asks a container to stop, killing it after `grace`.
    fn stop_container(
        &self,
        name: &str,
        grace: Duration,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Notes on a running turn that `caw-box stop` ends it, where the driver can read it
    /// after the container ended (Kubernetes: an annotation; its runtime directory is gone
    /// with the pod). Docker needs none: the stop request in the runtime directory is read
    /// from the stopped container.
    fn note_stop(&self, _name: &str) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }
    /// Whether [`Self::note_stop`] noted on the turn's container `name` that `caw-box stop`
    /// ended it, read once the container ended. `false` where nothing is noted there
    /// (Docker: the stop request in the runtime directory is read instead).
    fn stop_noted(&self, _name: &str) -> impl Future<Output = bool> + Send {
        async { false }
    }
    /// The error of a turn whose container `name` was removed from outside while it ran, so
    /// that its record could not be written (the session stays resumable), in the
    /// backend's words.
    fn removed_under_turn(&self, name: &str) -> Error;
    /// Why a turn's container failed when the cause lies outside the CLI, for the turn's
    /// result: the kernel killed a process of it for memory (its limit), or the cluster
    /// evicted it. `None`: nothing of the kind is known (Docker reports none here: its
    /// turns keep their Docker behaviour).
    fn ended_by_environment(&self, _name: &str) -> impl Future<Output = Option<String>> + Send {
        async { None }
    }
    /// What to run to read the output of a turn's container `name` left for inspection.
    fn logs_hint(&self, name: &str) -> String;
    /// Refuses (a usage error, with what to do) a session's `--network` or `--pids-limit`
    /// that this backend cannot honour, before anything is made; never ignores one.
    fn refuse_settings(&self, _network: &str, _pids_limit: Option<i64>) -> Result<()> {
        Ok(())
    }
    /// How the agent reaches the broker of `plan` (planned for this backend's
    /// [`Capabilities::broker_place`]), decided before anything is made: its host name and
    /// where it listens; Docker: its container's name on a network the agent shares;
    /// Kubernetes: the turn pod's loopback.
    fn broker_route(&self, plan: &BrokerPlan) -> BrokerRoute;
    /// The running broker's address as the agent reaches it (for the hosts it stands in
    /// for); `None`: it has none there.
    fn broker_address(
        &self,
        plan: &BrokerPlan,
    ) -> impl Future<Output = Result<Option<String>>> + Send {
        let address = self.broker_route(plan).address;
        async move { Ok(address) }
    }
    /// How this backend realises a turn's `--allow-host` ([`EgressPlan`]): where the agent
    /// finds the proxy, on which network, and whose log holds the proxy's decisions.
    fn egress_route(&self, plan: &EgressPlan) -> EgressRoute;
    /// Makes what a turn's egress needs before the turn's container is created (Docker: the
    /// agent's internal network and the proxy's container); a turn pod that holds its own
    /// egress (Kubernetes, from [`TurnSpec::egress_allow`]) needs nothing before.
    fn open_egress(
        &self,
        plan: &EgressPlan,
    ) -> impl Future<Output = std::result::Result<(), CreateError>> + Send;
    /// Removes what [`Self::open_egress`] made, after the turn (errors ignored); a shared
    /// proxy and its network stay for the next turns.
    fn close_egress(&self, plan: &EgressPlan) -> impl Future<Output = ()> + Send;
    /// Runs a shared proxy ([`EgressPlan::shared`]) and attaches to its input and output,
    /// where it reads its config and leases: a container of its own on the plan's networks,
    /// created, attached to and started. Only where
    /// [`Capabilities::shared_proxy`](capabilities::Capabilities::shared_proxy).
    fn start_proxy(
        &self,
        plan: &EgressPlan,
    ) -> impl Future<Output = std::result::Result<Attached, CreateError>> + Send {
        let _ = plan;
        async {
            Err(CreateError::Other(crate::error::Error::environment(
                "this backend keeps no shared egress proxy",
            )))
        }
    }
    /// The address the agent's container `name` has where it reaches its egress proxy
    /// (`route`): how a shared proxy's decisions are told apart. `None` where the proxy is
    /// the turn's own, or the address is not known.
    fn agent_address(
        &self,
        name: &str,
        route: &EgressRoute,
    ) -> impl Future<Output = Option<String>> + Send {
        let _ = (name, route);
        async { None }
    }
    /// Makes what a turn's broker ([`BrokerPlan`]) needs before the agent's container is
    /// created (Docker: the network made for it, found or made once for a shared one); a
    /// broker in the turn's own unit (Kubernetes) needs nothing before.
    fn open_broker(&self, plan: &BrokerPlan) -> impl Future<Output = Result<()>> + Send;
    /// Runs the planned broker and attaches to its input and output, where it reads its
    /// config and answers: a container of its own is created, attached to and started
    /// (Docker); one in the turn's own unit is attached to once it runs (Kubernetes: the
    /// turn pod's broker container, waited for a while).
    fn start_broker(
        &self,
        plan: &BrokerPlan,
    ) -> impl Future<Output = std::result::Result<Attached, CreateError>> + Send;
    /// Attaches again to the running broker in the turn `turn`'s own unit
    /// ([`BrokerPlace::InTurn`]): another process taking over a turn whose driver is gone
    /// (Kubernetes: the turn pod's broker container). Elsewhere there is none (an error).
    fn attach_broker(&self, turn: &str) -> impl Future<Output = Result<Attached>> + Send;
    /// Removes a turn's own broker and what [`Self::open_broker`] made for it, after the
    /// turn (errors ignored); a shared one stays for the next turns, one in the turn's own
    /// unit goes with it.
    fn close_broker(&self, plan: &BrokerPlan) -> impl Future<Output = ()> + Send;
    /// Holds the refresh lock of the brokered login `login` (a provider's name), waiting up
    /// to `limit`: of every process that brokers the login through this backend, one at a
    /// time refreshes it ([`refresh_lock`]). Docker: a file lock in the data directory (the
    /// turns of this host); Kubernetes: a Lease in the namespace (every host's drivers).
    /// `None`: not had within `limit` (the caller goes on without it).
    fn hold_refresh(
        &self,
        login: &str,
        limit: Duration,
    ) -> impl Future<Output = Option<Hold>> + Send {
        let login = login.to_string();
        async move { refresh_lock::hold_on_host(&login, limit).await }
    }
    /// One try at a slot of `account`'s `cap` turns in flight that this backend shares
    /// beyond this host (`--per-account`), taken after the host's own slot: `None` when all
    /// are held elsewhere. Docker: nothing to take (this host's slots are every slot of its
    /// turns); Kubernetes: a Lease per slot in the namespace, so the drivers of every host
    /// keep to one cap.
    fn try_account_slot(
        &self,
        account: &str,
        cap: u32,
    ) -> impl Future<Output = Result<Option<Hold>>> + Send {
        let _ = (account, cap);
        std::future::ready(Ok(Some(Hold::nothing())))
    }
    /// Removes what the backend made beside turns, volumes and helpers for turns' brokers
    /// and egress (Docker: their containers and networks) carrying all of `labels`, but
    /// what is named in `keep`: leftovers of turns whose caw-box was killed, or of a
    /// session being removed. Nothing of the kind outlives a turn's own unit (Kubernetes).
    fn sweep(&self, labels: &[String], keep: &[&str]) -> impl Future<Output = Result<()>> + Send;
    /// Removes the networks carrying all of `labels` that nothing is attached to (shared
    /// egress networks whose proxies idled out); their names. None on Kubernetes.
    fn remove_unused_networks(
        &self,
        labels: &[String],
    ) -> impl Future<Output = Result<Vec<String>>> + Send;
    /// Removes the volumes carrying all of `labels` that no container uses (created, running
    /// or stopped): a container's runtime scratch ([`TurnSpec::runtime`]) left behind by a
    /// container removed from outside without its volumes; their names. One in use stays
    /// (not an error). None on Kubernetes: a scratch there is its pod's memory.
    fn remove_unused_volumes(
        &self,
        labels: &[String],
    ) -> impl Future<Output = Result<Vec<String>>> + Send;
    /// Refuses (exit 3) an OCI runtime (on Kubernetes: a RuntimeClass) that the engine
    /// does not have, naming it, what there is, and what to do; asked before anything of
    /// a session or turn is created.
    fn check_runtime(&self, name: &str) -> impl Future<Output = Result<()>> + Send;
    /// Removes a container (`force`: also a running one); a missing one is `Ok`.
    fn remove_container(&self, name: &str, force: bool) -> impl Future<Output = Result<()>> + Send;
    /// Takes the session's idle warm container for the turn `name` (atomically: of racing
    /// turns, one takes it); after this it holds the session's lock as a turn's container
    /// does. `None`: there is none.
    fn claim_warm(
        &self,
        _name: &str,
    ) -> impl Future<Output = Result<Option<ContainerInfo>>> + Send {
        async { Ok(None) }
    }
    /// Runs turn `name` in its running warm container by `exec`: from here on this
    /// process's attach, start, wait and stop of `name` act on that turn, and its
    /// `remove_container` makes the container idle for the next turn instead.
    fn exec_in_warm(&self, _name: &str, _exec: warm::WarmExec) {}
    /// The turn running in the warm container `name` (the session's turn container) and
    /// its driver's pid; `None`: none runs, or `name` is no warm container.
    fn turn_in_warm(&self, _name: &str) -> impl Future<Output = Result<Option<(u32, u32)>>> + Send {
        async { Ok(None) }
    }
    /// How long (seconds) the session's idle warm container for turn `name` stays idle
    /// after a turn; `None`: there is none.
    fn warm_idle_for(&self, _name: &str) -> impl Future<Output = Result<Option<u64>>> + Send {
        async { Ok(None) }
    }
    /// Gives the warm container `name`, made and started for no turn (`caw-box warm`),
    /// back as the session's idle one (the session's lock is free again).
    fn idle_warm(&self, name: &str) -> impl Future<Output = Result<()>> + Send {
        let name = name.to_string();
        async move {
            Err(crate::error::Error::environment(format!(
                "this backend keeps no container warm ('{name}')"
            )))
        }
    }
    /// Parks turn `name`'s idle warm container, made and started for no turn (as
    /// `caw-box warm` makes one), as a pool's ready box named `box_name` (`caw-box pool`).
    fn pool_park(&self, name: &str, box_name: &str) -> impl Future<Output = Result<()>> + Send {
        let (name, box_name) = (name.to_string(), box_name.to_string());
        async move {
            Err(crate::error::Error::environment(format!(
                "this backend keeps no pool ('{name}' as '{box_name}')"
            )))
        }
    }
    /// Runs `argv` to its end in the pool's ready box `box_name`, as its user, with no
    /// stdin (`Provider::prime_argv`): its exit code.
    fn pool_prime(
        &self,
        box_name: &str,
        _argv: Vec<String>,
    ) -> impl Future<Output = Result<i64>> + Send {
        let box_name = box_name.to_string();
        async move {
            Err(crate::error::Error::environment(format!(
                "this backend keeps no pool ('{box_name}')"
            )))
        }
    }
    /// Claims the pool's ready box `box_name` for the turn `name`: atomically (of racing
    /// claims one wins) it becomes that session's idle warm container, which the turn takes
    /// as any. `false`: it is gone, or another claim won.
    fn pool_claim(
        &self,
        _box_name: &str,
        _name: &str,
    ) -> impl Future<Output = Result<bool>> + Send {
        async { Ok(false) }
    }
    /// Removes the session's idle warm container for turn `name`: whether there was one.
    fn remove_warm(&self, _name: &str) -> impl Future<Output = Result<bool>> + Send {
        async { Ok(false) }
    }
    /// Renames running container `name` to `to` ([`Capabilities::finishes_behind`]).
    fn rename_container(&self, name: &str, to: &str) -> impl Future<Output = Result<()>> + Send;
    /// Force-removes exactly the container `found` describes (listed or inspected before),
    /// never a newer one that took its name since (a session's next turn); one already
    /// gone is `Ok`.
    fn remove_found(&self, found: &ContainerInfo) -> impl Future<Output = Result<()>> + Send;
    /// Runs a short helper container to completion and removes it: (exit code, stdout,
    /// stderr).
    fn run_to_completion(
        &self,
        name: &str,
        spec: &HelperSpec,
    ) -> impl Future<Output = std::result::Result<(i64, String, String), CreateError>> + Send;
    /// A container's output from its start, following it until it ends.
    fn follow_logs(&self, name: &str) -> OutputStream;
    /// A container's output from its start to now (stdout; `<pod>/<container>` names a
    /// pod's sidecar on Kubernetes), not waiting for more.
    fn logs_so_far(&self, name: &str) -> OutputStream;
    /// A container's output (as [`Backend::logs_so_far`] names it) from about `since` on,
    /// each line after its time (RFC 3339, UTC) and a space: the backend starts at the
    /// second (or earlier), the caller reads the times. Followed until it ends when `follow`.
    fn logs_since(&self, name: &str, since: std::time::SystemTime, follow: bool) -> OutputStream;
    /// An image by name; `None` when it is not on the backend's host.
    fn inspect_image(&self, image: &str) -> impl Future<Output = Result<Option<ImageInfo>>> + Send;
    fn create_volume(
        &self,
        name: &str,
        labels: HashMap<String, String>,
    ) -> impl Future<Output = Result<()>> + Send;
    /// The storage's own way to copy a volume as it is now, if it has one: a cluster's CSI
    /// VolumeSnapshotClass for the claims' StorageClass ([`Self::clone_volume`]).
    fn snapshot_class(&self) -> impl Future<Output = Result<Option<String>>> + Send {
        async { Ok(None) }
    }
    /// Makes volume `to` (labelled `labels`) a copy of volume `from` as it is now, by the
    /// storage's snapshot class `class` ([`Self::snapshot_class`]).
    fn clone_volume(
        &self,
        class: &str,
        from: &str,
        to: &str,
        labels: HashMap<String, String>,
    ) -> impl Future<Output = Result<()>> + Send {
        let _ = (from, to, labels);
        let class = class.to_string();
        async move {
            Err(crate::error::Error::usage(format!(
                "this engine copies no volume by a snapshot (class '{class}')"
            )))
        }
    }
    fn inspect_volume(&self, name: &str)
        -> impl Future<Output = Result<Option<VolumeInfo>>> + Send;
    fn list_volumes(
        &self,
        labels: &[String],
    ) -> impl Future<Output = Result<Vec<VolumeInfo>>> + Send;
    /// Removes a volume; a missing one is `Ok`.
    fn remove_volume(&self, name: &str) -> impl Future<Output = Result<()>> + Send;
    /// Writes `files` under `dir` of a (created or stopped) container, owned by (uid, gid).
    fn upload_files(
        &self,
        name: &str,
        dir: &str,
        files: &[TarFile<'_>],
        owner: (u32, u32),
    ) -> impl Future<Output = Result<()>> + Send;
    /// Extracts a tar archive into `dir` of a (created or stopped) container.
    fn upload_tar(
        &self,
        name: &str,
        dir: &str,
        tar: Vec<u8>,
    ) -> impl Future<Output = Result<()>> + Send;
    /// One file of a (created or stopped) container; `None` when it does not exist.
    fn download_file(
        &self,
        name: &str,
        path: &str,
    ) -> impl Future<Output = Result<Option<Vec<u8>>>> + Send;
    /// A path of a (created or stopped) container as a tar archive; `None` when missing.
    fn download_tar(
        &self,
        name: &str,
        path: &str,
    ) -> impl Future<Output = Result<Option<Vec<u8>>>> + Send;
}

/// Why a container could not be created.
#[derive(Debug)]
pub enum CreateError {
    /// A container of that name exists already (the backend enforces names atomically).
    NameTaken,
    /// The image to run is not on the backend's host.
    ImageMissing(Error),
    Other(Error),
}

/// A create's failure as the person reads it: a missing image says how to build it.
pub fn image_hint_for(
    e: CreateError,
    image: &str,
    provider: crate::provider_kind::ProviderKind,
) -> Error {
    match e {
        CreateError::ImageMissing(_) => Error::missing_image(image, provider),
        other => other.into(),
    }
}

impl From<CreateError> for Error {
    fn from(e: CreateError) -> Error {
        match e {
            CreateError::NameTaken => Error::environment("a container of that name exists already"),
            CreateError::ImageMissing(e) | CreateError::Other(e) => e,
        }
    }
}

/// One file to write: a path relative to the upload directory, its bytes and mode.
#[derive(Debug, Clone)]
pub struct TarFile<'a> {
    pub path: &'a str,
    pub contents: &'a [u8],
    pub mode: u32,
}

/// A chunk of a running container's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputChunk {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// A terminal's output (an interactive turn: stdout and stderr are one stream).
    Console(Vec<u8>),
}

impl OutputChunk {
    pub fn into_bytes(self) -> Vec<u8> {
        match self {
            OutputChunk::Stdout(b) | OutputChunk::Stderr(b) | OutputChunk::Console(b) => b,
        }
    }
}

/// A container's output as it comes.
pub type OutputStream =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = crate::error::Result<OutputChunk>> + Send>>;

/// An attached container: its output, and (for a terminal) its input.
pub struct Attached {
    pub output: OutputStream,
    pub input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
}

impl std::fmt::Debug for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Attached")
    }
}

/// How a container reaches the network.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NetworkPolicy {
    /// The backend's default network (Docker's bridge: `--network open`).
    #[default]
    Default,
    /// No network at all.
    None,
    /// The host's network.
    Host,
    /// A network that exists already, by name (an internal one with a gateway, or a turn's
    /// egress network).
    Named(String),
}

impl NetworkPolicy {
    /// A session's `--network` setting: `open` (or empty), `none`, `host`, or a name.
    pub fn from_setting(network: &str) -> Self {
        match network {
            "open" | "" => NetworkPolicy::Default,
            "none" => NetworkPolicy::None,
            "host" => NetworkPolicy::Host,
            other => NetworkPolicy::Named(other.to_string()),
        }
    }
}

/// What a mount mounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountSource {
    /// A named volume of the backend (created on first use).
    Volume(String),
    /// A directory on the host that runs caw-box.
    HostDir(String),
}

/// One mount of a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    pub source: MountSource,
    /// Where it appears in the container.
    pub target: String,
    pub read_only: bool,
}

impl MountSpec {
    pub fn volume(name: impl Into<String>, target: &str) -> Self {
        MountSpec {
            source: MountSource::Volume(name.into()),
            target: target.to_string(),
            read_only: false,
        }
    }

    pub fn host_dir(path: impl Into<String>, target: &str) -> Self {
        MountSpec {
            source: MountSource::HostDir(path.into()),
            target: target.to_string(),
            read_only: false,
        }
    }

    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }
}

/// Resource limits of a turn.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Limits {
    /// Bytes.
    pub memory: Option<i64>,
    pub cpus: Option<f64>,
    pub pids: i64,
}

/// One turn of a session, in caw-box's terms: what the backend runs in the agent's
/// sandbox (non-root, no capabilities, no new privileges, read-only root with a /tmp,
/// never privileged). Its name, the session's turn container name, is the session's lock.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnSpec {
    pub image: String,
    /// The command: the image's entrypoint runs it.
    pub argv: Vec<String>,
    /// `KEY=VALUE`; never secrets (those go through the runtime directory).
    pub env: Vec<String>,
    /// uid:gid the CLI runs as.
    pub user: (u32, u32),
    pub working_dir: String,
    pub labels: HashMap<String, String>,
    /// The state volume at HOME.
    pub home: MountSpec,
    /// The workspace at /workspace, unless the session has none.
    pub workspace: Option<MountSpec>,
    /// Read-only host paths inside a bound workspace, each mounted over itself (the
    /// protected paths that exist, `session::quarantine`); empty on other workspaces.
    pub protected: Vec<MountSpec>,
    /// The turn's private runtime directory (env file, credentials, stdin, and what the
    /// entrypoint hands back), through the backend's API: never a host path.
    pub runtime: Scratch,
    /// The runtime files travel on the container's stdin (the driver writes them after
    /// attaching; the entrypoint unpacks them) instead of being put in before the start:
    /// no archive request on a headless turn's path. The backend keeps stdin open.
    pub runtime_over_stdin: bool,
    pub limits: Limits,
    pub network: NetworkPolicy,
    /// A terminal for the vendor's TUI (and its first size, columns x rows), or a headless
    /// turn read from stdout and stderr.
    pub interactive: Option<Option<(u16, u16)>>,
    /// The credential broker beside the agent in the turn's own unit (only where
    /// [`BrokerPlace::InTurn`]): its program ([`BrokerPlan::program`]), run by node in the
    /// turn's image; the backend ends it with the agent.
    pub broker: Option<String>,
    /// The hosts the turn's proxy admits (under `open`, none need be named), where the
    /// turn's own unit holds its egress ([`Self::egress_policy`]).
    pub egress_allow: Vec<String>,
    /// The turn's egress policy where its own unit holds and records its egress
    /// (Kubernetes: a proxy sidecar, and under `balanced` and `locked` firewall rules that
    /// hold the agent to it); `None`: nothing in the unit (Docker's is its
    /// [`Backend::open_egress`] network's).
    pub egress_policy: Option<crate::event::EgressPolicy>,
    /// `host:ip` entries the agent's container resolves so (a broker standing in for a
    /// host its CLI reaches directly); empty: none.
    pub extra_hosts: Vec<String>,
    /// The OCI runtime the agent's container runs under (`runsc`: gVisor); on Kubernetes
    /// the pod's RuntimeClass (its sidecars share the pod's sandbox). `None`: the
    /// engine's default. Checked before the turn ([`Backend::check_runtime`]).
    pub oci_runtime: Option<String>,
    /// Paths in the turn's volumes (HOME, a copied workspace) its container first hands to
    /// [`Self::user`], where the backend does ([`Capabilities::hands_over_to`]): with only the
    /// capabilities chown needs, all dropped (the bounding set too) before the image's
    /// entrypoint starts, so nothing of the turn ever holds one. Empty: none.
    pub hand_over: Vec<String>,
    /// The turn's checkpoint volumes, where its own container writes its checkpoint
    /// (`session::checkpoint::prepare`); empty: none (a helper takes it after the turn).
    pub checkpoint: Vec<MountSpec>,
}

impl TurnSpec {
    pub fn mounts(&self) -> impl Iterator<Item = &MountSpec> {
        std::iter::once(&self.home).chain(self.workspace.as_ref())
    }
}

/// One of caw-box's own short-lived containers (reading a volume, fixing its owner, an
/// egress proxy, a `git diff`): never the agent.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HelperSpec {
    pub image: String,
    /// Empty: the image's own entrypoint.
    pub entrypoint: Vec<String>,
    pub argv: Vec<String>,
    pub env: Vec<String>,
    /// `uid:gid`; `None`: the image's user.
    pub user: Option<String>,
    pub labels: HashMap<String, String>,
    pub mounts: Vec<MountSpec>,
    pub network: NetworkPolicy,
    /// Hardening beyond the backend's defaults.
    pub read_only_root: bool,
    pub drop_all_capabilities: bool,
    /// Capabilities given back after dropping all (a chown as root).
    pub add_capabilities: Vec<String>,
    pub no_new_privileges: bool,
    pub pids_limit: Option<i64>,
    /// A tmpfs at /tmp with these mount options (e.g. `rw,nosuid,nodev,size=16m`).
    pub tmp: Option<String>,
    /// A private runtime directory with files from before the start (a probe's key).
    pub scratch: Option<Scratch>,
    /// Keep stdin open for `attach` (the credential broker reads its keys there).
    pub stdin: bool,
    /// With `stdin`: its stdin ends (end of file) when the one attachment that writes it
    /// closes its side or goes (its process died), as a turn's does.
    pub stdin_once: bool,
    /// A terminal for stdin and output (a CLI whose flow runs only on one): `attach` then
    /// gives its output as one console stream.
    pub tty: bool,
    /// Removed by the engine once it exits (a shared credential broker that idled out).
    pub auto_remove: bool,
    /// A second network the helper joins, under an alias, before it starts (Docker: a
    /// credential broker on the session's network joining a turn's egress network). Only
    /// for backends whose turns live on networks ([`EgressRoute::agent_network`]).
    pub join: Option<(String, String)>,
    /// The hosts a helper that goes out (a login) may reach, where the backend holds egress
    /// in the helper's own unit (Kubernetes, as a turn pod's: [`EgressRoute::agent_network`]
    /// `None`); Docker holds it with [`Backend::open_egress`]'s network. Empty: none here.
    pub egress_allow: Vec<String>,
    /// A directory its command writes that is read after the command ended, until it is
    /// removed (Kubernetes keeps it in the pod's memory; Docker, a stopped container's).
    pub kept_dir: Option<String>,
}
