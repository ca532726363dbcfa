//! One-way throughput of nvme-tls over loopback TCP against plain TCP, per cipher suite and
//! record layer (OpenSSL's, nvme-tls's own), with the process's CPU seconds per GB (both ends are in this process, on one tokio runtime).
//!
//! `cargo run --release -p nvme-tls --example throughput [MiB] [ROW]` (default 1024 MiB; ROW:
//! run only the rows whose name contains it, e.g. `own`, `openssl`, `plain`, for `perf`). Compare
//! the extra CPU with the cipher's own cost: `openssl speed -evp aes-128-gcm -bytes 16384`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use nvme_proto::psk::{ConfiguredPsk, Derivation, IdentityVersion, PskHash, PskStore};
use nvme_tls::RecordLayer;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const H: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d65-766d-4000-8000-000000000001";
const S: &str = "nqn.2026-11.org.example:nvmet";
const CHUNK: usize = 128 * 1024;

fn cpu_seconds() -> f64 {
    // utime + stime of this process from /proc/self/stat (fields 14 and 15, in clock ticks).
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / 100.0
}

async fn pump<R, W>(mut r: R, mut w: W, bytes: usize)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin,
{
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; CHUNK];
        let mut got = 0;
        while got < bytes {
            let n = r.read(&mut buf).await.unwrap();
            assert!(n > 0);
            got += n;
        }
        r
    });
    let buf = vec![0xa5u8; CHUNK];
    let mut sent = 0;
    while sent < bytes {
        w.write_all(&buf).await.unwrap();
        sent += CHUNK;
    }
    w.flush().await.unwrap();
    let _r = reader.await.unwrap();
}

async fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (s, _) = l.accept().await.unwrap();
    (c, s)
}

fn report(what: &str, bytes: usize, wall: f64, cpu: f64) {
    let gb = bytes as f64 / 1e9;
    println!(
        "{what:<32} {:>8.0} MB/s  {:>6.2} CPU-s/GB",
        bytes as f64 / 1e6 / wall,
        cpu / gb
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().unwrap())
        .unwrap_or(1024);
    let bytes = mib * 1024 * 1024;
    let only = std::env::args().nth(2).unwrap_or_default();
    let runs = |name: &str| name.contains(only.as_str());

    if runs("plain TCP") {
        let (c, s) = pair().await;
        let (t, cpu) = (Instant::now(), cpu_seconds());
        pump(s, c, bytes).await;
        report(
            "plain TCP",
            bytes,
            t.elapsed().as_secs_f64(),
            cpu_seconds() - cpu,
        );
    }

    // Each suite with OpenSSL's record layer and with nvme-tls's own (the default).
    for hash in [PskHash::Sha256, PskHash::Sha384] {
        for layer in [RecordLayer::OpenSsl, RecordLayer::Own] {
            let name = match layer {
                RecordLayer::OpenSsl => "openssl",
                RecordLayer::Own => "own",
            };
            let name = format!("{} {name}", hash.cipher_suite());
            if !runs(&name) {
                continue;
            }
            let key = ConfiguredPsk::new(Some(hash), &vec![7u8; hash.key_len()]).unwrap();
            let mut store = PskStore::new();
            store.insert(H, S, key.clone());
            let (c, s) = pair().await;
            let server =
                tokio::spawn(
                    async move { nvme_tls::accept_using(s, &store, layer).await.unwrap() },
                );
            let (id, psk) = key.tls_psk(H, S, IdentityVersion::V0, Derivation::Libnvme);
            let client = nvme_tls::connect_using(c, &id, &psk, layer).await.unwrap();
            let server = server.await.unwrap().stream;
            let (t, cpu) = (Instant::now(), cpu_seconds());
            pump(server, client, bytes).await;
            report(&name, bytes, t.elapsed().as_secs_f64(), cpu_seconds() - cpu);
        }
    }

    // The sender's records coalesced into 256 KiB socket writes by a BufWriter under the TLS
    // stream: how the records of a batch shared a system call before `TlsStream` did it
    // itself (kept for comparison with older builds; now it only adds a copy).
    if !runs("AES_128_GCM + BufWriter") {
        return;
    }
    let key = ConfiguredPsk::new(Some(PskHash::Sha256), &[7u8; 32]).unwrap();
    let mut store = PskStore::new();
    store.insert(H, S, key.clone());
    let (c, s) = pair().await;
    let server = tokio::spawn(async move { nvme_tls::accept(s, &store).await.unwrap() });
    let (id, psk) = key.tls_psk(H, S, IdentityVersion::V0, Derivation::Libnvme);
    let c = tokio::io::BufWriter::with_capacity(256 * 1024, c);
    let client = nvme_tls::connect_with(c, &id, &psk).await.unwrap();
    let server = server.await.unwrap().stream;
    let (t, cpu) = (Instant::now(), cpu_seconds());
    pump(server, client, bytes).await;
    report(
        "AES_128_GCM + BufWriter",
        bytes,
        t.elapsed().as_secs_f64(),
        cpu_seconds() - cpu,
    );
}
