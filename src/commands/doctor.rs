//! `caw-box doctor`: what is wrong with this machine for caw-box, one line per problem with
//! the command that fixes it. Exit 0 only when all is well.

use crate::backend::DockerBackend;
use crate::error::{Error, Result};
use crate::output;
use crate::provider::ProviderKind;
use crate::session::record::labels;

pub async fn doctor() -> Result<i32> {
    if crate::backend::BackendKind::chosen()? == crate::backend::BackendKind::Kubernetes {
        return kubernetes().await;
    }
    let mut problems = 0;
    let backend = match DockerBackend::connect().await {
        Ok(b) => b,
        Err(e) => {
            output::println(&format!("✗ docker: {e}"));
            return Err(Error::environment("the Docker daemon is not reachable")
                .with_hint("start Docker, then run `caw-box doctor` again"));
        }
    };
    let endpoint = crate::backend::docker::endpoint()?;
    let tls = match &endpoint.tls {
        Some(tls) => format!(", TLS with the client certificate {}", tls.cert.display()),
        None => String::new(),
    };
    output::println(&format!(
        "✓ docker: {} ({}){tls}, daemon {}",
        endpoint.host,
        endpoint.why,
        backend.server_version().await?
    ));
    output::println(&runtimes_line(
        &backend.runtimes().await?,
        backend.is_podman().await,
    ));
    if !matches!(
        crate::backend::Backend::host_dirs(&backend),
        crate::backend::HostDirs::Shared
    ) {
        output::println(
            "  the daemon may not see this machine's files: a new session's workspace is copied unless it can (--workspace-mode auto)",
        );
    }
    for p in ProviderKind::ALL {
        let image = p.default_image();
        match backend.inspect_image(&image).await? {
            Some(img) => {
                let version = img
                    .labels
                    .get(labels::CLI_VERSION)
                    .cloned()
                    .unwrap_or_else(|| "unknown".into());
                output::println(&format!("✓ {p}: image {image} (CLI {version})"));
            }
            None => {
                problems += 1;
                output::println(&format!(
                    "✗ {p}: image {image} is missing; fix: caw-box image build --provider {p}"
                ));
            }
        }
    }
    // Not a problem (everything works), only disk space: a note with its fix.
    let leftovers = super::image::leftovers(&backend).await?;
    if !leftovers.is_empty() {
        output::println(&format!(
            "- images: {} untagged caw-box image{} left by earlier builds; fix: caw-box image prune",
            leftovers.len(),
            if leftovers.len() == 1 { "" } else { "s" }
        ));
    }
    problems += credentials()?;
    verdict(problems)
}

/// `doctor --backend kubernetes`: the API server, context and namespace, RBAC, the storage
/// class and the provider images on the nodes, then the credentials (as on Docker).
async fn kubernetes() -> Result<i32> {
    use crate::backend::kubernetes::doctor::{checks, Check};
    let get = crate::connection::setting;
    let (context, namespace) = (get("CAW_BOX_KUBE_CONTEXT"), get("CAW_BOX_NAMESPACE"));
    let images: Vec<(String, String)> = ProviderKind::ALL
        .iter()
        .map(|p| (p.to_string(), p.default_image()))
        .collect();
    let (lines, reached) = checks(context.as_deref(), namespace.as_deref(), &images).await;
    let mut problems = 0;
    for line in &lines {
        match line {
            Check::Ok(l) => output::println(&format!("✓ {l}")),
            Check::Note(l) => output::println(&format!("- {l}")),
            Check::Problem(l) => {
                problems += 1;
                output::println(&format!("✗ {l}"));
            }
        }
    }
    if !reached {
        return Err(
            Error::environment("the Kubernetes API server is not reachable")
                .with_hint("check KUBECONFIG and --context, then run `caw-box doctor` again"),
        );
    }
    problems += credentials()?;
    verdict(problems)
}

