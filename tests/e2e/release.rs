//! Releases (issue 16, part 5): an installed caw-box builds working images from the files it
//! carries (no source tree), and `image pull` + `--image-repo` run images from a registry.
//!
//! Neither test reaches beyond this machine. The install builds offline from the target
//! directory the suite already built. The image build runs every step of the embedded
//! Dockerfiles for real over a test base that already holds what `apt-get` and `npm` would
//! fetch (both are no-op shims there: a test may not reach Debian's mirror or npm). The
//! registry is a minimal OCI distribution server (the GET/HEAD endpoints `docker pull` uses)
//! that the test serves on loopback, from a `docker save` of an image here: no registry image
//! can be pulled on this machine.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bollard::query_parameters::{BuildImageOptions, RemoveImageOptions};
use futures_util::StreamExt;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::common::*;

/// Removes these image references (tags first; an image other tags still name is only
/// untagged) when the test ends, pass or fail.
struct ImageTags<'a> {
    rig: &'a Rig,
    tags: Vec<String>,
}

impl Drop for ImageTags<'_> {
    fn drop(&mut self) {
        for tag in self.tags.iter().rev() {
            let _ = self.rig.rt.block_on(self.rig.docker.remove_image(
                tag,
                Some(RemoveImageOptions {
                    force: false,
                    noprune: false,
                    ..Default::default()
                }),
                None,
            ));
        }
    }
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
}

/// Builds `dockerfile` (no other context) as `tag`, with the test's label.
fn build_test_image(rig: &Rig, tag: &str, dockerfile: &str) {
    let mut context = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(dockerfile.len() as u64);
    header.set_mode(0o644);
    context
        .append_data(&mut header, "Dockerfile", dockerfile.as_bytes())
        .unwrap();
    let context = context.into_inner().unwrap();
    rig.rt.block_on(async {
        let mut stream = rig.docker.build_image(
            BuildImageOptions {
                t: Some(tag.to_string()),
                labels: Some(HashMap::from([(
                    TEST_LABEL.to_string(),
                    rig.run_id.clone(),
                )])),
                rm: true,
                forcerm: true,
                ..Default::default()
            },
            None,
            Some(bollard::body_full(context.into())),
        );
        while let Some(item) = stream.next().await {
            let info = item.expect("build the test base");
            assert!(info.error_detail.is_none(), "{:?}", info.error_detail);
        }
    });
}

