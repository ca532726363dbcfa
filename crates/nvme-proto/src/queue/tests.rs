//! The queue machine driven as a host would drive it: PDUs encoded with `nvme-wire`'s codec on
//! the host's side, the queue's output decoded the same way. One `rejects_*` test per rule.

use super::*;
use nvme_wire::entry::PSDT_SGL;
use nvme_wire::fabrics::Connect;
use nvme_wire::pdu::{CapsuleCmd, H2cData, IcReq};

const WRITE: u8 = 0x01;
const READ: u8 = 0x02;

struct Host {
    q: Queue,
    /// The host's codec: what it sends, how it reads the queue's output.
    codec: Codec,
    rx: BytesMut,
    now: Instant,
}

fn cfg() -> QueueConfig {
    QueueConfig {
        maxh2cdata: 4096,
        max_c2h_data: 4096,
        ..QueueConfig::default()
    }
}

impl Host {
    fn new(cfg: QueueConfig) -> Self {
        let now = Instant::now();
        Self {
            q: Queue::new(cfg, now),
            codec: Codec::new(1 << 24),
            rx: BytesMut::new(),
            now,
        }
    }

    /// ICReq with the given digests and HPDA; returns the ICResp.
    fn connect_ic(&mut self, hdgst: bool, ddgst: bool, hpda: u8) -> IcResp {
        self.send(&Pdu::IcReq(IcReq {
            pfv: 0,
            hpda,
            hdgst,
            ddgst,
            maxr2t: 0,
        }));
        let Some(Pdu::IcResp(r)) = self.recv() else {
            panic!("no ICResp")
        };
        self.codec.header_digest = r.hdgst;
        self.codec.data_digest = r.ddgst;
        self.codec.tx_pda = r.cpda;
        self.codec.rx_pda = hpda;
        r
    }

    /// ICReq, then a Connect for `qid` (in-capsule data), handed to the test as the command.
    fn ready(cfg: QueueConfig, qid: u16, cattr: u8) -> Self {
        Self::ready_with(cfg, qid, cattr, false, false)
    }

    /// [`Host::ready`] with header and data digests as given.
    fn ready_with(cfg: QueueConfig, qid: u16, cattr: u8, hdgst: bool, ddgst: bool) -> Self {
        let mut h = Self::new(cfg);
        h.connect_ic(hdgst, ddgst, 0);
        let sqe = FabricsCommand {
            cid: 0xfff0,
            flags: PSDT_SGL,
            sgl: Sgl::InCapsule {
                offset: 0,
                length: 1024,
            },
            kind: FabricsKind::Connect(Connect {
                recfmt: 0,
                qid,
                sqsize: 31,
                cattr,
                kato: 0,
            }),
        }
        .to_sqe();
        h.send(&capsule(sqe, vec![0u8; 1024]));
        let cmd = h.command();
        assert_eq!(cmd.data.len(), 1024);
        h.q.complete(Completion {
            cqe: Cqe::new(0xfff0, Status::SUCCESS),
            data: Bytes::new(),
        })
        .unwrap();
        let Some(Pdu::CapsuleResp(_)) = h.recv() else {
            panic!("no Connect response")
        };
        assert_eq!(h.q.qid(), Some(qid));
        h
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        let mut buf = BytesMut::from(bytes);
        self.q.receive(&mut buf);
    }

    fn send(&mut self, pdu: &Pdu) {
        let b = self.codec.to_bytes(pdu).unwrap();
        self.send_raw(&b);
    }

    /// The next PDU the queue wrote, decoded by the host's codec.
    fn recv(&mut self) -> Option<Pdu> {
        while let Some(b) = self.q.poll_transmit() {
            self.rx.extend_from_slice(&b);
        }
        self.codec.decode_from(&mut self.rx).unwrap()
    }

    fn command(&mut self) -> Command {
        match self.q.poll_event() {
            Some(Event::Command(c)) => c,
            other => panic!("expected a command, got {other:?}"),
        }
    }

    fn no_event(&mut self) {
        assert!(self.q.poll_event().is_none());
    }

    /// Asserts the queue terminated with `fes` (and FEI `fei` when given).
    fn assert_terminated(&mut self, fes: Fes, fei: Option<u32>) {
        // A ready connection's PDUs carry the negotiated digests; the TermReq does not.
        let mut out = BytesMut::new();
        while let Some(b) = self.q.poll_transmit() {
            out.extend_from_slice(&b);
        }
        let mut rx = std::mem::take(&mut self.rx);
        rx.extend_from_slice(&out);
        let mut term = None;
        while let Some(p) = self.codec.decode_from(&mut rx).unwrap() {
            if let Pdu::C2hTermReq(t) = p {
                term = Some(t);
            }
        }
        let t = term.expect("a C2HTermReq");
        assert_eq!(t.fes, fes, "{t:?}");
        if let Some(fei) = fei {
            assert_eq!(t.fei, fei, "{t:?}");
        }
        assert!(self.q.is_closed());
        let mut closed = false;
        while let Some(e) = self.q.poll_event() {
            if matches!(e, Event::Closed(CloseReason::Terminated { .. })) {
                closed = true;
            }
            assert!(
                !matches!(e, Event::Command(_)),
                "no command after a fatal error"
            );
        }
        assert!(closed);
    }
}

fn capsule(sqe: Sqe, data: Vec<u8>) -> Pdu {
    Pdu::CapsuleCmd(CapsuleCmd {
        sqe,
        data: Bytes::from(data),
    })
}

fn io(opcode: u8, cid: u16, sgl: Sgl) -> Sqe {
    let mut s = Sqe::new(opcode, cid, sgl);
    s.nsid = 1;
    s
}

fn write_in_capsule(cid: u16, data: Vec<u8>) -> Pdu {
    let len = data.len() as u32;
    capsule(
        io(
            WRITE,
            cid,
            Sgl::InCapsule {
                offset: 0,
                length: len,
            },
        ),
        data,
    )
}

fn write_transport(cid: u16, len: u32) -> Pdu {
    capsule(io(WRITE, cid, Sgl::Transport { length: len }), vec![])
}

fn h2c(cccid: u16, ttag: u16, datao: u32, last: bool, data: Vec<u8>) -> Pdu {
    Pdu::H2cData(H2cData {
        cccid,
        ttag,
        datao,
        last,
        data: Bytes::from(data),
    })
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + 3) as u8).collect()
}

/// A write with a transport SGL; returns the R2T.
fn start_write(h: &mut Host, cid: u16, len: u32) -> R2t {
    h.send(&write_transport(cid, len));
    match h.recv() {
        Some(Pdu::R2t(r)) => r,
        other => panic!("expected R2T, got {other:?}"),
    }
}

