//! The images: each CLI at its pinned version, as a non-root user, no CA left in the final
//! image; `doctor` names a missing image with its fix; a missing base fails the build with
//! exit 3; the daemon's API version is cached per host; builds leave no builder image behind.

use std::collections::HashMap;

use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{ListImagesOptions, RemoveImageOptions};

use crate::common::*;

const PINNED: [(&str, &str, &str); 4] = [
    ("claude-code", "claude", "2.1.332"),
    ("codex", "codex", "0.171.0"),
    ("opencode", "opencode", "1.18.33"),
    ("gemini", "gemini", "0.61.0"),
];

/// Runs `cmd` in `image` with no network; returns (exit code, stdout and stderr).
fn run_in(rig: &Rig, image: &str, cmd: &[&str]) -> (i64, String) {
    let (code, out, err) = rig.run_container(ContainerCreateBody {
        image: Some(image.to_string()),
        cmd: Some(cmd.iter().map(|s| s.to_string()).collect()),
        host_config: Some(HostConfig {
            network_mode: Some("none".into()),
            ..Default::default()
        }),
        ..Default::default()
    });
    (code, out + &err)
}

#[test]
fn each_image_has_its_pinned_cli_as_a_non_root_user() {
    let rig = Rig::new("images");
    for (image, cli, version) in PINNED {
        let tag = format!("caw-box/{image}:latest");
        let inspect = rig.rt.block_on(rig.docker.inspect_image(&tag)).unwrap();
        let labels = inspect.config.unwrap().labels.unwrap();
        assert_eq!(
            labels.get("io.caw-box.cli-version").map(String::as_str),
            Some(version),
            "{tag}"
        );
        assert!(labels.contains_key("io.caw-box.provider"), "{tag}");
        let (code, out) = run_in(&rig, &tag, &[cli, "--version"]);
        assert_eq!(code, 0, "{tag}: {out}");
        assert!(out.contains(version), "{tag} --version said: {out}");
        let (code, out) = run_in(&rig, &tag, &["id", "-u"]);
        assert_eq!((code, out.trim()), (0, "1000"), "{tag}");
        // The build's extra CA stays in the install stage.
        let (code, out) = run_in(
            &rig,
            &tag,
            &["bash", "-c", "ls /tmp; env | grep -c CA_CERTS || true"],
        );
        assert_eq!(code, 0);
        assert!(!out.contains("extra-ca.pem"), "{tag}: {out}");
        assert_eq!(out.lines().last().map(str::trim), Some("0"), "{tag}: {out}");
    }
}

#[test]
fn image_ls_lists_provider_version_size_and_age() {
    let rig = Rig::new("image-ls");
    let mut cmd = rig.caw();
    cmd.args(["image", "ls"]);
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let stdout = stdout_of(&out);
    let header = stdout.lines().next().unwrap_or_default();
    for column in ["IMAGE", "PROVIDER", "CLI VERSION", "SIZE", "CREATED"] {
        assert!(header.contains(column), "{stdout}");
    }
    for ((image, _, version), provider) in
        PINNED
            .iter()
            .zip(["claude_code", "codex", "opencode", "gemini"])
    {
        let row = stdout
            .lines()
            .find(|l| l.starts_with(&format!("caw-box/{image}:latest ")))
            .unwrap_or_else(|| panic!("no row for {image}: {stdout}"));
        let cells: Vec<&str> = row
            .split("   ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        assert_eq!(cells[1], provider, "{row}");
        assert_eq!(cells[2], *version, "{row}");
        assert!(cells[3].ends_with(" MB"), "{row}");
        assert!(cells[4].ends_with(" ago"), "{row}");
    }
}

#[test]
fn doctor_names_a_missing_image_and_its_fix() {
    let rig = Rig::new("doctor");
    let mut cmd = rig.caw();
    cmd.arg("doctor")
        .env("CAW_BOX_IMAGE_REPO", "caw-box-test-missing");
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(3), "{}", stderr_of(&out));
    let stdout = stdout_of(&out);
    assert!(
        stdout.contains("✓ docker: ") && stdout.contains(", daemon "),
        "{stdout}"
    );
    // The daemon's runtimes: the rig registers gVisor's runsc (`--runtime runsc`).
    assert!(
        stdout.lines().any(|l| l.starts_with("✓ runtimes: ")
            && l.contains("runsc")
            && l.ends_with("gVisor: --runtime runsc")),
        "{stdout}"
    );
    for p in ["claude_code", "codex", "opencode", "gemini"] {
        assert!(
            stdout.contains(&format!("fix: caw-box image build --provider {p}")),
            "{stdout}"
        );
    }
    assert!(
        stderr_of(&out).contains("4 problems found"),
        "{}",
        stderr_of(&out)
    );

    // With the real images present, doctor is happy.
    let mut cmd = rig.caw();
    cmd.arg("doctor");
    let out = run(cmd);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout_of(&out),
        stderr_of(&out)
    );
}