#[test]
fn an_installed_caw_box_builds_its_images_and_runs_a_turn() {
    let rig = Rig::new("release_install");
    let root = tempfile::tempdir().unwrap();

    check("cargo install --path . (offline, from the built target dir)");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut install = std::process::Command::new(cargo);
    // As a person's shell runs it: without what cargo sets for this test binary (its
    // package's name, version, manifest dir…). Build scripts rerun on a change of such a
    // variable (ring's reads CARGO_PKG_NAME): inherited, they compiled ring and the 10
    // crates above it again here, and again in the next stage's build.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if [
            "CARGO_PKG_",
            "CARGO_MANIFEST_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
        ]
        .iter()
        .any(|p| name.starts_with(p))
            || ["CARGO_PRIMARY_PACKAGE", "CARGO_TARGET_TMPDIR", "OUT_DIR"].contains(&&*name)
        {
            install.env_remove(&*name);
        }
    }
    let out = install
        .args(["install", "--path"])
        .arg(repo_root())
        .arg("--root")
        .arg(root.path())
        .args(["--debug", "--offline", "--locked", "--bin", "caw-box"])
        .env("CARGO_TARGET_DIR", target_dir())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let installed = root.path().join("bin/caw-box");
    assert!(installed.is_file());

    check("the installed binary builds the base and the codex image, away from the source");
    // Everything `apt-get install` and `npm install -g` would add is in caw-box/codex
    // already; the shims stand in for the two commands that would fetch it.
    let repo = format!("caw-box-inst-{}", rig.run_id);
    let test_base = format!("{repo}/test-base:latest");
    let tags = ImageTags {
        rig: &rig,
        tags: vec![
            test_base.clone(),
            format!("{repo}/base:latest"),
            format!("{repo}/codex:latest"),
        ],
    };
    build_test_image(
        &rig,
        &test_base,
        "FROM caw-box/codex:latest\nUSER root\n\
         RUN for c in apt-get npm; do printf '#!/bin/sh\\necho \"test shim: $c $*\"\\n' \
             > /usr/local/sbin/$c; chmod 0755 /usr/local/sbin/$c; done\n",
    );
    let elsewhere = tempfile::tempdir().unwrap();
    let mut build = rig.caw_env(&installed);
    build
        .args([
            "image",
            "build",
            "--provider",
            "codex",
            "--base",
            &test_base,
        ])
        .env("CAW_BOX_IMAGE_REPO", &repo)
        .current_dir(elsewhere.path());
    let out = run(build);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let err = stderr_of(&out);
    assert!(
        err.contains(&format!("built {repo}/base:latest"))
            && err.contains(&format!("built {repo}/codex:latest")),
        "{err}"
    );
    let inspect = |tag: &str| rig.rt.block_on(rig.docker.inspect_image(tag)).unwrap();
    let codex = inspect(&format!("{repo}/codex:latest"));
    let labels = codex.config.unwrap().labels.unwrap();
    assert_eq!(labels["io.caw-box.provider"], "codex");
    assert_eq!(
        labels[TEST_LABEL], rig.run_id,
        "the test's label, inherited"
    );
    // The entrypoint in the new image is the one in this checkout, byte for byte.
    let (code, entry, _) = rig.run_container(bollard::models::ContainerCreateBody {
        image: Some(format!("{repo}/codex:latest")),
        entrypoint: Some(vec!["cat".into(), "/usr/local/bin/caw-box-entry".into()]),
        network_disabled: Some(true),
        ..Default::default()
    });
    assert_eq!(code, 0);
    assert_eq!(
        entry,
        std::fs::read_to_string(repo_root().join("images/base/caw-box-entry")).unwrap()
    );

    check("the installed binary runs a turn on the image it built");
    let mut turn = rig.caw_env(&installed);
    turn.args(["run", "--provider", "codex", "--network", &rig.network])
        .args(["--endpoint", &rig.endpoint(), "--model", "gpt-5.5"])
        .args(["--env", &format!("OPENAI_API_KEY={TEST_KEY}")])
        .arg("REMEMBER:installed")
        .env("CAW_BOX_IMAGE_REPO", &repo);
    let (code, result, err) = rig.json_turn(turn);
    assert_eq!(code, 0, "{err}");
    assert_eq!(result["status"], "success");
    let id = result["session_id"].as_str().unwrap();
    let show = rig.caw_run(&["show", id, "--json"]);
    assert!(
        stdout_of(&show).contains(&format!("{repo}/codex:latest")),
        "{}",
        stdout_of(&show)
    );
    let mut resume = rig.caw_env(&installed);
    resume
        .args(["resume", id, "--env", &format!("OPENAI_API_KEY={TEST_KEY}")])
        .arg("RECALL");
    let (code, result, err) = rig.json_turn(resume);
    assert_eq!(code, 0, "{err}");
    assert!(result["result"].as_str().unwrap().contains("installed"));
    rig.cleanup(); // the session's volumes, before its image goes
    drop(tags);
}

/// One image of `docker save`, served as a registry serves it.
struct Served {
    manifest: Vec<u8>,
    manifest_digest: String,
    blobs: HashMap<String, PathBuf>,
}

/// Reads a `docker save` tar (the legacy layout of Docker 20.10: manifest.json, the config
/// file, uncompressed layer tars) into a schema 2 manifest whose blobs are those files, with
/// `label` added to the image's config: a new image to the daemon, so it fetches the config.
fn serve_saved(dir: &Path, label: (&str, &str)) -> Served {
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let entry = &manifest[0];
    let digest_of = |path: &Path| {
        let mut h = Sha256::new();
        let mut f = std::fs::File::open(path).unwrap();
        std::io::copy(&mut f, &mut h).unwrap();
        format!("sha256:{:x}", h.finalize())
    };
    let mut blobs = HashMap::new();
    let config = dir.join(entry["Config"].as_str().unwrap());
    let mut config_json: Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    config_json["config"]["Labels"][label.0] = json!(label.1);
    let config = dir.join("config-labelled.json");
    std::fs::write(&config, serde_json::to_vec(&config_json).unwrap()).unwrap();
    let config_digest = digest_of(&config);
    let config_size = std::fs::metadata(&config).unwrap().len();
    blobs.insert(config_digest.clone(), config);
    let mut layers = Vec::new();
    for layer in entry["Layers"].as_array().unwrap() {
        let path = dir.join(layer.as_str().unwrap());
        let digest = digest_of(&path);
        layers.push(json!({
            "mediaType": "application/vnd.docker.image.rootfs.diff.tar",
            "size": std::fs::metadata(&path).unwrap().len(),
            "digest": digest,
        }));
        blobs.insert(digest, path);
    }
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {
            "mediaType": "application/vnd.docker.container.image.v1+json",
            "size": config_size,
            "digest": config_digest,
        },
        "layers": layers,
    }))
    .unwrap();
    let manifest_digest = format!("sha256:{:x}", Sha256::digest(&manifest));
    Served {
        manifest,
        manifest_digest,
        blobs,
    }
}

