//! One adapter for the CLI versions users have: a session started on the previous pin's
//! image resumes after the pin moved (its image now holds the new CLI), with the flags each
//! version takes (the adapter reads the image's `io.caw-box.cli-version` label).

use bollard::query_parameters::RemoveImageOptions;
use serde_json::Value;

use crate::common::*;

/// claude's previous pin: the oldest of its tested range (`ProviderKind::tested_cli_range`).
const CLAUDE_PREVIOUS: &str = "2.1.267";
/// codex's previous pin, likewise.
const CODEX_PREVIOUS: &str = "0.169.0";
/// Where that image is kept between runs: built once (`image build --cli-version`), reused.
const PREVIOUS_REPO: &str = "caw-box-prev";
const LOCAL_BASE: &str = "caw-box-local/node:20-bookworm";
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The repository of the images under test (`make drift`: the newest CLIs').
fn e2e_image_repo() -> String {
    std::env::var("CAW_BOX_E2E_IMAGE_REPO").unwrap_or_else(|_| "caw-box".to_string())
}

impl Rig {
    fn cli_version_label(&self, image: &str) -> Option<String> {
        let inspect = self.rt.block_on(self.docker.inspect_image(image)).ok()?;
        inspect
            .config?
            .labels?
            .get("io.caw-box.cli-version")
            .cloned()
    }

    /// `image` tagged as `tag` too.
    fn tag_as(&self, image: &str, tag: &str) {
        let (repo, version) = tag.rsplit_once(':').unwrap();
        self.rt
            .block_on(self.docker.tag_image(
                image,
                Some(bollard::query_parameters::TagImageOptions {
                    repo: Some(repo.to_string()),
                    tag: Some(version.to_string()),
                }),
            ))
            .unwrap_or_else(|e| panic!("tag {image} as {tag}: {e}"));
    }
}

/// claude's previous-pin image: `caw-box-prev/claude-code:latest`, built when missing.
fn previous_claude_image(rig: &Rig) -> String {
    previous_image(rig, "claude", "claude-code", CLAUDE_PREVIOUS)
}

/// `provider`'s image at `version` as `caw-box-prev/<image>:latest`, built when missing.
fn previous_image(rig: &Rig, provider: &str, image: &str, version: &str) -> String {
    let image = format!("{PREVIOUS_REPO}/{image}:latest");
    if rig.cli_version_label(&image).as_deref() == Some(version) {
        return image;
    }
    let mut cmd = rig.caw();
    cmd.args([
        "image",
        "build",
        "--provider",
        provider,
        "--base",
        LOCAL_BASE,
    ])
    .args(["--cli-version", version, "-q"])
    .env("CAW_BOX_IMAGE_REPO", PREVIOUS_REPO);
    if std::path::Path::new(CA_BUNDLE).exists() {
        cmd.args(["--ca-cert", CA_BUNDLE]);
    }
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    image
}

/// The session's image: a tag of the test's own (`caw-box-compat-<run>/<image>:latest`) on
/// the previous pin's image, removed when dropped.
struct SessionImage<'a> {
    rig: &'a Rig,
    tag: String,
}

impl<'a> SessionImage<'a> {
    fn on(rig: &'a Rig, image: &str, previous: &str) -> Self {
        let tag = format!("caw-box-compat-{}/{image}:latest", rig.run_id);
        rig.tag_as(previous, &tag);
        SessionImage { rig, tag }
    }
}

impl Drop for SessionImage<'_> {
    fn drop(&mut self) {
        let remove = self
            .rig
            .docker
            .remove_image(&self.tag, None::<RemoveImageOptions>, None);
        let _ = self.rig.rt.block_on(remove);
    }
}

/// The `system/init` line of a turn: the CLI version that ran it.
fn claude_version_of_turn(rig: &Rig, id: &str, turn: &str) -> String {
    let raw = stdout_of(&rig.caw_run(&["logs", id, "--turn", turn, "--raw"]));
    raw.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["type"] == "system" && l["subtype"] == "init")
        .and_then(|l| l["claude_code_version"].as_str().map(String::from))
        .unwrap_or_else(|| panic!("no system/init line in turn {turn}: {raw}"))
}

/// The system prompt texts of the stub's last request carrying `marker`.
fn system_of(rig: &Rig, marker: &str) -> String {
    rig.stub_requests()
        .into_iter()
        .rfind(|r| r["method"] == "POST" && r["body"].to_string().contains(marker))
        .map(|r| r["body"]["system"].to_string())
        .unwrap_or_else(|| panic!("no request carried {marker}"))
}

