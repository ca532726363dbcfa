//! The daemon that holds a link for the CLI, and its control socket.
//!
//! `ipsan wan up` starts the daemon, which brings the [`Link`] up, binds
//! `/run/ipsan-wan/<name>.sock` and answers one JSON request per line (`stats`, `config`,
//! `set`, `reset`, `cut`, `restore`, `down`). `ipsan wan down` asks it to stop and, if it crashed, cleans up
//! what it left (namespaces, socket, pid file) by itself.

use crate::config::{validate_name, DirConfig, LinkConfig};
use crate::error::LinkError;
use crate::link::{cleanup, Link, LinkStats};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::Duration;

/// Longest request line accepted (a `set` with two configs is well under 4 KiB).
const MAX_LINE: u64 = 64 * 1024;

/// Where sockets, pid files and daemon logs live.
pub fn state_dir() -> PathBuf {
    PathBuf::from("/run/ipsan-wan")
}

/// The control socket of link `name`.
pub fn socket_path(name: &str) -> PathBuf {
    state_dir().join(format!("{name}.sock"))
}

/// The daemon's pid file.
pub fn pid_path(name: &str) -> PathBuf {
    state_dir().join(format!("{name}.pid"))
}

/// The daemon's log (its stderr).
pub fn log_path(name: &str) -> PathBuf {
    state_dir().join(format!("{name}.log"))
}

/// A control request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Request {
    /// Both directions' counters.
    Stats,
    /// The settings in force.
    Config,
    /// New impairments.
    Set {
        /// Initiator → target.
        up: Box<DirConfig>,
        /// Target → initiator.
        down: Box<DirConfig>,
    },
    /// Zero the counters.
    Reset,
    /// Cut the link until `restore` (issue 8).
    Cut {
        /// Cut initiator → target.
        #[serde(default = "yes")]
        up: bool,
        /// Cut target → initiator.
        #[serde(default = "yes")]
        down: bool,
    },
    /// End a manual cut.
    Restore,
    /// Tear the link down and exit.
    Down,
}

fn yes() -> bool {
    true
}

/// A control response.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Response {
    /// Done.
    Ok,
    /// Counters.
    Stats(LinkStats),
    /// Settings.
    Config(LinkConfig),
    /// The request failed.
    Error(String),
}

/// Brings the link up, serves the control socket until a `down` request, then tears down.
/// `ready` runs once the link passes traffic and the socket accepts requests.
pub fn serve(cfg: LinkConfig, ready: impl FnOnce(&Link)) -> Result<(), LinkError> {
    validate_name(&cfg.name)?;
    let dir = state_dir();
    std::fs::create_dir_all(&dir)
        .map_err(|e| LinkError::io(format!("creating {}", dir.display()), e))?;
    let sock = socket_path(&cfg.name);
    if UnixStream::connect(&sock).is_ok() {
        return Err(LinkError::Exists(cfg.name.clone()));
    }
    let _ = std::fs::remove_file(&sock);
    let mut link = Link::up(cfg.clone())?;
    let listener = UnixListener::bind(&sock)
        .map_err(|e| LinkError::io(format!("binding {}", sock.display()), e))?;
    let pid = pid_path(&cfg.name);
    std::fs::write(&pid, std::process::id().to_string())
        .map_err(|e| LinkError::io(format!("writing {}", pid.display()), e))?;
    ready(&link);
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
        let (resp, stop) = match read_request(&conn) {
            Ok(Request::Stats) => {
                let mut st = link.stats();
                st.devices = link
                    .device_stats()
                    .map_err(|e| tracing::debug!("device stats: {e}"))
                    .ok();
                (Response::Stats(st), false)
            }
            Ok(Request::Config) => (Response::Config(link.config().clone()), false),
            Ok(Request::Set { up, down }) => match link.set(*up, *down) {
                Ok(()) => (Response::Ok, false),
                Err(e) => (Response::Error(e.to_string()), false),
            },
            Ok(Request::Cut { up, down }) => match link.cut(up, down) {
                Ok(()) => (Response::Ok, false),
                Err(e) => (Response::Error(e.to_string()), false),
            },
            Ok(Request::Restore) => match link.restore() {
                Ok(()) => (Response::Ok, false),
                Err(e) => (Response::Error(e.to_string()), false),
            },
            Ok(Request::Reset) => {
                link.reset_stats();
                (Response::Ok, false)
            }
            Ok(Request::Down) => (Response::Ok, true),
            Err(e) => (Response::Error(e), false),
        };
        let r = if stop { link.shutdown() } else { Ok(()) };
        let resp = match r {
            Ok(()) => resp,
            Err(e) => Response::Error(e.to_string()),
        };
        let _ = write_line(&mut conn, &resp);
        if stop {
            break;
        }
    }
    let _ = std::fs::remove_file(&sock);
    let _ = std::fs::remove_file(&pid);
    Ok(())
}

