//! Config files (issue 16): a project's `.caw-box.toml` shapes a real turn with no flags on
//! the command line, and its `egress = "locked"` holds the agent to its model.

use crate::common::*;

#[test]
fn a_project_file_locks_a_real_turns_egress() {
    let rig = Rig::new("cfgallow");
    let other = rig.start_other_server();
    // The repository's file holds every setting of the turn, its key only by name.
    let repo = rig.workspace.path();
    std::fs::create_dir(repo.join(".git")).unwrap();
    std::fs::create_dir(repo.join("app")).unwrap();
    std::fs::write(
        repo.join(".caw-box.toml"),
        format!(
            "provider = \"codex\"\nmodel = \"gpt-5.5\"\nnetwork = \"{network}\"\nendpoint = \"{endpoint}\"\negress = \"locked\"\nenv_pass = [\"OPENAI_API_KEY\"]\n",
            network = rig.network,
            endpoint = rig.endpoint(),
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

    // The session remembers the policy the file gave: its next turn (no config applies to a
    // resumed session's settings) reaches the model (the stub) through the proxy and nothing
    // else.
    rig.assert_only_the_stub_is_reachable(&id, &other);
}