// ------------------------------------------------------------------ set-up

#[test]
fn accepts_icreq_and_enables_the_digests_the_host_asked_for() {
    let mut h = Host::new(QueueConfig { cpda: 1, ..cfg() });
    let r = h.connect_ic(true, true, 3);
    assert_eq!(r.pfv, 0);
    assert_eq!(r.cpda, 1);
    assert!(r.hdgst && r.ddgst);
    assert_eq!(r.maxh2cdata, 4096);
    assert!(h.q.codec().header_digest && h.q.codec().data_digest);
    assert_eq!(h.q.codec().tx_pda, 3);

    let mut h = Host::new(cfg());
    let r = h.connect_ic(false, true, 0);
    assert!(!r.hdgst && r.ddgst);
}

#[test]
fn accepts_read_data_aligned_to_the_hosts_hpda_with_digests() {
    let mut h = Host::new(cfg());
    h.connect_ic(true, true, 7);
    h.send(&capsule(
        io(READ, 5, Sgl::Transport { length: 6000 }),
        vec![],
    ));
    let cmd = h.command();
    assert!(cmd.data.is_empty());
    let data = Bytes::from(pattern(6000));
    h.q.complete(Completion {
        cqe: Cqe::new(5, Status::SUCCESS),
        data: data.clone(),
    })
    .unwrap();
    // Two C2HData (4096 + 1904) the host's codec accepts (HPDA 7 = 32-byte alignment, both
    // digests), then the response capsule.
    let mut got = Vec::new();
    for (off, last) in [(0u32, false), (4096, true)] {
        let Some(Pdu::C2hData(d)) = h.recv() else {
            panic!("no C2HData")
        };
        assert_eq!((d.cccid, d.datao, d.last, d.success), (5, off, last, false));
        got.extend_from_slice(&d.data);
    }
    assert_eq!(got, data);
    let Some(Pdu::CapsuleResp(r)) = h.recv() else {
        panic!("no CapsuleResp")
    };
    assert_eq!(r.cqe.cid, 5);
    assert_eq!(h.q.outstanding(), 0);
}

#[test]
fn accepts_read_data_without_copying_the_payload() {
    let mut h = Host::ready(cfg(), 1, 0);
    h.send(&capsule(
        io(READ, 9, Sgl::Transport { length: 4096 }),
        vec![],
    ));
    h.command();
    let data = Bytes::from(pattern(4096));
    h.q.complete(Completion {
        cqe: Cqe::new(9, Status::SUCCESS),
        data: data.clone(),
    })
    .unwrap();
    let _header = h.q.poll_transmit().unwrap();
    let payload = h.q.poll_transmit().unwrap();
    assert_eq!(
        payload.as_ptr(),
        data.as_ptr(),
        "the payload is a slice, not a copy"
    );
}

#[test]
fn accepts_sqflow_disabled_reads_ending_with_c2h_success() {
    let mut h = Host::ready(cfg(), 1, CATTR_SQFLOW_DISABLE);
    h.send(&capsule(
        io(READ, 3, Sgl::Transport { length: 512 }),
        vec![],
    ));
    h.command();
    h.q.complete(Completion {
        cqe: Cqe::new(3, Status::SUCCESS),
        data: Bytes::from(pattern(512)),
    })
    .unwrap();
    let Some(Pdu::C2hData(d)) = h.recv() else {
        panic!("no C2HData")
    };
    assert!(d.last && d.success);
    assert!(h.recv().is_none(), "no CapsuleResp after SUCCESS");

    // A failed read still gets its response capsule.
    h.send(&capsule(
        io(READ, 4, Sgl::Transport { length: 512 }),
        vec![],
    ));
    h.command();
    h.q.complete(Completion {
        cqe: Cqe::new(4, Status::UNRECOVERED_READ_ERROR),
        data: Bytes::new(),
    })
    .unwrap();
    assert!(matches!(h.recv(), Some(Pdu::CapsuleResp(_))));
}

/// A transfer shorter than the host's SGL (an admin page or a remote LU's short answer) ends
/// with a response capsule even when SQ flow control is off: a host that takes SUCCESS as "all
/// the data came" (ipsan's does) would otherwise refuse it as a protocol error.
#[test]
fn accepts_a_short_read_ending_with_a_response_capsule_not_c2h_success() {
    let mut h = Host::ready(cfg(), 1, CATTR_SQFLOW_DISABLE);
    h.send(&capsule(
        io(READ, 5, Sgl::Transport { length: 512 }),
        vec![],
    ));
    h.command();
    h.q.complete(Completion {
        cqe: Cqe::new(5, Status::SUCCESS),
        data: Bytes::from(pattern(256)),
    })
    .unwrap();
    let Some(Pdu::C2hData(d)) = h.recv() else {
        panic!("no C2HData")
    };
    assert!(d.last && !d.success, "SUCCESS on a short transfer");
    assert!(matches!(h.recv(), Some(Pdu::CapsuleResp(_))));
}

#[test]
fn accepts_read_data_no_longer_than_the_sgl() {
    let mut h = Host::ready(cfg(), 1, 0);
    h.send(&capsule(
        io(READ, 3, Sgl::Transport { length: 100 }),
        vec![],
    ));
    h.command();
    h.q.complete(Completion {
        cqe: Cqe::new(3, Status::SUCCESS),
        data: Bytes::from(pattern(300)),
    })
    .unwrap();
    let Some(Pdu::C2hData(d)) = h.recv() else {
        panic!("no C2HData")
    };
    assert_eq!(d.data.len(), 100);
}

#[test]
fn rejects_a_capsule_before_icreq() {
    let mut h = Host::new(cfg());
    h.send(&write_in_capsule(1, pattern(16)));
    h.assert_terminated(Fes::PduSequenceError, None);
}

#[test]
fn rejects_a_second_icreq() {
    let mut h = Host::new(cfg());
    h.connect_ic(false, false, 0);
    h.send(&Pdu::IcReq(IcReq {
        pfv: 0,
        hpda: 0,
        hdgst: false,
        ddgst: false,
        maxr2t: 0,
    }));
    h.assert_terminated(Fes::PduSequenceError, None);
}

#[test]
fn rejects_an_icreq_with_another_pdu_format_version() {
    let mut h = Host::new(cfg());
    let mut b = h
        .codec
        .to_bytes(&Pdu::IcReq(IcReq {
            pfv: 0,
            hpda: 0,
            hdgst: false,
            ddgst: false,
            maxr2t: 0,
        }))
        .unwrap()
        .to_vec();
    b[8] = 1;
    h.send_raw(&b);
    h.assert_terminated(Fes::UnsupportedParameter, Some(8));
}

