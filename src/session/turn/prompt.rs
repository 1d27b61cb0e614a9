//! The cap on a turn's prompt: how large a prompt caw-box takes, and the refusal of a larger
//! one before anything is made for its turn.
//!
//! A prompt never rides on a command line (Linux takes at most 128 KiB in one argument, and
//! a turn would fail inside its container after its session exists): each adapter hands it
//! to its CLI on stdin, which the entrypoint feeds from the turn's runtime files. What bounds
//! it is where it is kept: in memory on the way, in the runtime files (a pod's memory on
//! Kubernetes), in the session's record with every turn, and in the CLI's own conversation.
//! Not here: reading the prompt (`settings::resolve_prompt`), or how each CLI gets it (the
//! adapters in `provider/`).

use crate::error::{Error, Result};

/// The largest prompt a turn takes, in bytes of UTF-8: 1 MiB.
pub const MAX_TURN_PROMPT_BYTES: usize = 1024 * 1024;

/// Refuses a prompt of `len` bytes over [`MAX_TURN_PROMPT_BYTES`]: a usage error (exit 2) saying
/// its size, the cap and what to do instead.
pub fn check_prompt_size(len: usize) -> Result<()> {
    if len <= MAX_TURN_PROMPT_BYTES {
        return Ok(());
    }
    Err(Error::usage(format!(
        "the prompt is {len} bytes ({}), over the cap of {MAX_TURN_PROMPT_BYTES} bytes ({})",
        size(len),
        size(MAX_TURN_PROMPT_BYTES)
    ))
    .with_hint("put the text in a file in the workspace and ask the agent to read it"))
}

/// `bytes` for a reader: in KiB or MiB, one decimal where it is not whole.
fn size(bytes: usize) -> String {
    let (value, unit) = if bytes >= 1024 * 1024 {
        (bytes as f64 / (1024.0 * 1024.0), "MiB")
    } else {
        (bytes as f64 / 1024.0, "KiB")
    };
    if value.fract() == 0.0 {
        format!("{value} {unit}")
    } else {
        format!("{value:.1} {unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn a_prompt_up_to_the_cap_passes_and_one_byte_more_is_a_usage_error() {
        assert!(check_prompt_size(0).is_ok());
        assert!(check_prompt_size(MAX_TURN_PROMPT_BYTES).is_ok());
        let e = check_prompt_size(MAX_TURN_PROMPT_BYTES + 1).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Usage);
        assert_eq!(e.exit_code(), 2);
        assert_eq!(
            e.to_string(),
            "the prompt is 1048577 bytes (1.0 MiB), over the cap of 1048576 bytes (1 MiB); \
             put the text in a file in the workspace and ask the agent to read it"
        );
    }

    #[test]
    fn sizes_read_in_kib_or_mib() {
        assert_eq!(size(512 * 1024), "512 KiB");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(3 * 1024 * 1024 + 1), "3.0 MiB");
    }
}
