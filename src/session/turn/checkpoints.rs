//! A turn's checkpoint, around the turn: a cold turn's volume made before it (its own
//! container writes it), a warm turn's helper armed beside it, the checkpoint a warm turn
//! left behind waited for, and a volume no turn used dropped (`store::checkpoint`,
//! `store::behind`).

use crate::backend::Backend;
use crate::error::Result;
use crate::session::store::record::SessionRecord;

/// Waits for the checkpoint a warm turn left behind it (`checkpoint::settle`), where the
/// backend takes those.
pub(super) async fn settle_behind(backend: &impl Backend, session_id: uuid::Uuid) -> Result<()> {
    if !backend.capabilities().warm_checkpoints {
        return Ok(());
    }
    crate::session::store::checkpoint::settle(backend, session_id).await
}

/// Arms a warm turn's checkpoint beside the turn (`checkpoint::arm`), where the backend takes
/// those behind the turn and the session keeps them, into `arming`.
pub(super) fn arm_checkpoint(
    backend: &impl Backend,
    record: &SessionRecord,
    turn: u32,
    warm_for: Option<u64>,
    arming: &crate::session::store::behind::Arming,
) {
    let caps = backend.capabilities();
    if warm_for.is_none()
        || !caps.checkpoints
        || !caps.warm_checkpoints
        || record.settings.no_checkpoints
    {
        return;
    }
    let (backend, source) = (backend.clone(), SourceOf::new(record));
    let task = tokio::spawn(async move {
        crate::session::store::behind::arm(&backend, &source.source(), turn).await
    });
    arming.start(task);
}

/// What a checkpoint made beside the turn needs of its record, owned (the record is the
/// rest's to change meanwhile); its resume key is the turn record's.
struct SourceOf {
    session_id: uuid::Uuid,
    provider: crate::provider::ProviderKind,
    image: String,
    workspace_mode: crate::session::store::record::WorkspaceMode,
}

impl SourceOf {
    fn new(record: &SessionRecord) -> SourceOf {
        SourceOf {
            session_id: record.session_id,
            provider: record.provider,
            image: record.settings.image.clone(),
            workspace_mode: record.settings.workspace_mode,
        }
    }

    fn source(&self) -> crate::session::checkpoint::Source<'_> {
        crate::session::checkpoint::Source {
            session_id: self.session_id,
            provider: self.provider,
            image: &self.image,
            workspace_mode: self.workspace_mode,
            resume_key: "",
        }
    }
}

/// The checkpoint volume a cold turn's own container writes once its CLI has ended
/// (`checkpoint::prepare`), made beside the rest of what the turn needs first. `None`: the
/// backend keeps none, the session keeps none (`--checkpoints off`), the turn runs warm (its container was made before), or it could not
/// be made (a helper takes the checkpoint after the turn then).
pub(super) fn prepare_checkpoint<'a>(
    backend: &'a impl Backend,
    record: &SessionRecord,
    turn: u32,
    warm_for: Option<u64>,
) -> impl std::future::Future<Output = Option<crate::session::checkpoint::InTurn>> + 'a {
    let wanted =
        backend.capabilities().checkpoints && !record.settings.no_checkpoints && warm_for.is_none();
    let source = SourceOf::new(record);
    async move {
        if !wanted {
            return None;
        }
        crate::session::checkpoint::prepare(backend, &source.source(), turn)
            .await
            .inspect_err(|e| tracing::debug!("no checkpoint volume before turn {turn}: {e}"))
            .ok()
    }
}

/// The checkpoint volume made for a turn whose container was never made: no turn ran, so
/// nothing of it is kept (a refused turn leaves nothing behind). Not when the turn was
/// refused as busy: the volume may be the racing winner's (both saw none and made it).
pub(super) async fn drop_unused_checkpoint<T>(
    backend: &impl Backend,
    volume: Option<&str>,
    outcome: &Result<T>,
) {
    let busy = matches!(outcome, Err(e) if e.kind == crate::error::ErrorKind::Busy);
    if let Some(v) = volume.filter(|_| !busy) {
        if let Err(e) = backend.remove_volume(v).await {
            tracing::warn!("could not remove the unused checkpoint volume '{v}': {e}");
        }
    }
}
