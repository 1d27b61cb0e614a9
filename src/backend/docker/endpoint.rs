//! Which Docker daemon to talk to, resolved as the docker CLI does: a context named by
//! `--context` / `DOCKER_CONTEXT`, else `DOCKER_HOST`, else the current context of the
//! docker CLI's config (`$DOCKER_CONFIG/config.json`, default `~/.docker`), else the first
//! socket that exists of the default one, rootless Docker's and Podman's. A `tcp://` daemon
//! is reached over TLS with client certificates as the docker CLI does: a context's
//! `contexts/tls/<id>/docker/`, or `DOCKER_TLS_VERIFY` with `DOCKER_CERT_PATH`. Pure but for
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
    /// The client certificates of a TLS endpoint (`tcp://` only).
    pub tls: Option<Tls>,
}

/// A TLS endpoint's certificate files, as the docker CLI keeps them in one directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Tls {
    /// `ca.pem`, `cert.pem` and `key.pem` of `dir`; a missing one is exit 3, naming it and
    /// what the directory is for (`whose`).
    fn in_dir(dir: &Path, whose: &str, exists: &dyn Fn(&Path) -> bool) -> Result<Tls> {
        let tls = Tls {
            ca: dir.join("ca.pem"),
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
        };
        for file in [&tls.ca, &tls.cert, &tls.key] {
            if !exists(file) {
                return Err(Error::environment(format!(
                    "{whose}: TLS certificate file {} is missing",
                    file.display()
                ))
                .with_hint("the directory needs ca.pem, cert.pem and key.pem, as `docker --tlsverify` does"));
            }
        }
        Ok(tls)
    }
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
            let (host, tls) = context_endpoint(&config_dir(get), name, exists)?;
            return Ok(Endpoint {
                host,
                why: format!("context {name}, from --context or DOCKER_CONTEXT"),
                tls,
            });
        }
    }
    if let Some(host) = var("DOCKER_HOST") {
        // The docker CLI's `DOCKER_TLS_VERIFY`: any non-empty value turns TLS on, with the
        // certificates of `DOCKER_CERT_PATH` (default the config directory).
        let tls = match var("DOCKER_TLS_VERIFY") {
            Some(_) if host.starts_with("tcp://") => {
                let dir = var("DOCKER_CERT_PATH")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| config_dir(get));
                Some(Tls::in_dir(&dir, "DOCKER_TLS_VERIFY", exists)?)
            }
            _ => None,
        };
        let why = if tls.is_some() {
            "DOCKER_HOST, with TLS from DOCKER_TLS_VERIFY".into()
        } else {
            "DOCKER_HOST".into()
        };
        return Ok(Endpoint { host, why, tls });
    }
    let dir = config_dir(get);
    // `DOCKER_CONTEXT=default` asks for the default context: no current one.
    let current = current_context(&dir).filter(|n| n != "default" && asked.is_none());
    if let Some(name) = current {
        let (host, tls) = context_endpoint(&dir, &name, exists)?;
        return Ok(Endpoint {
            host,
            why: format!(
                "context {name}, the current one in {}",
                dir.join("config.json").display()
            ),
            tls,
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
        tls: None,
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

/// A context's docker endpoint, from `contexts/meta/<sha256 of its name>/meta.json`, and
/// for a `tcp://` one its TLS certificates in `contexts/tls/<sha256>/docker/`, if any.
fn context_endpoint(
    dir: &Path,
    name: &str,
    exists: &dyn Fn(&Path) -> bool,
) -> Result<(String, Option<Tls>)> {
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
    let tls_dir = dir.join("contexts/tls").join(&id).join("docker");
    if !host.starts_with("tcp://") || !exists(&tls_dir) {
        return Ok((host.to_string(), None));
    }
    if json.pointer("/Endpoints/docker/SkipTLSVerify") == Some(&serde_json::Value::Bool(true)) {
        return Err(Error::environment(format!(
            "Docker context '{name}' skips verifying the daemon's TLS certificate, which caw-box does not do"
        ))
        .with_hint("give the context the daemon's CA (`docker context update --docker ca=...`)"));
    }
    let tls = Tls::in_dir(&tls_dir, &format!("Docker context '{name}'"), exists)?;
    Ok((host.to_string(), Some(tls)))
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

/// Gives context `name` under `dir` the TLS files of directory `from` (`ca.pem`, `cert.pem`,
/// `key.pem`), as `docker context create --docker ca=,cert=,key=` stores them.
pub fn write_context_tls(dir: &Path, name: &str, from: &Path) -> std::io::Result<()> {
    let id = hex(&Sha256::digest(name.as_bytes()));
    let tls = dir.join("contexts/tls").join(id).join("docker");
    std::fs::create_dir_all(&tls)?;
    for file in ["ca.pem", "cert.pem", "key.pem"] {
        std::fs::copy(from.join(file), tls.join(file))?;
    }
    Ok(())
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
        // DOCKER_CONFIG moves the directory.
        let e = resolve_with(&[("DOCKER_CONFIG", docker.display().to_string())], &[]).unwrap();
        assert_eq!(e.host, "unix:///tmp/desk.sock");
    }

    #[test]
    fn tls_certificates_come_from_the_context_or_docker_tls_verify() {
        let home = tempfile::tempdir().unwrap();
        let docker = home.path().join(".docker");
        let certs = home.path().join("certs");
        std::fs::create_dir_all(&certs).unwrap();
        for f in ["ca.pem", "cert.pem", "key.pem"] {
            std::fs::write(certs.join(f), "pem").unwrap();
        }
        write_context(&docker, "remote", "tcp://build:2376").unwrap();
        write_context_tls(&docker, "remote", &certs).unwrap();
        let vars = |extra: &[(&str, &str)]| {
            let mut v: HashMap<String, String> =
                HashMap::from([("HOME".into(), home.path().display().to_string())]);
            v.extend(extra.iter().map(|(k, x)| (k.to_string(), x.to_string())));
            v
        };
        let resolve_in =
            |v: HashMap<String, String>| resolve(&|k| v.get(k).cloned(), &|p| p.exists());

        // A context's own certificates.
        let e = resolve_in(vars(&[("DOCKER_CONTEXT", "remote")])).unwrap();
        let id = hex(&Sha256::digest(b"remote"));
        let dir = docker.join("contexts/tls").join(&id).join("docker");
        assert_eq!(e.host, "tcp://build:2376");
        assert_eq!(
            e.tls,
            Some(Tls {
                ca: dir.join("ca.pem"),
                cert: dir.join("cert.pem"),
                key: dir.join("key.pem")
            })
        );
        // A missing one: exit 3, naming the file and the context.
        std::fs::remove_file(dir.join("key.pem")).unwrap();
        let e = resolve_in(vars(&[("DOCKER_CONTEXT", "remote")])).unwrap_err();
        assert_eq!(e.exit_code(), 3);
        assert!(
            e.message
                .starts_with("Docker context 'remote': TLS certificate file"),
            "{}",
            e.message
        );
        assert!(e.message.contains("key.pem is missing"), "{}", e.message);
        // A context that skips verification is refused.
        write_context_tls(&docker, "remote", &certs).unwrap();
        let meta = docker.join("contexts/meta").join(&id).join("meta.json");
        let text = std::fs::read_to_string(&meta).unwrap();
        std::fs::write(
            &meta,
            text.replace("\"SkipTLSVerify\":false", "\"SkipTLSVerify\":true"),
        )
        .unwrap();
        let e = resolve_in(vars(&[("DOCKER_CONTEXT", "remote")])).unwrap_err();
        assert!(e.message.contains("skips verifying"), "{}", e.message);

        // DOCKER_TLS_VERIFY: DOCKER_CERT_PATH's files, else the config directory's.
        let tcp = ("DOCKER_HOST", "tcp://build:2376");
        let cert_path = certs.display().to_string();
        let e = resolve_in(vars(&[
            tcp,
            ("DOCKER_TLS_VERIFY", "1"),
            ("DOCKER_CERT_PATH", &cert_path),
        ]))
        .unwrap();
        assert_eq!(e.tls.unwrap().cert, certs.join("cert.pem"));
        assert_eq!(e.why, "DOCKER_HOST, with TLS from DOCKER_TLS_VERIFY");
        let e = resolve_in(vars(&[tcp, ("DOCKER_TLS_VERIFY", "1")])).unwrap_err();
        assert!(
            e.message
                .starts_with("DOCKER_TLS_VERIFY: TLS certificate file"),
            "{}",
            e.message
        );
        assert!(e.message.contains(".docker/ca.pem"), "{}", e.message);
        // Without it, or for a socket, no TLS.
        assert_eq!(resolve_in(vars(&[tcp])).unwrap().tls, None);
        let unix = ("DOCKER_HOST", "unix:///s.sock");
        assert_eq!(
            resolve_in(vars(&[unix, ("DOCKER_TLS_VERIFY", "1")]))
                .unwrap()
                .tls,
            None
        );
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
