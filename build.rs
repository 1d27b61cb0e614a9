//! Lays out the release `caw-box` binary's code by use: the functions a turn runs
//! (scripts/hot-functions.txt, made by scripts/hot-functions.sh from a profile of real turns)
//! go first, together, so a turn pages in about 2 of the 13 MB of code rather than 8 (the
//! kernel maps a file's pages 64 KiB around each one touched, and the functions a turn runs
//! are spread over the whole binary otherwise). A Docker turn's peak RSS: 6.5 MiB, against
//! 12.9 without (`make bench`). Names the file no longer matches are left where they were:
//! a stale list costs memory, not correctness, and `make bench` shows it.
//!
//! Only where the linker is LLD, which takes `--symbol-ordering-file`: rustc's default for
//! x86_64-unknown-linux-gnu since 1.90, when no other linker is configured.

use std::process::Command;

const LIST: &str = "scripts/hot-functions.txt";

fn main() {
    println!("cargo:rerun-if-changed={LIST}");
    println!("cargo:rerun-if-changed=build.rs");
    let release = std::env::var("PROFILE").is_ok_and(|p| p == "release");
    let list = std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap()).join(LIST);
    if release && list.is_file() && default_linker_is_lld() {
        println!(
            "cargo:rustc-link-arg-bin=caw-box=-Wl,--symbol-ordering-file={}",
            list.display()
        );
        // The list's names of functions this build does not have (changed since the list
        // was made, or of another platform) are expected, not worth a warning each.
        println!("cargo:rustc-link-arg-bin=caw-box=-Wl,--no-warn-symbol-ordering");
    }
}

/// Whether this build links with rustc's own LLD: x86_64 Linux (GNU), rustc 1.90 or later,
/// and no linker or linker flavour configured.
fn default_linker_is_lld() -> bool {
    let target = std::env::var("TARGET").unwrap_or_default();
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    if target != "x86_64-unknown-linux-gnu"
        || std::env::var_os("RUSTC_LINKER").is_some()
        || flags.contains("linker")
        || flags.contains("fuse-ld")
    {
        return false;
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let Ok(out) = Command::new(rustc).arg("-V").output() else {
        return false;
    };
    // "rustc 1.95.0 (59807616e 2026-04-14)"
    let version = String::from_utf8_lossy(&out.stdout);
    let mut numbers = version
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .split(['.', '-'])
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let (major, minor) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    (major, minor) >= (1, 90)
}
