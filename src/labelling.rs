//! The labels caw-box puts on everything it creates, and the roles its objects play
//! (SPEC.md, "Docker objects"): vocabulary that the session layer writes and every backend
//! reads back, so it lives below both. They must never change without a migration (old
//! sessions must resume). The names built from them: `session::names`.

/// Labels on everything caw-box creates (SPEC.md, "Docker objects").
pub mod labels {
    pub const MANAGED: &str = "io.caw-box.managed";
    pub const SESSION: &str = "io.caw-box.session";
    pub const PROVIDER: &str = "io.caw-box.provider";
    pub const NAME: &str = "io.caw-box.name";
    pub const GROUP: &str = "io.caw-box.group";
    /// The `caw-box mcp --scope` a session was started under: what that server may see and
    /// touch (a session without it, such as one `caw-box run` started, belongs to none).
    pub const SCOPE: &str = "io.caw-box.scope";
    pub const CREATED: &str = "io.caw-box.created";
    pub const SETTINGS: &str = "io.caw-box.settings";
    /// On a bind-mode state volume: the git workspace at session start
    /// ([`crate::session::patch::GitBase`]), for `diff --patch`.
    pub const WORKSPACE_BASE: &str = "io.caw-box.workspace-base";
    pub const ROLE: &str = "io.caw-box.role";
    pub const TURN: &str = "io.caw-box.turn";
    pub const CLI_VERSION: &str = "io.caw-box.cli-version";
    /// On a turn container: the process that drives the turn, and its host.
    pub const DRIVER_PID: &str = "io.caw-box.driver-pid";
    pub const DRIVER_HOST: &str = "io.caw-box.driver-host";
    /// On a turn container (pod) whose egress goes through a proxy: where the proxy logs its
    /// decisions (a name [`crate::backend::Backend::logs_since`] reads), the turn's policy,
    /// and, of a proxy other turns share, the network where the agent reaches it (the
    /// decisions from the agent's address there are the turn's). What `logs -f` and MCP's
    /// progress read a running turn's refusals from, as they come.
    pub const EGRESS_LOG: &str = "io.caw-box.egress-log";
    pub const EGRESS_POLICY: &str = "io.caw-box.egress-policy";
    pub const EGRESS_NETWORK: &str = "io.caw-box.egress-network";
    /// On a turn pod (Kubernetes): `caw-box stop` ended it (its runtime directory, where
    /// Docker's stop request goes, is gone with the pod).
    pub const STOP_REQUESTED: &str = "io.caw-box.stop-requested";
    /// On a headless turn's container, set by the backend that made it so (Docker, Kubernetes):
    /// it runs on when its driver is gone, and any caw-box can record it
    /// (`session::headless::adopt`): `wait`, `stop`, `show`, `logs`, `ls` and the session's
    /// next turn do.
    pub const ADOPTABLE: &str = "io.caw-box.adoptable";
    /// On a turn-record volume: the [`crate::session::record::TurnSummary`] of the session's latest turn.
    pub const SUMMARY: &str = "io.caw-box.summary";
    /// On a checkpoint volume: its [`crate::session::checkpoint::Checkpoint`] (turn, time,
    /// the checkpoint it holds the changes since).
    pub const CHECKPOINT: &str = "io.caw-box.checkpoint";
    /// On an image: a hash of everything it was built from; `image build` skips an image
    /// whose hash is current.
    pub const INPUTS: &str = "io.caw-box.inputs";
    /// On a builder-stage image (set by the Dockerfile): the stage, and the `image build`
    /// run that made it, which removes it when it ends.
    pub const STAGE: &str = "io.caw-box.stage";
    pub const BUILD_ID: &str = "io.caw-box.build-id";
    /// On a pool's box (container and volumes, `caw-box pool`): the pool's key, a hash of the
    /// settings its boxes are made for; on its container also the image id it was made
    /// from (a box of an older image is replaced, never claimed).
    pub const POOL: &str = "io.caw-box.pool";
    pub const POOL_IMAGE: &str = "io.caw-box.pool-image";
}

/// Roles of the objects caw-box creates (label `io.caw-box.role`).
pub mod roles {
    /// The state volume, mounted at HOME.
    pub const STATE: &str = "state";
    /// The container of a running turn; its name is the session's lock.
    pub const TURN: &str = "turn";
    /// A turn container's runtime scratch (`session::turn::runtime`: its prompt, credentials
    /// and scrub list), where it is a volume of its own (Docker's anonymous one): removed
    /// with its container, unless that is removed from outside without its volumes
    /// (`docker rm -f`); then the session's next turn and `gc` remove it, once no container
    /// uses it.
    pub const RUNTIME: &str = "runtime";
    /// A never-started container that reads files out of a state volume.
    pub const PROBE: &str = "probe";
    /// An empty volume whose labels summarise the session's latest turn (labels cannot be
    /// changed, so each turn replaces it): lets `ls` and `resume` learn the state of every
    /// session from one Docker call, without reading any volume.
    pub const TURN_RECORD: &str = "turn-record";
    /// A turn's egress proxy (`--allow-host`) and its internal network.
    pub const PROXY: &str = "proxy";
    /// A turn's credential broker, and the network made for it on `--network open`.
    pub const BROKER: &str = "broker";
    /// A copy-mode session's workspace, mounted at /workspace.
    pub const WORKSPACE: &str = "workspace";
    /// One turn's checkpoint: the files of HOME (and of a copy-mode workspace) that changed
    /// since the session's previous checkpoint, as a tar layer, with a listing of every path
    /// (`session::checkpoint`). Mounted in its own turn only (the next turn's has it read-only).
    pub const CHECKPOINT: &str = "checkpoint";
    /// `caw-box auth login`'s container of the vendor's login, and its egress (its
    /// session label is the login's own id: no session has it).
    pub const LOGIN: &str = "login";
    /// The state volume of a pool's box (`caw-box pool`), made before any session had it:
    /// no session's until a claim gives its session a facts volume (role `state`, the
    /// session's labels, `caw-box-<id>-facts`), which is what `ls` and a TARGET find.
    pub const POOL_STATE: &str = "pool-state";
}
