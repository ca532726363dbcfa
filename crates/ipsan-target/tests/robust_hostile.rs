//! Hostile and malformed input against the real target (issue 8): each gets the RFC's answer
//! (Reject, login failure or connection close), memory stays bounded, and other sessions keep
//! working. Complements `hostile.rs` (unknown opcode, oversized segment, CmdSN window,
//! reinstatement, commands before login).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod robust_common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use iscsi_wire::header::*;
use iscsi_wire::{Header, Pdu, RESERVED_TAG};
use robust_common::*;
use tokio::io::AsyncWriteExt;

fn mem() -> ipsan_target::Config {
    config(&["mem:16MiB"], "")
}

#[test]
fn truncated_header_then_close_leaves_target_serving() {
    bounded(30, async {
        let t = start(&mem()).await;
        // Half a BHS during login, then the initiator goes away.
        let mut c = Raw::connect(t.addrs[0]).await;
        c.s.write_all(&[0x43, 0x87, 0, 0, 0, 0, 0, 0x40])
            .await
            .unwrap();
        c.s.shutdown().await.unwrap();
        assert!(
            c.closed_within(Duration::from_secs(5)).await,
            "target closes"
        );
        // Half a BHS in full feature phase.
        let mut d = Raw::connect(t.addrs[0]).await;
        d.login([0x80, 0, 0, 0, 1, 1]).await;
        d.s.write_all(&[0x01, 0x80, 0, 0, 0, 0, 0]).await.unwrap();
        d.s.shutdown().await.unwrap();
        assert!(
            d.closed_within(Duration::from_secs(5)).await,
            "target closes"
        );
        let mut ok = Raw::connect(t.addrs[0]).await;
        ok.login([0x80, 0, 0, 0, 1, 2]).await;
        assert!(is_good(&ok.test_unit_ready(1).await, 1));
        t.shutdown().await.unwrap();
    });
}

