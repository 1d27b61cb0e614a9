//! Docker's API version as last negotiated with a daemon, kept for a day.
//!
//! Negotiating asks `GET /version`, for which the daemon runs `runc --version`: about 8 ms
//! before every command, a visible share of a short turn. With a cached version, a
//! versioned `GET /_ping` (well under a millisecond) both checks that the daemon answers
//! and that it still accepts that version (it answers 400 to one too new or too old), so a
//! daemon upgraded or downgraded meanwhile only costs one renegotiation. (bollard 0.21
//! drops the version from request paths, so the daemon answers at its own version anyway;
//! the cache keeps caw-box right if that changes.)
//!
//! The entry also says whether the daemon is Podman's service (asked with the same
//! `GET /version` when negotiating): turns ask that on their critical path.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use bollard::ClientVersion;

const FILE: &str = "docker-api-version";
const MAX_AGE: Duration = Duration::from_secs(24 * 3600);

fn path() -> Option<PathBuf> {
    crate::dirs::data_dir().ok().map(|d| d.join(FILE))
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What the cache knows of a daemon.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Known {
    pub version: ClientVersion,
    /// Whether it is Podman's service.
    pub podman: bool,
}

/// One line of the cache file, "HOST MAJOR.MINOR SAVED_AT docker|podman" (seconds since
/// the epoch). An older caw-box's line, without the engine, is no entry: negotiate again.
fn entry(line: &str) -> Option<(&str, Known, u64)> {
    let (rest, engine) = line.rsplit_once(' ')?;
    let podman = match engine {
        "podman" => true,
        "docker" => false,
        _ => return None,
    };
    let (rest, saved_at) = rest.rsplit_once(' ')?;
    let (host, v) = rest.rsplit_once(' ')?;
    let (major, minor) = v.split_once('.')?;
    let version = ClientVersion {
        major_version: major.parse().ok()?,
        minor_version: minor.parse().ok()?,
    };
    Some((host, Known { version, podman }, saved_at.parse().ok()?))
}

/// What the cache file knows of `host`, if it was saved less than a day before `now`.
pub(super) fn parse(contents: &str, host: &str, now: u64) -> Option<Known> {
    contents.lines().find_map(|line| {
        let (h, known, saved_at) = entry(line)?;
        (h == host && now.saturating_sub(saved_at) <= MAX_AGE.as_secs()).then_some(known)
    })
}

/// The cache file with `host`'s entry set to `known` as of `now`; other hosts' entries kept.
pub(super) fn updated(contents: &str, host: &str, known: &Known, now: u64) -> String {
    let mut out: String = contents
        .lines()
        .filter(|l| entry(l).is_some_and(|(h, _, _)| h != host))
        .map(|l| format!("{l}\n"))
        .collect();
    let v = &known.version;
    out.push_str(&format!(
        "{host} {}.{} {now} {}\n",
        v.major_version,
        v.minor_version,
        if known.podman { "podman" } else { "docker" }
    ));
    out
}

pub(super) fn load(host: &str) -> Option<Known> {
    parse(&std::fs::read_to_string(path()?).ok()?, host, now())
}

/// Best effort: without the cache, the next command negotiates again.
pub(super) fn store(host: &str, known: &Known) {
    let Some(path) = path() else { return };
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    if let Err(e) =
        crate::dirs::write_private_unsynced(&path, updated(&old, host, known, now()).as_bytes())
    {
        tracing::debug!("could not cache Docker's API version: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::{parse, updated, Known};
    use bollard::ClientVersion;

    const HOST: &str = "unix:///var/run/docker.sock";

    fn v(major_version: usize, minor_version: usize) -> Known {
        Known {
            version: ClientVersion {
                major_version,
                minor_version,
            },
            podman: false,
        }
    }

    #[test]
    fn the_cache_says_which_engine_answers() {
        let now = 1_800_000_000;
        let podman = Known {
            podman: true,
            ..v(1, 41)
        };
        let file = updated("", HOST, &podman, now);
        assert_eq!(file, format!("{HOST} 1.41 {now} podman\n"));
        assert_eq!(parse(&file, HOST, now), Some(podman));
        // An older caw-box's entry, without the engine: negotiate (and so learn it) again.
        assert_eq!(parse(&format!("{HOST} 1.43 {now}\n"), HOST, now), None);
    }

    #[test]
    fn the_api_version_cache_is_per_host() {
        let other = "unix:///run/user/1000/docker.sock";
        let now = 1_800_000_000;
        let file = updated("", HOST, &v(1, 41), now);
        assert_eq!(file, format!("{HOST} 1.41 {now} docker\n"));
        let file = updated(&file, other, &v(1, 47), now);
        assert_eq!(parse(&file, HOST, now), Some(v(1, 41)));
        assert_eq!(parse(&file, other, now), Some(v(1, 47)));
        // A host's new version replaces its entry and keeps the others.
        let file = updated(&file, HOST, &v(1, 44), now + 10);
        assert_eq!(parse(&file, HOST, now + 10), Some(v(1, 44)));
        assert_eq!(parse(&file, other, now + 10), Some(v(1, 47)));
        assert_eq!(file.lines().count(), 2);
    }

    #[test]
    fn each_entry_is_kept_for_a_day() {
        let other = "unix:///run/user/1000/docker.sock";
        let day = 24 * 3600;
        let file = updated("", other, &v(1, 47), 1000);
        let file = updated(&file, HOST, &v(1, 41), 1000 + day);
        assert_eq!(parse(&file, HOST, 1000 + day), Some(v(1, 41)));
        // Another host's refresh does not keep this one's entry alive.
        assert_eq!(parse(&file, other, 1000 + day), Some(v(1, 47)));
        assert_eq!(parse(&file, other, 1001 + day), None);
        assert_eq!(parse(&file, HOST, 1000 + 2 * day), Some(v(1, 41)));
        assert_eq!(parse(&file, HOST, 1001 + 2 * day), None);
    }

    #[test]
    fn a_damaged_api_version_cache_means_negotiate() {
        for junk in [
            "",
            "garbage",
            &format!("{HOST} 1"),
            &format!("{HOST} one.two 5"),
            &format!("{HOST} 1.41"),
            &format!("{HOST} 1.41 soon docker"),
            &format!("{HOST} 1.41 5 moby"),
        ] {
            assert_eq!(parse(junk, HOST, 5), None, "{junk:?}");
        }
        assert_eq!(parse(&format!("{HOST}x 1.41 5 docker"), HOST, 5), None);
    }
}
