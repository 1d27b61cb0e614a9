//! Pools (`caw-box pool`): boxes made ahead of new sessions, so that a new session's first
//! turn starts in a container that already runs.
//!
//! A box is what `caw-box warm` makes for a session's next turn, made for a session that
//! does not exist yet: its state volume (filled with the image's HOME, handed to the agent's
//! user; role `pool-state`, so no listing shows it as a session), its copy-mode workspace
//! volume (empty), the shared egress proxy and broker network its turns use, and its
//! container, created, started and idle (`backend::warm`'s loop), named `caw-box-pool-<id>`.
//! No credential, no prompt and no flag of a turn is in any of it: a turn's environment is
//! its exec's.
//!
//! A new session whose settings are a pool's (the same key: [`key_of`]) claims a ready box
//! ([`claim`]): the backend renames it to that session's idle warm container (atomically:
//! one claim wins), the session takes the box's id and gets a facts volume with its own
//! labels (name, group, scope, time), and its first turn runs in the box as any warm turn
//! does; after it the box goes, as a cold turn's container (unless the session keeps warm).
//! Whoever claims starts a refill in the background (`caw-box pool fill`), once its own
//! command ended or a few seconds passed (not beside the claimed turn's start), which replaces
//! what is stale (an older image; a box whose idle loop ended at the pool's age) and makes
//! boxes up to the pool's size.
//!
//! The pools' settings are files of this host's data directory (`pools/<key>.json`); the
//! boxes are the backend's, found by their labels.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::backend::{Backend, ContainerInfo};
use crate::error::{Error, Result};
use crate::provider::ProviderKind;
use crate::session::store::names::{self, LabelSet};
use crate::session::store::record::{labels, roles, SessionRecord, SessionSettings};

/// How long a box waits for a claim before it is replaced, unless the pool says.
pub const DEFAULT_MAX_AGE_SECS: u64 = 30 * 60;

/// A pool: the settings its boxes are made for, and how many it keeps ready.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolDef {
    pub key: String,
    pub provider: ProviderKind,
    pub settings: SessionSettings,
    pub size: u32,
    pub max_age_secs: u64,
    pub created_at: u64,
    /// Where its boxes live ([`scope_of`]): a pool is its backend's (and namespace's).
    pub scope: String,
}

/// A box of a pool, as `pool ls` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct BoxView {
    /// The session id its session will have.
    pub session_id: Uuid,
    /// Seconds since it was made.
    pub age_secs: u64,
    /// `ready`, or why it will not be claimed (`stale image`, `ended`).
    pub state: String,
}

/// What a fill did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Filled {
    pub made: u32,
    pub replaced: u32,
    pub ready: u32,
}

/// Where a backend's boxes live, as a pool's settings say it: `docker`, or `kubernetes`
/// with the namespace and the kubeconfig context.
pub fn scope_of(backend: &impl Backend) -> String {
    let scope = &backend.capabilities().scope;
    let mut tag = scope.kind.as_str().to_string();
    if let Some(ns) = &scope.namespace {
        tag.push_str(&format!(" namespace {ns}"));
    }
    if let Some(context) = &scope.context {
        tag.push_str(&format!(" context {context}"));
    }
    tag
}

/// The key of the pool whose boxes fit a new session of `provider` and `settings` where
/// `scope` ([`scope_of`]) says: a hash of the three (a box made for other settings, or on
/// another backend, is never claimed).
pub fn key_of(scope: &str, provider: ProviderKind, settings: &SessionSettings) -> String {
    use sha2::Digest;
    // serde_json's maps are sorted: the same settings give the same text.
    let value = serde_json::to_value((provider, settings, scope)).expect("settings serialize");
    let digest = sha2::Sha256::digest(value.to_string().as_bytes());
    digest[..6].iter().map(|b| format!("{b:02x}")).collect()
}

fn pools_dir() -> Result<PathBuf> {
    let dir = crate::dirs::data_dir()?.join("pools");
    crate::dirs::ensure_private_dir(&dir)?;
    Ok(dir)
}

fn def_path(key: &str) -> Result<PathBuf> {
    Ok(pools_dir()?.join(format!("{key}.json")))
}

