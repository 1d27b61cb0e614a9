//! Docker endpoints as the docker CLI resolves them (issue 16): with `DOCKER_HOST` unset,
//! the current context of `$DOCKER_CONFIG/config.json` is used for a real run and resume
//! (its endpoint is the test daemon through a second path, a socket symlink);
//! `DOCKER_CONTEXT` and `--context` override it; a context whose socket is missing is
//! exit 3, naming the context. A `tcp://` daemon behind TLS that checks client certificates
//! (a loopback TLS front of the test daemon) is reached with a context's certificates and
//! with `DOCKER_TLS_VERIFY`; a certificate it does not trust is exit 3.

use crate::common::*;

/// The rig daemon's socket path.
fn socket() -> String {
    std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|h| h.strip_prefix("unix://").map(str::to_string))
        .unwrap_or_else(|| "/var/run/docker.sock".to_string())
}

/// A context as `docker context create NAME --docker host=HOST` writes it.
fn write_context(dir: &std::path::Path, name: &str, host: &str) {
    caw_box::backend::docker::endpoint::write_context(dir, name, host).unwrap();
}

#[test]
fn the_current_docker_context_is_used_and_can_be_overridden() {
    let rig = Rig::new("contexts");
    let dir = tempfile::tempdir().unwrap();
    let alt = dir.path().join("alt.sock");
    std::os::unix::fs::symlink(socket(), &alt).unwrap();
    write_context(dir.path(), "alt", &format!("unix://{}", alt.display()));
    write_context(
        dir.path(),
        "broken",
        "unix:///nonexistent/caw-box-test.sock",
    );
    let set_current = |name: &str| {
        std::fs::write(
            dir.path().join("config.json"),
            format!(r#"{{"currentContext":"{name}"}}"#),
        )
        .unwrap();
    };
    let with_config = |mut c: std::process::Command| {
        c.env_remove("DOCKER_HOST")
            .env_remove("DOCKER_CONTEXT")
            .env("DOCKER_CONFIG", dir.path());
        c
    };

    check("the current context");
    set_current("alt");
    let mut doctor = with_config(rig.caw());
    doctor.arg("doctor");
    let out = run(doctor);
    assert!(
        stdout_of(&out).contains(&format!(
            "✓ docker: unix://{} (context alt, the current one in",
            alt.display()
        )),
        "{}{}",
        stdout_of(&out),
        stderr_of(&out)
    );
    let name = format!("ctx-{}", rig.run_id);
    let (code, first, stderr) = rig.json_turn(with_config(rig.run_cmd(
        CODEX,
        "Please REMEMBER:papaya-17 for later.",
        &["--name", &name],
    )));
    assert_eq!(code, 0, "{first}\n{stderr}");

    check("a context whose socket is missing: exit 3, naming it");
    set_current("broken");
    let mut ls = with_config(rig.caw());
    ls.arg("ls");
    let out = run(ls);
    assert_eq!(out.status.code(), Some(3), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("context broken"),
        "{}",
        stderr_of(&out)
    );

    check("--context and DOCKER_CONTEXT override the current one");
    let (code, second, stderr) = rig.json_turn(with_config(rig.resume_cmd(
        CODEX,
        &name,
        "RECALL",
        &["--context", "alt"],
    )));
    assert_eq!(code, 0, "{second}\n{stderr}");
    assert!(
        second["result"]
            .as_str()
            .unwrap_or("")
            .contains("You told me to remember papaya-17"),
        "{second}"
    );
    let mut ls = with_config(rig.caw());
    ls.args(["ls", "--json"]).env("DOCKER_CONTEXT", "alt");
    let out = run(ls);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(stdout_of(&out).contains(&name), "{}", stdout_of(&out));
    let mut gone = with_config(rig.caw());
    gone.args(["ls", "--context", "nowhere"]);
    let out = run(gone);
    assert_eq!(out.status.code(), Some(3), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("Docker context 'nowhere' does not exist"),
        "{}",
        stderr_of(&out)
    );
}

/// `openssl` on `args` in `dir`; the test fails with its words when it does.
fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl (scripts/rig.sh tools installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        stderr_of(&out)
    );
}

/// A CA in `dir` (`ca.pem`, `ca-key.pem`) and, signed by it, a server certificate for
/// 127.0.0.1 (`server.pem`, `server-key.pem`) and a client one (`cert.pem`, `key.pem`), as
/// `dockerd --tlsverify` and `docker --tlsverify` take them.
fn make_certificates(dir: &std::path::Path) {
    std::fs::create_dir_all(dir).unwrap();
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            "ca-key.pem",
            "-out",
            "ca.pem",
            "-subj",
            "/CN=caw-box-test-ca",
        ],
    );
    for (name, key, cn, ext) in [
        (
            "server.pem",
            "server-key.pem",
            "127.0.0.1",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        ),
        (
            "cert.pem",
            "key.pem",
            "caw-box-test-client",
            "extendedKeyUsage=clientAuth\n",
        ),
    ] {
        std::fs::write(dir.join("ext.cnf"), ext).unwrap();
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                key,
                "-out",
                "req.csr",
                "-subj",
                &format!("/CN={cn}"),
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "req.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca-key.pem",
                "-CAcreateserial",
                "-days",
                "1",
                "-out",
                name,
                "-extfile",
                "ext.cnf",
            ],
        );
    }
}

