//! `tune_for_path` across `ipsan wan` (two namespaces, 5 ms each way): both ends of a
//! connection, the one that connected and the one that accepted, judge it a long path from
//! the handshake alone and get paced. Needs root and
//! /dev/net/tun; without them it prints `SKIPPED: <reason>` and returns. (Loopback, not a
//! long path, is the unit test in `src/path.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use ipsan_tcp::path::LONG_PATH_RTT;
use ipsan_wan::{link, DirConfig, Engine, Link, LinkConfig, Side};

struct Guard(String);
impl Drop for Guard {
    fn drop(&mut self) {
        let _ = link::cleanup(&self.0);
    }
}

#[test]
fn both_ends_of_a_wan_connection_are_paced_from_the_handshake_on() {
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
    for (end, sock) in [("connecting", &c), ("accepting", &s)] {
        let t = ipsan_tcp::tune_for_path(sock).unwrap();
        assert!(t.rtt >= LONG_PATH_RTT, "{end}: {t:?}");
        assert!(t.long && t.paced, "{end}: {t:?}");
        assert_eq!(
            ipsan_tcp::max_pacing_rate(sock).unwrap(),
            u64::MAX - 1,
            "{end}: paced by the kernel, no cap of its own"
        );
    }
}
