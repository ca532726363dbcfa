//! Helpers shared by the root package's integration tests.
//!
//! `Relay`: a loopback TCP relay a test can cut, standing for a WAN link that fails (the
//! connection dies both ways, reconnects are refused while it is down). `spawn_ipsan`: the
//! `ipsan` binary started and waited for until it listens, killed when its `Proc` drops.
//! `guest`: a VM test's guest booted once more when its kernel failed while booting.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

pub mod guest;

use std::io::{BufRead, BufReader};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// A loopback TCP relay to `port` that the test can cut (every relayed connection shut
/// down, both ways) and hold down (new connections closed at once).
pub struct Relay {
    pub port: u16,
    pub ctl: Arc<RelayCtl>,
    stop: Arc<AtomicBool>,
}

/// The relay's connections and its down switch (shared with a cutting thread).
#[derive(Default)]
pub struct RelayCtl {
    conns: Mutex<Vec<TcpStream>>,
    /// Each relayed connection's two sockets, oldest first, with whether it still runs.
    pairs: Mutex<Vec<(TcpStream, TcpStream, Arc<AtomicBool>)>>,
    down: AtomicBool,
}

impl RelayCtl {
    /// Closes every relayed connection and refuses new ones for `hold`.
    pub fn cut_for(&self, hold: Duration) {
        self.down.store(true, Ordering::Release);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
        std::thread::sleep(hold);
        self.down.store(false, Ordering::Release);
    }

    /// Cuts the oldest relayed connection still running (both its sockets shut down), as a
    /// broken path does to one TCP connection of several; new connections are let through.
    /// False when none runs.
    pub fn cut_one(&self) -> bool {
        let pairs = self.pairs.lock().unwrap();
        let Some((a, b, alive)) = pairs
            .iter()
            .find(|(_, _, alive)| alive.load(Ordering::Acquire))
        else {
            return false;
        };
        alive.store(false, Ordering::Release);
        let _ = a.shutdown(Shutdown::Both);
        let _ = b.shutdown(Shutdown::Both);
        true
    }

    /// Relayed connections still running.
    pub fn running(&self) -> usize {
        self.pairs
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, _, alive)| alive.load(Ordering::Acquire))
            .count()
    }
}

impl Relay {
    pub fn start(to: u16) -> Relay {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let ctl: Arc<RelayCtl> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (c, st) = (ctl.clone(), stop.clone());
        std::thread::spawn(move || {
            for a in l.incoming() {
                if st.load(Ordering::Acquire) {
                    return;
                }
                let Ok(a) = a else { continue };
                if c.down.load(Ordering::Acquire) {
                    drop(a);
                    continue;
                }
                let Ok(b) = TcpStream::connect(("127.0.0.1", to)) else {
                    continue;
                };
                let _ = (a.set_nodelay(true), b.set_nodelay(true));
                let alive = Arc::new(AtomicBool::new(true));
                for (mut from, mut to) in [
                    (a.try_clone().unwrap(), b.try_clone().unwrap()),
                    (b.try_clone().unwrap(), a.try_clone().unwrap()),
                ] {
                    let alive = alive.clone();
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        alive.store(false, Ordering::Release);
                        let _ = to.shutdown(Shutdown::Both);
                        let _ = from.shutdown(Shutdown::Both);
                    });
                }
                c.pairs.lock().unwrap().push((
                    a.try_clone().unwrap(),
                    b.try_clone().unwrap(),
                    alive,
                ));
                c.conns.lock().unwrap().extend([a, b]);
            }
        });
        Relay { port, ctl, stop }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for c in self.ctl.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// The `ipsan` binary of this package.
pub const BIN: &str = env!("CARGO_BIN_EXE_ipsan");

/// A child process killed and reaped when dropped (a failing test leaves nothing running).
pub struct Proc(pub std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `ipsan` with `args` (stderr to `log`), waits for its "listening on" line and returns
/// it with its port. Stdout keeps being drained so the process never blocks on it.
pub fn spawn_ipsan(args: &[&str], log: &Path) -> (Proc, u16) {
    spawn_ipsan_until(args, log, "'listening on'", |l| {
        l.contains("listening on")
            .then(|| l.rsplit(':').next().unwrap().trim().parse().unwrap())
    })
}

/// Runs `ipsan` with `args` (stderr to `log`) and waits up to 30 s for the first stdout line
/// `port_of` takes a port from (`what` names that line in the failure); stdout keeps being
/// drained so the process never blocks on it.
pub fn spawn_ipsan_until(
    args: &[&str],
    log: &Path,
    what: &str,
    port_of: impl Fn(&str) -> Option<u16>,
) -> (Proc, u16) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let child = Proc(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => match port_of(&l) {
                Some(port) => return (child, port),
                None => seen.push(l),
            },
            Err(_) => panic!(
                "ipsan {args:?}: no {what} line within 30 s:\n{}\n{}",
                seen.join("\n"),
                std::fs::read_to_string(log).unwrap_or_default()
            ),
        }
    }
}
