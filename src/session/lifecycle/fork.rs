//! `caw-box fork`: new whole sessions made from a session's checkpoint
//! (`store::checkpoint`), each with its own volumes: its conversation and workspace as they
//! were at the end of the turn forked at, its record holding the turns up to it, and its
//! lineage (`SessionSettings::forked_from`) in its labels, so that its handle alone resumes
//! it from any process and `rm` removes it without touching the session it came from.
//!
//! The vendor's conversation needs no cutting: a checkpoint holds the CLI's whole state
//! under HOME as it was at that turn's end, so every conversation file holds exactly the
//! turns up to it, and the fork resumes it under the same vendor key in its own HOME (no
//! vendor keeps a conversation anywhere else). A bind-mode session's workspace is the
//! person's own directory, which no checkpoint holds: its forks get a copy-mode workspace
//! copied from that directory now.
//!
//! Everything is checked before anything is made (the source exists, runs no turn, has the
//! turn and its checkpoint; the names are free; the image is here), and what a failed fork
//! made is removed again: nothing half-made stays. The source is only read. Not here: a
//! fork's first turn (the caller resumes it as any session), the command's output.

use uuid::Uuid;

use crate::backend::{Backend, TarFile};
use crate::error::{Error, Result};
use crate::provider::AGENT_HOME;
use crate::provider_kind::ProviderKind;
use crate::session::store::checkpoint::{self, Checkpoint};
use crate::session::store::history;
use crate::session::store::names::{self, LabelSet};
use crate::session::store::record::{
    roles, volume_labels, ForkedFrom, SessionRecord, WorkspaceMode, HANDOFF_PATH, RECORD_PATH,
};
use crate::session::store::restore;
use crate::session::store::target::{self, SessionView};

/// At most this many forks in one call (`-n`).
pub const MAX_FORKS: u32 = 8;

/// What to fork, and how many.
#[derive(Debug, Clone, Default)]
pub struct ForkRequest {
    /// The turn whose end the forks start from; `None`: the latest.
    pub at: Option<u32>,
    /// How many forks, 1 to [`MAX_FORKS`].
    pub count: u32,
    /// The forks' name: NAME for one, NAME-1 … NAME-N for more.
    pub name: Option<String>,
    pub group: Option<String>,
    /// `--provider`: forks in this vendor's CLI. Another vendor's than the source's gets
    /// the checkpoint's workspace and a handoff instead of the conversation (see
    /// [`handoff_text`]).
    pub provider: Option<ProviderKind>,
}

impl ForkRequest {
    /// Refuses (exit 2) what no session could satisfy, before anything is looked up: `-n`
    /// outside 1..=[`MAX_FORKS`], `--at 0`.
    pub fn check(&self) -> Result<()> {
        if !(1..=MAX_FORKS).contains(&self.count) {
            return Err(Error::usage(format!(
                "-n takes 1 to {MAX_FORKS} forks, not {}",
                self.count
            )));
        }
        if self.at == Some(0) {
            return Err(Error::usage("--at 0 names no turn: turns count from 1")
                .with_hint("fork the end of a turn: `--at 1` is the state after the first turn"));
        }
        Ok(())
    }
}

/// The forks made.
#[derive(Debug, Clone)]
pub struct Forks {
    pub forked_from: ForkedFrom,
    /// Each fork's record, as its next turn reads it.
    pub sessions: Vec<SessionRecord>,
    /// A bind-mode source: the directory its forks' workspaces were copied from, now (not
    /// as it was at the turn).
    pub workspace_copied_from: Option<String>,
}

/// Makes `request.count` forks of the session `target` names (see the module's docs).
pub async fn fork(backend: &impl Backend, target: &str, request: &ForkRequest) -> Result<Forks> {
    fork_then(backend, target, request, std::future::ready(())).await
}

