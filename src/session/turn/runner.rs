//! Runs one turn of a session in a fresh container (pod): the plan (`plan.rs`, what the
//! provider adapter and the session's settings ask for) realised through the backend.
//!
//! The container name `caw-box-<session_id>` is the session's lock: the backend refuses a
//! second container of the same name atomically, so two racing turns cannot both start. Whatever
//! way the turn ends (answer, CLI crash, timeout, Ctrl-C), the container is removed and the
//! session's record in its state volume is brought up to date, so it stays resumable.
//!
//! This file is the turn's life, from its plan to its container's removal; the jobs it
//! hands out live beside it: the plan (`plan.rs`), the per-turn runtime dir (`runtime.rs`), the egress proxy
//! (`egress.rs`), the ownership helper (`owner.rs`), driver liveness (`liveness.rs`), the
//! two drivers (`headless.rs`, `interactive.rs`), what they share (`turn.rs`) and the
//! stored history with the record hand-off (`history.rs`). What other modules use is
//! re-exported here.

use std::borrow::Cow;

use crate::backend::{Backend, CreateError, TurnSpec};
use crate::error::{Error, Result};
use crate::event::{Event, Status, TurnResult};
use crate::session::broker::Broker;
use crate::session::lifecycle::liveness::{driver_is_gone, remove_abandoned_turns};
use crate::session::lifecycle::orphans::Orphan;
use crate::session::store::inflight::InFlight;
use crate::session::store::record::{labels, SessionRecord};
use crate::session::turn::checkpoints::{
    arm_checkpoint, drop_unused_checkpoint, prepare_checkpoint, settle_behind,
};
use crate::session::turn::plan::{plan_turn, TurnPlan};
use crate::session::turn::{admission, admit, park};
use crate::session::turn::{busy, image_hint, Interrupts, TurnContext, STOP_GRACE};
use crate::session::walls::egress::Egress;
use crate::session::walls::owner::{ensure_owner, fill_new_home, hand_over_in_turn};
use crate::session::walls::quarantine::Guard;

pub use crate::session::store::history::cache_record;
pub use crate::session::turn::ended::model_host;
pub use crate::session::turn::plan::DEFAULT_PIDS_LIMIT;
pub use crate::session::turn::prompt::{check_prompt_size, MAX_TURN_PROMPT_BYTES};
pub use crate::session::turn::runtime::{RUNTIME_MOUNT, RUN_DIR as RUNTIME_DIR, STOP_REQUEST};
pub use crate::session::turn::{
    container_name, handle_of, image_hint_for, leave_signals_to_the_caller, turn_error,
    TurnOptions, DEFAULT_CONNECT_TIMEOUT,
};

/// Runs one turn of `record`'s session and updates `record` with it.
///
/// `sink` sees every unified event as it happens, ending with the `result` event.
/// Returns the turn's result; an `Err` means the turn could not be run at all (bad
/// environment, busy session), in which case nothing about the session changed.
///
/// A parking session's turn (`--on-limit park`) that the account's usage limit stopped
/// parks the account and hands its place on to the session's next turn, which the caller
/// sends ([`crate::Session::send`] does, with [`park::CONTINUE_PROMPT`]).
pub async fn run_turn(
    backend: &impl Backend,
    record: &mut SessionRecord,
    options: &TurnOptions,
    sink: &mut (dyn FnMut(&Event) + Send),
) -> Result<TurnResult> {
    // Before anything of the turn exists; `run` and `resume` refused it sooner (before a new
    // session's volume), a library caller's turn is refused here.
    if !options.interactive {
        check_prompt_size(options.prompt.len())?;
    }
    record.settings.check_agent_config(record.provider)?;
    settle_orphan(backend, record).await?;
    // After the orphan: its cost counts.
    crate::session::turn::budget::check(record)?;
    // Held until the turn is recorded: its account's other turns wait meanwhile.
    let mut admitted = admit::for_turn(backend, record).await?;
    let handed = with_handoff(backend, record, options).await?;
    let options = handed.as_ref().unwrap_or(options);
    let mut interrupts = Interrupts::install()?;
    let plan = plan_turn(backend, record, options).await?;
    // Noted for whoever comes next if this process goes before the turn is recorded.
    let in_flight = InFlight::note(record.session_id, plan.turn, &options.prompt);
    let result = realise(backend, record, options, plan, &mut interrupts, sink).await;
    if let (Ok(r), Some(admitted)) = (&result, admitted.as_mut()) {
        if let Err(e) = park_after_limit(record, r, admitted) {
            tracing::warn!("could not park the account after a usage limit: {e}");
        }
    }
    if result.is_err() && record.turn_started {
        // It began and is not recorded: the note stays, for the turn to be.
        in_flight.keep();
    }
    if let Some(admitted) = admitted {
        admitted.release().await;
    }
    result
}