#[test]
fn image_build_with_a_missing_base_exits_3() {
    let rig = Rig::new("nobase");
    let mut cmd = rig.caw();
    // A registry on loopback that refuses at once: no traffic leaves this machine.
    cmd.args([
        "image",
        "build",
        "--provider",
        "codex",
        "--base",
        "localhost:1/caw-box-missing:latest",
    ])
    .env("CAW_BOX_IMAGE_REPO", "caw-box-test-nobase");
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(3), "{}", stderr_of(&out));
    let stderr = stderr_of(&out);
    assert!(
        stderr.contains("building caw-box-test-nobase/base:latest failed"),
        "{stderr}"
    );
    assert!(stderr.contains("--base"), "{stderr}");
}

/// caw-box keeps the daemon's API version (negotiating costs the daemon a `runc --version`
/// per command): per DOCKER_HOST, for a day, and renegotiates when the entry is damaged or old.
#[test]
fn the_daemons_api_version_is_cached_per_host() {
    let rig = Rig::new("apiversion");
    let host =
        std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".into());
    let version = rig.rt.block_on(rig.docker.version()).unwrap();
    let api = version.api_version.unwrap();
    // The entry also names the engine (turns ask whether it is Podman's).
    let engine = if version
        .components
        .unwrap_or_default()
        .iter()
        .any(|c| c.name.starts_with("Podman"))
    {
        "podman"
    } else {
        "docker"
    };
    let cache = rig.data_dir.path().join("docker-api-version");
    let ls = || {
        let mut cmd = rig.caw();
        cmd.args(["ls", "--json"]);
        let out = run(cmd);
        assert!(out.status.success(), "{}", stderr_of(&out));
    };
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    // This host's entry: (version, saved at), once its engine is checked.
    let entry = || -> (String, u64) {
        let file = std::fs::read_to_string(&cache).unwrap();
        let line = file
            .lines()
            .find(|l| l.starts_with(&format!("{host} ")))
            .unwrap_or_else(|| panic!("no entry for {host}: {file}"));
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields.get(3), Some(&engine), "{line}");
        (fields[1].to_string(), fields[2].parse().unwrap())
    };

    // Another daemon's entry stays; a damaged entry for this one is replaced.
    let other = format!("unix:///other/docker.sock 1.30 {} podman", now());
    std::fs::write(&cache, format!("{other}\n{host} one.two 5\n")).unwrap();
    let before = now();
    ls();
    let (version, saved_at) = entry();
    assert_eq!(version, api);
    assert!(saved_at >= before);
    assert!(std::fs::read_to_string(&cache).unwrap().starts_with(&other));

    // A fresh entry is used as it is (even a made-up version: nothing asks the daemon);
    // a day-old one is asked again.
    let an_hour_ago = now() - 3600;
    std::fs::write(&cache, format!("{host} 1.24 {an_hour_ago} {engine}\n")).unwrap();
    ls();
    assert_eq!(entry(), ("1.24".to_string(), an_hour_ago));
    std::fs::write(
        &cache,
        format!("{host} 1.24 {} {engine}\n", now() - 2 * 24 * 3600),
    )
    .unwrap();
    ls();
    assert_eq!(entry().0, api);
    // An older caw-box's entry, without the engine, is asked again too.
    std::fs::write(&cache, format!("{host} 1.24 {an_hour_ago}\n")).unwrap();
    ls();
    assert_eq!(entry().0, api);
}

/// The local base that scripts/images.sh builds (no registry on these machines).
const LOCAL_BASE: &str = "caw-box-local/node:20-bookworm";
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Removes the images a test built under its own repository, also when the test fails.
struct TestImages<'a> {
    rig: &'a Rig,
    tags: Vec<String>,
}

