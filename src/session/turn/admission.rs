//! Account-wide admission (`--per-account N`): at most N turns of one account in flight at
//! once, across every caw-box process of this host (each foreground run, each detached
//! turn's `__drive`, each MCP server's turns), because a vendor's limits are the account's.
//!
//! The host's processes agree through files under `<data dir>/accounts/<account>/`, locked
//! with `flock` (which the kernel releases when a process dies, however it dies):
//! - `slot-<k>`, k below N: a turn in flight holds one, locked, until it is recorded;
//! - `queue/<ticket>.json`: a turn over the cap, waiting, locked by the process that waits.
//!   Its name orders the queue (when it came); its content says whose turn it is
//!   ([`Queued`]). One whose lock is free is stale (its process is gone): whoever sees it
//!   removes it.
//!
//! A waiting turn takes a free slot only when fewer than N turns wait ahead of it, so the
//! oldest go first. Turns whose sessions ask for different N share the slots below the
//! smaller N.
//!
//! Where the backend's turns are driven from more than one host (Kubernetes), a turn also
//! holds one of the account's N slots the backend shares
//! ([`crate::backend::Backend::try_account_slot`]: a Lease per slot in the namespace), taken
//! once it has the host's: one that finds all N held elsewhere gives the host's slot back
//! and waits in line as before. Across hosts the first to find a slot free takes it.
//!
//! `--on-limit park` queues here too: a parking session's turn always holds a ticket while
//! it runs, waits (with or without a cap) while its account is parked ([`super::park`]),
//! and a turn that met the limit hands its ticket straight on to the turn that goes on
//! after the park ([`Admitted::carry_on`]): the session is never seen between the two.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::backend::Hold;
use crate::dirs;
use crate::error::{Error, Result};

/// How often a waiting turn looks for a free slot.
const POLL: Duration = Duration::from_millis(200);

/// A turn waiting for its account's slot, as its ticket says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Queued {
    pub session_id: Uuid,
    pub turn: u32,
    pub account: String,
    /// The process that waits (and will run the turn).
    pub pid: u32,
    /// Unix seconds.
    pub queued_at: u64,
    /// Its session's `--per-account` (0: no cap, only a park).
    pub cap: u32,
    /// Its session parks at a usage limit (`--on-limit park`): it waits while the account
    /// is parked.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub park: bool,
    /// Unix seconds: when the park it waits for ends (the account's, as read now).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumes_at: Option<u64>,
    /// 1 for the next to go; 0 once admitted.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub position: usize,
    /// Taken from the queue: its turn starts (or runs) now. Its ticket stays until the
    /// turn is recorded, so that a `wait` does not take the moment between the two for
    /// the turn's end.
    #[serde(skip)]
    pub admitted: bool,
    /// Its process died while it waited, and its job is kept: the next caw-box starts it
    /// again ([`Accounts::claim_orphans`]), in its place in line.
    #[serde(skip)]
    pub orphaned: bool,
}

impl Queued {
    /// `parked` while it waits for its account's park, else `queued` (or admitted).
    pub fn status(&self) -> crate::event::Status {
        if self.resumes_at.is_some() {
            crate::event::Status::Parked
        } else {
            crate::event::Status::Queued
        }
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// A turn's slot among its account's turns in flight: held while the turn runs, released
/// when dropped (or when its process dies).
#[derive(Debug)]
pub struct Admitted {
    _slot: Option<File>,
    /// The slot the backend shares beyond this host
    /// ([`crate::backend::Backend::try_account_slot`]).
    shared: Option<Hold>,
    ticket: Option<Ticket>,
}

/// What a turn that has to wait is waiting for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// Its place in its account's queue (1: next).
    InLine(usize),
    /// Its account's park, until then (Unix seconds).
    Parked(u64),
}

/// What a turn asks of admission.
#[derive(Debug, Clone, Copy)]
pub struct Want<'a> {
    pub account: &'a str,
    /// `--per-account`; `None`: no cap.
    pub cap: Option<u32>,
    /// `--on-limit park`.
    pub park: bool,
}