#[test]
fn rejects_pdu_types_only_a_controller_sends() {
    let mut h = Host::ready(cfg(), 1, 0);
    h.send(&Pdu::R2t(R2t {
        cccid: 1,
        ttag: 0,
        r2to: 0,
        r2tl: 10,
    }));
    h.assert_terminated(Fes::InvalidHeaderField, Some(0));
}

#[test]
fn rejects_a_huge_plen_before_buffering_it() {
    let mut h = Host::ready(cfg(), 1, 0);
    // A capsule header claiming 1 GiB: refused from its first 8 bytes.
    let mut ch = vec![0x04, 0x00, 72, 72];
    ch.extend_from_slice(&(1u32 << 30).to_le_bytes());
    h.send_raw(&ch);
    h.assert_terminated(Fes::InvalidHeaderField, Some(4));
}

#[test]
fn rejects_a_reserved_pdu_type() {
    let mut h = Host::ready(cfg(), 1, 0);
    h.send_raw(&[0x08, 0, 24, 0, 24, 0, 0, 0]);
    h.assert_terminated(Fes::InvalidHeaderField, Some(0));
}

#[test]
fn rejects_a_header_digest_mismatch() {
    let mut h = Host::new(cfg());
    h.connect_ic(true, false, 0);
    let mut b = h
        .codec
        .to_bytes(&write_in_capsule(1, pattern(16)))
        .unwrap()
        .to_vec();
    b[72] ^= 0xff; // the HDGST right after the 72-byte header
    h.send_raw(&b);
    h.assert_terminated(Fes::HeaderDigestError, None);
}

#[test]
fn closes_on_an_h2c_term_req_without_answering() {
    let mut h = Host::ready(cfg(), 1, 0);
    h.send(&Pdu::H2cTermReq(TermReq {
        fes: Fes::InvalidHeaderField,
        fei: 3,
        data: Bytes::new(),
    }));
    assert!(h.q.is_closed());
    assert!(matches!(
        h.q.poll_event(),
        Some(Event::Closed(CloseReason::HostTerminated { fei: 3, .. }))
    ));
    assert!(h.q.poll_transmit().is_none());
}

#[test]
fn closes_a_connection_that_never_sends_icreq() {
    let mut h = Host::new(cfg());
    let d = h.q.poll_timeout().unwrap();
    h.q.handle_timeout(h.now);
    assert!(!h.q.is_closed(), "not before the deadline");
    h.q.handle_timeout(d);
    assert!(h.q.is_closed());
    assert!(matches!(
        h.q.poll_event(),
        Some(Event::Closed(CloseReason::SetupTimeout))
    ));
    // After the first command the deadline is gone.
    let h = Host::ready(cfg(), 0, 0);
    assert!(h.q.poll_timeout().is_none());
}

// ------------------------------------------------------------------ capsules

#[test]
fn accepts_in_capsule_write_data_at_the_sgl_offset() {
    let mut h = Host::ready(cfg(), 1, 0);
    let data = pattern(600);
    h.send(&capsule(
        io(
            WRITE,
            7,
            Sgl::InCapsule {
                offset: 100,
                length: 500,
            },
        ),
        data.clone(),
    ));
    let c = h.command();
    assert_eq!(c.sqe.cid, 7);
    assert_eq!(&c.data[..], &data[100..]);
}

#[test]
fn accepts_the_io_in_capsule_size_on_io_queues_and_the_admin_size_on_admin() {
    let small = QueueConfig {
        io_in_capsule: 1024,
        ..cfg()
    };
    let mut io_q = Host::ready(small.clone(), 1, 0);
    io_q.send(&write_in_capsule(1, pattern(2048)));
    assert!(matches!(
        io_q.recv(),
        Some(Pdu::CapsuleResp(r)) if r.cqe.status == Status::DATA_SGL_LENGTH_INVALID
    ));
    io_q.no_event();
    assert!(!io_q.q.is_closed(), "an oversized capsule is not fatal");
    io_q.send(&write_in_capsule(2, pattern(1024)));
    assert_eq!(io_q.command().data.len(), 1024);

    let mut admin = Host::ready(small, 0, 0);
    admin.send(&write_in_capsule(1, pattern(8192)));
    assert_eq!(admin.command().data.len(), 8192);
}

#[test]
fn rejects_a_command_id_already_in_flight() {
    let mut h = Host::ready(cfg(), 1, 0);
    h.send(&write_in_capsule(1, pattern(16)));
    h.command();
    h.send(&write_in_capsule(1, pattern(16)));
    h.no_event();
    assert!(matches!(
        h.recv(),
        Some(Pdu::CapsuleResp(r)) if r.cqe.status == Status::COMMAND_ID_CONFLICT
    ));
}

#[test]
fn rejects_prp_commands_and_unknown_sgl_types_in_the_completion() {
    let mut h = Host::ready(cfg(), 1, 0);
    let mut s = io(READ, 1, Sgl::Transport { length: 512 });
    s.flags = 0; // PRP
    h.send(&capsule(s, vec![]));
    assert!(matches!(
        h.recv(),
        Some(Pdu::CapsuleResp(r)) if r.cqe.status == Status::INVALID_FIELD
    ));
    h.send(&capsule(io(READ, 2, Sgl::Other([0x11; 16])), vec![]));
    assert!(matches!(
        h.recv(),
        Some(Pdu::CapsuleResp(r)) if r.cqe.status == Status::SGL_DESCRIPTOR_TYPE_INVALID
    ));
    h.no_event();
}

#[test]
fn rejects_a_transport_sgl_longer_than_the_max_transfer() {
    let mut h = Host::ready(
        QueueConfig {
            max_transfer: 8192,
            ..cfg()
        },
        1,
        0,
    );
    h.send(&write_transport(1, 8193));
    assert!(matches!(
        h.recv(),
        Some(Pdu::CapsuleResp(r)) if r.cqe.status == Status::DATA_SGL_LENGTH_INVALID
    ));
    h.no_event();
}

#[test]
fn rejects_more_commands_than_the_queue_allows() {
    let mut h = Host::ready(
        QueueConfig {
            max_outstanding: 2,
            ..cfg()
        },
        1,
        0,
    );
    h.send(&write_in_capsule(1, pattern(8)));
    h.send(&write_in_capsule(2, pattern(8)));
    h.command();
    h.command();
    h.send(&write_in_capsule(3, pattern(8)));
    h.assert_terminated(Fes::PduSequenceError, None);
}

