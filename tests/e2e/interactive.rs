//! Interactive sessions (the vendor's own TUI attached to a terminal), driven through tmux:
//! keys go in with `send-keys`, the screen comes out with `capture-pane`. caw-box runs in a
//! pane of a tmux server of the test's own (its own socket), so the terminal it attaches
//! the TUI to is a real one, with a size that the test changes.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

/// Waits this long at most for the TUI to show something (a CLI's cold start included).
const SCREEN_WAIT: Duration = Duration::from_secs(90);

/// A tmux server of one test, with one window running a script; killed when dropped.
pub(crate) struct Tmux {
    /// `cbt-<run id>`; each window gets a server of its own, `<base>-<n>`.
    base: String,
    dir: PathBuf,
    script_no: u32,
}

impl Tmux {
    pub(crate) fn new(rig: &Rig) -> Tmux {
        let dir = rig.data_dir.path().join("tmux");
        std::fs::create_dir_all(&dir).unwrap();
        Tmux {
            base: format!("cbt-{}", rig.run_id),
            dir,
            script_no: 0,
        }
    }

    fn tmux(&self) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &format!("{}-{}", self.base, self.script_no)])
            .env_remove("TMUX");
        c
    }

    fn ok(&self, args: &[&str]) {
        let out = self
            .tmux()
            .args(args)
            .output()
            .expect("tmux (installed by scripts/rig.sh)");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts `caw-box ARGS` in a fresh 120x40 window, as a user would from a shell of
    /// `rig`'s. When caw-box ends, the window's script prints its exit code and the
    /// terminal's `icanon`/`echo` settings, then reads a line and echoes it back.
    pub(crate) fn start(&mut self, rig: &Rig, args: &[&str]) {
        // A new server (socket) per window: a killed one may linger on its socket a moment.
        let _ = self.tmux().arg("kill-server").output();
        self.script_no += 1;
        let cmd = rig.caw();
        let mut script = String::from("set +e\n");
        for (k, v) in cmd.get_envs() {
            let k = k.to_string_lossy();
            match v {
                Some(v) => {
                    script.push_str(&format!("export {k}={}\n", quote(&v.to_string_lossy())))
                }
                None => script.push_str(&format!("unset {k}\n")),
            }
        }
        script.push_str(&format!(
            "cd {}\n",
            quote(&rig.workspace.path().display().to_string())
        ));
        script.push_str(&quote(&cmd.get_program().to_string_lossy()));
        for a in args {
            script.push(' ');
            script.push_str(&quote(a));
        }
        script.push_str(
            "\necho \"EXIT=$?\"\n\
             echo \"TTY: $(stty -a | grep -o -- '-\\?icanon') $(stty -a | grep -o -- '-\\?echo ')\"\n\
             IFS= read -r line\n\
             echo \"READ:$line\"\n\
             sleep 600\n",
        );
        let path = self.dir.join(format!("run-{}.sh", self.script_no));
        std::fs::write(&path, script).unwrap();
        self.ok(&[
            "new-session",
            "-d",
            "-s",
            "main",
            "-x",
            "120",
            "-y",
            "40",
            &format!("bash {}", path.display()),
        ]);
    }

    pub(crate) fn screen(&self) -> String {
        let out = self
            .tmux()
            .args(["capture-pane", "-p", "-t", "main"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// Waits until the screen contains `needle`; returns the screen.
    pub(crate) fn wait_for(&self, needle: &str, what: &str) -> String {
        let deadline = Instant::now() + SCREEN_WAIT;
        loop {
            let screen = self.screen();
            if screen.contains(needle) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: '{needle}' did not appear in {SCREEN_WAIT:?}; the screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Types `text`, then Enter a moment later (a TUI takes a burst of keys ending in
    /// Enter for a paste, where Enter is a newline).
    /// Types `text`, waits until the TUI shows it, then presses Enter. (A TUI that reads
    /// the text and the Enter in one go, as a busy one does, may take both for a paste:
    /// gemini's then keeps the Enter as part of the input and never submits.)
    pub(crate) fn type_line(&self, text: &str) {
        self.ok(&["send-keys", "-t", "main", "-l", text]);
        self.wait_for(text, "the TUI did not show the typed text");
        std::thread::sleep(Duration::from_millis(800));
        self.ok(&["send-keys", "-t", "main", "Enter"]);
    }

    pub(crate) fn keys(&self, keys: &[&str]) {
        for k in keys {
            self.ok(&["send-keys", "-t", "main", k]);
            std::thread::sleep(Duration::from_millis(600));
        }
    }

    fn resize(&self, columns: u16, rows: u16) {
        self.ok(&[
            "resize-window",
            "-t",
            "main",
            "-x",
            &columns.to_string(),
            "-y",
            &rows.to_string(),
        ]);
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.tmux().arg("kill-server").output();
    }
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The size (rows, columns) of a running container's terminal, as the TUI sees it.
fn container_tty_size(rig: &Rig, container: &str) -> String {
    rig.exec(container, &["sh", "-c", "stty size </proc/1/fd/0"])
        .trim()
        .to_string()
}

/// Waits until the turn container's terminal has `rows` x `columns`.
fn assert_size_followed(rig: &Rig, container: &str, columns: u16, rows: u16) {
    let want = format!("{rows} {columns}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = container_tty_size(rig, container);
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the container's terminal is {got}, not {want}, after the resize"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Quits codex's TUI with Ctrl-C. A Ctrl-C that lands while codex still finishes the turn
/// it just showed (its answer is on screen before the turn ends, and under load that gap
/// grows) interrupts the turn instead of quitting: so once more, until the TUI is gone.
pub(crate) fn quit_codex_tui(tmux: &Tmux) {
    for _ in 0..4 {
        tmux.keys(&["C-c"]);
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if tmux.screen().contains("TTY: ") {
                return;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// After the TUI quit: caw-box exited 0 and the shell's terminal is back to normal (line
/// editing and echo: a typed line comes back whole).
pub(crate) fn assert_terminal_intact(tmux: &Tmux) {
    assert_ended_with(tmux, 0);
}

fn assert_ended_with(tmux: &Tmux, code: i32) {
    // The script prints the terminal's settings right after the exit code.
    let screen = tmux.wait_for("TTY: ", "caw-box did not end after the TUI");
    assert!(
        screen.contains(&format!("EXIT={code}")),
        "caw-box's exit code is not {code}:\n{screen}"
    );
    assert!(
        screen.contains("TTY: icanon echo"),
        "the terminal was left in raw mode:\n{screen}"
    );
    tmux.type_line("still-here");
    tmux.wait_for(
        "READ:still-here",
        "the shell did not read a line after the TUI",
    );
}

/// The session's state volume holds no copy of the key (grep as root, over every file).
fn assert_no_key_at_rest(rig: &Rig, session_id: &str) {
    let (code, out, _) = rig.run_container(bollard::models::ContainerCreateBody {
        image: Some("caw-box/base:latest".into()),
        user: Some("0:0".into()),
        entrypoint: Some(vec!["grep".into()]),
        cmd: Some(vec!["-rl".into(), TEST_KEY.into(), "/h".into()]),
        host_config: Some(bollard::models::HostConfig {
            binds: Some(vec![format!("caw-box-{session_id}:/h:ro")]),
            network_mode: Some("none".into()),
            ..Default::default()
        }),
        ..Default::default()
    });
    assert_eq!(code, 1, "files in the state volume hold the key: {out}");
}

/// After the TUI turn: no container is left, and a headless `resume RECALL` of session
/// `name` recalls `word`; returns the result object.
fn assert_headless_recall(rig: &Rig, p: P, name: &str, word: &str) -> serde_json::Value {
    assert!(
        rig.caw_containers().is_empty(),
        "the turn container is left"
    );
    let (code, json, stderr) = rig.json_turn(rig.resume_cmd(p, name, "RECALL", &[]));
    assert_eq!(code, 0, "{}: headless resume: {stderr}", p.name);
    assert_eq!(
        json["result"],
        format!("You told me to remember {word}."),
        "{json}"
    );
    json
}

fn session_id_by_name(rig: &Rig, name: &str) -> String {
    let mut c = rig.caw();
    c.args(["show", name, "--json"]);
    let out = run(c);
    assert!(out.status.success(), "show: {}", stderr_of(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["session_id"].as_str().unwrap().to_string()
}

/// The running TUI's terminal has the window's size (120x40), a typed `REMEMBER:<word>`
/// is answered, and after resizing the window to `(columns, rows)` the terminal has that.
fn answers_and_follows_a_resize(rig: &Rig, tmux: &Tmux, word: &str, (columns, rows): (u16, u16)) {
    let container = rig.wait_for_running_turn(None, Duration::from_secs(30));
    assert_size_followed(rig, &container, 120, 40);
    tmux.type_line(&format!("REMEMBER:{word}"));
    tmux.wait_for(&format!("Noted: {word}."), "the TUI did not answer");
    tmux.resize(columns, rows);
    assert_size_followed(rig, &container, columns, rows);
}

/// Starts a codex session named `name` in the TUI and waits for the TUI to be ready.
fn start_codex_tui(rig: &Rig, tmux: &mut Tmux, name: &str) {
    let key_env = format!("OPENAI_API_KEY={TEST_KEY}");
    let endpoint = rig.endpoint();
    // gpt-6-sol: for gpt-5.5 the TUI first offers a model upgrade (a one-time question).
    tmux.start(
        rig,
        &[
            "run",
            "--provider",
            "codex",
            "--name",
            name,
            "--network",
            &rig.network,
            "--endpoint",
            &endpoint,
            "--env",
            &key_env,
            "--model",
            "gpt-6-sol",
        ],
    );
    tmux.wait_for("Ask Codex to do anything", "codex's TUI did not come up");
}

/// codex: a session started in the TUI answers there, follows a resize, quits cleanly;
/// then a headless resume recalls what was told in the TUI, and an interactive resume
/// shows the whole conversation.
#[test]
fn codex_tui_session_resumes_headless_and_back() {
    let rig = Rig::new("tui-codex");
    // Session names are unique per Docker daemon: this run's own.
    let name = format!("n-{}", rig.run_id);
    let key_env = format!("OPENAI_API_KEY={TEST_KEY}");
    let mut tmux = Tmux::new(&rig);
    start_codex_tui(&rig, &mut tmux, &name);
    answers_and_follows_a_resize(&rig, &tmux, "zebra", (100, 30));
    // A protected path the agent creates in the TUI is moved aside when the turn ends
    // (issue 27; `protect::` proves the headless and detached turns).
    // (`!`: the TUI runs the command itself, in the agent's container.)
    tmux.keys(&["!"]);
    tmux.type_line("echo planted > .envrc && echo made-$((6*7))");
    tmux.wait_for("made-42", "the TUI did not run the command");
    quit_codex_tui(&tmux);
    assert_terminal_intact(&tmux);
    let screen = tmux.screen().replace('\n', "");
    assert!(
        screen.contains("the agent created protected paths in the workspace (.envrc)"),
        "no quarantine warning:\n{}",
        tmux.screen()
    );
    let id = session_id_by_name(&rig, &name);
    let quarantined = rig
        .data_dir
        .path()
        .join(format!("quarantine/{id}/turn-1/.envrc"));
    assert_eq!(std::fs::read_to_string(quarantined).unwrap(), "planted\n");
    assert!(!rig.workspace.path().join(".envrc").exists());
    let json = assert_headless_recall(&rig, CODEX, &name, "zebra");
    assert_eq!(json["turn"], 2);

    tmux.start(&rig, &["resume", &name, "--env", &key_env]);
    let screen = tmux.wait_for("You told me to remember zebra.", "codex's TUI resume");
    assert!(
        screen.contains("REMEMBER:zebra"),
        "history not shown:\n{screen}"
    );
    quit_codex_tui(&tmux);
    assert_terminal_intact(&tmux);

    let mut show = rig.caw();
    show.args(["show", &id, "--json"]);
    let shown: serde_json::Value = serde_json::from_slice(&run(show).stdout).unwrap();
    let turns = shown["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 3, "{shown}");
    assert_eq!(turns[0]["interactive"], true);
    assert!(turns[1].get("interactive").is_none());
    assert_eq!(turns[2]["status"], "success");
    rig.cleanup();
}

/// claude: a headless session resumed in the TUI shows its history; what is told there
/// is recalled by the next headless turn; the key never rests in the state volume.
#[test]
fn claude_tui_resumes_a_headless_session_and_hands_it_back() {
    let rig = Rig::new("tui-claude");
    // Session names are unique per Docker daemon: this run's own.
    let name = format!("n-{}", rig.run_id);
    let key_env = format!("ANTHROPIC_API_KEY={TEST_KEY}");
    let (code, json, stderr) =
        rig.json_turn(rig.run_cmd(CLAUDE, "REMEMBER:kiwi", &["--name", &name]));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json["result"], "Noted: kiwi.");

    let mut tmux = Tmux::new(&rig);
    tmux.start(&rig, &["resume", &name, "--env", &key_env]);
    let screen = tmux.wait_for("Noted: kiwi.", "claude's TUI did not show the history");
    assert!(screen.contains("REMEMBER:kiwi"), "{screen}");
    answers_and_follows_a_resize(&rig, &tmux, "fig", (90, 24));
    // Ctrl-C goes to the TUI, which asks for a second one; caw-box does not end.
    tmux.keys(&["C-c"]);
    let screen = tmux.wait_for(
        "Press Ctrl-C again to exit",
        "claude did not get the Ctrl-C",
    );
    assert!(
        !screen.contains("EXIT="),
        "caw-box ended on Ctrl-C:\n{screen}"
    );
    tmux.keys(&["C-c"]);
    assert_terminal_intact(&tmux);
    let id = session_id_by_name(&rig, &name);
    assert_no_key_at_rest(&rig, &id);
    let json = assert_headless_recall(&rig, CLAUDE, &name, "fig");
    assert_eq!(json["turn"], 3);
    rig.cleanup();
}

/// Without a PROMPT, `--detach` is refused on a terminal too (the TUI needs this one), and
/// nothing is created.
#[test]
fn detach_without_a_prompt_is_refused_on_a_terminal() {
    let rig = Rig::new("tui-detach");
    let mut tmux = Tmux::new(&rig);
    tmux.start(
        &rig,
        &[
            "run",
            "--provider",
            "codex",
            "-d",
            "--network",
            &rig.network,
        ],
    );
    let screen = tmux.wait_for("EXIT=", "caw-box did not end");
    assert!(screen.contains("EXIT=2"), "{screen}");
    assert!(screen.contains("--detach needs a PROMPT"), "{screen}");
    assert!(
        rig.caw_volumes().is_empty(),
        "volumes left: {:?}",
        rig.caw_volumes()
    );
    rig.cleanup();
}

/// A TUI stopped from outside (`caw-box stop`) never got to restore anything: caw-box
/// does, exits 130, and the session still resumes.
#[test]
fn tui_stopped_from_outside_leaves_the_terminal_intact() {
    let rig = Rig::new("tui-stop");
    // Session names are unique per Docker daemon: this run's own.
    let name = format!("n-{}", rig.run_id);
    let mut tmux = Tmux::new(&rig);
    start_codex_tui(&rig, &mut tmux, &name);
    tmux.type_line("REMEMBER:lynx");
    tmux.wait_for("Noted: lynx.", "codex's TUI did not answer");
    let mut stop = rig.caw();
    stop.args(["stop", &name]);
    let out = run(stop);
    assert!(out.status.success(), "stop: {}", stderr_of(&out));
    assert_ended_with(&tmux, 130);
    let screen = tmux.screen();
    assert!(
        screen.contains("TTY: icanon echo"),
        "raw mode left on:\n{screen}"
    );
    tmux.type_line("still-here");
    tmux.wait_for(
        "READ:still-here",
        "the shell did not read a line after the TUI",
    );
    assert_headless_recall(&rig, CODEX, &name, "lynx");
    rig.cleanup();
}

/// gemini and opencode: what is told in the TUI is recalled by a headless resume (their
/// keys are found in their own state after the TUI quits).
fn tui_session_resumes_headless(p: P, ready: &str, quit: &[&str]) {
    let rig = Rig::new(&format!("tui-{}", p.name));
    let endpoint = rig.endpoint();
    let mut tmux = Tmux::new(&rig);
    let name = format!("n-{}", rig.run_id);
    let key_env = format!("{}={TEST_KEY}", p.key_var);
    let mut args = vec![
        "run",
        "--provider",
        p.name,
        "--name",
        &name,
        "--network",
        &rig.network,
        "--endpoint",
        &endpoint,
        "--env",
        &key_env,
    ];
    if let Some(m) = p.model {
        args.extend(["--model", m]);
    }
    tmux.start(&rig, &args);
    tmux.wait_for(ready, &format!("{}'s TUI did not come up", p.name));
    tmux.type_line("REMEMBER:quince");
    tmux.wait_for(
        "Noted: quince.",
        &format!("{}'s TUI did not answer", p.name),
    );
    tmux.keys(quit);
    assert_terminal_intact(&tmux);
    assert_headless_recall(&rig, p, &name, "quince");
    rig.cleanup();
}

#[test]
fn gemini_tui_session_resumes_headless() {
    tui_session_resumes_headless(GEMINI, "Type your message", &["C-c", "C-c"]);
}

#[test]
fn opencode_tui_session_resumes_headless() {
    tui_session_resumes_headless(OPENCODE, "Ask anything", &["C-c"]);
}
