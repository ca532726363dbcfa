//! A session of several connections as a gateway's remote leg uses it (issue 28:
//! `McsSession::command_to_abortable`, `lun_reset_to`), against the real ipsan target
//! in-process on 127.0.0.1:0 with a `disk:` LUN (one head: seek + half a revolution per
//! command, so commands queue at the target and are in flight on every connection at once):
//!
//! - a LOGICAL UNIT RESET sent on one connection ends the LU's commands on all four: none of
//!   sixteen untimed reads spread over the connections waits for a status that will not come
//!   (the target aborts them silently, RFC 7143 §11.5.1), and the session goes on;
//! - a caller's abort of a queued command becomes ABORT TASK on that command's connection and
//!   the command ends aborted, while the others complete.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use common::{bounded, config};
use ipsan_initiator::{DataDir, Error, IscsiUrl, LoginOptions, McsConfig, McsSession, Spread};
use ipsan_target::config::{self as tconfig, Config, TargetConfig};
use ipsan_target::ServerHandle;
use tokio_util::sync::CancellationToken;

const IQN: &str = "iqn.2026-11.org.ipsan:mcs-passthrough";

/// A target whose LUN 0 takes a disk's time per command (8.5 ms seek + 4.2 ms half turn).
async fn disk_target() -> ServerHandle {
    let mut c = Config {
        portals: vec!["127.0.0.1:0".parse().unwrap()],
        targets: vec![TargetConfig::new(
            IQN,
            tconfig::luns_from_specs(&["disk:64MiB".to_owned()]).unwrap(),
        )],
        connections_per_session: 4,
        ..Config::default()
    };
    c.validate().unwrap();
    ServerHandle::start(&c).await.unwrap()
}

async fn four(h: &ServerHandle) -> Arc<McsSession> {
    let url = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", h.addrs[0])).unwrap();
    let s = McsSession::open(
        &url,
        &config(LoginOptions::default()),
        McsConfig {
            connections: 4,
            spread: Spread::RoundRobin,
        },
    )
    .await
    .unwrap();
    assert_eq!(s.connections(), 4);
    Arc::new(s)
}

/// LUN 0's raw 8-byte field.
const LUN0: u64 = 0;

/// READ(16) of one 4 KiB block at `lba`, through the pass-through form (no command timeout).
async fn read(
    s: &McsSession,
    lba: u64,
    abort: &CancellationToken,
) -> Result<ipsan_initiator::Passthrough, Error> {
    s.command_to_abortable(
        LUN0,
        ipsan_initiator::scsi::read16(lba, 8),
        DataDir::Read(BytesMut::new(), 4096),
        abort,
    )
    .await
}

#[test]
fn accepts_a_lun_reset_that_ends_the_lus_commands_on_every_connection() {
    bounded(60, async {
        let h = disk_target().await;
        let s = four(&h).await;
        let never = CancellationToken::new();
        let mut reads = Vec::new();
        for i in 0..16u64 {
            let (s, never) = (s.clone(), never.clone());
            // Far apart: every one seeks.
            reads.push(tokio::spawn(
                async move { read(&s, i * 2048, &never).await },
            ));
        }
        // Round robin: four on each connection, most still queued at the target's one head.
        tokio::time::sleep(Duration::from_millis(50)).await;
        s.lun_reset_to(LUN0).await.unwrap();
        // Without the aborts on the other connections, their reads (untimed) would wait here
        // until the bound.
        let (mut done, mut aborted) = (0, 0);
        for r in reads {
            match tokio::time::timeout(Duration::from_secs(10), r)
                .await
                .expect("a read outlived the LUN reset")
                .unwrap()
            {
                Ok(p) => {
                    assert_eq!(p.status, 0);
                    done += 1;
                }
                Err(Error::TaskAborted(_)) => aborted += 1,
                Err(e) => panic!("unexpected end: {e}"),
            }
        }
        assert_eq!(done + aborted, 16);
        assert!(
            aborted >= 4,
            "the reset met queued commands on several connections: {aborted} aborted"
        );
        // The session goes on (past the reset's UNIT ATTENTION, if this nexus gets one).
        let mut ok = false;
        for _ in 0..3 {
            let p = read(&s, 0, &never).await.unwrap();
            if p.status == 0 {
                ok = true;
                break;
            }
        }
        assert!(ok, "no read succeeded after the reset");
        assert_eq!(s.connections(), 4);
    });
}

#[test]
fn accepts_a_callers_abort_of_a_queued_command_as_abort_task_on_its_connection() {
    bounded(60, async {
        let h = disk_target().await;
        let s = four(&h).await;
        let never = CancellationToken::new();
        let mut reads = Vec::new();
        for i in 0..12u64 {
            let (s, never) = (s.clone(), never.clone());
            reads.push(tokio::spawn(
                async move { read(&s, i * 2048, &never).await },
            ));
        }
        // The thirteenth, behind the others at the target's one head (~150 ms of work).
        let abort = CancellationToken::new();
        let last = {
            let (s, abort) = (s.clone(), abort.clone());
            tokio::spawn(async move { read(&s, 12 * 2048, &abort).await })
        };
        tokio::time::sleep(Duration::from_millis(30)).await;
        abort.cancel();
        let r = tokio::time::timeout(Duration::from_secs(10), last)
            .await
            .expect("the aborted read did not end")
            .unwrap();
        assert!(matches!(r, Err(Error::TaskAborted(_))), "{r:?}");
        for r in reads {
            let p = r.await.unwrap().unwrap();
            assert_eq!(p.status, 0, "the others complete");
            assert_eq!(p.data.len(), 4096);
        }
        assert_eq!(s.connections(), 4);
    });
}
