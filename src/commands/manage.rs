//! `ls` (`--tree`: forks under their sources), `logs` and `rm`: finding, inspecting and
//! cleaning up sessions (`show` and `gc`: their own modules), all from Docker itself (labels, volumes, containers), so they work with the host's data
//! directory gone.

use std::time::Duration;

use futures_util::StreamExt;
use serde::Serialize;
use uuid::Uuid;

use super::ago::{ago, warm_left};
use crate::backend::OutputChunk;
use crate::backend::{Backend, ContainerInfo, Engine};
use crate::dirs;
use crate::error::{Error, Result};
use crate::event::Status;
use crate::output;
use crate::provider::ParseContext;
use crate::session::handle::ResumeHandle;
use crate::session::lifecycle::{self, WarmIdle};
use crate::session::names;
use crate::session::orphans::{self, Orphan};
use crate::session::record::{labels, now_secs, SessionRecord};
use crate::session::refusals::Watch;
use crate::session::target::{self, SessionView};

/// One row of `ls`, also its `--json` form.
#[derive(Debug, Serialize)]
struct Row {
    session_id: String,
    name: Option<String>,
    group: Option<String>,
    provider: String,
    turns: u32,
    status: String,
    created_at: u64,
    last_activity: u64,
    resume_handle: Option<String>,
    /// The session's cost so far (turns of unknown cost count for nothing); `null` when no
    /// turn has a known cost.
    cost_usd: Option<f64>,
    /// The same sum over every listed session of this row's group.
    #[serde(skip_serializing_if = "Option::is_none")]
    group_cost_usd: Option<f64>,
    /// `--on-limit fallback`: the session this one took over from.
    #[serde(skip_serializing_if = "Option::is_none")]
    fallback_of: Option<String>,
    /// ... and the sessions that took over from this one.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    fallback_to: Vec<String>,
    /// `caw-box fork`: the session and turn this one was forked from.
    #[serde(skip_serializing_if = "Option::is_none")]
    forked_from: Option<crate::session::ForkedFrom>,
    /// `--keep-warm`: until when (unix seconds) the session's idle container stays for its
    /// next turn; absent when it has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    warm_until: Option<u64>,
    /// Its turn's place in its account's queue (`--per-account`), 1 for the next.
    #[serde(skip_serializing_if = "Option::is_none")]
    queue_position: Option<usize>,
    /// Parked (`--on-limit park`): when its account's usage limit resets (unix seconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    resumes_at: Option<u64>,
}

/// The sessions that took over from `id` after a usage limit (`--on-limit fallback`).
pub(super) fn fallbacks_of(views: &[SessionView], id: uuid::Uuid) -> Vec<String> {
    views
        .iter()
        .filter(|v| v.facts.settings.fallback_of == Some(id))
        .map(|v| v.facts.session_id.to_string())
        .collect()
}

/// Sums `cost_usd` per group into each grouped row's `group_cost_usd`.
fn sum_groups(rows: &mut [Row]) {
    let mut sums: std::collections::HashMap<String, f64> = std::collections::HashMap::new();
    for r in rows.iter() {
        if let (Some(g), Some(c)) = (&r.group, r.cost_usd) {
            *sums.entry(g.clone()).or_default() += c;
        }
    }
    for r in rows.iter_mut() {
        r.group_cost_usd = r.group.as_ref().and_then(|g| sums.get(g).copied());
    }
}

fn row(
    view: &SessionView,
    running: Option<u32>,
    warm: Option<&WarmIdle>,
    scope: &crate::backend::Scope,
) -> Row {
    let f = &view.facts;
    let (turns, status) = match (running, &view.last) {
        (Some(turn), _) => (turn, Status::Running.to_string()),
        (None, Some(last)) => (last.turn, last.status.to_string()),
        (None, None) => (0, "new".to_string()),
    };
    let handle = view
        .last
        .as_ref()
        .filter(|l| !l.resume_key.is_empty())
        .map(|l| {
            ResumeHandle::in_scope(f.provider, f.session_id, l.resume_key.clone(), scope)
                .forked(f.settings.forked_from)
        })
        .map(|h| h.to_json());
    Row {
        session_id: f.session_id.to_string(),
        name: f.name.clone(),
        group: f.group.clone(),
        provider: f.provider.to_string(),
        turns,
        status,
        created_at: f.created_at,
        last_activity: if running.is_some() {
            now_secs()
        } else {
            view.last_activity()
        },
        resume_handle: handle,
        cost_usd: view.last.as_ref().and_then(|l| l.total_cost_usd),
        group_cost_usd: None,
        fallback_of: f.settings.fallback_of.map(|id| id.to_string()),
        fallback_to: Vec::new(),
        forked_from: f.settings.forked_from,
        warm_until: warm.map(|w| w.until(view.last_activity())),
        queue_position: None,
        resumes_at: None,
    }
}

