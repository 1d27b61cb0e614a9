//! The resource limits of `run`/`resume` and config (`--memory`, `--cpus`, `--pids-limit`,
//! `--max-cost`, `--per-account`): each value checked where it was written, and applied to
//! a session's settings.

use crate::error::{Error, Result};
use crate::session::record::SessionSettings;

/// "2g", "512m", "1048576" into bytes; `what` names it in errors (`--memory`, a variable
/// or a config key).
pub fn parse_memory(s: &str, what: &str) -> Result<i64> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.strip_suffix('b').unwrap_or(&t);
    let (num, mult) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1i64 << 10),
        Some('m') => (&t[..t.len() - 1], 1 << 20),
        Some('g') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let bad =
        || Error::usage(format!("{what} '{s}' is not a size")).with_hint("use e.g. 512m or 2g");
    let n: f64 = num.parse().map_err(|_| bad())?;
    // `inf`, `nan` and `1e300g` parse as f64 but are no size Docker can take.
    let exact = n * mult as f64;
    if !exact.is_finite() || n <= 0.0 || exact >= i64::MAX as f64 {
        return Err(bad());
    }
    let bytes = exact as i64;
    if bytes < 6 << 20 {
        return Err(Error::usage(format!(
            "{what} '{s}' is below Docker's minimum of 6m"
        )));
    }
    Ok(bytes)
}

/// `--cpus`, `--max-cost`, `--pids-limit`, `--per-account`.
pub(super) fn apply_limits(
    settings: &mut SessionSettings,
    cpus: Option<f64>,
    max_cost: Option<f64>,
    pids_limit: Option<i64>,
    per_account: Option<i64>,
) -> Result<()> {
    if let Some(c) = cpus {
        check_cpus(c, "--cpus")?;
        settings.cpus = Some(c);
    }
    if let Some(c) = max_cost {
        check_max_cost(c, "--max-cost")?;
        settings.max_cost_usd = Some(c);
    }
    if let Some(p) = pids_limit {
        check_pids_limit(p, "--pids-limit")?;
        settings.pids_limit = Some(p);
    }
    if let Some(n) = per_account {
        settings.per_account = check_per_account(n, "--per-account")?;
    }
    Ok(())
}

pub fn check_cpus(c: f64, what: &str) -> Result<()> {
    if c <= 0.0 || !c.is_finite() {
        return Err(Error::usage(format!(
            "{what} {c} must be a positive number"
        )));
    }
    Ok(())
}

/// A spend limit: a positive amount of USD.
pub fn check_max_cost(c: f64, what: &str) -> Result<()> {
    if c <= 0.0 || !c.is_finite() {
        return Err(Error::usage(format!(
            "{what} {c} must be a positive amount of USD, e.g. 2.50"
        )));
    }
    Ok(())
}

pub fn check_pids_limit(p: i64, what: &str) -> Result<()> {
    if p < 16 {
        return Err(Error::usage(format!(
            "{what} {p} is too low for any CLI (use 64 or more)"
        )));
    }
    Ok(())
}

/// `--per-account N`: a whole number of turns, 0 for no cap (`None`).
pub fn check_per_account(n: i64, what: &str) -> Result<Option<u32>> {
    match u32::try_from(n) {
        Ok(0) => Ok(None),
        Ok(n) if n <= 1000 => Ok(Some(n)),
        _ => Err(Error::usage(format!(
            "{what} {n} must be a number of turns from 0 (no cap) to 1000"
        ))),
    }
}
