//! `make bench`: caw-box's costs, measured on this machine, medians over repeated runs.
//!
//! A program, not a test: it prints a table and writes target/bench.json, and checks each
//! number against its target (exit 1 when one is missed). `--smoke` runs every part small
//! and fast, so CI keeps it from rotting; smoke numbers are not held to the targets.
//!
//! Parts: cold start of `caw-box --version`; event parsing and rendering throughput per
//! provider; listing and TARGET resolution with 1,000 sessions; per provider, a `run` and a
//! `resume` turn against plain `docker run` of the same image, command, mounts and env,
//! against the stub model on an internal network (ratios, same run; caw-box's turns use a
//! collected key, so they are brokered, as by default; docker run gets the key in its env);
//! peak RSS of caw-box during a turn (of the shipped static musl binary, `make dist`, when
//! CAW_BOX_BENCH_SHIPPED names it, beside this bench's gnu build); 32 turns at once against the same turns one by one;
//! the bind-mode git baseline of `run` (hardened git on this machine) against plain git;
//! a codex `run` and `resume` on gVisor (`--runtime runsc`) against plain `docker run
//! --runtime runsc` (part `runsc`, when the daemon has that runtime).
//!
//! A turn's ratio is the median of paired ratios: each caw-box turn against the plain
//! `docker run` turn just before or after it (the order alternates), so that the machine's
//! slower and faster spells (a shared 2-core machine: ±10% between runs) fall on both.
//!
//! Part `cluster` (also alone: `make bench-cluster`; not in `--smoke`) times a codex turn on
//! ../shared/k8s-lab against a plain pod: it takes the machine's one lab (`down`, `up`, and
//! `down` when it ends), so no Kubernetes test may run meanwhile.
//!
//! Part `checkpoints` ([`checkpoints`]): a codex turn keeping checkpoints against one that
//! keeps none (200 MB copy-mode workspace), the bytes the checkpoints hold, and `fork`
//! against a plain `docker run` copying the same volumes with `cp -a`.
//!
//! Part `egress`: codex's first turn and resume under `--egress locked` against plain
//! `docker run` (the `turns` part's run under the default, `balanced`: its proxy is the
//! shared one, its turns pay none to start).
//!
//! Part `pool` ([`pool`]): a new session's codex first turn from a pool (`caw-box pool`)
//! against plain `docker run` (target <= 0.5) and against a cold caw-box run, and a ready
//! box's memory at rest.
//!
//! Part `admission`: what `--per-account` (and the account's back-off) adds to a turn when its
//! account has a free slot.
//!
//! To iterate on one number: `--only PART` (`cold`, `parse`, `listing`, `gitbase`, `admission`, `turns`,
//! `runsc`, `concurrent`, `checkpoints`, `egress`, `pool`, `cluster`; repeatable) runs just those parts, `--provider P` (repeatable)
//! just those providers' turns, `--reps N` sets the repetitions of each turn (default: 31
//! for codex, 21 for claude, 11 for the slower opencode and gemini turns). `BENCH_DEBUG=1`
//! prints every turn's samples.

#![allow(clippy::print_stdout, clippy::print_stderr)]

#[path = "bench/checkpoints.rs"]
mod checkpoints;
#[path = "bench/pool.rs"]
mod pool;

use std::collections::HashMap;
use std::process::Command;
use std::time::Instant;

use bollard::models::VolumeCreateRequest;
use bollard::query_parameters::ListVolumesOptions;
use caw_box::event::Event;
use caw_box::provider::{ParseContext, ProviderKind};
use serde::Serialize;

const BENCH_LABEL: &str = "io.caw-box.test-run";

#[derive(Debug, Serialize)]
struct Measure {
    name: String,
    value: f64,
    unit: &'static str,
    target: String,
    met: Option<bool>,
}

/// The median: the middle value, or of an even count the mean of the two middle ones (it
/// was the upper one, which leans high by half a step).
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let mid = xs.len() / 2;
    if xs.len().is_multiple_of(2) {
        (xs[mid - 1] + xs[mid]) / 2.0
    } else {
        xs[mid]
    }
}

fn caw_box() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    profile_dir.join("caw-box")
}

fn time_command(args: &[&str], runs: usize, env: &[(&str, &str)]) -> f64 {
    let mut times = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        let out = Command::new(caw_box())
            .args(args)
            .envs(env.iter().copied())
            .output()
            .expect("run caw-box");
        let elapsed = started.elapsed().as_secs_f64() * 1000.0;
        assert!(
            out.status.success(),
            "caw-box {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        times.push(elapsed);
    }
    median(times)
}