/// Serves `image` under `name` (any tag) on 127.0.0.1 until the process ends: `GET /v2/`,
/// `GET|HEAD /v2/<name>/manifests/<ref>`, `GET|HEAD /v2/<name>/blobs/<digest>`; 404 else.
/// Returns the port and the log of requests.
fn start_registry(served: Served, name: String) -> (u16, Arc<std::sync::Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let served = Arc::new(served);
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log2 = log.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let served = served.clone();
            let name = name.clone();
            let log = log2.clone();
            std::thread::spawn(move || {
                let _ = serve_connection(conn, &served, &name, &log);
            });
        }
    });
    (port, log)
}

fn serve_connection(
    conn: TcpStream,
    served: &Served,
    name: &str,
    log: &std::sync::Mutex<Vec<String>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut conn = conn;
    loop {
        let mut request = String::new();
        if reader.read_line(&mut request)? == 0 {
            return Ok(());
        }
        let mut content_length = 0usize;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header)? == 0 {
                return Ok(());
            }
            if header.trim().is_empty() {
                break;
            }
            if let Some((k, v)) = header.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    content_length = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; content_length];
        reader.read_exact(&mut body)?;
        let mut parts = request.split_whitespace();
        let (method, path) = match (parts.next(), parts.next()) {
            (Some(m), Some(p)) => (m.to_string(), p.to_string()),
            // Not HTTP (the daemon's TLS attempt first): close.
            _ => return Ok(()),
        };
        log.lock().unwrap().push(format!("{method} {path}"));
        let prefix = format!("/v2/{name}/");
        let (status, content_type, digest, payload): (&str, &str, Option<&str>, Payload) =
            if path == "/v2/" {
                (
                    "200 OK",
                    "application/json",
                    None,
                    Payload::Bytes(b"{}".to_vec()),
                )
            } else if let Some(reference) = path
                .strip_prefix(&prefix)
                .and_then(|r| r.strip_prefix("manifests/"))
            {
                if reference.starts_with("sha256:") && reference != served.manifest_digest {
                    not_found()
                } else {
                    (
                        "200 OK",
                        "application/vnd.docker.distribution.manifest.v2+json",
                        Some(served.manifest_digest.as_str()),
                        Payload::Bytes(served.manifest.clone()),
                    )
                }
            } else if let Some(file) = path
                .strip_prefix(&prefix)
                .and_then(|r| r.strip_prefix("blobs/"))
                .and_then(|d| served.blobs.get_key_value(d))
            {
                (
                    "200 OK",
                    "application/octet-stream",
                    Some(file.0.as_str()),
                    Payload::File(file.1.clone()),
                )
            } else {
                not_found()
            };
        let len = match &payload {
            Payload::Bytes(b) => b.len() as u64,
            Payload::File(p) => std::fs::metadata(p)?.len(),
        };
        let mut head = format!(
            "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len}\r\nDocker-Distribution-API-Version: registry/2.0\r\n"
        );
        if let Some(d) = digest {
            head.push_str(&format!("Docker-Content-Digest: {d}\r\n"));
        }
        head.push_str("\r\n");
        conn.write_all(head.as_bytes())?;
        if method != "HEAD" {
            match payload {
                Payload::Bytes(b) => conn.write_all(&b)?,
                Payload::File(p) => {
                    std::io::copy(&mut std::fs::File::open(p)?, &mut conn)?;
                }
            }
        }
        conn.flush()?;
    }
}

fn pulled_labels(rig: &Rig, image: &str) -> HashMap<String, String> {
    rig.rt
        .block_on(rig.docker.inspect_image(image))
        .unwrap()
        .config
        .unwrap()
        .labels
        .unwrap()
}

