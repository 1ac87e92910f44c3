//! link/rustc-pgo, the rustc wrapper of .cargo/config.toml: it adds the committed profile to
//! optimised compiles only, and never when the compiler cannot read it. Run against a fake
//! rustc that prints the arguments it was given (and an LLVM version for `-vV`).

use std::path::{Path, PathBuf};
use std::process::Command;

const WRAPPER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/link/rustc-pgo");

/// A copy of the wrapper in `dir` (it finds the profile beside itself), and a fake rustc
/// reporting LLVM `llvm`.
fn setup(dir: &Path, llvm: u32, profile: bool) -> (PathBuf, PathBuf) {
    let wrapper = dir.join("rustc-pgo");
    std::fs::copy(WRAPPER, &wrapper).unwrap();
    let rustc = dir.join("fake-rustc");
    let script = format!(
        "#!/bin/sh\nif [ \"$1\" = -vV ]; then printf 'rustc 1.95.0\\nLLVM version: {llvm}.1.2\\n'; \
         exit 0; fi\nfor a in \"$@\"; do echo \"$a\"; done\n"
    );
    std::fs::write(&rustc, script).unwrap();
    for f in [&wrapper, &rustc] {
        Command::new("chmod").arg("+x").arg(f).status().unwrap();
    }
    if profile {
        std::fs::write(dir.join("legate.profdata"), b"profile").unwrap();
        std::fs::write(dir.join("legate.profdata.llvm"), "22\n").unwrap();
    }
    (wrapper, rustc)
}

/// The arguments the fake rustc received through the wrapper.
fn run(llvm: u32, profile: bool, args: &[&str]) -> (Vec<String>, PathBuf) {
    run_with(llvm, profile, args, None)
}

fn run_with(
    llvm: u32,
    profile: bool,
    args: &[&str],
    generate: Option<&str>,
) -> (Vec<String>, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let (wrapper, rustc) = setup(dir.path(), llvm, profile);
    let mut cmd = Command::new(&wrapper);
    cmd.arg(&rustc).args(args).env_remove("LEGATE_PGO_GENERATE");
    if let Some(raw) = generate {
        cmd.env("LEGATE_PGO_GENERATE", raw);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    // The directory is gone with `dir`; its path is still what the flag names.
    (got, dir.path().join("legate.profdata"))
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

const RELEASE: &[&str] = &["--crate-name", "legate", "-C", "opt-level=3", "src/lib.rs"];

#[test]
fn an_optimised_compile_gets_the_profile() {
    let (got, profile) = run(22, true, RELEASE);
    let mut want = strings(RELEASE);
    want.push(format!("-Cprofile-use={}", profile.display()));
    want.push("-Cllvm-args=-no-pgo-warn-mismatch".to_owned());
    assert_eq!(got, want);
    // A newer LLVM reads an older profile.
    let (got, _) = run(23, true, &["-Copt-level=3", "src/lib.rs"]);
    assert_eq!(got.len(), 4, "{got:?}");
    assert!(got[2].starts_with("-Cprofile-use="), "{got:?}");
}

#[test]
fn other_compiles_run_rustc_as_cargo_asked() {
    for args in [
        // Debug and test builds, build scripts and proc macros.
        &["--crate-name", "legate", "-C", "opt-level=0", "src/lib.rs"][..],
        &["--crate-name", "build_script_build", "build.rs"][..],
        // link/pgo.py's instrumented build.
        &[
            "-C",
            "opt-level=3",
            "-Cprofile-generate=/tmp/raw",
            "src/lib.rs",
        ][..],
        // cargo's probe of the compiler.
        &["-", "--crate-name", "___", "--print=file-names"][..],
    ] {
        let (got, _) = run(22, true, args);
        assert_eq!(got, strings(args));
    }
}

#[test]
fn an_older_llvm_or_a_missing_profile_builds_without_it() {
    let (got, _) = run(21, true, RELEASE);
    assert_eq!(
        got,
        strings(RELEASE),
        "LLVM 21 cannot read LLVM 22's profile"
    );
    let (got, _) = run(22, false, RELEASE);
    assert_eq!(got, strings(RELEASE));
}

#[test]
fn an_instrumented_build_is_asked_for_by_environment() {
    // Instead of the profile, not with it; optimised compiles only.
    let (got, _) = run_with(22, true, RELEASE, Some("/tmp/raw"));
    let mut want = strings(RELEASE);
    want.push("-Cprofile-generate=/tmp/raw".to_owned());
    assert_eq!(got, want);
    let debug = ["-C", "opt-level=0", "src/lib.rs"];
    let (got, _) = run_with(22, true, &debug, Some("/tmp/raw"));
    assert_eq!(got, strings(&debug));
}

#[test]
fn the_committed_profile_is_named_where_cargo_finds_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = std::fs::read_to_string(root.join(".cargo/config.toml")).unwrap();
    assert!(
        config.contains("rustc-wrapper = \"link/rustc-pgo\""),
        "{config}"
    );
    assert!(root.join("link/legate.profdata").is_file());
    let llvm = std::fs::read_to_string(root.join("link/legate.profdata.llvm")).unwrap();
    assert!(llvm.trim().parse::<u32>().is_ok(), "{llvm:?}");
}
