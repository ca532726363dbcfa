//! Connection recovery inside a session (ErrorRecoveryLevel 2, RFC 7143 §7.2, §11.5.1 TASK
//! REASSIGN; issue 28) against the real target, from a raw client that speaks the PDUs itself:
//! a session's only connection is cut with a WRITE half sent and a READ half received, a new
//! connection logs into the same session (its TSIH) and takes both tasks over, the write's
//! missing data is solicited again and lands on the LU, the read's missing Data-In and its
//! status come on the new connection. A session that negotiated level 0 ends with its last
//! connection as before.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod robust_common;

use std::time::Duration;

use bytes::Bytes;
use ipsan_target::{Config, ServerHandle};
use iscsi_wire::header::*;
use iscsi_wire::{Header, Pdu};
use robust_common::{bounded, read16_cdb, write16_cdb, Raw, INITIATOR, IQN};

const ISID: [u8; 6] = [0x80, 0, 0, 0, 0x28, 2];
/// The read: 64 blocks at LBA 0; the write: 128 blocks at LBA 4096.
const READ_BLOCKS: u32 = 64;
const WRITE_LBA: u64 = 4096;
const WRITE_BYTES: u32 = 64 << 10;
/// The part of the write sent before the cut.
const SENT_BEFORE_CUT: u32 = 16 << 10;
const SEG: usize = 8192;