pub async fn ls(json: bool, tree: bool, all: bool, group: Option<String>) -> Result<i32> {
    let rows = rows(all, group).await?;
    if json {
        output::print_json(&rows);
        return Ok(0);
    }
    let order = if tree {
        tree_order(&rows)
    } else {
        (0..rows.len()).map(|i| (i, String::new())).collect()
    };
    let mut table = vec![[
        "ID".to_string(),
        "NAME".to_string(),
        "PROVIDER".to_string(),
        "TURNS".to_string(),
        "STATUS".to_string(),
        "LAST ACTIVITY".to_string(),
        "GROUP".to_string(),
    ]];
    for (i, lead) in order {
        let r = &rows[i];
        let id = match (tree, r.forked_from) {
            (true, Some(from)) if !lead.is_empty() => {
                format!("{lead}{} @{}", &r.session_id[..8], from.turn)
            }
            _ => r.session_id[..8].to_string(),
        };
        table.push([
            id,
            r.name.clone().unwrap_or_else(|| "-".into()),
            r.provider.clone(),
            r.turns.to_string(),
            match r.warm_until {
                Some(until) => format!("{}, {}", r.status, warm_left(until)),
                None => r.status.clone(),
            },
            ago(r.last_activity),
            r.group.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    output::print_table(&table);
    Ok(0)
}

/// `ls --tree`: the rows in the order the tree draws them, each with what goes before its
/// id: a fork under the session it was forked from (when that is listed), the forks of one
/// session by the turn they were forked at, then by age; the rest in `rows`' order.
fn tree_order(rows: &[Row]) -> Vec<(usize, String)> {
    let index: std::collections::HashMap<&str, usize> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| (r.session_id.as_str(), i))
        .collect();
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); rows.len()];
    let mut roots = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let source = r
            .forked_from
            .and_then(|f| index.get(f.session.to_string().as_str()).copied());
        match source {
            Some(p) if p != i => children[p].push(i),
            _ => roots.push(i),
        }
    }
    for c in &mut children {
        c.sort_by_key(|&i| (rows[i].forked_from.map(|f| f.turn), rows[i].created_at));
    }
    fn walk(
        node: usize,
        lead: &str,
        children: &[Vec<usize>],
        seen: &mut [bool],
        out: &mut Vec<(usize, String)>,
    ) {
        let kids = &children[node];
        for (k, &c) in kids.iter().enumerate() {
            if std::mem::replace(&mut seen[c], true) {
                continue;
            }
            let last = k + 1 == kids.len();
            out.push((c, format!("{lead}{}", if last { "└─ " } else { "├─ " })));
            let deeper = format!("{lead}{}", if last { "   " } else { "│  " });
            walk(c, &deeper, children, seen, out);
        }
    }
    let mut seen = vec![false; rows.len()];
    let mut out = Vec::new();
    for r in roots {
        seen[r] = true;
        out.push((r, String::new()));
        walk(r, "", &children, &mut seen, &mut out);
    }
    // (A loop of sources, which no fork can make: listed flat rather than lost.)
    for (i, shown) in seen.iter().enumerate() {
        if !shown {
            out.push((i, String::new()));
        }
    }
    out
}

/// The rows `ls --json` prints, as a value (for the library's `embed`).
pub(crate) async fn ls_rows(all: bool, group: Option<String>) -> Result<serde_json::Value> {
    Ok(serde_json::to_value(rows(all, group).await?).expect("rows serialize"))
}