/// Writes (or replaces) a pool's settings.
pub fn save(def: &PoolDef) -> Result<()> {
    let json = serde_json::to_vec_pretty(def).expect("pools serialize");
    crate::dirs::write_private(&def_path(&def.key)?, &json)
}

/// The pool of `key`, if there is one on this host.
pub fn load(key: &str) -> Option<PoolDef> {
    let bytes = std::fs::read(def_path(key).ok()?).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The pools of this host on `backend` ([`scope_of`]), oldest first.
pub fn here(backend: &impl Backend) -> Result<Vec<PoolDef>> {
    let scope = scope_of(backend);
    Ok(all()?.into_iter().filter(|d| d.scope == scope).collect())
}

/// Every pool of this host, oldest first.
pub fn all() -> Result<Vec<PoolDef>> {
    let mut defs: Vec<PoolDef> = std::fs::read_dir(pools_dir()?)
        .map_err(|e| Error::environment(format!("cannot read the pools: {e}")))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
        .collect();
    defs.sort_by_key(|d: &PoolDef| d.created_at);
    Ok(defs)
}

/// Holds the pool's lock (`pools/<key>.lock`) while it lives: one fill or stop at a time.
fn lock(key: &str) -> Result<std::fs::File> {
    let path = pools_dir()?.join(format!("{key}.lock"));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Error::environment(format!("cannot open '{}': {e}", path.display())))?;
    file.lock()
        .map_err(|e| Error::environment(format!("cannot lock '{}': {e}", path.display())))?;
    Ok(file)
}

fn pool_filter(key: &str) -> Vec<String> {
    vec![
        format!("{}=true", labels::MANAGED),
        format!("{}={key}", labels::POOL),
    ]
}

fn session_of(c: &ContainerInfo) -> Option<Uuid> {
    Uuid::parse_str(c.label(labels::SESSION)?).ok()
}

fn age_of(c: &ContainerInfo) -> u64 {
    c.created
        .and_then(|t| t.elapsed().ok())
        .map_or(0, |d| d.as_secs())
}

/// The id of the image a pool's boxes are made from now (`None`: it is not here).
async fn image_id(backend: &impl Backend, def: &PoolDef) -> Result<Option<String>> {
    Ok(backend
        .inspect_image(&def.settings.image)
        .await?
        .map(|i| i.id))
}

/// A pool's boxes that wait for a claim (named as boxes; a claimed one is its session's),
/// each with whether it may be claimed: it runs, of the image there is now, younger than
/// the pool's age.
async fn boxes(
    backend: &impl Backend,
    def: &PoolDef,
    image: Option<&str>,
) -> Result<Vec<(ContainerInfo, BoxView)>> {
    let mut found: Vec<(ContainerInfo, BoxView)> = backend
        .list_containers(&pool_filter(&def.key))
        .await?
        .into_iter()
        .filter_map(|c| {
            let id = session_of(&c)?;
            (c.name == names::pool_box(id)).then_some((c, id))
        })
        .map(|(c, session_id)| {
            let age_secs = age_of(&c);
            let state = if !c.running() {
                "ended"
            } else if image.is_none() || c.label(labels::POOL_IMAGE) != image {
                "stale image"
            } else if age_secs + 5 >= def.max_age_secs {
                "too old"
            } else {
                "ready"
            };
            let view = BoxView {
                session_id,
                age_secs,
                state: state.to_string(),
            };
            (c, view)
        })
        .collect();
    found.sort_by_key(|(c, _)| c.created);
    Ok(found)
}

/// The boxes of the pool of `key` and their states, as `pool ls` shows them.
pub async fn list(backend: &impl Backend, def: &PoolDef) -> Result<Vec<BoxView>> {
    let image = image_id(backend, def).await?;
    Ok(boxes(backend, def, image.as_deref())
        .await?
        .into_iter()
        .map(|(_, v)| v)
        .collect())
}

