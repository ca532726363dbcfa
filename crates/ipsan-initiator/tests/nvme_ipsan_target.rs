//! The NVMe/TCP host (`ipsan_initiator::nvme`) against ipsan's own NVMe/TCP target, in
//! process on loopback: one RAM LUN served over iSCSI and NVMe/TCP at once. Writes through
//! NVMe (in-capsule and R2T-solicited, several H2CData PDUs per R2T, two queues, both
//! digests, many commands in flight) read back the same through NVMe and through iSCSI, and
//! the other way round; the Discovery log lists the subsystem; Keep Alive holds an idle
//! controller past its KATO.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ipsan_initiator::nvme::{self, NvmeConfig, NvmeSession, NvmeUrl};
use ipsan_initiator::{IscsiUrl, Session, SessionConfig};
use ipsan_target::ServerHandle;

const IQN: &str = "iqn.2026-11.org.ipsan:nvme-host";
const NQN: &str = "nqn.2026-11.org.ipsan:nvme-host";

fn pattern(len: usize, seed: u32) -> Bytes {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ seed).to_le_bytes()[2])
        .collect::<Vec<u8>>()
        .into()
}

fn nvme_url(h: &ServerHandle) -> NvmeUrl {
    NvmeUrl::parse(&format!("nvme+tcp://{}/{NQN}/1", h.nvme_addrs[0])).unwrap()
}

#[tokio::test]
async fn accepts_ipsan_target_and_both_protocols_see_the_same_data() {
    // 64 KiB of in-capsule data (the default): the 512 KiB write below goes through an R2T.
    let h = common::nvme_target_with(IQN, "mem:64MiB", Some(64 * 1024)).await;
    let cfg = NvmeConfig {
        queues: 2,
        header_digest: true,
        data_digest: true,
        ..NvmeConfig::default()
    };
    let s = Arc::new(
        tokio::time::timeout(
            Duration::from_secs(10),
            NvmeSession::open(&nvme_url(&h), &cfg),
        )
        .await
        .unwrap()
        .unwrap(),
    );
    assert_eq!(s.queues(), 2);
    assert!(s.transport().0, "header digest");
    assert!(s.transport().1, "data digest");
    let cap = s.capacity().unwrap();
    assert_eq!(cap.bytes(), 64 << 20);
    let bl = u64::from(cap.block_len);
    // 4 KiB fits the capsule; 512 KiB needs an R2T, answered by one H2CData PDU (MAXH2CDATA
    // is the largest transfer, 1 MiB) and read back as one C2HData. Data split over several
    // PDUs is the host queue's tests' (nvme-proto's tests/host_queue.rs) and Linux's target's.
    assert!(s.transport().2 >= 1 << 20);
    let small = pattern(4096, 1);
    let big = pattern(512 * 1024, 2);
    s.write(0, small.clone()).await.unwrap();
    s.write(4096 / bl, big.clone()).await.unwrap();
    let got = s
        .read_into(0, (4096 / bl) as u32, BytesMut::new())
        .await
        .unwrap();
    assert_eq!(&got[..], &small[..]);
    let got = s
        .read_into(4096 / bl, (512 * 1024 / bl) as u32, BytesMut::new())
        .await
        .unwrap();
    assert_eq!(&got[..], &big[..]);

    // 64 commands in flight over the two queues, each its own 8 KiB at its own LBA.
    let mut set = tokio::task::JoinSet::new();
    for i in 0..64u32 {
        let s = s.clone();
        set.spawn(async move {
            let lba = (1 << 20) / bl + u64::from(i) * 8192 / bl;
            s.write(lba, pattern(8192, 100 + i)).await.unwrap();
            let back = s
                .read_into(lba, (8192 / bl) as u32, BytesMut::new())
                .await
                .unwrap();
            assert_eq!(&back[..], &pattern(8192, 100 + i)[..], "command {i}");
        });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap();
    }
    s.flush().await.unwrap();

    // The same LU through iSCSI: what NVMe wrote, and the other way round.
    let url = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", h.addrs[0])).unwrap();
    let iscsi = Session::open(&url, &SessionConfig::default())
        .await
        .unwrap();
    let got = iscsi
        .read_into(4096 / bl, (512 * 1024 / bl) as u32, BytesMut::new())
        .await
        .unwrap();
    assert_eq!(&got[..], &big[..]);
    let from_iscsi = pattern(65536, 9);
    iscsi
        .write((8 << 20) / bl, from_iscsi.clone())
        .await
        .unwrap();
    let got = s
        .read_into((8 << 20) / bl, (65536 / bl) as u32, BytesMut::new())
        .await
        .unwrap();
    assert_eq!(&got[..], &from_iscsi[..]);
    iscsi.logout().await.unwrap();

    // Reading past the namespace is refused before anything is sent.
    let past = s.read_into(cap.blocks, 1, BytesMut::new()).await;
    assert!(past.is_err());
    Arc::try_unwrap(s).unwrap().close().await.unwrap();
    h.shutdown().await.unwrap();
}

