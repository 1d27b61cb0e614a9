#!/usr/bin/env python3
"""The project's snapshot of the RustSec advisory database (deny/advisory-db/), for
`cargo deny check advisories` (scripts/deny.sh) on machines that cannot reach GitHub.

  scripts/advisory-db.py refresh FULL_DB   take the advisories of every crate named in
                                            Cargo.lock or python/Cargo.lock from a checkout of
                                            rustsec/advisory-db, and its crate list
  scripts/advisory-db.py covers            fail when a crate of a lock file has advisories in
                                            the snapshot's source but not in the copy (a new
                                            dependency since the last refresh); print its age
  scripts/advisory-db.py assemble DIR      make DIR a git repository holding the copy, its
                                            commit dated as the snapshot's source, as
                                            cargo-deny opens a database it may not fetch

What the copy is: deny/advisory-db/crates/<crate>/*.md, the source's files unchanged, for the
crates of our lock files only; SNAPSHOT, the source's commit and date; all-crates.txt, every
crate the source has an advisory for, so `covers` can tell a crate with none from one the copy
left out. Not a mirror of the whole database: a crate added to a lock file needs a refresh
when the source has advisories for it, which `covers` (run by `make lint`) says.
"""

import datetime
import os
import shutil
import subprocess
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COPY = os.path.join(ROOT, "deny", "advisory-db")
LOCKS = ["Cargo.lock", os.path.join("python", "Cargo.lock")]
# cargo-deny's own `maximum-db-staleness` is not what holds the age (deny.toml says why);
# past this many days `covers` says the snapshot is stale, on every `make lint`.
STALE_DAYS = 90


def say(msg):
    print(f"advisory-db: {msg}", file=sys.stderr)


def lock_crates():
    names = set()
    for lock in LOCKS:
        with open(os.path.join(ROOT, lock), "rb") as f:
            for package in tomllib.load(f).get("package", []):
                # Registry crates only: the workspace's own (no source) have no advisories.
                if package.get("source", "").startswith("registry+"):
                    names.add(package["name"])
    return names


def read_snapshot():
    meta = {}
    with open(os.path.join(COPY, "SNAPSHOT")) as f:
        for line in f:
            if "=" in line and not line.startswith("#"):
                key, value = line.split("=", 1)
                meta[key.strip()] = value.strip()
    return meta


def refresh(full):
    crates_dir = os.path.join(full, "crates")
    if not os.path.isdir(crates_dir):
        sys.exit(f"advisory-db: {full} has no crates/: not a checkout of rustsec/advisory-db")
    git = ["git", "-C", full, "log", "-1", "--format=%H %cI"]
    commit, date = subprocess.run(git, check=True, capture_output=True, text=True).stdout.split()
    available = sorted(os.listdir(crates_dir))
    wanted = lock_crates()
    shutil.rmtree(os.path.join(COPY, "crates"), ignore_errors=True)
    taken = 0
    for name in available:
        if name not in wanted:
            continue
        shutil.copytree(os.path.join(crates_dir, name), os.path.join(COPY, "crates", name))
        taken += len([f for f in os.listdir(os.path.join(crates_dir, name)) if f.endswith(".md")])
    with open(os.path.join(COPY, "all-crates.txt"), "w") as f:
        f.write("".join(n + "\n" for n in available))
    today = datetime.date.today().isoformat()
    with open(os.path.join(COPY, "SNAPSHOT"), "w") as f:
        f.write(
            "# The RustSec advisory database this copy was taken from (scripts/advisory-db.py).\n"
            f"source = https://github.com/rustsec/advisory-db\ncommit = {commit}\n"
            f"date = {date}\nrefreshed = {today}\n"
        )
    # deny.toml names the snapshot in use too.
    config = os.path.join(ROOT, "deny.toml")
    with open(config) as f:
        lines = f.read().split("\n")
    marker = "# Snapshot in use: "
    lines = [
        f"{marker}rustsec/advisory-db {commit[:12]} of {date[:10]} (taken {today})."
        if line.startswith(marker) else line
        for line in lines
    ]
    with open(config, "w") as f:
        f.write("\n".join(lines))
    say(f"{taken} advisories of {len(wanted & set(available))} crates from {commit[:12]} ({date})")


def covers():
    meta = read_snapshot()
    with open(os.path.join(COPY, "all-crates.txt")) as f:
        available = {line.strip() for line in f if line.strip()}
    copied = set(os.listdir(os.path.join(COPY, "crates")))
    missing = sorted((lock_crates() & available) - copied)
    if missing:
        say(
            "the snapshot's source has advisories for crates of the lock files that the copy "
            f"left out: {', '.join(missing)}; run scripts/advisory-db.py refresh FULL_DB "
            "(CONTRIBUTING.md, \"Advisories and licences\")"
        )
        sys.exit(1)
    date = datetime.datetime.fromisoformat(meta["date"])
    age = (datetime.datetime.now(datetime.timezone.utc) - date).days
    state = f"stale (over {STALE_DAYS} days): refresh it" if age > STALE_DAYS else "fresh"
    say(f"snapshot of {meta['date'][:10]} ({meta['commit'][:12]}), {age} days old, {state}")


def assemble(dest):
    meta = read_snapshot()
    if os.path.exists(dest):
        shutil.rmtree(dest)
    shutil.copytree(os.path.join(COPY, "crates"), os.path.join(dest, "crates"))
    env = dict(os.environ, GIT_AUTHOR_DATE=meta["date"], GIT_COMMITTER_DATE=meta["date"])
    env.update(GIT_AUTHOR_NAME="caw-box", GIT_AUTHOR_EMAIL="caw-box@localhost")
    env.update(GIT_COMMITTER_NAME="caw-box", GIT_COMMITTER_EMAIL="caw-box@localhost")
    run = lambda *args: subprocess.run(["git", "-C", dest, *args], check=True, env=env,
                                       stdout=subprocess.DEVNULL)
    run("init", "-q", "-b", "main")
    run("add", "-A")
    run("commit", "-q", "--no-gpg-sign", "-m", f"rustsec/advisory-db {meta['commit']}")
    # cargo-deny dates a database it may not fetch by the newer of its HEAD commit and its
    # .git/HEAD file's mtime: the file gets the commit's date, so the age it sees is the
    # snapshot's, not this copy's.
    stamp = datetime.datetime.fromisoformat(meta["date"]).timestamp()
    os.utime(os.path.join(dest, ".git", "HEAD"), (stamp, stamp))


def main():
    args = sys.argv[1:]
    if args[:1] == ["refresh"] and len(args) == 2:
        refresh(args[1])
    elif args == ["covers"]:
        covers()
    elif args[:1] == ["assemble"] and len(args) == 2:
        assemble(args[1])
    else:
        sys.exit("usage: scripts/advisory-db.py refresh FULL_DB | covers | assemble DIR")


if __name__ == "__main__":
    main()
