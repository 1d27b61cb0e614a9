//! Where this process's sessions live, as values: the backend, the Kubernetes namespace,
//! the Docker or Kubernetes context, the Docker host and the image repository.
//!
//! The binary's `--backend`/`--namespace`/`--context`/`--image-repo` and a library caller's
//! [`crate::client::ClientBuilder`] both set a [`Connection`]; [`install`] makes it this
//! process's (once: sessions, handles and the daemon endpoint are per process). Library code
//! reads a setting through [`var`]: the installed value, else the variable of the same name
//! (`CAW_BOX_BACKEND`, …), else nothing. A detached driver receives the values as variables
//! on its own command line's environment ([`Connection::child_env`]). A leaf module: it
//! names the settings by their variables and knows nothing of the backends.

use std::sync::OnceLock;

/// The settings a process connects with; `None` leaves a setting to its variable, then the
/// config files, then the default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Connection {
    /// `docker` or `kubernetes` (`CAW_BOX_BACKEND`).
    pub backend: Option<String>,
    /// The Kubernetes namespace (`CAW_BOX_NAMESPACE`).
    pub namespace: Option<String>,
    /// The Kubernetes context (`CAW_BOX_KUBE_CONTEXT`).
    pub kube_context: Option<String>,
    /// The Docker context (`DOCKER_CONTEXT`).
    pub docker_context: Option<String>,
    /// The Docker daemon's address (`DOCKER_HOST`).
    pub docker_host: Option<String>,
    /// The image repository (`CAW_BOX_IMAGE_REPO`).
    pub image_repo: Option<String>,
    /// The `caw-box` executable that drives a detached turn; unset: this process's own
    /// (a program embedding the library, e.g. Python, names the installed binary).
    pub driver: Option<std::path::PathBuf>,
}

static INSTALLED: OnceLock<Connection> = OnceLock::new();

/// Makes `connection` this process's. A second call with other values gives back the
/// installed one: the first one's backend and daemon are already in use.
pub fn install(connection: Connection) -> Result<(), Box<Connection>> {
    let installed = INSTALLED.get_or_init(|| connection.clone());
    if *installed != connection {
        return Err(Box::new(installed.clone()));
    }
    Ok(())
}

/// The variable `name` as this process sees it: the installed connection's value, else the
/// process environment's.
pub fn var(name: &str) -> Option<String> {
    INSTALLED
        .get()
        .and_then(|c| c.value(name).map(str::to_string))
        .or_else(|| std::env::var(name).ok())
}

/// [`var`], with an empty value counted as unset.
pub fn setting(name: &str) -> Option<String> {
    var(name).filter(|v| !v.trim().is_empty())
}

impl Connection {
    /// The value this connection gives the variable `name`, if it sets it.
    fn value(&self, name: &str) -> Option<&str> {
        let v = match name {
            "CAW_BOX_BACKEND" => &self.backend,
            "CAW_BOX_NAMESPACE" => &self.namespace,
            "CAW_BOX_KUBE_CONTEXT" => &self.kube_context,
            "DOCKER_CONTEXT" => &self.docker_context,
            "DOCKER_HOST" => &self.docker_host,
            "CAW_BOX_IMAGE_REPO" => &self.image_repo,
            _ => return None,
        };
        v.as_deref()
    }

    /// The variables a child caw-box process (the detached driver) is started with, so it
    /// connects as this process did.
    pub fn child_env(&self) -> Vec<(&'static str, String)> {
        [
            "CAW_BOX_BACKEND",
            "CAW_BOX_NAMESPACE",
            "CAW_BOX_KUBE_CONTEXT",
            "DOCKER_CONTEXT",
            "DOCKER_HOST",
            "CAW_BOX_IMAGE_REPO",
        ]
        .into_iter()
        .filter_map(|k| self.value(k).map(|v| (k, v.to_string())))
        .collect()
    }
}

/// The executable a detached turn's driver runs: the installed connection's `driver`, else
/// this process's own.
pub fn driver() -> std::io::Result<std::path::PathBuf> {
    match INSTALLED.get().and_then(|c| c.driver.clone()) {
        Some(path) => Ok(path),
        None => std::env::current_exe(),
    }
}

/// This process's installed connection (empty when none was installed).
pub fn installed() -> Connection {
    INSTALLED.get().cloned().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_names_its_values_by_their_variables_and_hands_them_to_a_child() {
        let c = Connection {
            backend: Some("kubernetes".into()),
            kube_context: Some("lab".into()),
            ..Connection::default()
        };
        assert_eq!(c.value("CAW_BOX_BACKEND"), Some("kubernetes"));
        assert_eq!(c.value("DOCKER_CONTEXT"), None);
        assert_eq!(c.value("HOME"), None);
        assert_eq!(
            c.child_env(),
            vec![
                ("CAW_BOX_BACKEND", "kubernetes".to_string()),
                ("CAW_BOX_KUBE_CONTEXT", "lab".to_string())
            ]
        );
    }
}
