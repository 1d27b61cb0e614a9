//! `--egress balanced|locked|open`: what the agent reaches besides its model, through the
//! shared egress proxy, and every turn's record of it. Stand-ins on the test's network
//! answer under a package registry's name (`pypi.org`) and under one no list holds
//! (`decoy`); real codex, its shell tool run by the stub model, is the client.

use std::time::Duration;

use serde_json::Value;

use crate::broker::collect_key;
use crate::common::*;

/// The probe the stub model has codex run: a request to each host through the proxy its
/// environment names (curl honours `http_proxy`), the refusal timed, and a query string
/// with `marker` to the allowed host (it must reach the host and nowhere in the record).
/// What it prints is short (the stub quotes 300 characters of a tool's output): the allowed
/// host's status, the refusal's time, CONNECT's answer, and the refusal body's words found.
fn probe(allowed: &str, refused: &str, marker: &str, policy: &str) -> String {
    format!(
        "RUN:curl -s -o /dev/null -w 'got=%{{http_code}};' 'http://{allowed}/v1/models?token={marker}'; s=$EPOCHREALTIME; b=$(curl -s http://{refused}/_stub/health); e=$EPOCHREALTIME; echo \"ms=$(( (${{e/./}}-${{s/./}})/1000 ));\"; curl -sS https://{refused}/ 2>&1 | grep -o 'response 403'; echo \"$b\" | grep -o -e '{refused}:80 is refused' -e '\"{policy}\"' -e '--allow-host {refused}:80' -e '--egress open' | tr '\\n' ';'"
    )
}

fn stream(rig: &Rig, mut cmd: std::process::Command) -> (i32, Vec<Value>, String) {
    cmd.args(["-o", "stream-json"]);
    let out = run(cmd);
    let events = stdout_of(&out)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let _ = rig;
    (out.status.code().unwrap_or(-1), events, stderr_of(&out))
}

/// One host and port of a record's `allowed` or `refused`.
fn entry<'a>(egress: &'a Value, list: &str, host: &str) -> Option<&'a Value> {
    egress[list]
        .as_array()?
        .iter()
        .find(|e| e["host"] == host && e["port"] == 80)
}

