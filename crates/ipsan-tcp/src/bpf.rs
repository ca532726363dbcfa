//! The storage-friendly congestion controls as BPF `struct_ops` (`tcp_congestion_ops`).
//!
//! `bpf/ipsan_sf.bpf.c` defines, after the iFCP paper (Muknahallipatna et al. §4, Fig. 7 and Fig. 10):
//! - `ipsan_sf`: Reno (RFC 5681), but on fast retransmit ssthresh = 7/8 of cwnd instead of 1/2;
//! - `ipsan_sf_ss`: the same cut, with congestion avoidance disabled (cwnd keeps growing
//!   exponentially up to the peer's receive window);
//! - `ipsan_ss`: congestion avoidance disabled alone: Reno's cut to 1/2, then the same
//!   exponential growth (the paper's fourth series in Fig. 10).
//!
//! `build.rs` compiles it with clang against a `vmlinux.h` generated from the build machine's
//! kernel BTF, and the object is embedded in this crate.
//!
//! # Loader: bpftool, not libbpf-rs
//! Debian 12 ships libbpf 1.1 and bpftool 7.1. libbpf-rs needs a newer libbpf, which means
//! compiling a vendored libbpf (plus libelf/zlib headers) into every build of the `ipsan` binary
//! and adding FFI `unsafe` to the workspace. bpftool is the same libbpf, already packaged,
//! costs no build time and no `unsafe`, and `bpftool struct_ops register` does exactly what is
//! needed. libbpf 1.1 registers `struct_ops` the original way (a map update, no
//! `BPF_LINK_TYPE_STRUCT_OPS` link): the kernel keeps the map and the algorithm registered after
//! bpftool exits, until the map element is deleted (`unregister`). So "keep the link alive"
//! holds without a running process; in addition [`load`] pins each `struct_ops` map in bpffs
//! (default `/sys/fs/bpf/ipsan/tcp/<name>`) so it is visible and [`unload`] can find exactly the
//! map it registered.
//!
//! After `unload`, sockets that still use an algorithm keep it until they close; new sockets can
//! no longer select it.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;

use crate::TcpError;

/// The congestion controls this crate registers.
pub const OURS: [&str; 3] = ["ipsan_sf", "ipsan_sf_ss", "ipsan_ss"];

/// Where [`load`] pins the `struct_ops` maps unless told otherwise.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/ipsan/tcp";

const BPFFS: &str = "/sys/fs/bpf";

#[cfg(ipsan_tcp_bpf)]
static OBJECT: Result<&[u8], &str> = Ok(include_bytes!(env!("IPSAN_TCP_BPF_OBJ")));
#[cfg(not(ipsan_tcp_bpf))]
static OBJECT: Result<&[u8], &str> = Err(env!("IPSAN_TCP_BPF_MISSING"));

/// The compiled BPF object embedded at build time, or why it was not built.
pub fn object() -> Result<&'static [u8], TcpError> {
    OBJECT.map_err(|why| TcpError::BpfUnavailable(format!("not built into this binary: {why}")))
}

/// Checks everything [`load`] needs, without changing anything. `Err` says what is missing, in
/// words a user can act on; the built-in algorithms stay usable either way.
pub fn check_support() -> Result<(), TcpError> {
    object()?;
    if !is_root() {
        return Err(TcpError::BpfUnavailable(
            "registering a congestion control needs root (CAP_BPF and CAP_NET_ADMIN)".into(),
        ));
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Err(TcpError::BpfUnavailable(
            "the kernel has no BTF (/sys/kernel/btf/vmlinux); BPF struct_ops needs it".into(),
        ));
    }
    bpftool_version()?;
    Ok(())
}

/// `net.ipv4.tcp_available_congestion_control`: every algorithm the kernel can give a socket,
/// including BPF ones registered with `ipsan tcp load`.
pub fn available_congestion_controls() -> Result<Vec<String>, TcpError> {
    const PATH: &str = "/proc/sys/net/ipv4/tcp_available_congestion_control";
    let text =
        std::fs::read_to_string(PATH).map_err(|source| TcpError::Proc { path: PATH, source })?;
    Ok(text.split_whitespace().map(str::to_string).collect())
}

/// One of our algorithms, as the kernel sees it now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OurAlgorithm {
    /// `ipsan_sf`, `ipsan_sf_ss` or `ipsan_ss`.
    pub name: &'static str,
    /// Listed in `tcp_available_congestion_control` (selectable with `TCP_CONGESTION`).
    pub registered: bool,
    /// Its pinned `struct_ops` map, when [`load`] pinned one.
    pub pinned: Option<PathBuf>,
}