/// [`fork`], awaiting `between` once a fork of the latest turn has copied the source's
/// volumes and before it checks that no turn of the source began meanwhile: where a test
/// begins one, to see the forks made again from the checkpoints.
#[doc(hidden)]
pub async fn fork_then(
    backend: &impl Backend,
    target: &str,
    request: &ForkRequest,
    between: impl std::future::Future<Output = ()>,
) -> Result<Forks> {
    request.check()?;
    if !backend.capabilities().checkpoints {
        return Err(Error::usage(format!(
            "fork needs checkpoints, which caw-box does not keep on {} yet",
            backend.capabilities().words.engine
        ))
        .with_hint("fork a session of a Docker engine or a Kubernetes cluster (not Podman)"));
    }
    let view = target::resolve_view(backend, target).await?;
    let id = view.facts.session_id;
    // First: it may record a turn whose driver is gone (and its checkpoint).
    refuse_busy(backend, id).await?;
    checkpoint::settle(backend, id).await?;
    // Independent reads, side by side: each is a round trip.
    let (record, checkpoints) =
        tokio::join!(full_record(backend, &view), checkpoint::list(backend, id));
    let (record, checkpoints) = (record?, checkpoints?);
    let last = record.turns.last().map_or(0, |t| t.turn);
    if last == 0 {
        return Err(Error::usage(format!(
            "session {id} has no turn yet: there is nothing to fork"
        ))
        .with_hint(format!("run its first turn: `caw-box resume {id} PROMPT`")));
    }
    let at = request.at.unwrap_or(last);
    if at > last {
        return Err(Error::not_found(format!(
            "session {id} has no turn {at}: its last is turn {last}"
        )));
    }
    let chain = checkpoint::chain_to(&checkpoints, at).ok_or_else(|| {
        let hint = match record.settings.forked_from {
            // A fork keeps no checkpoint of the turns it inherited: its source has them.
            Some(from) if at <= from.turn => format!(
                "session {id} is a fork of {} at its turn {}: fork that session `--at {at}`",
                from.session, from.turn
            ),
            _ => "turns run with `--checkpoints off`, with `--keep-warm` on Kubernetes, by a \
                  caw-box without checkpoints, or pruned by `gc --checkpoints` have none; fork \
                  a turn `caw-box show` lists"
                .to_string(),
        };
        Error::not_found(format!("turn {at} of session {id} has no checkpoint")).with_hint(hint)
    })?;
    let names = fork_names(request.name.as_deref(), request.count);
    refuse_taken(backend, &names).await?;
    let handoff_to = request.provider.filter(|p| *p != record.provider);
    let image = match handoff_to {
        Some(p) => {
            record.settings.check_agent_config(p)?;
            p.default_image()
        }
        None => record.settings.image.clone(),
    };
    if backend.inspect_image(&image).await?.is_none() {
        return Err(Error::missing_image(
            &image,
            handoff_to.unwrap_or(record.provider),
        ));
    }
    let workspace_copied_from = bind_dir(&record)?;
    let handoff = handoff_to.map(|p| (p, image));
    let mut plan = Plan {
        source: &record,
        handoff,
        forked_from: ForkedFrom {
            session: id,
            turn: at,
        },
        chain: &chain,
        group: request.group.as_deref(),
        bind_dir: workspace_copied_from.as_deref(),
        copy: Copy::Layers,
    };
    // The latest turn in the source's own CLI: its volumes are that turn's end, copied in
    // place (Docker) or by the storage's snapshots (a cluster's CSI class, where it has one).
    if at == last && handoff_to.is_none() {
        if backend.capabilities().forks_from_volumes {
            plan.copy = Copy::Volumes;
        } else if let Some(class) = backend.snapshot_class().await? {
            plan.copy = Copy::Snapshots(class);
        }
    }
    let mut sessions = make_all(backend, &plan, names.clone()).await?;
    between.await;
    if plan.copy != Copy::Layers && turn_began(backend, &view).await? {
        // A turn of the source began during the copy: made again from the checkpoints.
        tracing::debug!("a turn of {id} began while it was copied: forking from checkpoints");
        for fork in &sessions {
            crate::session::lifecycle::remove(backend, fork.session_id).await?;
        }
        plan.copy = Copy::Layers;
        sessions = make_all(backend, &plan, names).await?;
    }
    Ok(Forks {
        forked_from: plan.forked_from,
        sessions,
        workspace_copied_from,
    })
}