/// Claims a ready box of the pool for a new session of `provider` and `settings`, whose
/// image is `image` (its id): the id the session takes. `None`: no pool has these settings,
/// or none of its boxes is ready (the session is made as without a pool).
pub async fn claim(
    backend: &impl Backend,
    provider: ProviderKind,
    settings: &SessionSettings,
    image: &str,
) -> Result<Option<Uuid>> {
    let key = key_of(&scope_of(backend), provider, settings);
    let Some(def) = load(&key) else {
        return Ok(None);
    };
    for (_, b) in boxes(backend, &def, Some(image)).await? {
        if b.state != "ready" {
            continue;
        }
        let id = b.session_id;
        let turn = names::turn_container(id);
        if backend.pool_claim(&names::pool_box(id), &turn).await? {
            tracing::debug!("claimed box {id} of pool {key}");
            return Ok(Some(id));
        }
    }
    Ok(None)
}

/// The labels of a box's container beside a turn container's: its pool and image.
fn box_labels(def: &PoolDef, image: &str) -> Vec<(String, String)> {
    vec![
        (labels::POOL.to_string(), def.key.clone()),
        (labels::POOL_IMAGE.to_string(), image.to_string()),
    ]
}

/// Makes one ready box of the pool: its volumes, and its container, idle, parked under
/// its box name. Nothing of it stays when a step fails.
async fn make_box(backend: &impl Backend, def: &PoolDef, image: &str) -> Result<Uuid> {
    let id = Uuid::new_v4();
    let now = crate::session::store::record::now_secs();
    let mut state = crate::session::store::record::volume_labels(
        id,
        def.provider,
        None,
        None,
        now,
        &def.settings,
    );
    state.insert(labels::ROLE.into(), roles::POOL_STATE.into());
    state.insert(labels::POOL.into(), def.key.clone());
    let made = async {
        backend
            .create_volume(&names::state_volume(id), state)
            .await?;
        if def.settings.workspace_mode == crate::session::WorkspaceMode::Copy {
            let ws = LabelSet::new(id, roles::WORKSPACE)
                .provider(def.provider)
                .with(labels::POOL, def.key.clone())
                .finish();
            backend
                .create_volume(&names::workspace_volume(id), ws)
                .await?;
        }
        let mut record = new_record(id, def.provider, &def.settings, now);
        let extra = box_labels(def, image);
        crate::session::turn::runner::warm_ahead_with(
            backend,
            &mut record,
            Some(def.max_age_secs),
            &extra,
            "their turns",
        )
        .await
        .map_err(|e| match e.kind {
            // Where a turn of these settings would run cold (a broker beside the agent on a
            // cluster), no box can wait for it.
            crate::error::ErrorKind::Usage => Error::usage(format!(
                "no box can be made ahead for these settings: {}",
                e.message
            )),
            _ => e,
        })?;
        let turn = names::turn_container(id);
        backend.pool_park(&turn, &names::pool_box(id)).await?;
        let cli = def.provider.adapter();
        ahead(backend, id, cli.prime_argv(), "primed").await;
        ahead(backend, id, cli.prestart_argv(), "its CLI started ahead").await;
        Ok(())
    };
    if let Err(e) = made.await {
        remove_box(backend, id).await;
        return Err(e);
    }
    Ok(id)
}

/// Runs in box `id`, ahead of its claim, what its provider's CLI does there (`what`, for the
/// debug log): the state its first run would make before it sends anything
/// (`Provider::prime_argv`), then the CLI itself started to wait for the first turn where it
/// can (`Provider::prestart_argv`). A step that fails leaves the box as it was: the first turn
/// does it itself.
async fn ahead(backend: &impl Backend, id: Uuid, argv: Option<Vec<String>>, what: &str) {
    let Some(argv) = argv else {
        return;
    };
    match backend.pool_prime(&names::pool_box(id), argv).await {
        Ok(0) => tracing::debug!("box {id}: {what}"),
        Ok(code) => tracing::debug!("box {id}: {what} ended {code}; its first turn does it"),
        Err(e) => tracing::debug!("box {id}: {what} failed: {e}"),
    }
}

