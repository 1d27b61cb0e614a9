//! The volume helpers: one hands a session's volumes to the uid:gid its turns run as; one
//! lets an engine that fills a new volume only at a container's start (Podman) fill it.

use super::turn::image_hint;
use crate::backend::Backend;
use crate::backend::{HelperSpec, MountSpec, NetworkPolicy};
use crate::dirs;
use crate::error::{Error, Result};
use crate::provider::{AGENT_HOME, WORKSPACE_DIR};
use crate::session::names::{self, LabelSet};
use crate::session::record::{roles, SessionRecord, WorkspaceMode};

/// Makes the session's volumes belong to the uid:gid this turn runs as, when they belong to
/// someone else (a fresh volume is the image's 1000:1000): a short root helper container
/// with only the capabilities chown needs, no network.
pub(super) async fn ensure_owner(backend: &impl Backend, record: &mut SessionRecord) -> Result<()> {
    let ids = dirs::agent_ids();
    if record.owner.unwrap_or((1000, 1000)) == ids {
        return Ok(());
    }
    let id = record.session_id;
    let mut mounts = vec![MountSpec::volume(names::state_volume(id), AGENT_HOME)];
    let mut paths = vec![AGENT_HOME.to_string()];
    if record.settings.workspace_mode == WorkspaceMode::Copy {
        mounts.push(MountSpec::volume(
            names::workspace_volume(id),
            WORKSPACE_DIR,
        ));
        paths.push(WORKSPACE_DIR.to_string());
    }
    let mut argv = vec!["-R".to_string(), format!("{}:{}", ids.0, ids.1)];
    argv.extend(paths);
    let spec = HelperSpec {
        image: record.settings.image.clone(),
        entrypoint: vec!["chown".into()],
        argv,
        user: Some("0:0".into()),
        labels: LabelSet::new(id, roles::PROBE).finish(),
        mounts,
        network: NetworkPolicy::None,
        drop_all_capabilities: true,
        add_capabilities: vec![
            "CHOWN".into(),
            "DAC_OVERRIDE".into(),
            "DAC_READ_SEARCH".into(),
            "FOWNER".into(),
        ],
        no_new_privileges: true,
        ..Default::default()
    };
    let what = format!("hand session {id}'s volumes to uid {}:{}", ids.0, ids.1);
    run_helper(backend, record, "chown", &spec, &what).await?;
    record.owner = Some(ids);
    Ok(())
}

/// Starts (and removes) a container of the session's image on its new state volume, so an
/// engine that copies the image's HOME into a new volume only when a container first starts
/// (Podman) has done so before caw-box writes files into it.
pub(super) async fn fill_new_home(backend: &impl Backend, record: &SessionRecord) -> Result<()> {
    let id = record.session_id;
    let (uid, gid) = dirs::agent_ids();
    let spec = HelperSpec {
        image: record.settings.image.clone(),
        entrypoint: vec!["true".into()],
        user: Some(format!("{uid}:{gid}")),
        labels: LabelSet::new(id, roles::PROBE).finish(),
        mounts: vec![MountSpec::volume(names::state_volume(id), AGENT_HOME)],
        network: NetworkPolicy::None,
        drop_all_capabilities: true,
        no_new_privileges: true,
        ..Default::default()
    };
    let what = format!("prepare session {id}'s new volume");
    run_helper(backend, record, "fill", &spec, &what).await
}

/// Runs one of the session's volume helpers to its end; a failure says what it was to do.
async fn run_helper(
    backend: &impl Backend,
    record: &SessionRecord,
    suffix: &str,
    spec: &HelperSpec,
    what: &str,
) -> Result<()> {
    let name = names::helper_container(record.session_id, suffix);
    let (code, _, err) = backend
        .run_to_completion(&name, spec)
        .await
        .map_err(|e| image_hint(e, record))?;
    if code != 0 {
        return Err(Error::environment(format!(
            "failed to {what}: {}",
            err.trim()
        )));
    }
    Ok(())
}
