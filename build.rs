//! Link options for the `legate` binary.
//!
//! On Linux with glibc the binary is linked with packed relative relocations (`DT_RELR`). A
//! position-independent executable carries one relocation per pointer in its read-only data;
//! in the classic format that table is over 400 KB, which the dynamic loader reads in full at
//! every start, so its pages stay resident for the life of the process. Packed, it is about
//! 10 KB. Such a binary needs glibc 2.36 or later to start (Debian 12, the container image's
//! base); a linker that does not know the option warns and ignores it.
//!
//! A release build on x86_64 Linux, where rustc links with its own lld (Rust 1.90 and later),
//! also hands lld `link/symbol-order.txt`: the functions start-up and serving run, hottest
//! first, which lld places side by side at the start of the code. A fault on code maps the
//! 64 KiB around it, so the same functions scattered among code that never runs kept about
//! 6.7 MiB of the binary resident, against about 2.1 MiB packed. Symbol names carry hashes of
//! the profile, the compiler and the dependency versions, so the list (written by
//! `link/order.py`) holds the names of the `release` profile's build (the one that ships and
//! that the benchmark measures), and goes stale with a compiler or dependency update: a name
//! lld does not find is skipped without a warning, so a stale list costs memory, never a build.

use std::path::Path;
use std::process::Command;

const ORDER_FILE: &str = "link/symbol-order.txt";
const PROFILE_FILE: &str = "link/legate.profdata";

fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    let release = std::env::var("PROFILE").is_ok_and(|p| p == "release");
    let target = std::env::var("TARGET").unwrap_or_default();
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let order = Path::new(&dir).join(ORDER_FILE);
    if release && target == "x86_64-unknown-linux-gnu" && links_with_lld() && order.is_file() {
        println!(
            "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
    println!("cargo:rerun-if-changed=build.rs");
    // The list's absolute path, as the link argument names it: a second checkout sharing the
    // target directory finds this path gone (or another file) and runs the script again,
    // instead of linking with the first checkout's list.
    println!("cargo:rerun-if-changed={}", order.display());
    // The profile optimised builds use (link/rustc-pgo): legate itself is compiled again when
    // it changes. cargo cannot tell its dependencies were built with another one.
    println!(
        "cargo:rerun-if-changed={}",
        Path::new(&dir).join(PROFILE_FILE).display()
    );
}

/// Whether rustc links this target with its bundled lld by default (1.90 and later), unless
/// the flags choose another linker; GNU ld would refuse the ordering option.
fn links_with_lld() -> bool {
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    if flags.contains("linker") || flags.contains("fuse-ld") {
        return false;
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let Ok(out) = Command::new(rustc).arg("--version").output() else {
        return false;
    };
    let version = String::from_utf8_lossy(&out.stdout);
    // "rustc 1.95.0 (59807616e 2026-04-14)"
    let minor = version
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.split('.').nth(1))
        .and_then(|m| m.parse::<u32>().ok());
    minor.is_some_and(|m| m >= 90)
}
