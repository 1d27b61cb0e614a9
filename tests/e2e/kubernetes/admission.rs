//! `--per-account` on Kubernetes (issue 55): one account's turns in flight are capped across
//! hosts, not only across one host's processes. Two caw-box "hosts" (two data directories:
//! they share nothing but the cluster) each start two codex sessions of one account with
//! `--per-account 1`; the stub pod holds each turn's request (`HOLD:`) until the test lets it
//! go, so its count of held requests is the number of turns in flight: never more than one.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::{json_of, result_text, turn_cmd, Lab};
use crate::common::*;

/// The `HOLD:` names of this check held at the stub now, with how many requests each holds.
fn held(stub: &StubControl) -> Vec<(String, u64)> {
    let mut held = stub.held();
    held.retain(|(name, _)| name.starts_with("acct"));
    held
}

/// Who holds the account's one slot, as its Lease says (empty: no one).
fn slot_holder(lab: &Lab) -> String {
    let holder = lab.kubectl_ok(&[
        "get",
        "lease",
        "caw-box-slot-codex-unstored-0",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    holder.trim().to_string()
}

/// Four sessions of one account from two hosts, `--per-account 1`: one turn at a time at
/// the stub, the slot a Lease in the namespace, every turn done, and the Lease free after.
pub(super) fn one_accounts_turns_across_hosts(
    lab: &Lab,
    endpoint: &str,
    workspace: &Path,
) -> AcrossHosts {
    check("--per-account 1 across two hosts' caw-box: one turn in flight at a time");
    // After the removals before it: new claims bind once the lab's provisioner caught up.
    lab.settle();
    let hosts = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let stub = StubControl::Http(endpoint.to_string());
    let mut children: Vec<_> = (0..4)
        .map(|i| {
            let mut c = turn_cmd(
                CODEX,
                hosts[i % 2].path(),
                workspace,
                lab,
                &["run", "--provider", CODEX.name, "--endpoint", endpoint],
            );
            c.args(["--model", CODEX.model.unwrap(), "--per-account", "1"])
                .arg(format!("HOLD:acct{i} REMEMBER:acct-{i}"))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            c.spawn().unwrap()
        })
        .collect();
    let mut released = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    while released.len() < 4 {
        let now = held(&stub);
        let total: u64 = now.iter().map(|(_, n)| n).sum();
        assert!(
            total <= 1,
            "more than one turn of the account in flight: {now:?}"
        );
        let Some((name, _)) = now.into_iter().next() else {
            // A run that ended before its turn was let go failed: say how.
            for (i, child) in children.iter_mut().enumerate() {
                let ended = child.try_wait().unwrap().is_some();
                if ended && !released.contains(&format!("acct{i}")) {
                    let mut said = String::new();
                    if let Some(mut err) = child.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut err, &mut said);
                    }
                    panic!("run {i} ended before its turn was let go: {said}");
                }
            }
            assert!(
                Instant::now() < deadline,
                "the account's turns stalled; released {released:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
            continue;
        };
        // The turn in flight holds the account's one slot shared by every host: a Lease.
        assert!(
            !slot_holder(lab).is_empty(),
            "the slot's Lease has no holder"
        );
        stub.release(&name);
        released.push(name);
    }
    let mut queued = 0;
    let mut ids: [Vec<String>; 2] = Default::default();
    for (i, child) in children.into_iter().enumerate() {
        let out = wait_with_deadline(child, Duration::from_secs(180));
        assert_eq!(out.status.code(), Some(0), "{i}: {}", stderr_of(&out));
        let r = json_of(&out);
        assert!(
            result_text(&r).contains(&format!("Noted: acct-{i}")),
            "{i}: {r}"
        );
        ids[i % 2].push(r["session_id"].as_str().unwrap().to_string());
        queued += stderr_of(&out).contains("queued: 1 turn(s) of account codex-unstored") as usize;
    }
    // Three waited; at least those of the other host waited on the Lease alone.
    assert!(queued >= 2, "{queued} of 4 said they were queued");
    // Released as each turn was recorded.
    let holder = slot_holder(lab);
    assert!(holder.is_empty(), "still held by {holder}");
    AcrossHosts { hosts, ids }
}

/// The check's two hosts (data directories) and each one's sessions, kept until the test
/// removes them with its own: a removal here would have the lab's provisioner deleting
/// volumes while the test's next sessions wait for theirs.
pub(super) struct AcrossHosts {
    hosts: [tempfile::TempDir; 2],
    ids: [Vec<String>; 2],
}

impl AcrossHosts {
    /// `rm` of each host's sessions, from that host.
    pub(super) fn remove(&self, lab: &Lab, workspace: &Path) {
        for (host, ids) in self.hosts.iter().zip(&self.ids) {
            let mut rm = super::caw_k8s(host.path(), workspace, lab);
            rm.arg("rm").args(ids);
            let out = crate::common::run(rm);
            assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
        }
    }
}
