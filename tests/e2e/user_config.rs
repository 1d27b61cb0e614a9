//! `--user-config` (issue 19): the user's own CLI setup on the host reaches a new session's
//! HOME, so that a line of `CLAUDE.md` / `AGENTS.md` / `GEMINI.md` is in what each CLI sends
//! its model; a credential file beside it never reaches the state volume.

use crate::common::*;

/// The instructions file of `p` under HOME, and the credential file beside it.
fn files_of(p: P) -> (&'static str, &'static str) {
    match p.name {
        "claude_code" => (".claude/CLAUDE.md", ".claude/.credentials.json"),
        "codex" => (".codex/AGENTS.md", ".codex/auth.json"),
        "gemini" => (".gemini/GEMINI.md", ".gemini/oauth_creds.json"),
        "opencode" => (
            ".config/opencode/AGENTS.md",
            ".local/share/opencode/auth.json",
        ),
        _ => unreachable!(),
    }
}

#[test]
fn the_users_instructions_reach_the_model_and_credentials_stay_home() {
    let rig = Rig::new("user-config");
    for p in ALL {
        let home = tempfile::tempdir().unwrap();
        let (instructions, credential) = files_of(p);
        let marker = format!("Always sign with kumquat-{}-{}.", p.name, rig.run_id);
        let secret = format!("refresh-token-{}", rig.run_id);
        for (path, text) in [
            (instructions, format!("# My rules\n{marker}\n")),
            (credential, format!("{{\"refresh_token\":\"{secret}\"}}")),
        ] {
            let path = home.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }

        let mut cmd = rig.run_cmd(p, "REMEMBER:configured", &["--user-config"]);
        cmd.env("HOME", home.path());
        let (code, json, stderr) = rig.json_turn(cmd);
        assert_eq!(code, 0, "{}: {json}\n{stderr}", p.name);
        assert!(
            stderr.contains(&format!("--user-config: ~/{instructions}: ")),
            "{}: {stderr}",
            p.name
        );
        let id = json["session_id"].as_str().unwrap();
        let requests = rig.stub_requests();
        assert!(
            requests
                .iter()
                .any(|r| r["body"].to_string().contains(&marker)),
            "{}: no model request carried the user's instructions",
            p.name
        );
        // (Also in codex's rollout, which records the instructions it sent.)
        let holding = volume_files_containing(&rig, id, &marker);
        assert!(
            holding.contains(&format!("/h/{instructions}")),
            "{}: {holding:?}",
            p.name
        );
        assert!(
            volume_files_containing(&rig, id, &secret).is_empty(),
            "{}: the credential file reached the volume",
            p.name
        );
        // The image's own defaults in HOME are there beside the user's files (Podman fills
        // a new volume only at a container's first start, and only while it is empty).
        let defaults = match p.name {
            "codex" => Some((".codex/config.toml", "[analytics]")),
            "gemini" => Some((".gemini/settings.json", "telemetry")),
            _ => None,
        };
        if let Some((path, line)) = defaults {
            let text = in_volume(&rig, id, &["cat", &format!("/h/{path}")]).join("\n");
            assert!(text.contains(line), "{}: ~/{path}: {text}", p.name);
        }
    }
}