/// The rows of `ls`, newest activity first.
async fn rows(all: bool, group: Option<String>) -> Result<Vec<Row>> {
    let backend = crate::client::connect_backend().await?;
    let (mut views, mut containers) = tokio::try_join!(
        target::list_sessions(&backend),
        lifecycle::turn_containers(&backend)
    )?;
    // Turns whose driver is gone: recorded first, so the rows tell how they ended.
    let mut recorded = false;
    for id in &containers.orphaned {
        recorded |= settled(&backend, *id).await?;
    }
    if recorded {
        (views, containers) = tokio::try_join!(
            target::list_sessions(&backend),
            lifecycle::turn_containers(&backend)
        )?;
    }
    let queued = crate::session::admission::queued();
    let mut rows: Vec<Row> = views
        .iter()
        .filter(|v| group.is_none() || v.facts.group == group)
        .map(|v| {
            let id = v.facts.session_id;
            let mut r = row(
                v,
                containers.running.get(&id).copied(),
                containers.warm.get(&id),
                &backend.capabilities().scope,
            );
            r.fallback_to = fallbacks_of(&views, v.facts.session_id);
            // A turn waiting for a slot of its account (`--per-account`) has no container
            // yet: its session says so.
            if let Some(q) = queued.iter().find(|q| q.session_id == id) {
                if !containers.running.contains_key(&id) {
                    r.status = q.status().to_string();
                    r.turns = q.turn;
                    r.queue_position = (q.position > 0).then_some(q.position);
                    r.resumes_at = q.resumes_at;
                }
            }
            r
        })
        .collect();
    if all {
        rows.extend(removed_but_cached(&views, group.as_deref()));
    }
    sum_groups(&mut rows);
    rows.sort_by(|a, b| {
        b.last_activity
            .cmp(&a.last_activity)
            .then(b.created_at.cmp(&a.created_at))
    });
    Ok(rows)
}

/// Sessions the host cache knows that Docker no longer has.
fn removed_but_cached(views: &[SessionView], group: Option<&str>) -> Vec<Row> {
    let present: std::collections::HashSet<Uuid> =
        views.iter().map(|v| v.facts.session_id).collect();
    let Ok(dir) = dirs::sessions_dir() else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| std::fs::read(e.ok()?.path()).ok())
        .filter_map(|b| serde_json::from_slice::<SessionRecord>(&b).ok())
        .filter(|r| !present.contains(&r.session_id))
        .filter(|r| group.is_none() || r.group.as_deref() == group)
        .map(|r| Row {
            session_id: r.session_id.to_string(),
            name: r.name.clone(),
            group: r.group.clone(),
            provider: r.provider.to_string(),
            turns: r.turns.last().map_or(0, |t| t.turn),
            status: "removed".to_string(),
            created_at: r.created_at,
            last_activity: r
                .turns
                .last()
                .map_or(r.created_at, |t| t.started_at + t.duration_ms / 1000),
            resume_handle: None,
            cost_usd: r.total_cost_usd(),
            group_cost_usd: None,
            fallback_of: r.settings.fallback_of.map(|id| id.to_string()),
            fallback_to: Vec::new(),
            forked_from: r.settings.forked_from,
            warm_until: None,
            queue_position: None,
            resumes_at: None,
        })
        .collect()
}

/// Records session `id`'s ended turn whose driver is gone, if there is one; whether one
/// was recorded (what the session's view said is then out of date).
pub(super) async fn settled(backend: &Engine, id: Uuid) -> Result<bool> {
    match orphans::settle(backend, id, false).await {
        Ok(o) => Ok(matches!(
            o,
            Orphan::Recorded(..) | Orphan::RecordedElsewhere
        )),
        // What could not be recorded now is read as it is; the next caw-box tries again
        // (a listing or a look at one session never fails for another's turn).
        Err(e) => {
            tracing::warn!("could not record session {id}'s turn whose driver is gone: {e}");
            Ok(false)
        }
    }
}

