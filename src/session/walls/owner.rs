//! Who a session's turns run as ([`turn_ids`], decided here and nowhere else), and the
//! volume helpers: one hands a session's volumes to that uid:gid; one lets an engine that
//! fills a new volume only at a container's start (Podman) fill it. Not the hardening of
//! the containers themselves (the backends' specs).

use std::os::unix::fs::MetadataExt;

use crate::backend::Backend;
use crate::backend::{HelperSpec, MountSpec, NetworkPolicy, TurnSpec};
use crate::dirs;
use crate::error::{Error, Result};
use crate::provider::{AGENT_HOME, WORKSPACE_DIR};
use crate::session::store::names::{self, LabelSet};
use crate::session::store::record::{roles, SessionRecord, SessionSettings, WorkspaceMode};
use crate::session::turn::image_hint;

pub use crate::session::store::record::IMAGE_IDS;

/// The uid:gid a turn of a session with `settings` runs as, and so whom its volumes, its
/// runtime files and what it creates in the workspace belong to. Decided once per turn (the
/// turn's driver calls this at its start, [`ensure_owner`] keeps it in the record) and by
/// every other caw-box that reaches into the session's files, by this one rule:
/// - caw-box run by a user: that user's (files the agent creates are theirs);
/// - run by root, a bound workspace: the workspace's owner, root included (a CI job's
///   checkout as root): the agent can write it, and what it creates belongs to that owner;
///   uid 0 in the container keeps the turn's hardening (no capabilities, so no bypass of
///   file permissions; no-new-privileges; a read-only root);
/// - run by root otherwise (a copied workspace, none): the image's `agent`, 1000.
pub fn turn_ids(settings: &SessionSettings) -> (u32, u32) {
    if !dirs::is_root() {
        return dirs::host_ids();
    }
    match bound_workspace(settings).map(std::fs::metadata) {
        Some(Ok(meta)) => (meta.uid(), meta.gid()),
        _ => IMAGE_IDS,
    }
}

fn bound_workspace(settings: &SessionSettings) -> Option<&str> {
    match settings.workspace_mode {
        WorkspaceMode::Bind => settings.workspace.as_deref(),
        WorkspaceMode::Copy | WorkspaceMode::None => None,
    }
}

/// One line for the user, before a turn, when its agent could not write the session's
/// bound workspace: the turn runs, but may only read it.
pub fn workspace_warning(settings: &SessionSettings) -> Option<String> {
    let dir = bound_workspace(settings)?;
    let meta = std::fs::metadata(dir).ok()?;
    unwritable(
        dir,
        (meta.uid(), meta.gid()),
        meta.mode() & 0o7777,
        turn_ids(settings),
    )
}

/// [`workspace_warning`] of a directory `dir` of `owner` with `mode`, for an agent of `ids`.
fn unwritable(dir: &str, owner: (u32, u32), mode: u32, ids: (u32, u32)) -> Option<String> {
    if writable_by(owner, mode, ids) {
        return None;
    }
    let (uid, gid) = ids;
    let what_to_do = if owner.0 == uid {
        format!("make it writable for its owner (`chmod u+rwx {dir}`)")
    } else {
        format!(
            "run caw-box as its owner (uid {}) or as root, or let uid {uid} write it (e.g. `chown -R {uid} {dir}`)",
            owner.0
        )
    };
    Some(format!(
        "the agent runs as uid {uid}:{gid} and cannot write the workspace {dir} (owner {}:{}, mode {mode:o}): this turn may only read it; {what_to_do}",
        owner.0, owner.1
    ))
}

/// Whether a process of `ids`, without capabilities (as in a turn's container: no
/// supplementary groups, no bypass of file permissions, uid 0 included), may create files
/// in a directory of `owner` with `mode`.
fn writable_by(owner: (u32, u32), mode: u32, ids: (u32, u32)) -> bool {
    let bits = if ids.0 == owner.0 {
        mode >> 6
    } else if ids.1 == owner.1 {
        mode >> 3
    } else {
        mode
    };
    bits & 0o3 == 0o3
}

