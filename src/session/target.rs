//! Finding a session from a TARGET (a handle, an id, a unique id prefix of 4+ characters, or
//! a name), and loading its record, from Docker alone when the host cache is gone.

use std::collections::HashMap;

use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType, Volume};
use uuid::Uuid;

use crate::backend::docker::{CreateError, DockerBackend};
use crate::dirs;
use crate::error::{Error, Result};
use crate::provider::{ProviderKind, AGENT_HOME};
use crate::session::files;
use crate::session::handle::{volume_name, ResumeHandle};
use crate::session::record::{labels, SessionRecord, SessionSettings, RECORD_PATH};

/// What the state volume's labels say about a session.
#[derive(Debug, Clone)]
pub struct VolumeFacts {
    pub session_id: Uuid,
    pub provider: ProviderKind,
    pub name: Option<String>,
    pub group: Option<String>,
    pub created_at: u64,
    pub settings: SessionSettings,
}

impl VolumeFacts {
    /// Reads a state volume's labels; `None` if it is not a caw-box state volume.
    pub fn from_volume(v: &Volume) -> Option<Self> {
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
            created_at: l
                .get(labels::CREATED)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0),
            settings,
        })
    }
}

/// The label filter of every state volume.
pub fn state_volume_filter() -> Vec<String> {
    vec![
        format!("{}=true", labels::MANAGED),
        format!("{}=state", labels::ROLE),
    ]
}

/// Resolves TARGET to a session and loads its record.
pub async fn resolve(backend: &DockerBackend, target: &str) -> Result<SessionRecord> {
    let target = target.trim();
    if target.is_empty() {
        return Err(Error::usage("empty TARGET").with_hint(
            "pass a handle, a session id, a unique id prefix (4+ characters) or a session name",
        ));
    }
    if ResumeHandle::looks_like_handle(target) {
        let handle = ResumeHandle::parse(target)?;
        let facts = facts_for_handle(backend, &handle).await?;
        let mut record = load_record(backend, &facts).await?;
        if record.resume_key.is_empty() && !handle.resume_key.is_empty() {
            record.resume_key = handle.resume_key.clone();
            record.key_confirmed = true;
        }
        return Ok(record);
    }
    let facts = find_by_id_prefix_or_name(backend, target).await?;
    load_record(backend, &facts).await
}

