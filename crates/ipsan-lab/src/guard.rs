//! Nothing outlives the lab: children die with it, and its namespaces and files go on Ctrl-C.
//!
//! - [`guard_child`] makes a spawned child (target, bench, wireguard-go, stunnel, …) receive
//!   SIGKILL when the lab dies, however it dies — SIGKILL included — through
//!   `PR_SET_PDEATHSIG` (prctl(2)). `ip netns exec` execs its program in place, so the
//!   setting reaches the real process. The kernel sends the signal when the *thread* that
//!   spawned the child exits, so spawn from a thread that lives as long as the child (the
//!   runner spawns from the thread that runs the plan).
//! - [`install_signal_cleanup`] turns SIGINT, SIGTERM and SIGHUP into an orderly exit: the
//!   registered links' namespaces are deleted (which SIGKILLs whatever runs in them), the
//!   registered files removed, and the process exits with 128 + the signal number.
//! - A SIGKILLed lab cannot clean up after itself; its children still die (above), and
//!   [`sweep_stale`] deletes the `ipsanlab<pid>-ini`/`-tgt` namespaces whose `<pid>` no
//!   longer runs, when the next lab starts.

use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

static STOPPING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Parks the calling thread for good once a signal has arrived: the signal thread is
/// killing the runs and exits the process, so what they return now (a bench killed under
/// it) must not be recorded or acted on. Call it after each run returns.
pub fn stop_point() {
    while STOPPING.load(std::sync::atomic::Ordering::SeqCst) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Held by whoever ends the process: the signal thread while it cleans up and exits with
/// 128 + signal, or the main thread once the lab's work is done ([`close_exit_gate`]). So a
/// signal's cleanup can never be cut short by a normal exit (which would exit 0 with
/// namespaces left), and a signal after the work is done changes nothing.
static EXIT_GATE: Mutex<()> = Mutex::new(());

/// Call when the lab's work is done, just before the process exits normally: waits for a
/// signal cleanup already under way (which then ends the process with 128 + signal), and stops
/// any later signal from starting one.
pub fn close_exit_gate() {
    let g = EXIT_GATE.lock().unwrap_or_else(|p| p.into_inner());
    // Held until the process exits.
    std::mem::forget(g);
}

/// Link-name prefix of every lab link; the rest of the name is the lab's pid.
pub const LINK_PREFIX: &str = "ipsanlab";

#[derive(Default)]
struct Registry {
    links: BTreeSet<String>,
    files: BTreeSet<PathBuf>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    links: BTreeSet::new(),
    files: BTreeSet::new(),
});

fn with_registry(f: impl FnOnce(&mut Registry)) {
    let mut g = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    f(&mut g);
}

/// Remembers link `name` for cleanup on a signal.
pub fn register_link(name: &str) {
    with_registry(|r| {
        r.links.insert(name.to_string());
    });
}

/// Forgets link `name` (it was torn down normally).
pub fn unregister_link(name: &str) {
    with_registry(|r| {
        r.links.remove(name);
    });
}

/// Remembers a file to remove on a signal.
pub fn register_file(path: PathBuf) {
    with_registry(|r| {
        r.files.insert(path);
    });
}

/// Forgets a file (it was removed normally).
pub fn unregister_file(path: &std::path::Path) {
    with_registry(|r| {
        r.files.remove(path);
    });
}

/// Deletes every registered namespace (SIGKILLing what runs inside) and file.
pub fn cleanup_registered() {
    let (links, files) = {
        let mut g = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
        (std::mem::take(&mut g.links), std::mem::take(&mut g.files))
    };
    for l in links {
        let _ = ipsan_wan::link::cleanup(&l);
    }
    for f in files {
        let _ = std::fs::remove_file(f);
    }
}

/// Makes `cmd`'s child die (SIGKILL) when the spawning thread dies, and start with
/// SIGINT/SIGTERM/SIGHUP unblocked even though the lab's threads block them.
pub fn guard_child(cmd: &mut Command) -> &mut Command {
    let parent = std::process::id() as libc::pid_t;
    pre_exec_guard(cmd, parent);
    cmd
}

