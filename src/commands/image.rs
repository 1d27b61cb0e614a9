//! `caw-box image build` and `caw-box image ls`.
//!
//! The Dockerfiles are compiled into the binary, so an installed caw-box builds its images
//! without the source tree. The build context is a tar made in memory; an extra CA is put in
//! the provider contexts for the install stage only (the final stage never copies it).

use std::collections::HashMap;
use std::time::Duration;

use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::backend::images::{BuildEvent, BuildSpec, ImageStore};
use crate::cli::{ImageBuildArgs, ImagePullArgs};
use crate::error::{Error, ErrorKind, Result};
use crate::output;
use crate::provider::ProviderKind;
use crate::session::record::labels;

const BASE_DOCKERFILE: &str = include_str!("../../images/base/Dockerfile");
const ENTRYPOINT: &str = include_str!("../../images/base/caw-box-entry");
const PROXY: &str = include_str!("../../images/base/caw-box-proxy.js");

fn base_tag() -> String {
    format!("{}/base:latest", crate::provider::image_repo())
}

fn provider_dockerfile(p: ProviderKind) -> &'static str {
    match p {
        ProviderKind::ClaudeCode => include_str!("../../images/claude-code/Dockerfile"),
        ProviderKind::Codex => include_str!("../../images/codex/Dockerfile"),
        ProviderKind::Opencode => include_str!("../../images/opencode/Dockerfile"),
        ProviderKind::Gemini => include_str!("../../images/gemini/Dockerfile"),
    }
}

