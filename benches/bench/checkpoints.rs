//! Part `checkpoints`: what keeping a checkpoint at every turn's end costs, and what a fork
//! costs (issue 53's `make bench` bullet).
//!
//! Two codex sessions in a copy-mode workspace of 200 MB (2,000 files; `--smoke`: 4 MB), one
//! keeping checkpoints (the default) and one with `--checkpoints off`. After their first turns
//! (each copies the workspace: not measured), ten turns each that change one small file,
//! alternating which session goes first; all of it [`ROUNDS`] times, with new sessions. The
//! median of the paired ratios of a turn with checkpoints to one without (target <= 1.03),
//! and the bytes the first session's checkpoint volumes hold (`du` of them) beyond the
//! workspace's own (target under 5 MB).
//!
//! Then `caw-box fork` of that session at its latest turn against the floor: one plain
//! `docker run` that copies the same session's state and workspace volumes into two new
//! volumes with `cp -a` (target <= 1.2). The storage driver, and the filesystem under the
//! volumes, are printed. A fork of the latest turn copies the source's volumes with `cp -a`
//! too (the kernel copies each file in place, or reflinks it on XFS and Btrfs): Docker
//! volumes have no copy-on-write, whatever the driver of the image layers. A fork at an
//! earlier turn unpacks its checkpoint's layers with tar instead (not measured here).

use std::process::Command;
use std::time::Instant;

use super::{caw_box, docker_cli, median, settled, timed, Bench, Measure, ModelRig};

/// How many times the sessions' pair (with checkpoints, without) is made and takes its ten
/// turns: a pair of turns differs by some 10% either way on a busy 2-core host, against a
/// target of 3%, so the median is of this many times ten pairs.
const ROUNDS: usize = 3;

/// The workspace: this many files of this many bytes (200 MB; the smoke run 4 MB).
const FILE_BYTES: usize = 100_000;

/// Fills `dir` with `files` files of [`FILE_BYTES`] each, of bytes no compression or
/// deduplication could shrink (a xorshift stream).
fn fill_workspace(dir: &std::path::Path, files: usize) -> u64 {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut buf = vec![0u8; FILE_BYTES];
    for i in 0..files {
        for chunk in buf.chunks_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
        }
        let sub = dir.join(format!("d{}", i / 100));
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(sub.join(format!("f{i}.bin")), &buf).unwrap();
    }
    (files * FILE_BYTES) as u64
}

fn session_of(out: &str) -> String {
    serde_json::from_str::<serde_json::Value>(out.trim()).unwrap()["session_id"]
        .as_str()
        .expect("a session id")
        .to_string()
}

/// One caw-box command in the rig's data directory, with its labels; stdout.
fn caw(rig: &ModelRig, args: &[&str]) -> (f64, String) {
    let mut c = Command::new(caw_box());
    c.args(args)
        .env("CAW_BOX_DATA_DIR", &rig.data_dir)
        .env("CAW_BOX_LABELS", &rig.label);
    let (secs, out, _) = timed(c);
    // What a turn's container finishes behind it (the checkpoint) is not the next
    // measurement's to share the machine with.
    settled(&rig.label);
    (secs, out)
}

/// The session's first turn in a copy of `ws` (with `extra` flags); its id.
fn first_turn(rig: &ModelRig, codex: &Bench, ws: &std::path::Path, extra: &[&str]) -> String {
    let endpoint = format!("http://{}:8080", rig.stub);
    let mut args = vec![
        "run",
        "--provider",
        codex.provider.as_str(),
        "--network",
        &rig.network,
        "--endpoint",
        &endpoint,
        "--workspace-mode",
        "copy",
        "--workspace",
        ws.to_str().unwrap(),
        "--model",
        codex.model.unwrap(),
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["-q", "-o", "json", "REMEMBER:bench RUN:echo 0 > turn.txt"]);
    session_of(&caw(rig, &args).1)
}

/// A resumed turn of `session` that changes one small file; seconds.
fn small_turn(rig: &ModelRig, session: &str, i: usize) -> f64 {
    let prompt = format!("RUN:echo {i} > turn.txt");
    caw(rig, &["resume", session, "-q", "-o", "json", &prompt]).0
}