/// A target offering ErrorRecoveryLevel 2 with one 16 MiB in-memory LU.
async fn start(erl: u32) -> ServerHandle {
    let toml = format!(
        "[server]\nportals = [\"127.0.0.1:0\"]\nnop_interval_secs = 0\nerror_recovery_level = {erl}\n\n\
         [[target]]\niqn = \"{IQN}\"\n[[target.lun]]\nid = 0\nbackend = \"mem:16MiB\"\n"
    );
    let c = Config::from_toml(&toml).unwrap();
    assert_eq!(c.error_recovery_level, erl);
    ServerHandle::start(&c).await.unwrap()
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

/// Logs a connection into session `tsih` (0: a new one) on `cid`, offering `erl`.
async fn login(
    addr: std::net::SocketAddr,
    tsih: u16,
    cid: u16,
    cmd_sn: u32,
    erl: &str,
) -> (Raw, LoginResponse, Option<String>) {
    let mut raw = Raw::connect(addr).await;
    raw.cmd_sn = cmd_sn;
    let a = raw
        .login_join(
            INITIATOR,
            ISID,
            tsih,
            cid,
            &[("ErrorRecoveryLevel", erl), ("InitialR2T", "Yes")],
        )
        .await;
    let erl = a.key("ErrorRecoveryLevel").map(str::to_owned);
    (raw, a.header, erl)
}

fn data_out(
    itt: u32,
    ttt: u32,
    data_sn: u32,
    offset: u32,
    data: &[u8],
    last: bool,
    exp_stat_sn: u32,
) -> Pdu {
    Pdu::new(
        DataOut {
            final_: last,
            lun: 0,
            itt,
            ttt,
            exp_stat_sn,
            data_sn,
            buffer_offset: offset,
        },
        Bytes::copy_from_slice(data),
    )
}

fn reassign(raw: &mut Raw, itt: u32, rtt: u32, exp_data_sn: u32) -> Pdu {
    Pdu::new(
        TaskMgmtRequest {
            immediate: true,
            function: TmfFunction::TASK_REASSIGN,
            lun: 0,
            itt,
            referenced_task_tag: rtt,
            cmd_sn: raw.cmd_sn,
            exp_stat_sn: raw.exp_stat_sn,
            ref_cmd_sn: 0,
            exp_data_sn,
        },
        Bytes::new(),
    )
}

/// The next PDU, skipping NOP-Ins.
async fn next(raw: &mut Raw) -> Pdu {
    loop {
        let p = raw.recv().await.expect("the connection stays open");
        if !matches!(p.header, Header::NopIn(_)) {
            return p;
        }
    }
}

async fn reassigns_a_read_and_a_write_to_a_new_connection(new_cid: u16) {
    let t = start(2).await;
    let addr = t.addrs[0];
    let (mut a, h, erl) = login(addr, 0, 1, 1, "2").await;
    assert_eq!(h.status_class, 0, "login: {h:?}");
    assert_eq!(
        erl.as_deref(),
        Some("2"),
        "the session runs at ErrorRecoveryLevel 2"
    );
    let tsih = h.tsih;

    // The data the read will fetch, written first (immediate data, 8 KiB a command).
    let read_data = pattern(7, READ_BLOCKS as usize * 512);
    for (k, chunk) in read_data.chunks(SEG).enumerate() {
        let itt = 0x10 + k as u32;
        let r = a
            .write16(
                itt,
                (k * SEG / 512) as u64,
                Bytes::copy_from_slice(chunk),
                false,
            )
            .await;
        assert!(robust_common::is_good(&r, itt), "setup write {k}: {r:?}");
    }

    // The WRITE: no immediate data, so the target asks for all of it with an R2T.
    let write_data = pattern(99, WRITE_BYTES as usize);
    let (w_itt, r_itt) = (0x100, 0x101);
    let cmd = a.command(
        w_itt,
        write16_cdb(WRITE_LBA, WRITE_BYTES / 512, false),
        true,
        WRITE_BYTES,
    );
    a.send(&Pdu::new(cmd, Bytes::new())).await;
    let r2t = match next(&mut a).await.header {
        Header::R2t(r) => r,
        h => panic!("expected the write's R2T, got {h:?}"),
    };
    assert_eq!((r2t.itt, r2t.buffer_offset), (w_itt, 0));
    // A quarter of it, then the READ on the same connection: the read's first Data-In shows
    // the target took that data in.
    for (k, chunk) in write_data[..SENT_BEFORE_CUT as usize]
        .chunks(SEG)
        .enumerate()
    {
        let p = data_out(
            w_itt,
            r2t.ttt,
            k as u32,
            (k * SEG) as u32,
            chunk,
            false,
            a.exp_stat_sn,
        );
        a.send(&p).await;
    }
    let cmd = a.command(r_itt, read16_cdb(0, READ_BLOCKS), false, READ_BLOCKS * 512);
    let cmd_sn_next = a.cmd_sn;
    a.send(&Pdu::new(cmd, Bytes::new())).await;
    let first = next(&mut a).await;
    let Header::DataIn(d) = &first.header else {
        panic!("expected the read's first Data-In, got {:?}", first.header)
    };
    assert_eq!((d.itt, d.data_sn, d.buffer_offset), (r_itt, 0, 0));
    assert!(!d.status_present, "the read is cut before its status");
    let mut got = vec![0u8; READ_BLOCKS as usize * 512];
    got[..first.data.len()].copy_from_slice(&first.data);

    // The cut: the session's only connection is gone, the rest of the read unread.
    drop(a);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A new connection logs into the same session.
    let (mut b, h, _) = login(addr, tsih, new_cid, cmd_sn_next, "2").await;
    assert_eq!(
        h.status_class, 0,
        "the session outlived its last connection (ErrorRecoveryLevel 2): {h:?}"
    );
    assert_eq!(h.tsih, tsih);
    b.codec.max_recv_data_segment_length = 262_144;

    // TASK REASSIGN of the write: Function complete, then an R2T for what never arrived.
    let tmf = reassign(&mut b, 0x200, w_itt, 1);
    b.send(&tmf).await;
    match next(&mut b).await.header {
        Header::TaskMgmtResponse(r) => {
            assert_eq!((r.itt, r.response), (0x200, TmfResponse::FUNCTION_COMPLETE));
        }
        h => panic!("expected the TASK REASSIGN's response, got {h:?}"),
    }
    let mut need = WRITE_BYTES - SENT_BEFORE_CUT;
    let write_status = loop {
        let p = next(&mut b).await;
        match p.header {
            Header::R2t(r) => {
                assert_eq!(r.itt, w_itt);
                assert!(
                    r.buffer_offset >= SENT_BEFORE_CUT,
                    "only what never arrived is asked again: {r:?}"
                );
                let (o, l) = (
                    r.buffer_offset as usize,
                    r.desired_data_transfer_length as usize,
                );
                let chunks: Vec<&[u8]> = write_data[o..o + l].chunks(SEG).collect();
                for (k, c) in chunks.iter().enumerate() {
                    let last = k + 1 == chunks.len();
                    let p = data_out(
                        w_itt,
                        r.ttt,
                        k as u32,
                        (o + k * SEG) as u32,
                        c,
                        last,
                        b.exp_stat_sn,
                    );
                    b.send(&p).await;
                }
                need -= l as u32;
            }
            Header::ScsiResponse(r) => {
                assert_eq!(r.itt, w_itt);
                break r.status;
            }
            h => panic!("unexpected {h:?}"),
        }
    };
    assert_eq!(need, 0, "the recovery R2Ts cover the rest of the write");
    assert_eq!(write_status, 0, "the reassigned write completes GOOD");

    // TASK REASSIGN of the read with ExpDataSN 1: the Data-In from DataSN 1 and its status.
    let tmf = reassign(&mut b, 0x201, r_itt, 1);
    b.send(&tmf).await;
    match next(&mut b).await.header {
        Header::TaskMgmtResponse(r) => {
            assert_eq!((r.itt, r.response), (0x201, TmfResponse::FUNCTION_COMPLETE));
        }
        h => panic!("expected the TASK REASSIGN's response, got {h:?}"),
    }
    let read_status = loop {
        let p = next(&mut b).await;
        match p.header {
            Header::DataIn(d) => {
                assert_eq!(d.itt, r_itt);
                assert!(
                    d.data_sn >= 1,
                    "DataSN 0 was acknowledged and is not sent again"
                );
                let o = d.buffer_offset as usize;
                got[o..o + p.data.len()].copy_from_slice(&p.data);
                if d.status_present {
                    break d.status;
                }
            }
            Header::ScsiResponse(r) => {
                assert_eq!(r.itt, r_itt);
                break r.status;
            }
            h => panic!("unexpected {h:?}"),
        }
    };
    assert_eq!(read_status, 0);
    assert!(
        got == read_data,
        "the read's data, half from each connection, is the LU's"
    );

    // The write's data is on the LU, all of it.
    let (on_lu, st) = b.read16(0x300, WRITE_LBA, WRITE_BYTES / 512).await;
    assert_eq!(st, 0);
    assert!(
        on_lu == write_data,
        "the write's data, half from each connection, is on the LU"
    );
    t.shutdown().await.unwrap();
}

#[test]
fn accepts_task_reassign_of_a_read_and_a_write_on_a_new_cid_after_the_last_connection_died() {
    bounded(30, reassigns_a_read_and_a_write_to_a_new_connection(2));
}

#[test]
fn accepts_task_reassign_of_a_read_and_a_write_on_the_same_cid_after_the_last_connection_died() {
    bounded(30, reassigns_a_read_and_a_write_to_a_new_connection(1));
}

/// An initiator offering level 0 gets 0 from a target offering 2, and its session ends with
/// its last connection as before: a login naming its TSIH is refused.
#[test]
fn rejects_joining_a_level_0_session_after_its_last_connection_died() {
    bounded(30, async {
        let t = start(2).await;
        let addr = t.addrs[0];
        let (mut a, h, erl) = login(addr, 0, 1, 1, "0").await;
        assert_eq!(h.status_class, 0);
        assert_eq!(erl.as_deref(), Some("0"));
        let cmd = a.command(0x100, write16_cdb(0, 128, false), true, 64 << 10);
        a.send(&Pdu::new(cmd, Bytes::new())).await;
        assert!(matches!(next(&mut a).await.header, Header::R2t(_)));
        drop(a);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (_b, h, _) = login(addr, h.tsih, 2, 2, "0").await;
        assert_ne!(
            h.status_class, 0,
            "a level 0 session ends with its last connection: {h:?}"
        );
        t.shutdown().await.unwrap();
    });
}

/// Tasks nobody reassigns keep the session only DefaultTime2Wait + DefaultTime2Retain: then it
/// ends, and a login naming its TSIH is refused.
#[test]
fn rejects_joining_a_level_2_session_after_time2wait_and_time2retain_ran_out() {
    bounded(30, async {
        let t = start(2).await;
        let addr = t.addrs[0];
        let mut a = Raw::connect(addr).await;
        let keys = [
            ("ErrorRecoveryLevel", "2"),
            ("InitialR2T", "Yes"),
            ("DefaultTime2Wait", "0"),
            ("DefaultTime2Retain", "1"),
        ];
        let ans = a.login_join(INITIATOR, ISID, 0, 1, &keys).await;
        assert!(ans.ok(), "{ans:?}");
        let secs = |k: &str| -> u64 { ans.key(k).map_or(0, |v| v.parse().unwrap()) };
        let keep = secs("DefaultTime2Wait") + secs("DefaultTime2Retain");
        assert!(
            keep <= 3,
            "the negotiated Time2Wait + Time2Retain: {keep} s"
        );
        let tsih = ans.header.tsih;
        let cmd = a.command(0x100, write16_cdb(0, 128, false), true, 64 << 10);
        a.send(&Pdu::new(cmd, Bytes::new())).await;
        assert!(matches!(next(&mut a).await.header, Header::R2t(_)));
        drop(a);
        // Still there just after the cut: a connection may join (and leave again at once).
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (b, h, _) = login(addr, tsih, 2, 2, "2").await;
        assert_eq!(h.status_class, 0, "kept within Time2Retain: {h:?}");
        drop(b);
        tokio::time::sleep(Duration::from_millis(keep * 1000 + 1500)).await;
        let (_c, h, _) = login(addr, tsih, 3, 2, "2").await;
        assert_ne!(
            h.status_class, 0,
            "ended after Time2Wait + Time2Retain: {h:?}"
        );
        t.shutdown().await.unwrap();
    });
}

#[test]
fn rejects_an_error_recovery_level_above_2_in_the_config() {
    let toml = "[server]\nerror_recovery_level = 3\n";
    let e = Config::from_toml(toml).unwrap_err().to_string();
    assert!(e.contains("error_recovery_level"), "{e}");
}

/// A TCP relay to `to` that holds everything it receives while `hold` says so (it keeps
/// reading meanwhile).
async fn relay(
    to: std::net::SocketAddr,
    hold: tokio::sync::watch::Receiver<bool>,
) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((a, _)) = l.accept().await {
            let b = tokio::net::TcpStream::connect(to).await.unwrap();
            let (ar, aw) = a.into_split();
            let (br, bw) = b.into_split();
            type R = Box<dyn tokio::io::AsyncRead + Unpin + Send>;
            type W = Box<dyn tokio::io::AsyncWrite + Unpin + Send>;
            let pairs: [(R, W); 2] = [(Box::new(ar), Box::new(bw)), (Box::new(br), Box::new(aw))];
            for (mut r, mut w) in pairs {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 << 10];
                    loop {
                        let n = match r.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        if tx.send(buf[..n].to_vec()).is_err() {
                            return;
                        }
                    }
                });
                let mut hold = hold.clone();
                tokio::spawn(async move {
                    while let Some(chunk) = rx.recv().await {
                        if hold.wait_for(|h| !*h).await.is_err() {
                            return;
                        }
                        if w.write_all(&chunk).await.is_err() {
                            return;
                        }
                    }
                });
            }
        }
    });
    addr
}

