//! Captures the git revision for `ipsan bench` reports (`git_rev` in the JSON schema).
use std::process::Command;

fn main() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let git = root.join(".git");
    for p in ["HEAD", "index"] {
        let f = git.join(p);
        if f.exists() {
            println!("cargo:rerun-if-changed={}", f.display());
        }
    }
    let rev = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(&root)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty());
    if let Some(rev) = rev {
        println!("cargo:rustc-env=IPSAN_GIT_REV={rev}");
    }
}