/// Makes every fork side by side (each is its own volumes and one restore helper). When one
/// fails, every fork of the call goes, made or not: nothing half-made stays.
async fn make_all(
    backend: &impl Backend,
    plan: &Plan<'_>,
    names: Vec<Option<String>>,
) -> Result<Vec<SessionRecord>> {
    let made = futures_util::future::join_all(names.into_iter().map(|name| {
        let fork_id = Uuid::new_v4();
        async move { (fork_id, make_one(backend, plan, fork_id, name).await) }
    }))
    .await;
    if made.iter().all(|(_, outcome)| outcome.is_ok()) {
        return Ok(made.into_iter().filter_map(|(_, m)| m.ok()).collect());
    }
    for (gone, _) in &made {
        if let Err(e) = crate::session::lifecycle::remove(backend, *gone).await {
            tracing::warn!("could not remove the unfinished fork {gone}: {e}");
        }
    }
    let first = made.into_iter().find_map(|(_, outcome)| outcome.err());
    Err(first.expect("a fork failed"))
}

/// A session whose turn runs is refused: a fork is made between turns. A turn that ended
/// with its driver gone is recorded first (its checkpoint with it), as `show` does.
/// Refuses a name of the forks that a session has already.
async fn refuse_taken(backend: &impl Backend, names: &[Option<String>]) -> Result<()> {
    for name in names.iter().flatten() {
        if target::name_taken(backend, name).await? {
            return Err(
                Error::usage(format!("a session named '{name}' exists already"))
                    .with_hint("pick another --name"),
            );
        }
    }
    Ok(())
}

async fn refuse_busy(backend: &impl Backend, id: Uuid) -> Result<()> {
    let busy = |turn: Option<u32>| {
        let turn = turn.map_or("a turn".to_string(), |t| format!("turn {t}"));
        Error::busy(format!(
            "session {id} is running {turn}: a fork is made between turns"
        ))
        .with_hint(format!("wait for it (`caw-box wait {id}`), then fork"))
    };
    if let Some(turn) = crate::session::lifecycle::running_turns(backend)
        .await?
        .get(&id)
    {
        return Err(busy(Some(*turn)));
    }
    match crate::session::lifecycle::orphans::settle(backend, id, false).await? {
        crate::session::lifecycle::orphans::Orphan::Running => Err(busy(None)),
        _ => Ok(()),
    }
}

/// The source's record with every turn (from the host's cache where it agrees with the
/// labels on the latest turn, else from its state volume), its settings as its labels say
/// now (a resume's `--keep-warm` and `--max-cost` included).
async fn full_record(backend: &impl Backend, view: &SessionView) -> Result<SessionRecord> {
    let labelled = view.record();
    let latest = |r: &SessionRecord| r.turns.last().map(|t| (t.turn, t.started_at));
    // (`record()` took its turns from that cache where it agreed: no summary only then.)
    let cached = (!labelled.summary_only)
        .then(|| target::cached_record(view.facts.session_id))
        .flatten()
        .filter(|c| latest(c) == latest(&labelled));
    let stored = match cached {
        Some(c) => Some(c),
        None => target::read_record(backend, &view.facts).await?,
    };
    let mut record = match stored {
        Some(stored)
            if stored.turns.last().map(|t| t.turn) >= labelled.turns.last().map(|t| t.turn) =>
        {
            stored
        }
        _ => labelled.clone(),
    };
    record.name = view.facts.name.clone();
    record.group = view.facts.group.clone();
    record.settings = labelled.settings;
    Ok(record)
}

/// NAME for one fork, NAME-1 … NAME-N for more; none without a name.
fn fork_names(name: Option<&str>, count: u32) -> Vec<Option<String>> {
    (1..=count)
        .map(|i| match (name, count) {
            (None, _) => None,
            (Some(n), 1) => Some(n.to_string()),
            (Some(n), _) => Some(format!("{n}-{i}")),
        })
        .collect()
}

