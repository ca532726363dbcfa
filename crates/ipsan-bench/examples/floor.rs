//! The TCP request/response floor on loopback (issue 27): what one depth-1 command costs with no
//! iSCSI at all, so a measured latency can be given as a multiple of it.
//!
//! A client sends `--req` bytes (48: a SCSI Command PDU's BHS), a server answers with `--resp`
//! bytes (65,584: a 64 KiB Data-In's data plus one 48-byte BHS), one request in flight, over
//! one loopback TCP connection with TCP_NODELAY, blocking sockets and one thread per side: one
//! `write` and as many `read`s as the kernel needs on each side, nothing else. Prints the
//! round-trip latency (median, p99, min, mean) and one JSON line for the raw data.
//!
//! ```text
//! cargo run --release -p ipsan-bench --example floor -- [--iters 20000] [--warmup 2000]
//!     [--req 48] [--resp 65584] [--json]
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

fn arg(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let iters = arg(&args, "--iters", 20_000).max(1);
    let warmup = arg(&args, "--warmup", 2_000);
    let req_len = arg(&args, "--req", 48).max(1);
    let resp_len = arg(&args, "--resp", 64 * 1024 + 48).max(1);
    let json = args.iter().any(|a| a == "--json");

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut req = vec![0u8; req_len];
        let resp = vec![0x5au8; resp_len];
        // Until the client closes.
        while s.read_exact(&mut req).is_ok() {
            s.write_all(&resp).unwrap();
        }
    });

    let mut c = TcpStream::connect(addr).unwrap();
    c.set_nodelay(true).unwrap();
    let req = vec![0xa5u8; req_len];
    let mut resp = vec![0u8; resp_len];
    let mut ns: Vec<u64> = Vec::with_capacity(iters);
    let start = Instant::now();
    for i in 0..warmup + iters {
        let t0 = Instant::now();
        c.write_all(&req).unwrap();
        c.read_exact(&mut resp).unwrap();
        if i >= warmup {
            ns.push(t0.elapsed().as_nanos() as u64);
        }
    }
    let wall = start.elapsed();
    drop(c);
    server.join().unwrap();

    ns.sort_unstable();
    let q = |p: f64| ns[((ns.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0;
    let mean = ns.iter().sum::<u64>() as f64 / ns.len() as f64 / 1000.0;
    println!(
        "TCP request/response floor, loopback, {req_len} B up, {resp_len} B down, depth 1, \
         {iters} round trips (after {warmup}): median {:.1} us, p99 {:.1} us, min {:.1} us, \
         mean {mean:.1} us ({:.2} s)",
        q(0.5),
        q(0.99),
        q(0.0),
        wall.as_secs_f64()
    );
    if json {
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let line = serde_json::json!({
            "tool": "ipsan-bench example floor",
            "req_bytes": req_len,
            "resp_bytes": resp_len,
            "iters": iters,
            "warmup": warmup,
            "median_us": q(0.5),
            "p99_us": q(0.99),
            "p99_9_us": q(0.999),
            "min_us": q(0.0),
            "mean_us": mean,
            "loadavg": load.trim(),
        });
        println!("{line}");
    }
}
