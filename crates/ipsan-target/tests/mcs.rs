//! Several connections in one session (RFC 7143 §4.2, MaxConnections > 1; issue 28) against
//! the real target, from a raw client that speaks the PDUs itself: a connection joins with the
//! session's TSIH, commands from both connections share one CmdSN window and run in CmdSN
//! order, a third connection is refused at MaxConnections, and a Logout of one connection
//! leaves the session running on the other.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod robust_common;

use std::time::Duration;

use bytes::Bytes;
use ipsan_target::ServerHandle;
use iscsi_wire::header::*;
use iscsi_wire::{Header, Pdu};
use robust_common::{config, LoginAnswer, Raw, INITIATOR};

async fn start() -> ServerHandle {
    let c = config(&["mem:16MiB"], "");
    assert_eq!(c.connections_per_session, 4, "the default");
    ServerHandle::start(&c).await.unwrap()
}

/// Logs `raw` in straight to full feature phase on connection `cid` of session (`isid`,
/// `tsih`) with `extra` keys; the response and its keys.
async fn login(
    raw: &mut Raw,
    isid: [u8; 6],
    tsih: u16,
    cid: u16,
    extra: &[(&str, &str)],
) -> (LoginResponse, Vec<(String, String)>) {
    let LoginAnswer { header, keys } = raw.login_join(INITIATOR, isid, tsih, cid, extra).await;
    (header, keys)
}

/// Sends TEST UNIT READY as task `itt` with `cmd_sn` (the caller numbers commands across
/// connections).
async fn test_unit_ready(raw: &mut Raw, itt: u32, cmd_sn: u32) {
    let cmd = ScsiCommand {
        immediate: false,
        final_: true,
        read: false,
        write: false,
        attr: TaskAttr::SIMPLE,
        lun: 0,
        itt,
        expected_data_transfer_length: 0,
        cmd_sn,
        exp_stat_sn: 0,
        cdb: [0; 16],
    };
    raw.send(&Pdu::new(cmd, Bytes::new())).await;
}

/// The next PDU within `wait`, or None (closed, or nothing came).
async fn recv_within(raw: &mut Raw, wait: Duration) -> Option<Pdu> {
    raw.recv_within(wait).await.ok().flatten()
}