fn read_request(conn: &UnixStream) -> Result<Request, String> {
    let mut line = String::new();
    BufReader::new(conn.take(MAX_LINE))
        .read_line(&mut line)
        .map_err(|e| format!("reading request: {e}"))?;
    serde_json::from_str(line.trim()).map_err(|e| format!("bad request: {e}"))
}

fn write_line<T: Serialize>(w: &mut impl Write, v: &T) -> std::io::Result<()> {
    let mut s = serde_json::to_string(v).map_err(std::io::Error::other)?;
    s.push('\n');
    w.write_all(s.as_bytes())
}

/// Sends one request to link `name`'s daemon and returns its answer.
pub fn request(name: &str, req: &Request) -> Result<Response, LinkError> {
    validate_name(name)?;
    let sock = socket_path(name);
    let mut conn =
        UnixStream::connect(&sock).map_err(|_| LinkError::NotRunning(name.to_owned()))?;
    conn.set_read_timeout(Some(Duration::from_secs(15)))
        .map_err(|e| LinkError::io("control socket timeout", e))?;
    write_line(&mut conn, req).map_err(|e| LinkError::io("sending control request", e))?;
    let mut line = String::new();
    BufReader::new((&conn).take(16 * MAX_LINE))
        .read_line(&mut line)
        .map_err(|e| LinkError::io("reading control response", e))?;
    match serde_json::from_str(line.trim()) {
        Ok(Response::Error(e)) => Err(LinkError::Control(e)),
        Ok(r) => Ok(r),
        Err(e) => Err(LinkError::Control(format!("bad response: {e}"))),
    }
}

fn pid_alive_daemon(pid: u32) -> bool {
    // Only a process whose command line is our daemon's counts: a recycled pid is left alone.
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
        let s = String::from_utf8_lossy(&c);
        s.contains("wan") && s.contains("daemon")
    })
}

/// Stops link `name` however it is: asks a live daemon to tear down, kills a stuck one,
/// removes namespaces and files a crashed one left. Idempotent; returns whether anything
/// was running or left over.
pub fn down(name: &str) -> Result<bool, LinkError> {
    validate_name(name)?;
    let pid: Option<u32> = std::fs::read_to_string(pid_path(name))
        .ok()
        .and_then(|s| s.trim().parse().ok());
    let asked = request(name, &Request::Down).is_ok();
    if let Some(pid) = pid {
        for _ in 0..(if asked { 500 } else { 0 }) {
            if !pid_alive_daemon(pid) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if pid_alive_daemon(pid) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .output();
            for _ in 0..100 {
                if !pid_alive_daemon(pid) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    let (ini, tgt) = crate::link::ns_names(name);
    let leftovers = crate::netns::exists(&ini) || crate::netns::exists(&tgt);
    cleanup(name)?;
    let files = [socket_path(name), pid_path(name)];
    let had_files = files.iter().any(|f| f.exists());
    for f in files {
        let _ = std::fs::remove_file(f);
    }
    // A daemon that stopped on request leaves nothing to read; a crashed one's log says why,
    // so it stays (in /run, gone at reboot) until the next `up` of that name overwrites it.
    if asked {
        let _ = std::fs::remove_file(log_path(name));
    }
    Ok(asked || leftovers || had_files)
}
