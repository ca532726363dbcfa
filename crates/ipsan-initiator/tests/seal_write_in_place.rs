//! Where a sealed write's bytes go from (issue 27): under `--seal none` without compression
//! a sealed transfer is the plaintext unchanged and a trailer (docs/seal.md §4), so ipsan's
//! initiator sends the caller's own buffer and the trailer after it (`Data::WriteParts`; the
//! Data-Out at the join is cut in two there) instead of sealing a copy of every write. Before,
//! each `none` write of 1 MiB was copied into a sealed buffer of its own (a 1 MiB allocation
//! while the session's recycled buffers were all in flight, and a 1 MiB copy every time).
//!
//! The real target (in-process, on a runtime of its own) and the real initiator on this test's
//! thread, crypto inline (no worker pool: everything the initiator does for a write happens on
//! this thread) and session recovery on, as `ipsan bench` runs (the plaintext is kept for a
//! reissue); a counting global allocator (hence a test binary of its own) counts the
//! allocations of at least 200 KiB this thread makes during 16 writes of 1 MiB in flight at
//! once from one shared buffer, as `ipsan bench` sends them, on a fresh session; AES-256-GCM
//! for contrast (it must seal into a buffer of its own). Every write is read back: the target
//! took the plaintext and its trailer in separate Data-Out PDUs, and for lengths just over
//! what is sealed inline (64 KiB) too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod counting_alloc;

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::{config, seal_request, seal_target};
use ipsan_initiator::seal::SealRequest;
use ipsan_initiator::{IscsiUrl, LoginOptions, Session, SessionConfig};
use ipsan_seal::{Cipher, SealPolicy};

use counting_alloc::Counting;

const IQN: &str = "iqn.2026-11.org.ipsan:seal-write-in-place";
const SECRET: &[u8] = b"seal-write-in-place-pre-shared-secret-012";
const MIB: usize = 1 << 20;

#[global_allocator]
static A: Counting = Counting(counting_alloc::count_marked_large);

fn pattern(len: usize, seed: u32) -> Bytes {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ seed).to_le_bytes()[2])
        .collect::<Vec<u8>>()
        .into()
}

/// Sealed with `cipher`, crypto on the caller's thread, session recovery on.
fn inline_sealed_config(cipher: Cipher) -> SessionConfig {
    let inline = SealRequest {
        pool: None,
        ..seal_request(cipher, SECRET)
    };
    SessionConfig {
        extension: Some(inline.factory()),
        recovery_timeout: Some(Duration::from_secs(30)),
        ..config(LoginOptions::default())
    }
}

#[test]
fn accepts_none_writes_sent_from_the_callers_buffer_without_a_sealed_copy() {
    let target_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // `Allowed`: a `Required` target refuses `none`, which protects nothing.
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
                Session::open(&url, &inline_sealed_config(cipher)),
            )
            .await
            .unwrap()
            .unwrap();
            let s = Arc::new(s);
            let blocks = (MIB / 512) as u32;
            let shared = pattern(MIB, 7);
            // Counted from the first write of the session: a sealed copy has no recycled
            // buffer to go in yet.
            counting_alloc::mark(true);
            let before = counting_alloc::marked_large();
            let mut writes = tokio::task::JoinSet::new();
            for i in 0..16u64 {
                let (s, data) = (Arc::clone(&s), shared.clone());
                writes.spawn(async move { s.write(i * u64::from(blocks), data).await });
            }
            while let Some(w) = writes.join_next().await {
                w.unwrap().unwrap();
            }
            let large = counting_alloc::marked_large() - before;
            counting_alloc::mark(false);
            for i in 0..16u64 {
                let got = s
                    .read_into(i * u64::from(blocks), blocks, BytesMut::new())
                    .await
                    .unwrap();
                assert!(got[..] == shared[..], "{cipher}: write {i} read back");
            }
            // Just over what is sealed inline, with a partial chunk: a trailer of its own too.
            for (n, len) in [(1u32, 64 * 1024 + 512), (2, 192 * 1024 + 3 * 512)] {
                let data = pattern(len, n);
                let lba = (16 + u64::from(n)) * u64::from(blocks);
                s.write(lba, data.clone()).await.unwrap();
                let got = s
                    .read_into(lba, (len / 512) as u32, BytesMut::new())
                    .await
                    .unwrap();
                assert!(got[..] == data[..], "{cipher}: {len} bytes read back");
            }
            Arc::into_inner(s).unwrap().logout().await.unwrap();
            large
        });
        report.push(format!("{cipher}: {large}"));
        if cipher == Cipher::None {
            // Before: a sealed copy per write in flight, 16 (the session's buffers are
            // recycled only once a write has left).
            assert_eq!(
                large, 0,
                "the initiator allocated {large} buffers of ≥ 200 KiB for 16 `none` writes of \
                 1 MiB: it sealed copies of the caller's data"
            );
        }
    }
    println!(
        "large initiator allocations in 16 sealed writes of 1 MiB in flight: {}",
        report.join(", ")
    );
    target_rt.block_on(h.shutdown()).unwrap();
}
