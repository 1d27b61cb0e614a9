//! Warm containers on Docker (`--keep-warm`, see `backend::warm`): an idle one is named
//! `<turn name>-warm`; a turn claims it by renaming it to the turn's name (the session's
//! lock: of racing renames one wins, the others find no container of that name), runs in it
//! by exec, and releases it by renaming it back once its turn is recorded. Its idle loop
//! ends it, and `auto_remove` removes it.
//!
//! A turn run by exec is this process's to drive: after `exec_in_warm`, the driver's
//! attach/start/wait/stop/remove of the turn's name act on the exec (the remove releases).

use std::time::Duration;

use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::query_parameters::RenameContainerOptions;
use futures_util::StreamExt;

use super::{is_not_found, DockerBackend};
use crate::backend::warm::{
    release_argv, stop_argv, turn_end, WarmExec, WARM_FOR_LABEL, WARM_LABEL,
};
use crate::backend::{Attached, ContainerInfo};
use crate::error::{Error, Result};

/// A turn run by exec in a warm container, by this process.
#[derive(Debug, Clone)]
pub(super) struct WarmTurn {
    exec: WarmExec,
    /// Set once the exec is made (at the attach).
    id: Option<String>,
    /// Whether the turn's command made the container idle itself.
    released: bool,
}

/// The name of turn `name`'s container while it is idle.
pub(super) fn idle_name(name: &str) -> String {
    format!("{name}-warm")
}