/// A far target (one 16 MiB in-memory LU) behind a [`relay`], and a gateway target offering
/// ErrorRecoveryLevel 2 whose LUN 0 is the far target's, reached through the relay: the far
/// target, the gateway, and the relay's switch (`true`: hold what the far target is sent).
async fn pass_through_gateway() -> (ServerHandle, ServerHandle, tokio::sync::watch::Sender<bool>) {
    const FAR_IQN: &str = "iqn.2026-11.org.ipsan:far";
    let far_cfg = Config::from_toml(&format!(
        "[server]\nportals = [\"127.0.0.1:0\"]\nnop_interval_secs = 0\n\n\
         [[target]]\niqn = \"{FAR_IQN}\"\n[[target.lun]]\nid = 0\nbackend = \"mem:16MiB\"\n"
    ))
    .unwrap();
    let far = ServerHandle::start(&far_cfg).await.unwrap();
    let (hold_tx, hold_rx) = tokio::sync::watch::channel(false);
    let via = relay(far.addrs[0], hold_rx).await;
    let toml = format!(
        "[server]\nportals = [\"127.0.0.1:0\"]\nnop_interval_secs = 0\nerror_recovery_level = 2\n\n\
         [[target]]\niqn = \"{IQN}\"\n[[target.lun]]\nid = 0\nbackend = \"iscsi://{via}/{FAR_IQN}/0\"\n"
    );
    let gw = ServerHandle::start(&Config::from_toml(&toml).unwrap())
        .await
        .unwrap();
    (far, gw, hold_tx)
}

