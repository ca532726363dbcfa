//! The full-feature engines (RFC 7143 §4.2, §11): one connection of each role
//! ([`engine_pdu`]) and the initiator's session with its recovery ([`engine_session`]).

use bytes::{Bytes, BytesMut};

use super::Input;

/// Session parameters chosen by one byte of input: around the burst limits.
fn engine_params(sel: u8) -> iscsi_proto::params::SessionParams {
    let bursts = [512u32, 4096, 8192, 65536];
    let max_burst = bursts[usize::from(sel >> 2 & 3)];
    iscsi_proto::params::SessionParams {
        initial_r2t: sel & 1 != 0,
        immediate_data: sel & 2 != 0,
        max_burst_length: max_burst,
        first_burst_length: bursts[usize::from(sel >> 4 & 3)].min(max_burst),
        max_outstanding_r2t: 1 + u32::from(sel >> 6 & 1),
        initiator_max_recv_data_segment_length: 8192,
        target_max_recv_data_segment_length: 8192,
        ..Default::default()
    }
}

struct FuzzLuns;

impl iscsi_proto::engine::target::LunDirectory for FuzzLuns {
    fn exists(&self, lun: u64) -> bool {
        lun == 0
    }
    fn size(
        &self,
        _itt: u32,
        _lun: u64,
        cdb: &[u8],
        _edtl: u32,
    ) -> iscsi_proto::engine::target::Sizing {
        // WRITE(10)-like: blocks in bytes 7..9, at most 128 KiB.
        let need = if cdb.first() == Some(&0x2a) {
            u64::from(u16::from_be_bytes([cdb[7], cdb[8]]).min(256)) * 512
        } else {
            0
        };
        iscsi_proto::engine::target::Sizing {
            need,
            early: None,
            transfer: None,
            decoded: None,
        }
    }
}

/// Up to 64 PDUs decoded from `bytes` (no digests, 64 KiB segments) for the engine
/// harnesses: a decode error is kept (the engine gets it as a wire error) and ends the stream
/// when it is out of step.
fn decode_pdus(bytes: &[u8]) -> Vec<Result<iscsi_wire::Pdu, iscsi_wire::WireError>> {
    let codec = iscsi_wire::Codec {
        header_digest: false,
        data_digest: false,
        max_recv_data_segment_length: 65536,
    };
    let mut buf = BytesMut::from(bytes);
    let mut pdus = Vec::new();
    while pdus.len() < 64 {
        match codec.decode(&mut buf) {
            Ok(Some(p)) => pdus.push(Ok(p)),
            Ok(None) => break,
            Err(e) => {
                let intact = e.stream_intact();
                pdus.push(Err(e));
                if !intact {
                    break;
                }
            }
        }
    }
    pdus
}

/// Feeds arbitrary PDUs to the engine's `handle_pdu` in either role (the first byte picks the
/// role and the parameters), with time advancing a second per PDU so pings and timeouts fire.
/// Target: every R2T carries a real TTT (never 0xffffffff) within the command's data; StatSN
/// runs in sequence; Data-In respects the initiator's MaxRecvDataSegmentLength and runs in
/// DataSN and offset order. Initiator: every submitted command completes at most once, and
/// exactly once when the connection has ended; Data-Out stays inside the write buffer and the
/// target's MaxRecvDataSegmentLength.
pub fn engine_pdu(data: &[u8]) {
    use std::time::{Duration, Instant};
    let mut input = Input(data);
    let sel = input.u8();
    let params = engine_params(input.u8());
    let pdus = decode_pdus(input.rest());
    let start = Instant::now();
    if sel & 0x80 == 0 {
        engine_target(params, start, pdus);
    } else {
        engine_initiator(params, start, pdus);
    }
    let _ = Duration::ZERO;
}