/// The daemon's OCI runtimes (`--runtime NAME`), and how gVisor is added where it is not
/// there: a note, not a problem (runc works).
fn runtimes_line(runtimes: &crate::backend::docker::Runtimes, podman: bool) -> String {
    let names: Vec<String> = runtimes
        .names
        .iter()
        .map(|n| match &runtimes.default {
            Some(d) if d == n => format!("{n} (default)"),
            _ => n.clone(),
        })
        .collect();
    let listed = if names.is_empty() {
        "none listed".to_string()
    } else {
        names.join(", ")
    };
    if podman {
        let default = runtimes.default.as_deref().unwrap_or("its default");
        format!(
            "- runtimes: Podman's API does not choose a container's runtime: every container runs on {default} (--runtime takes only that one; for gVisor, use Docker)"
        )
    } else if runtimes.names.iter().any(|n| n == "runsc") {
        format!("✓ runtimes: {listed}; gVisor: --runtime runsc")
    } else {
        format!(
            "- runtimes: {listed}; for gVisor (--runtime runsc): apt-get install runsc, add \"runtimes\": {{\"runsc\": {{\"path\": \"/usr/bin/runsc\", \"runtimeArgs\": [\"--network=host\"]}}}} to /etc/docker/daemon.json, reload the daemon (`systemctl reload docker`, or SIGHUP to dockerd); docs/walls.md: \"A stronger box\""
        )
    }
}

/// Exit 0 when all is well, else the count of problems (exit 3).
fn verdict(problems: usize) -> Result<i32> {
    if problems == 0 {
        Ok(0)
    } else {
        Err(Error::environment(format!(
            "{problems} problem{} found",
            if problems == 1 { "" } else { "s" }
        ))
        .with_hint("run the fixes listed above"))
    }
}

/// A line per provider's stored credentials; the count of problems.
fn credentials() -> Result<usize> {
    let mut problems = 0;
    let store = crate::auth::store::Store::open()?;
    let now = crate::session::record::now_secs();
    for p in ProviderKind::ALL {
        let manifest = store.manifest(p);
        let in_env: Vec<&str> = p
            .endpoint_key_vars()
            .iter()
            .copied()
            .filter(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()))
            .collect();
        if manifest.items.is_empty() {
            if in_env.is_empty() {
                output::println(&format!(
                    "- {p}: no credentials stored; fix: caw-box auth collect --provider {p}"
                ));
            } else {
                output::println(&format!(
                    "- {p}: {} set here but not collected; fix: caw-box auth collect --provider {p}",
                    in_env.join(", ")
                ));
            }
            continue;
        }
        let expired: Vec<&str> = manifest
            .items
            .iter()
            .filter(|i| i.expires_at.is_some_and(|e| e <= now))
            .map(|i| i.target.as_str())
            .collect();
        let has_key = manifest
            .items
            .iter()
            .any(|i| i.kind == "env" || i.kind == "derived");
        if !expired.is_empty() && !has_key {
            problems += 1;
            output::println(&format!(
                "✗ {p}: stored login expired ({}); fix: log in again on this host, then caw-box auth collect --provider {p}",
                expired.join(", ")
            ));
        } else {
            let names: Vec<&str> = manifest.items.iter().map(|i| i.target.as_str()).collect();
            output::println(&format!("✓ {p}: credentials stored ({})", names.join(", ")));
        }
    }
    Ok(problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::docker::Runtimes;

    #[test]
    fn the_runtimes_line_says_how_to_add_gvisor_where_it_is_missing() {
        let mut r = Runtimes {
            names: vec!["io.containerd.runc.v2".into(), "runc".into()],
            default: Some("runc".into()),
        };
        let line = runtimes_line(&r, false);
        assert!(
            line.starts_with("- runtimes: io.containerd.runc.v2, runc (default); for gVisor"),
            "{line}"
        );
        assert!(
            line.contains("apt-get install runsc")
                && line.contains("\"runtimeArgs\": [\"--network=host\"]"),
            "{line}"
        );
        r.names.push("runsc".into());
        assert_eq!(
            runtimes_line(&r, false),
            "✓ runtimes: io.containerd.runc.v2, runc (default), runsc; gVisor: --runtime runsc"
        );
        // Podman lists what its configuration names, but runs every container on its default.
        assert!(
            runtimes_line(&r, true).contains("every container runs on runc"),
            "{}",
            runtimes_line(&r, true)
        );
    }
}
