//! Records the git commit the binary is built from, for `qpath --version`: the short hash
//! of `git rev-parse --short HEAD`, or "unknown" where there is no git or no checkout
//! (a source tarball). Never fails the build.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).current_dir(dir).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let commit = git(&dir, &["rev-parse", "--short", "HEAD"])
        .filter(|c| c.chars().all(|ch| ch.is_ascii_hexdigit()))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=QPATH_GIT_COMMIT={commit}");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=GIT_DIR");
    // Build again when HEAD moves: HEAD itself (a checkout or detached HEAD), the branch
    // it points to, and the packed refs. Only files that exist are named (a missing one
    // would make cargo run this script on every build).
    let abs = |p: String| -> PathBuf {
        let p = PathBuf::from(p);
        if p.is_absolute() { p } else { dir.join(p) }
    };
    let mut watch = Vec::new();
    if let Some(git_dir) = git(&dir, &["rev-parse", "--git-dir"]).map(abs) {
        watch.push(git_dir.join("HEAD"));
    }
    if let Some(common) = git(&dir, &["rev-parse", "--git-common-dir"]).map(abs) {
        watch.push(common.join("packed-refs"));
        if let Some(branch) = git(&dir, &["symbolic-ref", "-q", "HEAD"]) {
            watch.push(common.join(branch));
        }
    }
    for p in watch.into_iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", p.display());
    }
}
