//! Warm containers (`--keep-warm`), the part every backend shares: a turn's container whose
//! main process is an idle loop instead of the CLI, so that the session's turns run in it
//! one after the other (each by an exec of the image's entrypoint), and which ends itself
//! when it was idle for its time. What is here is the loop's protocol, in the container's
//! own shell: no host process times a warm container out.
//!
//! Not here: when a turn keeps its container warm or takes a warm one (`session::warm`),
//! and how a backend names, claims and execs in one (`docker/warm.rs`).

/// The label that marks a warm container; its value is the fingerprint of the settings it
/// was made with (a turn with other settings cannot run in it).
pub const WARM_LABEL: &str = "io.caw-box.warm";
/// The label that holds how long (seconds) a warm container stays idle.
pub const WARM_FOR_LABEL: &str = "io.caw-box.warm-for";

/// The loop keeps its state in the container's own /tmp (`.caw-box-warm`): its pid and the
/// running turn's (`turn.pid`).
///
/// The idle loop, the container's command (`bash -c IDLE warm SECONDS`): it extends its
/// deadline while a turn's process (`turn.pid`) lives and exits when the deadline passes,
/// ending the container. A stop of the container stops the running turn first.
const IDLE: &str = r#"W=/tmp/.caw-box-warm; secs=$1
mkdir -p "$W" && echo $$ $PPID >"$W/loop.pid" || exit 1
busy() { { read -r p <"$W/turn.pid"; } 2>/dev/null && kill -0 "$p" 2>/dev/null; }
stop() {
  if busy; then
    kill -TERM "$p" 2>/dev/null; n=0
    while kill -0 "$p" 2>/dev/null && [ $n -lt 90 ]; do sleep 0.1; n=$((n+1)); done
  fi
  exit 0
}
trap stop TERM INT HUP
printf -v now '%(%s)T' -1; until=$((now + secs))
while :; do
  printf -v now '%(%s)T' -1
  busy && until=$((now + secs))
  [ "$now" -ge "$until" ] && exit 0
  sleep 1 & wait $!
done"#;

/// The exit code of a warm turn's command when the turn's entrypoint ended 0 (the turn is
/// recorded) but the container was not made idle, because the driver still reads the
/// turn's runtime directory (a stop request, refreshed credentials): the driver then does
/// it ([`release_argv`]). An entrypoint that ends 0 otherwise leaves it idle: exit 0.
pub const RECORDED_NOT_RELEASED: i64 = 86;

/// What the end of a warm turn's command says, in both backends: whether the command made
/// the container idle itself (it ended 0), and the turn's exit code
/// ([`RECORDED_NOT_RELEASED`] is a recorded turn: 0, its release still to do).
pub fn turn_end(code: i64) -> (bool, i64) {
    let turn = if code == RECORDED_NOT_RELEASED {
        0
    } else {
        code
    };
    (code == 0, turn)
}

