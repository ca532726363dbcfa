//! `tune_for_path` across `ipsan wan` (two namespaces, 5 ms each way): both ends of a
//! connection, the one that connected and the one that accepted, judge it a long path from
//! the handshake alone and get paced, and a send buffer past the autotuning ceiling where the
//! host's `net.core.wmem_max` allows one (a plain `SO_SNDBUF` otherwise untouched), split
//! across a session's connections by `share_send_buffer`. Needs root and
//! /dev/net/tun; without them it prints `SKIPPED: <reason>` and returns. (Loopback, not a
//! long path, is the unit test in `src/path.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use ipsan_tcp::path::LONG_PATH_RTT;
use ipsan_tcp::SendBuffer;
use ipsan_wan::{link, DirConfig, Engine, Link, LinkConfig, Side};

struct Guard(String);
impl Drop for Guard {
    fn drop(&mut self) {
        let _ = link::cleanup(&self.0);
    }
}

#[test]
fn both_ends_of_a_wan_connection_are_paced_and_buffered_from_the_handshake_on() {
    if !link::is_root() || !std::path::Path::new("/dev/net/tun").exists() {
        println!("SKIPPED: needs root and /dev/net/tun (namespaces, TUN)");
        return;
    }
    let name = format!("tp{}", std::process::id());
    let _g = Guard(name.clone());
    let mut cfg = LinkConfig::new(&name).symmetric(DirConfig {
        delay: Duration::from_millis(5),
        ..Default::default()
    });
    cfg.engine = Engine::Builtin;
    // This test's own /24 of 10.231.0.0/16, away from the other suites' defaults.
    cfg.subnet = 200 + (std::process::id() % 20) as u8;
    let link = Link::up(cfg).unwrap();
    let tgt = link.addr(Side::Tgt);
    let l = link
        .run_in(Side::Tgt, move || TcpListener::bind((tgt, 0)))
        .unwrap()
        .unwrap();
    let addr = l.local_addr().unwrap();
    let c = link
        .run_in(Side::Ini, move || {
            TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        })
        .unwrap()
        .unwrap();
    let (s, _) = l.accept().unwrap();
    let read = |p: &str| std::fs::read_to_string(p).unwrap();
    let wmem_max: u64 = read("/proc/sys/net/core/wmem_max").trim().parse().unwrap();
    let tcp_wmem_max: u64 = read("/proc/sys/net/ipv4/tcp_wmem")
        .split_whitespace()
        .nth(2)
        .unwrap()
        .parse()
        .unwrap();
    for (end, sock) in [("connecting", &c), ("accepting", &s)] {
        let t = ipsan_tcp::tune_for_path(sock, SendBuffer::Path).unwrap();
        assert!(t.rtt >= LONG_PATH_RTT, "{end}: {t:?}");
        assert!(t.long && t.paced, "{end}: {t:?}");
        let sndbuf = socket2::SockRef::from(sock).send_buffer_size().unwrap() as u64;
        if wmem_max * 2 > tcp_wmem_max {
            assert_eq!(t.sndbuf, Some(wmem_max * 2), "{end}: {t:?}");
            assert_eq!(
                sndbuf,
                wmem_max * 2,
                "{end}: the kernel doubles the request"
            );
            // One of two connections of a session: half the whole, down to the ceiling.
            let half = (wmem_max / 2 * 2).max(tcp_wmem_max.next_multiple_of(2));
            assert_eq!(
                ipsan_tcp::share_send_buffer(sock, 2).unwrap(),
                Some(half),
                "{end}"
            );
            assert_eq!(
                socket2::SockRef::from(sock).send_buffer_size().unwrap() as u64,
                half,
                "{end}"
            );
            // Alone again: the whole.
            assert_eq!(
                ipsan_tcp::share_send_buffer(sock, 1).unwrap(),
                Some(wmem_max * 2),
                "{end}"
            );
        } else {
            assert_eq!(
                ipsan_tcp::share_send_buffer(sock, 2).unwrap(),
                None,
                "{end}"
            );
            assert_eq!(
                t.sndbuf, None,
                "{end}: autotuning's ceiling is higher: {t:?}"
            );
        }
        assert_eq!(
            ipsan_tcp::max_pacing_rate(sock).unwrap(),
            u64::MAX - 1,
            "{end}: paced by the kernel, no cap of its own"
        );
    }
}
