//! The files a patch changes, as git counts them: `git diff --numstat -z` read, so that a
//! path comes exactly as git has it (no quoting to undo, a space or ` b/` in it no problem),
//! a renamed file under its new name, a binary one as binary. Not the patch itself
//! ([`super::patch`]), which is never parsed for this.

use serde::Serialize;

/// One file of a patch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileChange {
    /// The path after the change (a renamed file's new name). A name that is not UTF-8 has
    /// its bad bytes replaced by U+FFFD here; the patch carries it exactly.
    pub path: String,
    /// A renamed file's old path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renamed_from: Option<String>,
    /// Lines added; `None` (null) for a binary file.
    pub added: Option<u64>,
    /// Lines removed; `None` (null) for a binary file.
    pub removed: Option<u64>,
    /// The patch carries the file as a binary hunk (git saw a NUL, or its content is not
    /// UTF-8: see [`super::patch`]).
    pub binary: bool,
}

/// The records of `git diff --numstat -z`: `ADDED\tREMOVED\tPATH\0`, a rename as
/// `ADDED\tREMOVED\t\0OLD\0NEW\0`, a binary file with `-` for both counts. A record it
/// cannot read ends the list (git writes none such).
pub fn parse(numstat: &[u8]) -> Vec<FileChange> {
    let name = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let mut fields = numstat.split(|b| *b == 0);
    let mut files = Vec::new();
    while let Some(record) = fields.next().filter(|r| !r.is_empty()) {
        let mut parts = record.splitn(3, |b| *b == b'\t');
        let (Some(added), Some(removed), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            break;
        };
        let count = |c: &[u8]| std::str::from_utf8(c).ok()?.parse::<u64>().ok();
        let (path, renamed_from) = if path.is_empty() {
            let (Some(old), Some(new)) = (fields.next(), fields.next().filter(|n| !n.is_empty()))
            else {
                break;
            };
            (name(new), Some(name(old)))
        } else {
            (name(path), None)
        };
        let binary = added == b"-" && removed == b"-";
        files.push(FileChange {
            path,
            renamed_from,
            added: count(added),
            removed: count(removed),
            binary,
        });
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(path: &str, added: u64, removed: u64) -> FileChange {
        FileChange {
            path: path.into(),
            renamed_from: None,
            added: Some(added),
            removed: Some(removed),
            binary: false,
        }
    }

    #[test]
    fn paths_come_as_git_has_them_renames_under_the_new_name_binaries_without_counts() {
        let numstat = "2\t1\tkeep.txt\0\
            1\t0\t\u{e9} b/x.txt\0\
            0\t0\t\0move-me.txt\0a b/moved.txt\0\
            -\t-\tblob.bin\0\
            3\t0\tnew\nline \"quoted\"\0";
        let mut with_bad_name = numstat.as_bytes().to_vec();
        with_bad_name.extend_from_slice(b"-\t-\tcaf\xe9.txt\0");
        assert_eq!(
            parse(&with_bad_name),
            vec![
                text("keep.txt", 2, 1),
                text("\u{e9} b/x.txt", 1, 0),
                FileChange {
                    renamed_from: Some("move-me.txt".into()),
                    ..text("a b/moved.txt", 0, 0)
                },
                FileChange {
                    path: "blob.bin".into(),
                    renamed_from: None,
                    added: None,
                    removed: None,
                    binary: true
                },
                text("new\nline \"quoted\"", 3, 0),
                FileChange {
                    path: "caf\u{fffd}.txt".into(),
                    renamed_from: None,
                    added: None,
                    removed: None,
                    binary: true
                },
            ]
        );
    }

    #[test]
    fn nothing_or_a_cut_record_gives_what_was_whole() {
        assert!(parse(b"").is_empty());
        assert_eq!(
            parse(b"1\t1\ta.txt\x000\t0\t\0old\0"),
            vec![text("a.txt", 1, 1)],
            "a rename without its new name"
        );
        assert_eq!(parse(b"1\t1\ta.txt\0garbage\0"), vec![text("a.txt", 1, 1)]);
    }

    #[test]
    fn it_serializes_as_the_tools_answer_it() {
        let moved = FileChange {
            renamed_from: Some("old.txt".into()),
            ..text("new.txt", 1, 2)
        };
        assert_eq!(
            serde_json::to_value(&moved).unwrap(),
            serde_json::json!({"path": "new.txt", "renamed_from": "old.txt", "added": 1, "removed": 2, "binary": false})
        );
        let blob = FileChange {
            path: "b.bin".into(),
            renamed_from: None,
            added: None,
            removed: None,
            binary: true,
        };
        assert_eq!(
            serde_json::to_value(&blob).unwrap(),
            serde_json::json!({"path": "b.bin", "added": null, "removed": null, "binary": true})
        );
    }
}