/// `release`: makes the container idle after a recorded turn: nothing of the turn stays:
/// no process (what the CLI left running), no runtime file (`$1`: the runtime directory),
/// no temporary file. Skips the container's init, the entrypoint and the loop (with its
/// sleep), and the calling shell. Its patterns need `shopt -s extglob` before it is read.
macro_rules! release_fn {
    () => {
        r#"release() {
  local run=$1 loop entry d p s q keep
  { read -r loop entry <"$W/loop.pid"; } 2>/dev/null || return 1
  rm -f "$W/turn.pid"
  # The loop and every process above it (a pod's wrapper between it and init, too).
  keep=" 1 $$ " q=$loop
  while [ -n "$q" ] && [ "$q" -gt 1 ] && [[ $keep != *" $q "* ]]; do
    keep+="$q "
    { read -r s <"/proc/$q/stat"; } 2>/dev/null || break
    s=${s##*) }; set -- $s; q=$2
  done
  keep+="$entry "
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [[ $keep == *" $p "* ]] && continue
    { read -r s <"$d/stat"; } 2>/dev/null || continue
    s=${s##*) }; set -- $s
    case $2 in $loop|$$) continue ;; esac
    kill -KILL "$p" 2>/dev/null
  done
  local f=("$run"/* /tmp/!(.caw-box-warm))
  [ ${#f[@]} -eq 0 ] || rm -rf -- "${f[@]}" 2>/dev/null
  return 0
}
"#
    };
}

/// A turn in a warm container (`bash -c TURN turn N PID ENTRYPOINT ARGV...`: turn N of the
/// driver PID, which a process that looks at the container reads back, `turn_of`): once the
/// idle loop runs (the first turn's exec comes right after the container's start), runs
/// the entrypoint as a child that notes its own pid for the loop (and for a stop, which
/// signals it); once it ended 0 (recorded), makes the container idle at once when the
/// driver reads nothing more of the runtime directory (`$CAW_BOX_RUN_DIR`), so that no
/// second exec is on the turn's path; else exits [`RECORDED_NOT_RELEASED`].
///
/// For whoever records the turn if its driver is gone (an exec's output is kept by no log),
/// in the runtime directory (a volume the engine reads from outside, unlike /tmp): the
/// turn, driver and start, the entrypoint's stdout as well, and its exit code once it
/// ended ([`ADOPT_FILES`]); a release empties the directory.
const TURN: &str = concat!(
    "W=${CAW_BOX_WARM_DIR:-/tmp/.caw-box-warm}; run=${CAW_BOX_RUN_DIR:-/run/caw-box}\n",
    // A container just started: its loop may not have made its directory yet (up to 5 s).
    "for ((i = 0; i < 50; i++)); do [ -e \"$W/loop.pid\" ] && break; sleep 0.1; done\n",
    "printf -v t '%(%s)T' -1\n",
    "echo \"$1 $2 $t\" >\"$run/caw-box-turn.of\" && rm -f \"$run/caw-box-turn.rc\" || exit 1\n",
    "shift 2; shopt -s nullglob dotglob extglob\n",
    release_fn!(),
    r#"bash -c 'echo $$ >"$0" && exec "$@"' "$W/turn.pid" "$@" > >(tee "$run/caw-box-turn.out")
rc=$?
wait $!
echo "$rc" >"$run/caw-box-turn.rc"
[ "$rc" -eq 0 ] || exit "$rc"
if [ ! -e "$run/stop-requested" ] && [ -z "$(ls -A "$run/auth/home-out" 2>/dev/null)" ]; then
  release "$run" && exit 0
fi
exit 86"#
);

/// Where a warm turn's command keeps, in the turn's runtime directory, the turn, its driver
/// and when it started (`N PID UNIX-SECONDS`), the entrypoint's stdout, and its exit code
/// once it ended ([`TURN`]).
pub const ADOPT_FILES: [&str; 3] = ["caw-box-turn.of", "caw-box-turn.out", "caw-box-turn.rc"];

/// Stops the running turn (`bash -c STOP stop GRACE`): SIGTERM to the entrypoint, which
/// stops the CLI and takes the credentials out of HOME, SIGKILL after GRACE seconds.
const STOP: &str = r#"W=/tmp/.caw-box-warm
{ read -r p <"$W/turn.pid"; } 2>/dev/null || exit 0
kill -TERM "$p" 2>/dev/null || exit 0
n=0; while kill -0 "$p" 2>/dev/null && [ $n -lt $(($1 * 10)) ]; do sleep 0.1; n=$((n+1)); done
kill -KILL "$p" 2>/dev/null; exit 0"#;

/// Makes the container idle after a recorded turn (`bash -c RELEASE release RUN_DIR`)
/// where its turn's command did not ([`RECORDED_NOT_RELEASED`], or the turn was killed).
/// Exits 0 once it is so.
const RELEASE: &str = concat!(
    "W=/tmp/.caw-box-warm\n",
    "shopt -s nullglob dotglob extglob\n",
    release_fn!(),
    r#"release "$1" && exit 0
exit 1"#
);

/// The warm container's command: the idle loop for `secs` seconds.
pub fn idle_argv(secs: u64) -> Vec<String> {
    vec![
        "bash".into(),
        "-c".into(),
        IDLE.into(),
        "warm".into(),
        secs.to_string(),
    ]
}

/// A turn's command in a warm container: `entrypoint` (the image's, with the turn's
/// `argv`), noted for the idle loop, as turn `turn` of the driver `driver` (a pid).
pub fn turn_argv(turn: u32, driver: u32, entrypoint: &[&str], argv: &[String]) -> Vec<String> {
    let mut v: Vec<String> = vec!["bash".into(), "-c".into(), TURN.into(), "turn".into()];
    v.extend([turn.to_string(), driver.to_string()]);
    v.extend(entrypoint.iter().map(|s| s.to_string()));
    v.extend(argv.iter().cloned());
    v
}

/// The turn and its driver's pid of a warm turn's command as the engine reports it (its
/// arguments after `bash`); `None` for any other command.
pub fn turn_of(arguments: &[String]) -> Option<(u32, u32)> {
    match arguments {
        [c, script, _, turn, driver, ..] if c == "-c" && script == TURN => {
            Some((turn.parse().ok()?, driver.parse().ok()?))
        }
        _ => None,
    }
}

/// The command that stops the turn running in a warm container within `grace`.
pub fn stop_argv(grace: std::time::Duration) -> Vec<String> {
    vec![
        "bash".into(),
        "-c".into(),
        STOP.into(),
        "stop".into(),
        grace.as_secs().max(1).to_string(),
    ]
}

/// The command that makes a warm container idle after its turn; `run_dir`: the turn's
/// runtime directory, emptied.
pub fn release_argv(run_dir: &str) -> Vec<String> {
    vec![
        "bash".into(),
        "-c".into(),
        RELEASE.into(),
        "release".into(),
        run_dir.into(),
    ]
}

/// A turn to run in a warm container by exec: the command and how.
#[derive(Debug, Clone, PartialEq)]
pub struct WarmExec {
    pub argv: Vec<String>,
    /// `KEY=VALUE`, over the container's; never secrets.
    pub env: Vec<String>,
    pub working_dir: String,
    /// The turn's runtime directory, emptied when the turn is released.
    pub run_dir: String,
    /// The container goes after the turn instead of waiting idle for the next: a pool's box
    /// (`session::lifecycle::pool`) that ran a first turn of a session that keeps no
    /// container warm, as a cold turn's container goes.
    pub goes_after: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a 0 is a release the command did; 86 is a recorded turn (0) to release; the
    /// rest are the turn's own codes.
    #[test]
    fn a_turns_end_says_who_releases() {
        assert_eq!(turn_end(0), (true, 0));
        assert_eq!(turn_end(RECORDED_NOT_RELEASED), (false, 0));
        assert_eq!(turn_end(1), (false, 1));
        assert_eq!(turn_end(-1), (false, -1));
    }

    /// The scripts are valid bash (the release's patterns need extglob, which they set on a
    /// line before them: `-n` does not run it), and the turn wrapper notes the turn's pid,
    /// passes its arguments on unchanged and ends with its exit code.
    #[test]
    fn the_scripts_parse_and_the_turn_runs_its_arguments() {
        for script in [IDLE, TURN, STOP, RELEASE] {
            let out = std::process::Command::new("bash")
                .args(["-O", "extglob", "-n", "-c", script])
                .output()
                .unwrap();
            assert!(out.status.success(), "{script}: {out:?}");
        }
        let argv = turn_argv(3, 77, &["/entry"], &["codex".into(), "a b".into()]);
        assert_eq!(&argv[6..], ["/entry", "codex", "a b"]);
        assert_eq!(turn_of(&argv[1..]), Some((3, 77)));
        assert_eq!(turn_of(&idle_argv(5)[1..]), None);
        let turn = |warm_dir: &std::path::Path| {
            // A command that fails: no release is tried (it would need the loop's note,
            // which is not here either).
            std::process::Command::new(&argv[0])
                .args(&argv[1..4])
                .args(["3", "77", "bash", "-c", "echo ran $1; exit 3", "x", "a b"])
                .env("CAW_BOX_WARM_DIR", warm_dir)
                .env("CAW_BOX_RUN_DIR", warm_dir)
                .output()
                .unwrap()
        };
        // No loop (after waiting 5 s for one): the note fails and nothing runs.
        let out = turn(std::path::Path::new("/nonexistent"));
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("ran"),
            "{out:?}"
        );
        let dir = tempfile::tempdir().unwrap();
        // The loop starts a moment after the turn's command: the turn waits for it.
        let note = dir.path().join("loop.pid");
        let loop_starts = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            std::fs::write(note, "1 0\n").unwrap();
        });
        let out = turn(dir.path());
        loop_starts.join().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "ran a b\n", "{out:?}");
        assert_eq!(out.status.code(), Some(3), "{out:?}");
        let pid = std::fs::read_to_string(dir.path().join("turn.pid")).unwrap();
        assert!(pid.trim().parse::<u32>().is_ok(), "{pid}");
        // What an adopter reads: the turn and driver, the output, the exit code.
        let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap();
        let of = read("caw-box-turn.of");
        let (noted, at) = of.trim_end().rsplit_once(' ').unwrap();
        assert_eq!(noted, "3 77");
        assert!(at.parse::<u64>().unwrap() > 1_700_000_000, "{of}");
        assert_eq!(read("caw-box-turn.out"), "ran a b\n");
        assert_eq!(read("caw-box-turn.rc"), "3\n");
    }
}
