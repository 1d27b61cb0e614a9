//! `DOCKER_HOST=ssh://...` (issue 19): caw-box reaches the daemon through the user's own
//! `ssh` and `docker system dial-stdio` on the far side, as the docker CLI does. The far
//! side here is an sshd this test starts on loopback (the rig installs openssh-server); the
//! `ssh` caw-box runs is the real client, given this test's config by a wrapper first on
//! PATH (ssh reads the passwd entry's ~/.ssh, never $HOME), so the user's ssh setup is
//! never touched.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// An sshd on 127.0.0.1 that admits one key, killed when dropped.
struct Sshd {
    child: Child,
    port: u16,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn keygen(path: &Path) {
    let ok = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .status()
        .expect("ssh-keygen")
        .success();
    assert!(ok, "ssh-keygen failed");
}

fn start_sshd(dir: &Path) -> Sshd {
    keygen(&dir.join("host_key"));
    keygen(&dir.join("id"));
    std::fs::copy(dir.join("id.pub"), dir.join("authorized_keys")).unwrap();
    // Privilege separation wants its directory.
    std::fs::create_dir_all("/run/sshd").unwrap();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("/usr/sbin/sshd")
        .args(["-D", "-e", "-f", "/dev/null", "-p", &port.to_string(), "-h"])
        .arg(dir.join("host_key"))
        .args([
            "-o",
            "ListenAddress=127.0.0.1",
            "-o",
            "StrictModes=no",
            "-o",
            "UsePAM=no",
        ])
        .args([
            "-o",
            "PermitRootLogin=prohibit-password",
            "-o",
            "PidFile=none",
        ])
        .arg("-o")
        .arg(format!(
            "AuthorizedKeysFile={}",
            dir.join("authorized_keys").display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("sshd (installed by `scripts/rig.sh tools`)");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "sshd did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    Sshd { child, port }
}

/// The ssh host name of the test's sshd, in the config the wrapper gives ssh.
const HOST_ALIAS: &str = "caw-box-ssh-test";

/// A directory holding `ssh`: the real client with this test's config. The port is in the
/// config, as users set it: bollard hands ssh the `user@host` of `DOCKER_HOST` alone.
fn ssh_wrapper(dir: &Path, port: u16) -> std::path::PathBuf {
    let config = dir.join("ssh_config");
    std::fs::write(
        &config,
        format!(
            "Host {HOST_ALIAS}\n  HostName 127.0.0.1\n  Port {port}\n  IdentityFile {}\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n",
            dir.join("id").display()
        ),
    )
    .unwrap();
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let wrapper = bin.join("ssh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec /usr/bin/ssh -F {} \"$@\"\n",
            config.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    bin
}

#[test]
fn an_ssh_docker_host_runs_and_resumes_a_session() {
    let rig = Rig::new("ssh-host");
    let dir = tempfile::tempdir().unwrap();
    let sshd = start_sshd(dir.path());
    let bin = ssh_wrapper(dir.path(), sshd.port);
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let host = format!("ssh://root@{HOST_ALIAS}");
    let over_ssh = |mut c: Command| {
        c.env("DOCKER_HOST", &host).env("PATH", &path);
        c
    };

    check("doctor names the ssh endpoint");
    let mut doctor = over_ssh(rig.caw());
    doctor.arg("doctor");
    let out = run(doctor);
    assert!(
        stdout_of(&out).contains(&format!("✓ docker: {host} (DOCKER_HOST)")),
        "{}{}",
        stdout_of(&out),
        stderr_of(&out)
    );

    check("run and resume over ssh");
    let name = format!("ssh-{}", rig.run_id);
    let (code, first, stderr) = rig.json_turn(over_ssh(rig.run_cmd(
        CODEX,
        "Please REMEMBER:papaya-17 for later.",
        &["--name", &name],
    )));
    assert_eq!(code, 0, "{first}\n{stderr}");
    let (code, second, stderr) =
        rig.json_turn(over_ssh(rig.resume_cmd(CODEX, &name, "RECALL", &[])));
    assert_eq!(code, 0, "{second}\n{stderr}");
    assert!(
        second["result"]
            .as_str()
            .unwrap_or("")
            .contains("You told me to remember papaya-17"),
        "{second}"
    );
}