/// A session begun on claude's previous pin (its image under the session's image tag), the
/// tag then moved to the pinned image, as `image build` does when the pin moves: the resume
/// runs the new CLI on the old one's state, recalls the first turn, and a resume's
/// `--system-prompt` takes effect there (the new CLI gets `--system-prompt-snapshot off`).
#[test]
fn claude_session_on_the_previous_pin_resumes_after_the_pin_moved() {
    let rig = Rig::new("compat-claude");
    let previous = previous_claude_image(&rig);
    let pinned = format!("{}/claude-code:latest", e2e_image_repo());
    let pinned_version = rig
        .cli_version_label(&pinned)
        .expect("the pinned image's label");
    assert_ne!(
        pinned_version, CLAUDE_PREVIOUS,
        "{pinned} is the previous pin"
    );
    let session_image = SessionImage::on(&rig, "claude-code", &previous);
    let tag = session_image.tag.clone();

    check("turn 1 on the previous pin");
    let image = ["--image", tag.as_str()];
    let first = [&image[..], &["--system-prompt", "You are COMPAT-SYS-3301."]].concat();
    let (code, out, stderr) = rig.json_turn(rig.run_cmd(CLAUDE, "REMEMBER:otter", &first));
    assert_eq!(code, 0, "turn 1 failed: {out}\n{stderr}");
    let id = out["session_id"].as_str().unwrap().to_string();
    assert_eq!(claude_version_of_turn(&rig, &id, "1"), CLAUDE_PREVIOUS);
    assert!(system_of(&rig, "REMEMBER:otter").contains("COMPAT-SYS-3301"));

    check("the pin moves");
    rig.tag_as(&pinned, &tag);

    check("resume on the new pin");
    let (code, out, stderr) = rig.json_turn(rig.resume_cmd(CLAUDE, &id, "RECALL", &[]));
    assert_eq!(code, 0, "resume failed: {out}\n{stderr}");
    assert_eq!(claude_version_of_turn(&rig, &id, "2"), pinned_version);
    assert!(
        out["result"].as_str().unwrap_or_default().contains("otter"),
        "the resume lost turn 1: {out}"
    );

    check("a resume's system prompt takes effect on the new pin");
    let over = ["--system-prompt", "You are COMPAT-OVER-7702."];
    let (code, out, stderr) = rig.json_turn(rig.resume_cmd(CLAUDE, &id, "compat-q3", &over));
    assert_eq!(code, 0, "override failed: {out}\n{stderr}");
    let system = system_of(&rig, "compat-q3");
    assert!(system.contains("COMPAT-OVER-7702"), "{system}");
    assert!(!system.contains("COMPAT-SYS-3301"), "{system}");
}

/// A codex session begun on codex's previous pin (0.169.0) resumes after the pin moved to
/// 0.171.0: the new CLI reads the old one's conversation (the stub answers from it) and the
/// turn runs on the new image.
#[test]
fn codex_session_on_the_previous_pin_resumes_after_the_pin_moved() {
    let rig = Rig::new("compat-codex");
    let previous = previous_image(&rig, "codex", "codex", CODEX_PREVIOUS);
    let pinned = format!("{}/codex:latest", e2e_image_repo());
    let pinned_version = rig
        .cli_version_label(&pinned)
        .expect("the pinned image's label");
    assert_ne!(
        pinned_version, CODEX_PREVIOUS,
        "{pinned} is the previous pin"
    );
    let session_image = SessionImage::on(&rig, "codex", &previous);
    let image = ["--image", session_image.tag.as_str()];

    check("turn 1 on the previous pin");
    let (code, out, stderr) = rig.json_turn(rig.run_cmd(CODEX, "REMEMBER:heron", &image));
    assert_eq!(code, 0, "turn 1 failed: {out}\n{stderr}");
    let id = out["session_id"].as_str().unwrap().to_string();

    check("the pin moves");
    rig.tag_as(&pinned, &session_image.tag);
    assert_eq!(
        rig.cli_version_label(&session_image.tag).as_deref(),
        Some(pinned_version.as_str())
    );

    check("resume on the new pin recalls turn 1");
    let (code, out, stderr) = rig.json_turn(rig.resume_cmd(CODEX, &id, "RECALL", &[]));
    assert_eq!(code, 0, "resume failed: {out}\n{stderr}");
    assert!(
        out["result"].as_str().unwrap_or_default().contains("heron"),
        "the resume lost turn 1: {out}"
    );
}