/// What `ipsan tcp list` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Listing {
    /// `net.ipv4.tcp_available_congestion_control`.
    pub available: Vec<String>,
    /// The default for new sockets in this network namespace (ipsan always sets its own).
    pub default: Option<String>,
    /// ipsan's algorithms and their state.
    pub ours: Vec<OurAlgorithm>,
    /// Why they cannot be loaded here, if they cannot.
    pub unavailable: Option<String>,
    /// Corrupted windows the programs have repaired since they were loaded, all sockets
    /// together (`ipsan_sf_repairs` in the object's .bss map, pinned by [`load`]; docs/tcp.md
    /// *Window repair*). `None` when the map is not pinned or cannot be read.
    pub window_repairs: Option<u64>,
}

/// Lists the kernel's congestion controls and the state of ours.
pub fn list(pin_dir: &Path) -> Result<Listing, TcpError> {
    let available = available_congestion_controls()?;
    let default = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .ok()
        .map(|s| s.trim().to_string());
    let ours = OURS
        .iter()
        .map(|&name| OurAlgorithm {
            name,
            registered: available.iter().any(|a| a == name),
            pinned: Some(pin_dir.join(name)).filter(|p| p.exists()),
        })
        .collect();
    Ok(Listing {
        available,
        default,
        ours,
        unavailable: check_support().err().map(|e| e.to_string()),
        window_repairs: window_repairs(pin_dir),
    })
}

/// Name libbpf gives the object's .bss map, which holds the repair counter.
const BSS_MAP: &str = "ipsan_sf.bss";
/// Where [`load`] pins it (bpffs refuses '.' in names).
const BSS_PIN: &str = "ipsan_sf_bss";

/// The repair counter (see [`Listing::window_repairs`]) from the .bss map pinned in `pin_dir`.
pub fn window_repairs(pin_dir: &Path) -> Option<u64> {
    let v = pinned_map_json(
        &pin_dir.join(BSS_PIN),
        "lookup",
        &["key", "0", "0", "0", "0"],
    )?;
    parse_u64_le_bytes(v.get("value")?)
}

/// `bpftool -j map <verb> pinned <path> <args>` as JSON; `None` if nothing is pinned there or
/// bpftool fails.
fn pinned_map_json(path: &Path, verb: &str, args: &[&str]) -> Option<serde_json::Value> {
    if !path.exists() {
        return None;
    }
    let mut argv: Vec<&std::ffi::OsStr> = vec!["-j".as_ref(), "map".as_ref(), verb.as_ref()];
    argv.extend(["pinned".as_ref(), path.as_os_str()]);
    argv.extend(args.iter().map(|a| std::ffi::OsStr::new(*a)));
    let out = bpftool(&argv).ok()?;
    serde_json::from_str(&out.stdout).ok()
}

/// bpftool's raw value bytes (`["0x2a", "0x00", ...]`), little-endian, as a u64.
fn parse_u64_le_bytes(value: &serde_json::Value) -> Option<u64> {
    let bytes = value.as_array()?;
    if bytes.len() != 8 {
        return None;
    }
    let mut b = [0u8; 8];
    for (dst, src) in b.iter_mut().zip(bytes) {
        *dst = u8::from_str_radix(src.as_str()?.strip_prefix("0x")?, 16).ok()?;
    }
    Some(u64::from_le_bytes(b))
}

/// The object's .bss map: libbpf creates it just before the struct_ops maps it registers, so
/// it is the newest map of that name older than the first of `registered` (map ids grow).
fn find_bss_map(registered: &[u32]) -> Option<u32> {
    let first = registered.iter().copied().min()?;
    let out = bpftool(&["-j".as_ref(), "map".as_ref(), "show".as_ref()]).ok()?;
    let maps: serde_json::Value = serde_json::from_str(&out.stdout).ok()?;
    maps.as_array()?
        .iter()
        .filter(|m| m.get("name").and_then(|n| n.as_str()) == Some(BSS_MAP))
        .filter_map(|m| m.get("id")?.as_u64().and_then(|id| u32::try_from(id).ok()))
        .filter(|&id| id < first)
        .max()
}

/// What [`load`] did for each algorithm.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LoadReport {
    /// Registered by this call.
    pub registered: Vec<String>,
    /// Already registered before this call (left as they were).
    pub already: Vec<String>,
    /// Pinned maps (this call's registrations).
    pub pinned: Vec<PathBuf>,
}

