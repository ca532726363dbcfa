#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Brings a lab link up at a given one-way delay and prints its calibration (RTT, SOCKET):
//! `cargo run --release -p ipsan-lab --example calib -- 8` (root).

use std::time::Duration;

use ipsan_lab::calibrate::{self, Sockets};
use ipsan_wan::{DirConfig, Link, LinkConfig, Side};

struct L(Link);

impl Sockets for L {
    fn listen(&self) -> std::io::Result<std::net::TcpListener> {
        let a = std::net::SocketAddr::from((self.0.addr(Side::Tgt), 0));
        self.0
            .run_in(Side::Tgt, move || std::net::TcpListener::bind(a))
            .map_err(std::io::Error::other)?
    }
    fn connect(&self, addr: std::net::SocketAddr) -> std::io::Result<std::net::TcpStream> {
        self.0
            .run_in(Side::Ini, move || std::net::TcpStream::connect(addr))
            .map_err(std::io::Error::other)?
    }
}

fn main() {
    let ms: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(8.0);
    let dir = DirConfig {
        delay: Duration::from_secs_f64(ms / 1e3),
        ..DirConfig::default()
    };
    let mut cfg = LinkConfig::new("labcalib").symmetric(dir);
    cfg.subnet = 188;
    let l = L(Link::up(cfg).unwrap());
    println!("rtt {:?}", calibrate::rtt(&l, 10).unwrap());
    for secs in [1.0, 2.0, 4.0] {
        let s = calibrate::socket_throughput(&l, Duration::from_secs_f64(secs)).unwrap();
        println!("socket {secs}s: {:.1} MB/s", s / 1e6);
    }
}