/// A fork in another vendor's CLI (`fork --provider`): until its CLI confirmed a
/// conversation, each headless turn's prompt comes after the handoff its HOME holds (cut
/// from the front, its oldest turns, where both would be over the prompt cap). `None`: the
/// turn's options as given.
async fn with_handoff(
    backend: &impl Backend,
    record: &SessionRecord,
    options: &TurnOptions,
) -> Result<Option<TurnOptions>> {
    let first_conversation_turn = !record.key_confirmed || record.resume_key.is_empty();
    if !record.settings.handoff || options.interactive || !first_conversation_turn {
        return Ok(None);
    }
    let facts = crate::session::store::target::VolumeFacts::of(record);
    let path = crate::session::store::record::HANDOFF_PATH;
    let Some(bytes) =
        crate::session::store::target::read_volume_file(backend, &facts, path).await?
    else {
        tracing::warn!("session {} has no handoff in its HOME", record.session_id);
        return Ok(None);
    };
    let handoff = String::from_utf8_lossy(&bytes);
    let room = MAX_TURN_PROMPT_BYTES.saturating_sub(options.prompt.len());
    let handoff = if handoff.len() <= room {
        handoff.into_owned()
    } else {
        let cut = "(the handoff's start is left out: it and the prompt were over the prompt cap)\n";
        let mut from = handoff.len() - room.saturating_sub(cut.len());
        while !handoff.is_char_boundary(from) {
            from += 1;
        }
        format!("{cut}{}", &handoff[from..])
    };
    let mut options = options.clone();
    options.prompt = format!("{handoff}{}", options.prompt);
    Ok(Some(options))
}

/// Records this session's turn whose driver is gone, if one ended, so that this turn comes
/// after it (its answer is in the conversation the CLI resumes, and in the record). One
/// that still runs keeps the session busy: `caw-box wait` records it when it ends.
async fn settle_orphan(backend: &impl Backend, record: &mut SessionRecord) -> Result<()> {
    let id = record.session_id;
    let stored = match crate::session::lifecycle::orphans::settle(backend, id, false).await? {
        Orphan::None => return Ok(()),
        Orphan::Running => {
            let turn = record.next_turn().to_string();
            return Err(busy(record, &turn).with_hint(format!(
                "its caw-box is gone: `caw-box wait {id}` records it when it ends, \
                 or `caw-box stop {id}` ends it"
            )));
        }
        Orphan::Recorded(recorded) => recorded.0,
        Orphan::RecordedElsewhere => {
            crate::session::store::target::resolve(backend, &id.to_string()).await?
        }
    };
    record.turns = stored.turns;
    record.resume_key = stored.resume_key;
    record.key_confirmed = stored.key_confirmed;
    record.summary_only = stored.summary_only;
    record.owner = record.owner.or(stored.owner);
    Ok(())
}

/// `caw-box warm`: makes `record`'s session's warm container ahead of its next turn, idle
/// for `secs` after each turn (else the session's `--keep-warm`): planned as the next
/// headless turn would be, with what it needs made first (its state volume filled and
/// handed to its user, its broker's network), but no turn run. `false`: one made with the
/// same settings was warm already, and stays. Refused (exit 2) where the next turn would
/// run cold anyway (say why).
pub async fn warm_ahead(
    backend: &impl Backend,
    record: &mut SessionRecord,
    secs: Option<u64>,
) -> Result<bool> {
    let whose = format!("session {}'s turns", record.session_id);
    warm_ahead_with(backend, record, secs, &[], &whose).await
}

