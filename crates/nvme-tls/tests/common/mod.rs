//! What the record tests share (`records.rs`, `batching.rs`, `loopback.rs`): the host and
//! subsystem NQNs, a position-dependent byte pattern and its check, reading until an error,
//! and a relay on the path that hands each of the host's encrypted records to an [`Edit`].
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

pub const H: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d65-766d-4000-8000-000000000001";
pub const S: &str = "nqn.2026-11.org.example:nvmet";
pub const T: Duration = Duration::from_secs(30);
/// A TLS 1.3 record's plaintext at most.
pub const RECORD: usize = 16 * 1024;

/// The byte at offset `i` of a test stream: position-dependent, so a piece lost, repeated or
/// moved shows.
pub fn pattern(i: usize, seed: u32) -> u8 {
    ((i as u32 ^ seed).wrapping_mul(2_654_435_761) >> 24) as u8
}

pub fn bytes(from: usize, len: usize, seed: u32) -> Vec<u8> {
    (from..from + len).map(|i| pattern(i, seed)).collect()
}

/// Reads exactly `len` bytes and checks them against the pattern.
pub async fn read_pattern<R: AsyncRead + Unpin>(r: &mut R, len: usize, seed: u32) {
    let mut got = vec![0u8; len];
    timeout(T, r.read_exact(&mut got)).await.unwrap().unwrap();
    assert!(
        got == bytes(0, len, seed),
        "the bytes read differ from those sent"
    );
}

/// Reads with a buffer of `buf` bytes until an error or the end (within [`T`]): what was
/// delivered, and the error (`None`: a clean end).
pub async fn read_until_error<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: usize,
) -> (Vec<u8>, Option<std::io::Error>) {
    let mut got = Vec::new();
    let mut buf = vec![0u8; buf];
    let err = timeout(T, async {
        loop {
            match r.read(&mut buf).await {
                Ok(0) => return None,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => return Some(e),
            }
        }
    })
    .await
    .unwrap();
    (got, err)
}

/// What the relay does with the `n`-th encrypted record (and the records it holds back): the
/// records to forward in its place; an empty record in the list ends the connection there.
pub type Edit = fn(usize, Vec<u8>, &mut Vec<Vec<u8>>) -> Vec<Vec<u8>>;

/// A relay between host and target: the target's bytes go back unchanged; the host's TLS
/// records are read one by one and each encrypted one (content type 23 outside; 1 = the
/// host's Finished) goes through `edit`. Runs until either side closes.
pub async fn relay_records(host: TcpStream, target: TcpStream, edit: Edit) {
    let (mut hr, mut hw) = host.into_split();
    let (mut tr, mut tw) = target.into_split();
    let back = tokio::spawn(async move { tokio::io::copy(&mut tr, &mut hw).await });
    let mut records = 0;
    let mut held = Vec::new();
    loop {
        let mut hdr = [0u8; 5];
        if hr.read_exact(&mut hdr).await.is_err() {
            break;
        }
        let len = usize::from(u16::from_be_bytes([hdr[3], hdr[4]]));
        let mut rec = hdr.to_vec();
        rec.resize(5 + len, 0);
        if hr.read_exact(&mut rec[5..]).await.is_err() {
            break;
        }
        let out = if hdr[0] == 23 {
            records += 1;
            edit(records, rec, &mut held)
        } else {
            vec![rec]
        };
        for r in out {
            if r.is_empty() {
                // The relay ends the connection here (no close_notify).
                let _ = tw.shutdown().await;
                back.abort();
                return;
            }
            if tw.write_all(&r).await.is_err() {
                break;
            }
        }
    }
    back.abort();
}
