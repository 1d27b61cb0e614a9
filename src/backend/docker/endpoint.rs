//! Which Docker daemon to talk to, resolved as the docker CLI does: a context named by
//! `--context` / `DOCKER_CONTEXT`, else `DOCKER_HOST`, else the current context of the
//! docker CLI's config (`$DOCKER_CONFIG/config.json`, default `~/.docker`), else the first
//! socket that exists of the default one, rootless Docker's and Podman's. Pure but for
//! reading files: the lookups are passed in, so tests give their own.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// A daemon address and why it is the one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `unix:///path`, `tcp://host:port` or `ssh://user@host`.
    pub host: String,
    /// Where it came from, for `doctor` and error lines.
    pub why: String,
}

/// The default socket of a rootful Docker.
const DEFAULT_SOCKET: &str = "/var/run/docker.sock";

/// Resolves the endpoint. `get` looks variables up; `exists` says whether a path exists.
pub fn resolve(
    get: &dyn Fn(&str) -> Option<String>,
    exists: &dyn Fn(&Path) -> bool,
) -> Result<Endpoint> {
    let var = |k: &str| get(k).filter(|v| !v.trim().is_empty());
    let asked = var("DOCKER_CONTEXT");
    if let Some(name) = &asked {
        if name != "default" {
            let host = context_host(&config_dir(get), name)?;
            return Ok(Endpoint {
                host,
                why: format!("context {name}, from --context or DOCKER_CONTEXT"),
            });
        }
    }
    if let Some(host) = var("DOCKER_HOST") {
        return Ok(Endpoint {
            host,
            why: "DOCKER_HOST".into(),
        });
    }
    let dir = config_dir(get);
    // `DOCKER_CONTEXT=default` asks for the default context: no current one.
    let current = current_context(&dir).filter(|n| n != "default" && asked.is_none());
    if let Some(name) = current {
        let host = context_host(&dir, &name)?;
        return Ok(Endpoint {
            host,
            why: format!(
                "context {name}, the current one in {}",
                dir.join("config.json").display()
            ),
        });
    }
    let mut candidates = vec![(PathBuf::from(DEFAULT_SOCKET), "the default socket")];
    if let Some(run) = var("XDG_RUNTIME_DIR") {
        candidates.push((
            Path::new(&run).join("docker.sock"),
            "rootless Docker's socket",
        ));
        candidates.push((
            Path::new(&run).join("podman/podman.sock"),
            "rootless Podman's socket",
        ));
    }
    candidates.push((PathBuf::from("/run/podman/podman.sock"), "Podman's socket"));
    let (path, why) = candidates
        .iter()
        .find(|(p, _)| exists(p))
        .cloned()
        .unwrap_or_else(|| candidates[0].clone());
    Ok(Endpoint {
        host: format!("unix://{}", path.display()),
        why: why.into(),
    })
}

/// The docker CLI's config directory: `$DOCKER_CONFIG`, else `~/.docker`.
fn config_dir(get: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    match get("DOCKER_CONFIG").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => Path::new(&get("HOME").unwrap_or_default()).join(".docker"),
    }
}

/// The registry an image repository lives in, as `docker login` keys it: the first path
/// part when it looks like a host (`ghcr.io`, `localhost:5000`), else Docker Hub.
pub fn registry_of(repo: &str) -> &str {
    match repo.split_once('/') {
        Some((host, _)) if host.contains('.') || host.contains(':') || host == "localhost" => host,
        _ => "https://index.docker.io/v1/",
    }
}

/// Plain credentials `docker login` stored for the registry of `repo` (the `auths` entries of
/// `$DOCKER_CONFIG/config.json`; credential helpers are not asked). `None`: pull anonymously.
pub fn registry_credentials(repo: &str) -> Option<bollard::auth::DockerCredentials> {
    use base64::Engine;
    let dir = config_dir(&|v| std::env::var(v).ok());
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    let registry = registry_of(repo);
    let auth = json.get("auths")?.get(registry)?.get("auth")?.as_str()?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(auth)
        .ok()?;
    let (user, password) = std::str::from_utf8(&decoded).ok()?.split_once(':')?;
    Some(bollard::auth::DockerCredentials {
        username: Some(user.to_string()),
        password: Some(password.to_string()),
        serveraddress: Some(registry.to_string()),
        ..Default::default()
    })
}

fn current_context(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json.get("currentContext")?.as_str().map(str::to_string)
}