/// Tickets handed on by turns that met their usage limit to the turn that goes on after
/// it, in this process ([`Admitted::carry_on`]), until that turn's admission takes them.
static CARRIED: std::sync::Mutex<Vec<Ticket>> = std::sync::Mutex::new(Vec::new());

impl Admitted {
    /// Gives the slots back, and waits (a few seconds at most) until the one shared beyond
    /// this host is released: a driver that ends right after its turn does not leave it
    /// held until it expires.
    pub async fn release(mut self) {
        if let Some(shared) = self.shared.take() {
            shared.release().await;
        }
    }

    /// Hands this turn's ticket on to the session's turn `turn`, which goes on after its
    /// account's park: queued under a new name (the lock kept throughout), for that turn's
    /// admission in this process. `false` when this turn held no ticket.
    pub fn carry_on(&mut self, turn: u32) -> bool {
        let Some(mut ticket) = self.ticket.take() else {
            return false;
        };
        let Some(mut q) = read_ticket(&ticket.path) else {
            self.ticket = Some(ticket);
            return false;
        };
        q.turn = turn;
        q.queued_at = crate::clock::now_secs();
        let name = ticket_name(q.session_id, turn);
        let path = ticket.path.with_file_name(&name);
        let rewritten = ticket
            ._file
            .set_len(0)
            .and_then(|()| {
                use std::io::Seek;
                ticket._file.seek(std::io::SeekFrom::Start(0))?;
                ticket
                    ._file
                    .write_all(&serde_json::to_vec(&q).expect("tickets serialize"))
            })
            .and_then(|()| fs::rename(&ticket.path, &path));
        if rewritten.is_err() {
            self.ticket = Some(ticket);
            return false;
        }
        ticket.path = path;
        ticket.name = name;
        CARRIED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ticket);
        true
    }
}

/// A queue ticket's name: when it came (to the nanosecond), then whose turn it is.
fn ticket_name(session_id: Uuid, turn: u32) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("{nanos:024}-{session_id}-{turn}.json")
}

/// Whether a turn of `session_id` that met its usage limit handed its ticket on in this
/// process, for the turn that goes on after the park.
pub fn carried_on(session_id: Uuid) -> bool {
    let carried = CARRIED.lock().unwrap_or_else(|e| e.into_inner());
    carried
        .iter()
        .any(|t| read_ticket(&t.path).is_some_and(|q| q.session_id == session_id))
}

/// The ticket carried on in this process for `session_id`'s turn `turn`, taken.
fn take_carried(session_id: Uuid, turn: u32) -> Option<Ticket> {
    let mut carried = CARRIED.lock().unwrap_or_else(|e| e.into_inner());
    let at = carried.iter().position(|t| {
        read_ticket(&t.path).is_some_and(|q| q.session_id == session_id && q.turn == turn)
    })?;
    Some(carried.swap_remove(at))
}

/// A waiting turn's place in its account's queue (`<name>.json`), then its mark of a turn
/// admitted from it (`<name>.admitted`, the same file and lock): removed when dropped.
#[derive(Debug)]
struct Ticket {
    path: PathBuf,
    name: String,
    _file: File,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::environment(format!("cannot {what} '{}': {e}", path.display()))
}

/// The accounts' slots and queues of one data directory.
#[derive(Debug, Clone)]
pub struct Accounts {
    root: PathBuf,
}

impl Accounts {
    /// Those of the accounts directory `root` (`<data dir>/accounts`).
    pub fn at(root: PathBuf) -> Accounts {
        Accounts { root }
    }

    /// The directory of `account`'s slots, queue and park mark.
    pub fn account_dir(&self, account: &str) -> PathBuf {
        self.root.join(account)
    }

    /// This host's, in caw-box's data directory.
    pub fn here() -> Result<Accounts> {
        Ok(Accounts {
            root: dirs::data_dir()?.join("accounts"),
        })
    }

