//! `caw-box doctor` on Docker: the daemon and how it is reached, its OCI runtimes (and how
//! gVisor is added), whether it sees this host's files, the provider images and the
//! untagged images earlier builds left. Read-only.

use super::{DockerBackend, Runtimes};
use crate::backend::doctor::Check;
use crate::backend::{BackendSettings, HostDirs};
use crate::error::{Error, Result};
use crate::labelling::labels;

/// See [`crate::backend::doctor::checkup`].
pub async fn checkup(
    settings: &BackendSettings,
    images: &[(String, String)],
    say: &mut (dyn FnMut(&Check) + Send),
) -> Result<()> {
    let backend = match DockerBackend::connect(settings).await {
        Ok(b) => b,
        Err(e) => {
            say(&Check::Problem(format!("docker: {e}")));
            return Err(Error::environment("the Docker daemon is not reachable")
                .with_hint("start Docker, then run `caw-box doctor` again"));
        }
    };
    let endpoint = backend.endpoint();
    let tls = match &endpoint.tls {
        Some(tls) => format!(", TLS with the client certificate {}", tls.cert.display()),
        None => String::new(),
    };
    say(&Check::Ok(format!(
        "docker: {} ({}){tls}, daemon {}",
        endpoint.host,
        endpoint.why,
        backend.server_version().await?
    )));
    say(&runtimes_check(
        &backend.runtimes().await?,
        backend.is_podman(),
    ));
    if !matches!(backend.capabilities().host_dirs, HostDirs::Shared) {
        say(&Check::Detail(
            "the daemon may not see this machine's files: a new session's workspace is copied unless it can (--workspace-mode auto)".into(),
        ));
    }
    for (p, image) in images {
        match backend.inspect_image(image).await? {
            Some(img) => {
                let version = img
                    .labels
                    .get(labels::CLI_VERSION)
                    .cloned()
                    .unwrap_or_else(|| "unknown".into());
                say(&Check::Ok(format!("{p}: image {image} (CLI {version})")));
            }
            None => say(&Check::Problem(format!(
                "{p}: image {image} is missing; fix: caw-box image build --provider {p}"
            ))),
        }
    }
    // Not a problem (everything works), only disk space: a note with its fix.
    let leftovers = backend.leftover_images().await?;
    if !leftovers.is_empty() {
        say(&Check::Note(format!(
            "images: {} untagged caw-box image{} left by earlier builds; fix: caw-box image prune",
            leftovers.len(),
            if leftovers.len() == 1 { "" } else { "s" }
        )));
    }
    Ok(())
}

/// The daemon's OCI runtimes (`--runtime NAME`), and how gVisor is added where it is not
/// there: a note, not a problem (runc works).
fn runtimes_check(runtimes: &Runtimes, podman: bool) -> Check {
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
        Check::Note(format!(
            "runtimes: Podman's API does not choose a container's runtime: every container runs on {default} (--runtime takes only that one; for gVisor, use Docker)"
        ))
    } else if runtimes.names.iter().any(|n| n == "runsc") {
        Check::Ok(format!("runtimes: {listed}; gVisor: --runtime runsc"))
    } else {
        Check::Note(format!(
            "runtimes: {listed}; for gVisor (--runtime runsc): apt-get install runsc, add \"runtimes\": {{\"runsc\": {{\"path\": \"/usr/bin/runsc\", \"runtimeArgs\": [\"--network=host\"]}}}} to /etc/docker/daemon.json, reload the daemon (`systemctl reload docker`, or SIGHUP to dockerd); docs/walls.md: \"A stronger box\""
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtimes_line_says_how_to_add_gvisor_where_it_is_missing() {
        let mut r = Runtimes {
            names: vec!["io.containerd.runc.v2".into(), "runc".into()],
            default: Some("runc".into()),
        };
        let line = runtimes_check(&r, false).line();
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
            runtimes_check(&r, false).line(),
            "✓ runtimes: io.containerd.runc.v2, runc (default), runsc; gVisor: --runtime runsc"
        );
        // Podman lists what its configuration names, but runs every container on its default.
        assert!(
            runtimes_check(&r, true)
                .line()
                .contains("every container runs on runc"),
            "{}",
            runtimes_check(&r, true).line()
        );
    }
}