fn engine_target(
    params: iscsi_proto::params::SessionParams,
    start: std::time::Instant,
    pdus: Vec<Result<iscsi_wire::Pdu, iscsi_wire::WireError>>,
) {
    use iscsi_proto::engine::target::{Config, Connection, Event, Response};
    use iscsi_wire::{Header, RESERVED_TAG};
    use std::collections::HashMap;
    use std::time::Duration;
    let seg = params.initiator_max_recv_data_segment_length;
    let mut cfg = Config::new(params, 0, 100);
    cfg.cmd_window = 4;
    cfg.nop_interval = Some(Duration::from_secs(3));
    let mut c = Connection::new(cfg, start);
    let mut stat_sn = 100u32;
    let mut data_in: HashMap<u32, (u32, u32)> = HashMap::new();
    for (i, p) in pdus.into_iter().enumerate() {
        let now = start + Duration::from_secs(i as u64);
        match p {
            Ok(p) => c.handle_pdu(now, &FuzzLuns, p),
            Err(e) => c.handle_wire_error(now, &e),
        }
        c.handle_timeout(now);
        while let Some(e) = c.poll_event() {
            if let Event::Execute(x) = e {
                let len = if x.cdb.first() == Some(&0x28) {
                    x.edtl.min(65536) as usize
                } else {
                    0
                };
                c.complete(x.itt, Response::good(Bytes::from(vec![0u8; len])));
            }
        }
        while let Some(out) = c.poll_transmit() {
            let status = match &out.header {
                Header::R2t(r) => {
                    assert_ne!(r.ttt, RESERVED_TAG, "R2T with the reserved TTT");
                    assert!(r.desired_data_transfer_length > 0);
                    None
                }
                Header::DataIn(d) => {
                    assert!(
                        out.data.len() as u32 <= seg,
                        "Data-In over MaxRecvDataSegmentLength"
                    );
                    let (sn, off) = data_in.entry(d.itt).or_insert((0, 0));
                    assert_eq!(d.data_sn, *sn, "Data-In DataSN out of order");
                    assert_eq!(d.buffer_offset, *off, "Data-In offset out of order");
                    *sn += 1;
                    *off += out.data.len() as u32;
                    if d.status_present {
                        data_in.remove(&d.itt);
                        Some(d.stat_sn)
                    } else {
                        None
                    }
                }
                Header::ScsiResponse(r) => {
                    data_in.remove(&r.itt);
                    Some(r.stat_sn)
                }
                Header::NopIn(n) if n.itt != RESERVED_TAG => Some(n.stat_sn),
                Header::NopIn(_) => None,
                Header::TaskMgmtResponse(r) => Some(r.stat_sn),
                Header::TextResponse(r) => Some(r.stat_sn),
                Header::LogoutResponse(r) => Some(r.stat_sn),
                Header::Reject(r) => Some(r.stat_sn),
                Header::AsyncMessage(r) => Some(r.stat_sn),
                _ => None,
            };
            if let Some(s) = status {
                assert_eq!(s, stat_sn, "StatSN out of sequence");
                stat_sn = stat_sn.wrapping_add(1);
            }
        }
    }
}

fn engine_initiator(
    params: iscsi_proto::params::SessionParams,
    start: std::time::Instant,
    pdus: Vec<Result<iscsi_wire::Pdu, iscsi_wire::WireError>>,
) {
    use iscsi_proto::engine::initiator::{Command, Config, Connection, Data, Event};
    use iscsi_wire::Header;
    use std::collections::HashMap;
    use std::time::Duration;
    let seg = params.target_max_recv_data_segment_length;
    let mut c = Connection::new(Config::new(params, 1, 8, 100), start);
    let write_len = 20_000u32;
    let mut done: HashMap<u32, u32> = HashMap::new();
    let cmds = [
        Data::Read {
            buf: BytesMut::new(),
            len: 8192,
        },
        Data::Write(Bytes::from(vec![1u8; write_len as usize])),
        Data::None,
    ];
    for d in cmds {
        let itt = c
            .submit(
                start,
                Command {
                    lun: 0,
                    cdb: [0; 16],
                    data: d,
                    timed: false,
                },
            )
            .unwrap_or(0);
        done.insert(itt, 0);
    }
    for (i, p) in pdus.into_iter().enumerate() {
        let now = start + Duration::from_secs(i as u64);
        match p {
            Ok(p) => c.handle_pdu(now, p),
            Err(_) => c.handle_wire_error(now),
        }
        c.handle_timeout(now);
        while let Some(out) = c.poll_transmit() {
            if let Header::DataOut(d) = &out.header {
                assert!(
                    out.data.len() as u32 <= seg,
                    "Data-Out over MaxRecvDataSegmentLength"
                );
                assert!(d.buffer_offset + out.data.len() as u32 <= write_len);
            }
        }
        while let Some(e) = c.poll_event() {
            if let Event::Completed { itt, .. } = e {
                let n = done.get_mut(&itt).expect("completion for a submitted ITT");
                *n += 1;
                assert_eq!(*n, 1, "ITT {itt:#x} completed twice");
            }
        }
    }
    if c.closed().is_some() {
        assert!(done.values().all(|n| *n == 1), "a command never completed");
        assert_eq!(c.tasks_in_flight(), 0);
    }
}