impl DockerBackend {
    fn warm_turn(&self, name: &str) -> Option<WarmTurn> {
        self.warm
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    /// Whether `name` is a turn this process runs in a warm container.
    pub(super) fn is_warm_turn(&self, name: &str) -> bool {
        self.warm_turn(name).is_some()
    }

    pub(super) fn exec_in_warm(&self, name: &str, exec: WarmExec) {
        self.warm.lock().unwrap_or_else(|e| e.into_inner()).insert(
            name.to_string(),
            WarmTurn {
                exec,
                id: None,
                released: false,
            },
        );
    }

    /// Renames the idle warm container of turn `name` to `name`: it is the turn's then.
    /// `None`: there is none (or a racing turn took it first).
    pub(super) async fn claim_warm(&self, name: &str) -> Result<Option<ContainerInfo>> {
        let idle = idle_name(name);
        let renamed = self
            .docker
            .rename_container(
                &idle,
                RenameContainerOptions {
                    name: name.to_string(),
                },
            )
            .await;
        match renamed {
            Ok(()) => self.inspect_container(name).await,
            // None idle, or the turn's name is taken (a turn runs): a cold start finds out.
            Err(e) if is_not_found(&e) || super::is_conflict(&e) || super::is_name_taken(&e) => {
                Ok(None)
            }
            // A racing turn renamed it meanwhile (the daemon found it by its old name).
            Err(e) if super::daemon_message(&e).contains("same name as its current name") => {
                Ok(None)
            }
            Err(e) => Err(self.failed(format_args!("take the warm container '{idle}'"), &e)),
        }
    }

    /// The turn (and its driver's pid) that runs in the warm container `name`, read from its
    /// execs' commands.
    pub(super) async fn turn_in_warm(&self, name: &str) -> Result<Option<(u32, u32)>> {
        let c = match self.docker.inspect_container(name, None).await {
            Ok(c) => c,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(self.failed(format_args!("inspect container '{name}'"), &e)),
        };
        for id in c.exec_ids.unwrap_or_default() {
            let Ok(exec) = self.docker.inspect_exec(&id).await else {
                continue;
            };
            let args = exec.process_config.and_then(|p| p.arguments);
            let turn = args.as_deref().and_then(crate::backend::warm::turn_of);
            if exec.running == Some(true) && turn.is_some() {
                return Ok(turn);
            }
        }
        Ok(None)
    }

    /// How long turn `name`'s idle warm container stays idle after a turn, if there is one
    /// (running).
    pub(super) async fn warm_idle_for(&self, name: &str) -> Result<Option<u64>> {
        Ok(self
            .inspect_container(&idle_name(name))
            .await?
            .filter(|c| c.running())
            .and_then(|c| c.label(WARM_FOR_LABEL)?.parse().ok()))
    }

    /// Renames the warm container `name`, made for no turn, to its idle name.
    pub(super) async fn idle_warm(&self, name: &str) -> Result<()> {
        self.docker
            .rename_container(
                name,
                RenameContainerOptions {
                    name: idle_name(name),
                },
            )
            .await
            .map_err(|e| self.failed(format_args!("make container '{name}' idle"), &e))
    }

    /// Renames turn `name`'s idle warm container, made for no turn, to a pool's box name.
    pub(super) async fn pool_park(&self, name: &str, box_name: &str) -> Result<()> {
        self.docker
            .rename_container(
                &idle_name(name),
                RenameContainerOptions {
                    name: box_name.to_string(),
                },
            )
            .await
            .map_err(|e| self.failed(format_args!("park container '{name}' in its pool"), &e))
    }

    /// Renames the pool's box `box_name` to turn `name`'s idle name: `false` when it is gone
    /// or a racing claim renamed it first (the daemon renames one at a time).
    pub(super) async fn pool_claim(&self, box_name: &str, name: &str) -> Result<bool> {
        let renamed = self
            .docker
            .rename_container(
                box_name,
                RenameContainerOptions {
                    name: idle_name(name),
                },
            )
            .await;
        match renamed {
            Ok(()) => Ok(true),
            Err(e) if is_not_found(&e) || super::is_conflict(&e) || super::is_name_taken(&e) => {
                Ok(false)
            }
            Err(e) if super::daemon_message(&e).contains("same name as its current name") => {
                Ok(false)
            }
            Err(e) => Err(self.failed(format_args!("claim the pool's box '{box_name}'"), &e)),
        }
    }

    /// Removes turn `name`'s idle warm container, if there is one.
    pub(super) async fn remove_warm(&self, name: &str) -> Result<bool> {
        let idle = idle_name(name);
        let Some(c) = self.inspect_container(&idle).await? else {
            return Ok(false);
        };
        crate::backend::Backend::remove_found(self, &c).await?;
        Ok(true)
    }

    /// Makes and starts the exec of the warm turn `name`, attached.
    pub(super) async fn warm_attach(&self, name: &str, stdin: bool) -> Result<Attached> {
        let turn = self
            .warm_turn(name)
            .ok_or_else(|| Error::environment(format!("no warm turn in '{name}'")))?;
        let exec = self
            .docker
            .create_exec(
                name,
                CreateExecOptions {
                    cmd: Some(turn.exec.argv.clone()),
                    env: Some(turn.exec.env.clone()),
                    working_dir: Some(turn.exec.working_dir.clone()),
                    attach_stdin: Some(stdin),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| self.failed(format_args!("run the turn in container '{name}'"), &e))?;
        if let Some(t) = self
            .warm
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(name)
        {
            t.id = Some(exec.id.clone());
        }
        let started = self
            .docker
            .start_exec(
                &exec.id,
                Some(StartExecOptions {
                    detach: false,
                    tty: false,
                    output_capacity: None,
                }),
            )
            .await
            .map_err(|e| self.failed(format_args!("start the turn in container '{name}'"), &e))?;
        match started {
            StartExecResults::Attached { output, input } => Ok(Attached {
                output: self
                    .output_stream(output, format!("read the output of container '{name}'")),
                input,
            }),
            StartExecResults::Detached => Err(Error::environment(format!(
                "the turn in container '{name}' started detached"
            ))),
        }
    }

    /// Waits for the warm turn `name`'s exec to end: its exit code. Docker's API has no
    /// wait for an exec: its state is polled, quickly at first (a driver waits once the
    /// CLI ended: the turn's command ends within moments).
    pub(super) async fn warm_wait(&self, name: &str) -> Result<i64> {
        let Some(id) = self.warm_turn(name).and_then(|t| t.id) else {
            return Ok(-1);
        };
        let started = std::time::Instant::now();
        loop {
            match self.docker.inspect_exec(&id).await {
                Ok(e) if e.running != Some(true) => {
                    let (released, code) = turn_end(e.exit_code.unwrap_or(-1));
                    if let Some(t) = self
                        .warm
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get_mut(name)
                    {
                        t.released = released;
                    }
                    return Ok(code);
                }
                Ok(_) => {
                    let fast = started.elapsed() < Duration::from_secs(2);
                    tokio::time::sleep(Duration::from_millis(if fast { 5 } else { 100 })).await
                }
                // The container is gone, and the turn with it.
                Err(e) if is_not_found(&e) => return Ok(-1),
                Err(e) => {
                    return Err(self.failed(format_args!("wait for the turn in '{name}'"), &e))
                }
            }
        }
    }

    /// Runs `argv` in container `name` to its end: its exit code.
    pub(super) async fn exec_to_end(&self, name: &str, argv: Vec<String>) -> Result<i64> {
        let exec = self
            .docker
            .create_exec(
                name,
                CreateExecOptions {
                    cmd: Some(argv),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| self.failed(format_args!("run a command in container '{name}'"), &e))?;
        if let StartExecResults::Attached { mut output, .. } = self
            .docker
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| self.failed(format_args!("run a command in container '{name}'"), &e))?
        {
            while output.next().await.is_some() {}
        }
        let inspected =
            self.docker.inspect_exec(&exec.id).await.map_err(|e| {
                self.failed(format_args!("run a command in container '{name}'"), &e)
            })?;
        Ok(inspected.exit_code.unwrap_or(-1))
    }

    /// Stops the turn running in warm container `name` (the container stays): `false` when
    /// `name` is no warm container.
    pub(super) async fn stop_warm_turn(&self, name: &str, grace: Duration) -> Result<bool> {
        if !self.is_warm_turn(name) {
            let warm = self
                .inspect_container(name)
                .await?
                .is_some_and(|c| c.running() && c.label(WARM_LABEL).is_some());
            if !warm {
                return Ok(false);
            }
        }
        self.exec_to_end(name, stop_argv(grace)).await?;
        Ok(true)
    }

    /// Ends the container `going`, renamed aside after its last turn; the engine removes
    /// it (`auto_remove`). Where the kill fails, it is removed here.
    ///
    /// SIGTERM, which its idle loop ends on (no turn runs in it now): the daemon answers a
    /// SIGKILL only once the container has died (0.05-0.2 s on the turn's path, measured),
    /// any other signal once it is sent.
    async fn kill_going(&self, going: &str) -> Result<()> {
        let killed = self
            .docker
            .kill_container(
                going,
                Some(bollard::query_parameters::KillContainerOptions {
                    signal: "SIGTERM".to_string(),
                }),
            )
            .await;
        match killed {
            Ok(()) => Ok(()),
            // Gone, or ending already.
            Err(e) if is_not_found(&e) || super::is_conflict(&e) => Ok(()),
            Err(_) => self.remove_container(going, true).await,
        }
    }

    /// After the warm turn `name` was recorded: makes its container idle again and renames
    /// it back; a container that cannot be made so is removed.
    pub(super) async fn release_warm(&self, name: &str) -> Result<()> {
        let turn = self
            .warm
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        let Some(turn) = turn else {
            return Ok(());
        };
        if turn.exec.goes_after {
            // Renamed first: the session's lock is free at once, and no one who waits for
            // the turn meets its container stopped half-way through its removal.
            let going = format!("{name}-going");
            let renamed = self
                .docker
                .rename_container(
                    name,
                    RenameContainerOptions {
                        name: going.clone(),
                    },
                )
                .await;
            // Killed, not removed: a warm container removes itself once it ended
            // (`auto_remove`), so its removal (its scratch volume and network let go, some
            // 70 ms of the daemon's) is not on the turn's path.
            return match renamed {
                Ok(()) => self.kill_going(&going).await,
                Err(_) => self.remove_container(name, true).await,
            };
        }
        let idle = if turn.released {
            Ok(0)
        } else {
            self.exec_to_end(name, release_argv(&turn.exec.run_dir))
                .await
        };
        let released = match idle {
            Ok(0) => self
                .docker
                .rename_container(
                    name,
                    RenameContainerOptions {
                        name: idle_name(name),
                    },
                )
                .await
                .map_err(|e| self.failed(format_args!("release container '{name}'"), &e)),
            Ok(code) => Err(Error::environment(format!(
                "making container '{name}' idle failed ({code})"
            ))),
            Err(e) => Err(e),
        };
        if let Err(e) = released {
            tracing::debug!("{e}; removing it");
            self.remove_container(name, true).await?;
        }
        Ok(())
    }

    /// Waits, from a process that does not drive it, for the turn in warm container `name`
    /// to be released (the name goes) or the container to end.
    pub(super) async fn wait_warm_elsewhere(&self, c: &ContainerInfo) -> Result<i64> {
        loop {
            match self.inspect_container(&c.name).await? {
                Some(now) if now.id == c.id && now.running() => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                _ => return Ok(0),
            }
        }
    }
}