/// A TLS endpoint on loopback in front of the rig daemon's socket that takes only clients
/// with a certificate of `certs`' CA: what `dockerd --tlsverify -H tcp://...` offers.
struct TlsDaemon {
    port: u16,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TlsDaemon {
    fn start(certs: &std::path::Path) -> TlsDaemon {
        use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
        use std::sync::Arc;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(certs.join("ca.pem")).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .unwrap();
        let chain = CertificateDer::pem_file_iter(certs.join("server.pem"))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let key = PrivateKeyDer::from_pem_file(certs.join("server-key.pem")).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let socket = socket();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let serve = async {
                    loop {
                        let Ok((tcp, _)) = listener.accept().await else {
                            continue;
                        };
                        let (acceptor, socket) = (acceptor.clone(), socket.clone());
                        tokio::spawn(async move {
                            // A client the CA did not sign ends here, in the handshake.
                            let Ok(mut tls) = acceptor.accept(tcp).await else {
                                return;
                            };
                            let Ok(mut unix) = tokio::net::UnixStream::connect(&socket).await
                            else {
                                return;
                            };
                            let _ = tokio::io::copy_bidirectional(&mut tls, &mut unix).await;
                        });
                    }
                };
                tokio::select! {
                    _ = serve => {}
                    _ = stopped => {}
                }
            });
        });
        TlsDaemon {
            port,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for TlsDaemon {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[test]
fn a_tls_daemon_is_reached_with_the_contexts_or_docker_cert_paths_certificates() {
    use caw_box::backend::docker::endpoint::{write_context, write_context_tls};
    let rig = Rig::new("tls-context");
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    make_certificates(&certs);
    // A client certificate of another CA, beside the right CA for the daemon's side.
    let other = dir.path().join("other");
    make_certificates(&other);
    std::fs::copy(certs.join("ca.pem"), other.join("ca.pem")).unwrap();
    let daemon = TlsDaemon::start(&certs);
    let host = format!("tcp://127.0.0.1:{}", daemon.port);
    let config = dir.path().join("docker");
    write_context(&config, "secure", &host).unwrap();
    write_context_tls(&config, "secure", &certs).unwrap();
    write_context(&config, "stranger", &host).unwrap();
    write_context_tls(&config, "stranger", &other).unwrap();
    std::fs::write(config.join("config.json"), r#"{"currentContext":"secure"}"#).unwrap();
    let with_config = |mut c: std::process::Command| {
        c.env_remove("DOCKER_HOST")
            .env_remove("DOCKER_CONTEXT")
            .env("DOCKER_CONFIG", &config);
        c
    };

    check("the current context's certificates: doctor and a turn");
    let mut doctor = with_config(rig.caw());
    doctor.arg("doctor");
    let out = run(doctor);
    let said = stdout_of(&out);
    assert!(
        said.contains(&format!(
            "✓ docker: {host} (context secure, the current one in"
        )) && said.contains("TLS with the client certificate"),
        "{said}{}",
        stderr_of(&out)
    );
    let name = format!("tls-{}", rig.run_id);
    let (code, first, stderr) = rig.json_turn(with_config(rig.run_cmd(
        CODEX,
        "Please REMEMBER:quince-23 for later.",
        &["--name", &name],
    )));
    assert_eq!(code, 0, "{first}\n{stderr}");

    check("DOCKER_HOST with DOCKER_TLS_VERIFY and DOCKER_CERT_PATH: the resume recalls");
    let mut resume = with_config(rig.resume_cmd(CODEX, &name, "RECALL", &[]));
    resume
        .env("DOCKER_HOST", &host)
        .env("DOCKER_TLS_VERIFY", "1")
        .env("DOCKER_CERT_PATH", &certs);
    let (code, second, stderr) = rig.json_turn(resume);
    assert_eq!(code, 0, "{second}\n{stderr}");
    assert!(
        second["result"]
            .as_str()
            .unwrap_or("")
            .contains("You told me to remember quince-23"),
        "{second}"
    );

    check("a certificate the daemon does not trust: exit 3, naming the endpoint");
    let mut ls = with_config(rig.caw());
    ls.args(["ls", "--context", "stranger"]);
    let out = run(ls);
    assert_eq!(out.status.code(), Some(3), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains(&format!(
            "cannot reach the Docker daemon at {host} (context stranger"
        )),
        "{}",
        stderr_of(&out)
    );

    check("plain TCP to a TLS daemon, and DOCKER_TLS_VERIFY without the files: exit 3");
    let mut plain = with_config(rig.caw());
    plain.args(["ls"]).env("DOCKER_HOST", &host);
    let out = run(plain);
    assert_eq!(out.status.code(), Some(3), "{}", stderr_of(&out));
    let mut missing = with_config(rig.caw());
    missing
        .args(["ls"])
        .env("DOCKER_HOST", &host)
        .env("DOCKER_TLS_VERIFY", "1")
        .env("DOCKER_CERT_PATH", dir.path());
    let out = run(missing);
    assert_eq!(out.status.code(), Some(3), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("DOCKER_TLS_VERIFY: TLS certificate file")
            && stderr_of(&out).contains("ca.pem is missing"),
        "{}",
        stderr_of(&out)
    );
}
