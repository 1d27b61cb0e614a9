//! Finding a session from a TARGET (a handle, an id, a unique id prefix of 4+ characters, or
//! a name), and loading its record, from the backend alone when the host cache is gone.

use std::collections::HashMap;

use uuid::Uuid;

use crate::backend::{Backend, CreateError};
use crate::backend::{HelperSpec, MountSpec, NetworkPolicy, VolumeInfo};
use crate::error::{Error, Result};
use crate::provider::{ProviderKind, AGENT_HOME};
use crate::session::store::handle::ResumeHandle;
use crate::session::store::names::{self, LabelSet};
use crate::session::store::record::{
    labels, roles, SessionRecord, SessionSettings, TurnRecord, TurnSummary, RECORD_PATH,
};

/// What the state volume's labels say about a session.
#[derive(Debug, Clone)]
pub struct VolumeFacts {
    pub session_id: Uuid,
    pub provider: ProviderKind,
    pub name: Option<String>,
    pub group: Option<String>,
    /// The `caw-box mcp` scope it was started under, if any.
    pub scope: Option<String>,
    pub created_at: u64,
    pub settings: SessionSettings,
    /// A bind-mode git workspace as it was at session start (`diff --patch`).
    pub workspace_base: Option<crate::session::store::record::GitBase>,
}

impl VolumeFacts {
    /// The facts of `record`'s session as its record holds them (no scope, no git base):
    /// enough to mount and read its volumes.
    pub fn of(record: &SessionRecord) -> Self {
        Self {
            session_id: record.session_id,
            provider: record.provider,
            name: record.name.clone(),
            group: record.group.clone(),
            scope: None,
            created_at: record.created_at,
            settings: record.settings.clone(),
            workspace_base: None,
        }
    }

    /// Reads a state volume's labels; `None` if it is not a caw-box state volume.
    pub fn from_volume(v: &VolumeInfo) -> Option<Self> {
        let l = &v.labels;
        if l.get(labels::MANAGED).map(String::as_str) != Some("true") {
            return None;
        }
        let session_id = Uuid::parse_str(l.get(labels::SESSION)?).ok()?;
        let provider = l.get(labels::PROVIDER)?.parse().ok()?;
        let settings = l
            .get(labels::SETTINGS)
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or_else(|| SessionSettings {
                image: ProviderKind::default_image(provider),
                network: "open".into(),
                ..Default::default()
            });
        Some(VolumeFacts {
            session_id,
            provider,
            name: l.get(labels::NAME).cloned(),
            group: l.get(labels::GROUP).cloned(),
            scope: l.get(labels::SCOPE).cloned(),
            created_at: l
                .get(labels::CREATED)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0),
            settings,
            workspace_base: l
                .get(labels::WORKSPACE_BASE)
                .and_then(|b| serde_json::from_str(b).ok()),
        })
    }
}

/// The label filter of every state volume.
pub fn state_volume_filter() -> Vec<String> {
    vec![
        format!("{}=true", labels::MANAGED),
        format!("{}={}", labels::ROLE, roles::STATE),
    ]
}

/// A session as the backend's labels describe it: its state volume and its latest turn.
#[derive(Debug, Clone)]
pub struct SessionView {
    pub facts: VolumeFacts,
    pub last: Option<TurnSummary>,
}

impl SessionView {
    /// The session's record as far as labels tell it: enough to run the next turn. The
    /// full history stays in the state volume (see [`read_record`]).
    pub fn record(&self) -> SessionRecord {
        let f = &self.facts;
        let mut record = SessionRecord {
            version: 1,
            session_id: f.session_id,
            provider: f.provider,
            name: f.name.clone(),
            group: f.group.clone(),
            resume_key: String::new(),
            key_confirmed: false,
            owner: None,
            created_at: f.created_at,
            settings: f.settings.clone(),
            turns: Vec::new(),
            home_unlike_image: false,
            turn_started: false,
            summary_only: false,
            cli_version: None,
        };
        if let Some(last) = &self.last {
            record.resume_key = last.resume_key.clone();
            record.key_confirmed = last.key_confirmed;
            record.owner = last.owner;
            record.home_unlike_image = last.home_unlike_image;
            if last.keep_warm_secs.is_some() {
                record.settings.keep_warm_secs = last.keep_warm_secs;
            }
            if last.max_cost_usd.is_some() {
                record.settings.max_cost_usd = last.max_cost_usd;
            }
            record.turns.push(TurnRecord {
                turn: last.turn,
                prompt: String::new(),
                status: last.status,
                result: String::new(),
                // The session's spend so far, which its `--max-cost` is held against (the
                // turns' own costs are in the state volume's history).
                usage: crate::event::Usage {
                    cost_usd: last.total_cost_usd,
                    ..Default::default()
                },
                started_at: last.started_at,
                duration_ms: last.ended_at.saturating_sub(last.started_at) * 1000,
                exit_code: last.status.exit_code(),
                cumulative_usage: last.cumulative_usage,
                interactive: last.interactive,
                limit_resets_at: None,
                account: None,
                inherited: false,
                resume_key: String::new(),
                egress: None,
            });
            // The host cache completes the history when it agrees with the labels on the
            // latest turn (else the next turn reads it from the state volume).
            if let Some(cached) = cached_record(f.session_id).filter(|c| {
                c.has_every_turn_before(last.turn + 1)
                    && c.turns
                        .last()
                        .is_some_and(|t| t.started_at == last.started_at)
            }) {
                record.turns = cached.turns;
            } else {
                record.summary_only = true;
            }
        }
        record
    }

