//! Config files (issue 16): a project's `.caw-box.toml` shapes a real turn with no flags on
//! the command line, and its `allow_host` list restricts the agent's egress.

use crate::common::*;

#[test]
fn a_project_file_allow_host_restricts_a_real_turn() {
    let rig = Rig::new("cfgallow");
    let other = rig.start_other_server();
    // The repository's file holds every setting of the turn, its key only by name.
    let repo = rig.workspace.path();
    std::fs::create_dir(repo.join(".git")).unwrap();
    std::fs::create_dir(repo.join("app")).unwrap();
    std::fs::write(
        repo.join(".caw-box.toml"),
        format!(
            "provider = \"codex\"\nmodel = \"gpt-5.5\"\nnetwork = \"{network}\"\nendpoint = \"{endpoint}\"\nallow_host = [\"{stub}:8080\"]\nenv_pass = [\"OPENAI_API_KEY\"]\n",
            network = rig.network,
            endpoint = rig.endpoint(),
            stub = rig.stub,
        ),
    )
    .unwrap();
    let mut cmd = rig.caw();
    cmd.current_dir(repo.join("app"))
        .env("OPENAI_API_KEY", TEST_KEY)
        .args(["run", "REMEMBER:configured"]);
    let (code, json, stderr) = rig.json_turn(cmd);
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert_eq!(json["provider"], "codex");
    let id = json["session_id"].as_str().unwrap().to_string();

    // The session remembers the allowlist the file gave: its next turn (no config applies
    // to a resumed session's settings) reaches the stub through the proxy and nothing else.
    rig.assert_only_the_stub_is_reachable(&id, &other);
}