/// [`warm_ahead`], with `labels` added to the container's (a pool's box: its pool), and
/// `whose` naming the turns in a refusal.
pub async fn warm_ahead_with(
    backend: &impl Backend,
    record: &mut SessionRecord,
    secs: Option<u64>,
    labels: &[(String, String)],
    whose: &str,
) -> Result<bool> {
    record.settings.check_agent_config(record.provider)?;
    if secs.is_some() {
        record.settings.keep_warm_secs = secs;
    }
    let mut options = TurnOptions::default();
    let p = record.provider;
    if crate::auth::store::Store::open()?
        .manifest(p)
        .items
        .is_empty()
    {
        // Nothing collected: the next turn brings its key (`--env`), so it is planned so,
        // with a stand-in that reaches no container (an idle one gets no runtime file and
        // no turn environment).
        let var = p.endpoint_key_vars()[0];
        options
            .env
            .push((var.to_string(), "warm-ahead".to_string()));
    }
    let plan = plan_turn(backend, record, &options).await?;
    let Some(secs) = plan.warm_for else {
        return Err(crate::session::turn::warm::runs_cold(
            backend,
            record,
            plan.egress.as_ref().is_some_and(Egress::goes_with_turn),
            plan.spec.broker.is_some(),
            whose,
        ));
    };
    if plan.fill_home {
        fill_new_home(backend, record, plan.ids).await?;
    }
    ensure_owner(backend, record, plan.ids).await?;
    // The network the container goes on, and a proxy there (released: the turns lease it).
    if let Some(e) = &plan.egress {
        open_egress(backend, record, e).await?;
        e.close(backend).await;
    }
    let mut spec = plan.spec;
    spec.labels.extend(labels.iter().cloned());
    if let Some(b) = &plan.broker {
        b.prepare(backend).await?;
        // Where the broker stands in for hosts, its address is in the container's hosts.
        if let Some(i) = b.intercept() {
            let started = b.start(backend).await;
            let address = match started {
                Ok(()) => b.address(backend).await,
                Err(e) => Err(e),
            };
            b.stop(backend).await;
            let Some(address) = address? else {
                return Err(Error::environment(format!(
                    "the credential broker {} did not start",
                    b.container
                )));
            };
            spec.extra_hosts = i.hosts.iter().map(|h| format!("{h}:{address}")).collect();
        }
    }
    let (rec, name): (&SessionRecord, &str) = (record, &plan.name);
    let create =
        move |idle: TurnSpec| async move { create_turn_container(backend, rec, name, &idle).await };
    crate::session::turn::warm::make_ahead(backend, name, &spec, secs, create).await
}

/// Runs a planned turn: what it needs made first (its state volume filled and handed to
/// its user, its broker, its egress), its container and driver, and what comes after.
/// The session's proxies and brokers of turns whose caw-box was killed, once this turn
/// holds the lock.
async fn remove_leftovers(
    backend: &impl Backend,
    record: &SessionRecord,
    egress: Option<&Egress>,
    broker: Option<&Broker>,
) {
    if let Some(e) = egress {
        e.remove_leftovers(backend, record).await;
    }
    if let Some(b) = broker {
        b.remove_leftovers(backend).await;
    }
}

async fn realise(
    backend: &impl Backend,
    record: &mut SessionRecord,
    options: &TurnOptions,
    plan: TurnPlan,
    interrupts: &mut Interrupts,
    sink: &mut (dyn FnMut(&Event) + Send),
) -> Result<TurnResult> {
    let TurnPlan {
        name,
        turn,
        ids,
        spec,
        payload,
        broker,
        egress,
        fill_home,
        home_files,
        guard,
        writes_back,
        warm_for,
    } = plan;
    // A cold turn's container hands the volumes to its user itself where it can (a warm
    // container would keep what that takes for the turns it runs later).
    let (mut spec, owner_before) = (spec, record.owner);
    let handed_in_turn = warm_for.is_none() && hand_over_in_turn(backend, record, ids, &mut spec);
    let in_turn = prepare_checkpoint(backend, record, turn, warm_for);
    let (first, in_turn) = tokio::join!(
        make_first(
            backend,
            record,
            ids,
            fill_home,
            broker.as_ref(),
            egress.as_ref(),
        ),
        in_turn
    );
    let prepared = in_turn.as_ref().map(|c| c.volume.clone());
    if let Err(e) = first {
        record.owner = owner_before;
        drop_unused_checkpoint(backend, prepared.as_deref(), &Ok(())).await;
        return Err(e);
    }
    if let Some(c) = in_turn {
        spec.checkpoint = c.mounts;
        spec.env.extend(c.env);
    }
    // What the CLI refreshed of its credential files, read back before its container goes.
    let home_out = std::sync::Mutex::new(None);
    let mut container_made = false;
    // The broker starts beside the agent's container, off the turn's critical path: the
    // runtime files (and so the CLI) wait for it on the agent's stdin, not its creation.
    let (ready_tx, ready_rx) = tokio::sync::watch::channel(broker.is_none().then_some(true));
    // A broker in the turn's own unit starts with it: handed its keys once that runs.
    let (turn_made, mut turn_made_rx) = tokio::sync::watch::channel(false);
    let broker_starts = start_broker(backend, broker.as_ref(), &mut turn_made_rx, &ready_tx);
    let arming = crate::session::store::behind::Arming::default();
    let main = async {
        let spec = with_intercepts(backend, broker.as_ref(), &spec, &ready_rx).await?;
        let make = make_container(backend, record, &name, &spec, warm_for);
        let idle_goes = async {
            // A turn that starts cold when the session kept one warm: it goes.
            if warm_for.is_none() && record.settings.keep_warm_secs.is_some() {
                let _ = backend.remove_warm(&name).await;
            }
        };
        // What the session's turns removed from outside (`docker rm -f`) left: their scratch.
        let scratch_goes =
            crate::session::turn::runtime::remove_unused(backend, Some(record.session_id));
        let abandoned_go = remove_abandoned_turns(backend, &name);
        let (created, (), (), _) = tokio::join!(make, abandoned_go, idle_goes, scratch_goes);
        let _ = turn_made.send(created.is_ok());
        // (Dropped on failure, which frees the start of a broker in it from its wait.)
        drop(turn_made);
        created?;
        container_made = true;
        // Under the lock now: a checkpoint left behind the last (warm) turn ends first.
        settle_behind(backend, record.session_id).await?;
        arm_checkpoint(backend, record, turn, warm_for, &arming);
        remove_leftovers(backend, record, egress.as_ref(), broker.as_ref()).await;
        // From here on the container exists: every path out must remove it.
        let ctx = TurnContext {
            backend,
            name: &name,
            turn,
            options,
            home_files: &home_files,
            home_out: writes_back.then_some(&home_out),
            runtime_payload: payload.as_deref(),
            egress: egress.as_ref(),
            adopted_egress: None,
            broker_ready: ready_rx.clone(),
            guard: guard.as_ref(),
            user: ids,
            armed: Some(&arming),
        };
        drive(&ctx, record, interrupts, sink).await
    };
    let ((), mut outcome) = tokio::join!(broker_starts, main);
    if handed_in_turn && outcome.is_err() {
        // Maybe never handed over: the next turn does it again (chown is idempotent).
        record.owner = owner_before;
    }
    if let Some(g) = guard.as_ref().filter(|_| container_made) {
        sweep_again(g, &mut outcome);
    }
    drop_unused_checkpoint(
        backend,
        prepared.filter(|_| !container_made).as_deref(),
        &outcome,
    )
    .await;
    close_beside(backend, broker.as_ref(), egress.as_ref(), &arming).await;
    save_refreshed(record, home_out);
    outcome
}