/// Creates `n` sessions as caw-box would leave them after one turn each (a labelled state
/// volume and a turn-record volume), times `ls` and TARGET resolution, removes them.
async fn listing(n: usize, runs: usize, smoke: bool) -> Vec<Measure> {
    let docker = bollard::Docker::connect_with_defaults()
        .expect("docker")
        .negotiate_version()
        .await
        .expect("docker answers");
    let run_id = format!("bench-{}", std::process::id());
    let settings = r#"{"image":"caw-box/codex:latest","network":"open","workspace":"/tmp"}"#;
    let mut ids = Vec::new();
    let started = Instant::now();
    for chunk in (0..n).collect::<Vec<_>>().chunks(32) {
        let mut creates = Vec::new();
        for _ in chunk {
            let id = uuid::Uuid::new_v4();
            ids.push(id);
            let base = HashMap::from([
                ("io.caw-box.managed".to_string(), "true".to_string()),
                ("io.caw-box.session".to_string(), id.to_string()),
                ("io.caw-box.provider".to_string(), "codex".to_string()),
                (BENCH_LABEL.to_string(), run_id.clone()),
            ]);
            let mut state = base.clone();
            state.insert("io.caw-box.role".into(), "state".into());
            state.insert("io.caw-box.created".into(), "1700000000".into());
            state.insert("io.caw-box.settings".into(), settings.into());
            let mut record = base;
            record.insert("io.caw-box.role".into(), "turn-record".into());
            record.insert("io.caw-box.turn".into(), "1".into());
            record.insert(
                "io.caw-box.summary".into(),
                format!(
                    r#"{{"turn":1,"status":"success","started_at":1700000000,"ended_at":1700000001,"resume_key":"thread-{id}","key_confirmed":true}}"#
                ),
            );
            let d = docker.clone();
            creates.push(async move {
                d.create_volume(VolumeCreateRequest {
                    name: Some(format!("caw-box-{id}")),
                    labels: Some(state),
                    ..Default::default()
                })
                .await
                .expect("create a state volume");
                d.create_volume(VolumeCreateRequest {
                    name: Some(format!("caw-box-{id}-turn-1")),
                    labels: Some(record),
                    ..Default::default()
                })
                .await
                .expect("create a turn-record volume");
            });
        }
        futures_util::future::join_all(creates).await;
    }
    eprintln!(
        "created {n} sessions in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let data_dir = tempfile::tempdir().unwrap();
    let env = [("CAW_BOX_DATA_DIR", data_dir.path().to_str().unwrap())];
    let ls = time_command(&["ls", "--json"], runs, &env);
    let prefix = ids[n / 2].to_string()[..8].to_string();
    let resolve = time_command(&["handle", &prefix], runs, &env);

    // Remove what we made, by label.
    let vols = docker
        .list_volumes(Some(ListVolumesOptions {
            filters: Some(HashMap::from([(
                "label".to_string(),
                vec![format!("{BENCH_LABEL}={run_id}")],
            )])),
        }))
        .await
        .unwrap()
        .volumes
        .unwrap_or_default();
    for chunk in vols.chunks(32) {
        futures_util::future::join_all(chunk.iter().map(|v| {
            docker.remove_volume(
                &v.name,
                None::<bollard::query_parameters::RemoveVolumeOptions>,
            )
        }))
        .await;
    }
    let check = |ms: f64| (!smoke).then_some(ms <= 100.0);
    vec![
        Measure {
            name: format!("ls --json with {n} sessions"),
            value: ls,
            unit: "ms",
            target: "<= 100 ms".into(),
            met: check(ls),
        },
        Measure {
            name: format!("TARGET resolution (id prefix) with {n} sessions"),
            value: resolve,
            unit: "ms",
            target: "<= 100 ms".into(),
            met: check(resolve),
        },
    ]
}

/// Parses and renders (as stream-json) a large recorded stream per provider.
fn throughput(megabytes: usize, smoke: bool) -> Vec<Measure> {
    let root = env!("CARGO_MANIFEST_DIR");
    ProviderKind::ALL
        .iter()
        .map(|&p| {
            let mut sample = String::new();
            for f in ["turn1", "tool-call", "resume"] {
                sample.push_str(
                    &std::fs::read_to_string(format!(
                        "{root}/tests/fixtures/{}/{f}.jsonl",
                        p.as_str()
                    ))
                    .expect("recorded fixtures"),
                );
            }
            let mut stream = String::with_capacity(megabytes << 20);
            while stream.len() < megabytes << 20 {
                stream.push_str(&sample);
            }
            let mut parser = p.adapter().parser(ParseContext::default());
            let mut events: Vec<Event> = Vec::new();
            let mut rendered: Vec<u8> = Vec::with_capacity(1 << 20);
            let started = Instant::now();
            for line in stream.lines() {
                events.clear();
                parser.parse_line(line, &mut events);
                for e in &events {
                    serde_json::to_writer(&mut rendered, e).unwrap();
                    rendered.push(b'\n');
                }
                if rendered.len() > 1 << 20 {
                    rendered.clear();
                }
            }
            let secs = started.elapsed().as_secs_f64();
            let mbps = stream.len() as f64 / (1 << 20) as f64 / secs;
            Measure {
                name: format!("parse + render {p} ({megabytes} MB)"),
                value: mbps,
                unit: "MB/s",
                target: ">= 200 MB/s".into(),
                met: (!smoke).then_some(mbps >= 200.0),
            }
        })
        .collect()
}

fn cold_start(runs: usize, smoke: bool) -> Measure {
    let ms = time_command(&["--version"], runs, &[]);
    Measure {
        name: "cold start: caw-box --version".into(),
        value: ms,
        unit: "ms",
        target: "<= 5 ms".into(),
        met: (!smoke).then_some(ms <= 5.0),
    }
}

/// What `--per-account` adds to a turn when its account has a free slot (no contention):
/// the account's fingerprint from its manifest, then a slot taken (nobody queued) and given
/// back, in a data directory of its own, and a brokered turn's flight of its account's
/// back-off taken, its schedule looked at and the flight given back. The turn's own time is
/// not in it: this is all the admission does on the turn's path.
async fn admission(runs: usize, smoke: bool) -> Measure {
    use caw_box::auth::store::{Item, Manifest};
    use caw_box::session::admission::Accounts;
    let dir = tempfile::tempdir().unwrap();
    let accounts = Accounts::at(dir.path().to_path_buf());
    let manifest = Manifest {
        items: vec![Item {
            kind: "env".into(),
            target: "OPENAI_API_KEY".into(),
            source: "env:OPENAI_API_KEY".into(),
            collected_at: 1,
            refreshed_at: None,
            sha256: "0".repeat(64),
            expires_at: None,
        }],
        ..Manifest::default()
    };
    let mut samples = Vec::with_capacity(runs);
    for turn in 0..runs {
        let t = Instant::now();
        let account = caw_box::auth::account::of_manifest(ProviderKind::Codex, &manifest).unwrap();
        let id = uuid::Uuid::new_v4();
        let slot = accounts
            .admit(
                caw_box::session::admission::Want {
                    account: &account,
                    cap: Some(2),
                    park: false,
                },
                id,
                turn as u32 + 1,
                |_| panic!("no contention"),
                caw_box::session::admission::host_only,
            )
            .await
            .unwrap();
        // A brokered turn's part in its account's back-off: its flight, and a look at the
        // schedule (its caw-box looks four times a second while the turn runs).
        let paced = caw_box::auth::backoff::Account::at(dir.path().join(&account));
        let flight = paced.fly().unwrap();
        assert_eq!(paced.opens_at(&flight, caw_box::clock::now_ms()), None);
        drop((slot, flight));
        samples.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let ms = median(samples);
    Measure {
        name: "admission per turn, no contention (--per-account)".into(),
        value: ms,
        unit: "ms",
        target: "<= 20 ms".into(),
        met: (!smoke).then_some(ms <= 20.0),
    }
}

/// The baseline `run` records in a bind-mode git workspace (for `diff --patch`): caw-box's
/// hardened git on this machine (a private repository over the work tree, nothing of the
/// repository's config run) against the plain `git add -A` with a temporary index that it
/// replaced, on a repository of 1,000 files with a tenth changed and 50 untracked. Paid
/// once per session, at `run`.
async fn git_baseline(runs: usize) -> Vec<Measure> {
    let repo = tempfile::tempdir().unwrap();
    let w = repo.path();
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args(["-c", "user.name=b", "-c", "user.email=b@b"])
            .args(args)
            .current_dir(w)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
    };
    for i in 0..1000 {
        let dir = w.join(format!("src/{}", i / 100));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join(format!("f{i}.txt")),
            format!("file {i}\n").repeat(20),
        )
        .unwrap();
    }
    git(&["init", "-q"]);
    git(&["add", "."]);
    git(&["commit", "-qm", "base"]);
    for i in (0..1000).step_by(10) {
        std::fs::write(w.join(format!("src/{}/f{i}.txt", i / 100)), "changed\n").unwrap();
    }
    for i in 0..50 {
        std::fs::write(w.join(format!("new{i}.txt")), "untracked\n").unwrap();
    }
    let dir = w.to_str().unwrap();
    let mut hardened = Vec::new();
    let mut plain = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        assert!(caw_box::session::patch::host_base(dir).await.is_some());
        hardened.push(started.elapsed().as_secs_f64() * 1000.0);
        let index = tempfile::tempdir().unwrap();
        let started = Instant::now();
        let out = Command::new("sh")
            .args([
                "-c",
                "cp .git/index \"$I\" && GIT_INDEX_FILE=\"$I\" git add -A . && \
                 GIT_INDEX_FILE=\"$I\" git write-tree",
            ])
            .env("I", index.path().join("index"))
            .current_dir(w)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        plain.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    vec![
        Measure {
            name: "git baseline at run: hardened host git".into(),
            value: median(hardened),
            unit: "ms",
            target: "(reported)".into(),
            met: None,
        },
        Measure {
            name: "git baseline at run: plain git add -A (before)".into(),
            value: median(plain),
            unit: "ms",
            target: "(reported)".into(),
            met: None,
        },
    ]
}