/// A bind-mode source's directory, which its forks' workspaces are copied from.
fn bind_dir(record: &SessionRecord) -> Result<Option<String>> {
    if record.settings.workspace_mode != WorkspaceMode::Bind {
        return Ok(None);
    }
    let dir = record.settings.workspace.clone().unwrap_or_default();
    if !std::path::Path::new(&dir).is_dir() {
        return Err(Error::usage(format!(
            "session {}'s workspace '{dir}' is not a directory here: a fork of a bind-mode \
             session copies it",
            record.session_id
        )));
    }
    Ok(Some(dir))
}

/// What every fork of one call shares.
struct Plan<'a> {
    source: &'a SessionRecord,
    /// `--provider` another vendor's: that vendor and its image.
    handoff: Option<(ProviderKind, String)>,
    forked_from: ForkedFrom,
    chain: &'a [Checkpoint],
    group: Option<&'a str>,
    bind_dir: Option<&'a str>,
    copy: Copy,
}

/// How a fork's volumes get their files.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Copy {
    /// The checkpoints' layers up to the turn, unpacked.
    Layers,
    /// The source's volumes (its latest turn), copied with `cp -a` by the restore helper.
    Volumes,
    /// The source's volumes (its latest turn), each a snapshot of the storage's class (a
    /// claim provisioned from a CSI VolumeSnapshot).
    Snapshots(String),
}

/// Whether a turn of the source runs, ended unrecorded, or was recorded since `before` was
/// read: its volumes may have changed while a fork copied them.
async fn turn_began(backend: &impl Backend, before: &SessionView) -> Result<bool> {
    let id = before.facts.session_id;
    let turns = crate::session::lifecycle::turn_containers(backend).await?;
    if turns.running.contains_key(&id) || turns.orphaned.contains(&id) {
        return Ok(true);
    }
    let now = target::resolve_view(backend, &id.to_string()).await?;
    let latest = |v: &SessionView| v.last.as_ref().map(|l| (l.turn, l.started_at));
    Ok(latest(&now) != latest(before))
}

/// The fork's record as it starts (and, in another vendor's CLI, its handoff so far): the
/// source's, with the turns up to the one forked at and the key after it.
fn fork_record(
    plan: &Plan<'_>,
    fork_id: Uuid,
    name: Option<String>,
) -> (SessionRecord, Option<String>) {
    let source = plan.source;
    let mut record = source.clone();
    record.session_id = fork_id;
    record.name = name;
    record.group = plan.group.map(str::to_string);
    record.created_at = crate::clock::now_secs();
    record.turns.retain(|t| t.turn <= plan.forked_from.turn);
    for t in &mut record.turns {
        t.inherited = true;
    }
    record.summary_only = false;
    record.turn_started = false;
    // The key after the turn forked at: its checkpoint's where a helper took it after the
    // turn, else its turn's record (a checkpoint made before its turn cannot know it).
    let at_turn = record
        .turns
        .iter()
        .find(|t| t.turn == plan.forked_from.turn)
        .map(|t| &t.resume_key);
    if let Some(key) = plan
        .chain
        .last()
        .map(|c| &c.resume_key)
        .filter(|k| !k.is_empty())
        .or(at_turn.filter(|k| !k.is_empty()))
    {
        record.resume_key = key.clone();
    }
    let settings = &mut record.settings;
    settings.forked_from = Some(plan.forked_from);
    settings.fallback_of = None;
    settings.handoff = false;
    if plan.bind_dir.is_some() {
        settings.workspace_mode = WorkspaceMode::Copy;
    }
    // Another vendor's CLI: a conversation of its own, which starts with the handoff.
    let handoff = match &plan.handoff {
        Some((p, image)) => {
            let text = handoff_text(source, plan.forked_from.turn, *p);
            record.provider = *p;
            record.settings.image = image.clone();
            record.settings.model = None;
            record.settings.handoff = true;
            record.turns.clear();
            record.resume_key.clear();
            record.key_confirmed = false;
            record.cli_version = None;
            record.home_unlike_image = false;
            Some(text)
        }
        None => None,
    };
    (record, handoff)
}