    /// When the session last did something: the end of its latest turn, else its creation
    /// (a fork's latest turn may be its source's, from before it was made: `gc` must not
    /// take a fork made now for an old session).
    pub fn last_activity(&self) -> u64 {
        self.last.as_ref().map_or(self.facts.created_at, |l| {
            l.ended_at.max(l.started_at).max(self.facts.created_at)
        })
    }
}

/// Every session on this backend (Docker host, or cluster namespace), from one filtered
/// listing.
pub async fn list_sessions(backend: &impl Backend) -> Result<Vec<SessionView>> {
    let volumes = backend
        .list_volumes(&[format!("{}=true", labels::MANAGED)])
        .await?;
    Ok(join_views(&volumes))
}

fn join_views(volumes: &[VolumeInfo]) -> Vec<SessionView> {
    let mut summaries: HashMap<Uuid, TurnSummary> = HashMap::new();
    for v in volumes {
        if let Some((id, s)) = TurnSummary::from_labels(&v.labels) {
            match summaries.get(&id) {
                Some(have) if have.turn >= s.turn => {}
                _ => {
                    summaries.insert(id, s);
                }
            }
        }
    }
    volumes
        .iter()
        .filter(|v| v.labels.get(labels::ROLE).map(String::as_str) == Some(roles::STATE))
        .filter_map(VolumeFacts::from_volume)
        .map(|facts| SessionView {
            last: summaries.remove(&facts.session_id),
            facts,
        })
        .collect()
}

/// Resolves TARGET to a session and loads what its next turn needs.
pub async fn resolve(backend: &impl Backend, target: &str) -> Result<SessionRecord> {
    Ok(resolve_view(backend, target).await?.record())
}

/// What a TARGET string names, decided from the string alone (no Docker).
#[derive(Debug)]
pub enum TargetSpec<'a> {
    /// A full resume handle, parsed and validated.
    Handle(ResumeHandle),
    /// An id, a unique id prefix or a name (trimmed), to look up with [`find_in`].
    Lookup(&'a str),
}

/// Classifies TARGET: trims it, refuses an empty one, and parses what looks like a handle,
/// refusing one of a session that lives outside `scope` (another backend or namespace).
pub fn parse_target<'a>(target: &'a str, scope: &crate::backend::Scope) -> Result<TargetSpec<'a>> {
    // A byte-order mark counts as blank: a handle saved by some editors starts with one.
    let target = target.trim_matches(|c: char| c.is_whitespace() || c == '\u{feff}');
    if target.is_empty() {
        return Err(Error::usage("empty TARGET").with_hint(
            "pass a handle, a session id, a unique id prefix (4+ characters) or a session name",
        ));
    }
    if ResumeHandle::looks_like_handle(target) {
        let handle = ResumeHandle::parse(target)?;
        handle.check_scope(scope)?;
        return Ok(TargetSpec::Handle(handle));
    }
    Ok(TargetSpec::Lookup(target))
}

/// Resolves TARGET (a handle, id, unique id prefix of 4+ characters, or name) to a session.
pub async fn resolve_view(backend: &impl Backend, target: &str) -> Result<SessionView> {
    resolve_view_in(backend, target, None).await
}

