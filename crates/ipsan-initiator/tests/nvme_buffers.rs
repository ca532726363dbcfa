//! Where a long NVMe/TCP read's bytes live (issue 30): ipsan's target serves a 1 MiB read of a
//! RAM namespace from the store's own memory (no read buffer, no copy: the socket's copy is
//! the only one, as its iSCSI side does since issue 27), and ipsan's host receives it into
//! buffers that go round (the one the previous read handed back) instead of a fresh 1 MiB
//! buffer per read, whose page zeroing was 43–46 % of the host's CPU at 1 MiB reads.
//!
//! The real target and host in one process, on loopback: the target on a runtime of its own
//! whose threads are marked, the host on this test's thread; a counting global allocator
//! (hence a test binary of its own) counts the large allocations each side makes while the
//! host reads, handing each read's data back as the next read's buffer as `ipsan bench` does.
//! On the code before this test (3378dc6) the 16 measured reads made 16 on each side.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod counting_alloc;

mod common;

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ipsan_initiator::nvme::{NvmeConfig, NvmeSession, NvmeUrl};

use counting_alloc::Counting;

const IQN: &str = "iqn.2026-11.org.ipsan:nvme-buffers";
const NQN: &str = "nqn.2026-11.org.ipsan:nvme-buffers";

/// An allocation at least this large is a data buffer (a command's data is 1 MiB here; nothing
/// else either side allocates per command comes near).
const LARGE: usize = 512 * 1024;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Other,
    Target,
    Host,
}

thread_local! {
    static SIDE: Cell<Side> = const { Cell::new(Side::Other) };
}

static TARGET_LARGE: AtomicUsize = AtomicUsize::new(0);
static HOST_LARGE: AtomicUsize = AtomicUsize::new(0);

fn count(size: usize) {
    if size < LARGE {
        return;
    }
    // `try_with`: a thread being torn down has no thread-locals left.
    match SIDE.try_with(Cell::get) {
        Ok(Side::Target) => TARGET_LARGE.fetch_add(1, Ordering::Relaxed),
        Ok(Side::Host) => HOST_LARGE.fetch_add(1, Ordering::Relaxed),
        _ => 0,
    };
}

#[global_allocator]
static A: Counting = Counting(count);

const MIB: usize = 1 << 20;

fn pattern(len: usize, seed: u32) -> Bytes {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ seed).to_le_bytes()[2])
        .collect::<Vec<u8>>()
        .into()
}

#[test]
fn accepts_1mib_reads_served_from_the_ram_store_into_host_buffers_that_go_round() {
    // The target: its own runtime, every thread of it (workers and blocking pool) marked.
    let target_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(|| SIDE.with(|s| s.set(Side::Target)))
        .build()
        .unwrap();
    let h = target_rt.block_on(common::nvme_target(IQN, "mem:16MiB"));
    let url = NvmeUrl::parse(&format!("nvme+tcp://{}/{NQN}/1", h.nvme_addrs[0])).unwrap();

    // The host: this thread, one thread for all of it (as `ipsan bench` runs by default).
    SIDE.with(|s| s.set(Side::Host));
    let host_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (target, host) = host_rt.block_on(async {
        let s = tokio::time::timeout(
            Duration::from_secs(10),
            NvmeSession::open(&url, &NvmeConfig::default()),
        )
        .await
        .unwrap()
        .unwrap();
        let bl = u64::from(s.capacity().unwrap().block_len);
        let blocks = (MIB as u64 / bl) as u32;
        assert!(s.max_transfer() as usize >= MIB);
        // Four chunks of the RAM store written (an unwritten one reads as zeroes, copied).
        let data: Vec<Bytes> = (0..4).map(|i| pattern(MIB, i)).collect();
        for (i, d) in data.iter().enumerate() {
            s.write(i as u64 * u64::from(blocks), d.clone())
                .await
                .unwrap();
        }
        let mut buf = BytesMut::new();
        let read = |i: usize, b: BytesMut| {
            let s = &s;
            async move { s.read_into(i as u64 * u64::from(blocks), blocks, b).await }
        };
        // Warm up: the host's receive buffers are allocated once.
        for (i, d) in data.iter().enumerate() {
            let got = read(i, buf).await.unwrap();
            assert_eq!(&got[..], &d[..]);
            buf = got.try_into_mut().unwrap_or_default();
        }
        let (t0, h0) = (
            TARGET_LARGE.load(Ordering::Relaxed),
            HOST_LARGE.load(Ordering::Relaxed),
        );
        for n in 0..16 {
            let i = n % 4;
            let got = read(i, buf).await.unwrap();
            assert_eq!(&got[..], &data[i][..], "read {n}");
            buf = got.try_into_mut().unwrap_or_default();
        }
        let counts = (
            TARGET_LARGE.load(Ordering::Relaxed) - t0,
            HOST_LARGE.load(Ordering::Relaxed) - h0,
        );
        s.close().await.unwrap();
        counts
    });
    println!("large allocations in 16 reads of 1 MiB: target {target}, host {host}");
    assert_eq!(
        target, 0,
        "the target allocated {target} buffers of ≥ 512 KiB for 16 reads of 1 MiB: it copied \
         the RAM store's data instead of sending the store's own bytes"
    );
    // Without buffers that go round the host allocates one per read (16). On a quiet machine
    // it was seen to allocate 1–2 of 16 here (0 under load): which PDU boundary makes a
    // receive buffer grow is not found yet (the session's closing note says so); the bound
    // keeps what the test is for, that the host does not allocate per read.
    assert!(
        host <= 2,
        "the host allocated {host} buffers of ≥ 512 KiB for 16 reads of 1 MiB: its receive \
         buffers do not go round"
    );
    target_rt.block_on(h.shutdown()).unwrap();
}