/// A stub model on an internal network of the benchmark's own, like the e2e rig.
struct ModelRig {
    network: String,
    stub: String,
    label: String,
    /// caw-box's data directory for the turns: the key collected there, so that caw-box's
    /// turns are brokered (the default); plain `docker run` gets the key in its env.
    data_dir: String,
}

const BENCH_KEY: &str = "sk-bench";

fn docker_cli(args: &[&str]) -> std::process::Output {
    let out = Command::new("docker")
        .args(args)
        .output()
        .expect("docker CLI");
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

impl ModelRig {
    fn start() -> ModelRig {
        let id = std::process::id();
        let rig = ModelRig {
            network: format!("caw-box-bench-net-{id}"),
            stub: format!("caw-box-bench-stub-{id}"),
            label: format!("{BENCH_LABEL}=bench-turns-{id}"),
            data_dir: tempfile::tempdir()
                .unwrap()
                .keep()
                .to_string_lossy()
                .into_owned(),
        };
        for (p, var) in [
            ("claude_code", "ANTHROPIC_API_KEY"),
            ("codex", "OPENAI_API_KEY"),
            ("opencode", "OPENAI_API_KEY"),
            ("gemini", "GEMINI_API_KEY"),
        ] {
            let out = Command::new(caw_box())
                .args(["auth", "collect", "--provider", p])
                .env("CAW_BOX_DATA_DIR", &rig.data_dir)
                .env("HOME", &rig.data_dir)
                .env(var, BENCH_KEY)
                .output()
                .expect("caw-box auth collect");
            assert!(out.status.success(), "auth collect --provider {p}");
        }
        docker_cli(&[
            "network",
            "create",
            "--internal",
            "--label",
            &rig.label,
            &rig.network,
        ]);
        docker_cli(&[
            "run",
            "-d",
            "--name",
            &rig.stub,
            "--label",
            &rig.label,
            "--network",
            &rig.network,
            "-e",
            &format!("STUB_EXPECT_KEY={BENCH_KEY}"),
            "caw-box-test/stub-model:latest",
        ]);
        rig
    }
}

impl Drop for ModelRig {
    /// Removes what carries this run's label, and nothing else: other test runs may share
    /// the daemon (scripts/cleanup.sh would remove theirs too).
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.data_dir);
        let filter = format!("label={}", self.label);
        let ids = |args: &[&str]| -> Vec<String> {
            Command::new("docker")
                .args(args)
                .args(["-q", "--filter", &filter])
                .output()
                .map(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .split_whitespace()
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default()
        };
        for (list, remove) in [
            (&["ps", "-a"][..], &["rm", "-f", "-v"][..]),
            (&["volume", "ls"][..], &["volume", "rm", "-f"][..]),
            (&["network", "ls"][..], &["network", "rm"][..]),
        ] {
            let found = ids(list);
            if !found.is_empty() {
                let _ = Command::new("docker")
                    .args(remove)
                    .args(&found)
                    .stdout(std::process::Stdio::null())
                    .status();
            }
        }
    }
}

struct Bench {
    provider: ProviderKind,
    key_var: &'static str,
    model: Option<&'static str>,
    /// Repetitions by default. A turn's time varies by some ±8% from one to the next here
    /// (a shared 2-core machine), against caw-box's few milliseconds: the short turns get
    /// more, so that the median's own error stays near 2% for each provider.
    reps: usize,
    /// The OCI runtime of both sides (`--runtime`, `docker run --runtime`); `None`: the
    /// daemon's default.
    runtime: Option<&'static str>,
}

const TURN_BENCHES: [Bench; 4] = [
    Bench {
        provider: ProviderKind::ClaudeCode,
        key_var: "ANTHROPIC_API_KEY",
        model: None,
        reps: 21,
        runtime: None,
    },
    Bench {
        provider: ProviderKind::Codex,
        key_var: "OPENAI_API_KEY",
        model: Some("gpt-5.5"),
        reps: 31,
        runtime: None,
    },
    Bench {
        provider: ProviderKind::Opencode,
        key_var: "OPENAI_API_KEY",
        model: Some("stub-model"),
        reps: 11,
        runtime: None,
    },
    Bench {
        provider: ProviderKind::Gemini,
        key_var: "GEMINI_API_KEY",
        model: Some("gemini-2.5-flash"),
        reps: 11,
        runtime: None,
    },
];

/// A codex turn on gVisor (`--runtime runsc`) against plain `docker run --runtime runsc`:
/// part `runsc`, measured when the daemon has that runtime (`scripts/rig.sh up` adds it).
/// Its turns take some 2.5 times a runc turn's: fewer repetitions.
const RUNSC_BENCH: Bench = Bench {
    provider: ProviderKind::Codex,
    key_var: "OPENAI_API_KEY",
    model: Some("gpt-5.5"),
    reps: 11,
    runtime: Some("runsc"),
};

/// Whether the daemon lists the OCI runtime `name`.
fn daemon_has_runtime(name: &str) -> bool {
    Command::new("docker")
        .args(["info", "--format", "{{json .Runtimes}}"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(&format!("\"{name}\"")))
}

/// The largest anonymous part of a measured process's RSS (heap, stacks, dirty data) seen by
/// [`timed`], in KiB: the rest of its RSS is file pages (the executable's and libraries'
/// code, shared with every other caw-box process and the page cache).
static PEAK_ANON_KB: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Runs `cmd`, returns (seconds, stdout, peak RSS in KiB sampled from /proc while it ran).
fn timed(cmd: Command) -> (f64, String, u64) {
    let (secs, out, peak, _) = timed_with_anon(cmd);
    (secs, out, peak)
}

/// [`timed`], and the largest anonymous part of its RSS seen, in KiB.
fn timed_with_anon(mut cmd: Command) -> (f64, String, u64, u64) {
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let started = Instant::now();
    let mut child = cmd.spawn().expect("spawn");
    let pid = child.id();
    let mut peak = 0u64;
    let mut anon = 0u64;
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut { stdout }, &mut s);
        s
    });
    loop {
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            let kb_of = |key: &str| {
                status
                    .lines()
                    .find(|l| l.starts_with(key))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|v| v.parse::<u64>().ok())
            };
            if let Some(kb) = kb_of("VmHWM:") {
                peak = peak.max(kb);
            }
            if let Some(kb) = kb_of("RssAnon:") {
                anon = anon.max(kb);
            }
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let secs = started.elapsed().as_secs_f64();
    let status = child.wait().unwrap();
    let out = reader.join().unwrap();
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    assert!(status.success(), "{cmd:?} failed: {err}\n{out}");
    (secs, out, peak, anon)
}