/// [`resolve_view`] among the sessions of one `caw-box mcp` scope (`None`: all of them). A
/// session outside the scope is not found, as if it did not exist: a prefix or name is
/// matched only against the scope's sessions, so one outside it neither answers nor makes a
/// prefix ambiguous, and a handle of one is refused with the same words as an unknown one.
pub async fn resolve_view_in(
    backend: &impl Backend,
    target: &str,
    scope: Option<&str>,
) -> Result<SessionView> {
    let visible = |facts: &VolumeFacts| scope.is_none() || facts.scope.as_deref() == scope;
    let handle = match parse_target(target, &backend.capabilities().scope)? {
        TargetSpec::Handle(handle) => handle,
        TargetSpec::Lookup(target) => {
            let mut all = list_sessions(backend).await?;
            all.retain(|v| visible(&v.facts));
            return find_in(all, target);
        }
    };
    let facts = facts_for_handle(backend, &handle).await?;
    if !visible(&facts) {
        return Err(not_found(&format!(
            "the handle of session {}",
            handle.session_id
        )));
    }
    let volumes = backend
        .list_volumes(&[
            format!("{}={}", labels::SESSION, facts.session_id),
            format!("{}={}", labels::ROLE, roles::TURN_RECORD),
        ])
        .await?;
    let mut last = join_last(&volumes, facts.session_id);
    // A handle carries the vendor key; it also resumes a session whose turn record
    // was lost (say, a turn killed hard before it was written).
    if last.as_ref().is_none_or(|l| l.resume_key.is_empty()) && !handle.resume_key.is_empty() {
        let mut l = last.unwrap_or(TurnSummary {
            turn: 0,
            status: crate::event::Status::Success,
            started_at: facts.created_at,
            ended_at: facts.created_at,
            resume_key: String::new(),
            key_confirmed: false,
            cumulative_usage: None,
            total_cost_usd: None,
            owner: None,
            interactive: false,
            home_unlike_image: false,
            keep_warm_secs: None,
            max_cost_usd: None,
        });
        l.resume_key = handle.resume_key.clone();
        l.key_confirmed = true;
        last = Some(l);
    }
    Ok(SessionView { facts, last })
}

fn join_last(volumes: &[VolumeInfo], id: Uuid) -> Option<TurnSummary> {
    volumes
        .iter()
        .filter_map(|v| TurnSummary::from_labels(&v.labels))
        .filter(|(sid, _)| *sid == id)
        .map(|(_, s)| s)
        .max_by_key(|s| s.turn)
}

/// What an unknown TARGET is told (`what`: the TARGET as the message names it).
fn not_found(what: &str) -> Error {
    Error::not_found(format!("no session matches {what}")).with_hint(
        "pass a handle, a session id, a unique id prefix (4+ characters) or a session name; `caw-box ls` lists them",
    )
}

/// Picks one session by exact id, name, or unique id prefix.
pub fn find_in(all: Vec<SessionView>, target: &str) -> Result<SessionView> {
    let not_found = || not_found(&format!("'{target}'"));
    let lower = target.to_ascii_lowercase();
    let mut by_prefix = Vec::new();
    for view in all {
        let id = view.facts.session_id.to_string();
        if id == lower || view.facts.name.as_deref() == Some(target) {
            return Ok(view);
        }
        if target.len() >= 4 && id.starts_with(&lower) {
            by_prefix.push(view);
        }
    }
    match by_prefix.len() {
        0 => Err(not_found()),
        1 => Ok(by_prefix.remove(0)),
        _ => {
            let mut ids: Vec<String> = by_prefix
                .iter()
                .map(|v| v.facts.session_id.to_string())
                .collect();
            ids.sort();
            Err(Error::usage(format!(
                "'{target}' is ambiguous: it matches sessions {}",
                ids.join(", ")
            ))
            .with_hint("give more characters of the id"))
        }
    }
}

/// Checks a handle against the backend: its volume must exist and carry matching labels.
async fn facts_for_handle(backend: &impl Backend, handle: &ResumeHandle) -> Result<VolumeFacts> {
    let volume = backend
        .inspect_volume(&handle.volume)
        .await?
        .ok_or_else(|| {
            let words = &backend.capabilities().words;
            Error::not_found(format!(
                "the handle's state volume '{}' does not exist on {}",
                handle.volume, words.here
            ))
            .with_hint(format!(
                "the session was removed, or it lives on {}",
                words.elsewhere
            ))
        })?;
    // A pool made the state volume before its session: the session's labels are on its
    // facts volume.
    let volume = match volume.labels.get(labels::ROLE).map(String::as_str) {
        Some(roles::POOL_STATE) => backend
            .inspect_volume(&names::facts_volume(handle.session_id))
            .await?
            .unwrap_or(volume),
        _ => volume,
    };
    let facts = VolumeFacts::from_volume(&volume).ok_or_else(|| {
        Error::usage(format!(
            "volume '{}' is not a caw-box session volume (its labels do not match the handle)",
            handle.volume
        ))
    })?;
    if facts.session_id != handle.session_id {
        return Err(Error::usage(format!(
            "volume '{}' belongs to session {}, not to the handle's session {}",
            handle.volume, facts.session_id, handle.session_id
        )));
    }
    if facts.provider != handle.provider {
        return Err(Error::usage(format!(
            "the handle says provider {} but volume '{}' belongs to a {} session",
            handle.provider, handle.volume, facts.provider
        ))
        .with_hint("use the handle printed for this session by `caw-box handle`"));
    }
    Ok(facts)
}