/// The default policy, from inside the agent's container during its turn: a package host's
/// stand-in answers, a host not on the list gets within a second the 403 that names it, the
/// policy and the flag (plain HTTP and CONNECT), as the output of the CLI's own tool, and the
/// turn goes on. The refusal is an `egress_refused` event as it happens; the turn's record
/// (`-o stream-json`'s result, `show --json`, `show`) holds both hosts with counts, and no
/// query string (the marker reached the host: the control).
#[test]
fn the_default_policy_reaches_package_hosts_and_refuses_others_in_words() {
    let rig = Rig::new("egress-default");
    let pypi = rig.start_stand_in("pypi.org");
    rig.start_stand_in("decoy");
    let marker = "EGRESSMARK7q";
    let (code, events, stderr) = stream(
        &rig,
        rig.run_cmd(CODEX, &probe("pypi.org", "decoy", marker, "balanced"), &[]),
    );
    assert_eq!(code, 0, "{stderr}\n{events:#?}");
    let result = events.last().unwrap();
    assert_eq!(result["status"], "success", "{result:#}");
    let answer = result["result"].as_str().unwrap();
    assert!(
        answer.contains("got=200;"),
        "pypi.org did not answer: {answer}"
    );
    for words in [
        "decoy:80 is refused;",
        "\"balanced\";",
        "--allow-host decoy:80;",
        "--egress open;",
    ] {
        assert!(answer.contains(words), "{words:?} not in: {answer}");
    }
    let took: u64 = answer
        .split("ms=")
        .nth(1)
        .and_then(|t| t.split(';').next())
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or_else(|| panic!("no time in: {answer}"));
    assert!(took < 1000, "the refusal took {took} ms: {answer}");
    assert!(answer.contains("response 403"), "CONNECT: {answer}");
    // Said as it happened: before the turn's result.
    let refused_at = events
        .iter()
        .position(|e| e["type"] == "egress_refused" && e["host"] == "decoy" && e["port"] == 80)
        .unwrap_or_else(|| panic!("no egress_refused event: {events:#?}"));
    assert_eq!(events[refused_at]["policy"], "balanced");
    // Said when it happened, during the tool's run: before the model's answer that tells
    // of it (a refusal said only at the turn's end would come after it).
    let answered_at = events
        .iter()
        .rposition(|e| e["type"] == "text")
        .unwrap_or_else(|| panic!("no text event: {events:#?}"));
    assert!(refused_at < answered_at, "said late: {events:#?}");

    let id = result["session_id"].as_str().unwrap();
    let egress = &result["egress"];
    assert_eq!(egress["policy"], "balanced", "{egress:#}");
    let reached = entry(egress, "allowed", "pypi.org").unwrap_or_else(|| panic!("{egress:#}"));
    assert_eq!(reached["connections"], 1, "{egress:#}");
    assert!(reached["bytes_in"].as_u64() > Some(0), "{egress:#}");
    let refused = entry(egress, "refused", "decoy").unwrap_or_else(|| panic!("{egress:#}"));
    assert_eq!(refused["connections"], 1, "{egress:#}");
    assert!(
        egress["refused"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["host"] == "decoy" && e["port"] == 443),
        "{egress:#}"
    );

    let shown = run({
        let mut c = rig.caw();
        c.args(["show", id, "--json"]);
        c
    });
    let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
    let turn = &shown["turns"][0];
    assert_eq!(&turn["egress"], egress, "{shown:#}");
    let text = stdout_of(&run({
        let mut c = rig.caw();
        c.args(["show", id]);
        c
    }));
    assert!(
        text.contains("  egress balanced: reached ")
            && text.contains("pypi.org:80 (1x, ")
            && text.contains("refused decoy:80 (1x)"),
        "{text}"
    );
    assert!(text.contains("egress     balanced"), "{text}");

    // The marker reached pypi.org, and is nowhere in what caw-box kept or printed.
    assert!(
        rig.requests_of(&pypi)
            .iter()
            .any(|r| r.to_string().contains(marker)),
        "the control: the query never reached the host"
    );
    assert!(!egress.to_string().contains(marker), "{egress:#}");
    assert!(!turn["egress"].to_string().contains(marker));
    let logged = proxy_logs(&rig);
    assert!(logged.contains("pypi.org:80"), "the proxy's log: {logged}");
    assert!(
        !logged.contains(marker) && !logged.contains("/v1/models"),
        "the proxy logged a path or query: {logged}"
    );

    check("logs -f of a detached turn says its refusal as it comes, once");
    let out = run(rig.resume_cmd(
        CODEX,
        id,
        "RUN:sleep 3; curl -s http://decoy/_stub/health >/dev/null; sleep 2; echo done",
        &["-d"],
    ));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let following = std::time::Instant::now();
    let followed = rig.caw_run(&["logs", id, "-f"]);
    assert_eq!(followed.status.code(), Some(0), "{}", stderr_of(&followed));
    // It followed the turn as it ran (a turn that ended is read at once from its record).
    assert!(
        following.elapsed() > Duration::from_secs(3),
        "the turn had ended: {:?}",
        following.elapsed()
    );
    let events: Vec<Value> = stdout_of(&followed)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
        .collect();
    let refusals: Vec<usize> = (0..events.len())
        .filter(|i| events[*i]["type"] == "egress_refused")
        .collect();
    assert_eq!(refusals.len(), 1, "{events:#?}");
    assert_eq!(events[refusals[0]]["host"], "decoy", "{events:#?}");
    assert_eq!(events[refusals[0]]["policy"], "balanced", "{events:#?}");
    // Followed from the proxy's log while the tool ran: before the model's answer after
    // it (the turn's recorded log, printed once the turn ended, comes after that).
    let answered_at = events
        .iter()
        .rposition(|e| e["type"] == "text")
        .unwrap_or_else(|| panic!("no text event: {events:#?}"));
    assert!(refusals[0] < answered_at, "said late: {events:#?}");
    assert_eq!(events.last().unwrap()["type"], "result", "{events:#?}");
}