#[test]
fn accepts_a_capsule_data_digest_error_as_a_transient_transport_error() {
    let mut h = Host::new(cfg());
    h.connect_ic(false, true, 0);
    let mut b = h
        .codec
        .to_bytes(&write_in_capsule(4, pattern(64)))
        .unwrap()
        .to_vec();
    let n = b.len();
    b[n - 1] ^= 1;
    h.send_raw(&b);
    h.no_event();
    assert!(!h.q.is_closed());
    assert!(matches!(
        h.recv(),
        Some(Pdu::CapsuleResp(r)) if r.cqe.cid == 4 && r.cqe.status == Status::TRANSIENT_TRANSPORT_ERROR
    ));
}

#[test]
fn rejects_completing_a_command_the_controller_does_not_hold() {
    let mut h = Host::ready(cfg(), 1, 0);
    let e = h.q.complete(Completion {
        cqe: Cqe::new(77, Status::SUCCESS),
        data: Bytes::new(),
    });
    assert_eq!(e, Err(QueueError::UnknownCommand { cid: 77 }));
    // A write still receiving its data is not the controller's either.
    start_write(&mut h, 5, 100);
    assert!(h
        .q
        .complete(Completion {
            cqe: Cqe::new(5, Status::SUCCESS),
            data: Bytes::new(),
        })
        .is_err());
}

// ------------------------------------------------------------------ R2T / H2CData

#[test]
fn accepts_write_data_in_several_h2c_pdus_after_one_r2t() {
    let mut h = Host::ready(cfg(), 1, 0);
    let r = start_write(&mut h, 11, 10_000);
    assert_eq!((r.cccid, r.r2to, r.r2tl), (11, 0, 10_000));
    h.no_event();
    let data = pattern(10_000);
    h.send(&h2c(11, r.ttag, 0, false, data[..4096].to_vec()));
    h.send(&h2c(11, r.ttag, 4096, false, data[4096..8192].to_vec()));
    h.no_event();
    h.send(&h2c(11, r.ttag, 8192, true, data[8192..].to_vec()));
    let c = h.command();
    assert_eq!(c.sqe.cid, 11);
    assert_eq!(&c.data[..], &data[..]);
    h.q.complete(Completion {
        cqe: Cqe::new(11, Status::SUCCESS),
        data: Bytes::new(),
    })
    .unwrap();
    assert!(matches!(h.recv(), Some(Pdu::CapsuleResp(_))));
}

/// Connect's SQSIZE (31: 32 entries) bounds the queue, not the configured ceiling (2048): a
/// host cannot make one queue hold more commands (and their in-capsule data) than it has
/// entries.
#[test]
fn rejects_more_commands_than_connects_sqsize_allows() {
    let mut h = Host::ready(cfg(), 1, 0);
    assert!(cfg().max_outstanding > 33);
    for cid in 1..=32 {
        h.send(&write_transport(cid, 512));
    }
    h.no_event();
    assert!(!h.q.is_closed(), "32 commands fit 32 entries");
    assert_eq!(h.q.outstanding(), 32);
    h.send(&write_transport(33, 512));
    h.assert_terminated(Fes::PduSequenceError, None);
}

#[test]
fn accepts_a_connect_whose_data_comes_through_an_r2t() {
    let mut h = Host::new(cfg());
    h.connect_ic(true, true, 0);
    let sqe = FabricsCommand {
        cid: 1,
        flags: PSDT_SGL,
        sgl: Sgl::Transport { length: 1024 },
        kind: FabricsKind::Connect(Connect {
            recfmt: 0,
            qid: 2,
            sqsize: 127,
            cattr: 0,
            kato: 0,
        }),
    }
    .to_sqe();
    h.send(&capsule(sqe, vec![]));
    let Some(Pdu::R2t(r)) = h.recv() else {
        panic!("no R2T for Connect's data")
    };
    h.send(&h2c(1, r.ttag, 0, true, vec![0x5a; 1024]));
    assert_eq!(h.command().data.len(), 1024);
    assert_eq!(h.q.qid(), Some(2));
}

#[test]
fn accepts_writes_beyond_the_r2t_window_in_turn() {
    let mut h = Host::ready(
        QueueConfig {
            max_r2t_commands: 1,
            ..cfg()
        },
        1,
        0,
    );
    let r1 = start_write(&mut h, 1, 100);
    h.send(&write_transport(2, 200));
    assert!(h.recv().is_none(), "no second R2T while the window is full");
    h.send(&h2c(1, r1.ttag, 0, true, pattern(100)));
    let Some(Pdu::R2t(r2)) = h.recv() else {
        panic!("the waiting write gets its R2T")
    };
    assert_eq!((r2.cccid, r2.r2tl), (2, 200));
    assert_ne!(r1.ttag, r2.ttag);
    assert_eq!(h.command().sqe.cid, 1);
    h.send(&h2c(2, r2.ttag, 0, true, pattern(200)));
    assert_eq!(h.command().data.len(), 200);
}

#[test]
fn rejects_h2c_data_beyond_the_r2t() {
    let mut h = Host::ready(cfg(), 1, 0);
    let r = start_write(&mut h, 1, 100);
    h.send(&h2c(1, r.ttag, 0, true, pattern(101)));
    h.assert_terminated(Fes::DataTransferOutOfRange, None);
}

#[test]
fn rejects_h2c_data_out_of_order() {
    let mut h = Host::ready(cfg(), 1, 0);
    let r = start_write(&mut h, 1, 8192);
    h.send(&h2c(1, r.ttag, 4096, true, pattern(4096)));
    h.assert_terminated(Fes::DataTransferOutOfRange, None);
}

#[test]
fn rejects_h2c_data_for_a_ttag_never_issued() {
    let mut h = Host::ready(cfg(), 1, 0);
    let r = start_write(&mut h, 1, 100);
    h.send(&h2c(1, r.ttag.wrapping_add(1), 0, true, pattern(100)));
    h.assert_terminated(Fes::InvalidHeaderField, Some(10));
}

#[test]
fn rejects_h2c_data_after_its_r2t_was_satisfied() {
    let mut h = Host::ready(cfg(), 1, 0);
    let r = start_write(&mut h, 1, 100);
    h.send(&h2c(1, r.ttag, 0, true, pattern(100)));
    h.command();
    h.send(&h2c(1, r.ttag, 100, true, pattern(10)));
    h.assert_terminated(Fes::InvalidHeaderField, Some(10));
}

#[test]
fn rejects_h2c_data_whose_cccid_is_not_the_ttags_command() {
    let mut h = Host::ready(cfg(), 1, 0);
    let r = start_write(&mut h, 1, 100);
    h.send(&h2c(2, r.ttag, 0, true, pattern(100)));
    h.assert_terminated(Fes::InvalidHeaderField, Some(8));
}

#[test]
fn rejects_h2c_data_above_maxh2cdata() {
    // The in-capsule size (8 KiB) lets the codec frame the PDU; MAXH2CDATA (4 KiB) refuses it.
    let mut h = Host::ready(cfg(), 1, 0);
    let r = start_write(&mut h, 1, 8192);
    h.send(&h2c(1, r.ttag, 0, true, pattern(8192)));
    h.assert_terminated(Fes::R2tLimitExceeded, None);
}