/// One caw-box turn (run, or resume of `session`).
fn caw_turn(
    rig: &ModelRig,
    b: &Bench,
    ws: &std::path::Path,
    session: Option<&str>,
    prompt: &str,
) -> (f64, String, u64) {
    caw_turn_with(rig, b, ws, session, &[], prompt)
}

/// [`caw_turn`] with `extra` flags.
fn caw_turn_with(
    rig: &ModelRig,
    b: &Bench,
    ws: &std::path::Path,
    session: Option<&str>,
    extra: &[&str],
    prompt: &str,
) -> (f64, String, u64) {
    caw_turn_by(&caw_box(), rig, b, ws, session, extra, prompt)
}

/// [`caw_turn_with`] of the caw-box binary `bin`.
fn caw_turn_by(
    bin: &std::path::Path,
    rig: &ModelRig,
    b: &Bench,
    ws: &std::path::Path,
    session: Option<&str>,
    extra: &[&str],
    prompt: &str,
) -> (f64, String, u64) {
    let mut c = Command::new(bin);
    match session {
        None => {
            c.args([
                "run",
                "--provider",
                b.provider.as_str(),
                "--network",
                &rig.network,
            ])
            .args(["--endpoint", &format!("http://{}:8080", rig.stub)]);
            if let Some(m) = b.model {
                c.args(["--model", m]);
            }
        }
        Some(id) => {
            c.args(["resume", id]);
        }
    }
    if let Some(runtime) = b.runtime {
        c.args(["--runtime", runtime]);
    }
    c.args(extra);
    c.args(["-q", "-o", "json", prompt])
        .env("CAW_BOX_DATA_DIR", &rig.data_dir)
        .env("CAW_BOX_LABELS", &rig.label)
        .current_dir(ws);
    let (secs, out, peak, anon) = timed_with_anon(c);
    PEAK_ANON_KB.fetch_max(anon, std::sync::atomic::Ordering::Relaxed);
    settled(&rig.label);
    (secs, out, peak)
}

/// Waits, untimed, until no container of `label` finishes a turn behind it (renamed
/// `caw-box-probe-<id>-checkpoint`: its checkpoint, exit and removal come after the
/// turn's command ended), so that the next measurement (a plain `docker run`'s, or the
/// next turn's) does not share the machine with it.
fn settled(label: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        let out = Command::new("docker")
            .args(["ps", "-aq", "--filter", &format!("label={label}")])
            .args(["--filter", "name=-checkpoint"])
            .output()
            .expect("docker CLI");
        if out.stdout.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("a container finishing a turn behind it stayed for 60 s");
}

/// The first turn of a session in a bound workspace owned by root (a CI job's checkout, caw-box
/// run as root): the agent runs as root there, so the session's new state volume (the
/// image's HOME, 1000:1000) is first handed to root. Against the same plain `docker run` of a
/// first turn (a fresh volume, the image's user), alternating which goes first. `None` when
/// this bench does not run as root (only root's caw-box runs the agent as root).
fn root_owned_first_turns(
    rig: &ModelRig,
    ws: &std::path::Path,
    reps: usize,
    smoke: bool,
) -> Option<Measure> {
    if !caw_box::dirs::is_root() {
        eprintln!("root-owned workspace: this bench does not run as root: not measured");
        return None;
    }
    let codex = &TURN_BENCHES[1];
    let root_ws = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(root_ws.path(), Some(0), Some(0)).unwrap();
    let (mut caw, mut dk) = (vec![], vec![]);
    for i in 0..reps {
        let volume = format!("caw-box-bench-{}-{i}-root", std::process::id());
        let caw_first = || caw_turn(rig, codex, root_ws.path(), None, "REMEMBER:bench").0;
        let dk_first = || docker_turn(rig, codex, ws, &volume, None, "REMEMBER:bench").0;
        if i % 2 == 0 {
            caw.push(caw_first());
            dk.push(dk_first());
        } else {
            dk.push(dk_first());
            caw.push(caw_first());
        }
    }
    Some(paired(
        "codex run, workspace owned by root (a CI checkout)",
        caw,
        dk,
        1.05,
        smoke,
    ))
}

/// codex's first turn and resume under `--egress locked` (the model's API only), each
/// against the same plain `docker run` turn, and beside the same turns under the default,
/// `balanced`, measured in the same repetitions (rotating which goes first), so that the two
/// policies meet the same spell of the machine. One turn of each policy before the first
/// measurement starts its shared egress proxy, which a policy's first turn of the run
/// would otherwise pay inside a sample. (With the bench's collected key the model's traffic
/// goes through the broker, which the agent reaches beside the proxy: the policies differ
/// only in the proxy's allow-list.)
fn locked_turns(rig: &ModelRig, ws: &std::path::Path, reps: usize, smoke: bool) -> Vec<Measure> {
    let codex = &TURN_BENCHES[1];
    let policies: [&[&str]; 2] = [&["--egress", "locked"], &["--egress", "balanced"]];
    for flags in policies {
        caw_turn_with(rig, codex, ws, None, flags, "Say hello.");
    }
    // Per policy (locked, balanced) and for docker run: first turns and resumes.
    let mut run: [Vec<f64>; 3] = Default::default();
    let mut resume: [Vec<f64>; 3] = Default::default();
    for i in 0..reps {
        let volume = format!("caw-box-bench-{}-{i}-locked", std::process::id());
        let mut sessions = [String::new(), String::new()];
        let mut key = String::new();
        // 0, 1: caw-box under policies[0], [1]; 2: docker run. Rotated each repetition.
        let order: Vec<usize> = (0..3).map(|k| (k + i) % 3).collect();
        for &who in &order {
            if who == 2 {
                let (t, out) = docker_turn(rig, codex, ws, &volume, None, "REMEMBER:bench");
                key = resume_key_of(codex, &out);
                run[2].push(t);
            } else {
                let (t, out, _) =
                    caw_turn_with(rig, codex, ws, None, policies[who], "REMEMBER:bench");
                run[who].push(t);
                sessions[who] = serde_json::from_str::<serde_json::Value>(out.trim()).unwrap()
                    ["session_id"]
                    .as_str()
                    .unwrap()
                    .to_string();
            }
        }
        for &who in order.iter().rev() {
            let t = match who {
                2 => docker_turn(rig, codex, ws, &volume, Some(&key), "RECALL").0,
                _ => {
                    caw_turn_with(
                        rig,
                        codex,
                        ws,
                        Some(&sessions[who]),
                        policies[who],
                        "RECALL",
                    )
                    .0
                }
            };
            resume[who].push(t);
        }
    }
    let [locked_run, balanced_run, dk_run] = run;
    let [locked_resume, balanced_resume, dk_resume] = resume;
    let beside = |what: &str, locked: &[f64], balanced: &[f64]| {
        let mut m = paired(what, locked.to_vec(), balanced.to_vec(), 0.0, true);
        m.name = m.name.replace("docker run", "balanced");
        m.target = "(reported)".into();
        m
    };
    vec![
        paired(
            "codex run, --egress locked",
            locked_run.clone(),
            dk_run.clone(),
            1.05,
            smoke,
        ),
        paired(
            "codex resume, --egress locked",
            locked_resume.clone(),
            dk_resume.clone(),
            1.05,
            smoke,
        ),
        paired(
            "codex run, --egress balanced (beside locked)",
            balanced_run.clone(),
            dk_run,
            1.05,
            smoke,
        ),
        paired(
            "codex resume, --egress balanced (beside locked)",
            balanced_resume.clone(),
            dk_resume,
            1.05,
            smoke,
        ),
        beside(
            "codex run, locked against balanced",
            &locked_run,
            &balanced_run,
        ),
        beside(
            "codex resume, locked against balanced",
            &locked_resume,
            &balanced_resume,
        ),
    ]
}