/// Makes one fork: its volumes, its restored state and workspace, its record.
async fn make_one(
    backend: &impl Backend,
    plan: &Plan<'_>,
    fork_id: Uuid,
    name: Option<String>,
) -> Result<SessionRecord> {
    let source = plan.source;
    let provider = plan.handoff.as_ref().map_or(source.provider, |(p, _)| *p);
    let (record, handoff) = fork_record(plan, fork_id, name);
    let restores_workspace = checkpoint::keeps_workspace(source.settings.workspace_mode);
    let mut volumes = vec![(
        names::state_volume(source.session_id),
        names::state_volume(fork_id),
        volume_labels(
            fork_id,
            provider,
            record.name.as_deref(),
            record.group.as_deref(),
            record.created_at,
            &record.settings,
        ),
    )];
    if restores_workspace {
        volumes.push((
            names::workspace_volume(source.session_id),
            names::workspace_volume(fork_id),
            LabelSet::new(fork_id, roles::WORKSPACE)
                .provider(provider)
                .finish(),
        ));
    }
    for (from, to, labels) in volumes {
        match &plan.copy {
            Copy::Snapshots(class) => backend.clone_volume(class, &from, &to, labels).await?,
            _ => backend.create_volume(&to, labels).await?,
        }
    }
    if handoff.is_some() {
        // The fork's HOME is its own CLI's image's: the volume is filled from that image
        // first (a first mount), then the restore adds the workspace's base to it.
        write_record(backend, &record, None).await?;
    }
    // The restore runs in the source's image (its tar and owner ids), the rest in the fork's.
    // In the source's CLI it writes the fork's record too, last (no second helper).
    let home = match handoff {
        Some(_) => restore::Restored::BaseOnly,
        None => restore::Restored::WithRecord {
            json: serde_json::to_vec_pretty(&record).expect("records serialize"),
            owner: record.owner_ids(),
        },
    };
    let from = match plan.copy {
        Copy::Layers => restore::RestoreFrom::Checkpoints(plan.chain),
        Copy::Volumes => restore::RestoreFrom::Volumes(source.provider),
        Copy::Snapshots(_) => restore::RestoreFrom::Cloned(source.provider),
    };
    let spec = restore::restore_spec(
        &source.settings.image,
        source.session_id,
        fork_id,
        from,
        home,
        restores_workspace,
    );
    let image = &record.settings.image;
    let (code, _, err) = backend
        .run_to_completion(&names::helper_container(fork_id, "restore"), &spec)
        .await?;
    if code != 0 {
        return Err(Error::environment(format!(
            "restoring turn {} of session {} into fork {fork_id} failed: {}",
            plan.forked_from.turn,
            source.session_id,
            err.trim()
        )));
    }
    if let Some(dir) = plan.bind_dir {
        crate::session::workspace::populate(
            backend,
            fork_id,
            provider,
            image,
            std::path::Path::new(dir),
            record.owner_ids(),
        )
        .await?;
    }
    let (written, summary) = tokio::join!(
        async {
            match handoff {
                Some(text) => {
                    let text = with_files_changed(backend, &record, text).await?;
                    write_record(backend, &record, Some(&text)).await
                }
                None => Ok(()),
            }
        },
        history::write_turn_summary(backend, &record)
    );
    written?;
    summary?;
    history::cache_record(&record);
    Ok(record)
}

/// The handoff a fork in `to`'s CLI gets ahead of its first prompt: what the source's
/// conversation was, up to turn `at` (each turn's prompt and final answer). The files the
/// source changed are added once the fork's workspace is made ([`with_files_changed`]).
pub fn handoff_text(source: &SessionRecord, at: u32, to: ProviderKind) -> String {
    let mut text = format!(
        "# Handoff

You take over from another coding agent ({from}, caw-box session {id}) after its turn {at}. \
Its conversation cannot move to {to}, so here is what it was: its prompts and final answers. \
The workspace is as that agent left it at the end of turn {at}.
",
        from = source.provider,
        id = source.session_id,
    );
    for t in source.turns.iter().filter(|t| t.turn <= at) {
        text.push_str(&format!(
            "
## Turn {n}: prompt

{prompt}

## Turn {n}: answer ({status})

{result}
",
            n = t.turn,
            prompt = t.prompt.trim_end(),
            status = t.status,
            result = t.result.trim_end(),
        ));
    }
    text
}

