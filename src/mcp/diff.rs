//! `diff`: a session's patch as text an orchestrating model reads and `git apply` takes,
//! bounded by `max_bytes`.
//!
//! The patch is the bytes `caw-box diff --patch` writes and `apply` applies
//! ([`crate::session::patch`] makes it UTF-8: a file that is not gets a binary hunk), so the
//! first text block of the answer is exactly it, whole or, past `max_bytes`, cut where a file
//! (else a line, else a character) begins. What the answer says about it (its size, whether
//! it was cut, the files changed) is the structured content; a cut answer adds a second text
//! block saying how to get the rest.

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::json;

use super::read::patch_of;
use crate::client::Client;
use crate::error::{Error, Result};

/// The most of the patch `diff` returns unless asked otherwise (1 MiB).
pub const DEFAULT_MAX_BYTES: usize = 1 << 20;
/// The most `max_bytes` may ask for (16 MiB); a longer patch is for `caw-box diff --patch`.
pub const MAX_MAX_BYTES: usize = 16 << 20;

/// Where a patch is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Not cut: it fits.
    Whole,
    /// Before the first file that does not fit.
    File,
    /// Its first file alone does not fit: after the last whole line that does.
    Line,
    /// Its first line alone does not fit: after the last whole character that does.
    Character,
}

/// The longest head of `patch` of at most `max` bytes that ends where a file begins, else
/// where a line does, else between characters (never inside one).
pub fn cut(patch: &str, max: usize) -> (&str, Cut) {
    if patch.len() <= max {
        return (patch, Cut::Whole);
    }
    // A file's section starts a line with `diff --git `; no other line of a patch can (a
    // hunk's lines start with ' ', '+', '-' or '\', a binary hunk's are base85, no space).
    let file = patch
        .match_indices("\ndiff --git ")
        .map(|(at, _)| at + 1)
        .take_while(|&end| end <= max)
        .last();
    if let Some(end) = file {
        return (&patch[..end], Cut::File);
    }
    if let Some(nl) = patch.as_bytes()[..max].iter().rposition(|b| *b == b'\n') {
        return (&patch[..=nl], Cut::Line);
    }
    let mut end = max;
    while !patch.is_char_boundary(end) {
        end -= 1;
    }
    (&patch[..end], Cut::Character)
}

/// `max_bytes` as given, checked: 1 to [`MAX_MAX_BYTES`], [`DEFAULT_MAX_BYTES`] when absent.
fn max_bytes(asked: Option<usize>) -> Result<usize> {
    match asked {
        None => Ok(DEFAULT_MAX_BYTES),
        Some(n) if (1..=MAX_MAX_BYTES).contains(&n) => Ok(n),
        Some(n) => Err(Error::usage(format!(
            "max_bytes must be 1 to {MAX_MAX_BYTES}, not {n}"
        ))),
    }
}

/// The tool's answer: the patch (or its head) as the first text block; `session_id`,
/// `bytes` (the whole patch), `returned_bytes`, `truncated`, `files_changed` and
/// `protected_left_out` as structured content; when cut, a second block saying so.
pub async fn diff(target: &str, asked: Option<usize>) -> Result<CallToolResult> {
    let max = max_bytes(asked)?;
    let client = Client::connect().await?;
    let (view, made) = patch_of(&client, target).await?;
    let id = view.facts.session_id;
    let text = made.text().map_err(|e| {
        e.with_hint(format!(
            "`caw-box diff {id} --patch FILE` writes it as bytes; `apply` applies it as well"
        ))
    })?;
    let (head, how) = cut(text, max);
    let truncated = how != Cut::Whole;
    let meta = json!({
        "session_id": id.to_string(),
        "bytes": text.len(),
        "returned_bytes": head.len(),
        "truncated": truncated,
        "files_changed": made.files,
        "protected_left_out": made.protected,
    });
    let mut blocks = vec![ContentBlock::text(head)];
    if truncated {
        blocks.push(ContentBlock::text(truncation_note(
            &id.to_string(),
            head.len(),
            text.len(),
            how,
        )));
    }
    let mut answer = CallToolResult::success(blocks);
    answer.structured_content = Some(meta);
    Ok(answer)
}