/// A gateway's pass-through READ still running on the far target when the host's only
/// connection dies: a new connection takes it over with TASK REASSIGN and gets its data and
/// status once the far target answers (the completion the old connection's command hands in
/// goes to the task's new connection).
#[test]
fn accepts_task_reassign_of_a_pass_through_read_still_running_when_its_connection_died() {
    bounded(30, async {
        let (far, gw, hold_tx) = pass_through_gateway().await;
        let addr = gw.addrs[0];
        let (mut a, h, erl) = login(addr, 0, 1, 1, "2").await;
        assert_eq!(h.status_class, 0, "login: {h:?}");
        assert_eq!(erl.as_deref(), Some("2"));
        let tsih = h.tsih;
        let data = pattern(42, SEG);
        let r = a
            .write16(0x10, 0, Bytes::copy_from_slice(&data), false)
            .await;
        assert!(
            robust_common::is_good(&r, 0x10),
            "setup write through the gateway: {r:?}"
        );

        // The far target stops answering; the READ is forwarded and waits there.
        hold_tx.send(true).unwrap();
        let r_itt = 0x101;
        let cmd = a.command(r_itt, read16_cdb(0, (SEG / 512) as u32), false, SEG as u32);
        let cmd_sn_next = a.cmd_sn;
        a.send(&Pdu::new(cmd, Bytes::new())).await;
        assert!(
            a.recv_within(Duration::from_millis(300)).await.is_err(),
            "the read is still running"
        );
        drop(a);
        tokio::time::sleep(Duration::from_millis(500)).await;

        let (mut b, h, _) = login(addr, tsih, 2, cmd_sn_next, "2").await;
        assert_eq!(
            h.status_class, 0,
            "the session outlived its last connection: {h:?}"
        );
        b.codec.max_recv_data_segment_length = 262_144;
        let tmf = reassign(&mut b, 0x201, r_itt, 0);
        b.send(&tmf).await;
        match next(&mut b).await.header {
            Header::TaskMgmtResponse(r) => {
                assert_eq!((r.itt, r.response), (0x201, TmfResponse::FUNCTION_COMPLETE));
            }
            h => panic!("expected the TASK REASSIGN's response, got {h:?}"),
        }
        hold_tx.send(false).unwrap();
        let mut got = vec![0u8; SEG];
        let status = loop {
            let p = next(&mut b).await;
            match p.header {
                Header::DataIn(d) => {
                    assert_eq!(d.itt, r_itt);
                    let o = d.buffer_offset as usize;
                    got[o..o + p.data.len()].copy_from_slice(&p.data);
                    if d.status_present {
                        break d.status;
                    }
                }
                Header::ScsiResponse(r) => {
                    assert_eq!(r.itt, r_itt);
                    break r.status;
                }
                h => panic!("unexpected {h:?}"),
            }
        };
        assert_eq!(status, 0);
        assert!(
            got == data,
            "the reassigned pass-through read brings the far LU's data"
        );
        gw.shutdown().await.unwrap();
        far.shutdown().await.unwrap();
    });
}