/// What ran beside the turn goes once it ended: its broker, its egress; and a recorded warm
/// turn's checkpoint is taken now, behind everything the turn needed.
async fn close_beside(
    backend: &impl Backend,
    broker: Option<&Broker>,
    egress: Option<&Egress>,
    arming: &crate::session::store::behind::Arming,
) {
    let close = async {
        if let Some(b) = broker {
            b.stop(backend).await;
        }
        if let Some(e) = egress {
            e.close(backend).await;
        }
    };
    tokio::join!(close, arming.fire(backend));
}

/// What the turn needs before its container: a new state volume filled with the image's
/// HOME, the session's volumes handed to the turn's user, its broker prepared, its egress
/// opened. A broker prepared is stopped again if the rest fails.
async fn make_first(
    backend: &impl Backend,
    record: &mut SessionRecord,
    ids: (u32, u32),
    fill_home: bool,
    broker: Option<&Broker>,
    egress: Option<&Egress>,
) -> Result<()> {
    if fill_home {
        fill_new_home(backend, record, ids).await?;
    }
    let prepare_broker = async {
        match broker {
            Some(b) => b.prepare(backend).await,
            None => Ok(()),
        }
    };
    // The proxy (and the network the broker joins) before the broker starts, beside the
    // rest: a shared one found running costs a lease. (The record, for its messages.)
    let shown = egress.is_some().then(|| record.clone());
    let opened = async {
        match (egress, &shown) {
            (Some(e), Some(r)) => open_egress(backend, r, e).await,
            _ => Ok(()),
        }
    };
    let (owned, prepared, opened) =
        tokio::join!(ensure_owner(backend, record, ids), prepare_broker, opened);
    if let Err(e) = owned.and(prepared).and(opened) {
        if let Some(b) = broker {
            b.stop(backend).await;
        }
        if let Some(e) = egress {
            e.close(backend).await;
        }
        return Err(e);
    }
    Ok(())
}

/// Opens the turn's egress ([`Egress::open`]): a taken name is a busy session (a turn's own
/// proxy, named for its driver), a missing image is said with what to do.
async fn open_egress(backend: &impl Backend, record: &SessionRecord, e: &Egress) -> Result<()> {
    match e.open(backend).await {
        Ok(()) => Ok(()),
        Err(CreateError::NameTaken) => Err(busy(record, "?")),
        Err(err) => Err(image_hint(err, record)),
    }
}