/// A context's docker endpoint, from `contexts/meta/<sha256 of its name>/meta.json`.
fn context_host(dir: &Path, name: &str) -> Result<String> {
    let id = hex(&Sha256::digest(name.as_bytes()));
    let meta = dir.join("contexts/meta").join(&id).join("meta.json");
    let not_found = || {
        Error::environment(format!(
            "Docker context '{name}' does not exist (no {})",
            meta.display()
        ))
        .with_hint("`docker context ls` lists the contexts; or unset DOCKER_CONTEXT / --context")
    };
    let text = std::fs::read_to_string(&meta).map_err(|_| not_found())?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        Error::environment(format!(
            "Docker context '{name}': {} is not valid JSON: {e}",
            meta.display()
        ))
    })?;
    let host = json
        .pointer("/Endpoints/docker/Host")
        .and_then(|h| h.as_str())
        .filter(|h| !h.is_empty())
        .ok_or_else(|| {
            Error::environment(format!("Docker context '{name}' names no docker endpoint"))
        })?;
    if dir.join("contexts/tls").join(&id).join("docker").is_dir() {
        return Err(Error::environment(format!(
            "Docker context '{name}' uses TLS client certificates, which caw-box does not support yet"
        ))
        .with_hint("reach that daemon over ssh:// or a local socket, or set DOCKER_HOST"));
    }
    Ok(host.to_string())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes a context under config directory `dir` as `docker context create NAME --docker
/// host=HOST` does (for tests, and for machines without the docker CLI).
pub fn write_context(dir: &Path, name: &str, host: &str) -> std::io::Result<()> {
    let id = hex(&Sha256::digest(name.as_bytes()));
    let meta = dir.join("contexts/meta").join(id);
    std::fs::create_dir_all(&meta)?;
    let json = serde_json::json!({
        "Name": name,
        "Metadata": {},
        "Endpoints": { "docker": { "Host": host, "SkipTLSVerify": false } }
    });
    std::fs::write(meta.join("meta.json"), json.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn resolve_with(vars: &[(&str, String)], existing: &[&str]) -> Result<Endpoint> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        let existing: Vec<PathBuf> = existing.iter().map(PathBuf::from).collect();
        resolve(&|k| vars.get(k).cloned(), &|p| {
            existing.iter().any(|e| e == p)
        })
    }

    #[test]
    fn contexts_variables_and_sockets_in_the_docker_clis_order() {
        let home = tempfile::tempdir().unwrap();
        let docker = home.path().join(".docker");
        write_context(&docker, "desk", "unix:///tmp/desk.sock").unwrap();
        write_context(&docker, "remote", "ssh://me@build").unwrap();
        std::fs::write(docker.join("config.json"), r#"{"currentContext":"desk"}"#).unwrap();
        let h = ("HOME", home.path().display().to_string());
        // The current context of config.json.
        let e = resolve_with(std::slice::from_ref(&h), &[]).unwrap();
        assert_eq!(e.host, "unix:///tmp/desk.sock");
        assert!(
            e.why.starts_with("context desk, the current one in"),
            "{}",
            e.why
        );
        // DOCKER_HOST beats it.
        let e = resolve_with(&[h.clone(), ("DOCKER_HOST", "tcp://d:2375".into())], &[]).unwrap();
        assert_eq!(
            (e.host.as_str(), e.why.as_str()),
            ("tcp://d:2375", "DOCKER_HOST")
        );
        // DOCKER_CONTEXT (and --context, which sets it) beats both.
        let e = resolve_with(
            &[
                h.clone(),
                ("DOCKER_HOST", "tcp://d:2375".into()),
                ("DOCKER_CONTEXT", "remote".into()),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(e.host, "ssh://me@build");
        // `default` is no context: DOCKER_HOST, else a socket.
        let e = resolve_with(&[h.clone(), ("DOCKER_CONTEXT", "default".into())], &[]).unwrap();
        assert_eq!(e.host, "unix:///var/run/docker.sock");
        // A context that does not exist: exit 3, naming it.
        let e = resolve_with(&[h.clone(), ("DOCKER_CONTEXT", "gone".into())], &[]).unwrap_err();
        assert_eq!(e.exit_code(), 3);
        assert!(
            e.message.contains("Docker context 'gone' does not exist"),
            "{}",
            e.message
        );
        // A context with TLS client certificates: refused, exit 3, naming it.
        let id = hex(&Sha256::digest(b"remote"));
        std::fs::create_dir_all(docker.join("contexts/tls").join(id).join("docker")).unwrap();
        let e = resolve_with(&[h.clone(), ("DOCKER_CONTEXT", "remote".into())], &[]).unwrap_err();
        assert_eq!(e.exit_code(), 3);
        assert!(
            e.message.contains("'remote' uses TLS client certificates"),
            "{}",
            e.message
        );
        // DOCKER_CONFIG moves the directory.
        let e = resolve_with(&[("DOCKER_CONFIG", docker.display().to_string())], &[]).unwrap();
        assert_eq!(e.host, "unix:///tmp/desk.sock");
    }

    #[test]
    fn the_registry_of_a_repository_is_its_host_or_docker_hub() {
        assert_eq!(registry_of("ghcr.io/owner/caw-box"), "ghcr.io");
        assert_eq!(registry_of("127.0.0.1:5000/x"), "127.0.0.1:5000");
        assert_eq!(registry_of("localhost/x"), "localhost");
        assert_eq!(registry_of("caw-box"), "https://index.docker.io/v1/");
        assert_eq!(
            registry_of("someone/caw-box"),
            "https://index.docker.io/v1/"
        );
    }

    #[test]
    fn without_a_context_the_first_socket_there_is_used() {
        let run = ("XDG_RUNTIME_DIR", "/run/user/1000".to_string());
        let e = resolve_with(
            std::slice::from_ref(&run),
            &["/run/user/1000/podman/podman.sock"],
        )
        .unwrap();
        assert_eq!(e.host, "unix:///run/user/1000/podman/podman.sock");
        assert_eq!(e.why, "rootless Podman's socket");
        let e = resolve_with(std::slice::from_ref(&run), &["/run/user/1000/docker.sock"]).unwrap();
        assert_eq!(e.why, "rootless Docker's socket");
        let e = resolve_with(
            std::slice::from_ref(&run),
            &["/var/run/docker.sock", "/run/podman/podman.sock"],
        )
        .unwrap();
        assert_eq!(e.why, "the default socket");
        let e = resolve_with(&[], &["/run/podman/podman.sock"]).unwrap();
        assert_eq!(e.host, "unix:///run/podman/podman.sock");
        // None there: the default, for the error to name.
        let e = resolve_with(&[], &[]).unwrap();
        assert_eq!(e.host, "unix:///var/run/docker.sock");
    }
}