pub async fn logs(target_arg: &str, turn: Option<u32>, raw: bool, follow: bool) -> Result<i32> {
    let backend = crate::client::connect_backend().await?;
    let mut view = target::resolve_view(&backend, target_arg).await?;
    let id = view.facts.session_id;
    if settled(&backend, id).await? {
        view = target::resolve_view(&backend, &id.to_string()).await?;
    }
    let container = names::turn_container(id);
    let running = backend
        .inspect_container(&container)
        .await?
        .filter(|c| c.running())
        .and_then(|c| Some((c.label(labels::TURN)?.parse::<u32>().ok()?, c)));
    if let Some((running_turn, c)) = running.filter(|(r, _)| follow && turn.is_none_or(|t| t == *r))
    {
        return follow_turn(&backend, &view, &c, running_turn, raw).await;
    }
    let last = view.last.as_ref().map_or(0, |l| l.turn);
    let n = turn.unwrap_or(last);
    if n == 0 {
        return Err(
            Error::usage(format!("session {id} has no finished turn yet")).with_hint(format!(
                "follow the running one with `caw-box logs {id} -f`"
            )),
        );
    }
    let path = format!(
        ".caw-box/turns/{n}.{}.jsonl",
        if raw { "raw" } else { "events" }
    );
    let bytes = target::read_volume_file(&backend, &view.facts, &path)
        .await?
        .ok_or_else(|| {
            Error::not_found(format!("session {id} has no turn {n}"))
                .with_hint(format!("its turns are 1 to {last}"))
        })?;
    output::write_stdout(&bytes);
    Ok(0)
}