/// The bytes the volumes `names` hold, by `du` in one container.
fn volume_bytes(rig: &ModelRig, image: &str, names: &[String]) -> u64 {
    let mut c = Command::new("docker");
    c.args(["run", "--rm", "--network", "none", "--label", &rig.label]);
    c.args(["--user", "0:0", "--entrypoint", "du"]);
    for (i, v) in names.iter().enumerate() {
        c.args(["-v", &format!("{v}:/v/{i}:ro")]);
    }
    c.args([image, "-s", "-b", "/v"]);
    let out = c.output().expect("docker run du");
    assert!(
        out.status.success(),
        "du: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("du's total")
}

/// The floor of a fork: one plain `docker run` that copies the session's volumes into two
/// new ones with `cp -a`; seconds. The new volumes go afterwards (not timed).
fn plain_copy(rig: &ModelRig, image: &str, session: &str, i: usize) -> f64 {
    let (home, ws) = (
        format!("caw-box-bench-copy-{}-{i}-home", std::process::id()),
        format!("caw-box-bench-copy-{}-{i}-ws", std::process::id()),
    );
    let mut c = Command::new("docker");
    c.args(["run", "--rm", "--network", "none", "--label", &rig.label])
        .args(["--user", "0:0", "--entrypoint", "sh"])
        .args(["-v", &format!("caw-box-{session}:/s/home:ro")])
        .args(["-v", &format!("caw-box-{session}-workspace:/s/ws:ro")]);
    for (v, dst) in [(&home, "/d/home"), (&ws, "/d/ws")] {
        c.args([
            "--mount",
            &format!("type=volume,src={v},dst={dst},volume-label={}", rig.label),
        ]);
    }
    c.args([
        image,
        "-c",
        "cp -a /s/home/. /d/home/ && cp -a /s/ws/. /d/ws/",
    ]);
    settle();
    let (secs, _, _) = timed(c);
    docker_cli(&["volume", "rm", "-f", &home, &ws]);
    secs
}

/// Writes the page cache's dirty pages out before a timed copy, so that neither the fork
/// nor the floor pays for the writeback of the 400 MB the one before it wrote (or removed).
fn settle() {
    let _ = Command::new("sync").status();
}

/// The storage driver and the filesystem under Docker's volumes, as the daemon says.
fn storage() -> String {
    let out = docker_cli(&["info", "--format", "{{.Driver}} {{.DockerRootDir}}"]);
    let info = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let (driver, root) = info.split_once(' ').unwrap_or((&info, "/var/lib/docker"));
    let fs = Command::new("stat")
        .args(["-f", "-c", "%T", root])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    format!("{driver} on {}", if fs.is_empty() { "?" } else { &fs })
}

/// The median of the paired ratios of turns with checkpoints (`on`) to turns without
/// (`off`), against 1.03.
fn on_off(what: &str, on: Vec<f64>, off: Vec<f64>) -> Measure {
    if std::env::var_os("BENCH_DEBUG").is_some() {
        eprintln!("{what}: on {on:.3?}\n{what}: off {off:.3?}");
    }
    let ratio = median(on.iter().zip(&off).map(|(a, b)| a / b).collect());
    Measure {
        name: format!(
            "{what}: on {:.0} ms / off {:.0} ms",
            median(on) * 1000.0,
            median(off) * 1000.0
        ),
        value: ratio,
        unit: "x",
        target: "<= 1.03".into(),
        met: Some(ratio <= 1.03),
    }
}

/// Part `checkpoints` (see the module's docs), on the turns' rig. The smoke run (some 5 s)
/// keeps the session with checkpoints only, its first turn and one fork: the session without
/// them, and so the ratio of the two, is the full run's (`--checkpoints off` is an e2e test's).
pub fn checkpoints(
    rig: &ModelRig,
    smoke: bool,
    reps: Option<usize>,
    codex: &Bench,
) -> Vec<Measure> {
    let ws = tempfile::tempdir().unwrap();
    let _ = std::os::unix::fs::chown(ws.path(), Some(1000), Some(1000));
    let files = if smoke { 40 } else { 2_000 };
    let ws_bytes = fill_workspace(ws.path(), files);
    let image = codex.provider.default_image();

    let turns = reps.unwrap_or(if smoke { 0 } else { 10 });
    let rounds = if smoke || reps.is_some() { 1 } else { ROUNDS };
    let (mut on, mut off) = (Vec::new(), Vec::new());
    let mut kept = None;
    for _ in 0..rounds {
        let with = first_turn(rig, codex, ws.path(), &[]);
        let without =
            (!smoke).then(|| first_turn(rig, codex, ws.path(), &["--checkpoints", "off"]));
        // The first turns' 400 MB of copies are written out before any turn is timed.
        settle();
        for i in 1..=turns {
            let Some(without) = &without else {
                small_turn(rig, &with, i);
                continue;
            };
            if i % 2 == 0 {
                on.push(small_turn(rig, &with, i));
                off.push(small_turn(rig, without, i));
            } else {
                off.push(small_turn(rig, without, i));
                on.push(small_turn(rig, &with, i));
            }
        }
        if let Some(without) = &without {
            let shown: serde_json::Value =
                serde_json::from_str(caw(rig, &["show", without, "--json"]).1.trim()).unwrap();
            assert_eq!(
                shown["checkpoints"].as_array().map_or(0, Vec::len),
                0,
                "--checkpoints off keeps none: {shown}"
            );
        }
        // The first round's session is the one measured for bytes and forked.
        kept.get_or_insert(with);
    }
    let with = kept.expect("a round");
    let mb = ws_bytes as f64 / 1e6;
    let mut results = Vec::new();
    if !on.is_empty() {
        let what = format!(
            "codex turn, {mb:.0} MB copy workspace, checkpoints ({} pairs)",
            on.len()
        );
        results.push(on_off(&what, on, off));
    }
    // The checkpoints the first session keeps (its `show --json`), and what their volumes hold.
    let shown: serde_json::Value =
        serde_json::from_str(caw(rig, &["show", &with, "--json"]).1.trim()).unwrap();
    let listed = shown["checkpoints"]
        .as_array()
        .expect("checkpoints in show --json");
    assert_eq!(listed.len(), turns + 1, "a checkpoint per turn: {shown}");
    let held: Vec<String> = listed
        .iter()
        .map(|c| format!("caw-box-{with}-checkpoint-{}", c["turn"]))
        .collect();
    let layer = |c: &serde_json::Value| c["bytes"].as_u64().unwrap_or(0) as f64 / 1e6;
    // (+ 0.0: an empty sum of floats is -0.)
    let later = listed[1..].iter().map(layer).sum::<f64>() + 0.0;
    let first = layer(&listed[0]);
    let bytes = volume_bytes(rig, &image, &held);
    let above = (bytes as f64 - ws_bytes as f64) / 1e6;
    results.push(Measure {
        name: format!(
            "{} checkpoints hold {:.1} MB (first layer {first:.1}, the {} later {later:.2}): \
             above the {mb:.0} MB workspace by",
            held.len(),
            bytes as f64 / 1e6,
            held.len() - 1
        ),
        value: above,
        unit: "MB",
        target: "< 5 MB".into(),
        met: (!smoke).then_some(above < 5.0),
    });

    // fork at the latest turn against one plain `cp -a` of the same volumes.
    let forks = reps.unwrap_or(if smoke { 1 } else { 5 });
    let (mut caw_forks, mut floor) = (Vec::new(), Vec::new());
    let fork_once = || {
        settle();
        let started = Instant::now();
        let (_, out) = caw(rig, &["fork", &with, "-o", "json"]);
        let secs = started.elapsed().as_secs_f64();
        let made: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        let id = made["sessions"][0]["session_id"]
            .as_str()
            .unwrap()
            .to_string();
        caw(rig, &["rm", &id]);
        secs
    };
    for i in 0..forks {
        if i % 2 == 0 {
            caw_forks.push(fork_once());
            floor.push(plain_copy(rig, &image, &with, i));
        } else {
            floor.push(plain_copy(rig, &image, &with, i));
            caw_forks.push(fork_once());
        }
    }
    if std::env::var_os("BENCH_DEBUG").is_some() {
        eprintln!("fork: {caw_forks:.3?}\ncp -a: {floor:.3?}");
    }
    let ratio = median(caw_forks.iter().zip(&floor).map(|(c, d)| c / d).collect());
    let store = storage();
    results.push(Measure {
        name: format!(
            "fork {:.0} ms / docker run cp -a {:.0} ms, {store}",
            median(caw_forks) * 1000.0,
            median(floor) * 1000.0
        ),
        value: ratio,
        unit: "x",
        target: "<= 1.2".into(),
        met: (!smoke).then_some(ratio <= 1.2),
    });
    results
}
