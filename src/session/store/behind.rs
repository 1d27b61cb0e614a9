//! A warm turn's checkpoint, taken behind the turn: its container was made before the turn
//! (so without the turn's checkpoint volume), and a helper takes it instead, started while
//! the turn runs and told to go once the turn is recorded ([`arm`]), or started after the
//! turn where it was not armed ([`take_behind`]). [`super::checkpoint::settle`] waits for it.

use uuid::Uuid;

use super::checkpoint::{new_volume, new_volume_of, settle, take_spec, Source, TAKE_SCRIPT};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::session::store::names;

/// Takes the checkpoint of a warm turn behind it where it was not armed beside the turn
/// ([`arm`]: an adopted warm turn's, or arming failed): its volume made and a helper
/// started that removes itself when done, not waited for, so the turn ends without it. The
/// caller holds the session's lock. On failure to start it, nothing of it is left.
pub async fn take_behind(backend: &impl Backend, source: &Source<'_>, turn: u32) -> Result<()> {
    let id = source.session_id;
    settle(backend, id).await?;
    let (checkpoint, volume) = new_volume(backend, source, turn).await?;
    let mut spec = take_spec(source, &checkpoint, &volume);
    spec.auto_remove = true;
    let name = names::checkpoint_behind(id);
    let started = async {
        backend.create_helper(&name, &spec).await?;
        backend.start_container(&name).await
    };
    if let Err(e) = started.await {
        let _ = backend.remove_container(&name, true).await;
        let _ = backend.remove_volume(&volume).await;
        return Err(e);
    }
    Ok(())
}

/// A warm turn's checkpoint helper, started while the turn runs and waiting for the word
/// ([`arm`]).
pub struct Armed {
    input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    volume: String,
    session_id: Uuid,
}

impl std::fmt::Debug for Armed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Armed")
            .field("volume", &self.volume)
            .finish()
    }
}

/// The helper's script: the take once its driver says `go` (the turn is recorded); at the
/// end of its stdin without it (the turn was not, or its driver is gone), none.
fn armed_script() -> String {
    format!("IFS= read -r go || exit 0\n[ \"$go\" = go ] || exit 0\n{TAKE_SCRIPT}")
}

/// Arms the checkpoint of a warm turn (its container, made before the turn, has no
/// checkpoint volume of its own) while the turn runs: its volume made, and a helper created,
/// attached and started that waits on its stdin, so that the turn's end only writes a word
/// ([`Armed::fire`]) instead of waiting for a container to start. The helper removes itself
/// when done; the next turn, a fork, an export, a prune and an adopter wait for it
/// ([`settle`]). A helper that fails leaves its checkpoint without `info.json`: no later
/// checkpoint is taken on top of it (the next one holds every file) and no restore applies
/// it (it says so). The caller holds the session's lock and has settled the last helper.
/// On failure nothing of it is left.
pub async fn arm(backend: &impl Backend, source: &Source<'_>, turn: u32) -> Result<Armed> {
    let id = source.session_id;
    let (checkpoint, volume) = new_volume_of(backend, source, turn, true).await?;
    let mut spec = take_spec(source, &checkpoint, &volume);
    spec.entrypoint = vec!["bash".into(), "-c".into(), armed_script()];
    // Taken when the turn has ended, not now.
    spec.env.retain(|e| !e.starts_with("CKPT_AT="));
    (spec.stdin, spec.stdin_once, spec.auto_remove) = (true, true, true);
    let name = names::checkpoint_behind(id);
    let armed = async {
        backend.create_helper(&name, &spec).await?;
        let attached = backend.attach(&name, true).await?;
        backend.start_container(&name).await?;
        Ok::<_, Error>(attached.input)
    };
    match armed.await {
        Ok(input) => Ok(Armed {
            input,
            volume,
            session_id: id,
        }),
        Err(e) => {
            let _ = backend.remove_container(&name, true).await;
            let _ = backend.remove_volume(&volume).await;
            Err(e)
        }
    }
}

impl Armed {
    /// The turn is recorded: its checkpoint is taken now, behind it.
    pub async fn fire(mut self) -> Result<()> {
        use tokio::io::AsyncWriteExt;
        let said = async {
            self.input.write_all(b"go\n").await?;
            self.input.flush().await?;
            self.input.shutdown().await
        };
        said.await.map_err(|e| {
            Error::environment(format!(
                "the checkpoint helper of session {} did not take the word: {e}",
                self.session_id
            ))
        })
    }