/// The test's egress proxies' containers.
fn proxy_ids(rig: &Rig) -> Vec<String> {
    rig.rt.block_on(async {
        rig.docker
            .list_containers(Some(bollard::query_parameters::ListContainersOptions {
                all: true,
                filters: Some(std::collections::HashMap::from([(
                    "label".to_string(),
                    vec![
                        format!("{TEST_LABEL}={}", rig.run_id),
                        "io.caw-box.role=proxy".to_string(),
                    ],
                )])),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_iter()
            .filter_map(|c| c.id)
            .collect()
    })
}

/// What the test's shared proxies printed.
fn proxy_logs(rig: &Rig) -> String {
    use futures_util::StreamExt;
    let mut text = String::new();
    for id in proxy_ids(rig) {
        rig.rt.block_on(async {
            let mut logs = rig.docker.logs(
                &id,
                Some(bollard::query_parameters::LogsOptions {
                    stdout: true,
                    stderr: true,
                    ..Default::default()
                }),
            );
            while let Some(Ok(chunk)) = logs.next().await {
                text.push_str(&chunk.to_string());
            }
        });
    }
    text
}

/// `--egress locked`: the package host is refused too, while the model's traffic flows
/// through the broker (a collected key); a resume with `--egress open` reaches the decoy,
/// recorded under `allowed` (the session keeps its own policy, which `show` says).
#[test]
fn locked_refuses_package_hosts_and_open_reaches_anything() {
    let rig = Rig::new("egress-locked");
    let home = tempfile::tempdir().unwrap();
    collect_key(&rig, CODEX, home.path());
    rig.start_stand_in("pypi.org");
    rig.start_stand_in("decoy");
    let (code, events, stderr) = stream(
        &rig,
        rig.run_cmd_stored_key(
            CODEX,
            &probe("decoy", "pypi.org", "m1", "locked"),
            &["--egress", "locked"],
        ),
    );
    assert_eq!(code, 0, "{stderr}\n{events:#?}");
    let result = events.last().unwrap();
    let answer = result["result"].as_str().unwrap();
    assert!(
        answer.contains("got=403;")
            && answer.contains("pypi.org:80 is refused;")
            && answer.contains("\"locked\";"),
        "{answer}"
    );
    assert!(
        entry(&result["egress"], "refused", "pypi.org").is_some(),
        "{result:#}"
    );
    assert!(
        entry(&result["egress"], "refused", "decoy").is_some(),
        "{result:#}"
    );
    // Brokered: the agent holds a placeholder, and the model answered through the broker.
    assert!(rig.stub_requests().iter().all(|r| r["status"] != 401));
    let id = result["session_id"].as_str().unwrap().to_string();

    let mut c = rig.caw();
    c.args([
        "resume",
        &id,
        "--egress",
        "open",
        &probe("decoy", "nowhere", "m2", "open"),
    ]);
    let (code, events, stderr) = stream(&rig, c);
    assert_eq!(code, 0, "{stderr}\n{events:#?}");
    let result = events.last().unwrap();
    let egress = &result["egress"];
    assert_eq!(egress["policy"], "open", "{egress:#}");
    assert!(entry(egress, "allowed", "decoy").is_some(), "{egress:#}");
    assert!(
        result["result"].as_str().unwrap().contains("got=200;"),
        "{result:#}"
    );
    let text = stdout_of(&run({
        let mut c = rig.caw();
        c.args(["show", &id]);
        c
    }));
    // The session keeps its policy; the resume's applied to its turn.
    assert!(text.contains("egress     locked"), "{text}");
    assert!(
        text.contains("  egress locked: nothing reached; refused "),
        "{text}"
    );
    assert!(text.contains("  egress open: reached "), "{text}");
}

/// A shared proxy stays for the next turn of any session with the same egress, and goes
/// once no turn held it for its idle time (`CAW_BOX_PROXY_IDLE`), removing itself; the
/// change of the default is said on the first run after the upgrade, and only then.
#[test]
fn shared_proxies_serve_several_sessions_and_idle_out() {
    let rig = Rig::new("egress-idle");
    let proxies = || proxy_ids(&rig);
    // A data directory an older caw-box used: the first new session says the default
    // changed, once.
    std::fs::write(rig.data_dir.path().join("broker-salt"), [7u8; 32]).unwrap();
    let news = "new sessions' egress is now `balanced` (was open)";
    let mut first = rig.run_cmd(CODEX, "REMEMBER:one", &[]);
    first.env("CAW_BOX_PROXY_IDLE", "4");
    let (code, json, stderr) = rig.json_turn(first);
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert!(stderr.contains(news), "{stderr}");
    let after_first = proxies();
    assert_eq!(after_first.len(), 1, "one proxy, kept for the next turns");
    let mut second = rig.run_cmd(CODEX, "REMEMBER:two", &[]);
    second.env("CAW_BOX_PROXY_IDLE", "4");
    let (code, json, stderr) = rig.json_turn(second);
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert!(!stderr.contains(news), "said twice: {stderr}");
    assert_eq!(
        proxies(),
        after_first,
        "the second session's turn used the same proxy"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !proxies().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(proxies().is_empty(), "the idle proxy is still there");
    // Its network stays for the next proxy, until `gc` finds nothing on it.
    let networks = || {
        rig.rt
            .block_on(rig.docker.list_networks(Some(
                bollard::query_parameters::ListNetworksOptions {
                    filters: Some(std::collections::HashMap::from([(
                        "label".to_string(),
                        vec![
                            format!("{TEST_LABEL}={}", rig.run_id),
                            "io.caw-box.role=proxy".to_string(),
                        ],
                    )])),
                },
            )))
            .unwrap()
            .len()
    };
    assert_eq!(networks(), 1, "the shared egress network");
    let out = rig.caw_run(&["gc", "--older-than", "30d"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(
        stdout_of(&out).contains("removed 1 unused egress network"),
        "{}",
        stdout_of(&out)
    );
    assert_eq!(networks(), 0, "gc left the unused egress network");
}