/// The initiator's engine session ([`iscsi_proto::engine::session`]) under arbitrary target
/// PDUs, with connection losses and reattachments at points the input picks. Properties:
/// every submitted command completes exactly once (the session ends at the close), a
/// completion names a submitted ITT, COMPARE AND WRITE (not idempotent) is never sent on more
/// than one connection, and nothing is left in the task table.
pub fn engine_session(data: &[u8]) {
    use iscsi_proto::engine::initiator::{Command, Config as ConnConfig, Connection, Data};
    use iscsi_proto::engine::session::{Binding, Config, Event, Session};
    use iscsi_proto::engine::{CloseReason, ConnectionError, Side};
    use iscsi_wire::Header;
    use std::collections::HashMap;
    use std::time::{Duration, Instant};

    let mut input = Input(data);
    let sel = input.u8();
    let params = engine_params(input.u8());
    // PDUs per connection before the input cuts it (0: only when the engine ends it).
    let per_conn = usize::from(input.u8() % 8);
    let pdus = decode_pdus(input.rest());
    let start = Instant::now();
    let recovery = (sel & 1 == 1).then(|| Duration::from_secs(5 + u64::from(sel >> 4)));
    let conn = |now| Connection::new(ConnConfig::new(params.clone(), 1, 8, 100), now);
    let mut s = Session::new(
        Config {
            recovery_timeout: recovery,
            idempotent: ipsan_scsi::cdb::is_idempotent,
        },
        conn(start),
    );
    let write = Bytes::from(vec![1u8; 20_000]);
    let caw = Bytes::from(vec![2u8; 1024]);
    let cdb = |op: u8| {
        let mut c = [0u8; 16];
        c[0] = op;
        c
    };
    let cmds = [
        (
            cdb(0x88),
            Data::Read {
                buf: BytesMut::new(),
                len: 8192,
            },
            Binding::Free,
        ),
        (cdb(0x8a), Data::Write(write.clone()), Binding::Free),
        (cdb(0x8a), Data::Write(write.clone()), Binding::Bound),
        (cdb(0x89), Data::Write(caw), Binding::Free),
        (cdb(0x00), Data::None, Binding::Free),
    ];
    let mut done: HashMap<u32, u32> = HashMap::new();
    let mut caw_itt = None;
    for (cdb, data, binding) in cmds {
        let itt = s.alloc_itt();
        let cmd = Command {
            lun: 0,
            cdb,
            data,
            timed: false,
        };
        if s.submit_as(start, itt, cmd, binding).is_ok() {
            done.insert(itt, 0);
            if cdb[0] == 0x89 {
                caw_itt = Some(itt);
            }
        }
    }
    // Connections on which the COMPARE AND WRITE command PDU left.
    let mut caw_sent_on: Vec<u64> = Vec::new();
    let mut drain = |s: &mut Session, now: Instant, done: &mut HashMap<u32, u32>| loop {
        let mut any = false;
        while let Some(out) = s.poll_transmit() {
            any = true;
            if let Header::ScsiCommand(c) = &out.header {
                if Some(c.itt) == caw_itt && !caw_sent_on.contains(&s.generation()) {
                    caw_sent_on.push(s.generation());
                }
            }
        }
        while let Some(e) = s.poll_event() {
            any = true;
            match e {
                Event::Completed { itt, .. } => {
                    let n = done.get_mut(&itt).expect("completion for a submitted ITT");
                    *n += 1;
                    assert_eq!(*n, 1, "ITT {itt:#x} completed twice");
                }
                Event::Rebind { itt } => {
                    let _ = s.resubmit(now, itt, Data::Write(write.clone()));
                }
                _ => {}
            }
        }
        if !any {
            break;
        }
    };
    let mut on_conn = 0usize;
    for (i, p) in pdus.into_iter().enumerate() {
        let now = start + Duration::from_secs(i as u64);
        match p {
            Ok(p) => s.handle_pdu(now, p),
            Err(_) => s.handle_wire_error(now),
        }
        s.handle_timeout(now);
        drain(&mut s, now, &mut done);
        on_conn += 1;
        let cut = per_conn > 0 && on_conn >= per_conn;
        if cut && s.connection().closed().is_none() {
            s.peer_closed(now);
            drain(&mut s, now, &mut done);
        }
        if s.connection().closed().is_some() && s.ended().is_none() && recovery.is_some() {
            s.attach(now, conn(now));
            on_conn = 0;
            drain(&mut s, now, &mut done);
        }
    }
    let end = start + Duration::from_secs(100);
    s.end(
        end,
        ConnectionError {
            by: Side::Initiator,
            reason: CloseReason::Local,
        },
    );
    drain(&mut s, end, &mut done);
    assert!(
        caw_sent_on.len() <= 1,
        "COMPARE AND WRITE sent on {caw_sent_on:?}"
    );
    assert!(
        done.values().all(|n| *n == 1),
        "a command never completed: {done:?}"
    );
    assert_eq!(s.tasks_in_flight(), 0);
}