/// Starts the turn's broker, if it has one, and says on `ready` whether it runs.
async fn start_broker(
    backend: &impl Backend,
    broker: Option<&Broker>,
    turn_made: &mut tokio::sync::watch::Receiver<bool>,
    ready: &tokio::sync::watch::Sender<Option<bool>>,
) {
    if let Some(b) = broker {
        if b.in_turn() && turn_made.wait_for(|made| *made).await.is_err() {
            // The turn's unit was never made: nothing to start, and the turn failed already.
            let _ = ready.send(Some(false));
            return;
        }
        let started = b.start(backend).await;
        if let Err(e) = &started {
            tracing::warn!("{e}");
        }
        let _ = ready.send(Some(started.is_ok()));
    }
}

/// The agent's spec with the hosts its broker stands in for resolved to the broker.
async fn with_intercepts<'s>(
    backend: &impl Backend,
    broker: Option<&Broker>,
    spec: &'s TurnSpec,
    ready: &tokio::sync::watch::Receiver<Option<bool>>,
) -> Result<Cow<'s, TurnSpec>> {
    // A broker that stands in for hosts the CLI reaches directly is where the agent's
    // container resolves them: its address is known once it runs, before the container
    // is made (on that login's turns only, the broker's start is on the critical path).
    let Some((b, i)) = broker.and_then(|b| Some((b, b.intercept()?))) else {
        return Ok(Cow::Borrowed(spec));
    };
    let mut ready = ready.clone();
    // A broker in the turn's own unit starts with it: its address is known.
    let started = match b.in_turn() {
        true => Some(true),
        false => ready.wait_for(Option::is_some).await.ok().and_then(|r| *r),
    };
    let address = match started {
        Some(true) => b.address(backend).await?,
        _ => None,
    };
    let Some(address) = address else {
        return Err(Error::environment(format!(
            "the credential broker {} that stands in for {} did not start",
            b.container,
            i.hosts.join(", ")
        )));
    };
    let mut s = spec.clone();
    s.extra_hosts = i.hosts.iter().map(|h| format!("{h}:{address}")).collect();
    Ok(Cow::Owned(s))
}

/// The turn's container: taken warm where the session keeps one, else created.
async fn make_container(
    backend: &impl Backend,
    record: &SessionRecord,
    name: &str,
    spec: &TurnSpec,
    warm_for: Option<u64>,
) -> Result<()> {
    match warm_for {
        Some(secs) => {
            let create = move |idle: TurnSpec| async move {
                create_turn_container(backend, record, name, &idle).await
            };
            let last_end = record
                .turns
                .iter()
                .map(|t| t.started_at + t.duration_ms / 1000)
                .max()
                .unwrap_or(0);
            let keeps = record.settings.keep_warm_secs.is_some();
            crate::session::turn::warm::take_or_make(
                backend,
                name,
                spec,
                (secs, keeps),
                last_end,
                create,
            )
            .await
        }
        None => create_turn_container(backend, record, name, spec).await,
    }
}

/// Drives the turn in its container, and removes the container where the driver fails.
async fn drive(
    ctx: &TurnContext<'_, impl Backend>,
    record: &mut SessionRecord,
    interrupts: &mut Interrupts,
    sink: &mut (dyn FnMut(&Event) + Send),
) -> Result<TurnResult> {
    let outcome = if ctx.options.interactive {
        // A TUI's runtime files go in before its start: wait for the broker here.
        let mut ready = ctx.broker_ready.clone();
        let _ = ready.wait_for(Option::is_some).await;
        crate::session::turn::interactive::drive_tui(ctx, record, interrupts, sink).await
    } else {
        crate::session::turn::headless::drive_headless(ctx, record, interrupts, sink).await
    };
    if outcome.is_err() {
        // Not recorded (a recorded turn's is fired later): under the lock still, it goes.
        if let Some(a) = ctx.armed {
            a.disarm(ctx.backend).await;
        }
        // A recorded turn's container is gone already (save_record released the lock);
        // removing it again could remove the next turn's.
        // A stop first, not a kill: the entrypoint then removes the credentials it put
        // in HOME, and writes back refreshed ones.
        let _ = ctx.backend.stop_container(ctx.name, STOP_GRACE).await;
        let _ = ctx.backend.remove_container(ctx.name, true).await;
    }
    outcome
}

/// Sweeps the protected paths again, now that the container is surely gone (its driver
/// may have failed before the first sweep, or an agent's process outlived it): what this
/// one moves is said.
fn sweep_again(guard: &Guard, outcome: &mut Result<TurnResult>) {
    let swept = guard.sweep();
    match outcome {
        Ok(result) if result.quarantined != swept => {
            if let Some(q) = &swept {
                tracing::warn!("{}", q.warning());
            }
            result.quarantined = swept;
        }
        Err(_) => {
            if let Some(q) = &swept {
                tracing::warn!("{}", q.warning());
            }
        }
        Ok(_) => {}
    }
}

