//! Helpers shared by the lab's integration tests.

use std::path::PathBuf;

/// The `ipsan` binary the lab drives: $IPSAN_BIN, else target/{debug,release}/ipsan under
/// $CARGO_TARGET_DIR or the workspace. `None` if none is built (the tests then print SKIP).
pub fn ipsan_bin() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("IPSAN_BIN") {
        return Some(PathBuf::from(p)).filter(|p| p.exists());
    }
    let ws = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut dirs = vec![ws.join("target")];
    if let Ok(t) = std::env::var("CARGO_TARGET_DIR") {
        dirs.insert(0, PathBuf::from(t));
    }
    dirs.iter()
        .flat_map(|d| [d.join("debug/ipsan"), d.join("release/ipsan")])
        .find(|p| p.exists())
}
