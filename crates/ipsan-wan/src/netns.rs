//! Network namespaces and interface setup through iproute2 (`ip netns`, `ip -n`), plus running
//! code inside a namespace on a short-lived thread.

use crate::error::LinkError;
use std::path::PathBuf;
use std::process::Command;

/// The interface name inside each namespace.
pub const IFNAME: &str = "wan0";

/// The namespace names of link `name`.
pub fn ns_names(name: &str) -> (String, String) {
    (format!("{name}-ini"), format!("{name}-tgt"))
}

/// Where `ip netns add` binds a namespace.
pub fn ns_path(ns: &str) -> PathBuf {
    PathBuf::from("/run/netns").join(ns)
}

/// Whether the named namespace exists.
pub fn exists(ns: &str) -> bool {
    ns_path(ns).exists()
}

/// Runs `program args...`, turning a failure into an error that quotes the command and its
/// stderr.
pub fn run(program: &str, args: &[&str]) -> Result<(), LinkError> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| LinkError::io(format!("running {program}"), e))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(LinkError::Command {
            cmd: format!("{program} {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// `ip netns add NAME`.
pub fn add(ns: &str) -> Result<(), LinkError> {
    run("ip", &["netns", "add", ns])
}

/// Kills every process still inside `ns` (they were started there by this link) and deletes
/// the namespace. Missing namespaces are fine: deleting is idempotent.
pub fn delete(ns: &str) -> Result<(), LinkError> {
    if !exists(ns) {
        return Ok(());
    }
    kill_pids_in(ns);
    match run("ip", &["netns", "del", ns]) {
        Err(_) if !exists(ns) => Ok(()),
        r => r,
    }
}

/// SIGKILLs the processes `ip netns pids` lists for `ns`, by pid, and waits briefly for them.
fn kill_pids_in(ns: &str) {
    let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() else {
        return;
    };
    let pids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
        .map(str::to_owned)
        .collect();
    let me = std::process::id().to_string();
    for pid in pids.iter().filter(|p| **p != me) {
        let _ = Command::new("kill").args(["-KILL", pid]).output();
    }
    for _ in 0..50 {
        if pids
            .iter()
            .all(|p| !PathBuf::from(format!("/proc/{p}")).exists())
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Runs `f` on a fresh thread that has entered namespace `ns`, and returns its result.
/// Sockets created inside `f` stay in that namespace and may be used from any thread.
pub fn run_in<T, F>(ns: &str, f: F) -> Result<T, LinkError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let path = ns_path(ns);
    let h = std::thread::Builder::new()
        .name(format!("netns-{ns}"))
        .spawn(move || -> Result<T, LinkError> {
            crate::sys::enter_netns(&path)
                .map_err(|e| LinkError::io(format!("entering {}", path.display()), e))?;
            Ok(f())
        })
        .map_err(|e| LinkError::io("spawning a namespace thread", e))?;
    h.join()
        .map_err(|_| LinkError::Probe("a namespace thread panicked".into()))?
}

/// Writes a sysctl under `/proc/sys/net` of the calling thread's namespace.
pub fn write_net_sysctl(key: &str, value: &str) -> std::io::Result<()> {
    std::fs::write(
        PathBuf::from("/proc/sys/net").join(key.replace('.', "/")),
        value,
    )
}