/// Checks a handle against Docker: its volume must exist and carry matching labels.
async fn facts_for_handle(backend: &DockerBackend, handle: &ResumeHandle) -> Result<VolumeFacts> {
    let volume = backend
        .inspect_volume(&handle.volume)
        .await?
        .ok_or_else(|| {
            Error::usage(format!(
                "the handle's state volume '{}' does not exist on this Docker host",
                handle.volume
            ))
            .with_hint("the session was removed, or it lives on another Docker host")
        })?;
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

/// Finds one session by exact id, name, or unique id prefix (one Docker call).
pub async fn find_by_id_prefix_or_name(
    backend: &DockerBackend,
    target: &str,
) -> Result<VolumeFacts> {
    let all: Vec<VolumeFacts> = backend
        .list_volumes(&state_volume_filter())
        .await?
        .iter()
        .filter_map(VolumeFacts::from_volume)
        .collect();
    if let Some(f) = all.iter().find(|f| f.session_id.to_string() == target) {
        return Ok(f.clone());
    }
    if let Some(f) = all.iter().find(|f| f.name.as_deref() == Some(target)) {
        return Ok(f.clone());
    }
    let not_found = || {
        Error::usage(format!("no session matches '{target}'")).with_hint(
            "pass a handle, a session id, a unique id prefix (4+ characters) or a session name",
        )
    };
    if target.len() < 4 {
        return Err(not_found());
    }
    let lower = target.to_ascii_lowercase();
    let matches: Vec<&VolumeFacts> = all
        .iter()
        .filter(|f| f.session_id.to_string().starts_with(&lower))
        .collect();
    match matches.as_slice() {
        [] => Err(not_found()),
        [one] => Ok((*one).clone()),
        many => Err(Error::usage(format!(
            "'{target}' is ambiguous: it matches sessions {}",
            many.iter()
                .map(|f| f.session_id.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .with_hint("give more characters of the id")),
    }
}

/// Whether a session of that name exists already.
pub async fn name_taken(backend: &DockerBackend, name: &str) -> Result<bool> {
    let mut filter = state_volume_filter();
    filter.push(format!("{}={name}", labels::NAME));
    Ok(!backend.list_volumes(&filter).await?.is_empty())
}

/// The session's record: the host cache if present, else read from the state volume.
/// Labels win over the record for what they hold (they are the truth).
pub async fn load_record(backend: &DockerBackend, facts: &VolumeFacts) -> Result<SessionRecord> {
    let cached = dirs::sessions_dir()
        .ok()
        .map(|d| d.join(format!("{}.json", facts.session_id)))
        .and_then(|p| std::fs::read(p).ok())
        .and_then(|b| serde_json::from_slice::<SessionRecord>(&b).ok());
    let record = match cached {
        Some(r) => Some(r),
        None => read_record_from_volume(backend, facts).await?,
    };
    let mut record = record.unwrap_or_else(|| SessionRecord {
        version: 1,
        session_id: facts.session_id,
        provider: facts.provider,
        name: None,
        group: None,
        resume_key: String::new(),
        key_confirmed: false,
        created_at: facts.created_at,
        settings: facts.settings.clone(),
        turns: Vec::new(),
    });
    record.session_id = facts.session_id;
    record.provider = facts.provider;
    record.name = facts.name.clone();
    record.group = facts.group.clone();
    record.created_at = facts.created_at;
    record.settings = facts.settings.clone();
    Ok(record)
}

/// Reads the record file from the state volume through a short-lived container that is
/// created (never started) with the volume mounted.
async fn read_record_from_volume(
    backend: &DockerBackend,
    facts: &VolumeFacts,
) -> Result<Option<SessionRecord>> {
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
    let name = format!("caw-box-probe-{}-{}", facts.session_id, std::process::id());
    let body = ContainerCreateBody {
        image: Some(image.clone()),
        entrypoint: Some(vec!["true".into()]),
        cmd: Some(vec![]),
        network_disabled: Some(true),
        labels: Some(crate::session::record::with_extra_labels(HashMap::from([
            (labels::MANAGED.to_string(), "true".to_string()),
            (labels::SESSION.to_string(), facts.session_id.to_string()),
            (labels::PROVIDER.to_string(), facts.provider.to_string()),
            (labels::ROLE.to_string(), "probe".to_string()),
        ]))),
        host_config: Some(HostConfig {
            mounts: Some(vec![Mount {
                target: Some(AGENT_HOME.to_string()),
                source: Some(volume_name(facts.session_id)),
                typ: Some(MountType::VOLUME),
                read_only: Some(true),
                ..Default::default()
            }]),
            network_mode: Some("none".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    match backend.create_container(&name, body).await {
        Ok(_) => {}
        Err(CreateError::NameTaken) => {
            backend.remove_container(&name, true).await?;
            return Err(Error::environment(format!(
                "a stale probe container '{name}' was in the way; removed it"
            ))
            .with_hint("run the command again"));
        }
        Err(CreateError::Other(e)) => return Err(e),
    }
    let downloaded = backend
        .download_tar(&name, &format!("{AGENT_HOME}/{RECORD_PATH}"))
        .await;
    let _ = backend.remove_container(&name, true).await;
    let Some(tar) = downloaded? else {
        return Ok(None);
    };
    let Some(bytes) = files::first_file(&tar)? else {
        return Ok(None);
    };
    Ok(serde_json::from_slice(&bytes).ok())
}
