//! Link options for the `legate` binary.
//!
//! On Linux with glibc the binary is linked with packed relative relocations (`DT_RELR`). A
//! position-independent executable carries one relocation per pointer in its read-only data;
//! in the classic format that table is over 400 KB, which the dynamic loader reads in full at
//! every start, so its pages stay resident for the life of the process. Packed, it is about
//! 10 KB. Such a binary needs glibc 2.36 or later to start (Debian 12, the container image's
//! base); a linker that does not know the option warns and ignores it.

fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