/// Whole 1 MiB writes (issue 30): the target receives a 1 MiB write's data into a buffer of
/// its own and the RAM store keeps it as its chunk: in the write's capsule (an in-capsule
/// size of 1 MiB) or in an H2CData after an R2T (the default, 64 KiB). Chunk-aligned
/// and unaligned 1 MiB writes in flight together on two queues, with 4 KiB writes between
/// them, without digests, with a header digest (placed behind it) and with a data digest
/// (not placed): every write reads back, a 4 KiB write into a kept chunk lands in it and
/// leaves the rest, and iSCSI reads what NVMe wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_whole_1mib_writes_kept_by_the_ram_store() {
    for in_capsule in [Some(1 << 20), None] {
        whole_1mib_writes(in_capsule).await;
    }
}

async fn whole_1mib_writes(in_capsule: Option<u32>) {
    const MIB: u64 = 1 << 20;
    let h = common::nvme_target_with(IQN, "mem:64MiB", in_capsule).await;
    for (round, (hd, dd)) in [(false, false), (true, false), (false, true)]
        .into_iter()
        .enumerate()
    {
        let cfg = NvmeConfig {
            queues: 2,
            header_digest: hd,
            data_digest: dd,
            ..NvmeConfig::default()
        };
        let s = Arc::new(NvmeSession::open(&nvme_url(&h), &cfg).await.unwrap());
        let bl = u64::from(s.capacity().unwrap().block_len);
        let seed = 1000 * (round as u32 + 1);
        // (byte offset, length, seed): whole chunks, an unaligned 1 MiB, 4 KiB writes.
        let mut writes = Vec::new();
        for i in 0..8u64 {
            writes.push((i * MIB, MIB, seed + i as u32));
        }
        writes.push((8 * MIB + 4096, MIB, seed + 8));
        for i in 0..4u64 {
            writes.push((16 * MIB + i * 4096, 4096, seed + 20 + i as u32));
        }
        let mut set = tokio::task::JoinSet::new();
        for &(off, len, sd) in &writes {
            let s = s.clone();
            set.spawn(async move { s.write(off / bl, pattern(len as usize, sd)).await });
        }
        while let Some(r) = set.join_next().await {
            r.unwrap().unwrap();
        }
        // A short write into a kept chunk: only its 4 KiB change.
        let patch = pattern(4096, seed + 99);
        s.write((2 * MIB + 8192) / bl, patch.clone()).await.unwrap();
        for &(off, len, sd) in &writes {
            let got = s
                .read_into(off / bl, (len / bl) as u32, BytesMut::new())
                .await
                .unwrap();
            let mut want = pattern(len as usize, sd).to_vec();
            if off == 2 * MIB {
                want[8192..12288].copy_from_slice(&patch);
            }
            assert_eq!(
                &got[..],
                &want[..],
                "{in_capsule:?} round {round}: {len} at {off}"
            );
        }
        let url = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", h.addrs[0])).unwrap();
        let iscsi = Session::open(&url, &SessionConfig::default())
            .await
            .unwrap();
        let got = iscsi
            .read_into(5 * MIB / bl, (MIB / bl) as u32, BytesMut::new())
            .await
            .unwrap();
        assert_eq!(
            &got[..],
            &pattern(MIB as usize, seed + 5)[..],
            "round {round}"
        );
        iscsi.logout().await.unwrap();
        Arc::try_unwrap(s).unwrap().close().await.unwrap();
    }
    h.shutdown().await.unwrap();
}

