//! What the target allocates to answer a `--seal none` READ (issue 27): under `none` without
//! compression a sealed transfer is the plaintext unchanged and a trailer, so the target sends
//! a RAM store's own memory and the trailer in a Data-In of its own (`none_trailer`). It used
//! to read the data into a buffer of its own first (room to seal in place, which `none`
//! never uses): a 1 MiB copy and a 1 MiB allocation per READ.
//!
//! The real target (in-process, on a runtime whose threads are marked) and the real
//! initiator on loopback; a counting global allocator (hence a test binary of its own) counts
//! the allocations of at least 200 KiB the target's threads make during 16 sealed `none`
//! READs of 1 MiB, and the AES-256-GCM ones for contrast (they seal in a buffer of their own).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod counting_alloc;

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::{seal_target, sealed_config};
use ipsan_initiator::{IscsiUrl, Session};
use ipsan_seal::{Cipher, SealPolicy};

use counting_alloc::Counting;

const IQN: &str = "iqn.2026-11.org.ipsan:target-read-buffers";
const SECRET: &[u8] = b"target-read-buffers-pre-shared-secret-0123";
const MIB: usize = 1 << 20;

#[global_allocator]
static A: Counting = Counting(counting_alloc::count_marked_large);

#[test]
fn accepts_none_reads_answered_from_the_stores_memory_without_a_buffer_per_read() {
    let target_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .on_thread_start(|| counting_alloc::mark(true))
        .enable_all()
        .build()
        .unwrap();
    let h = target_rt.block_on(seal_target(IQN, SECRET, SealPolicy::Allowed, None));
    let url = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", h.addrs[0])).unwrap();
    let host_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut report = Vec::new();
    for cipher in [Cipher::None, Cipher::Aes256Gcm] {
        let large = host_rt.block_on(async {
            let s = tokio::time::timeout(
                Duration::from_secs(10),
                Session::open(&url, &sealed_config(cipher, SECRET)),
            )
            .await
            .unwrap()
            .unwrap();
            let blocks = (MIB / 512) as u32;
            let data: Vec<Bytes> = (0..4u8)
                .map(|i| Bytes::from(vec![i.wrapping_mul(37).wrapping_add(1); MIB]))
                .collect();
            for (i, d) in data.iter().enumerate() {
                s.write(i as u64 * u64::from(blocks), d.clone())
                    .await
                    .unwrap();
            }
            let mut buf = BytesMut::new();
            // Warm up (first reads of each chunk, the session's buffers).
            for i in 0..4 {
                buf = s
                    .read_into(i as u64 * u64::from(blocks), blocks, buf)
                    .await
                    .unwrap();
            }
            let before = counting_alloc::marked_large();
            for n in 0..16 {
                let i = n % 4;
                let got = s
                    .read_into(i as u64 * u64::from(blocks), blocks, buf)
                    .await
                    .unwrap();
                assert!(got[..] == data[i][..], "{cipher}: read {n}");
                buf = got;
            }
            let large = counting_alloc::marked_large() - before;
            s.logout().await.unwrap();
            large
        });
        report.push(format!("{cipher}: {large}"));
        if cipher == Cipher::None {
            // Before: one buffer of 1 MiB (and its copy) per READ, 16.
            assert!(
                large <= 2,
                "the target allocated {large} buffers of ≥ 200 KiB for 16 `none` reads of 1 MiB: \
                 it did not answer from the store's memory"
            );
        }
    }
    println!(
        "large target allocations in 16 sealed reads of 1 MiB: {}",
        report.join(", ")
    );
    target_rt.block_on(h.shutdown()).unwrap();
}