impl Drop for TestImages<'_> {
    fn drop(&mut self) {
        for tag in &self.tags {
            // Untags an image shared with another tag, removes one of the test's own.
            let _ = self.rig.rt.block_on(self.rig.docker.remove_image(
                tag,
                None::<RemoveImageOptions>,
                None,
            ));
        }
    }
}

impl Rig {
    /// Ids of every builder-stage image (intermediate ones included) that exists now.
    fn install_stage_images(&self) -> Vec<String> {
        let images = self
            .rt
            .block_on(self.docker.list_images(Some(ListImagesOptions {
                all: true,
                filters: Some(HashMap::from([(
                    "label".to_string(),
                    vec!["io.caw-box.stage=install".to_string()],
                )])),
                ..Default::default()
            })))
            .unwrap();
        images.into_iter().map(|i| i.id).collect()
    }

    fn image_id(&self, tag: &str) -> Option<String> {
        self.rt
            .block_on(self.docker.inspect_image(tag))
            .ok()
            .and_then(|i| i.id)
    }
}

/// `image build` leaves no builder-stage image behind (after a build, a rebuild, a failed
/// build), removes the image a rebuild replaced, skips an image whose inputs did not change,
/// and the rebuilt image works. (claude: the quickest npm install of the four.)
#[test]
fn image_builds_leave_no_builder_images_and_skip_what_is_up_to_date() {
    let rig = Rig::new("rebuild");
    let repo = format!("caw-box-test-{}", rig.run_id);
    let tag = format!("{repo}/claude-code:latest");
    let _images = TestImages {
        rig: &rig,
        tags: vec![tag.clone(), format!("{repo}/base:latest")],
    };
    // Builder images of other builds running now on this daemon are not this test's.
    let before = rig.install_stage_images();
    let leftovers = || -> Vec<String> {
        let mut now = rig.install_stage_images();
        now.retain(|i| !before.contains(i));
        now
    };
    let build = |ca: &std::path::Path, extra: &[&str]| {
        let mut cmd = rig.caw();
        cmd.args([
            "image",
            "build",
            "--provider",
            "claude",
            "--base",
            LOCAL_BASE,
        ])
        .arg("--ca-cert")
        .arg(ca)
        .args(extra)
        .env("CAW_BOX_IMAGE_REPO", &repo);
        run(cmd)
    };
    // The host's CA bundle (npm needs it here), with a line of this test's own: so the image
    // is the test's own too (an input differs), not one shared with other tags.
    let ca_file = |name: &str| {
        let mut pem = std::fs::read(CA_BUNDLE).expect("the host's CA bundle");
        pem.extend_from_slice(format!("\n# {name} {}\n", rig.run_id).as_bytes());
        let path = rig.data_dir.path().join(name);
        std::fs::write(&path, pem).unwrap();
        path
    };
    let ca = &ca_file("ca.pem");
    let out = build(ca, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains(&format!("built {tag}")));
    let first = rig.image_id(&tag).expect("built");
    assert_eq!(leftovers(), Vec::<String>::new(), "after the first build");

    // Nothing changed: not rebuilt.
    let out = build(ca, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains(&format!("{tag} is up to date (CLI {})", PINNED[0].2)),
        "{}",
        stderr_of(&out)
    );
    assert_eq!(rig.image_id(&tag).as_deref(), Some(first.as_str()));

    // Another CA is another input: rebuilt, and the replaced image is gone with it.
    let other_ca = ca_file("other-ca.pem");
    let out = build(&other_ca, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let second = rig.image_id(&tag).expect("rebuilt");
    assert_ne!(second, first);
    assert_eq!(rig.image_id(&first), None, "the replaced image was left");
    assert_eq!(leftovers(), Vec::<String>::new(), "after the rebuild");
    let (code, out) = run_in(&rig, &tag, &["claude", "--version"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(PINNED[0].2), "{out}");

    // A failed build (no such version on npm) leaves nothing, and the image as it was.
    let out = build(
        &other_ca,
        &["--cli-version", "0.0.0-caw-box-no-such-version"],
    );
    assert_eq!(out.status.code(), Some(3), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains(&format!("building {tag} failed")),
        "{}",
        stderr_of(&out)
    );
    assert_eq!(leftovers(), Vec::<String>::new(), "after the failed build");
    assert_eq!(rig.image_id(&tag).as_deref(), Some(second.as_str()));
}