#[test]
fn rejects_last_pdu_before_the_end_of_the_r2t() {
    let mut h = Host::ready(cfg(), 1, 0);
    let r = start_write(&mut h, 1, 200);
    h.send(&h2c(1, r.ttag, 0, true, pattern(100)));
    h.assert_terminated(Fes::InvalidHeaderField, Some(1));
}

#[test]
fn rejects_the_end_of_the_r2t_without_last_pdu() {
    let mut h = Host::ready(cfg(), 1, 0);
    let r = start_write(&mut h, 1, 200);
    h.send(&h2c(1, r.ttag, 0, false, pattern(200)));
    h.assert_terminated(Fes::InvalidHeaderField, Some(1));
}

#[test]
fn accepts_an_h2c_data_digest_error_as_a_transient_transport_error() {
    let mut h = Host::new(cfg());
    h.connect_ic(false, true, 0);
    let r = start_write(&mut h, 3, 8192);
    let mut bad = h
        .codec
        .to_bytes(&h2c(3, r.ttag, 0, false, pattern(4096)))
        .unwrap()
        .to_vec();
    let n = bad.len();
    bad[n - 2] ^= 0x40;
    h.send_raw(&bad);
    assert!(!h.q.is_closed());
    h.send(&h2c(3, r.ttag, 4096, true, pattern(4096)));
    h.no_event();
    assert!(matches!(
        h.recv(),
        Some(Pdu::CapsuleResp(r)) if r.cqe.cid == 3 && r.cqe.status == Status::TRANSIENT_TRANSPORT_ERROR
    ));
    // The CID is free again and the queue goes on.
    h.send(&write_in_capsule(3, pattern(8)));
    assert_eq!(h.command().data.len(), 8);
}

#[test]
fn accepts_pdus_split_across_reads() {
    let mut h = Host::ready(cfg(), 1, 0);
    let b = h
        .codec
        .to_bytes(&write_in_capsule(1, pattern(300)))
        .unwrap();
    let mut buf = BytesMut::new();
    for chunk in b.chunks(7) {
        assert!(h.q.poll_event().is_none());
        buf.extend_from_slice(chunk);
        h.q.receive(&mut buf);
    }
    assert_eq!(h.command().data.len(), 300);
    assert!(buf.is_empty());
}

// ------------------------------------------------------------------ a hostile peer, seeded

/// xorshift64*: a seeded generator without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// An R2T the host is answering: where its data has got to.
struct Answering {
    r2t: R2t,
    next: u32,
}

/// One PDU a careless or hostile host might send: mostly well-formed ones with random fields
/// (so they get past the codec and test the queue's own rules) and writes' data in order, now
/// and then one that breaks a rule, a few with a byte flipped.
fn random_pdu(r: &mut Rng, codec: &Codec, r2ts: &mut Vec<Answering>) -> Vec<u8> {
    let cid = r.below(8) as u16;
    let len = [0u32, 1, 511, 4096, 4097, 8192, 9000, 70_000][r.below(8) as usize];
    let mut roll = r.below(100);
    if (55..85).contains(&roll) && r2ts.is_empty() {
        roll = 0;
    }
    let pdu = if roll < 55 {
        let opcode = [WRITE, READ, 0x00, 0x7f][r.below(4) as usize];
        let in_capsule = r.chance(50);
        let sgl = if in_capsule {
            Sgl::InCapsule {
                offset: if r.chance(80) { 0 } else { r.below(3) * 100 },
                length: len.min(8192),
            }
        } else {
            Sgl::Transport { length: len }
        };
        let mut sqe = io(opcode, cid, sgl);
        if opcode == 0x7f {
            sqe.nsid = r.below(8) as u32;
        }
        let data = if in_capsule && r.chance(85) {
            pattern(len.min(8192) as usize)
        } else if r.chance(10) {
            pattern(r.below(9000) as usize)
        } else {
            vec![]
        };
        capsule(sqe, data)
    } else if roll < 85 && !r2ts.is_empty() {
        // The next piece of a write's data, in order, as a host sends it.
        let i = r.below(r2ts.len() as u64) as usize;
        let a = &mut r2ts[i];
        let n = (a.r2t.r2tl - a.next).min(1 + r.below(4096) as u32);
        let d = h2c(
            a.r2t.cccid,
            a.r2t.ttag,
            a.next,
            a.next + n == a.r2t.r2tl,
            pattern(n as usize),
        );
        a.next += n;
        if a.next == a.r2t.r2tl {
            r2ts.swap_remove(i);
        }
        d
    } else if roll < 90 {
        h2c(
            cid,
            r.below(4) as u16,
            r.below(9000) as u32,
            r.chance(50),
            pattern(1 + r.below(4500) as usize),
        )
    } else if roll < 93 {
        Pdu::IcReq(IcReq {
            pfv: 0,
            // The host's codec reads with HPDA 0 unless connect_ic set another.
            hpda: codec.rx_pda,
            hdgst: r.chance(50),
            ddgst: r.chance(50),
            maxr2t: 0,
        })
    } else if roll < 97 {
        Pdu::H2cTermReq(TermReq {
            fes: Fes::PduSequenceError,
            fei: 0,
            data: Bytes::new(),
        })
    } else {
        Pdu::R2t(R2t {
            cccid: cid,
            ttag: 0,
            r2to: 0,
            r2tl: 1,
        })
    };
    let mut b = codec.to_bytes(&pdu).map(|b| b.to_vec()).unwrap_or_default();
    if !b.is_empty() && r.chance(3) {
        let i = r.below(b.len() as u64) as usize;
        b[i] ^= 1 << r.below(8);
    }
    b
}