enum Payload {
    Bytes(Vec<u8>),
    File(PathBuf),
}

fn not_found() -> (&'static str, &'static str, Option<&'static str>, Payload) {
    (
        "404 Not Found",
        "application/json",
        None,
        Payload::Bytes(br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"unknown"}]}"#.to_vec()),
    )
}

#[test]
fn image_pull_fetches_from_the_image_repo_and_run_uses_it() {
    let rig = Rig::new("release_pull");
    let provider = GEMINI; // the smallest provider image: the least to serve

    // The registry's content: a `docker save` of the image built here.
    let saved = tempfile::tempdir().unwrap();
    let image = format!("caw-box/{}:latest", "gemini");
    rig.rt.block_on(async {
        let mut tar_bytes = Vec::new();
        let mut stream = rig.docker.export_image(&image);
        while let Some(chunk) = stream.next().await {
            tar_bytes.extend_from_slice(&chunk.expect("docker save"));
        }
        tar::Archive::new(&tar_bytes[..])
            .unpack(saved.path())
            .unwrap();
    });
    let test_repo = format!("cbt/{}", rig.run_id);
    let (port, log) = start_registry(
        serve_saved(saved.path(), (TEST_LABEL, &rig.run_id)),
        format!("{test_repo}/gemini"),
    );
    let repo = format!("127.0.0.1:{port}/{test_repo}");
    let _tags = ImageTags {
        rig: &rig,
        tags: vec![format!("{repo}/gemini:latest"), format!("{repo}/gemini:v9")],
    };

    check("run with --image-repo names REPO/<image>:latest, missing before the pull");
    let (code, json, err) = rig.json_turn({
        let mut c = rig.run_cmd(provider, "hello", &[]);
        c.args(["--image-repo", &repo]);
        c
    });
    assert_eq!(code, 3, "{err}");
    assert!(
        json["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("{repo}/gemini:latest")),
        "{json:#}"
    );

    check("image pull --image-repo --tag: pulled from the loopback registry, tagged latest");
    let out = rig.caw_run(&[
        "image",
        "pull",
        "--image-repo",
        &repo,
        "--provider",
        "gemini",
        "--tag",
        "v9",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let requests = log.lock().unwrap().clone();
    // The tag resolved (HEAD), then the manifest and the config fetched by digest: the
    // served config differs from the local image's (a label), so it is new to the daemon. The
    // layers are fetched too the first time this daemon sees them; after that, it knows
    // their digests and keeps its own copies.
    assert!(
        requests.contains(&format!("HEAD /v2/{test_repo}/gemini/manifests/v9")),
        "{requests:?}"
    );
    assert!(
        requests
            .iter()
            .any(|r| r.starts_with(&format!("GET /v2/{test_repo}/gemini/blobs/sha256:"))),
        "no config fetched: {requests:?}"
    );
    let labels = pulled_labels(&rig, &format!("{repo}/gemini:v9"));
    assert_eq!(labels[TEST_LABEL], rig.run_id, "not the served image");
    let pulled = rig
        .rt
        .block_on(rig.docker.inspect_image(&format!("{repo}/gemini:latest")))
        .unwrap();
    assert!(pulled
        .repo_tags
        .unwrap()
        .contains(&format!("{repo}/gemini:v9")));

    check("run uses the pulled image (CAW_BOX_IMAGE_REPO), and the turn works");
    let mut cmd = rig.run_cmd(provider, "REMEMBER:pulled", &[]);
    cmd.env("CAW_BOX_IMAGE_REPO", &repo);
    let (code, result, err) = rig.json_turn(cmd);
    assert_eq!(code, 0, "{err}");
    let id = result["session_id"].as_str().unwrap();
    let show = rig.caw_run(&["show", id, "--json"]);
    assert!(
        stdout_of(&show).contains(&format!("{repo}/gemini:latest")),
        "{}",
        stdout_of(&show)
    );

    check("a repository that does not hold the image: exit 3 naming it");
    let out = rig.caw_run(&[
        "image",
        "pull",
        "--image-repo",
        &format!("127.0.0.1:{port}/cbt/nothing-here"),
        "--provider",
        "codex",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains("nothing-here/codex:latest"));
    rig.cleanup();
}