/// Registers `ipsan_sf`, `ipsan_sf_ss` and `ipsan_ss` and pins their maps under `pin_dir`. Idempotent:
/// algorithms already registered are left alone. They stay registered after this process
/// exits, until [`unload`].
pub fn load(pin_dir: &Path) -> Result<LoadReport, TcpError> {
    check_support()?;
    let before = available_congestion_controls()?;
    let already: Vec<String> = OURS
        .iter()
        .filter(|n| before.iter().any(|a| a == *n))
        .map(|n| n.to_string())
        .collect();
    if already.len() == OURS.len() {
        return Ok(LoadReport {
            registered: Vec::new(),
            already,
            pinned: Vec::new(),
        });
    }
    let object = object()?;
    let dir = tempdir()?;
    let obj_path = dir.path.join("ipsan_sf.bpf.o");
    std::fs::write(&obj_path, object).map_err(|e| TcpError::Bpf {
        step: format!("writing {}", obj_path.display()),
        detail: e.to_string(),
    })?;
    // bpftool registers every struct_ops map in the object; one already registered fails with
    // EEXIST while the others succeed, so judge by the kernel's list afterwards.
    let out = bpftool(&[
        "struct_ops".as_ref(),
        "register".as_ref(),
        obj_path.as_os_str(),
    ])?;
    // bpftool 7.x reports registrations on stderr (p_info); accept either stream.
    let ids = parse_registered(&format!("{}\n{}", out.stdout, out.stderr));
    let after = available_congestion_controls()?;
    let missing: Vec<&str> = OURS
        .iter()
        .copied()
        .filter(|n| !after.iter().any(|a| a == n))
        .collect();
    if !missing.is_empty() {
        return Err(TcpError::Bpf {
            step: format!(
                "bpftool struct_ops register (still missing: {})",
                missing.join(", ")
            ),
            detail: out.stderr.trim().to_string(),
        });
    }
    let mut report = LoadReport {
        registered: Vec::new(),
        already,
        pinned: Vec::new(),
    };
    let mut ours = Vec::new();
    for (name, id) in ids {
        if !OURS.contains(&name.as_str()) {
            continue;
        }
        ours.push(id);
        match pin(pin_dir, &name, id) {
            Ok(path) => report.pinned.push(path),
            Err(e) => tracing::warn!(%name, id, error = ?e, "registered but not pinned"),
        }
        report.registered.push(name);
    }
    match find_bss_map(&ours).map(|id| pin(pin_dir, BSS_PIN, id)) {
        Some(Ok(path)) => report.pinned.push(path),
        Some(Err(e)) => tracing::warn!(error = ?e, "repair counter map not pinned"),
        None if !ours.is_empty() => tracing::warn!("repair counter map not found"),
        None => {}
    }
    Ok(report)
}

/// What [`unload`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnloadReport {
    /// Unregistered by this call.
    pub unregistered: Vec<String>,
    /// Not registered in the first place.
    pub absent: Vec<String>,
}

/// Unregisters `ipsan_sf`, `ipsan_sf_ss` and `ipsan_ss` and removes their pins. Existing sockets keep
/// their algorithm until they close.
pub fn unload(pin_dir: &Path) -> Result<UnloadReport, TcpError> {
    check_support()?;
    let before = available_congestion_controls()?;
    let mut report = UnloadReport {
        unregistered: Vec::new(),
        absent: Vec::new(),
    };
    for name in OURS {
        let pin_path = pin_dir.join(name);
        let registered = before.iter().any(|a| a == name);
        if registered {
            // Prefer the exact map we pinned; fall back to the name (loaded by other means).
            let by_id = pinned_map_id(&pin_path).map(|id| id.to_string());
            let target: [&str; 2] = match &by_id {
                Some(id) => ["id", id.as_str()],
                None => ["name", name],
            };
            let args = ["struct_ops", "unregister", target[0], target[1]];
            let out = bpftool(&args.map(std::ffi::OsStr::new))?;
            if !out.ok && available_congestion_controls()?.iter().any(|a| a == name) {
                return Err(TcpError::Bpf {
                    step: format!("bpftool {}", args.join(" ")),
                    detail: out.stderr.trim().to_string(),
                });
            }
            report.unregistered.push(name.to_string());
        } else {
            report.absent.push(name.to_string());
        }
        if pin_path.exists() {
            std::fs::remove_file(&pin_path).map_err(|e| TcpError::Bpf {
                step: format!("removing pin {}", pin_path.display()),
                detail: e.to_string(),
            })?;
        }
    }
    // The counter map goes with the programs (they hold it; the pin only keeps it visible).
    let _ = std::fs::remove_file(pin_dir.join(BSS_PIN));
    let _ = std::fs::remove_dir(pin_dir); // only if empty
    Ok(report)
}

/// `Registered tcp_congestion_ops ipsan_sf id 25` lines from bpftool (7.x wording).
fn parse_registered(stdout: &str) -> Vec<(String, u32)> {
    stdout
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next()? == "Registered").then_some(())?;
            let _kind = words.next()?;
            let name = words.next()?.to_string();
            (words.next()? == "id").then_some(())?;
            let id = words.next()?.parse().ok()?;
            Some((name, id))
        })
        .collect()
}