/// The median of the paired ratios of caw-box's turns `caw` to plain `docker run`'s `dk`
/// (seconds), against `target`; held to it unless `smoke`.
fn paired(what: &str, caw: Vec<f64>, dk: Vec<f64>, target: f64, smoke: bool) -> Measure {
    if std::env::var_os("BENCH_DEBUG").is_some() {
        eprintln!("{what}: caw {caw:.3?}\n{what}: dk  {dk:.3?}");
    }
    let ratio = median(caw.iter().zip(&dk).map(|(c, d)| c / d).collect());
    let (c, d) = (median(caw), median(dk));
    Measure {
        name: format!(
            "{what}: caw-box {:.0} ms / docker run {:.0} ms",
            c * 1000.0,
            d * 1000.0
        ),
        value: ratio,
        unit: "x",
        target: format!("<= {target}"),
        met: (!smoke).then_some(ratio <= target),
    }
}

/// The peak RSS (KiB) of `bin` over `reps` codex turns: a run, then a resume of it.
fn shipped_peak_rss(
    rig: &ModelRig,
    ws: &std::path::Path,
    bin: &std::path::Path,
    reps: usize,
) -> u64 {
    let codex = &TURN_BENCHES[1];
    assert_eq!(codex.provider, ProviderKind::Codex);
    let mut peak = 0;
    for _ in 0..reps {
        let (_, out, rss) = caw_turn_by(bin, rig, codex, ws, None, &[], "REMEMBER:shipped");
        peak = rss.max(peak);
        let session = serde_json::from_str::<serde_json::Value>(out.trim()).unwrap()["session_id"]
            .as_str()
            .unwrap()
            .to_string();
        let (_, _, rss) = caw_turn_by(bin, rig, codex, ws, Some(&session), &[], "RECALL");
        peak = rss.max(peak);
    }
    peak
}

/// The same turn as a plain `docker run`: same image, CLI command, mounts, env, hardening.
fn docker_turn(
    rig: &ModelRig,
    b: &Bench,
    ws: &std::path::Path,
    volume: &str,
    resume_key: Option<&str>,
    prompt: &str,
) -> (f64, String) {
    use caw_box::provider::TurnRequest;
    let new_key = uuid::Uuid::new_v4().to_string();
    let endpoint = format!("http://{}:8080", rig.stub);
    // The key goes in as an environment variable, as caw-box's injected mode does it.
    let credential_env = [b.key_var.to_string()];
    let command = b.provider.adapter().turn_command(&TurnRequest {
        prompt,
        resume_key,
        new_session_key: (resume_key.is_none() && b.provider.adapter().chooses_key_up_front())
            .then_some(new_key.as_str()),
        model: b.model,
        endpoint: Some(&endpoint),
        interactive: false,
        credential_env: &credential_env,
        ..Default::default()
    });
    let run_dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(run_dir.path(), Some(1000), Some(1000)).unwrap();
    let mut c = Command::new("docker");
    c.args([
        "run",
        "--rm",
        "--network",
        &rig.network,
        "--label",
        &rig.label,
    ])
    .args(["--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL"])
    .args([
        "--security-opt",
        "no-new-privileges",
        "--pids-limit",
        "512",
        "--user",
        "1000:1000",
    ])
    // Created by this run when missing (the first turn), with the rig's label for clean-up:
    // caw-box's first turn creates its state volume too.
    .args([
        "--mount",
        &format!(
            "type=volume,src={volume},dst=/home/agent,volume-label={}",
            rig.label
        ),
    ])
    .args(["-v", &format!("{}:/workspace", ws.display())])
    .args(["-v", &format!("{}:/run/caw-box", run_dir.path().display())])
    .args(["-w", "/workspace", "-e", "HOME=/home/agent"])
    .args(["-e", &format!("{}={BENCH_KEY}", b.key_var)]);
    if let Some(runtime) = b.runtime {
        c.args(["--runtime", runtime]);
    }
    for (k, v) in &command.env {
        c.args(["-e", &format!("{k}={v}")]);
    }
    if let Some(stdin) = &command.stdin {
        std::fs::write(run_dir.path().join("stdin"), stdin).unwrap();
        c.args(["-e", "CAW_BOX_STDIN_FILE=/run/caw-box/stdin"]);
    }
    c.arg(b.provider.default_image()).args(&command.argv);
    let (secs, out, _) = timed(c);
    (secs, out)
}

fn resume_key_of(b: &Bench, stdout: &str) -> String {
    let mut parser = b.provider.adapter().parser(ParseContext::default());
    let mut events = Vec::new();
    for line in stdout.lines() {
        parser.parse_line(line, &mut events);
    }
    parser
        .resume_key()
        .expect("the CLI printed its resume key")
        .to_string()
}

/// Which parts, providers and how many repetitions a run measures (see the module docs).
#[derive(Debug, Default)]
struct Filter {
    parts: Vec<String>,
    providers: Vec<ProviderKind>,
    reps: Option<usize>,
}

impl Filter {
    fn from_args() -> Filter {
        let mut f = Filter::default();
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            match a.as_str() {
                "--only" => f.parts.push(args.next().expect("--only PART")),
                "--provider" => f.providers.push(
                    args.next()
                        .expect("--provider P")
                        .parse()
                        .expect("a provider"),
                ),
                "--reps" => {
                    f.reps = Some(args.next().and_then(|n| n.parse().ok()).expect("--reps N"))
                }
                _ => {}
            }
        }
        f
    }

    fn wants(&self, part: &str) -> bool {
        self.parts.is_empty() || self.parts.iter().any(|p| p == part)
    }
}

