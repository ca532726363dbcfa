//! `ipsan wan proxy`: a TCP relay that delays each direction's bytes, for hosts where the
//! namespace emulator cannot run (no root).
//!
//! It is **less faithful** than the packet-level emulator: it terminates TCP on both sides, so
//! each host's TCP sees a loopback RTT and its own window and congestion control never react
//! to the emulated delay; the relay adds the delay to the byte stream instead. Use it for
//! functional tests of latency tolerance, not for TCP behaviour.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A running relay; dropping it stops accepting (open connections finish on their own).
#[derive(Debug)]
pub struct Proxy {
    local: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Listens on `listen` and relays each connection to `to`, delaying each direction's
    /// bytes by `delay`.
    pub fn start(listen: SocketAddr, to: SocketAddr, delay: Duration) -> std::io::Result<Self> {
        let listener = TcpListener::bind(listen)?;
        listener.set_nonblocking(true)?;
        let local = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("wan-proxy".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((client, _)) => {
                            if let Err(e) = relay(client, to, delay) {
                                tracing::warn!("proxy: connecting to {to}: {e}");
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        Err(e) => tracing::warn!("proxy: accept: {e}"),
                    }
                }
            })?;
        Ok(Self {
            local,
            stop,
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Blocks for as long as the relay runs.
    pub fn wait(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn relay(client: TcpStream, to: SocketAddr, delay: Duration) -> std::io::Result<()> {
    client.set_nonblocking(false)?;
    let server = TcpStream::connect_timeout(&to, Duration::from_secs(5))?;
    for s in [&client, &server] {
        s.set_nodelay(true)?;
    }
    pump(client.try_clone()?, server.try_clone()?, delay)?;
    pump(server, client, delay)?;
    Ok(())
}

/// Copies `from` → `to`, each chunk leaving `delay` after it arrived. A reader thread stamps
/// chunks; a writer thread sleeps until each chunk's time.
fn pump(mut from: TcpStream, mut to: TcpStream, delay: Duration) -> std::io::Result<()> {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::Builder::new()
        .name("wan-proxy-rd".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => {
                        let _ = tx.send((Instant::now() + delay, Vec::new()));
                        return;
                    }
                    Ok(n) => {
                        if tx
                            .send((Instant::now() + delay, buf[..n].to_vec()))
                            .is_err()
                        {
                            return;
                        }
                    }
                }
            }
        })?;
    std::thread::Builder::new()
        .name("wan-proxy-wr".into())
        .spawn(move || {
            for (at, chunk) in rx {
                let now = Instant::now();
                if at > now {
                    std::thread::sleep(at - now);
                }
                if chunk.is_empty() {
                    let _ = to.shutdown(Shutdown::Write);
                    return;
                }
                if to.write_all(&chunk).is_err() {
                    return;
                }
            }
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relay_delays_each_direction_and_delivers_every_byte() {
        // An echo server on loopback.
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let echo_addr = echo.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = echo.accept().unwrap();
            let mut buf = [0u8; 4096];
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => s.write_all(&buf[..n]).unwrap(),
                }
            }
        });
        let delay = Duration::from_millis(20);
        let proxy = Proxy::start("127.0.0.1:0".parse().unwrap(), echo_addr, delay).unwrap();
        let mut c = TcpStream::connect(proxy.local_addr()).unwrap();
        c.set_nodelay(true).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut rtts = Vec::new();
        for i in 0..10u8 {
            let t = Instant::now();
            c.write_all(&[i; 100]).unwrap();
            let mut got = [0u8; 100];
            c.read_exact(&mut got).unwrap();
            rtts.push(t.elapsed());
            assert_eq!(got, [i; 100]);
        }
        rtts.sort();
        let median = rtts[5];
        assert!(
            median >= Duration::from_millis(40) && median < Duration::from_millis(70),
            "median RTT {median:?}"
        );
    }
}