fn pin(pin_dir: &Path, name: &str, id: u32) -> Result<PathBuf, TcpError> {
    ensure_bpffs()?;
    std::fs::create_dir_all(pin_dir).map_err(|e| TcpError::Bpf {
        step: format!("creating {}", pin_dir.display()),
        detail: e.to_string(),
    })?;
    let path = pin_dir.join(name);
    if path.exists() {
        // A stale pin from an earlier load whose algorithm was unregistered by other means.
        let _ = std::fs::remove_file(&path);
    }
    let id = id.to_string();
    let out = bpftool(&[
        "map".as_ref(),
        "pin".as_ref(),
        "id".as_ref(),
        id.as_ref(),
        path.as_os_str(),
    ])?;
    if !out.ok {
        return Err(TcpError::Bpf {
            step: format!("bpftool map pin id {id} {}", path.display()),
            detail: out.stderr.trim().to_string(),
        });
    }
    Ok(path)
}

fn pinned_map_id(path: &Path) -> Option<u32> {
    let v = pinned_map_json(path, "show", &[])?;
    v.get("id")?.as_u64().and_then(|id| u32::try_from(id).ok())
}

/// Mounts bpffs at /sys/fs/bpf if nothing is mounted there (pins need it).
fn ensure_bpffs() -> Result<(), TcpError> {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let mounted = mounts.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 2 && f[1] == BPFFS && f[2] == "bpf"
    });
    if mounted {
        return Ok(());
    }
    let status = Command::new("mount")
        .args(["-t", "bpf", "bpf", BPFFS])
        .status()
        .map_err(|e| TcpError::Bpf {
            step: "mount -t bpf".into(),
            detail: e.to_string(),
        })?;
    if status.success() {
        Ok(())
    } else {
        Err(TcpError::Bpf {
            step: format!("mount -t bpf bpf {BPFFS}"),
            detail: status.to_string(),
        })
    }
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    // /proc/self is owned by the effective uid.
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

struct Output {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn bpftool_path() -> String {
    std::env::var("BPFTOOL")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "bpftool".to_string())
}

fn bpftool(args: &[&std::ffi::OsStr]) -> Result<Output, TcpError> {
    let tool = bpftool_path();
    let out = Command::new(&tool).args(args).output().map_err(|e| {
        TcpError::BpfUnavailable(format!(
            "cannot run {tool} ({e}); Debian: apt-get install bpftool"
        ))
    })?;
    Ok(Output {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

fn bpftool_version() -> Result<String, TcpError> {
    let out = bpftool(&["version".as_ref()])?;
    if out.ok {
        Ok(out.stdout.lines().next().unwrap_or_default().to_string())
    } else {
        Err(TcpError::BpfUnavailable(format!(
            "bpftool version failed: {}",
            out.stderr.trim()
        )))
    }
}

/// A private temporary directory, removed on drop.
struct TempDir {
    path: PathBuf,
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn tempdir() -> Result<TempDir, TcpError> {
    use std::os::unix::fs::DirBuilderExt;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let path = std::env::temp_dir().join(format!("ipsan-tcp-{}-{nanos}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&path)
        .map_err(|e| TcpError::Bpf {
            step: format!("creating {}", path.display()),
            detail: e.to_string(),
        })?;
    Ok(TempDir { path })
}

#[cfg(test)]
mod tests {

    #[test]
    fn reads_bpftools_value_bytes_little_endian() {
        let v: serde_json::Value =
            serde_json::from_str(r#"["0x2a","0x01","0x00","0x00","0x00","0x00","0x00","0x00"]"#)
                .unwrap();
        assert_eq!(parse_u64_le_bytes(&v), Some(0x012a));
        let short: serde_json::Value = serde_json::from_str(r#"["0x2a"]"#).unwrap();
        assert_eq!(parse_u64_le_bytes(&short), None);
        let bad: serde_json::Value =
            serde_json::from_str(r#"["zz","0","0","0","0","0","0","0"]"#).unwrap();
        assert_eq!(parse_u64_le_bytes(&bad), None);
    }

    use super::*;

    #[test]
    fn parses_bpftool_register_output() {
        let out = "Registered tcp_congestion_ops ipsan_sf id 25\n\
                   Registered tcp_congestion_ops ipsan_sf_ss id 26\n\
                   libbpf: something else\n";
        assert_eq!(
            parse_registered(out),
            vec![
                ("ipsan_sf".to_string(), 25),
                ("ipsan_sf_ss".to_string(), 26)
            ]
        );
        assert!(parse_registered("Registered nonsense").is_empty());
    }

    #[test]
    fn list_reports_builtins() {
        let l = list(Path::new("/nonexistent/ipsan-pins")).unwrap();
        assert!(l.available.iter().any(|a| a == "reno"), "{l:?}");
        assert_eq!(l.ours.len(), 3);
        assert!(l.ours.iter().any(|o| o.name == "ipsan_ss"), "{l:?}");
        assert!(l.ours.iter().all(|o| o.pinned.is_none()));
    }
}
