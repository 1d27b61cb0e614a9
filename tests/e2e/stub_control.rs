//! The helpers that reach a stub's own endpoints (`StubControl`), against the stub image: by
//! an exec in its container (the rig's way: its network is internal) and over HTTP from the
//! host (the Kubernetes tests' way: a pod by its IP; here the container's IP on the test's
//! network, which the host reaches). A `HOLD:` keeps a model request waiting until released.

use std::time::Duration;

use serde_json::Value;

use crate::common::*;

#[test]
fn stub_control_holds_and_releases_a_request_over_exec_and_http() {
    let rig = Rig::new("stub-control");
    let exec = rig.stub_control();
    let ip = rig
        .rt
        .block_on(rig.docker.inspect_container(&rig.stub, None))
        .unwrap()
        .network_settings
        .and_then(|n| n.networks)
        .and_then(|n| n.get(&rig.network).and_then(|e| e.ip_address.clone()))
        .expect("the stub's address on the test's network");
    let http = StubControl::Http(format!("http://{ip}:8080"));

    // A model request from the container's own node, held at the stub.
    let body = r#"{"model":"m","messages":[{"role":"user","content":"HOLD:h1 REMEMBER:fig"}]}"#;
    let send = format!(
        "fetch('http://127.0.0.1:8080/v1/chat/completions',{{method:'POST',headers:{{authorization:'Bearer {TEST_KEY}','content-type':'application/json'}},body:'{body}'}}).then(r=>r.text()).then(t=>console.log(t))"
    );
    let container = rig.stub.clone();
    let held = std::thread::spawn(move || {
        runtime().block_on(async {
            let docker = docker().negotiate_version().await.unwrap();
            exec_stdout(&docker, &container, &["node", "-e", &send]).await
        })
    });
    exec.wait_held("h1", 1, Duration::from_secs(60));
    assert_eq!(http.holds()["waiting"]["h1"], 1, "{}", http.holds());
    http.wait_held("h1", 1, Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(300));
    assert!(!held.is_finished(), "answered before its release");

    assert_eq!(http.release("h1"), 1);
    let answer: Value = serde_json::from_str(held.join().unwrap().trim()).unwrap();
    assert_eq!(
        answer["choices"][0]["message"]["content"], "Noted: fig.",
        "{answer}"
    );
    // A release before the request counts; the exec transport releases too.
    assert_eq!(exec.release("early"), 0);
    assert_eq!(http.holds()["released"], serde_json::json!(["early", "h1"]));
    let (status, _) = http.call("POST", "/_stub/release/not%20a%20name");
    assert_eq!(status, 404);
}