/// Turn overhead against plain docker run, concurrency, peak RSS, and (part `checkpoints`)
/// what checkpoints and forks cost, on one rig.
fn turns(smoke: bool, filter: &Filter) -> Vec<Measure> {
    let rig = ModelRig::start();
    std::thread::sleep(std::time::Duration::from_millis(500));
    // The same turn on both sides: the plain `docker run` runs as the image's agent
    // (1000:1000), and so does caw-box's agent in a workspace of that owner. (In a
    // root-owned one, run by root, caw-box runs the agent as root and first hands a new
    // state volume to it with a short chown container, which plain `docker run --user 0`
    // under `--cap-drop ALL` could not do at all: a different turn.)
    let ws = tempfile::tempdir().unwrap();
    // (Only root may give it away; a user's caw-box runs its agent as that user.)
    let _ = std::os::unix::fs::chown(ws.path(), Some(1000), Some(1000));
    let mut results = Vec::new();
    let mut peak_rss = 0u64;
    let benches: Vec<&Bench> = TURN_BENCHES
        .iter()
        .filter(|_| filter.wants("turns"))
        .filter(|b| {
            if filter.providers.is_empty() {
                !smoke || b.provider == ProviderKind::Codex
            } else {
                filter.providers.contains(&b.provider)
            }
        })
        .collect();
    let mut benches = benches;
    let codex_wanted =
        filter.providers.is_empty() || filter.providers.contains(&ProviderKind::Codex);
    if filter.wants("runsc") && codex_wanted {
        if daemon_has_runtime("runsc") {
            benches.push(&RUNSC_BENCH);
        } else {
            eprintln!("runsc: the Docker daemon has no runsc runtime (scripts/rig.sh up adds it): not measured");
        }
    }
    let measured_turns = !benches.is_empty();
    for b in benches {
        let reps = filter.reps.unwrap_or(if smoke { 1 } else { b.reps });
        let (mut caw_run, mut caw_resume, mut dk_run, mut dk_resume) =
            (vec![], vec![], vec![], vec![]);
        // A warm resume (`--keep-warm`, codex on the default runtime): against the same
        // plain `docker run` resume.
        let warm = b.provider == ProviderKind::Codex && b.runtime.is_none();
        let (mut caw_warm, mut dk_warm) = (vec![], vec![]);
        for i in 0..reps {
            // caw-box: a new session, then a resume of it; plain docker run: a fresh volume
            // (made by its first run), the same two turns. Each caw-box turn is next to its
            // docker run twin, and which goes first alternates (A B B A): neither gains from
            // its place in the rhythm, and both see the same spell of the machine.
            let volume = format!(
                "caw-box-bench-{}-{i}-{}",
                std::process::id(),
                b.provider.as_str()
            );
            let mut session = String::new();
            let mut key = String::new();
            let mut caw_first = |session: &mut String| {
                let (t, out, rss) = caw_turn(&rig, b, ws.path(), None, "REMEMBER:bench");
                peak_rss = peak_rss.max(rss);
                caw_run.push(t);
                *session = serde_json::from_str::<serde_json::Value>(out.trim()).unwrap()
                    ["session_id"]
                    .as_str()
                    .unwrap()
                    .to_string();
            };
            let dk_first = |key: &mut String| {
                let (t, out) = docker_turn(&rig, b, ws.path(), &volume, None, "REMEMBER:bench");
                *key = resume_key_of(b, &out);
                t
            };
            if i % 2 == 0 {
                caw_first(&mut session);
                dk_run.push(dk_first(&mut key));
            } else {
                dk_run.push(dk_first(&mut key));
                caw_first(&mut session);
            }
            let caw_again = || caw_turn(&rig, b, ws.path(), Some(&session), "RECALL");
            let dk_again = || docker_turn(&rig, b, ws.path(), &volume, Some(&key), "RECALL").0;
            let ((t, _, rss), d) = if i % 2 == 0 {
                let d = dk_again();
                (caw_again(), d)
            } else {
                let c = caw_again();
                (c, dk_again())
            };
            peak_rss = peak_rss.max(rss);
            caw_resume.push(t);
            dk_resume.push(d);
            if warm {
                // This resume leaves the session's container warm; the next runs in it.
                caw_turn_with(
                    &rig,
                    b,
                    ws.path(),
                    Some(&session),
                    &["--keep-warm", "60s"],
                    "RECALL",
                );
                let ((t, _, _), d) = if i % 2 == 0 {
                    let d = dk_again();
                    (caw_again(), d)
                } else {
                    let c = caw_again();
                    (c, dk_again())
                };
                caw_warm.push(t);
                dk_warm.push(d);
                // Not left for the next repetitions' machine.
                caw_turn_with(
                    &rig,
                    b,
                    ws.path(),
                    Some(&session),
                    &["--keep-warm", "off"],
                    "RECALL",
                );
            }
        }
        if warm && !caw_warm.is_empty() {
            let what = format!("{} warm resume (--keep-warm)", b.provider);
            results.push(paired(&what, caw_warm, dk_warm, 0.6, smoke));
        }
        for (what, caw, dk) in [("run", caw_run, dk_run), ("resume", caw_resume, dk_resume)] {
            let on = b.runtime.map(|r| format!(" ({r})")).unwrap_or_default();
            let what = format!("{}{on} {what}", b.provider);
            results.push(paired(&what, caw, dk, 1.05, smoke));
        }
    }
    if filter.wants("turns") && codex_wanted {
        let reps = filter.reps.unwrap_or(if smoke { 1 } else { 9 });
        results.extend(root_owned_first_turns(&rig, ws.path(), reps, smoke));
    }
    if filter.wants("egress") && codex_wanted {
        let reps = filter.reps.unwrap_or(if smoke { 1 } else { 15 });
        results.extend(locked_turns(&rig, ws.path(), reps, smoke));
    }
    if filter.wants("pool") && codex_wanted {
        let reps = filter.reps.unwrap_or(if smoke { 1 } else { 9 });
        let codex = &TURN_BENCHES[1];
        results.extend(pool::pool_turns(&rig, codex, ws.path(), reps, smoke));
    }
    if measured_turns {
        // The binary users install (`make dist`'s static musl binary, which the hot-function
        // list is made for) holds the target; this bench's own gnu build is shown beside it.
        let shipped = std::env::var_os("CAW_BOX_BENCH_SHIPPED").map(std::path::PathBuf::from);
        if let Some(bin) = &shipped {
            let reps = filter.reps.unwrap_or(if smoke { 1 } else { 5 });
            let peak = shipped_peak_rss(&rig, ws.path(), bin, reps);
            results.push(Measure {
                name: "peak RSS of caw-box during a turn: the shipped musl binary (make dist)"
                    .into(),
                value: peak as f64 / 1024.0,
                unit: "MiB",
                target: "<= 10 MiB".into(),
                met: (!smoke).then_some(peak <= 10 * 1024),
            });
        }
        let gnu_holds_target = shipped.is_none() && !smoke;
        results.push(Measure {
            name: format!(
                "peak RSS of caw-box during a turn: the gnu binary of this bench ({})",
                if smoke { "debug" } else { "release" }
            ),
            value: peak_rss as f64 / 1024.0,
            unit: "MiB",
            target: if shipped.is_some() {
                "(reported)".into()
            } else {
                "<= 10 MiB".into()
            },
            met: gnu_holds_target.then_some(peak_rss <= 10 * 1024),
        });
        let over = results
            .iter()
            .any(|m| m.name.starts_with("peak RSS") && m.met == Some(false));
        if over {
            // Most of it is the binary's code pages: build.rs lays out what turns run.
            eprintln!(
                "peak RSS over its target: if much of the code or its dependencies changed \
                 since scripts/hot-functions.txt was made, run scripts/rig.sh with \
                 scripts/hot-functions.sh"
            );
        }
        results.push(Measure {
            name: "  of it anonymous (heap, stacks), at most".into(),
            value: PEAK_ANON_KB.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1024.0,
            unit: "MiB",
            target: "(reported)".into(),
            met: None,
        });
    }
    if filter.wants("checkpoints") && codex_wanted {
        results.extend(checkpoints::checkpoints(
            &rig,
            smoke,
            filter.reps,
            &TURN_BENCHES[1],
        ));
    }
    if !filter.wants("concurrent") {
        return results;
    }

    // Many turns at once: all must succeed; wall time against the same turns one by one.
    let n = if smoke { 4 } else { 32 };
    let codex = &TURN_BENCHES[1];
    let started = Instant::now();
    for _ in 0..n {
        caw_turn(&rig, codex, ws.path(), None, "REMEMBER:seq");
    }
    let sequential = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let (network, stub, label) = (rig.network.clone(), rig.stub.clone(), rig.label.clone());
            let data_dir = rig.data_dir.clone();
            let ws = ws.path().to_path_buf();
            std::thread::spawn(move || {
                let r = ModelRig {
                    network,
                    stub,
                    label,
                    data_dir,
                };
                let out = caw_turn(&r, &TURN_BENCHES[1], &ws, None, "REMEMBER:par");
                std::mem::forget(r); // the shared rig is cleaned up once, below
                out
            })
        })
        .collect();
    let ok = handles
        .into_iter()
        .map(|h| h.join().is_ok())
        .filter(|ok| *ok)
        .count();
    let parallel = started.elapsed().as_secs_f64();
    results.push(Measure {
        name: format!(
            "{n} codex turns at once: {ok}/{n} ok, {parallel:.1}s vs {sequential:.1}s one by one"
        ),
        value: parallel / sequential,
        unit: "x",
        target: "all succeed".into(),
        met: Some(ok == n),
    });
    drop(rig);
    results
}