    /// Waits for a slot of `want.account` where at most `want.cap` turns may be in flight
    /// (and, for a parking turn, for the account's park to end), and takes it. `told` hears
    /// what the turn waits for whenever that changes, and only when it has to wait.
    ///
    /// `shared(cap)` takes a slot the backend shares beyond this host, once the host's is
    /// had ([`crate::backend::Backend::try_account_slot`]); [`host_only`] where there is none.
    pub async fn admit<F, Fut>(
        &self,
        want: Want<'_>,
        session_id: Uuid,
        turn: u32,
        mut told: impl FnMut(Waiting) + Send,
        mut shared: F,
    ) -> Result<Admitted>
    where
        F: FnMut(u32) -> Fut + Send,
        Fut: std::future::Future<Output = Result<Option<Hold>>> + Send,
    {
        let dir = self.root.join(want.account);
        let queue = dir.join("queue");
        dirs::ensure_private_dir(&queue)?;
        let adopted =
            take_carried(session_id, turn).or_else(|| Ticket::take_over(&queue, session_id, turn));
        // Straight in, when nobody waits and a slot is free (a parking turn always queues:
        // it holds its ticket while it runs, to hand it on).
        if let (None, Some(cap), false) = (&adopted, want.cap, want.park) {
            if live_tickets(&queue).iter().all(|(_, q)| q.orphaned) {
                if let Some(slot) = take_slot(&dir, cap)? {
                    if let Some(held) = shared(cap).await? {
                        return Ok(Admitted {
                            _slot: Some(slot),
                            shared: Some(held),
                            ticket: None,
                        });
                    }
                }
            }
        }
        let mut ticket = match adopted {
            Some(t) => t,
            None => Ticket::take(
                &queue,
                &Queued {
                    session_id,
                    turn,
                    account: want.account.to_string(),
                    pid: std::process::id(),
                    queued_at: crate::clock::now_secs(),
                    cap: want.cap.unwrap_or(0),
                    park: want.park,
                    resumes_at: None,
                    position: 0,
                    admitted: false,
                    orphaned: false,
                },
            )?,
        };
        let mut said = None;
        loop {
            if ticket.stop_asked() {
                return Err(Error::new(
                    crate::error::ErrorKind::Interrupted,
                    "the turn was stopped while it waited in its account's queue",
                ));
            }
            let parked = super::park::parked(&dir);
            let waiting = match (&parked, want.park) {
                (Some(p), true) => Waiting::Parked(p.until),
                _ => {
                    // Turns parked ahead do not hold up one that does not park.
                    let held_up = |q: &Queued| q.park && parked.is_some();
                    let ahead = live_tickets(&queue)
                        .iter()
                        .filter(|(name, q)| {
                            !q.admitted && !q.orphaned && !held_up(q) && *name < ticket.name
                        })
                        .count();
                    let slot = match want.cap {
                        None => None,
                        Some(cap) if ahead < paced(&dir, cap) as usize => take_slot(&dir, cap)?,
                        Some(_) => None,
                    };
                    // The host's slot is kept only with a shared one (when it is given
                    // back, the next in line here tries).
                    let held = match (slot.is_some(), want.cap) {
                        (true, Some(cap)) => shared(cap).await?,
                        _ => None,
                    };
                    if want.cap.is_none() || held.is_some() {
                        ticket.admit();
                        return Ok(Admitted {
                            _slot: slot.filter(|_| held.is_some()),
                            shared: held,
                            ticket: Some(ticket),
                        });
                    }
                    Waiting::InLine(ahead + 1)
                }
            };
            if said != Some(waiting) {
                told(waiting);
                said = Some(waiting);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Every turn waiting for its account's slot, oldest first per account, each with its
    /// place.
    pub fn queued(&self) -> Vec<Queued> {
        let Ok(accounts) = fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut all = Vec::new();
        for account in accounts.flatten() {
            let tickets = live_tickets(&account.path().join("queue"));
            let parked = super::park::parked(&account.path()).map(|p| p.until);
            let mut place = 0;
            all.extend(tickets.into_iter().map(|(_, mut q)| {
                if q.admitted {
                    return q;
                }
                match parked.filter(|_| q.park) {
                    Some(until) => q.resumes_at = Some(until),
                    None => {
                        place += 1;
                        q.position = place;
                    }
                }
                q
            }));
        }
        all
    }

    /// Claims each queued turn whose driver died while it waited and whose job is kept
    /// (its ticket renamed, so only one caw-box claims it): their jobs, for a new driver
    /// each, which takes its ticket over.
    pub fn claim_orphans(&self) -> Vec<Vec<u8>> {
        let Ok(accounts) = fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut jobs = Vec::new();
        for account in accounts.flatten() {
            let queue = account.path().join("queue");
            for (name, q) in live_tickets(&queue) {
                if !q.orphaned {
                    continue;
                }
                let path = queue.join(&name);
                let Ok(file) = OpenOptions::new().write(true).open(&path) else {
                    continue;
                };
                if file.try_lock().is_err() {
                    continue;
                }
                let job = self
                    .root
                    .join(".jobs")
                    .join(format!("{}.json", q.session_id));
                let Ok(bytes) = fs::read(&job) else {
                    continue;
                };
                // Its age counts from the claim.
                let _ = file.set_modified(std::time::SystemTime::now());
                if fs::rename(&path, queue.join(format!("{ADOPT}{name}"))).is_ok() {
                    jobs.push(bytes);
                }
            }
        }
        jobs
    }

    /// The turn of `session_id` waiting for a slot, or admitted from the queue and not
    /// recorded yet (`admitted`).
    pub fn queued_turn(&self, session_id: Uuid) -> Option<Queued> {
        self.queued()
            .into_iter()
            .find(|q| q.session_id == session_id)
    }
}

/// Asks the turn of `session_id` waiting for a slot to give up its place; `true` once it
/// did (within 10 s), `false` when none waits.
pub async fn stop_queued(session_id: Uuid) -> Result<bool> {
    let accounts = Accounts::here()?;
    let Some(q) = accounts.queued_turn(session_id).filter(|q| !q.admitted) else {
        return Ok(false);
    };
    let queue = accounts.root.join(&q.account).join("queue");
    for (name, t) in live_tickets(&queue) {
        if t.session_id == session_id && !t.admitted {
            let asked = queue.join(name).with_extension("stop");
            dirs::write_private_unsynced(&asked, b"")?;
        }
    }
    for _ in 0..100 {
        if accounts.queued_turn(session_id).is_none() {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(Error::environment(format!(
        "session {session_id}'s turn still waits for a slot of its account after being asked to stop"
    ))
    .with_hint(format!("its caw-box process is {}", q.pid)))
}

/// The turns of this host waiting for their account's slot (none where the data directory
/// cannot be found).
pub fn queued() -> Vec<Queued> {
    Accounts::here().map(|a| a.queued()).unwrap_or_default()
}

/// The turn of `session_id` waiting on this host for its account's slot.
pub fn queued_turn(session_id: Uuid) -> Option<Queued> {
    Accounts::here().ok()?.queued_turn(session_id)
}

/// `cap`, lowered while the account backs off from a refusal ([`crate::auth::backoff`]: the
/// turns its schedule lets send, at least 1).
fn paced(dir: &Path, cap: u32) -> u32 {
    let now = crate::clock::now_ms();
    match crate::auth::backoff::Account::at(dir.to_path_buf()).schedule() {
        Some(b) if b.holds(now, u64::from(cap)) => cap.min(b.cap_at(now).max(1) as u32),
        _ => cap,
    }
}

/// A free slot of `0..cap`, where fewer turns hold one than the account's back-off lets
/// send ([`paced`]).
fn take_slot(dir: &Path, cap: u32) -> Result<Option<File>> {
    let paced = paced(dir, cap);
    if paced < cap {
        let held = (0..cap)
            .filter(|k| crate::auth::backoff::is_held(&dir.join(format!("slot-{k}"))))
            .count();
        if held >= paced as usize {
            return Ok(None);
        }
    }
    try_slot(dir, cap)
}

/// Tries slots `0..cap` of the account's directory; the first free one is taken.
fn try_slot(dir: &Path, cap: u32) -> Result<Option<File>> {
    for k in 0..cap.max(1) {
        let path = dir.join(format!("slot-{k}"));
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| io_err("open", &path, e))?;
        match file.try_lock() {
            Ok(()) => return Ok(Some(file)),
            Err(TryLockError::WouldBlock) => continue,
            Err(TryLockError::Error(e)) => return Err(io_err("lock", &path, e)),
        }
    }
    Ok(None)
}

impl Ticket {
    /// Written under a hidden name, locked, then renamed into the queue: no one sees it
    /// unlocked (and so stale) in between.
    fn take(queue: &Path, q: &Queued) -> Result<Ticket> {
        let hidden = queue.join(format!(".{}", Uuid::new_v4()));
        let mut file = OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&hidden)
            .map_err(|e| io_err("write", &hidden, e))?;
        file.lock().map_err(|e| io_err("lock", &hidden, e))?;
        file.write_all(&serde_json::to_vec(q).expect("tickets serialize"))
            .map_err(|e| io_err("write", &hidden, e))?;
        let name = ticket_name(q.session_id, q.turn);
        let path = queue.join(&name);
        fs::rename(&hidden, &path).map_err(|e| io_err("write", &path, e))?;
        Ok(Ticket {
            path,
            name,
            _file: file,
        })
    }

    /// The ticket of `session_id`'s turn `turn` that a caw-box claimed for it, its driver
    /// having died while it waited ([`Accounts::claim_orphans`]): taken over, in its place.
    /// A claimed ticket of another turn of the session is stale (the session moved on).
    fn take_over(queue: &Path, session_id: Uuid, turn: u32) -> Option<Ticket> {
        let entries = fs::read_dir(queue).ok()?;
        for e in entries.flatten() {
            let hidden = e.file_name().to_string_lossy().into_owned();
            let Some(name) = hidden.strip_prefix(ADOPT) else {
                continue;
            };
            let Some(q) = read_ticket(&e.path()) else {
                continue;
            };
            if q.session_id != session_id {
                continue;
            }
            if q.turn != turn {
                let _ = fs::remove_file(e.path());
                continue;
            }
            let mut file = OpenOptions::new().write(true).open(e.path()).ok()?;
            file.try_lock().ok()?;
            // Its process is this one now.
            let ours = Queued {
                pid: std::process::id(),
                ..q
            };
            file.set_len(0).ok()?;
            file.write_all(&serde_json::to_vec(&ours).expect("tickets serialize"))
                .ok()?;
            let path = queue.join(name);
            fs::rename(e.path(), &path).ok()?;
            return Some(Ticket {
                path,
                name: name.to_string(),
                _file: file,
            });
        }
        None
    }

    /// Whether `stop` asked this turn to give up its place (its ticket's `.stop` beside it),
    /// which is then taken back.
    fn stop_asked(&self) -> bool {
        let asked = self.path.with_extension("stop");
        fs::remove_file(asked).is_ok()
    }

    /// Marks it admitted: renamed, so it keeps its lock.
    fn admit(&mut self) {
        let admitted = self.path.with_extension("admitted");
        if fs::rename(&self.path, &admitted).is_ok() {
            self.path = admitted;
        }
    }
}

/// The prefix of a ticket a caw-box claimed for a new driver of its turn.
const ADOPT: &str = ".adopt-";

/// Where a detached turn's job (its `__drive` input) is kept while it may wait in a queue:
/// `<data dir>/accounts/.jobs/<session>.json`, private, removed once the turn is admitted.
pub fn job_path(session_id: Uuid) -> Result<PathBuf> {
    Ok(Accounts::here()?
        .root
        .join(".jobs")
        .join(format!("{session_id}.json")))
}

/// The tickets of `queue` whose process still waits, oldest first, and those whose process
/// died but whose job is kept (`orphaned`); other stale ones are removed.
fn live_tickets(queue: &Path) -> Vec<(String, Queued)> {
    let jobs = queue
        .parent()
        .and_then(Path::parent)
        .map(|root| root.join(".jobs"));
    let Ok(entries) = fs::read_dir(queue) else {
        return Vec::new();
    };
    let mut live: Vec<(String, Queued)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(claimed) = name.strip_prefix(ADOPT) {
                return claimed_ticket(&e.path(), claimed);
            }
            let admitted = name.ends_with(".admitted");
            if name.starts_with('.') || !(admitted || name.ends_with(".json")) {
                return None;
            }
            let file = File::open(e.path()).ok()?;
            match file.try_lock_shared() {
                // Nobody holds it: its process is gone.
                Ok(()) => {
                    let q = read_ticket(&e.path());
                    let kept = |q: &Queued| {
                        jobs.as_ref()
                            .is_some_and(|j| j.join(format!("{}.json", q.session_id)).exists())
                    };
                    match q {
                        Some(mut q) if !admitted && kept(&q) => {
                            q.orphaned = true;
                            Some((name, q))
                        }
                        _ => {
                            let _ = fs::remove_file(e.path());
                            None
                        }
                    }
                }
                Err(TryLockError::WouldBlock) => {
                    let mut q = read_ticket(&e.path())?;
                    q.admitted = admitted;
                    Some((name, q))
                }
                Err(TryLockError::Error(_)) => None,
            }
        })
        .collect();
    live.sort_by(|a, b| a.0.cmp(&b.0));
    live
}

/// What a ticket says (`None`: gone, or not a ticket).
fn read_ticket(path: &Path) -> Option<Queued> {
    serde_json::from_slice(&fs::read(path).ok()?).ok()
}

/// A ticket claimed for a new driver of its turn: still in line (under its own name)
/// until that driver takes it over; a claim no driver took within a minute is dropped.
fn claimed_ticket(path: &Path, name: &str) -> Option<(String, Queued)> {
    let age = fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .unwrap_or_default();
    if age > Duration::from_secs(60) {
        let _ = fs::remove_file(path);
        return None;
    }
    Some((name.to_string(), read_ticket(path)?))
}

/// No slot shared beyond this host: the `shared` of [`Accounts::admit`] for a caller without
/// a backend's.
pub fn host_only(_cap: u32) -> std::future::Ready<Result<Option<Hold>>> {
    std::future::ready(Ok(Some(Hold::nothing())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capped(account: &str, cap: u32) -> Want<'_> {
        Want {
            account,
            cap: Some(cap),
            park: false,
        }
    }

    #[tokio::test]
    async fn a_parked_account_holds_parking_turns_and_a_limited_turn_hands_its_ticket_on() {
        let dir = tempfile::tempdir().unwrap();
        let accounts = Accounts {
            root: dir.path().to_path_buf(),
        };
        let parking = Want {
            account: "codex-p",
            cap: None,
            park: true,
        };
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        // Not parked: in at once, holding a ticket while it runs.
        let mut first = accounts
            .admit(parking, a, 1, |_| panic!("no wait"), host_only)
            .await
            .unwrap();
        assert!(accounts.queued_turn(a).is_some_and(|q| q.admitted));
        // It meets the limit: the account is parked, its ticket goes on to turn 2.
        let until = crate::clock::now_secs() + 2;
        super::super::park::park(
            &dir.path().join("codex-p"),
            &super::super::park::Parked {
                until,
                since: 0,
                by: a,
                named: true,
            },
        )
        .unwrap();
        assert!(first.carry_on(2));
        drop(first);
        let waiting = accounts.queued_turn(a).expect("turn 2 waits");
        assert_eq!(
            (waiting.turn, waiting.resumes_at, waiting.admitted),
            (2, Some(until), false)
        );
        // Another parking session of the account waits too; one that does not park goes in.
        let heard = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let told = heard.clone();
        let other = {
            let accounts = accounts.clone();
            tokio::spawn(async move {
                accounts
                    .admit(
                        parking,
                        b,
                        1,
                        move |w| told.lock().unwrap().push(w),
                        host_only,
                    )
                    .await
            })
        };
        let plain = Want {
            park: false,
            cap: Some(1),
            ..parking
        };
        drop(
            accounts
                .admit(plain, Uuid::new_v4(), 1, |_| panic!("no wait"), host_only)
                .await
                .unwrap(),
        );
        // At the reset both go on: turn 2 with the ticket turn 1 carried.
        let second = accounts
            .admit(
                parking,
                a,
                2,
                |w| assert_eq!(w, Waiting::Parked(until)),
                host_only,
            )
            .await
            .unwrap();
        assert!(crate::clock::now_secs() >= until);
        other.await.unwrap().unwrap();
        assert_eq!(*heard.lock().unwrap(), vec![Waiting::Parked(until)]);
        drop(second);
    }

    #[tokio::test]
    async fn turns_over_the_cap_wait_in_order_and_go_as_slots_free() {
        let dir = tempfile::tempdir().unwrap();
        let accounts = Accounts {
            root: dir.path().to_path_buf(),
        };
        let (a, b, c) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let first = accounts
            .admit(capped("codex-x", 1), a, 1, |_| panic!("no wait"), host_only)
            .await
            .unwrap();
        assert!(accounts.queued().is_empty());
        let places = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let wait = |id: Uuid, heard: std::sync::Arc<std::sync::Mutex<Vec<Waiting>>>| {
            let accounts = accounts.clone();
            tokio::spawn(async move {
                accounts
                    .admit(
                        capped("codex-x", 1),
                        id,
                        1,
                        move |p| heard.lock().unwrap().push(p),
                        host_only,
                    )
                    .await
            })
        };
        let second = wait(b, places.clone());
        tokio::time::sleep(Duration::from_millis(50)).await;
        let third = wait(c, std::sync::Arc::default());
        tokio::time::sleep(Duration::from_millis(300)).await;
        let waiting = accounts.queued_turn(b).expect("b waits");
        assert_eq!((waiting.turn, waiting.position, waiting.cap), (1, 1, 1));
        assert_eq!(waiting.pid, std::process::id());
        assert_eq!(accounts.queued_turn(c).map(|q| q.position), Some(2));
        // Another account is not held up by this one's.
        accounts
            .admit(capped("codex-y", 1), a, 2, |_| panic!("no wait"), host_only)
            .await
            .unwrap();
        drop(first);
        // The oldest goes first; the other still waits, now next.
        let second = second.await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!third.is_finished());
        assert_eq!(accounts.queued_turn(c).map(|q| q.position), Some(1));
        // Admitted, its ticket stays until its turn is recorded.
        let admitted = accounts.queued_turn(b).expect("b's mark");
        assert!(admitted.admitted && admitted.position == 0, "{admitted:?}");
        drop(second);
        assert!(accounts.queued_turn(b).is_none(), "its ticket went");
        third.await.unwrap().unwrap();
        assert_eq!(*places.lock().unwrap(), vec![Waiting::InLine(1)]);
        assert!(accounts.queued().is_empty());
    }

    /// Where the backend shares the account's slots beyond this host and all are held
    /// elsewhere, a turn gives the host's slot back and waits in line; it goes once one is
    /// free, and a turn of this host behind it is held up meanwhile only by the cap.
    #[tokio::test]
    async fn a_turn_waits_in_line_while_every_shared_slot_is_held_elsewhere() {
        let dir = tempfile::tempdir().unwrap();
        let accounts = Accounts {
            root: dir.path().to_path_buf(),
        };
        let elsewhere = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let heard = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let waiting = {
            let (accounts, elsewhere, heard) = (accounts.clone(), elsewhere.clone(), heard.clone());
            tokio::spawn(async move {
                let shared = move |_cap| {
                    let held = elsewhere.load(std::sync::atomic::Ordering::SeqCst);
                    std::future::ready(Ok((!held).then(Hold::nothing)))
                };
                let told = move |w| heard.lock().unwrap().push(w);
                accounts
                    .admit(capped("codex-z", 1), Uuid::new_v4(), 1, told, shared)
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!waiting.is_finished());
        assert_eq!(*heard.lock().unwrap(), vec![Waiting::InLine(1)]);
        // The host's slot was given back: it is free to lock.
        let free = try_slot(&dir.path().join("codex-z"), 1).unwrap();
        assert!(
            free.is_some(),
            "the host's slot is held while the turn waits"
        );
        drop(free);
        elsewhere.store(false, std::sync::atomic::Ordering::SeqCst);
        let admitted = waiting.await.unwrap().unwrap();
        assert!(try_slot(&dir.path().join("codex-z"), 1).unwrap().is_none());
        admitted.release().await;
    }

    #[test]
    fn a_ticket_no_process_holds_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        let accounts = Accounts {
            root: dir.path().to_path_buf(),
        };
        let queue = dir.path().join("claude-x").join("queue");
        dirs::ensure_private_dir(&queue).unwrap();
        let q = Queued {
            session_id: Uuid::new_v4(),
            turn: 3,
            account: "claude-x".into(),
            pid: 1,
            queued_at: 0,
            cap: 2,
            park: false,
            resumes_at: None,
            position: 0,
            admitted: false,
            orphaned: false,
        };
        let ticket = Ticket::take(&queue, &q).unwrap();
        assert_eq!(accounts.queued_turn(q.session_id).map(|q| q.turn), Some(3));
        // What a killed process leaves: the file, with no lock on it.
        let left = dir.path().join("left.json");
        fs::copy(&ticket.path, &left).unwrap();
        drop(ticket);
        let stale = queue.join(format!("{:024}-{}-3.json", 1, q.session_id));
        fs::rename(&left, &stale).unwrap();
        assert!(accounts.queued().is_empty());
        assert!(!stale.exists());
    }

    /// While the account backs off from a refusal, fewer turns than the cap are let in:
    /// those its schedule lets send now, at least 1.
    #[test]
    fn a_refused_account_lets_in_only_what_its_back_off_allows() {
        use crate::auth::backoff::Backoff;
        let dir = tempfile::tempdir().unwrap();
        let acct = dir.path().join("claude-b");
        dirs::ensure_private_dir(&acct).unwrap();
        let now = crate::clock::now_ms();
        let schedule = |b: Backoff| {
            fs::write(acct.join("backoff.json"), serde_json::to_vec(&b).unwrap()).unwrap()
        };
        // Waiting out a refusal: one turn.
        schedule(Backoff {
            refused_at: now,
            until: now + 60_000,
            cap: 2,
            step: 60_000,
        });
        assert_eq!(paced(&acct, 4), 1);
        let first = take_slot(&acct, 4).unwrap().expect("one turn goes");
        assert!(take_slot(&acct, 4).unwrap().is_none());
        // Past it: the schedule's cap, then one more a step.
        schedule(Backoff {
            refused_at: now - 1_000,
            until: now - 1,
            cap: 2,
            step: 60_000,
        });
        assert_eq!(paced(&acct, 4), 2);
        let second = take_slot(&acct, 4).unwrap().expect("a second turn goes");
        assert!(take_slot(&acct, 4).unwrap().is_none());
        // Grown back past the cap, or none at all: the cap.
        schedule(Backoff {
            refused_at: now - 10_000,
            until: now - 9_000,
            cap: 2,
            step: 1_000,
        });
        assert_eq!(paced(&acct, 4), 4);
        fs::remove_file(acct.join("backoff.json")).unwrap();
        assert_eq!(paced(&acct, 4), 4);
        drop((first, second));
    }
}