#[allow(unsafe_code)]
fn pre_exec_guard(cmd: &mut Command, parent: libc::pid_t) {
    // SAFETY: the closure runs in the forked child before exec and only calls
    // async-signal-safe functions (prctl, getppid, sigemptyset/sigaddset on a local set,
    // pthread_sigmask, _exit); it allocates nothing and touches no locks.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl: then nobody will signal us.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::sigaddset(&mut set, s);
            }
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            Ok(())
        });
    }
}

fn signal_set() -> libc::sigset_t {
    #[allow(unsafe_code)]
    // SAFETY: sigemptyset/sigaddset initialise and fill a set we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Blocks SIGINT/SIGTERM/SIGHUP in the calling thread (and so in every thread it spawns
/// later) and starts a thread that waits for them, cleans up and exits with 128 + signal.
/// Call it early in `main`'s thread, before other threads start; calling it twice is harmless.
pub fn install_signal_cleanup() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let set = signal_set();
        #[allow(unsafe_code)]
        // SAFETY: pthread_sigmask on the calling thread with a valid, initialised set.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        if rc != 0 {
            tracing::warn!("cannot block signals: error {rc}; Ctrl-C will not clean up");
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("lab-signals".into())
            .spawn(move || loop {
                let mut sig: libc::c_int = 0;
                #[allow(unsafe_code)]
                // SAFETY: sigwait with a valid set (blocked in this thread) and an out pointer.
                let rc = unsafe { libc::sigwait(&set, &mut sig) };
                if rc != 0 {
                    continue;
                }
                let gate = EXIT_GATE.lock().unwrap_or_else(|p| p.into_inner());
                STOPPING.store(true, std::sync::atomic::Ordering::SeqCst);
                eprintln!("\nipsan lab: signal {sig}: removing the lab's namespaces and exiting");
                cleanup_registered();
                std::mem::forget(gate);
                std::process::exit(128 + sig);
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot start the signal thread: {e}; Ctrl-C will not clean up");
        }
    });
}

/// The lab link name for this process: `ipsanlab<pid>`. Unique among live processes, so two
/// labs running at once never share namespaces, wireguard-go sockets or scratch names.
pub fn link_name_for_pid(pid: u32) -> String {
    format!("{LINK_PREFIX}{pid}")
}

/// Deletes the namespaces of lab links whose owning process (the pid in the name) no longer
/// exists: what a SIGKILLed lab left behind. Namespaces of live labs are never touched.
/// Returns the namespaces deleted.
pub fn sweep_stale() -> Vec<String> {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return Vec::new();
    };
    let mut gone = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(ns) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = stale_owner(ns) else {
            continue;
        };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if ipsan_wan::netns::delete(ns).is_ok() {
            gone.push(ns.to_string());
        }
    }
    gone
}

/// The pid in a lab namespace name `ipsanlab<pid>-ini`/`-tgt`, if `ns` is one.
fn stale_owner(ns: &str) -> Option<u32> {
    let rest = ns.strip_prefix(LINK_PREFIX)?;
    let digits = rest
        .strip_suffix("-ini")
        .or_else(|| rest.strip_suffix("-tgt"))?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn accepts_only_lab_namespace_names_as_stale_candidates() {
        assert_eq!(stale_owner("ipsanlab1234-ini"), Some(1234));
        assert_eq!(stale_owner("ipsanlab7-tgt"), Some(7));
        assert_eq!(stale_owner("ipsanlab-ini"), None);
        assert_eq!(stale_owner("ipsanlab12x-ini"), None);
        assert_eq!(stale_owner("labsmoke12-ini"), None);
        assert_eq!(stale_owner("ipsanlab12-foo"), None);
    }

    #[test]
    fn guarded_child_dies_with_its_spawning_thread() {
        // A thread spawns `sleep 30` guarded, then exits: the kernel must SIGKILL the child.
        let h = std::thread::spawn(|| {
            let mut c = Command::new("sleep");
            c.arg("30");
            guard_child(&mut c).spawn().unwrap()
        });
        let mut child = h.join().unwrap();
        let t = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                use std::os::unix::process::ExitStatusExt;
                assert_eq!(st.signal(), Some(libc::SIGKILL));
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the guarded child outlived its parent thread"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