/// Makes the session's volumes belong to `ids`, the uid:gid this turn runs as
/// ([`turn_ids`]), when they belong to someone else (a fresh volume is [`IMAGE_IDS`]'): a
/// short root helper container with only the capabilities chown needs, no network.
pub(in crate::session) async fn ensure_owner(
    backend: &impl Backend,
    record: &mut SessionRecord,
    ids: (u32, u32),
) -> Result<()> {
    if record.owner_ids() == ids {
        return Ok(());
    }
    let id = record.session_id;
    let (mounts, paths) = session_volumes(record);
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

/// Where the backend can, the turn's own container hands the session's volumes to `ids`
/// ([`TurnSpec::hand_over`]) instead of a helper before it: `true` when `spec` now does, and
/// the record says the volumes are `ids`' (the caller puts back `previous` when the turn
/// failed before its container could). `false`: [`ensure_owner`] is still to run.
pub(in crate::session) fn hand_over_in_turn(
    backend: &impl Backend,
    record: &mut SessionRecord,
    ids: (u32, u32),
    spec: &mut TurnSpec,
) -> bool {
    if record.owner_ids() == ids || !backend.capabilities().hands_over_to(ids) {
        return false;
    }
    spec.hand_over = session_volumes(record).1;
    record.owner = Some(ids);
    true
}

/// The session's volumes whose owner is the turn's user, and where a turn mounts them.
fn session_volumes(record: &SessionRecord) -> (Vec<MountSpec>, Vec<String>) {
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
    (mounts, paths)
}

/// Fills the session's new state volume with the image's HOME before caw-box writes files
/// into it, where the engine does so only when a container first starts
/// ([`Capabilities::fill_volume_first`](crate::backend::Capabilities::fill_volume_first):
/// Podman), by running a container of the session's image on it to its end. Elsewhere the
/// backend fills it anyway: nothing to do.
pub(in crate::session) async fn fill_new_home(
    backend: &impl Backend,
    record: &SessionRecord,
    (uid, gid): (u32, u32),
) -> Result<()> {
    if !backend.capabilities().fill_volume_first {
        return Ok(());
    }
    let id = record.session_id;
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
    let name = names::helper_container(id, "fill");
    let (code, _, err) = backend
        .run_to_completion(&name, &spec)
        .await
        .map_err(|e| image_hint(e, record))?;
    if code != 0 {
        return Err(Error::environment(format!(
            "failed to prepare session {id}'s new volume: {}",
            err.trim()
        )));
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// As in a turn's container: the owner's bits for the owner (uid 0 too: no capability
    /// bypasses them), else the group's, else the others'; creating needs write and search.
    #[test]
    fn who_may_write_follows_the_mode_bits_alone() {
        assert!(writable_by((0, 0), 0o755, (0, 0)));
        assert!(!writable_by((0, 0), 0o755, (1000, 1000)));
        assert!(writable_by((0, 0), 0o777, (1000, 1000)));
        assert!(!writable_by((0, 0), 0o555, (0, 0)));
        assert!(!writable_by((0, 0), 0o655, (0, 0)), "no search bit");
        assert!(writable_by((5, 7), 0o770, (1000, 7)));
        assert!(!writable_by((5, 7), 0o750, (1000, 7)));
        assert!(writable_by((1000, 5), 0o700, (1000, 1000)));
    }

    #[test]
    fn an_unwritable_workspace_is_one_line_with_what_to_do() {
        assert_eq!(unwritable("/w", (0, 0), 0o777, (1000, 1000)), None);
        let other = unwritable("/w", (0, 0), 0o755, (1000, 1000)).unwrap();
        assert_eq!(
            other,
            "the agent runs as uid 1000:1000 and cannot write the workspace /w (owner 0:0, mode \
             755): this turn may only read it; run caw-box as its owner (uid 0) or as root, or \
             let uid 1000 write it (e.g. `chown -R 1000 /w`)"
        );
        let own = unwritable("/w", (0, 0), 0o555, (0, 0)).unwrap();
        assert!(
            own.ends_with("make it writable for its owner (`chmod u+rwx /w`)"),
            "{own}"
        );
        assert!(!own.contains('\n'));
    }

    /// Root runs the agent as the bound workspace's owner (root included); otherwise (copy
    /// mode, no workspace) as the image's user. Anyone else runs it as themselves.
    #[test]
    fn turns_run_as_the_workspace_owner_under_root() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = SessionSettings {
            workspace: Some(dir.path().to_string_lossy().into_owned()),
            ..Default::default()
        };
        if !dirs::is_root() {
            assert_eq!(turn_ids(&s), dirs::host_ids());
            return;
        }
        assert_eq!(turn_ids(&s), (0, 0));
        std::os::unix::fs::chown(dir.path(), Some(4242), Some(4343)).unwrap();
        assert_eq!(turn_ids(&s), (4242, 4343));
        s.workspace_mode = WorkspaceMode::Copy;
        assert_eq!(turn_ids(&s), IMAGE_IDS);
        s.workspace_mode = WorkspaceMode::Bind;
        s.workspace = None;
        assert_eq!(turn_ids(&s), IMAGE_IDS);
    }
}
