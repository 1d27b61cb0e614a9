//! A turn's admission ([`super::admission`]): what the session asks of its account's
//! slots and park, and what a turn that has to wait says of it on stderr.

use std::time::Duration;

use crate::backend::Backend;
use crate::error::Result;
use crate::session::store::record::SessionRecord;
use crate::session::turn::admission::{job_path, Accounts, Admitted, Waiting, Want};

/// Waits for a slot of the account this turn spends, where the session caps its account's
/// turns in flight (`--per-account`), and for the account's park to end, where the session
/// parks at a usage limit (`--on-limit park`), saying on stderr what it waits for.
pub(in crate::session) async fn for_turn(
    backend: &impl Backend,
    record: &SessionRecord,
) -> Result<Option<Admitted>> {
    let (cap, park) = (record.settings.per_account, record.settings.park);
    if cap.is_none() && !park {
        return Ok(None);
    }
    let p = record.provider;
    let account = crate::auth::account::spent_by(p);
    let want = Want {
        account: &account,
        cap,
        park,
    };
    let told = |waiting| crate::output::eprintln(&waiting_line(&account, cap, waiting));
    let shared = |cap| backend.try_account_slot(&account, cap);
    let admitted = Accounts::here()?
        .admit(want, record.session_id, record.next_turn(), told, shared)
        .await?;
    // Admitted: a driver that dies now leaves a turn in flight, not in a queue.
    if let Ok(job) = job_path(record.session_id) {
        let _ = std::fs::remove_file(job);
    }
    Ok(Some(admitted))
}

/// What a turn that waits says of it.
fn waiting_line(account: &str, cap: Option<u32>, waiting: Waiting) -> String {
    match waiting {
        Waiting::InLine(place) => {
            let cap = cap.unwrap_or(0);
            format!(
                "queued: {cap} turn(s) of account {account} in flight (--per-account {cap}); this one is {} in line",
                ordinal(place)
            )
        }
        Waiting::Parked(until) => {
            let left = until.saturating_sub(crate::clock::now_secs());
            format!(
                "parked: account {account} met its usage limit; this turn starts when it resets, in {} (--on-limit park)",
                humantime::format_duration(Duration::from_secs(left))
            )
        }
    }
}

/// "1st", "2nd", "3rd", "4th", "11th".
fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}
