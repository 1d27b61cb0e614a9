//! `caw-box image build` and `caw-box image ls`.
//!
//! The Dockerfiles are compiled into the binary, so an installed caw-box builds its images
//! without the source tree. The build context is a tar made in memory; an extra CA is put in
//! the provider contexts for the install stage only (the final stage never copies it).

use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

use bollard::query_parameters::{BuildImageOptions, ListImagesOptions};
use futures_util::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};

use crate::backend::DockerBackend;
use crate::cli::ImageBuildArgs;
use crate::error::{Error, Result};
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

pub async fn build(args: ImageBuildArgs, verbose: bool, quiet: bool) -> Result<i32> {
    let providers: Vec<ProviderKind> = if args.all {
        ProviderKind::ALL.to_vec()
    } else if args.provider.is_empty() {
        return Err(Error::usage(
            "say which images to build: --provider P (repeatable) or --all",
        ));
    } else {
        args.provider
            .iter()
            .map(|p| p.parse())
            .collect::<std::result::Result<_, _>>()?
    };
    if args.cli_version.is_some() && providers.len() > 1 {
        return Err(Error::usage(
            "--cli-version applies to one provider; build them one at a time",
        ));
    }
    if let Some(v) = &args.cli_version {
        if v.is_empty()
            || !v
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ".-+".contains(c))
        {
            return Err(Error::usage(format!(
                "--cli-version '{v}' is not a version"
            )));
        }
    }
    let ca = match &args.ca_cert {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| {
                Error::usage(format!("cannot read --ca-cert '{}': {e}", path.display()))
            })?;
            if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                return Err(Error::usage(format!(
                    "--ca-cert '{}' holds no PEM certificate",
                    path.display()
                )));
            }
            pem
        }
        None => Vec::new(),
    };
    let backend = DockerBackend::connect().await?;

    let mut jobs = vec![BuildJob {
        tag: base_tag(),
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
    for job in jobs {
        build_one(&backend, job, &args, verbose, quiet).await?;
    }
    Ok(0)
}

async fn build_one(
    backend: &DockerBackend,
    job: BuildJob,
    args: &ImageBuildArgs,
    verbose: bool,
    quiet: bool,
) -> Result<()> {
    let tar = context_tar(&job.files)?;
    let options = BuildImageOptions {
        t: Some(job.tag.clone()),
        buildargs: Some(job.args.clone()),
        labels: Some(job.labels.clone()),
        rm: true,
        forcerm: true,
        nocache: args.no_cache,
        ..Default::default()
    };
    let progress = if quiet || verbose {
        ProgressBar::hidden()
    } else {
        let pb = ProgressBar::new_spinner();
        pb.set_style(
            ProgressStyle::with_template("{spinner} {prefix} {wide_msg} {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        pb.set_prefix(format!("building {}", job.tag));
        pb.enable_steady_tick(Duration::from_millis(120));
        pb
    };
    let started = std::time::Instant::now();
    let mut log = String::new();
    let mut failure: Option<String> = None;
    let mut stream =
        backend
            .client()
            .build_image(options, None, Some(bollard::body_full(tar.into())));
    while let Some(item) = stream.next().await {
        match item {
            Ok(info) => {
                if let Some(text) = info.stream.as_deref() {
                    log.push_str(text);
                    if verbose {
                        let _ = std::io::stderr().write_all(text.as_bytes());
                    }
                    if let Some(step) = text.lines().find(|l| l.starts_with("Step ")) {
                        progress.set_message(step.to_string());
                    }
                }
                if let Some(err) = info.error_detail.and_then(|d| d.message) {
                    failure = Some(err);
                }
            }
            Err(e) => {
                failure = Some(crate::backend::docker::daemon_message(&e));
                break;
            }
        }
    }
    progress.finish_and_clear();
    if let Some(err) = failure {
        let last_lines: Vec<&str> = log.lines().rev().take(3).collect();
        tracing::debug!("build log tail: {:?}", last_lines);
        let hint = if job.tag == base_tag()
            && backend
                .inspect_image(&args.base)
                .await
                .ok()
                .flatten()
                .is_none()
        {
            format!(
                "the base image '{}' is not present and could not be pulled: pass --base with a local image that has node >= 20",
                args.base
            )
        } else {
            "run again with -v for the full build log".to_string()
        };
        return Err(
            Error::environment(format!("building {} failed: {err}", job.tag)).with_hint(hint),
        );
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

pub async fn ls() -> Result<i32> {
    let backend = DockerBackend::connect().await?;
    let images = backend
        .client()
        .list_images(Some(ListImagesOptions {
            filters: Some(HashMap::from([(
                "label".to_string(),
                vec![format!("{}=true", labels::MANAGED)],
            )])),
            ..Default::default()
        }))
        .await
        .map_err(|e| {
            Error::environment(format!(
                "failed to list images: {}",
                crate::backend::docker::daemon_message(&e)
            ))
        })?;
    let mut rows = vec![[
        "IMAGE".to_string(),
        "PROVIDER".to_string(),
        "CLI VERSION".to_string(),
        "SIZE".to_string(),
        "CREATED".to_string(),
    ]];
    let now = crate::session::record::now_secs() as i64;
    for img in images {
        let tag = img
            .repo_tags
            .iter()
            .find(|t| !t.starts_with("<none>"))
            .cloned()
            .unwrap_or_else(|| img.id.chars().take(19).collect());
        let label = |k: &str| img.labels.get(k).cloned().unwrap_or_else(|| "-".into());
        let age = Duration::from_secs((now - img.created).max(0) as u64);
        rows.push([
            tag,
            label(labels::PROVIDER),
            label(labels::CLI_VERSION),
            format!("{:.0} MB", img.size as f64 / 1e6),
            format!("{} ago", humantime::format_duration(round_age(age))),
        ]);
    }
    rows[1..].sort();
    print_table(&rows);
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

/// Prints rows as aligned columns.
pub fn print_table<const N: usize>(rows: &[[String; N]]) {
    let mut widths = [0usize; N];
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        output::println(line.join("   ").trim_end());
    }
}