/// One image to build: its context files, build args and tag.
struct BuildJob {
    tag: String,
    /// The image its (first) FROM names.
    from: String,
    files: Vec<(&'static str, Vec<u8>, u32)>,
    args: HashMap<String, String>,
    labels: HashMap<String, String>,
}

fn context_tar(files: &[(&'static str, Vec<u8>, u32)]) -> Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, contents, mode) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(contents.len() as u64);
        h.set_mode(*mode);
        h.set_mtime(0);
        b.append_data(&mut h, path, &contents[..])
            .map_err(|e| Error::environment(format!("failed to build the build context: {e}")))?;
    }
    b.into_inner()
        .map_err(|e| Error::environment(format!("failed to build the build context: {e}")))
}

/// `--cli-version`: one provider's, a version's shape; one line of warning when it lies
/// outside the versions caw-box is tested with.
fn check_cli_version(version: Option<&str>, providers: &[ProviderKind]) -> Result<()> {
    let Some(v) = version else {
        return Ok(());
    };
    let [p] = providers else {
        return Err(Error::usage(
            "--cli-version applies to one provider; build them one at a time",
        ));
    };
    if v.is_empty()
        || !v
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-+".contains(c))
    {
        return Err(Error::usage(format!(
            "--cli-version '{v}' is not a version"
        )));
    }
    if let Some(warning) = untested_warning(*p, v) {
        output::eprintln(&warning);
    }
    Ok(())
}

/// The warning for a CLI version outside `p`'s tested range, if it is.
fn untested_warning(p: ProviderKind, version: &str) -> Option<String> {
    let (oldest, newest) = p.tested_cli_range();
    p.untested_cli_version(version).then(|| {
        format!(
            "warning: {p} {version} is outside the versions caw-box is tested with ({oldest} to {newest}, docs/compatibility.md): its features may differ from the docs"
        )
    })
}

pub async fn build(args: ImageBuildArgs, verbose: bool, quiet: bool) -> Result<i32> {
    let settings = crate::client::backend_settings()?;
    ImageStore::refuse_elsewhere(&settings, "build")?;
    let providers = chosen_providers(&args.provider, args.all, "build")?;
    check_cli_version(args.cli_version.as_deref(), &providers)?;
    let ca = match &args.ca_cert {
        Some(path) => read_ca_cert(path)?,
        None => Vec::new(),
    };
    let backend = ImageStore::connect(&settings).await?;

    let mut jobs = vec![BuildJob {
        tag: base_tag(),
        from: args.base.clone(),
        files: vec![
            ("Dockerfile", BASE_DOCKERFILE.as_bytes().to_vec(), 0o644),
            ("caw-box-entry", ENTRYPOINT.as_bytes().to_vec(), 0o755),
            ("caw-box-proxy.js", PROXY.as_bytes().to_vec(), 0o644),
        ],
        args: HashMap::from([("BASE".to_string(), args.base.clone())]),
        labels: HashMap::from([(labels::MANAGED.to_string(), "true".to_string())]),
    }];
    for p in &providers {
        let version = args
            .cli_version
            .clone()
            .unwrap_or_else(|| p.default_cli_version().to_string());
        jobs.push(BuildJob {
            tag: p.default_image(),
            from: base_tag(),
            files: vec![
                (
                    "Dockerfile",
                    provider_dockerfile(*p).as_bytes().to_vec(),
                    0o644,
                ),
                ("extra-ca.pem", ca.clone(), 0o644),
            ],
            args: HashMap::from([
                ("BASE_IMAGE".to_string(), base_tag()),
                ("CLI_VERSION".to_string(), version.clone()),
            ]),
            labels: HashMap::from([
                (labels::MANAGED.to_string(), "true".to_string()),
                (labels::PROVIDER.to_string(), p.to_string()),
                (labels::CLI_VERSION.to_string(), version),
            ]),
        });
    }
    let mut interrupts = Interrupts::install()?;
    for job in jobs {
        build_one(&backend, job, &args, verbose, quiet, &mut interrupts).await?;
    }
    Ok(0)
}

/// Ctrl-C, SIGTERM and SIGHUP during a build: caught, so the builder images are removed.
struct Interrupts {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Interrupts {
    fn install() -> Result<Self> {
        let err = |e| Error::environment(format!("failed to install signal handlers: {e}"));
        Ok(Interrupts {
            int: signal(SignalKind::interrupt()).map_err(err)?,
            term: signal(SignalKind::terminate()).map_err(err)?,
            hup: signal(SignalKind::hangup()).map_err(err)?,
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {},
            _ = self.term.recv() => {},
            _ = self.hup.recv() => {},
        }
    }
}

/// A hash of everything an image is built from: the context files (Dockerfile, entrypoint,
/// CA), the build args with the FROM image's name replaced by its id, and the labels.
/// `None` when the FROM image is not here (it would be pulled): such a build always runs.
fn inputs_hash(job: &BuildJob, from_id: Option<&str>) -> Option<String> {
    let from_id = from_id?;
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(b"caw-box image inputs v1");
    field(from_id.as_bytes());
    let mut files: Vec<_> = job.files.iter().collect();
    files.sort_by_key(|f| f.0);
    for (path, contents, mode) in files {
        field(path.as_bytes());
        field(&mode.to_le_bytes());
        field(contents);
    }
    for map in [&job.args, &job.labels] {
        let mut pairs: Vec<_> = map.iter().filter(|(_, v)| **v != job.from).collect();
        pairs.sort();
        for (k, v) in pairs {
            field(k.as_bytes());
            field(v.as_bytes());
        }
    }
    Some(format!("{:x}", h.finalize()))
}

/// What a build's stream of events came to.
struct BuildRun {
    log: String,
    failure: Option<String>,
    interrupted: bool,
}

/// Follows a build to its end or a Ctrl-C, its `Step` lines on the spinner.
async fn stream_build(
    backend: &ImageStore,
    spec: BuildSpec,
    progress: &output::Spinner,
    verbose: bool,
    interrupts: &mut Interrupts,
) -> BuildRun {
    let mut log = String::new();
    let mut failure: Option<String> = None;
    let mut interrupted = false;
    let mut stream = backend.build_image(spec);
    loop {
        let event = tokio::select! {
            event = stream.next() => event,
            _ = interrupts.recv() => {
                interrupted = true;
                break;
            }
        };
        match event {
            None => break,
            Some(BuildEvent::Log(text)) => {
                log.push_str(&text);
                if verbose {
                    output::write_stderr(&text);
                }
                if let Some(step) = text.lines().find(|l| l.starts_with("Step ")) {
                    progress.set_message(step.to_string());
                }
            }
            Some(BuildEvent::Failed(err)) => failure = Some(err),
        }
    }
    // Dropping the stream closes the connection: the daemon cancels the build.
    BuildRun {
        log,
        failure,
        interrupted,
    }
}

async fn failure_hint(backend: &ImageStore, tag: &str, base: &str) -> String {
    if tag == base_tag() && backend.inspect_image(base).await.ok().flatten().is_none() {
        format!(
            "the base image '{base}' is not present and could not be pulled: pass --base with a local image that has node >= 20"
        )
    } else {
        "run again with -v for the full build log".to_string()
    }
}

async fn build_one(
    backend: &ImageStore,
    mut job: BuildJob,
    args: &ImageBuildArgs,
    verbose: bool,
    quiet: bool,
    interrupts: &mut Interrupts,
) -> Result<()> {
    let from_id = backend.inspect_image(&job.from).await?.map(|i| i.id);
    let inputs = inputs_hash(&job, from_id.as_deref());
    let current = backend.inspect_image(&job.tag).await?;
    let current_labels = current
        .as_ref()
        .map(|i| i.labels.clone())
        .unwrap_or_default();
    let up_to_date = inputs.is_some() && current_labels.get(labels::INPUTS) == inputs.as_ref();
    if up_to_date && !args.force && !args.no_cache {
        if !quiet {
            let version = current_labels
                .get(labels::CLI_VERSION)
                .map(|v| format!(" (CLI {v})"))
                .unwrap_or_default();
            output::eprintln(&format!(
                "{} is up to date{version}; --force rebuilds it",
                job.tag
            ));
        }
        return Ok(());
    }
    if let Some(inputs) = inputs {
        job.labels.insert(labels::INPUTS.to_string(), inputs);
    }
    // Marks this build's builder-stage images (see the provider Dockerfiles); not an input.
    let build_id = uuid::Uuid::new_v4().simple().to_string();
    if job.files[0].1.windows(12).any(|w| w == b"ARG BUILD_ID") {
        job.args.insert("BUILD_ID".to_string(), build_id.clone());
    }

    let tar = context_tar(&job.files)?;
    let progress = output::Spinner::new(format!("building {}", job.tag), !(quiet || verbose));
    let started = std::time::Instant::now();
    let spec = BuildSpec {
        tag: job.tag.clone(),
        context_tar: tar,
        args: job.args.clone(),
        labels: job.labels.clone(),
        no_cache: args.no_cache,
    };
    let BuildRun {
        log,
        failure,
        interrupted,
    } = stream_build(backend, spec, &progress, verbose, interrupts).await;
    progress.finish();
    // Success, failure or Ctrl-C: this build's builder-stage images go.
    remove_builder_images(backend, &build_id, interrupted).await;
    if interrupted {
        return Err(Error::new(
            ErrorKind::Interrupted,
            format!("building {} was interrupted", job.tag),
        ));
    }
    if let Some(err) = failure {
        let last_lines: Vec<&str> = log.lines().rev().take(3).collect();
        tracing::debug!("build log tail: {:?}", last_lines);
        let hint = failure_hint(backend, &job.tag, &args.base).await;
        return Err(
            Error::environment(format!("building {} failed: {err}", job.tag)).with_hint(hint),
        );
    }
    // The image the tag named before is caw-box's own leftover now, unless something still
    // uses it (a container, another tag, a child image): Docker then keeps it.
    if let Some(previous) = current.map(|i| i.id).filter(|id| !id.is_empty()) {
        if let Some(old) = backend.inspect_image(&previous).await? {
            if old.tags.is_empty() {
                backend.remove_image(&previous).await?;
            }
        }
    }
    if !quiet {
        output::eprintln(&format!(
            "built {} in {:.1}s",
            job.tag,
            started.elapsed().as_secs_f64()
        ));
    }
    Ok(())
}

/// Removes the builder-stage images that build `build_id` made. After an interruption the
/// daemon is still tearing the build down (its step container holds the last image), so
/// this waits a little for that container to go.
async fn remove_builder_images(backend: &ImageStore, build_id: &str, interrupted: bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut clean_rounds = 0;
    loop {
        let mut left = 0;
        match backend.labelled(labels::BUILD_ID, build_id).await {
            Ok(images) => {
                for img in images {
                    match backend.remove_image(&img.id).await {
                        Ok(true) => {}
                        Ok(false) => left += 1,
                        Err(e) => tracing::warn!("{e}"),
                    }
                }
            }
            Err(e) => tracing::warn!("{e}"),
        }
        if !interrupted {
            if left > 0 {
                tracing::warn!("{left} builder image(s) of this build are in use; `caw-box image prune` removes them later");
            }
            return;
        }
        let busy = backend
            .containers_labelled(labels::BUILD_ID, build_id)
            .await
            .unwrap_or(0);
        // Twice clean in a row: the daemon has seen the cancellation by then.
        clean_rounds = if left == 0 && busy == 0 {
            clean_rounds + 1
        } else {
            0
        };
        if clean_rounds == 2 || std::time::Instant::now() > deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `image pull`: `REPO/<image>:TAG` of each provider from the image repository (the images
/// workflow publishes them), tagged `REPO/<image>:latest` here, which `run` uses.
pub async fn pull(args: ImagePullArgs, quiet: bool) -> Result<i32> {
    let settings = crate::client::backend_settings()?;
    ImageStore::refuse_elsewhere(&settings, "pull")?;
    let providers = chosen_providers(&args.provider, args.all, "pull")?;
    let repo = crate::provider::image_repo();
    if repo == crate::provider::DEFAULT_IMAGE_REPO {
        return Err(Error::usage(
            "say which repository to pull from: --image-repo REPO (or CAW_BOX_IMAGE_REPO, or image_repo in a config file), e.g. ghcr.io/OWNER/caw-box",
        )
        .with_hint(format!(
            "'{repo}' is the repository of local builds: `caw-box image build` makes its images"
        )));
    }
    crate::settings::validate_image_repo(&repo, "--image-repo")?;
    if args.tag.is_empty()
        || !args
            .tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
    {
        return Err(Error::usage(format!("--tag '{}' is not a tag", args.tag)));
    }
    let backend = ImageStore::connect(&settings).await?;
    for p in providers {
        let image = format!("{repo}/{}:{}", p.image_name(), args.tag);
        let progress = output::Spinner::new(format!("pulling {image}"), !quiet);
        let started = std::time::Instant::now();
        let pulled = backend.pull_image(&image).await;
        progress.finish();
        let status = pulled.map_err(|e| {
            e.with_hint(format!(
                "is {repo} reachable and does it hold {}? `caw-box image build --provider {p}` builds the image here instead",
                p.image_name()
            ))
        })?;
        let info = backend
            .inspect_image(&image)
            .await?
            .ok_or_else(|| Error::environment(format!("'{image}' is not here after pulling it")))?;
        if info.labels.get(labels::PROVIDER).map(String::as_str) != Some(p.as_str()) {
            return Err(Error::environment(format!(
                "'{image}' is not a caw-box {p} image (its label {} is not '{p}')",
                labels::PROVIDER
            )));
        }
        let latest = p.default_image();
        if image != latest {
            backend.tag_image(&info.id, &latest).await?;
        }
        if !quiet {
            let version = info
                .labels
                .get(labels::CLI_VERSION)
                .map(|v| format!(", CLI {v}"))
                .unwrap_or_default();
            output::eprintln(&format!(
                "{image}: {status} ({:.1}s{version})",
                started.elapsed().as_secs_f64()
            ));
        }
    }
    Ok(0)
}

/// The providers `--provider P...` or `--all` name; `what` is the verb for the error.
fn chosen_providers(given: &[String], all: bool, what: &str) -> Result<Vec<ProviderKind>> {
    if all {
        Ok(ProviderKind::ALL.to_vec())
    } else if given.is_empty() {
        Err(Error::usage(format!(
            "say which images to {what}: --provider P (repeatable) or --all"
        )))
    } else {
        Ok(given
            .iter()
            .map(|p| p.parse())
            .collect::<std::result::Result<_, _>>()?)
    }
}

pub async fn ls() -> Result<i32> {
    let settings = crate::client::backend_settings()?;
    ImageStore::refuse_elsewhere(&settings, "ls")?;
    let backend = ImageStore::connect(&settings).await?;
    let images = backend.managed().await?;
    let mut rows = vec![[
        "IMAGE".to_string(),
        "PROVIDER".to_string(),
        "CLI VERSION".to_string(),
        "SIZE".to_string(),
        "CREATED".to_string(),
    ]];
    let now = crate::clock::now_secs() as i64;
    let mut untagged = 0;
    for img in images {
        // A row per tag, as `docker image ls`: an image tagged twice (a `make drift` build
        // at the pinned version has the pinned image's id) shows under both names.
        let mut tags: Vec<String> = img
            .tags
            .iter()
            .filter(|t| !t.starts_with("<none>"))
            .cloned()
            .collect();
        if tags.is_empty() {
            untagged += 1;
            tags.push(format!("<none> ({})", short_id(&img.id)));
        }
        let label = |k: &str| img.labels.get(k).cloned().unwrap_or_else(|| "-".into());
        let age = Duration::from_secs((now - img.created).max(0) as u64);
        for tag in tags {
            rows.push([
                tag,
                label(labels::PROVIDER),
                label(labels::CLI_VERSION),
                format!("{:.0} MB", img.size_bytes as f64 / 1e6),
                format!("{} ago", humantime::format_duration(round_age(age))),
            ]);
        }
    }
    rows[1..].sort();
    output::print_table(&rows);
    if untagged > 0 {
        output::eprintln(&format!(
            "{untagged} untagged image{} left by earlier builds; `caw-box image prune` removes {}",
            if untagged == 1 { "" } else { "s" },
            if untagged == 1 { "it" } else { "them" }
        ));
    }
    Ok(0)
}

fn short_id(id: &str) -> &str {
    let id = id.strip_prefix("sha256:").unwrap_or(id);
    &id[..id.len().min(12)]
}

pub async fn prune(quiet: bool) -> Result<i32> {
    let settings = crate::client::backend_settings()?;
    ImageStore::refuse_elsewhere(&settings, "prune")?;
    let backend = ImageStore::connect(&settings).await?;
    let (mut removed, mut kept) = (0, 0);
    for img in backend.leftovers().await? {
        if backend.remove_image(&img.id).await? {
            removed += 1;
        } else {
            kept += 1;
        }
    }
    if !quiet {
        output::eprintln(&format!(
            "removed {removed} untagged caw-box image{}{}",
            if removed == 1 { "" } else { "s" },
            if kept > 0 {
                format!("; {kept} kept: in use by a container or another image")
            } else {
                String::new()
            }
        ));
    }
    Ok(0)
}

fn round_age(d: Duration) -> Duration {
    let s = d.as_secs();
    Duration::from_secs(match s {
        0..=59 => s,
        60..=3599 => s / 60 * 60,
        3600..=86399 => s / 3600 * 3600,
        _ => s / 86400 * 86400,
    })
}

/// The PEM of a `--ca-cert FILE` (an image build's, a login's): a usage error when it cannot
/// be read or holds no certificate.
pub(crate) fn read_ca_cert(path: &std::path::Path) -> Result<Vec<u8>> {
    let pem = std::fs::read(path)
        .map_err(|e| Error::usage(format!("cannot read --ca-cert '{}': {e}", path.display())))?;
    if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
        return Err(Error::usage(format!(
            "--ca-cert '{}' holds no PEM certificate",
            path.display()
        )));
    }
    Ok(pem)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(ca: &[u8], version: &str) -> BuildJob {
        BuildJob {
            tag: "caw-box/codex:latest".into(),
            from: "caw-box/base:latest".into(),
            files: vec![
                ("Dockerfile", b"FROM x".to_vec(), 0o644),
                ("extra-ca.pem", ca.to_vec(), 0o644),
            ],
            args: HashMap::from([
                ("BASE_IMAGE".to_string(), "caw-box/base:latest".to_string()),
                ("CLI_VERSION".to_string(), version.to_string()),
            ]),
            labels: HashMap::from([(labels::CLI_VERSION.to_string(), version.to_string())]),
        }
    }

    /// The version caw-box builds with (and `--version` names) is the one each Dockerfile
    /// defaults to, so a plain `docker build` of images/ (the images workflow) pins the same.
    #[test]
    fn a_cli_version_outside_the_tested_range_warns_in_one_line() {
        let claude = ProviderKind::ClaudeCode;
        assert_eq!(untested_warning(claude, "2.1.332"), None);
        assert_eq!(untested_warning(claude, "2.1.300"), None);
        assert_eq!(untested_warning(claude, "2.1.267"), None);
        let warning = untested_warning(claude, "2.1.400").unwrap();
        assert_eq!(
            warning,
            "warning: claude_code 2.1.400 is outside the versions caw-box is tested with (2.1.267 to 2.1.332, docs/compatibility.md): its features may differ from the docs"
        );
        assert!(untested_warning(claude, "2.1.100").is_some());
        assert!(untested_warning(claude, "latest").is_some());
        assert!(untested_warning(ProviderKind::Codex, "0.172.0").is_some());
        assert!(check_cli_version(Some("2.1.400"), &[claude]).is_ok());
        assert!(check_cli_version(Some("1.0"), &ProviderKind::ALL).is_err());
        assert!(check_cli_version(Some("1 0"), &[claude]).is_err());
    }

    #[test]
    fn each_dockerfile_defaults_to_the_pinned_cli_version() {
        for p in ProviderKind::ALL {
            let pin = format!("ARG CLI_VERSION={}", p.default_cli_version());
            let args: Vec<&str> = provider_dockerfile(p)
                .lines()
                .filter(|l| l.starts_with("ARG CLI_VERSION"))
                .collect();
            assert!(!args.is_empty(), "{p}: no ARG CLI_VERSION");
            for line in args {
                assert_eq!(line, pin, "images/{}/Dockerfile", p.image_name());
            }
        }
        let version = crate::provider::pinned_cli_versions();
        for p in ProviderKind::ALL {
            assert!(version.contains(p.default_cli_version()), "{version}");
        }
    }

    #[test]
    fn the_inputs_hash_follows_every_input_and_the_base_by_id() {
        let h = |j: &BuildJob, id: &str| inputs_hash(j, Some(id)).unwrap();
        let a = h(&job(b"", "1.0.0"), "sha256:aa");
        assert_eq!(a, h(&job(b"", "1.0.0"), "sha256:aa"));
        assert_ne!(a, h(&job(b"", "1.0.1"), "sha256:aa"));
        assert_ne!(
            a,
            h(&job(b"-----BEGIN CERTIFICATE-----", "1.0.0"), "sha256:aa")
        );
        assert_ne!(a, h(&job(b"", "1.0.0"), "sha256:bb"));
        // The base is taken by id: another repository's base with the same id is the same.
        let mut other_repo = job(b"", "1.0.0");
        other_repo.from = "caw-box-drift/base:latest".into();
        other_repo
            .args
            .insert("BASE_IMAGE".into(), "caw-box-drift/base:latest".into());
        assert_eq!(a, h(&other_repo, "sha256:aa"));
        // A FROM image that is not here (it would be pulled): no hash, so always built.
        assert_eq!(inputs_hash(&job(b"", "1.0.0"), None), None);
    }
}