fn truncation_note(session: &str, returned: usize, bytes: usize, how: Cut) -> String {
    let whole = match how {
        Cut::File => "whole files",
        Cut::Line => "whole lines of its first file",
        Cut::Character | Cut::Whole => "the start of its first line",
    };
    let rest = if bytes <= MAX_MAX_BYTES {
        format!("call `diff` again with max_bytes {bytes} for all of it")
    } else {
        format!(
            "it is longer than `diff` returns ({MAX_MAX_BYTES} bytes): `caw-box diff {session} \
             --patch FILE` writes all of it"
        )
    };
    format!(
        "[truncated: the patch is {bytes} bytes; above are its first {returned} ({whole}). To \
         read the rest, {rest}. `apply` applies the whole patch either way.]"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATCH: &str = "diff --git a/a.txt b/a.txt\n\
        --- a/a.txt\n\
        +++ b/a.txt\n\
        @@ -1 +1 @@\n\
        -old\n\
        +caf\u{e9} \u{65e5}\u{672c}\n\
        diff --git a/b.txt b/b.txt\n\
        --- a/b.txt\n\
        +++ b/b.txt\n\
        @@ -1 +1 @@\n\
        -x diff --git a/c b/c\n\
        +y\n";

    #[test]
    fn a_patch_that_fits_is_whole() {
        assert_eq!(cut(PATCH, PATCH.len()), (PATCH, Cut::Whole));
        assert_eq!(cut("", 1), ("", Cut::Whole));
    }

    #[test]
    fn a_cut_falls_where_a_file_begins_else_a_line_else_a_character() {
        let second = PATCH.find("diff --git a/b.txt").unwrap();
        // Anywhere from the second file's start to just before the end: the first file.
        for max in [second, second + 5, PATCH.len() - 1] {
            assert_eq!(cut(PATCH, max), (&PATCH[..second], Cut::File), "{max}");
        }
        // Inside the first file: whole lines; `diff --git` inside a hunk's line is no file.
        let (head, how) = cut(PATCH, 30);
        assert_eq!((head, how), ("diff --git a/a.txt b/a.txt\n", Cut::Line));
        // Inside the first line: whole characters, never half of `é`.
        let line = "+caf\u{e9}\u{e9}";
        for max in 1..line.len() {
            let (head, how) = cut(line, max);
            assert_eq!(how, Cut::Character);
            assert!(
                head.len() <= max && line.starts_with(head),
                "{max}: {head:?}"
            );
            assert!(
                head.len() + 1 >= max,
                "{max}: {head:?} is shorter than it need be"
            );
        }
        assert_eq!(cut(line, 5), ("+caf", Cut::Character));
    }

    #[test]
    fn every_cut_is_a_head_of_at_most_max_bytes() {
        for max in 1..=PATCH.len() {
            let (head, _) = cut(PATCH, max);
            assert!(head.len() <= max && PATCH.starts_with(head), "{max}");
        }
    }

    #[test]
    fn max_bytes_has_a_default_and_a_ceiling() {
        assert_eq!(max_bytes(None).unwrap(), DEFAULT_MAX_BYTES);
        assert_eq!(max_bytes(Some(1)).unwrap(), 1);
        assert_eq!(max_bytes(Some(MAX_MAX_BYTES)).unwrap(), MAX_MAX_BYTES);
        for bad in [0, MAX_MAX_BYTES + 1] {
            let e = max_bytes(Some(bad)).unwrap_err();
            assert_eq!(e.kind, crate::error::ErrorKind::Usage, "{e:?}");
        }
    }

    #[test]
    fn the_schema_tells_a_client_the_bounds() {
        let schema =
            serde_json::to_value(schemars::schema_for!(super::super::args::DiffArgs)).unwrap();
        let max_bytes = &schema["properties"]["max_bytes"];
        assert_eq!(max_bytes["minimum"], 1);
        assert_eq!(max_bytes["maximum"], MAX_MAX_BYTES);
        let said = max_bytes["description"].as_str().unwrap();
        assert!(said.contains(&DEFAULT_MAX_BYTES.to_string()), "{said}");
        assert!(said.contains(&MAX_MAX_BYTES.to_string()), "{said}");
    }

    #[test]
    fn the_note_says_how_to_get_the_rest() {
        let note = truncation_note("s1", 100, 5000, Cut::File);
        assert!(note.contains("5000 bytes") && note.contains("first 100 (whole files)"));
        assert!(note.contains("max_bytes 5000"), "{note}");
        let huge = truncation_note("s1", 100, MAX_MAX_BYTES + 1, Cut::Line);
        assert!(huge.contains("caw-box diff s1 --patch FILE"), "{huge}");
    }
}
