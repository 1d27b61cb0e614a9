//! Part `pool`: a new session's first turn from a pool (`caw-box pool`, issue 56) against a
//! plain `docker run` of the same first turn (target <= 0.5), and against a cold caw-box
//! first turn of the same cost (reported); and what a pool at rest holds: the memory of its
//! ready boxes (reported).
//!
//! A pool of one box for the settings the bench's codex `run` has. Each repetition waits
//! until the box is ready (the refill a claim starts runs between measurements, never
//! during one), then times, in alternating order, a `run` that claims the box, a plain
//! `docker run` first turn, and a cold `run` (`--timeout 1h`: settings of their own, so it
//! takes no box, and nothing it does costs more).

use std::process::Command;
use std::time::{Duration, Instant};

use super::{caw_box, caw_turn_with, docker_turn, median, paired, Bench, Measure, ModelRig};

fn caw(rig: &ModelRig, ws: &std::path::Path) -> Command {
    let mut c = Command::new(caw_box());
    c.env("CAW_BOX_DATA_DIR", &rig.data_dir)
        .env("CAW_BOX_LABELS", &rig.label)
        .current_dir(ws);
    c
}

/// The pool's ready boxes: their session ids.
fn ready(rig: &ModelRig, ws: &std::path::Path) -> Vec<String> {
    let out = caw(rig, ws)
        .args(["pool", "ls", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ls: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    ls.as_array()
        .and_then(|a| a.first())
        .and_then(|p| p["boxes"].as_array())
        .map(|boxes| {
            boxes
                .iter()
                .filter(|b| b["state"] == "ready")
                .filter_map(|b| b["session_id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until the pool holds `n` ready boxes (and its refill has ended: making the box is
/// its last step; a short settle covers its exit).
fn until_ready(rig: &ModelRig, ws: &std::path::Path, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let boxes = ready(rig, ws);
        if boxes.len() >= n {
            std::thread::sleep(Duration::from_millis(300));
            return boxes;
        }
        assert!(Instant::now() < deadline, "the pool did not fill");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The memory (bytes) the containers `names` use now, as `docker stats` reads it.
fn memory_of(names: &[String]) -> u64 {
    let mut c = Command::new("docker");
    c.args(["stats", "--no-stream", "--format", "{{.MemUsage}}"])
        .args(names);
    let out = c.output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split('/').next())
        .map(|used| {
            let used = used.trim();
            let (num, unit) =
                used.split_at(used.find(|c: char| c.is_alphabetic()).unwrap_or(used.len()));
            let n: f64 = num.parse().unwrap_or(0.0);
            let scale = match unit {
                "KiB" | "kB" => 1024.0,
                "MiB" | "MB" => 1024.0 * 1024.0,
                "GiB" | "GB" => 1024.0 * 1024.0 * 1024.0,
                _ => 1.0,
            };
            (n * scale) as u64
        })
        .sum()
}

pub fn pool_turns(
    rig: &ModelRig,
    b: &Bench,
    ws: &std::path::Path,
    reps: usize,
    smoke: bool,
) -> Vec<Measure> {
    let endpoint = format!("http://{}:8080", rig.stub);
    let mut start = caw(rig, ws);
    start
        .args(["-q", "pool", "start", "--provider", b.provider.as_str()])
        .args([
            "--network",
            &rig.network,
            "--endpoint",
            &endpoint,
            "--size",
            "1",
        ]);
    if let Some(m) = b.model {
        start.args(["--model", m]);
    }
    let out = start.output().unwrap();
    assert!(
        out.status.success(),
        "pool start: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (mut pooled, mut dk, mut cold) = (vec![], vec![], vec![]);
    let mut at_rest = vec![];
    for i in 0..reps {
        let boxes = until_ready(rig, ws, 1);
        let names: Vec<String> = boxes
            .iter()
            .map(|id| format!("caw-box-pool-{id}"))
            .collect();
        at_rest.push(memory_of(&names) as f64);
        let volume = format!("caw-box-bench-{}-{i}-pool", std::process::id());
        let claim = || {
            let (t, out, _) = caw_turn_with(rig, b, ws, None, &[], "REMEMBER:bench");
            let id = serde_json::from_str::<serde_json::Value>(out.trim()).unwrap()["session_id"]
                .as_str()
                .unwrap()
                .to_string();
            assert!(boxes.contains(&id), "the run took no box: {out}");
            t
        };
        let plain = || docker_turn(rig, b, ws, &volume, None, "REMEMBER:bench").0;
        let cold_run = || caw_turn_with(rig, b, ws, None, &["--timeout", "1h"], "REMEMBER:bench").0;
        if i % 2 == 0 {
            pooled.push(claim());
            until_ready(rig, ws, 1);
            dk.push(plain());
            cold.push(cold_run());
        } else {
            cold.push(cold_run());
            dk.push(plain());
            until_ready(rig, ws, 1);
            pooled.push(claim());
        }
    }
    until_ready(rig, ws, 1);
    let out = caw(rig, ws)
        .args(["-q", "pool", "stop", "--all"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pool stop: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let against_cold = median(pooled.iter().zip(&cold).map(|(p, c)| p / c).collect());
    vec![
        paired(
            &format!("{} first turn from a pool", b.provider),
            pooled,
            dk,
            0.5,
            smoke,
        ),
        Measure {
            name: format!(
                "{} first turn from a pool, against a cold caw-box run",
                b.provider
            ),
            value: against_cold,
            unit: "x",
            target: "(reported)".into(),
            met: None,
        },
        Measure {
            name: "a ready box at rest: its memory".into(),
            value: median(at_rest) / (1024.0 * 1024.0),
            unit: "MiB",
            target: "(reported)".into(),
            met: None,
        },
    ]
}