/// A record of a session that does not exist yet (a box's, or a claimed box's session).
pub fn new_record(
    id: Uuid,
    provider: ProviderKind,
    settings: &SessionSettings,
    created_at: u64,
) -> SessionRecord {
    SessionRecord {
        version: 1,
        session_id: id,
        provider,
        name: None,
        group: None,
        resume_key: String::new(),
        key_confirmed: false,
        owner: None,
        created_at,
        settings: settings.clone(),
        turns: Vec::new(),
        home_unlike_image: false,
        turn_started: false,
        summary_only: false,
        cli_version: None,
    }
}

/// Removes an unclaimed box `id`: its container (by any of its names) and its volumes.
async fn remove_box(backend: &impl Backend, id: Uuid) {
    let turn = names::turn_container(id);
    for name in [names::pool_box(id), turn.clone()] {
        let _ = backend.remove_container(&name, true).await;
    }
    let _ = backend.remove_warm(&turn).await;
    for v in [names::state_volume(id), names::workspace_volume(id)] {
        let _ = backend.remove_volume(&v).await;
    }
}

/// Removes a claimed box whose session could not be made: its container (the session's
/// idle one now) and every volume of its session.
pub async fn remove_claimed(backend: &impl Backend, id: Uuid) {
    remove_box(backend, id).await;
    let _ = backend.remove_volume(&names::facts_volume(id)).await;
}

/// The pool's volumes of boxes that are gone and were never claimed (their idle loop ended
/// at the pool's age, or they were removed from outside): their session ids.
async fn unclaimed_leftovers(backend: &impl Backend, key: &str) -> Result<Vec<Uuid>> {
    let volumes = backend.list_volumes(&pool_filter(key)).await?;
    let containers = backend
        .list_containers(&[format!("{}=true", labels::MANAGED)])
        .await?;
    let with_container: std::collections::HashSet<Uuid> =
        containers.iter().filter_map(session_of).collect();
    let mut left = Vec::new();
    for v in volumes {
        if v.labels.get(labels::ROLE).map(String::as_str) != Some(roles::POOL_STATE) {
            continue;
        }
        let Some(id) = v
            .labels
            .get(labels::SESSION)
            .and_then(|s| Uuid::parse_str(s).ok())
        else {
            continue;
        };
        if with_container.contains(&id) {
            continue;
        }
        if backend
            .inspect_volume(&names::facts_volume(id))
            .await?
            .is_none()
        {
            left.push(id);
        }
    }
    Ok(left)
}