/// `text` with the files the fork's workspace holds changed since the source's start (a
/// copy-mode workspace's diff), and the line that hands over to the fork's own prompt.
async fn with_files_changed(
    backend: &impl Backend,
    record: &SessionRecord,
    mut text: String,
) -> Result<String> {
    if record.settings.workspace_mode == WorkspaceMode::Copy {
        let facts = target::VolumeFacts::of(record);
        let ids = crate::session::walls::owner::turn_ids(&record.settings);
        let made = crate::session::walls::patch::patch(backend, &facts, ids, false).await?;
        text.push_str("\n## Files it changed\n\n");
        if made.files.is_empty() {
            text.push_str("(none)\n");
        }
        for f in &made.files {
            text.push_str(&format!("- {}\n", f.path));
        }
    }
    text.push_str("\n# Your task\n\n");
    Ok(text)
}

/// The fork's own `session.json` in its HOME: the turns it inherited, its id and names;
/// and its handoff, when it is in another vendor's CLI.
async fn write_record(
    backend: &impl Backend,
    record: &SessionRecord,
    handoff: Option<&str>,
) -> Result<()> {
    let json = serde_json::to_vec_pretty(record).expect("records serialize");
    let id = record.session_id;
    let spec = crate::backend::HelperSpec {
        image: record.settings.image.clone(),
        entrypoint: vec!["true".into()],
        labels: LabelSet::new(id, roles::PROBE).finish(),
        mounts: vec![crate::backend::MountSpec::volume(
            names::state_volume(id),
            AGENT_HOME,
        )],
        network: crate::backend::NetworkPolicy::None,
        ..Default::default()
    };
    crate::session::walls::workspace::with_holder(backend, spec, id, async |name: &str| {
        let mut files = vec![TarFile {
            path: RECORD_PATH,
            contents: &json,
            mode: 0o600,
        }];
        if let Some(text) = handoff {
            files.push(TarFile {
                path: HANDOFF_PATH,
                contents: text.as_bytes(),
                mode: 0o600,
            });
        }
        backend
            .upload_files(name, AGENT_HOME, &files, record.owner_ids())
            .await
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The handoff carries each turn's prompt and answer up to the turn forked at, and says
    /// whose they were.
    #[test]
    fn a_handoff_holds_the_turns_up_to_the_fork() {
        let turn = |n: u32, prompt: &str, result: &str| crate::session::TurnRecord {
            prompt: prompt.into(),
            result: result.into(),
            ..crate::session::TurnRecord::succeeded(n)
        };
        let mut source = crate::session::turn::plan::tests::record("none");
        source.resume_key = "thread".into();
        source.key_confirmed = true;
        source.turns = vec![
            turn(1, "plan the parser\n", "a plan: three steps"),
            turn(2, "write step one", "done: parser.rs"),
        ];
        let text = handoff_text(&source, 1, ProviderKind::Gemini);
        assert!(text.contains("another coding agent (codex"), "{text}");
        assert!(text.contains("cannot move to gemini"), "{text}");
        assert!(
            text.contains("after its turn 1. Its conversation") && !text.contains("  "),
            "one space between words: {text}"
        );
        assert!(
            text.contains("## Turn 1: prompt\n\nplan the parser\n\n## Turn 1: answer (success)\n\na plan: three steps\n"),
            "{text}"
        );
        assert!(
            !text.contains("Turn 2") && !text.contains("parser.rs"),
            "{text}"
        );
    }

    #[test]
    fn one_fork_takes_the_name_more_are_numbered() {
        assert_eq!(fork_names(None, 2), vec![None, None]);
        assert_eq!(fork_names(Some("try"), 1), vec![Some("try".to_string())]);
        assert_eq!(
            fork_names(Some("try"), 3),
            ["try-1", "try-2", "try-3"].map(|n| Some(n.to_string()))
        );
    }
}