/// Saves the credentials the CLI refreshed, read back from its HOME, to the store.
fn save_refreshed(record: &SessionRecord, home_out: std::sync::Mutex<Option<Vec<u8>>>) {
    let handed_back = home_out.into_inner().unwrap_or_else(|e| e.into_inner());
    match handed_back.map(|tar| crate::auth::inject::finish(record.provider, &tar)) {
        Some(Ok(updated)) if !updated.is_empty() => {
            tracing::info!("saved refreshed credentials: {}", updated.join(", "))
        }
        Some(Err(e)) => tracing::warn!("could not save refreshed credentials: {e}"),
        _ => {}
    }
}

/// Creates the turn's container, which is also the session's lock.
async fn create_turn_container(
    backend: &impl Backend,
    record: &SessionRecord,
    name: &str,
    spec: &TurnSpec,
) -> Result<()> {
    for _ in 0..2 {
        match backend.create_turn(name, spec).await {
            Ok(_) => return Ok(()),
            Err(e @ (CreateError::Other(_) | CreateError::ImageMissing(_))) => {
                return Err(image_hint(e, record))
            }
            Err(CreateError::NameTaken) => {
                let existing = backend.inspect_container(name).await?;
                let turn = existing
                    .as_ref()
                    .and_then(|c| c.label(labels::TURN))
                    .unwrap_or("?")
                    .to_string();
                let running = existing.as_ref().is_some_and(|c| c.running());
                // Not found right after a taken name is a container still being registered
                // (Docker reserves the name first): busy, never a leftover to remove.
                let leftover = match existing {
                    Some(c) if !running && driver_is_gone(&c) => c,
                    Some(c)
                        if running && crate::session::turn::warm::orphaned(backend, &c).await? =>
                    {
                        c
                    }
                    _ => return Err(busy(record, &turn)),
                };
                // A leftover of a turn whose caw-box was killed: it holds nothing we need.
                // Removed by id: a racing resume may have replaced it meanwhile.
                backend.remove_found(&leftover).await?;
            }
        }
    }
    Err(busy(record, "?"))
}