/// Follows a running turn's container output, parsed as the turn's own driver does, and
/// its egress refusals from its proxy's log as they come; once it ended, the rest of the
/// turn's recorded log (its result event, and on Podman lines its log stream may not have
/// delivered before it closed) from the state volume: what was said already is not said
/// again.
async fn follow_turn(
    backend: &Engine,
    view: &SessionView,
    found: &ContainerInfo,
    turn: u32,
    raw: bool,
) -> Result<i32> {
    let container = found.name.as_str();
    let provider = view.facts.provider;
    let mcp_servers = view.record().settings.mcp_names();
    let mut parser = provider.adapter().parser(ParseContext {
        previous_cumulative_usage: view.last.as_ref().and_then(|l| l.cumulative_usage),
    });
    let mut stream = backend.follow_logs(container);
    let (tx, mut refusals) = tokio::sync::mpsc::unbounded_channel();
    let ended = view
        .last
        .as_ref()
        .map(|l| std::time::UNIX_EPOCH + Duration::from_secs(l.ended_at));
    let watcher = match raw {
        true => None,
        false => Watch::of(backend, found, ended)
            .await
            .map(|w| tokio::spawn(w.follow(backend.clone(), tx))),
    };
    let mut lines = crate::lines::LineBuffer::default();
    let mut events = Vec::new();
    let mut said = Said::default();
    let mut emit = |said: &mut Said, line: &str| {
        if crate::session::is_marker(line) {
            // The entrypoint's markers of how the CLI ended, for the driver.
            return;
        }
        if raw {
            said.say(line.to_string());
            return;
        }
        events.clear();
        parser.parse_line(line, &mut events);
        crate::agent_config::tag_tool_groups(
            provider.adapter().tool_names(),
            &mcp_servers,
            &mut events,
        );
        for e in &events {
            if let Ok(json) = serde_json::to_string(e) {
                said.say(json);
            }
        }
    };
    loop {
        tokio::select! {
            chunk = stream.next() => match chunk {
                Some(Ok(OutputChunk::Stdout(message))) => lines.feed(&message, |l| emit(&mut said, l)),
                Some(Ok(_)) => {}
                Some(Err(e)) => tracing::debug!("{e}"),
                None => break,
            },
            Some(refused) = refusals.recv() => {
                if let Ok(json) = serde_json::to_string(&refused) {
                    said.say(json);
                }
            }
        }
    }
    lines.finish(|l| emit(&mut said, l));
    if let Some(w) = watcher {
        w.abort();
    }
    while let Ok(refused) = refusals.try_recv() {
        if let Ok(json) = serde_json::to_string(&refused) {
            said.say(json);
        }
    }
    tracing::debug!("turn {turn} of {} ended", view.facts.session_id);
    // A turn whose driver is gone is recorded now, by this process.
    orphans::settle(backend, view.facts.session_id, false).await?;
    // The turn's driver records it, then removes the container.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        let same_turn = backend
            .inspect_container(container)
            .await?
            .is_some_and(|c| c.label(labels::TURN) == Some(turn.to_string().as_str()));
        if !same_turn {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let path = format!(
        ".caw-box/turns/{turn}.{}.jsonl",
        if raw { "raw" } else { "events" }
    );
    match target::read_volume_file(backend, &view.facts, &path).await {
        Ok(Some(recorded)) => {
            let rest: Vec<&[u8]> = recorded
                .split_inclusive(|b| *b == b'\n')
                .filter(|l| {
                    !said.taken(&String::from_utf8_lossy(l.strip_suffix(b"\n").unwrap_or(l)))
                })
                .collect();
            output::write_stdout(&rest.concat());
        }
        Ok(None) => tracing::debug!("turn {turn} was not recorded"),
        Err(e) => tracing::debug!("reading turn {turn}'s record: {e}"),
    }
    Ok(0)
}

/// The lines `logs -f` printed of a running turn, as a multiset: the turn's recorded log
/// holds them too (the refusals where its driver said them, among the CLI's events).
#[derive(Default)]
struct Said(std::collections::HashMap<String, usize>);

impl Said {
    fn say(&mut self, line: String) {
        output::println(&line);
        *self.0.entry(line).or_default() += 1;
    }

    /// Whether `line` was said already (each saying answers once).
    fn taken(&mut self, line: &str) -> bool {
        match self.0.get_mut(line) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }
}

pub async fn rm(targets: Vec<String>, force: bool, group: Option<String>) -> Result<i32> {
    if targets.is_empty() && group.is_none() {
        return Err(Error::usage(
            "say which sessions to remove: TARGET... or --group G",
        ));
    }
    let backend = crate::client::connect_backend().await?;
    let (all, running) = tokio::try_join!(
        target::list_sessions(&backend),
        lifecycle::running_turns(&backend)
    )?;
    // Resolve everything first: one bad TARGET removes nothing.
    let mut chosen: Vec<SessionView> = Vec::new();
    for t in &targets {
        let view = if crate::session::ResumeHandle::looks_like_handle(t) {
            target::resolve_view(&backend, t).await?
        } else {
            target::find_in(all.clone(), t)?
        };
        chosen.push(view);
    }
    if let Some(g) = &group {
        let members: Vec<SessionView> = all
            .iter()
            .filter(|v| v.facts.group.as_deref() == Some(g))
            .cloned()
            .collect();
        if members.is_empty() && targets.is_empty() {
            return Err(Error::not_found(format!("no session is in group '{g}'")));
        }
        chosen.extend(members);
    }
    chosen.sort_by_key(|v| v.facts.session_id);
    chosen.dedup_by_key(|v| v.facts.session_id);
    if !force {
        if let Some(busy) = chosen
            .iter()
            .find(|v| running.contains_key(&v.facts.session_id))
        {
            let id = busy.facts.session_id;
            return Err(lifecycle::running_refusal(id, running[&id]));
        }
    }
    for v in &chosen {
        lifecycle::remove(&backend, v.facts.session_id).await?;
        output::println(&v.facts.session_id.to_string());
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: char, created_at: u64, from: Option<(char, u32)>) -> Row {
        let uuid = |c: char| format!("{}-0000-4000-8000-000000000000", c.to_string().repeat(8));
        Row {
            session_id: uuid(id),
            name: None,
            group: None,
            provider: "codex".into(),
            turns: 1,
            status: "success".into(),
            created_at,
            last_activity: created_at,
            resume_handle: None,
            cost_usd: None,
            group_cost_usd: None,
            fallback_of: None,
            fallback_to: Vec::new(),
            forked_from: from.map(|(c, turn)| crate::session::ForkedFrom {
                session: uuid(c).parse().unwrap(),
                turn,
            }),
            warm_until: None,
            queue_position: None,
            resumes_at: None,
        }
    }

    /// Forks go under their source (by the turn forked at, then age), a fork of a fork one
    /// level deeper; a fork whose source is not listed, and sessions without family, stay
    /// where the listing put them.
    #[test]
    fn the_tree_draws_forks_under_their_source() {
        let rows = [
            row('a', 5, Some(('b', 2))),
            row('b', 1, None),
            row('c', 6, Some(('b', 1))),
            row('d', 7, Some(('a', 3))),
            row('e', 8, None),
            row('f', 9, Some(('9', 1))),
        ];
        let drawn: Vec<String> = tree_order(&rows)
            .into_iter()
            .map(|(i, lead)| format!("{lead}{}", &rows[i].session_id[..1]))
            .collect();
        assert_eq!(drawn, ["b", "├─ c", "└─ a", "   └─ d", "e", "f"]);
    }
}