/// More callers than a queue holds (queue_depth 4: 3 commands in flight), on both threads of a
/// multi-thread runtime: the callers that find room submit their commands themselves (one
/// alone writes its capsule too), the others wait in the dispatcher's channel and go out as
/// completions make room. Every write reads back, and a depth-1 caller after them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_more_callers_than_the_queue_holds_from_both_threads() {
    let h = common::nvme_target(IQN, "mem:64MiB").await;
    let cfg = NvmeConfig {
        queues: 1,
        queue_depth: 4,
        ..NvmeConfig::default()
    };
    let s = Arc::new(
        tokio::time::timeout(
            Duration::from_secs(10),
            NvmeSession::open(&nvme_url(&h), &cfg),
        )
        .await
        .unwrap()
        .unwrap(),
    );
    let bl = u64::from(s.capacity().unwrap().block_len);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..48u32 {
        let s = s.clone();
        set.spawn(async move {
            let lba = u64::from(i) * 16384 / bl;
            // Odd callers write in-capsule (8 KiB), even ones past it (16 KiB: an R2T).
            let data = pattern(if i % 2 == 1 { 8192 } else { 16384 }, 500 + i);
            s.write(lba, data.clone()).await.unwrap();
            let n = (data.len() as u64 / bl) as u32;
            let back = s.read_into(lba, n, BytesMut::new()).await.unwrap();
            assert_eq!(&back[..], &data[..], "caller {i}");
        });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap();
    }
    // One caller alone, many times: the capsule written by the caller itself.
    let mut buf = BytesMut::new();
    for i in 0..200u32 {
        let lba = u64::from(i % 48) * 16384 / bl;
        let data = pattern(if i % 48 % 2 == 1 { 8192 } else { 16384 }, 500 + i % 48);
        let got = s
            .read_into(lba, (data.len() as u64 / bl) as u32, buf)
            .await
            .unwrap();
        assert_eq!(&got[..], &data[..], "read {i}");
        buf = got.try_into_mut().unwrap_or_default();
    }
    Arc::try_unwrap(s).unwrap().close().await.unwrap();
    h.shutdown().await.unwrap();
}

#[tokio::test]
async fn accepts_ipsan_discovery_log_listing_the_subsystem() {
    let h = common::nvme_target(IQN, "mem:64MiB").await;
    let url = NvmeUrl::parse(&format!("nvme+tcp://{}", h.nvme_addrs[0])).unwrap();
    let (_, entries) = nvme::discover(&url, &NvmeConfig::default()).await.unwrap();
    let e = entries
        .iter()
        .find(|e| e.subnqn == NQN)
        .unwrap_or_else(|| panic!("{NQN} not in {entries:?}"));
    assert_eq!(e.trtype, 3, "TCP");
    assert_eq!(e.subtype, 2, "an NVM subsystem");
    assert_eq!(
        format!("{}:{}", e.traddr, e.trsvcid),
        h.nvme_addrs[0].to_string()
    );
    h.shutdown().await.unwrap();
}

#[tokio::test]
async fn accepts_an_idle_session_past_kato_because_keep_alive_runs() {
    let h = common::nvme_target(IQN, "mem:64MiB").await;
    let cfg = NvmeConfig {
        kato: Duration::from_secs(1),
        ..NvmeConfig::default()
    };
    let s = NvmeSession::open(&nvme_url(&h), &cfg).await.unwrap();
    // Three KATOs of silence from the application: only Keep Alive keeps the controller (the
    // target ends a controller whose KATO passes without a command).
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let data = pattern(4096, 7);
    s.write(0, data.clone()).await.unwrap();
    let back = s.read_into(0, 8, BytesMut::new()).await.unwrap();
    assert_eq!(&back[..], &data[..]);
    s.close().await.unwrap();
    h.shutdown().await.unwrap();
}