/// After a parking session's turn: one the account's usage limit stopped parks the account
/// until the limit resets ([`park::after_limit`]) and hands its ticket on to the next turn.
fn park_after_limit(
    record: &SessionRecord,
    result: &TurnResult,
    admitted: &mut admission::Admitted,
) -> Result<()> {
    if !record.settings.park || result.status != Status::UsageLimit {
        return Ok(());
    }
    let p = record.provider;
    let account = crate::auth::account::spent_by(p);
    let dir = admission::Accounts::here()?.account_dir(&account);
    let parked = park::park(&dir, &park::after_limit(record, result, &account))?;
    admitted.carry_on(record.next_turn());
    tracing::info!(
        "account {account} parked until {} (session {})",
        parked.until,
        record.session_id
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dirs;
    use crate::session::turn::plan::{tests::record, turn_spec};

    /// A backend that holds one turn container (or none) and records what it was asked to
    /// do: enough to check how a turn takes the session's lock.
    #[derive(Clone, Default)]
    struct FakeBackend(std::sync::Arc<std::sync::Mutex<Fake>>);

    #[derive(Default)]
    struct Fake {
        /// The container under the turn's name, if any.
        existing: Option<ContainerInfo>,
        image_missing: bool,
        calls: Vec<String>,
    }

    impl FakeBackend {
        fn calls(&self) -> Vec<String> {
            self.0.lock().unwrap().calls.clone()
        }
        fn log(&self, call: String) {
            self.0.lock().unwrap().calls.push(call);
        }
    }

    use crate::backend::{
        Attached, Backend, ContainerInfo, ContainerState, HelperSpec, ImageInfo, OutputStream,
        TarFile, VolumeInfo,
    };
    use std::collections::HashMap;

    /// The operations a lock does not use are not expected.
    macro_rules! unexpected {
        ($what:literal) => {
            unreachable!(concat!("the lock does not ", $what))
        };
    }

    /// What the fake can do: a local Docker daemon's answers, where the lock asks any.
    static FAKE_CAPABILITIES: std::sync::LazyLock<crate::backend::Capabilities> =
        std::sync::LazyLock::new(|| crate::backend::Capabilities {
            scope: crate::backend::Scope::default(),
            words: crate::backend::Words {
                here: "here".into(),
                elsewhere: "elsewhere".into(),
                engine: "the engine".into(),
            },
            host_dirs: crate::backend::HostDirs::Shared,
            runtime_dir: crate::backend::RuntimeDir::KeptWithContainer,
            broker_place: crate::backend::BrokerPlace::SharedContainer,
            keeps_warm: false,
            hands_over_to_root: false,
            fill_volume_first: false,
            checkpoints: false,
            warm_checkpoints: false,
            finishes_behind: false,
            forks_from_volumes: false,
            pools: false,
            shared_proxy: false,
            proxy_in_turn: false,
        });

    impl Backend for FakeBackend {
        fn capabilities(&self) -> &crate::backend::Capabilities {
            &FAKE_CAPABILITIES
        }
        async fn create_turn(
            &self,
            name: &str,
            spec: &TurnSpec,
        ) -> std::result::Result<String, CreateError> {
            self.log(format!("create {name}"));
            let mut fake = self.0.lock().unwrap();
            if fake.image_missing {
                return Err(CreateError::ImageMissing(Error::environment(
                    "no such image",
                )));
            }
            if fake.existing.is_some() {
                return Err(CreateError::NameTaken);
            }
            fake.existing = Some(ContainerInfo {
                name: name.to_string(),
                labels: spec.labels.clone(),
                state: ContainerState::Created,
                ..Default::default()
            });
            Ok("id".into())
        }
        async fn inspect_container(&self, name: &str) -> Result<Option<ContainerInfo>> {
            self.log(format!("inspect {name}"));
            Ok(self.0.lock().unwrap().existing.clone())
        }
        async fn check_runtime(&self, _: &str) -> Result<()> {
            unexpected!("check a runtime")
        }
        async fn remove_container(&self, name: &str, force: bool) -> Result<()> {
            self.log(format!("remove {name} force={force}"));
            self.0.lock().unwrap().existing = None;
            Ok(())
        }
        async fn rename_container(&self, _: &str, _: &str) -> Result<()> {
            unexpected!("rename containers")
        }
        async fn remove_found(&self, found: &ContainerInfo) -> Result<()> {
            self.log(format!("remove id {}", found.id));
            self.0.lock().unwrap().existing = None;
            Ok(())
        }
        async fn list_containers(&self, _: &[String]) -> Result<Vec<ContainerInfo>> {
            unexpected!("list containers")
        }
        async fn create_helper(
            &self,
            _: &str,
            _: &HelperSpec,
        ) -> std::result::Result<String, CreateError> {
            unexpected!("create helpers")
        }
        async fn attach(&self, _: &str, _: bool) -> Result<Attached> {
            unexpected!("attach")
        }
        async fn resize_tty(&self, _: &str, _: u16, _: u16) -> Result<()> {
            unexpected!("resize")
        }
        async fn start_container(&self, _: &str) -> Result<()> {
            unexpected!("start")
        }
        async fn wait_container(&self, _: &str) -> Result<i64> {
            unexpected!("wait")
        }
        async fn stop_container(&self, _: &str, _: std::time::Duration) -> Result<()> {
            unexpected!("stop")
        }
        fn logs_hint(&self, _: &str) -> String {
            unexpected!("a logs hint")
        }
        fn egress_route(&self, _: &crate::backend::EgressPlan) -> crate::backend::EgressRoute {
            unexpected!("route egress")
        }
        async fn open_egress(
            &self,
            _: &crate::backend::EgressPlan,
        ) -> std::result::Result<(), CreateError> {
            unexpected!("open egress")
        }
        async fn close_egress(&self, _: &crate::backend::EgressPlan) {
            unexpected!("close egress")
        }
        async fn open_broker(&self, _: &crate::backend::BrokerPlan) -> Result<()> {
            unexpected!("open a broker")
        }
        async fn start_broker(
            &self,
            _: &crate::backend::BrokerPlan,
        ) -> std::result::Result<Attached, CreateError> {
            unexpected!("start a broker")
        }
        fn broker_route(&self, _: &crate::backend::BrokerPlan) -> crate::backend::BrokerRoute {
            unexpected!("route a broker")
        }
        async fn attach_broker(&self, _: &str) -> Result<Attached> {
            unexpected!("attach to a broker")
        }
        async fn close_broker(&self, _: &crate::backend::BrokerPlan) {
            unexpected!("close a broker")
        }
        async fn sweep(&self, _: &[String], _: &[&str]) -> Result<()> {
            unexpected!("sweep")
        }
        async fn remove_unused_networks(&self, _: &[String]) -> Result<Vec<String>> {
            unexpected!("remove networks")
        }
        async fn remove_unused_volumes(&self, _: &[String]) -> Result<Vec<String>> {
            unexpected!("remove volumes")
        }
        fn removed_under_turn(&self, _: &str) -> Error {
            unexpected!("a removed turn")
        }
        async fn run_to_completion(
            &self,
            _: &str,
            _: &HelperSpec,
        ) -> std::result::Result<(i64, String, String), CreateError> {
            unexpected!("run helpers")
        }
        fn follow_logs(&self, _: &str) -> OutputStream {
            unexpected!("follow logs")
        }
        fn logs_so_far(&self, _: &str) -> OutputStream {
            unexpected!("read logs")
        }
        fn logs_since(&self, _: &str, _: std::time::SystemTime, _: bool) -> OutputStream {
            unexpected!("read logs")
        }
        async fn inspect_image(&self, _: &str) -> Result<Option<ImageInfo>> {
            // A turn reads its image's CLI version: none here.
            Ok(None)
        }
        async fn create_volume(&self, _: &str, _: HashMap<String, String>) -> Result<()> {
            unexpected!("create volumes")
        }
        async fn inspect_volume(&self, _: &str) -> Result<Option<VolumeInfo>> {
            unexpected!("inspect volumes")
        }
        async fn list_volumes(&self, _: &[String]) -> Result<Vec<VolumeInfo>> {
            unexpected!("list volumes")
        }
        async fn remove_volume(&self, _: &str) -> Result<()> {
            unexpected!("remove volumes")
        }
        async fn upload_files(
            &self,
            _: &str,
            _: &str,
            _: &[TarFile<'_>],
            _: (u32, u32),
        ) -> Result<()> {
            unexpected!("upload")
        }
        async fn upload_tar(&self, _: &str, _: &str, _: Vec<u8>) -> Result<()> {
            unexpected!("upload")
        }
        async fn download_file(&self, _: &str, _: &str) -> Result<Option<Vec<u8>>> {
            unexpected!("download")
        }
        async fn download_tar(&self, _: &str, _: &str) -> Result<Option<Vec<u8>>> {
            unexpected!("download")
        }
    }

    /// A turn container left by a driver: running or not, and whose driver is this process
    /// (alive) or a pid that cannot exist (gone).
    fn left_by(turn: u32, state: ContainerState, driver_alive: bool) -> ContainerInfo {
        let pid = if driver_alive {
            std::process::id().to_string()
        } else {
            "999999999".to_string()
        };
        ContainerInfo {
            labels: HashMap::from([
                (labels::TURN.to_string(), turn.to_string()),
                (labels::DRIVER_PID.to_string(), pid),
                (labels::DRIVER_HOST.to_string(), dirs::host_name()),
            ]),
            state,
            id: "leftover-id".into(),
            ..Default::default()
        }
    }

    /// The lock, against the neutral backend: a free name is taken; a running turn, or a
    /// stopped one whose driver lives, is busy (nothing removed); a dead driver's leftover
    /// is removed and the name taken; a missing image is the missing-image error.
    #[tokio::test(flavor = "current_thread")]
    async fn a_turn_takes_the_lock_or_says_who_holds_it() {
        let r = record("open");
        let name = container_name(&r);
        let spec = turn_spec(
            &r,
            5,
            "img",
            vec![],
            vec![],
            crate::backend::Scratch::default(),
        )
        .unwrap();

        let free = FakeBackend::default();
        create_turn_container(&free, &r, &name, &spec)
            .await
            .unwrap();
        assert_eq!(free.calls(), vec![format!("create {name}")]);
        let taken = free.0.lock().unwrap().existing.clone().unwrap();
        assert_eq!(taken.label(labels::TURN), Some("5"));

        for (state, alive) in [
            (ContainerState::Running, false),
            (ContainerState::Exited, true),
            (ContainerState::Created, true),
        ] {
            let busy = FakeBackend::default();
            busy.0.lock().unwrap().existing = Some(left_by(4, state, alive));
            let e = create_turn_container(&busy, &r, &name, &spec)
                .await
                .unwrap_err();
            assert_eq!(e.exit_code(), 2, "{state:?}");
            assert!(e.message.contains("is busy: turn 4"), "{}", e.message);
            assert!(
                !busy.calls().iter().any(|c| c.starts_with("remove")),
                "{state:?}: {:?}",
                busy.calls()
            );
        }

        let leftover = FakeBackend::default();
        leftover.0.lock().unwrap().existing = Some(left_by(4, ContainerState::Exited, false));
        create_turn_container(&leftover, &r, &name, &spec)
            .await
            .unwrap();
        assert_eq!(
            leftover.calls(),
            vec![
                format!("create {name}"),
                format!("inspect {name}"),
                // By id, never by name: a racing resume may hold the name by then.
                "remove id leftover-id".to_string(),
                format!("create {name}"),
            ]
        );

        let no_image = FakeBackend::default();
        no_image.0.lock().unwrap().image_missing = true;
        let e = create_turn_container(&no_image, &r, &name, &spec)
            .await
            .unwrap_err();
        assert_eq!(e.exit_code(), 3);
        assert!(
            e.message
                .contains("image 'caw-box/codex:latest' is not present"),
            "{}",
            e.message
        );
    }
}