/// The record the host cached after the session's latest turn here, if any.
pub(crate) fn cached_record(id: uuid::Uuid) -> Option<SessionRecord> {
    let path = crate::dirs::sessions_dir().ok()?.join(format!("{id}.json"));
    let record: SessionRecord = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    (record.session_id == id).then_some(record)
}

/// Whether a session of that name exists already.
pub async fn name_taken(backend: &impl Backend, name: &str) -> Result<bool> {
    let mut filter = state_volume_filter();
    filter.push(format!("{}={name}", labels::NAME));
    Ok(!backend.list_volumes(&filter).await?.is_empty())
}

/// The full record of a session, with every turn, read from its state volume.
pub async fn read_record(
    backend: &impl Backend,
    facts: &VolumeFacts,
) -> Result<Option<SessionRecord>> {
    let Some(bytes) = read_volume_file(backend, facts, RECORD_PATH).await? else {
        return Ok(None);
    };
    Ok(serde_json::from_slice(&bytes).ok())
}

/// Reads a file (a path relative to HOME) from a session's state volume through a
/// short-lived container that is created, never started, with the volume mounted.
pub async fn read_volume_file(
    backend: &impl Backend,
    facts: &VolumeFacts,
    path: &str,
) -> Result<Option<Vec<u8>>> {
    let image = &facts.settings.image;
    if backend.inspect_image(image).await?.is_none() {
        return Err(Error::environment(format!(
            "image '{image}' of session {} is not present",
            facts.session_id
        ))
        .with_hint(format!(
            "build it with `caw-box image build --provider {}`",
            facts.provider
        )));
    }
    let name = names::helper_container(facts.session_id, "");
    let spec = HelperSpec {
        image: image.clone(),
        entrypoint: vec!["true".into()],
        labels: LabelSet::new(facts.session_id, roles::PROBE)
            .provider(facts.provider)
            .finish(),
        mounts: vec![MountSpec::volume(
            crate::session::store::names::state_volume(facts.session_id),
            AGENT_HOME,
        )
        .read_only()],
        network: NetworkPolicy::None,
        ..Default::default()
    };
    match backend.create_helper(&name, &spec).await {
        Ok(_) => {}
        Err(CreateError::NameTaken) => {
            backend.remove_container(&name, true).await?;
            return Err(Error::environment(format!(
                "a stale probe container '{name}' was in the way; removed it"
            ))
            .with_hint("run the command again"));
        }
        Err(e) => return Err(e.into()),
    }
    let downloaded = backend
        .download_file(&name, &format!("{AGENT_HOME}/{path}"))
        .await;
    let _ = backend.remove_container(&name, true).await;
    downloaded
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fork's latest turn is its source's, from before it was made: `gc --older-than`
    /// must go by when the fork was made.
    #[test]
    fn a_fork_is_as_recent_as_its_making_not_its_inherited_turn() {
        let facts = VolumeFacts {
            session_id: Uuid::new_v4(),
            provider: ProviderKind::Codex,
            name: None,
            group: None,
            scope: None,
            created_at: 1000,
            settings: SessionSettings::default(),
            workspace_base: None,
        };
        let inherited = TurnSummary {
            turn: 3,
            status: crate::event::Status::Success,
            started_at: 100,
            ended_at: 200,
            resume_key: String::new(),
            key_confirmed: true,
            cumulative_usage: None,
            total_cost_usd: None,
            owner: None,
            interactive: false,
            home_unlike_image: false,
            keep_warm_secs: None,
            max_cost_usd: None,
        };
        let fork = SessionView {
            facts,
            last: Some(inherited.clone()),
        };
        assert_eq!(fork.last_activity(), 1000);
        let own = TurnSummary {
            ended_at: 2000,
            ..inherited
        };
        let later = SessionView {
            last: Some(own),
            ..fork
        };
        assert_eq!(later.last_activity(), 2000);
    }
}