fn main() {
    let smoke = std::env::args().any(|a| a == "--smoke");
    let filter = Filter::from_args();
    let (sessions, runs, megabytes) = if smoke { (50, 3, 4) } else { (1000, 21, 100) };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut results = Vec::new();
    if filter.wants("cold") {
        results.push(cold_start(runs * 2, smoke));
    }
    if filter.wants("parse") {
        results.extend(throughput(megabytes, smoke));
    }
    if filter.wants("listing") {
        results.extend(rt.block_on(listing(sessions, runs, smoke)));
    }
    if filter.wants("gitbase") {
        results.extend(rt.block_on(git_baseline(runs)));
    }
    if filter.wants("admission") {
        results.push(rt.block_on(admission(runs * 10, smoke)));
    }
    if [
        "turns",
        "concurrent",
        "runsc",
        "checkpoints",
        "egress",
        "pool",
    ]
    .iter()
    .any(|p| filter.wants(p))
    {
        results.extend(turns(smoke, &filter));
    }
    // Not in the smoke run (`make test` has its own Kubernetes tests): it takes the
    // machine's one k8s-lab, down and up, and down when it ends.
    if !smoke && filter.wants("cluster") {
        results.extend(cluster(filter.reps.unwrap_or(5)));
    }

    println!("{:<52} {:>12}   {:<14} met", "measure", "median", "target");
    for m in &results {
        let met = match m.met {
            Some(true) => "yes",
            Some(false) => "NO",
            None if m.target == "(reported)" => "-",
            None => "(smoke)",
        };
        let digits = if m.unit == "x" { 2 } else { 1 };
        println!(
            "{:<52} {:>9.digits$} {:<4} {:<14} {met}",
            m.name, m.value, m.unit, m.target
        );
    }
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench.json");
    std::fs::write(&out, serde_json::to_vec_pretty(&results).unwrap()).unwrap();
    println!("written to {}", out.display());
    if results.iter().any(|m| m.met == Some(false)) {
        std::process::exit(1);
    }
}

/// The lab script: `CAW_BOX_K8S_LAB`, else `shared/k8s-lab/k8s-lab` beside the checkout or
/// one of its parents.
fn lab_script() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("CAW_BOX_K8S_LAB") {
        return p.into();
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    root.ancestors()
        .skip(1)
        .map(|d| d.join("shared/k8s-lab/k8s-lab"))
        .find(|p| p.exists())
        .expect("the k8s-lab script (shared/k8s-lab beside the checkout, or CAW_BOX_K8S_LAB)")
}

const LAB_DIR: &str = "/tmp/k8s-lab";
const LAB_KUBECTL: &str = "/var/cache/k8s-lab/bin/kubectl";