#[test]
fn rejects_ahs_whose_length_runs_past_the_segment() {
    bounded(30, async {
        let t = start(&mem()).await;
        let mut c = Raw::connect(t.addrs[0]).await;
        c.login([0x80, 0, 0, 0, 1, 3]).await;
        // One 8-byte AHS whose AHSLength claims 0x100 bytes of extended CDB.
        let cmd = c.command(
            5,
            [0x12, 0, 0, 0, 36, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            false,
            36,
        );
        let ahs = Bytes::from_static(&[0x01, 0x00, 0x01, 0, 1, 2, 3, 4]);
        c.send(&Pdu::with_ahs(cmd, ahs, Bytes::new())).await;
        let p = c.recv().await;
        assert_eq!(
            reject_reason(&p),
            Some(RejectReason::PROTOCOL_ERROR),
            "{p:?}"
        );
        assert!(is_good(&c.test_unit_ready(6).await, 6), "session continues");
        t.shutdown().await.unwrap();
    });
}

#[test]
fn rejects_data_segment_over_limit_during_login_without_allocating() {
    bounded(60, async {
        let t = start(&mem()).await;
        let before = rss_kib();
        // 64 connections, each a Login Request header claiming 16 MiB - 1 of text: over the
        // 8 KiB login limit. Were the buffer sized by the field, that is 1 GiB.
        let mut conns = Vec::new();
        for _ in 0..64 {
            let mut c = Raw::connect(t.addrs[0]).await;
            let mut raw = [0u8; 48];
            raw[0] = 0x43;
            raw[1] = 0x87;
            raw[5..8].copy_from_slice(&[0xff, 0xff, 0xff]);
            c.s.write_all(&raw).await.unwrap();
            conns.push(c);
        }
        for c in &mut conns {
            assert!(
                c.closed_within(Duration::from_secs(5)).await,
                "connection dropped"
            );
        }
        let after = rss_kib();
        assert!(
            after < before + 64 * 1024,
            "RSS grew from {before} KiB to {after} KiB"
        );
        let mut ok = Raw::connect(t.addrs[0]).await;
        ok.login([0x80, 0, 0, 0, 1, 4]).await;
        assert!(is_good(&ok.test_unit_ready(1).await, 1));
        t.shutdown().await.unwrap();
    });
}

#[test]
fn writes_claiming_64mib_each_do_not_grow_memory() {
    bounded(60, async {
        let t = start(&mem()).await;
        let mut c = Raw::connect(t.addrs[0]).await;
        c.login_with(
            [0x80, 0, 0, 0, 1, 5],
            &[("InitialR2T", "Yes"), ("ImmediateData", "No")],
        )
        .await;
        let before = rss_kib();
        let vm_before = vm_kib();
        // 32 WRITE(16)s of 131072 blocks (64 MiB) with EDTL 64 MiB whose data never comes:
        // buffers sized by the CDB alone would be 2 GiB.
        for i in 0..32u32 {
            let cmd = c.command(100 + i, write16_cdb(0, 131_072, false), true, 64 << 20);
            c.send(&Pdu::new(cmd, Bytes::new())).await;
        }
        // Each gets CHECK CONDITION (beyond the 16 MiB LU) or an R2T; drain what comes.
        let mut answered = 0;
        while let Ok(Some(_)) = c.recv_within(Duration::from_millis(500)).await {
            answered += 1;
        }
        let after = rss_kib();
        let vm_after = vm_kib();
        eprintln!("32 x 64 MiB writes without data: RSS {before} -> {after} KiB, VmSize {vm_before} -> {vm_after} KiB, {answered} answers");
        assert!(answered > 0, "the target answered");
        assert!(
            after < before + 128 * 1024,
            "RSS grew from {before} KiB to {after} KiB"
        );
        // Untouched buffers do not show in RSS; the mapping does.
        assert!(
            vm_after < vm_before + 512 * 1024,
            "VmSize grew from {vm_before} KiB to {vm_after} KiB: buffers sized by the CDB"
        );
        t.shutdown().await.unwrap();
    });
}

#[test]
fn rejects_data_out_for_unknown_task() {
    bounded(30, async {
        let t = start(&mem()).await;
        let mut c = Raw::connect(t.addrs[0]).await;
        c.login([0x80, 0, 0, 0, 1, 6]).await;
        let d = DataOut {
            final_: true,
            lun: 0,
            itt: 0xdead,
            ttt: 7,
            exp_stat_sn: c.exp_stat_sn,
            data_sn: 0,
            buffer_offset: 0,
        };
        c.send(&Pdu::new(d, Bytes::from_static(&[0u8; 512]))).await;
        let p = c.recv().await;
        assert_eq!(
            reject_reason(&p),
            Some(RejectReason::INVALID_PDU_FIELD),
            "{p:?}"
        );
        assert!(is_good(&c.test_unit_ready(2).await, 2), "session continues");
        t.shutdown().await.unwrap();
    });
}

#[test]
fn rejects_data_out_beyond_the_burst_and_fails_the_command() {
    bounded(30, async {
        let t = start(&mem()).await;
        let mut c = Raw::connect(t.addrs[0]).await;
        c.login_with(
            [0x80, 0, 0, 0, 1, 7],
            &[
                ("InitialR2T", "Yes"),
                ("ImmediateData", "No"),
                ("MaxBurstLength", "4096"),
                ("FirstBurstLength", "4096"),
            ],
        )
        .await;
        let cmd = c.command(9, write16_cdb(0, 8, false), true, 4096);
        c.send(&Pdu::new(cmd, Bytes::new())).await;
        let p = c.recv().await.expect("R2T");
        let Header::R2t(r2t) = p.header else {
            panic!("{:?}", p.header)
        };
        assert_eq!(r2t.desired_data_transfer_length, 4096);
        // 4096 + 512 bytes for a 4096-byte R2T.
        let d = DataOut {
            final_: true,
            lun: 0,
            itt: 9,
            ttt: r2t.ttt,
            exp_stat_sn: c.exp_stat_sn,
            data_sn: 0,
            buffer_offset: 0,
        };
        c.send(&Pdu::new(d, Bytes::from(vec![0x77u8; 4608]))).await;
        let mut saw_reject = false;
        let mut status = None;
        for _ in 0..2 {
            let p = c.recv().await.expect("an answer");
            match &p.header {
                Header::Reject(r) => {
                    assert_eq!(r.reason, RejectReason::PROTOCOL_ERROR);
                    saw_reject = true;
                }
                Header::ScsiResponse(_) => status = scsi_status(&p),
                h => panic!("unexpected {h:?}"),
            }
        }
        assert!(saw_reject, "Reject for the Data-Out");
        let (st, key, asc, _) = status.expect("the command ends");
        assert_eq!(
            (st, key, asc),
            (2, 0x0b, 0x4b),
            "CHECK CONDITION, ABORTED COMMAND, DATA PHASE ERROR"
        );
        // Nothing was written.
        let (data, st) = c.read16(10, 0, 8).await;
        assert_eq!(st, 0);
        assert!(data.iter().all(|&b| b == 0), "the bad write left no data");
        t.shutdown().await.unwrap();
    });
}

#[test]
fn wrong_data_digest_is_rejected_and_session_continues() {
    bounded(30, async {
        let t = start(&mem()).await;
        let mut c = Raw::connect(t.addrs[0]).await;
        let a = c
            .login_with(
                [0x80, 0, 0, 0, 1, 8],
                &[("HeaderDigest", "CRC32C"), ("DataDigest", "CRC32C")],
            )
            .await;
        assert_eq!(a.key("DataDigest"), Some("CRC32C"));
        let nop = NopOut {
            immediate: true,
            lun: 0,
            itt: 3,
            ttt: RESERVED_TAG,
            cmd_sn: c.cmd_sn,
            exp_stat_sn: c.exp_stat_sn,
        };
        // Flip a bit of the data digest (the last 4 bytes).
        c.send_tampered(&Pdu::new(nop, Bytes::from_static(b"ping")), |b| {
            let n = b.len();
            b[n - 1] ^= 1;
        })
        .await;
        let p = c.recv().await;
        assert_eq!(
            reject_reason(&p),
            Some(RejectReason::DATA_DIGEST_ERROR),
            "{p:?}"
        );
        assert!(is_good(&c.test_unit_ready(4).await, 4), "session continues");
        t.shutdown().await.unwrap();
    });
}

#[test]
fn wrong_header_digest_drops_the_connection_only() {
    bounded(30, async {
        let t = start(&mem()).await;
        let mut good = Raw::connect(t.addrs[0]).await;
        good.login_with([0x80, 0, 0, 0, 1, 9], &[("HeaderDigest", "CRC32C")])
            .await;
        let mut c = Raw::connect(t.addrs[0]).await;
        c.login_with([0x80, 0, 0, 0, 1, 10], &[("HeaderDigest", "CRC32C")])
            .await;
        assert!(c.codec.header_digest);
        let cmd = c.command(5, [0; 16], false, 0);
        // Flip a bit of the header digest (bytes 48..52).
        c.send_tampered(&Pdu::new(cmd, Bytes::new()), |b| b[49] ^= 0x10)
            .await;
        // RFC 7143 §7.8: the header cannot be trusted; the connection is dropped.
        assert!(
            c.closed_within(Duration::from_secs(5)).await,
            "connection dropped"
        );
        assert!(
            is_good(&good.test_unit_ready(1).await, 1),
            "other session unaffected"
        );
        t.shutdown().await.unwrap();
    });
}

#[test]
fn login_pdus_out_of_order_fail_the_login() {
    bounded(30, async {
        let t = start(&mem()).await;
        // Full feature phase as the current stage is not a login stage.
        let mut c = Raw::connect(t.addrs[0]).await;
        let a = c
            .login_step(
                [0x80, 0, 0, 0, 2, 1],
                Stage::FULL_FEATURE_PHASE,
                Stage::FULL_FEATURE_PHASE,
                true,
                &[("InitiatorName", INITIATOR), ("TargetName", IQN)],
            )
            .await
            .expect("a login response");
        assert_eq!(a.header.status_class, 2, "initiator error: {a:?}");
        assert!(c.closed_within(Duration::from_secs(5)).await);
        // Going back from operational negotiation to security negotiation.
        let mut c = Raw::connect(t.addrs[0]).await;
        let a = c
            .login_step(
                [0x80, 0, 0, 0, 2, 2],
                Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                false,
                &[
                    ("InitiatorName", INITIATOR),
                    ("TargetName", IQN),
                    ("SessionType", "Normal"),
                ],
            )
            .await
            .expect("a login response");
        assert!(a.ok(), "{a:?}");
        let b = c
            .login_step(
                [0x80, 0, 0, 0, 2, 2],
                Stage::SECURITY_NEGOTIATION,
                Stage::FULL_FEATURE_PHASE,
                true,
                &[("AuthMethod", "None")],
            )
            .await;
        // Either a failure status and a close, or a close straight away.
        if let Some(b) = b {
            assert_eq!(b.header.status_class, 2, "initiator error: {b:?}");
            assert!(c.closed_within(Duration::from_secs(5)).await);
        }
        // The first PDU is not a Login Request: covered by hostile.rs; the first Login skips
        // InitiatorName: a missing parameter.
        let mut c = Raw::connect(t.addrs[0]).await;
        let a = c
            .login_step(
                [0x80, 0, 0, 0, 2, 3],
                Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                Stage::FULL_FEATURE_PHASE,
                true,
                &[("TargetName", IQN)],
            )
            .await
            .expect("a login response");
        assert_eq!(a.header.status_class, 2, "{a:?}");
        t.shutdown().await.unwrap();
    });
}

#[test]
fn login_that_never_completes_is_dropped_after_the_timeout() {
    bounded(30, async {
        let mut cfg = mem();
        cfg.login_timeout = Duration::from_secs(1);
        let t = start(&cfg).await;
        // Silent from the start.
        let mut silent = Raw::connect(t.addrs[0]).await;
        // First step answered, then nothing.
        let mut stalled = Raw::connect(t.addrs[0]).await;
        let a = stalled
            .login_step(
                [0x80, 0, 0, 0, 3, 1],
                Stage::SECURITY_NEGOTIATION,
                Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                false,
                &[
                    ("InitiatorName", INITIATOR),
                    ("TargetName", IQN),
                    ("AuthMethod", "None"),
                ],
            )
            .await
            .unwrap();
        assert!(a.ok());
        let t0 = Instant::now();
        assert!(
            silent.closed_within(Duration::from_secs(5)).await,
            "silent login dropped"
        );
        assert!(
            stalled.closed_within(Duration::from_secs(5)).await,
            "stalled login dropped"
        );
        let took = t0.elapsed();
        assert!(took < Duration::from_secs(3), "dropped after {took:?}");
        t.shutdown().await.unwrap();
    });
}

#[test]
fn connections_over_the_limit_are_refused_and_the_limit_frees() {
    bounded(30, async {
        let mut cfg = mem();
        cfg.max_connections = 4;
        cfg.login_timeout = Duration::from_secs(1);
        let t = start(&cfg).await;
        let mut idle = Vec::new();
        for _ in 0..4 {
            idle.push(Raw::connect(t.addrs[0]).await);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut over = Raw::connect(t.addrs[0]).await;
        assert!(
            over.closed_within(Duration::from_millis(500)).await,
            "fifth connection refused"
        );
        // The idle ones time out at the login timeout and free their slots.
        for c in &mut idle {
            assert!(c.closed_within(Duration::from_secs(5)).await);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut ok = Raw::connect(t.addrs[0]).await;
        ok.login([0x80, 0, 0, 0, 3, 2]).await;
        assert!(is_good(&ok.test_unit_ready(1).await, 1));
        t.shutdown().await.unwrap();
    });
}

#[test]
fn a_thousand_idle_connections_do_not_stop_a_working_session() {
    bounded(120, async {
        let mut cfg = mem();
        cfg.login_timeout = Duration::from_secs(60);
        // All from 127.0.0.1 and mostly silent: lift the per-address cap and the first-PDU
        // timeout, which would otherwise close them (robust_limits.rs tests those).
        cfg.limits.max_connections_per_address = 2048;
        cfg.limits.first_pdu_timeout = Duration::from_secs(60);
        let t = start(&cfg).await;
        // Measure one session's write throughput alone, then with 1000 idle connections open
        // (each holds two fds in this process: the soft limit here is checked first).
        let mut c = Raw::connect(t.addrs[0]).await;
        c.login([0x80, 0, 0, 0, 4, 1]).await;
        // The first pass allocates the RAM LUN's chunks; measure the second.
        write_rate(&mut c, 64).await;
        let alone = write_rate(&mut c, 200).await;
        let before = rss_kib();
        let mut idle = Vec::new();
        for i in 0..1000 {
            let mut r = Raw::connect(t.addrs[0]).await;
            if i % 2 == 0 {
                // Half of them start a login and stall.
                r.s.write_all(&[0x43, 0x87, 0, 0]).await.unwrap();
            }
            idle.push(r);
        }
        let loaded = write_rate(&mut c, 200).await;
        let after = rss_kib();
        // A new session still logs in and works.
        let mut n = Raw::connect(t.addrs[0]).await;
        n.login([0x80, 0, 0, 0, 4, 2]).await;
        assert!(is_good(&n.test_unit_ready(1).await, 1));
        eprintln!(
            "64 KiB writes: {alone:.0} MB/s alone, {loaded:.0} MB/s with 1000 idle connections; RSS {before} -> {after} KiB"
        );
        assert!(
            loaded > alone / 4.0,
            "throughput collapsed: {alone:.0} -> {loaded:.0} MB/s"
        );
        assert!(
            after < before + 256 * 1024,
            "1000 idle connections cost {} KiB",
            after - before
        );
        drop(idle);
        t.shutdown().await.unwrap();
    });
}

/// `n` sequential 64 KiB writes; MB/s.
async fn write_rate(c: &mut Raw, n: u32) -> f64 {
    let data = Bytes::from(vec![0x3cu8; 65536]);
    let t0 = Instant::now();
    for i in 0..n {
        let p = c
            .write16(1000 + i, u64::from(i % 64) * 128, data.clone(), false)
            .await;
        assert!(is_good(&p, 1000 + i), "{p:?}");
    }
    f64::from(n) * 65536.0 / t0.elapsed().as_secs_f64() / 1e6
}
