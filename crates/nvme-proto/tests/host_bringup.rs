//! The host's bring-up and Keep Alive with time passed in, against a scripted controller:
//! the paths Linux's nvmet does not take on demand (a Discovery log that changes while it is
//! read, a controller that never gets ready, an unanswered Keep Alive, an unexpected
//! authentication request).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use nvme_proto::host::bringup::{Bringup, BringupConfig, BringupError, KeepAlive};
use nvme_proto::host::cmd::{ADMIN_GET_LOG_PAGE, ADMIN_IDENTIFY, ADMIN_KEEP_ALIVE};
use nvme_wire::entry::Status;
use nvme_wire::fabrics::{FabricsCommand, FabricsKind, Property, AUTHREQ_ATR, OPCODE_FABRICS};
use nvme_wire::{Cqe, Sqe};

/// A controller's answer to `sqe`: (DW0, DW1, data).
type Answer = (u32, u32, Vec<u8>);

fn log(genctr: u64, entries: &[&str]) -> Vec<u8> {
    let mut b = vec![0u8; 1024 * (entries.len() + 1)];
    b[0..8].copy_from_slice(&genctr.to_le_bytes());
    b[8..16].copy_from_slice(&(entries.len() as u64).to_le_bytes());
    for (i, nqn) in entries.iter().enumerate() {
        let e = &mut b[1024 * (i + 1)..];
        e[0] = 3;
        e[2] = 2;
        e[256..256 + nqn.len()].copy_from_slice(nqn.as_bytes());
    }
    b
}

/// Drives `b` to its end with `answer`; time advances 10 ms per command. Returns the result
/// and how many Get Log Page commands went out.
fn drive(
    b: &mut Bringup,
    mut answer: impl FnMut(&Sqe) -> Answer,
    mut now: Instant,
) -> (Result<(), BringupError>, usize) {
    let mut logs = 0;
    for _ in 0..1000 {
        let c = match b.poll_command(now) {
            Err(e) => return (Err(e), logs),
            Ok(Some(c)) => c,
            Ok(None) if b.is_done() => return (Ok(()), logs),
            Ok(None) => {
                now = b.poll_timeout().expect("waiting for something");
                continue;
            }
        };
        if c.sqe.opcode == ADMIN_GET_LOG_PAGE {
            logs += 1;
        }
        let (dw0, dw1, mut data) = answer(&c.sqe);
        data.truncate(c.read_len as usize);
        let mut cqe = Cqe::new(c.sqe.cid, Status::SUCCESS);
        cqe.dw0 = dw0;
        cqe.dw1 = dw1;
        now += Duration::from_millis(10);
        if let Err(e) = b.handle_completion(&cqe, &data, now) {
            return (Err(e), logs);
        }
    }
    panic!("bring-up did not end");
}

/// A controller: CAP.TO = 1 (500 ms), RDY after `rdy_after` CSTS reads, and `other` for the
/// rest.
fn controller(
    rdy_after: usize,
    connect_dw0: u32,
    mut other: impl FnMut(&Sqe) -> Vec<u8>,
) -> impl FnMut(&Sqe) -> Answer {
    let mut csts_reads = 0;
    move |sqe| {
        if sqe.opcode == OPCODE_FABRICS {
            return match FabricsCommand::decode(sqe).unwrap().kind {
                FabricsKind::Connect(_) => (connect_dw0, 0, vec![]),
                FabricsKind::PropertyGet(p) if p.property == Property::Cap => {
                    (127 | 1 << 24, 0, vec![])
                }
                FabricsKind::PropertyGet(p) if p.property == Property::Csts => {
                    csts_reads += 1;
                    (u32::from(csts_reads > rdy_after), 0, vec![])
                }
                _ => (0, 0, vec![]),
            };
        }
        (0, 0, other(sqe))
    }
}

fn discovery() -> Bringup {
    Bringup::new(BringupConfig::discovery(
        "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-000000000000".into(),
        [0; 16],
    ))
}

#[test]
fn accepts_a_discovery_log_that_changed_while_read_by_reading_it_again() {
    let mut b = discovery();
    // The log changes (GENCTR 1 → 2, a second subsystem) between the read and the re-check.
    let mut reads = 0;
    let ctrl = controller(2, 1, |sqe| match sqe.opcode {
        ADMIN_IDENTIFY => vec![0; 4096],
        ADMIN_GET_LOG_PAGE => {
            reads += 1;
            if reads <= 2 {
                log(1, &["nqn.a"])
            } else {
                log(2, &["nqn.a", "nqn.b"])
            }
        }
        o => panic!("unexpected opcode {o:#x}"),
    });
    let (r, logs) = drive(&mut b, ctrl, Instant::now());
    r.unwrap();
    let info = b.into_info();
    assert_eq!(info.genctr, 2);
    let nqns: Vec<&str> = info.discovery.iter().map(|e| e.subnqn.as_str()).collect();
    assert_eq!(nqns, ["nqn.a", "nqn.b"]);
    // header, log, re-check (changed), header, log, re-check (same)
    assert_eq!(logs, 6);
}

#[test]
fn rejects_a_controller_that_is_not_ready_within_cap_to() {
    let mut b = discovery();
    let ctrl = controller(usize::MAX, 1, |_| vec![0; 4096]);
    let (r, _) = drive(&mut b, ctrl, Instant::now());
    assert!(matches!(r, Err(BringupError::NotReady(_))), "{r:?}");
}

#[test]
fn rejects_an_authentication_request_without_secrets() {
    let mut b = discovery();
    let ctrl = controller(0, 1 | AUTHREQ_ATR, |_| vec![0; 4096]);
    let (r, logs) = drive(&mut b, ctrl, Instant::now());
    assert!(
        matches!(r, Err(BringupError::AuthenticationRequired)),
        "{r:?}"
    );
    assert_eq!(logs, 0, "nothing after Connect");
}

#[test]
fn keep_alive_goes_out_at_half_kato_and_expires_unanswered() {
    let t0 = Instant::now();
    let mut ka = KeepAlive::new(2000, t0).unwrap();
    assert_eq!(ka.poll_timeout(), t0 + Duration::from_secs(1));
    assert!(ka
        .handle_timeout(t0 + Duration::from_millis(999))
        .unwrap()
        .is_none());
    let c = ka
        .handle_timeout(t0 + Duration::from_secs(1))
        .unwrap()
        .unwrap();
    assert_eq!(c.sqe.opcode, ADMIN_KEEP_ALIVE);
    // Answered: the next one half a KATO later.
    ka.answered(t0 + Duration::from_millis(1100));
    assert_eq!(ka.poll_timeout(), t0 + Duration::from_millis(2100));
    assert!(ka
        .handle_timeout(t0 + Duration::from_millis(2100))
        .unwrap()
        .is_some());
    // Not answered for a whole KATO: expired.
    assert!(ka
        .handle_timeout(t0 + Duration::from_millis(4000))
        .unwrap()
        .is_none());
    assert!(ka.handle_timeout(t0 + Duration::from_millis(4100)).is_err());
    assert!(KeepAlive::new(0, t0).is_none(), "KATO 0: no keep alive");
}
