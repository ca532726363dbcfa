#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Loopback throughput of Seal's framing and pipeline, end to end over TCP (no added delay):
//! sequential writes then sequential reads, each cipher against the `none` baseline and a plain
//! session. Both ends run in this process, so CPU per GB is initiator + target together.
//!
//! ```text
//! cargo run --release -p ipsan-seal --example loopback -- \
//!     [--io BYTES] [--depth N] [--total BYTES] [--crypto-workers N] [--pipeline on|off] [--reps N]
//!     [--cases none,plain,aes-256-gcm,chacha20-poly1305,3des-cbc-hmac-sha1] [--delay-ms D]
//! ```
//! Uses the toy block protocol of `tests/support/blockproto.rs` (not iSCSI); the iSCSI numbers
//! come from `ipsan bench` once the target and initiator integrate Seal.

#[path = "../tests/support/blockproto.rs"]
mod blockproto;
#[path = "../tests/support/keys.rs"]
mod keys;

use std::sync::Arc;
use std::time::Instant;

use blockproto::{Client, Sealing};
use ipsan_seal::{Cipher, CryptoPool};

struct Opts {
    io: usize,
    depth: usize,
    total: usize,
    workers: usize,
    pipeline: bool,
    reps: usize,
    cases: Vec<Option<Cipher>>,
    delay_ms: u64,
}

fn parse() -> Opts {
    let mut o = Opts {
        io: 1 << 20,
        depth: 16,
        total: 1 << 30,
        workers: 2,
        pipeline: true,
        reps: 3,
        delay_ms: 0,
        cases: vec![
            Some(Cipher::None),
            None,
            Some(Cipher::Aes256Gcm),
            Some(Cipher::ChaCha20Poly1305),
            Some(Cipher::TripleDesCbcHmacSha1),
        ],
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--io" => o.io = v.parse().unwrap(),
            "--depth" => o.depth = v.parse().unwrap(),
            "--total" => o.total = v.parse().unwrap(),
            "--crypto-workers" => o.workers = v.parse().unwrap(),
            "--pipeline" => o.pipeline = v == "on",
            "--reps" => o.reps = v.parse().unwrap(),
            // Hold every response this long at the server (a stand-in for a long link).
            "--delay-ms" => o.delay_ms = v.parse().unwrap(),
            // Comma-separated cipher names; `plain` = no Seal at all. Put `none` first: it is
            // the baseline the ratios divide by.
            "--cases" => {
                o.cases = v
                    .split(',')
                    .map(|c| (c != "plain").then(|| c.parse().unwrap()))
                    .collect()
            }
            _ => panic!("unknown flag {a}"),
        }
    }
    o
}

/// utime + stime of this process in seconds (/proc/self/stat fields 14 and 15, USER_HZ = 100).
fn cpu_seconds() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

/// utime + stime of this process's `seal-crypto-*` pool threads, in seconds.
fn crypto_cpu_seconds() -> f64 {
    let mut ticks = 0u64;
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("seal-crypto") {
            continue;
        }
        let Ok(s) = std::fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        let rest = &s[s.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        ticks += f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    }
    ticks as f64 / 100.0
}

struct Run {
    crypto_s_per_gb: f64,
    write_mbs: f64,
    read_mbs: f64,
    cpu_s_per_gb: f64,
}

async fn run(cipher: Option<Cipher>, o: &Opts, total: usize) -> Run {
    let (ci, ct) = match cipher {
        None => (None, None),
        Some(c) => {
            let (i, t) = keys::pair(c, 65536);
            let pool = Arc::new(CryptoPool::new(o.workers).unwrap());
            let mk = |s| Sealing {
                session: Arc::new(s),
                pool: Arc::clone(&pool),
                pipeline: o.pipeline,
            };
            (Some(mk(i)), Some(mk(t)))
        }
    };
    let depth = if o.pipeline { o.depth } else { 1 };
    let delay = std::time::Duration::from_millis(o.delay_ms);
    let (addr, _lun) = blockproto::serve_delayed(ct, total, delay).await;
    let client = Client::connect(addr, ci).await;
    let cpu0 = cpu_seconds();
    let crypto0 = crypto_cpu_seconds();
    let t0 = Instant::now();
    blockproto::sequential_write(&client, total, o.io, depth, 0x42).await;
    let tw = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    blockproto::sequential_read(&client, total, o.io, depth, 0x42).await;
    let tr = t1.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let crypto = crypto_cpu_seconds() - crypto0;
    let mb = total as f64 / 1e6;
    Run {
        write_mbs: mb / tw,
        read_mbs: mb / tr,
        cpu_s_per_gb: cpu / (2.0 * total as f64 / 1e9),
        crypto_s_per_gb: crypto / (2.0 * total as f64 / 1e9),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let o = parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "# loopback, io={} depth={} workers={} pipeline={} reps={} delay={}ms (median)",
        o.io,
        if o.pipeline { o.depth } else { 1 },
        o.workers,
        if o.pipeline { "on" } else { "off" },
        o.reps,
        o.delay_ms
    );
    println!("| seal | MB each way | write MB/s | read MB/s | CPU s/GB (both ends) | of which crypto pool | write vs none | read vs none |");
    println!("|---|---|---|---|---|---|---|---|");
    let cases = o.cases.clone();
    // 3DES runs at a few MB/s: move less data, once.
    let plan = |c: Option<Cipher>| {
        if c == Some(Cipher::TripleDesCbcHmacSha1) {
            ((16 << 20).min(o.total), 1)
        } else {
            (o.total, o.reps)
        }
    };
    // Interleave the cases rep by rep so drifting background load hits them alike.
    let mut results: Vec<Vec<Run>> = cases.iter().map(|_| Vec::new()).collect();
    for rep in 0..o.reps {
        for (i, &c) in cases.iter().enumerate() {
            let (total, reps) = plan(c);
            if rep < reps {
                results[i].push(rt.block_on(run(c, &o, total)));
            }
        }
    }
    let mut base: Option<(f64, f64)> = None;
    for (c, runs) in cases.iter().zip(results) {
        let w = median(runs.iter().map(|r| r.write_mbs).collect());
        let r = median(runs.iter().map(|r| r.read_mbs).collect());
        let cpu = median(runs.iter().map(|r| r.cpu_s_per_gb).collect());
        let crypto = median(runs.iter().map(|r| r.crypto_s_per_gb).collect());
        if *c == Some(Cipher::None) {
            base = Some((w, r));
        }
        let (bw, br) = base.unwrap_or((w, r));
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} |",
            c.map_or("plain (no seal)".to_owned(), |c| c.to_string()),
            plan(*c).0 / 1_000_000,
            w,
            r,
            cpu,
            crypto,
            w / bw,
            r / br
        );
    }
}
