//! `make bench`: caw-box's costs, measured on this machine, medians over repeated runs.
//!
//! A program, not a test: it prints a table and writes target/bench.json, and checks each
//! number against its target (exit 1 when one is missed). `--smoke` runs every part small
//! and fast, so CI keeps it from rotting; smoke numbers are not held to the targets.
//!
//! Parts so far: listing and TARGET resolution with many sessions, event parsing and
//! rendering throughput per provider, cold start of `caw-box --version`.

#![allow(clippy::print_stdout, clippy::print_stderr)]

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

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    xs[xs.len() / 2]
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

fn main() {
    let smoke = std::env::args().any(|a| a == "--smoke");
    let (sessions, runs, megabytes) = if smoke { (50, 3, 4) } else { (1000, 21, 100) };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut results = Vec::new();
    results.push(cold_start(runs * 2, smoke));
    results.extend(throughput(megabytes, smoke));
    results.extend(rt.block_on(listing(sessions, runs, smoke)));

    println!("{:<52} {:>12}   {:<14} met", "measure", "median", "target");
    for m in &results {
        let met = match m.met {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "(smoke)",
        };
        println!(
            "{:<52} {:>9.1} {:<4} {:<14} {met}",
            m.name, m.value, m.unit, m.target
        );
    }
    println!("not measured yet: turn overhead vs plain docker run, 32 concurrent turns, peak RSS during a turn");
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench.json");
    std::fs::write(&out, serde_json::to_vec_pretty(&results).unwrap()).unwrap();
    println!("written to {}", out.display());
    if results.iter().any(|m| m.met == Some(false)) {
        std::process::exit(1);
    }
}
