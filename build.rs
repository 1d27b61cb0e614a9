//! Lays out the release `caw-box` binary's code by use: the functions a turn runs
//! (scripts/hot-functions.txt, made by scripts/hot-functions.sh from a profile of real turns
//! of the shipped binary) go first, together, so a turn pages in about 2 of the 13 MB of code
//! rather than 8 (the kernel maps a file's pages 64 KiB around each one touched, and the
//! functions a turn runs are spread over the whole binary otherwise). A Docker turn's peak
//! RSS: 6.5 MiB, against 12.9 without (`make bench`). Names the file no longer matches are
//! left where they were: a stale list costs memory, not correctness, and the dist stage's
//! check (`scripts/hot-functions.sh --check`) fails on it.
//!
//! Only where the linker is LLD, which takes `--symbol-ordering-file`:
//! - x86_64-unknown-linux-gnu: rustc's default linker since 1.90, when no other linker is
//!   configured;
//! - x86_64-unknown-linux-musl, the static binary a release ships (`make dist`): linked by
//!   the C compiler driver, told here to use the `ld.lld` rustc ships (its `gcc-ld`
//!   directory, as rustc does itself for the gnu target).

use std::path::PathBuf;
use std::process::Command;

const LIST: &str = "scripts/hot-functions.txt";

fn main() {
    println!("cargo:rerun-if-changed={LIST}");
    println!("cargo:rerun-if-changed=build.rs");
    let release = std::env::var("PROFILE").is_ok_and(|p| p == "release");
    let list = std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap()).join(LIST);
    if !release || !list.is_file() || linker_configured() || !rustc_at_least(1, 90) {
        return;
    }
    let target = std::env::var("TARGET").unwrap_or_default();
    match target.as_str() {
        "x86_64-unknown-linux-gnu" => {}
        "x86_64-unknown-linux-musl" => {
            let Some(gcc_ld) = rust_lld_dir() else { return };
            println!("cargo:rustc-link-arg-bin=caw-box=-fuse-ld=lld");
            println!("cargo:rustc-link-arg-bin=caw-box=-B{}", gcc_ld.display());
        }
        _ => return,
    }
    println!(
        "cargo:rustc-link-arg-bin=caw-box=-Wl,--symbol-ordering-file={}",
        list.display()
    );
    // The list's names of functions this build does not have (changed since the list was
    // made) are not worth a warning each: `scripts/hot-functions.sh --check` counts them.
    println!("cargo:rustc-link-arg-bin=caw-box=-Wl,--no-warn-symbol-ordering");
}

/// Whether a linker or linker flavour is configured (then it is not ours to choose).
fn linker_configured() -> bool {
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    std::env::var_os("RUSTC_LINKER").is_some()
        || flags.contains("linker")
        || flags.contains("fuse-ld")
}

/// The directory of the `ld.lld` that rustc ships for the host (rustup's `rustc` component):
/// `-B` it, and `cc -fuse-ld=lld` links with it.
fn rust_lld_dir() -> Option<PathBuf> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()?;
    let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let host = std::env::var("HOST").ok()?;
    let dir = PathBuf::from(sysroot).join(format!("lib/rustlib/{host}/bin/gcc-ld"));
    dir.join("ld.lld").is_file().then_some(dir)
}

/// Whether rustc is at least `major.minor` (LLD is the gnu target's default from 1.90).
fn rustc_at_least(major: u32, minor: u32) -> bool {
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
    (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0)) >= (major, minor)
}