/// The first session's open connections once they are 2 (a connection is added, or one
/// closes, right after its last PDU: waited for, bounded).
async fn connections(t: &ServerHandle) -> usize {
    let mut n = 0;
    for _ in 0..200 {
        n = t.registry().sessions()[0].connections;
        if n == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    n
}

/// The SCSI Response's (StatSN, ExpCmdSN) when it is GOOD for `itt`.
fn good(p: Option<Pdu>, itt: u32) -> (u32, u32) {
    match p {
        Some(Pdu {
            header: Header::ScsiResponse(r),
            ..
        }) if r.itt == itt && r.status == 0 && r.response == 0 => (r.stat_sn, r.exp_cmd_sn),
        other => panic!("ITT {itt}: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_a_second_connection_and_runs_both_in_one_cmdsn_window() {
    let t = start().await;
    let addr = t.addrs[0];
    let isid = [0x80, 0, 0, 0, 0x28, 1];
    let mut a = Raw::connect(addr).await;
    let (r, keys) = login(&mut a, isid, 0, 0, &[("MaxConnections", "2")]).await;
    assert_eq!((r.status_class, r.status_detail), (0, 0));
    assert!(
        keys.iter().any(|(k, v)| k == "MaxConnections" && v == "2"),
        "the lower offer: {keys:?}"
    );
    let tsih = r.tsih;
    let mut b = Raw::connect(addr).await;
    let (r, _) = login(&mut b, isid, tsih, 1, &[]).await;
    assert_eq!(
        (r.status_class, r.status_detail, r.tsih),
        (0, 0, tsih),
        "joins"
    );
    assert_eq!(t.registry().sessions().len(), 1, "one session");
    assert_eq!(connections(&t).await, 2, "of two connections");

    test_unit_ready(&mut a, 1, 1).await;
    let (sa, exp) = good(a.recv().await, 1);
    assert_eq!(exp, 2);
    test_unit_ready(&mut b, 2, 2).await;
    let (sb, exp) = good(b.recv().await, 2);
    assert_eq!(exp, 3, "one window for both connections");

    // CmdSN 4 on b before 3 on a: it waits for 3 (RFC 7143 §4.2.2.1).
    test_unit_ready(&mut b, 4, 4).await;
    assert!(
        recv_within(&mut b, Duration::from_millis(300))
            .await
            .is_none(),
        "CmdSN 4 answered before CmdSN 3 arrived"
    );
    test_unit_ready(&mut a, 3, 3).await;
    let (sa2, _) = good(a.recv().await, 3);
    let (sb2, exp) = good(b.recv().await, 4);
    assert_eq!(exp, 5);
    // StatSN per connection.
    assert_eq!((sa2, sb2), (sa + 1, sb + 1));

    // MaxConnections=2: a third is refused with 0x0206.
    let mut c = Raw::connect(addr).await;
    let (r, _) = login(&mut c, isid, tsih, 2, &[]).await;
    assert_eq!((r.status_class, r.status_detail), (2, 0x06));

    // Logout of b's connection (reason 1): the session goes on over a.
    b.send(&Pdu::new(
        LogoutRequest {
            immediate: false,
            reason: LogoutReason::CLOSE_CONNECTION,
            itt: 5,
            cid: 1,
            cmd_sn: 5,
            exp_stat_sn: 0,
        },
        Bytes::new(),
    ))
    .await;
    match b.recv().await {
        Some(Pdu {
            header: Header::LogoutResponse(r),
            ..
        }) => assert_eq!(r.response, 0),
        other => panic!("{other:?}"),
    }
    assert!(b.recv().await.is_none(), "b's connection is closed");
    test_unit_ready(&mut a, 6, 6).await;
    let (_, exp) = good(a.recv().await, 6);
    assert_eq!(exp, 7);

    // And a connection may join again in its place.
    let mut d = Raw::connect(addr).await;
    let (r, _) = login(&mut d, isid, tsih, 3, &[]).await;
    assert_eq!((r.status_class, r.status_detail), (0, 0));
    test_unit_ready(&mut d, 7, 7).await;
    good(d.recv().await, 7);

    // The same CID again reinstates that connection (RFC 7143 §6.3.4): the old one closes,
    // the session goes on over the new one and a.
    let mut e = Raw::connect(addr).await;
    let (r, _) = login(&mut e, isid, tsih, 3, &[]).await;
    assert_eq!((r.status_class, r.status_detail), (0, 0));
    assert!(
        d.recv().await.is_none(),
        "the reinstated connection is closed"
    );
    test_unit_ready(&mut e, 8, 8).await;
    good(e.recv().await, 8);
    test_unit_ready(&mut a, 9, 9).await;
    let (_, exp) = good(a.recv().await, 9);
    assert_eq!(exp, 10);
    assert_eq!(connections(&t).await, 2);
    t.shutdown().await.unwrap();
}

/// Issue 28: a connection that joins the instant the leading login's final response is read
/// (its socket open already, no retry) finds the session: the target registers the session
/// before that response leaves (RFC 7143 §5.3.4: the TSIH is the initiator's to use as soon as
/// it has it). Each round's leading login has the same ISID and TSIH 0, so it reinstates the
/// previous round's session (§6.3.5) as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_joining_the_instant_the_leading_login_is_answered_finds_the_session() {
    let t = start().await;
    let addr = t.addrs[0];
    let isid = [0x80, 0, 0, 0, 0x28, 2];
    let mut tsihs = std::collections::HashSet::new();
    for round in 0..200 {
        let mut a = Raw::connect(addr).await;
        let mut b = Raw::connect(addr).await;
        let (r, _) = login(&mut a, isid, 0, 0, &[("MaxConnections", "2")]).await;
        assert_eq!((r.status_class, r.status_detail), (0, 0), "round {round}");
        let (j, _) = login(&mut b, isid, r.tsih, 1, &[]).await;
        assert_eq!(
            (j.status_class, j.status_detail, j.tsih),
            (0, 0, r.tsih),
            "round {round}: the joining login"
        );
        tsihs.insert(r.tsih);
    }
    assert_eq!(tsihs.len(), 200, "each round a new session");
    t.shutdown().await.unwrap();
}

/// Two connections that join a session with room for one at the same instant: one joins, the
/// other is refused with 0x0206 (too many connections, RFC 7143 §11.13.5). The connection is
/// added to its session before its login is answered, so the one that lost the race hears a
/// refusal, never a success followed by a closed connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_connections_joining_the_last_place_at_once_one_joins_and_one_is_refused() {
    let t = start().await;
    let addr = t.addrs[0];
    let isid = [0x80, 0, 0, 0, 0x28, 3];
    for round in 0..100 {
        let mut a = Raw::connect(addr).await;
        let mut b = Raw::connect(addr).await;
        let mut c = Raw::connect(addr).await;
        let (r, _) = login(&mut a, isid, 0, 0, &[("MaxConnections", "2")]).await;
        assert_eq!((r.status_class, r.status_detail), (0, 0), "round {round}");
        let ((rb, _), (rc, _)) = tokio::join!(
            login(&mut b, isid, r.tsih, 1, &[]),
            login(&mut c, isid, r.tsih, 2, &[])
        );
        let mut answers = [
            (rb.status_class, rb.status_detail),
            (rc.status_class, rc.status_detail),
        ];
        answers.sort_unstable();
        assert_eq!(answers, [(0, 0), (2, 0x06)], "round {round}");
        let joined = if rb.status_class == 0 { &mut b } else { &mut c };
        test_unit_ready(joined, 1, 1).await;
        good(joined.recv().await, 1);
    }
    t.shutdown().await.unwrap();
}