fn lab_kubectl(args: &[&str], stdin: Option<&str>) -> String {
    let mut c = Command::new(LAB_KUBECTL);
    c.env("KUBECONFIG", format!("{LAB_DIR}/kubeconfig"))
        .args(["-n", "default"])
        .args(args);
    if stdin.is_some() {
        c.stdin(std::process::Stdio::piped());
    }
    c.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().expect("kubectl");
    if let Some(text) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The lab while the cluster part runs; `k8s-lab down` when dropped, unless it was the
/// test run's lab, taken as the tests take it (see [`test_runs_lab`]).
struct LabUp {
    reused: bool,
}

impl Drop for LabUp {
    fn drop(&mut self) {
        if self.reused {
            // Its own objects only: the stub and the plain pods' claim.
            let _ = Command::new(LAB_KUBECTL)
                .env("KUBECONFIG", format!("{LAB_DIR}/kubeconfig"))
                .args(["-n", "default", "delete", "pod,pvc", "--wait=false"])
                .args(["-l", "app.kubernetes.io/managed-by=caw-box-bench"])
                .output();
        } else {
            let _ = Command::new(lab_script()).args(["down", LAB_DIR]).output();
        }
    }
}

/// Whether the lab up now is the one of the test run `CAW_BOX_K8S_LAB_RUN` names (its mark,
/// tests/e2e/kubernetes.rs): then the bench uses it as it is (and leaves it up, for
/// scripts/test.sh to take down), as a test of that run would; else `down`, `up`.
fn test_runs_lab() -> bool {
    let Some(run) = std::env::var("CAW_BOX_K8S_LAB_RUN")
        .ok()
        .filter(|r| !r.trim().is_empty())
    else {
        return false;
    };
    let mark = std::fs::read_to_string(format!("{LAB_DIR}/caw-box-e2e-run")).unwrap_or_default();
    let up = Command::new(lab_script())
        .args(["status", LAB_DIR])
        .output()
        .is_ok_and(|o| {
            o.status.success() && !String::from_utf8_lossy(&o.stdout).contains("stopped")
        });
    mark.starts_with(&format!("run {run}\n")) && up
}

/// `--only cluster`: a codex turn through caw-box on ../shared/k8s-lab (`resume` of a
/// session, so its claims exist) against the same turn as a plain pod: `kubectl run --rm
/// -i` of the same image, CLI command, env and hardening, with a claim of its own at HOME.
/// Both answered by the stub model as a pod (by pod IP: the lab has no DNS). Ratio of
/// medians, held to 1.5x (a pod's start dominates both). A warm resume (`--keep-warm`: the
/// turn execs in the session's pod kept idle) against the same plain pod, held to 0.5x. `caw-box -v` prints where a
/// turn's time goes on a cluster, step by step.
fn cluster(reps: usize) -> Vec<Measure> {
    use caw_box::provider::TurnRequest;
    let script = lab_script();
    let reused = test_runs_lab();
    if !reused {
        let _ = Command::new(&script).args(["down", LAB_DIR]).output();
        let up = Command::new(&script)
            .args(["up", LAB_DIR])
            .output()
            .unwrap();
        assert!(
            up.status.success(),
            "k8s-lab up: {}",
            String::from_utf8_lossy(&up.stderr)
        );
    }
    let _lab = LabUp { reused };
    let stub_image = "caw-box-test/stub-model:latest";
    let load = Command::new(&script)
        .args(["load-image", "caw-box/codex:latest", stub_image])
        .output()
        .unwrap();
    assert!(
        load.status.success(),
        "load-image: {}",
        String::from_utf8_lossy(&load.stderr)
    );
    let stub = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "bench-stub", "labels": {"app.kubernetes.io/managed-by": "caw-box-bench"}},
        "spec": {"restartPolicy": "Never", "automountServiceAccountToken": false,
            "containers": [{"name": "stub", "image": stub_image, "imagePullPolicy": "Never",
                "env": [{"name": "STUB_EXPECT_KEY", "value": BENCH_KEY}]}]}
    });
    lab_kubectl(&["apply", "-f", "-"], Some(&stub.to_string()));
    lab_kubectl(
        &[
            "wait",
            "--for=condition=Ready",
            "pod/bench-stub",
            "--timeout=120s",
        ],
        None,
    );
    let ip = lab_kubectl(
        &["get", "pod", "bench-stub", "-o", "jsonpath={.status.podIP}"],
        None,
    );
    let endpoint = format!("http://{}:8080", ip.trim());
    // The stub listens a moment after its pod is ready.
    for _ in 0..50 {
        let addr = format!("{}:8080", ip.trim()).parse().unwrap();
        if std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(200))
            .is_ok()
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }

    let data = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("README.md"), "bench\n").unwrap();
    let caw = |args: &[&str]| {
        let mut c = Command::new(caw_box());
        c.args(["--backend", "kubernetes", "--namespace", "default"])
            .args(args)
            .args([
                "--env",
                &format!("OPENAI_API_KEY={BENCH_KEY}"),
                "-q",
                "-o",
                "json",
            ])
            .env("CAW_BOX_DATA_DIR", data.path())
            .env("KUBECONFIG", format!("{LAB_DIR}/kubeconfig"))
            .env_remove("CAW_BOX_BACKEND")
            .current_dir(ws.path());
        c
    };
    let (_, first, _) = timed(caw(&[
        "run",
        "--provider",
        "codex",
        "--model",
        "gpt-5.5",
        "--endpoint",
        &endpoint,
        "REMEMBER:bench",
    ]));
    let id = serde_json::from_str::<serde_json::Value>(first.trim()).unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let caw_times: Vec<f64> = (0..reps)
        .map(|_| timed(caw(&["resume", &id, "hello"])).0)
        .collect();
    // Warm resumes (`--keep-warm`): the first leaves the session's pod warm, the next run
    // in it by exec; the last goes cold again and takes the pod with it.
    timed(caw(&["resume", &id, "--keep-warm", "60s", "hello"]));
    let warm_times: Vec<f64> = (0..reps)
        .map(|_| timed(caw(&["resume", &id, "hello"])).0)
        .collect();
    timed(caw(&["resume", &id, "--keep-warm", "off", "hello"]));

    let claim = serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "bench-plain-home", "labels": {"app.kubernetes.io/managed-by": "caw-box-bench"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    });
    lab_kubectl(&["apply", "-f", "-"], Some(&claim.to_string()));
    let credential_env = ["OPENAI_API_KEY".to_string()];
    let command = ProviderKind::Codex.adapter().turn_command(&TurnRequest {
        prompt: "hello",
        model: Some("gpt-5.5"),
        endpoint: Some(&endpoint),
        credential_env: &credential_env,
        ..Default::default()
    });
    let mut env = vec![
        serde_json::json!({"name": "HOME", "value": "/home/agent"}),
        serde_json::json!({"name": "OPENAI_API_KEY", "value": BENCH_KEY}),
    ];
    env.extend(
        command
            .env
            .iter()
            .map(|(k, v)| serde_json::json!({"name": k, "value": v})),
    );
    let plain_times: Vec<f64> = (0..reps)
        .map(|i| {
            let name = format!("bench-plain-{i}");
            let overrides = serde_json::json!({
                "spec": {
                    "restartPolicy": "Never", "automountServiceAccountToken": false,
                    "securityContext": {"fsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": name, "image": "caw-box/codex:latest", "imagePullPolicy": "Never",
                        "args": command.argv, "env": env, "workingDir": "/workspace",
                        "stdin": command.stdin.is_some(), "stdinOnce": true,
                        "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": true,
                            "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                            "capabilities": {"drop": ["ALL"]}},
                        "volumeMounts": [{"name": "home", "mountPath": "/home/agent"},
                            {"name": "tmp", "mountPath": "/tmp"},
                            {"name": "ws", "mountPath": "/workspace"}]
                    }],
                    "volumes": [{"name": "home", "persistentVolumeClaim": {"claimName": "bench-plain-home"}},
                        {"name": "tmp", "emptyDir": {}}, {"name": "ws", "emptyDir": {}}]
                }
            });
            let mut c = Command::new(LAB_KUBECTL);
            c.env("KUBECONFIG", format!("{LAB_DIR}/kubeconfig"))
                .args(["-n", "default", "run", &name, "--rm", "-i", "--quiet"])
                .args(["--restart=Never", "--image=caw-box/codex:latest", "--image-pull-policy=Never"])
                .arg(format!("--overrides={overrides}"));
            if let Some(stdin) = &command.stdin {
                let file = data.path().join(format!("stdin-{i}"));
                std::fs::write(&file, stdin).unwrap();
                c.stdin(std::fs::File::open(file).unwrap());
            } else {
                c.stdin(std::process::Stdio::null());
            }
            timed(c).0
        })
        .collect();
    let (caw, plain, warm) = (median(caw_times), median(plain_times), median(warm_times));
    let _ = Command::new(caw_box())
        .args([
            "--backend",
            "kubernetes",
            "--namespace",
            "default",
            "rm",
            "--force",
            &id,
        ])
        .env("CAW_BOX_DATA_DIR", data.path())
        .env("KUBECONFIG", format!("{LAB_DIR}/kubeconfig"))
        .output();
    vec![
        Measure {
            name: "cluster: codex resume turn, caw-box (s)".into(),
            value: caw,
            unit: "s",
            target: "(reported)".into(),
            met: None,
        },
        Measure {
            name: "cluster: the same turn, kubectl run --rm -i (s)".into(),
            value: plain,
            unit: "s",
            target: "(reported)".into(),
            met: None,
        },
        Measure {
            name: "cluster: caw-box / plain pod".into(),
            value: caw / plain,
            unit: "x",
            target: "<= 1.50".into(),
            met: Some(caw / plain <= 1.5),
        },
        Measure {
            name: "cluster: codex warm resume turn (--keep-warm), caw-box (s)".into(),
            value: warm,
            unit: "s",
            target: "(reported)".into(),
            met: None,
        },
        Measure {
            name: "cluster: warm resume / plain pod".into(),
            value: warm / plain,
            unit: "x",
            target: "<= 0.50".into(),
            met: Some(warm / plain <= 0.5),
        },
    ]
}