    /// The turn was not recorded: its helper ends without a checkpoint, whose volume goes.
    /// The caller still holds the session's lock (the next turn would make a volume of the
    /// same name).
    pub async fn disarm(self, backend: &impl Backend) {
        let Armed {
            input,
            volume,
            session_id,
        } = self;
        // Its stdin's end: the helper exits.
        drop(input);
        if let Err(e) = settle(backend, session_id).await {
            tracing::warn!("{e}");
        }
        if let Err(e) = backend.remove_volume(&volume).await {
            tracing::warn!("could not remove the unused checkpoint volume '{volume}': {e}");
        }
    }
}

/// A warm turn's checkpoint as its driver holds it: armed beside the turn ([`arm`]), then,
/// once the turn is recorded under its lock ([`Arming::recorded`]), fired when the driver
/// is done with the turn ([`Arming::fire`]), so that the helper's copy does not compete with
/// the turn's last steps; not recorded, disarmed under the lock ([`Arming::disarm`]).
#[derive(Default)]
pub(in crate::session) struct Arming(std::sync::Mutex<ArmState>);

#[derive(Default)]
enum ArmState {
    #[default]
    None,
    Arming(tokio::task::JoinHandle<Result<Armed>>),
    Recorded(Armed),
}

impl Arming {
    fn take(&self) -> ArmState {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn put(&self, state: ArmState) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = state;
    }

    /// Whether a checkpoint was armed beside the turn (it ran warm: in the session's warm
    /// container, or a pool's box).
    pub(in crate::session) fn is_armed(&self) -> bool {
        !matches!(
            *self.0.lock().unwrap_or_else(|e| e.into_inner()),
            ArmState::None
        )
    }

    /// The arming under way (a task of [`arm`]).
    pub(in crate::session) fn start(&self, task: tokio::task::JoinHandle<Result<Armed>>) {
        self.put(ArmState::Arming(task));
    }

    /// The turn is recorded (its lock still held): `true` when its helper is armed and
    /// waits for [`Arming::fire`]; `false`: nothing was armed (the caller takes the
    /// checkpoint another way, under the lock).
    pub(in crate::session) async fn recorded(&self) -> bool {
        let armed = match self.take() {
            ArmState::Arming(task) => match task.await {
                Ok(Ok(armed)) => armed,
                Ok(Err(e)) => {
                    tracing::debug!("the checkpoint was not armed: {e}");
                    return false;
                }
                Err(e) => {
                    tracing::debug!("arming the checkpoint failed: {e}");
                    return false;
                }
            },
            ArmState::Recorded(armed) => armed,
            ArmState::None => return false,
        };
        self.put(ArmState::Recorded(armed));
        true
    }

    /// Where the turn was not recorded, while it still holds the lock: what was armed ends
    /// unwritten.
    pub(in crate::session) async fn disarm(&self, backend: &impl Backend) {
        match self.take() {
            ArmState::Arming(task) => {
                if let Ok(Ok(armed)) = task.await {
                    armed.disarm(backend).await;
                }
            }
            recorded @ ArmState::Recorded(_) => self.put(recorded),
            ArmState::None => {}
        }
    }

    /// The driver is done with a recorded turn: its checkpoint is taken now.
    pub(in crate::session) async fn fire(&self, backend: &impl Backend) {
        match self.take() {
            ArmState::Recorded(armed) => {
                if let Err(e) = armed.fire().await {
                    tracing::warn!("no checkpoint of the turn: {e}");
                }
            }
            ArmState::Arming(task) => {
                if let Ok(Ok(armed)) = task.await {
                    armed.disarm(backend).await;
                }
            }
            ArmState::None => {}
        }
    }
}

/// Starts `caw-box __settle SESSION` in the background, detached from this process (its
/// output goes nowhere): it waits for the container that finishes session `session_id`'s
/// turn behind it ([`names::checkpoint_behind`]) to end, and removes it. `false` where it
/// could not be started (the caller then waits for it itself).
pub fn settle_in_background(session_id: Uuid) -> bool {
    // The `caw-box` binary: the one installed as the driver, or this one; never a program
    // that embeds caw-box as a library (it would be started with arguments it knows not).
    let exe = match crate::connection::installed().driver {
        Some(driver) => driver,
        None => match std::env::current_exe() {
            Ok(exe) if exe.file_stem().is_some_and(|s| s == "caw-box") => exe,
            _ => return false,
        },
    };
    let spawned = std::process::Command::new(exe)
        .args(["-q", "__settle", &session_id.to_string()])
        .envs(crate::connection::installed().child_env())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    match spawned {
        // Reaped by nobody: it outlives this process, and init takes it then.
        Ok(child) => {
            drop(child);
            true
        }
        Err(e) => {
            tracing::debug!("could not start the settling of session {session_id}: {e}");
            false
        }
    }
}