/// Brings the pool to its size: what will not be claimed goes (a box of an older image, or
/// older than the pool's age, and the volumes of boxes gone unclaimed), and new boxes are
/// made until `size` are ready. One fill at a time per pool (its lock).
pub async fn fill(
    backend: &impl Backend,
    def: &PoolDef,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Filled> {
    let _lock = lock(&def.key)?;
    // A `pool stop` while this waited for the lock: nothing to fill.
    if load(&def.key).is_none() {
        return Ok(Filled::default());
    }
    let image = image_id(backend, def)
        .await?
        .ok_or_else(|| Error::missing_image(&def.settings.image, def.provider))?;
    let mut filled = Filled::default();
    for (c, b) in boxes(backend, def, Some(&image)).await? {
        if b.state == "ready" {
            filled.ready += 1;
        } else if backend
            .pool_claim(&c.name, &format!("{}-stale", c.name))
            .await?
        {
            // (Renamed first, so that no claim takes it while it goes.)
            remove_box(backend, b.session_id).await;
            let _ = backend.remove_warm(&format!("{}-stale", c.name)).await;
            filled.replaced += 1;
        }
    }
    for id in unclaimed_leftovers(backend, &def.key).await? {
        remove_box(backend, id).await;
    }
    while filled.ready < def.size {
        progress(&format!(
            "making box {} of {} for pool {}",
            filled.ready + 1,
            def.size,
            def.key
        ));
        make_box(backend, def, &image).await?;
        filled.made += 1;
        filled.ready += 1;
    }
    Ok(filled)
}

/// Removes the pool: its ready boxes and what is left of those gone unclaimed, and its
/// settings (no claim and no refill finds it after). Claimed boxes are their sessions'.
pub async fn stop(backend: &impl Backend, def: &PoolDef) -> Result<u32> {
    let _lock = lock(&def.key)?;
    let _ = std::fs::remove_file(def_path(&def.key)?);
    let mut removed = 0;
    for (c, b) in boxes(backend, def, None).await? {
        if backend
            .pool_claim(&c.name, &format!("{}-stop", c.name))
            .await?
        {
            remove_box(backend, b.session_id).await;
            let _ = backend.remove_warm(&format!("{}-stop", c.name)).await;
            removed += 1;
        }
    }
    for id in unclaimed_leftovers(backend, &def.key).await? {
        remove_box(backend, id).await;
    }
    Ok(removed)
}

/// `gc`'s part: the boxes of pools this host no longer has (their settings removed by
/// hand, or by another data directory's `pool stop`: the label says which pool, not whose)
/// stay; the leftovers of every pool here go (volumes of boxes gone unclaimed). How many
/// boxes' worth went.
pub async fn sweep(backend: &impl Backend) -> Result<usize> {
    let mut removed = 0;
    for def in here(backend)? {
        let _lock = lock(&def.key)?;
        for id in unclaimed_leftovers(backend, &def.key).await? {
            remove_box(backend, id).await;
            removed += 1;
        }
    }
    Ok(removed)
}

/// How long a refill after a claim waits for the claiming command to end (see
/// [`refill_after_claim`]).
pub const REFILL_AFTER_CLAIM_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Starts `caw-box pool fill KEY` in the background, detached from this process (its
/// output goes nowhere).
pub fn fill_in_background(key: &str) {
    spawn_fill(key, None);
}

/// [`fill_in_background`] after a claim: the fill waits until this process ended (a `run`
/// whose turn is done), at most [`REFILL_AFTER_CLAIM_WAIT`]. Making a box is a container's
/// create and start, and a volume's chown: on the same cores as the claimed turn's CLI
/// while it starts, it slowed that turn by more than the claim saved.
pub fn refill_after_claim(key: &str) {
    spawn_fill(key, Some(std::process::id()));
}

/// Waits until process `pid` ended, at most [`REFILL_AFTER_CLAIM_WAIT`].
pub async fn after(pid: u32) {
    let deadline = tokio::time::Instant::now() + REFILL_AFTER_CLAIM_WAIT;
    while crate::dirs::process_is_alive(pid) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

fn spawn_fill(key: &str, after: Option<u32>) {
    let Ok(exe) = crate::connection::driver() else {
        return;
    };
    let mut fill = std::process::Command::new(exe);
    fill.args(["-q", "pool", "fill", key]);
    if let Some(pid) = after {
        fill.args(["--after", &pid.to_string()]);
    }
    let spawned = fill
        .envs(crate::connection::installed().child_env())
        .env(
            "CAW_BOX_LABELS",
            crate::session::store::record::render_labels(
                &crate::session::store::record::extra_labels(),
            ),
        )
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    match spawned {
        // Reaped by nobody: it outlives this process, and init takes it then.
        Ok(child) => drop(child),
        Err(e) => tracing::debug!("could not start the pool's refill: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key follows every setting: a box made for other settings is never claimed.
    #[test]
    fn a_pools_key_is_its_provider_and_settings() {
        let s = SessionSettings {
            image: "caw-box/codex:latest".into(),
            network: "n".into(),
            ..Default::default()
        };
        let key = |p, s: &SessionSettings| key_of("docker", p, s);
        let k = key(ProviderKind::Codex, &s);
        assert_eq!(k, key(ProviderKind::Codex, &s.clone()));
        assert_eq!(k.len(), 12);
        assert_ne!(k, key(ProviderKind::Gemini, &s));
        let mut other = s.clone();
        other.allow_hosts.push("pypi.org:443".into());
        assert_ne!(k, key(ProviderKind::Codex, &other));
        let mut other = s.clone();
        other.memory = Some(1 << 30);
        assert_ne!(k, key(ProviderKind::Codex, &other));
        // The same settings on another backend (or namespace) are another pool.
        assert_ne!(k, key_of("kubernetes namespace a", ProviderKind::Codex, &s));
        assert_ne!(
            key_of("kubernetes namespace a", ProviderKind::Codex, &s),
            key_of("kubernetes namespace b", ProviderKind::Codex, &s)
        );
    }
}