#[test]
fn accepts_any_byte_stream_without_panicking_or_breaking_its_promises() {
    let (mut commands, mut closes) = (0, 0);
    for seed in 1..=400u64 {
        let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut h = Host::new(QueueConfig {
            maxh2cdata: 4096,
            max_c2h_data: 4096,
            max_transfer: 65_536,
            max_r2t_commands: 2,
            max_outstanding: 6,
            ..QueueConfig::default()
        });
        if r.chance(90) {
            h.connect_ic(r.chance(30), r.chance(30), r.below(3) as u8);
        }
        let mut r2ts: Vec<Answering> = Vec::new();
        let mut held: Vec<Command> = Vec::new();
        let mut closed = false;
        for _ in 0..60 {
            let bytes = random_pdu(&mut r, &h.codec, &mut r2ts);
            // Split at a random point: the queue must reassemble.
            let cut = r.below(bytes.len() as u64 + 1) as usize;
            let mut buf = BytesMut::from(&bytes[..cut]);
            h.q.receive(&mut buf);
            buf.extend_from_slice(&bytes[cut..]);
            h.q.receive(&mut buf);
            while let Some(e) = h.q.poll_event() {
                match e {
                    Event::Command(c) => {
                        assert!(!closed, "seed {seed}: a command after the close");
                        // What reaches the controller is exactly what the SGL describes.
                        if is_host_to_controller(&c.sqe) {
                            assert_eq!(
                                c.data.len(),
                                c.sqe.sgl.length() as usize,
                                "seed {seed}: {:?}",
                                c.sqe
                            );
                        } else if matches!(c.sqe.sgl, Sgl::Transport { .. }) {
                            assert!(c.data.is_empty(), "seed {seed}");
                        }
                        commands += 1;
                        held.push(c);
                    }
                    Event::Closed(_) => closed = true,
                }
            }
            // Complete some held commands with random amounts of data.
            while !held.is_empty() && r.chance(50) {
                let c = held.swap_remove(r.below(held.len() as u64) as usize);
                let n = r.below(10_000) as usize;
                h.q.complete(Completion {
                    cqe: Cqe::new(c.sqe.cid, Status::SUCCESS),
                    data: Bytes::from(pattern(n)),
                })
                .unwrap();
            }
            // Everything the queue writes is a valid PDU for the host.
            while let Some(b) = h.q.poll_transmit() {
                h.rx.extend_from_slice(&b);
            }
            loop {
                match h.codec.decode_from(&mut h.rx) {
                    Ok(Some(Pdu::R2t(t))) => {
                        assert!(t.r2tl <= 65_536, "seed {seed}");
                        r2ts.push(Answering { r2t: t, next: 0 });
                    }
                    Ok(Some(Pdu::C2hData(d))) => assert!(d.data.len() <= 4096, "seed {seed}"),
                    Ok(Some(Pdu::IcResp(ic))) => {
                        h.codec.header_digest = ic.hdgst;
                        h.codec.data_digest = ic.ddgst;
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    // Anything undecodable is a bug.
                    Err(e) => panic!("seed {seed}: the queue wrote an invalid PDU: {e}"),
                }
            }
            if closed {
                assert!(h.q.is_closed());
                closes += 1;
                break;
            }
        }
        assert!(h.q.outstanding() <= 6, "seed {seed}");
    }
    // The stream got past the codec often enough to exercise the queue's own rules.
    assert!(
        commands > 400 && closes > 200,
        "{commands} commands, {closes} closes"
    );
}

/// A driver that reads into one buffer as `Queue::prepare_recv` says (at most its limit per
/// read, each read as much of `stream` as the "socket" has, `avail` bytes at a time) gets
/// every long PDU's data where the socket put it: the commands' data is never moved, and
/// `prepare_recv` always left room for the read. Here two 1 MiB H2CData PDUs and a 4 KiB
/// in-capsule write arrive back to back, the first command's data still held (a store
/// still writing it) while the second arrives.
#[test]
fn receives_long_h2c_data_where_the_socket_put_it() {
    let cfg = QueueConfig {
        maxh2cdata: 1 << 20,
        max_transfer: 1 << 20,
        ..QueueConfig::default()
    };
    for avail in [1000, 65_536, 100_000, 300_000, 3 << 20] {
        let mut h = Host::ready(cfg.clone(), 1, 0);
        let r1 = start_write(&mut h, 1, 1 << 20);
        let r2 = start_write(&mut h, 2, 1 << 20);
        let (d1, d2, d3) = (pattern(1 << 20), pattern((1 << 20) - 3), pattern(4096));
        let mut d2 = d2;
        d2.extend_from_slice(&[1, 2, 3]);
        let mut stream = BytesMut::new();
        let mut starts = Vec::new();
        for (pdu, len) in [
            (h2c(1, r1.ttag, 0, true, d1.clone()), d1.len()),
            (h2c(2, r2.ttag, 0, true, d2.clone()), d2.len()),
            (write_in_capsule(3, d3.clone()), d3.len()),
        ] {
            let b = h.codec.to_bytes(&pdu).unwrap();
            // Where the PDU's data begins in the stream.
            starts.push(stream.len() + b.len() - len);
            stream.extend_from_slice(&b);
        }
        // (stream offset, address, length) of every read.
        let mut landed: Vec<(usize, usize, usize)> = Vec::new();
        let mut buf = BytesMut::new();
        let mut at = 0;
        let mut cmds = Vec::new();
        while at < stream.len() {
            let limit = h.q.prepare_recv(&mut buf);
            let n = limit.min(avail).min(stream.len() - at);
            assert!(buf.capacity() - buf.len() >= n, "avail {avail}: no room");
            let addr = buf.as_ptr() as usize + buf.len();
            buf.extend_from_slice(&stream[at..at + n]);
            landed.push((at, addr, n));
            at += n;
            h.q.receive(&mut buf);
            while let Some(ev) = h.q.poll_event() {
                let Event::Command(c) = ev else {
                    panic!("avail {avail}: {ev:?}")
                };
                cmds.push(c);
            }
        }
        let cids: Vec<u16> = cmds.iter().map(|c| c.sqe.cid).collect();
        assert_eq!(cids, [1, 2, 3], "avail {avail}");
        for ((c, want), start) in cmds.iter().zip([&d1, &d2, &d3]).zip(&starts) {
            assert_eq!(&c.data[..], &want[..], "avail {avail}");
            if want.len() < 32 * 1024 {
                continue;
            }
            let &(s, addr, _) = landed
                .iter()
                .find(|&&(s, _, n)| (s..s + n).contains(start))
                .unwrap();
            assert_eq!(
                c.data.as_ptr() as usize,
                addr + (start - s),
                "avail {avail}: command {} was moved",
                c.sqe.cid
            );
        }
    }
}

/// A driver that follows `Queue::placement` (and `Queue::prepare_recv` otherwise, each read
/// as much as the "socket" has, `avail` bytes at a time) receives an H2CData that carries all
/// of a transfer of at least `place_min` bytes into a buffer of its own: the command's data is
/// that buffer, the whole of its allocation, and no read put any of that data into the
/// receive buffer. A shorter transfer, one sent as two PDUs and an in-capsule write between
/// them are received as before; with data digests nothing is placed. Header digests and a
/// CPDA that pads the data are placed like the rest.
#[test]
fn receives_a_whole_long_transfer_into_a_buffer_of_its_own() {
    const MIB: usize = 1 << 20;
    for (hd, dd, cpda) in [
        (false, false, 0),
        (true, false, 1),
        (false, true, 0),
        (true, true, 0),
    ] {
        for avail in [1000, 65_536, 300_000, 3 << 20] {
            let what = format!("hdgst {hd} ddgst {dd} cpda {cpda} avail {avail}");
            let cfg = QueueConfig {
                maxh2cdata: MIB as u32,
                max_transfer: MIB as u32,
                place_min: MIB as u32,
                cpda,
                ..QueueConfig::default()
            };
            let mut h = Host::ready_with(cfg, 1, 0, hd, dd);
            let r1 = start_write(&mut h, 1, MIB as u32);
            let r2 = start_write(&mut h, 2, (MIB / 2) as u32);
            let r4 = start_write(&mut h, 4, MIB as u32);
            let (d1, d2, d3) = (pattern(MIB), pattern(MIB / 2), pattern(4096));
            let mut d4 = pattern(MIB);
            d4.reverse();
            let half = MIB / 2;
            let mut stream = BytesMut::new();
            let mut d1_at = 0..0;
            for (i, pdu) in [
                h2c(1, r1.ttag, 0, true, d1.clone()),
                h2c(2, r2.ttag, 0, true, d2.clone()),
                write_in_capsule(3, d3.clone()),
                h2c(4, r4.ttag, 0, false, d4[..half].to_vec()),
                h2c(4, r4.ttag, half as u32, true, d4[half..].to_vec()),
            ]
            .iter()
            .enumerate()
            {
                let b = h.codec.to_bytes(pdu).unwrap();
                if i == 0 {
                    let start = stream.len() + b.len() - MIB - if dd { 4 } else { 0 };
                    d1_at = start..start + MIB;
                }
                stream.extend_from_slice(&b);
            }
            let mut buf = BytesMut::new();
            let mut placing: Option<(BytesMut, usize)> = None;
            let mut placed = Vec::new();
            let mut at = 0;
            let mut cmds = Vec::new();
            while at < stream.len() {
                if placing.is_none() {
                    placing = h.q.placement(&buf).map(|n| (BytesMut::with_capacity(n), n));
                }
                let rest = stream.len() - at;
                if let Some((data, n)) = placing.as_mut() {
                    let k = (*n - data.len()).min(avail).min(rest);
                    data.extend_from_slice(&stream[at..at + k]);
                    at += k;
                    if data.len() == *n {
                        let (data, _) = placing.take().unwrap();
                        placed.push(data.as_ptr() as usize);
                        h.q.receive_placed(&mut buf, data.freeze());
                    }
                } else {
                    let limit = h.q.prepare_recv(&mut buf);
                    assert!(limit > 0, "{what}");
                    let k = limit.min(avail).min(rest);
                    assert!(buf.capacity() - buf.len() >= k, "{what}: no room");
                    // No read into the receive buffer takes a placed PDU's data.
                    if !dd {
                        assert!(
                            at + k <= d1_at.start || at >= d1_at.end,
                            "{what}: read {at}+{k}"
                        );
                    }
                    buf.extend_from_slice(&stream[at..at + k]);
                    at += k;
                    h.q.receive(&mut buf);
                }
                while let Some(ev) = h.q.poll_event() {
                    let Event::Command(c) = ev else {
                        panic!("{what}: {ev:?}")
                    };
                    cmds.push(c);
                }
            }
            let cids: Vec<u16> = cmds.iter().map(|c| c.sqe.cid).collect();
            assert_eq!(cids, [1, 2, 3, 4], "{what}");
            for (c, want) in cmds.iter().zip([&d1, &d2, &d3, &d4]) {
                assert_eq!(&c.data[..], &want[..], "{what}");
            }
            if dd {
                assert!(placed.is_empty(), "{what}: placed with a data digest");
                continue;
            }
            assert_eq!(placed, [cmds[0].data.as_ptr() as usize], "{what}");
            let first = cmds.swap_remove(0).data;
            let whole = first.try_into_mut().expect("the only handle on it");
            assert_eq!(whole.capacity(), whole.len(), "{what}");
        }
    }
}

/// A placed H2CData gets every check an H2CData gets: a header digest that does not match
/// terminates the connection (the data is not handed over).
#[test]
fn rejects_a_placed_h2c_data_with_a_bad_header_digest() {
    let cfg = QueueConfig {
        maxh2cdata: 1 << 20,
        max_transfer: 1 << 20,
        place_min: 1 << 20,
        ..QueueConfig::default()
    };
    let mut h = Host::ready_with(cfg, 1, 0, true, false);
    let r = start_write(&mut h, 1, 1 << 20);
    let mut b = BytesMut::from(
        &h.codec
            .to_bytes(&h2c(1, r.ttag, 0, true, pattern(1 << 20)))
            .unwrap()[..],
    );
    b[25] ^= 0xff;
    let data = b.split_off(28);
    let mut head = BytesMut::new();
    while head.len() < b.len() {
        let k = h.q.prepare_recv(&mut head).min(b.len() - head.len());
        head.extend_from_slice(&b[head.len()..head.len() + k]);
        h.q.receive(&mut head);
    }
    assert_eq!(h.q.placement(&head), Some(1 << 20));
    h.q.receive_placed(&mut head, data.freeze());
    h.assert_terminated(Fes::HeaderDigestError, None);
}

/// With an in-capsule size of at least `place_min`, a command capsule that carries all of a
/// write of at least `place_min` bytes is placed like a long H2CData once a capsule before it
/// carried one (the first is received as before: nothing says it is coming): its data is
/// read into a buffer of its own, all of that allocation, and no read into the receive
/// buffer takes any of it. A read's capsule between them changes nothing; a short write's
/// capsule ends the placing until a long one comes again; a write whose SGL is not all of
/// the capsule's data is not placed. With data digests nothing is placed. Commands hold
/// their write data (`Queue::held`) until they complete.
#[test]
fn receives_a_long_write_in_its_capsule_into_a_buffer_of_its_own() {
    const MIB: usize = 1 << 20;
    for (hd, dd, cpda) in [
        (false, false, 0),
        (true, false, 1),
        (false, true, 0),
        (true, false, 0),
    ] {
        for avail in [1000, 65_536, 300_000, 3 << 20] {
            let what = format!("hdgst {hd} ddgst {dd} cpda {cpda} avail {avail}");
            let cfg = QueueConfig {
                maxh2cdata: MIB as u32,
                max_transfer: MIB as u32,
                io_in_capsule: MIB as u32,
                place_min: MIB as u32,
                cpda,
                ..QueueConfig::default()
            };
            let mut h = Host::ready_with(cfg, 1, 0, hd, dd);
            let data: Vec<Vec<u8>> = (0..7u8)
                .map(|i| {
                    let mut d = pattern(if i == 4 { 4096 } else { MIB });
                    d[0] = i;
                    d
                })
                .collect();
            let read = capsule(io(READ, 10, Sgl::Transport { length: 4096 }), vec![]);
            // Not all of the capsule's data: 16 bytes before the write's.
            let mut off = vec![0u8; 16];
            off.extend_from_slice(&data[6][16..]);
            let offset = capsule(
                io(
                    WRITE,
                    6,
                    Sgl::InCapsule {
                        offset: 16,
                        length: (MIB - 16) as u32,
                    },
                ),
                off,
            );
            let pdus = [
                write_in_capsule(0, data[0].clone()),
                write_in_capsule(1, data[1].clone()),
                read,
                write_in_capsule(2, data[2].clone()),
                write_in_capsule(3, data[3].clone()),
                write_in_capsule(4, data[4].clone()),
                write_in_capsule(5, data[5].clone()),
                offset,
            ];
            let mut stream = BytesMut::new();
            // Where the data of the writes that must be placed lies in the stream.
            let mut must = Vec::new();
            for (i, pdu) in pdus.iter().enumerate() {
                let b = h.codec.to_bytes(pdu).unwrap();
                if [3, 4].contains(&i) {
                    let start = stream.len() + b.len() - MIB - if dd { 4 } else { 0 };
                    must.push(start..start + MIB);
                }
                stream.extend_from_slice(&b);
            }
            let mut buf = BytesMut::new();
            let mut placing: Option<(BytesMut, usize)> = None;
            let mut placed = Vec::new();
            let mut at = 0;
            let mut cmds = Vec::new();
            while at < stream.len() {
                if placing.is_none() {
                    placing = h.q.placement(&buf).map(|n| (BytesMut::with_capacity(n), n));
                }
                let rest = stream.len() - at;
                if let Some((d, n)) = placing.as_mut() {
                    let k = (*n - d.len()).min(avail).min(rest);
                    d.extend_from_slice(&stream[at..at + k]);
                    at += k;
                    if d.len() == *n {
                        let (d, _) = placing.take().unwrap();
                        placed.push(d.as_ptr() as usize);
                        h.q.receive_placed(&mut buf, d.freeze());
                    }
                } else {
                    let limit = h.q.prepare_recv(&mut buf);
                    assert!(limit > 0, "{what}");
                    let k = limit.min(avail).min(rest);
                    assert!(buf.capacity() - buf.len() >= k, "{what}: no room");
                    if !dd {
                        for r in &must {
                            assert!(at + k <= r.start || at >= r.end, "{what}: read {at}+{k}");
                        }
                    }
                    buf.extend_from_slice(&stream[at..at + k]);
                    at += k;
                    h.q.receive(&mut buf);
                }
                while let Some(ev) = h.q.poll_event() {
                    let Event::Command(c) = ev else {
                        panic!("{what}: {ev:?}")
                    };
                    cmds.push(c);
                }
            }
            let cids: Vec<u16> = cmds.iter().map(|c| c.sqe.cid).collect();
            assert_eq!(cids, [0, 1, 10, 2, 3, 4, 5, 6], "{what}");
            let writes: Vec<&Command> = cmds.iter().filter(|c| c.sqe.cid != 10).collect();
            for (c, want) in writes.iter().zip(&data) {
                let want = if c.sqe.cid == 6 {
                    &want[16..]
                } else {
                    &want[..]
                };
                assert_eq!(&c.data[..], want, "{what}");
            }
            let total: usize = writes.iter().map(|c| c.data.len()).sum();
            assert_eq!(h.q.held(), total, "{what}");
            // The writes whose data landed in a placed buffer: at least the two whose capsule
            // came after a long write's was received (the one right after the first may have
            // begun in the read that took the first; a head that a read happened to end at is
            // placed too), never the one whose SGL is not all of its capsule's data.
            let placed_cids: Vec<u16> = writes
                .iter()
                .filter(|c| placed.contains(&(c.data.as_ptr() as usize)))
                .map(|c| c.sqe.cid)
                .collect();
            assert_eq!(placed_cids.len(), placed.len(), "{what}");
            if dd {
                assert!(placed.is_empty(), "{what}: placed with a data digest");
            } else {
                for cid in [2, 3] {
                    assert!(placed_cids.contains(&cid), "{what}: {placed_cids:?}");
                }
                assert!(
                    placed_cids.iter().all(|c| [0, 1, 2, 3, 5].contains(c)),
                    "{what}: {placed_cids:?}"
                );
            }
            let mut left = total;
            for c in cmds {
                let (cid, len) = (c.sqe.cid, c.data.len());
                if placed.contains(&(c.data.as_ptr() as usize)) {
                    let whole = c.data.try_into_mut().expect("the only handle on it");
                    assert_eq!(whole.capacity(), whole.len(), "{what}");
                }
                h.q.complete(Completion {
                    cqe: Cqe::new(cid, Status::SUCCESS),
                    data: Bytes::new(),
                })
                .unwrap();
                left -= if cid == 10 { 0 } else { len };
                assert_eq!(h.q.held(), left, "{what}");
            }
        }
    }
}

/// A connection that sends only short writes keeps a short receive buffer whatever the
/// in-capsule size: room for a 1 MiB capsule behind every read is made only once a capsule
/// carried more than 64 KiB (at 4 KiB × 32 writes a ~2.3 MiB buffer was allocated and given
/// back to the OS over and over, docs/results/nvme-speed-11).
#[test]
fn leaves_room_for_long_capsules_only_once_one_came() {
    const MIB: usize = 1 << 20;
    let cfg = QueueConfig {
        maxh2cdata: MIB as u32,
        max_transfer: MIB as u32,
        io_in_capsule: MIB as u32,
        place_min: MIB as u32,
        ..QueueConfig::default()
    };
    let mut h = Host::ready(cfg, 1, 0);
    let mut buf = BytesMut::new();
    for (cid, len) in [(1u16, 4096usize), (2, 4096), (3, 128 * 1024), (4, 4096)] {
        let limit = h.q.prepare_recv(&mut buf);
        let room = buf.capacity() - buf.len();
        if cid <= 3 {
            assert!(room < MIB, "write {cid}: room {room}");
            assert!(limit < MIB, "write {cid}: limit {limit}");
        } else {
            assert!(room > 2 * MIB, "write {cid}: room {room}");
        }
        let b = h
            .codec
            .to_bytes(&write_in_capsule(cid, pattern(len)))
            .unwrap();
        buf.extend_from_slice(&b);
        h.q.receive(&mut buf);
        let c = h.command();
        assert_eq!(c.data.len(), len);
        drop(c);
        h.q.complete(Completion {
            cqe: Cqe::new(cid, Status::SUCCESS),
            data: Bytes::new(),
        })
        .unwrap();
    }
}
