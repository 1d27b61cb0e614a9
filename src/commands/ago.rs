//! Times in words, as `ls`, `show` and `auth status` print them: how long ago, how long left.

use crate::clock::now_secs;

/// "warm 4m": how long an idle warm container has left, until `until`.
pub(super) fn warm_left(until: u64) -> String {
    let d = until.saturating_sub(now_secs());
    match d {
        0..=59 => format!("warm {d}s"),
        60..=3599 => format!("warm {}m", d / 60),
        _ => format!("warm {}h", d / 3600),
    }
}

/// "3m ago", "2h ago", "just now".
pub fn ago(secs: u64) -> String {
    let d = now_secs().saturating_sub(secs);
    match d {
        0..=4 => "just now".to_string(),
        5..=59 => format!("{d}s ago"),
        60..=3599 => format!("{}m ago", d / 60),
        3600..=86399 => format!("{}h ago", d / 3600),
        _ => format!("{}d ago", d / 86400),
    }
}