/// A gateway's pass-through READ still running at the far target when the host's only
/// connection dies, never reassigned: once Time2Wait + Time2Retain pass the engine drops it and
/// the driver aborts it on the far target (the gateway's remote session is asked for an ABORT
/// TASK) although
/// the connection the command came on is still waiting for it: the abort is taken by the
/// session's other connection.
#[test]
fn accepts_an_expired_pass_through_task_being_aborted_on_the_far_target() {
    bounded(30, async {
        let log = robust_common::captured_log(tracing::Level::DEBUG);
        let (far, gw, hold_tx) = pass_through_gateway().await;
        let addr = gw.addrs[0];
        let mut a = Raw::connect(addr).await;
        let keys = [
            ("ErrorRecoveryLevel", "2"),
            ("DefaultTime2Wait", "0"),
            ("DefaultTime2Retain", "1"),
        ];
        let ans = a.login_join(INITIATOR, ISID, 0, 1, &keys).await;
        assert!(ans.ok(), "{ans:?}");
        let secs = |k: &str| -> u64 { ans.key(k).map_or(0, |v| v.parse().unwrap()) };
        let keep = secs("DefaultTime2Wait") + secs("DefaultTime2Retain");
        assert!(
            keep <= 3,
            "the negotiated Time2Wait + Time2Retain: {keep} s"
        );
        let tsih = ans.header.tsih;
        let r = a.write16(0x10, 0, Bytes::from(vec![5u8; 512]), false).await;
        assert!(
            robust_common::is_good(&r, 0x10),
            "setup write through the gateway: {r:?}"
        );

        hold_tx.send(true).unwrap();
        let cmd = a.command(0x101, read16_cdb(0, 1), false, 512);
        let cmd_sn_next = a.cmd_sn;
        a.send(&Pdu::new(cmd, Bytes::new())).await;
        assert!(
            a.recv_within(Duration::from_millis(300)).await.is_err(),
            "the read is still running"
        );
        drop(a);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (_b, h, _) = login(addr, tsih, 2, cmd_sn_next, "2").await;
        assert_eq!(
            h.status_class, 0,
            "the session outlived its last connection: {h:?}"
        );
        let aborted = || {
            log.lock()
                .unwrap()
                .contains("ABORT TASK asked by the caller")
        };
        assert!(
            !aborted(),
            "nothing is aborted while the task waits for TASK REASSIGN"
        );
        let until = tokio::time::Instant::now() + Duration::from_millis(keep * 1000 + 3000);
        while !aborted() && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            aborted(),
            "the gateway's remote session was asked to abort the expired task (ABORT TASK)"
        );
        hold_tx.send(false).unwrap();
        gw.shutdown().await.unwrap();
        far.shutdown().await.unwrap();
    });
}
