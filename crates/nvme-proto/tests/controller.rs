//! The controller as a Linux host drives it (nvme_tcp + nvme core bring-up), the discovery
//! controller, every refusal, keep-alive expiry with time passed in, and block requests run
//! against an in-test store.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use nvme_proto::auth::{
    AuthConfig, AuthState, DhGroup, DhchapSecret, HashId, HostAuth, HostStep, RECEIVE_ALLOC_LEN,
};
use nvme_proto::controller::{
    AcquireAction, AllowedHosts, BlockError, BlockOp, Channel, CloseReason, DhchapHosts,
    DiscoveryEntry, Event, NamespaceConfig, Queue, RegisterAction, Registrant, Reservation,
    ReservationStatus, Submitted, SubsystemConfig, Target, TargetConfig, TlsPeer, DISCOVERY_NQN,
};
use nvme_proto::{Command, Completion};
use nvme_wire::fabrics::{
    Auth, Connect, ConnectData, FabricsCommand, FabricsKind, Property, PropertyGet, PropertySet,
    CNTLID_DYNAMIC, SECP_NVME_AUTH, SPSP_DHCHAP,
};
use nvme_wire::{Sgl, Sqe, Status};

const SUBNQN: &str = "nqn.2026-01.io.ipsan:disk1";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
const HOSTID: [u8; 16] = [0x11; 16];
const BS: u32 = 4096;
const NS_BLOCKS: u64 = 256;

fn ns(nsid: u32) -> NamespaceConfig {
    NamespaceConfig {
        nsid,
        size: NS_BLOCKS * u64::from(BS),
        block_size: BS,
        nguid: [0xa0 + nsid as u8; 16],
        uuid: [0xb0 + nsid as u8; 16],
        eui64: [0xc0 + nsid as u8; 8],
        deallocate_zeroes: true,
        read_only: false,
        reservations: false,
    }
}

fn subsystem(hosts: AllowedHosts) -> SubsystemConfig {
    SubsystemConfig {
        nqn: SUBNQN.into(),
        serial: "IPSAN0001".into(),
        model: "ipsan RAM".into(),
        namespaces: vec![ns(1)],
        hosts,
        auth_required: false,
        volatile_write_cache: true,
    }
}

fn config() -> TargetConfig {
    TargetConfig {
        subsystems: vec![
            subsystem(AllowedHosts::Any),
            SubsystemConfig {
                nqn: "nqn.2026-01.io.ipsan:private".into(),
                hosts: AllowedHosts::Only(vec!["nqn.other-host".into()]),
                ..subsystem(AllowedHosts::Any)
            },
        ],
        discovery: vec![
            DiscoveryEntry {
                subnqn: DISCOVERY_NQN.into(),
                traddr: "127.0.0.1".into(),
                trsvcid: "8009".into(),
                ipv6: false,
                portid: 1,
                treq_secure_channel: 2,
                sectype: 0,
            },
            DiscoveryEntry {
                subnqn: SUBNQN.into(),
                traddr: "127.0.0.1".into(),
                trsvcid: "4420".into(),
                ipv6: false,
                portid: 1,
                treq_secure_channel: 1,
                sectype: 2,
            },
            DiscoveryEntry {
                subnqn: "nqn.2026-01.io.ipsan:private".into(),
                traddr: "127.0.0.1".into(),
                trsvcid: "4420".into(),
                ipv6: false,
                portid: 1,
                treq_secure_channel: 0,
                sectype: 0,
            },
        ],
        max_io_queues: 4,
        queue_size: 128,
        ..TargetConfig::default()
    }
}

fn fabrics(cid: u16, sgl: Sgl, kind: FabricsKind) -> Sqe {
    FabricsCommand {
        cid,
        flags: nvme_wire::entry::PSDT_SGL,
        sgl,
        kind,
    }
    .to_sqe()
}

fn connect_cmd(
    qid: u16,
    sqsize: u16,
    kato: u32,
    subnqn: &str,
    hostnqn: &str,
    cntlid: u16,
) -> Command {
    connect_cmd_id(qid, sqsize, kato, subnqn, hostnqn, cntlid, HOSTID)
}

fn connect_cmd_id(
    qid: u16,
    sqsize: u16,
    kato: u32,
    subnqn: &str,
    hostnqn: &str,
    cntlid: u16,
    hostid: [u8; 16],
) -> Command {
    let data = ConnectData {
        hostid,
        cntlid,
        subnqn: subnqn.into(),
        hostnqn: hostnqn.into(),
    }
    .encode()
    .unwrap();
    Command {
        sqe: fabrics(
            1,
            Sgl::InCapsule {
                offset: 0,
                length: 1024,
            },
            FabricsKind::Connect(Connect {
                recfmt: 0,
                qid,
                sqsize,
                cattr: 0,
                kato,
            }),
        ),
        data: Bytes::copy_from_slice(&data),
    }
}

fn cmd(opcode: u8, cid: u16, nsid: u32, sgl_len: u32, cdw: [u32; 6]) -> Command {
    let mut sqe = Sqe::new(opcode, cid, Sgl::Transport { length: sgl_len });
    sqe.nsid = nsid;
    sqe.cdw = cdw;
    Command {
        sqe,
        data: Bytes::new(),
    }
}

fn with_data(mut c: Command, data: Vec<u8>) -> Command {
    c.sqe.sgl = Sgl::InCapsule {
        offset: 0,
        length: data.len() as u32,
    };
    c.data = Bytes::from(data);
    c
}

fn done(s: Submitted) -> Completion {
    match s {
        Submitted::Done(c) => c,
        other => panic!("expected a completion, got {other:?}"),
    }
}

fn status(s: Submitted) -> Status {
    done(s).cqe.status
}

/// A host with its queues against one target; the in-test store runs block requests.
struct Host {
    t: Target,
    now: Instant,
    admin: Queue,
    store: HashMap<u32, Vec<u8>>,
    /// Results the store returns instead of running the next requests.
    fail_next: Option<BlockError>,
    /// The last reservation request the store ran.
    last_resv: Option<Reservation>,
}

impl Host {
    fn connect(t: Target, kato: u32) -> Self {
        Self::connect_to(t, kato, SUBNQN)
    }

    fn connect_to(mut t: Target, kato: u32, subnqn: &str) -> Self {
        let now = Instant::now();
        let (admin, c) = t
            .connect(
                &connect_cmd(0, 31, kato, subnqn, HOSTNQN, CNTLID_DYNAMIC),
                now,
            )
            .unwrap();
        assert!(c.cqe.status.is_success());
        assert_eq!(admin.cntlid() as u32, c.cqe.dw0 & 0xffff);
        Self {
            t,
            now,
            admin,
            store: HashMap::from([(1, vec![0u8; (NS_BLOCKS * u64::from(BS)) as usize])]),
            fail_next: None,
            last_resv: None,
        }
    }

    fn admin(&mut self, c: Command) -> Submitted {
        self.t.submit(&mut self.admin, c, self.now)
    }

    fn prop_get(&mut self, property: Property, size8: bool) -> Completion {
        let sqe = fabrics(
            2,
            Sgl::Transport { length: 0 },
            FabricsKind::PropertyGet(PropertyGet { size8, property }),
        );
        done(self.admin(Command {
            sqe,
            data: Bytes::new(),
        }))
    }

    fn prop_set(&mut self, property: Property, value: u64) -> Completion {
        let sqe = fabrics(
            3,
            Sgl::Transport { length: 0 },
            FabricsKind::PropertySet(PropertySet {
                size8: false,
                property,
                value,
            }),
        );
        done(self.admin(Command {
            sqe,
            data: Bytes::new(),
        }))
    }

    /// CC as Linux's nvme_enable_ctrl writes it: IOSQES 6, IOCQES 4, then EN.
    fn enable(&mut self) {
        let cc = 6 << 16 | 4 << 20;
        assert!(self.prop_set(Property::Cc, cc).cqe.status.is_success());
        assert!(self.prop_set(Property::Cc, cc | 1).cqe.status.is_success());
        assert_eq!(
            self.prop_get(Property::Csts, false).cqe.dw0 & 1,
            1,
            "CSTS.RDY"
        );
    }

    fn identify(&mut self, cns: u32, nsid: u32) -> Completion {
        done(self.admin(cmd(0x06, 4, nsid, 4096, [cns, 0, 0, 0, 0, 0])))
    }

    fn io_queue(&mut self, qid: u16) -> Result<Queue, Completion> {
        let c = connect_cmd(qid, 127, 0, SUBNQN, HOSTNQN, self.admin.cntlid());
        self.t.connect(&c, self.now).map(|(q, r)| {
            assert!(r.cqe.status.is_success());
            q
        })
    }

    /// Runs a command's block requests against the store.
    fn run_io(&mut self, q: &mut Queue, c: Command) -> Completion {
        match q.submit(c, self.now) {
            Submitted::Done(c) => c,
            Submitted::Held => panic!("I/O held"),
            Submitted::Block(reqs) => {
                let mut last = None;
                for r in reqs {
                    let result = self.execute(r.nsid, &r.op);
                    let c = q.block_done(r.tag, result);
                    assert!(last.is_none(), "completion before the last request");
                    last = c;
                }
                last.expect("completion after the last request")
            }
        }
    }

    fn execute(&mut self, nsid: u32, op: &BlockOp) -> Result<Bytes, BlockError> {
        if let Some(e) = self.fail_next.take() {
            return Err(e);
        }
        let s = self.store.get_mut(&nsid).ok_or(BlockError::Internal)?;
        let range = |o: u64, l: u64| o as usize..(o + l) as usize;
        Ok(match op {
            BlockOp::Read { offset, len } => Bytes::copy_from_slice(&s[range(*offset, *len)]),
            BlockOp::Write { offset, data, .. } => {
                s[range(*offset, data.len() as u64)].copy_from_slice(data);
                Bytes::new()
            }
            BlockOp::Discard { offset, len } | BlockOp::WriteZeroes { offset, len } => {
                s[range(*offset, *len)].fill(0);
                Bytes::new()
            }
            BlockOp::Flush => Bytes::new(),
            BlockOp::Reservation(r) => {
                self.last_resv = Some(*r);
                if *r == Reservation::Report {
                    ReservationStatus {
                        generation: 2,
                        rtype: 1,
                        registrants: vec![Registrant {
                            hostid: HOSTID,
                            rkey: 0xab,
                            holds: true,
                        }],
                    }
                    .encode()
                } else {
                    Bytes::new()
                }
            }
        })
    }
}

fn rw(opcode: u8, cid: u16, slba: u64, nlb0: u32) -> Command {
    let len = (nlb0 + 1) * BS;
    cmd(
        opcode,
        cid,
        1,
        len,
        [slba as u32, (slba >> 32) as u32, nlb0, 0, 0, 0],
    )
}

fn write(cid: u16, slba: u64, data: Vec<u8>) -> Command {
    let nlb0 = data.len() as u32 / BS - 1;
    with_data(rw(0x01, cid, slba, nlb0), data)
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

#[test]
fn accepts_linux_host_bring_up_and_round_trips_data() {
    let mut h = Host::connect(Target::new(config()).unwrap(), 5000);
    // nvme_enable_ctrl: CAP first.
    let cap = h.prop_get(Property::Cap, true);
    assert!(cap.cqe.status.is_success());
    let cap = u64::from(cap.cqe.dw0) | u64::from(cap.cqe.dw1) << 32;
    assert_eq!(cap & 0xffff, 127, "MQES");
    assert_ne!(cap & 1 << 16, 0, "CQR");
    assert_ne!(cap & 1 << 37, 0, "CSS NVM");
    assert_eq!(h.prop_get(Property::Vs, false).cqe.dw0, 0x0002_0000);
    assert_eq!(h.prop_get(Property::Csts, false).cqe.dw0 & 1, 0);
    h.enable();

    let id = h.identify(1, 0);
    assert!(id.cqe.status.is_success());
    let d = &id.data;
    assert_eq!(d.len(), 4096);
    assert_eq!(&d[4..13], b"IPSAN0001");
    assert_eq!(u16::from_le_bytes([d[78], d[79]]), h.admin.cntlid());
    assert_eq!(le32(d, 80), 0x0002_0000, "VER");
    assert_eq!(d[77], 8, "MDTS: 1 MiB in 4 KiB pages");
    assert_eq!(d[111], 1, "CNTRLTYPE I/O");
    assert_eq!(u16::from_le_bytes([d[520], d[521]]), 0x2d, "ONCS");
    assert_eq!(d[525], 0x07, "VWC");
    assert_eq!(d[512], 0x66);
    assert_eq!(d[513], 0x44);
    assert_eq!(le32(d, 1792), (64 + 8192) / 16, "IOCCSZ");
    assert_eq!(le32(d, 1796), 1, "IORCSZ");
    assert_eq!(&d[768..768 + SUBNQN.len()], SUBNQN.as_bytes());
    assert_eq!(d[768 + SUBNQN.len()], 0);

    let list = h.identify(2, 0);
    assert_eq!(le32(&list.data, 0), 1);
    assert_eq!(le32(&list.data, 4), 0);

    let idns = h.identify(0, 1);
    assert_eq!(le64(&idns.data, 0), NS_BLOCKS, "NSZE");
    assert_eq!(idns.data[33], 0x09, "DLFEAT");
    assert_eq!(&idns.data[104..120], &[0xa1; 16], "NGUID");
    assert_eq!(&idns.data[120..128], &[0xc1; 8], "EUI64");
    assert_eq!((le32(&idns.data, 128) >> 16) & 0xff, 12, "LBADS");

    let desc = h.identify(3, 1);
    let b = &desc.data;
    assert_eq!((b[0], b[1]), (1, 8));
    assert_eq!(&b[4..12], &[0xc1; 8]);
    assert_eq!((b[12], b[13]), (2, 16));
    assert_eq!(&b[16..32], &[0xa1; 16]);
    assert_eq!((b[32], b[33]), (3, 16));
    assert_eq!(&b[36..52], &[0xb1; 16]);
    assert_eq!((b[52], b[53], b[56]), (4, 1, 0), "CSI NVM");

    // Number of Queues: 2 asked, 2 granted (0's based in both halves).
    let nq = done(h.admin(cmd(0x09, 5, 0, 0, [0x07, 1 | 1 << 16, 0, 0, 0, 0])));
    assert!(nq.cqe.status.is_success());
    assert_eq!(nq.cqe.dw0, 1 | 1 << 16);

    let mut q1 = h.io_queue(1).unwrap();
    let mut q2 = h.io_queue(2).unwrap();
    let data: Vec<u8> = (0..2 * BS).map(|i| (i % 251) as u8).collect();
    let c = h.run_io(&mut q1, write(10, 7, data.clone()));
    assert!(c.cqe.status.is_success());
    let c = h.run_io(&mut q2, rw(0x02, 11, 7, 1));
    assert!(c.cqe.status.is_success());
    assert_eq!(c.data, data, "read on queue 2 returns what queue 1 wrote");
    assert_eq!(c.cqe.cid, 11);
    let c = h.run_io(&mut q1, cmd(0x00, 12, 1, 0, [0; 6]));
    assert!(c.cqe.status.is_success(), "flush");
    // Keep Alive.
    assert!(status(h.admin(cmd(0x18, 13, 0, 0, [0; 6]))).is_success());
    // The counters reach the SMART log.
    let smart = done(h.admin(cmd(
        0x02,
        14,
        u32::MAX,
        512,
        [0x02 | 127 << 16, 0, 0, 0, 0, 0],
    )));
    assert!(smart.cqe.status.is_success());
    assert_eq!(le64(&smart.data, 64), 1, "host read commands");
    assert_eq!(le64(&smart.data, 80), 1, "host write commands");
    let info = h.t.controllers();
    assert_eq!(info.len(), 1);
    assert_eq!(info[0].io_queues, vec![1, 2]);
}

#[test]
fn discovery_log_lists_what_the_host_may_connect_to() {
    let mut h = Host::connect_to(Target::new(config()).unwrap(), 0, DISCOVERY_NQN);
    assert!(h.admin.is_discovery());
    h.enable();
    let id = h.identify(1, 0);
    assert_eq!(id.data[111], 2, "CNTRLTYPE discovery");
    assert_eq!(
        &id.data[768..768 + DISCOVERY_NQN.len()],
        DISCOVERY_NQN.as_bytes()
    );
    assert_eq!(
        status(h.admin(cmd(0x06, 4, 1, 4096, [0, 0, 0, 0, 0, 0]))),
        Status::INVALID_FIELD
    );
    // libnvme reads the header first, then the whole page.
    let hdr = done(h.admin(cmd(0x02, 5, 0, 16, [0x70 | 3 << 16, 0, 0, 0, 0, 0])));
    assert!(hdr.cqe.status.is_success());
    let genctr = le64(&hdr.data, 0);
    assert_eq!(
        le64(&hdr.data, 8),
        2,
        "the private subsystem is hidden from this host"
    );
    let len: u32 = 1024 * 3;
    let page = done(h.admin(cmd(
        0x02,
        6,
        0,
        len,
        [0x70 | (len / 4 - 1) << 16, 0, 0, 0, 0, 0],
    )));
    let e0 = &page.data[1024..2048];
    assert_eq!(
        (e0[0], e0[1], e0[2]),
        (3, 1, 3),
        "TCP, IPv4, current discovery subsystem"
    );
    assert_eq!(&e0[32..36], b"8009");
    let e1 = &page.data[2048..3072];
    assert_eq!(e1[2], 2, "NVM subsystem");
    assert_eq!(e1[3], 1, "TREQ: secure channel required");
    assert_eq!(e1[768], 2, "TSAS SECTYPE TLS 1.3");
    assert_eq!(&e1[256..256 + SUBNQN.len()], SUBNQN.as_bytes());
    assert_eq!(&e1[512..521], b"127.0.0.1");
    assert_eq!(u16::from_le_bytes([e1[6], e1[7]]), 0xffff);

    // Discovery Log Page Change notices: an AER completes when the entries change.
    assert!(status(h.admin(cmd(0x09, 7, 0, 0, [0x0b, 1 << 31, 0, 0, 0, 0]))).is_success());
    assert!(matches!(
        h.admin(cmd(0x0c, 8, 0, 0, [0; 6])),
        Submitted::Held
    ));
    assert!(h.t.poll_event().is_none());
    h.t.set_discovery_entries(Vec::new());
    match h.t.poll_event() {
        Some(Event::AdminCompletion { cntlid, completion }) => {
            assert_eq!(cntlid, h.admin.cntlid());
            assert_eq!(completion.cqe.cid, 8);
            assert_eq!(completion.cqe.dw0, 2 | 0xf0 << 8 | 0x70 << 16);
        }
        other => panic!("{other:?}"),
    }
    let hdr = done(h.admin(cmd(0x02, 9, 0, 16, [0x70 | 3 << 16, 0, 0, 0, 0, 0])));
    assert_ne!(le64(&hdr.data, 0), genctr, "GENCTR moved");
    assert_eq!(le64(&hdr.data, 8), 0);
}

fn refused(t: &mut Target, c: &Command) -> Completion {
    match t.connect(c, Instant::now()) {
        Ok(_) => panic!("connect accepted"),
        Err(c) => c,
    }
}

#[test]
fn rejects_connect_to_unknown_subnqn_with_ipo_in_the_data() {
    let mut t = Target::new(config()).unwrap();
    let c = refused(
        &mut t,
        &connect_cmd(0, 31, 0, "nqn.nope", HOSTNQN, CNTLID_DYNAMIC),
    );
    assert_eq!(c.cqe.status, Status::CONNECT_INVALID_PARAMETERS);
    assert!(c.cqe.dnr);
    assert_eq!(c.cqe.dw0, 1 << 16 | 256, "IATTR data, IPO SUBNQN");
}

#[test]
fn rejects_connect_from_host_not_allowed() {
    let mut t = Target::new(config()).unwrap();
    let c = connect_cmd(
        0,
        31,
        0,
        "nqn.2026-01.io.ipsan:private",
        HOSTNQN,
        CNTLID_DYNAMIC,
    );
    let r = refused(&mut t, &c);
    assert_eq!(r.cqe.status, Status::CONNECT_INVALID_HOST);
    assert_eq!(r.cqe.dw0, 1 << 16 | 512, "IPO HOSTNQN");
    // The allowed host gets in.
    let ok = connect_cmd(
        0,
        31,
        0,
        "nqn.2026-01.io.ipsan:private",
        "nqn.other-host",
        CNTLID_DYNAMIC,
    );
    assert!(t.connect(&ok, Instant::now()).is_ok());
}

/// A subsystem's host list changed live: the host taken off it loses its controller (and
/// the I/O queue with it) and cannot connect again; the host put on it connects at once.
#[test]
fn rejects_a_host_taken_off_the_list_live_and_accepts_the_one_put_on_it() {
    let mut h = Host::connect(Target::new(config()).unwrap(), 0);
    h.enable();
    let mut q = h.io_queue(1).unwrap();
    let private = "nqn.2026-01.io.ipsan:private";
    let other = connect_cmd(0, 31, 0, private, HOSTNQN, CNTLID_DYNAMIC);
    assert_eq!(
        refused(&mut h.t, &other).cqe.status,
        Status::CONNECT_INVALID_HOST
    );
    assert_eq!(
        h.t.set_allowed_hosts(SUBNQN, AllowedHosts::Only(vec!["nqn.other-host".into()]))
            .unwrap(),
        vec![h.admin.cntlid()],
        "HOSTNQN's controller is closed"
    );
    match h.t.poll_event() {
        Some(Event::CloseController { cntlid, reason }) => {
            assert_eq!(cntlid, h.admin.cntlid());
            assert_eq!(reason, CloseReason::HostNotAllowed);
        }
        other => panic!("{other:?}"),
    }
    assert!(!q.is_live() && !h.admin.is_live());
    assert_ne!(
        h.run_io(&mut q, rw(0x02, 4, 0, 0)).cqe.status,
        Status::SUCCESS,
        "no I/O on the closed controller's queue"
    );
    let again = connect_cmd(0, 31, 0, SUBNQN, HOSTNQN, CNTLID_DYNAMIC);
    let r = refused(&mut h.t, &again);
    assert_eq!(r.cqe.status, Status::CONNECT_INVALID_HOST);
    assert_eq!(r.cqe.dw0, 1 << 16 | 512, "IPO HOSTNQN");
    // The other subsystem's list lets HOSTNQN in now; the same list again closes nothing.
    h.t.set_allowed_hosts(private, AllowedHosts::Only(vec![HOSTNQN.into()]))
        .unwrap();
    assert!(h.t.connect(&other, h.now).is_ok());
    assert_eq!(
        h.t.allowed_hosts(private),
        Some(&AllowedHosts::Only(vec![HOSTNQN.into()]))
    );
    assert!(h
        .t
        .set_allowed_hosts(private, AllowedHosts::Only(vec![HOSTNQN.into()]))
        .unwrap()
        .is_empty());
    // Back to any host.
    h.t.set_allowed_hosts(SUBNQN, AllowedHosts::Any).unwrap();
    assert!(h.t.connect(&again, h.now).is_ok());
    assert!(h
        .t
        .set_allowed_hosts(DISCOVERY_NQN, AllowedHosts::Any)
        .is_err());
}

#[test]
fn rejects_connect_with_bad_queue_parameters() {
    let mut t = Target::new(config()).unwrap();
    let r = refused(
        &mut t,
        &connect_cmd(0, 128, 0, SUBNQN, HOSTNQN, CNTLID_DYNAMIC),
    );
    assert_eq!(r.cqe.status, Status::CONNECT_INVALID_PARAMETERS);
    assert_eq!(r.cqe.dw0, 44, "IATTR SQE, IPO SQSIZE");
    let r = refused(
        &mut t,
        &connect_cmd(0, 0, 0, SUBNQN, HOSTNQN, CNTLID_DYNAMIC),
    );
    assert_eq!(r.cqe.dw0, 44);
    let r = refused(&mut t, &connect_cmd(0, 31, 0, SUBNQN, HOSTNQN, 5));
    assert_eq!(
        (r.cqe.status, r.cqe.dw0),
        (Status::CONNECT_INVALID_PARAMETERS, 1 << 16 | 16),
        "static CNTLID"
    );
    let mut bad = connect_cmd(0, 31, 0, SUBNQN, HOSTNQN, CNTLID_DYNAMIC);
    bad.sqe.cdw[0] |= 1; // RECFMT 1
    assert_eq!(
        refused(&mut t, &bad).cqe.status,
        Status::CONNECT_INCOMPATIBLE_FORMAT
    );
    let mut short = connect_cmd(0, 31, 0, SUBNQN, HOSTNQN, CNTLID_DYNAMIC);
    short.data.truncate(512);
    assert_eq!(
        refused(&mut t, &short).cqe.status,
        Status::DATA_SGL_LENGTH_INVALID
    );
    let first = cmd(0x06, 1, 0, 4096, [1, 0, 0, 0, 0, 0]);
    assert_eq!(
        refused(&mut t, &first).cqe.status,
        Status::INVALID_OPCODE,
        "not a Fabrics command"
    );
    let prop = Command {
        sqe: fabrics(
            1,
            Sgl::Transport { length: 0 },
            FabricsKind::PropertyGet(PropertyGet {
                size8: true,
                property: Property::Cap,
            }),
        ),
        data: Bytes::new(),
    };
    assert_eq!(
        refused(&mut t, &prop).cqe.status,
        Status::COMMAND_SEQUENCE_ERROR,
        "first command not Connect"
    );
}

#[test]
fn rejects_io_queue_connects_that_do_not_match_the_controller() {
    let mut h = Host::connect(Target::new(config()).unwrap(), 0);
    // Before CC.EN: no I/O queues.
    let r = h.io_queue(1).unwrap_err();
    assert_eq!(r.cqe.status, Status::COMMAND_SEQUENCE_ERROR);
    h.enable();
    let nq = done(h.admin(cmd(0x09, 5, 0, 0, [0x07, 0, 0, 0, 0, 0])));
    assert_eq!(nq.cqe.dw0, 0, "one queue granted");
    let r = h.io_queue(2).unwrap_err();
    assert_eq!(
        (r.cqe.status, r.cqe.dw0),
        (Status::CONNECT_INVALID_PARAMETERS, 42),
        "QID beyond the grant"
    );
    let _q1 = h.io_queue(1).unwrap();
    let r = h.io_queue(1).unwrap_err();
    assert_eq!(
        r.cqe.status,
        Status::COMMAND_SEQUENCE_ERROR,
        "QID already connected"
    );
    let cntlid = h.admin.cntlid();
    let r = refused(
        &mut h.t,
        &connect_cmd(1, 127, 0, SUBNQN, HOSTNQN, cntlid + 1),
    );
    assert_eq!(
        (r.cqe.status, r.cqe.dw0),
        (Status::CONNECT_INVALID_PARAMETERS, 1 << 16 | 16),
        "unknown CNTLID"
    );
    let r = refused(
        &mut h.t,
        &connect_cmd(1, 127, 0, SUBNQN, "nqn.someone-else", cntlid),
    );
    assert_eq!(r.cqe.dw0, 1 << 16 | 16, "another host's controller");
    let r = refused(
        &mut h.t,
        &connect_cmd_id(1, 127, 0, SUBNQN, HOSTNQN, cntlid, [0x22; 16]),
    );
    assert_eq!(
        (r.cqe.status, r.cqe.dw0),
        (Status::CONNECT_INVALID_HOST, 1 << 16),
        "another Host Identifier"
    );
}

#[test]
fn rejects_admin_commands_before_enable_and_unknown_ones_after() {
    let mut h = Host::connect(Target::new(config()).unwrap(), 0);
    let c = h.identify(1, 0);
    assert_eq!(c.cqe.status, Status::COMMAND_SEQUENCE_ERROR);
    h.enable();
    for op in [0x01u8, 0x05, 0x0d, 0x80, 0x10] {
        let c = done(h.admin(cmd(op, 7, 0, 0, [0; 6])));
        assert_eq!(c.cqe.status, Status::INVALID_OPCODE, "opcode {op:#x}");
        assert!(c.cqe.dnr);
    }
    assert_eq!(
        h.identify(0x10, 0).cqe.status,
        Status::INVALID_FIELD,
        "unknown CNS"
    );
    assert_eq!(
        h.identify(3, 9).cqe.status,
        Status::INVALID_NAMESPACE,
        "descriptors of no namespace"
    );
    assert_eq!(
        h.identify(0, u32::MAX).cqe.status,
        Status::INVALID_NAMESPACE
    );
    let zero = h.identify(0, 9);
    assert!(
        zero.cqe.status.is_success() && zero.data.iter().all(|&b| b == 0),
        "inactive NSID reads zero"
    );
    let short = done(h.admin(cmd(0x06, 4, 0, 512, [1, 0, 0, 0, 0, 0])));
    assert_eq!(short.cqe.status, Status::DATA_SGL_LENGTH_INVALID);
    assert_eq!(
        status(h.admin(cmd(0x02, 8, 0, 4, [0x42, 0, 0, 0, 0, 0]))),
        Status::INVALID_LOG_PAGE
    );
    assert_eq!(
        status(h.admin(cmd(0x02, 8, 0, 4, [0x02, 0, 2, 0, 0, 0]))),
        Status::INVALID_FIELD,
        "offset not dword aligned"
    );
    assert_eq!(
        status(h.admin(cmd(0x09, 9, 0, 0, [0x07 | 1 << 31, 0, 0, 0, 0, 0]))),
        Status::FEATURE_NOT_SAVEABLE
    );
    assert_eq!(
        status(h.admin(cmd(0x09, 9, 0, 0, [0x0b, 1 << 31, 0, 0, 0, 0]))),
        Status::INVALID_FIELD,
        "unsupported AEC bit"
    );
    assert_eq!(
        status(h.admin(cmd(0x09, 9, 0, 0, [0x07, 0xffff, 0, 0, 0, 0]))),
        Status::INVALID_FIELD
    );
    assert_eq!(
        status(h.admin(cmd(0x0a, 9, 0, 0, [0x42, 0, 0, 0, 0, 0]))),
        Status::INVALID_FIELD
    );
    // Abort completes, aborting nothing.
    let a = done(h.admin(cmd(0x08, 10, 0, 0, [1 << 16, 0, 0, 0, 0, 0])));
    assert_eq!((a.cqe.status, a.cqe.dw0 & 1), (Status::SUCCESS, 1));
}

#[test]
fn rejects_property_access_that_is_not_allowed() {
    let mut h = Host::connect(Target::new(config()).unwrap(), 0);
    assert_eq!(
        h.prop_get(Property::Cap, false).cqe.status,
        Status::INVALID_FIELD,
        "CAP is 8 bytes"
    );
    assert_eq!(
        h.prop_get(Property::Cc, true).cqe.status,
        Status::INVALID_FIELD,
        "CC is 4 bytes"
    );
    assert_eq!(
        h.prop_get(Property::Other(0x40), false).cqe.status,
        Status::INVALID_FIELD
    );
    assert_eq!(
        h.prop_set(Property::Vs, 1).cqe.status,
        Status::INVALID_FIELD,
        "VS is read-only"
    );
    assert_eq!(
        h.prop_set(Property::Csts, 1).cqe.status,
        Status::INVALID_FIELD
    );
    // A CC.EN with 128-byte SQ entries fails the controller (CSTS.CFS), not ready.
    assert!(h
        .prop_set(Property::Cc, 7 << 16 | 4 << 20 | 1)
        .cqe
        .status
        .is_success());
    assert_eq!(h.prop_get(Property::Csts, false).cqe.dw0 & 0b11, 0b10);
}

#[test]
fn rejects_io_that_is_out_of_range_or_malformed() {
    let cfg = TargetConfig {
        max_transfer: 64 << 10,
        ..config()
    };
    let mut h = Host::connect(Target::new(cfg).unwrap(), 0);
    h.enable();
    let mut q = h.io_queue(1).unwrap();
    let s = |h: &mut Host, q: &mut Queue, c| h.run_io(q, c).cqe.status;
    assert_eq!(
        s(&mut h, &mut q, rw(0x02, 1, NS_BLOCKS - 1, 1)),
        Status::LBA_OUT_OF_RANGE
    );
    assert_eq!(
        s(&mut h, &mut q, rw(0x02, 1, u64::MAX, 0)),
        Status::LBA_OUT_OF_RANGE
    );
    let mut wrong = rw(0x02, 2, 0, 1);
    wrong.sqe.sgl = Sgl::Transport { length: BS };
    assert_eq!(
        s(&mut h, &mut q, wrong),
        Status::DATA_SGL_LENGTH_INVALID,
        "SGL shorter than NLB"
    );
    let mut short = write(3, 0, vec![1; 2 * BS as usize]);
    short.data.truncate(BS as usize);
    assert_eq!(
        s(&mut h, &mut q, short),
        Status::DATA_SGL_LENGTH_INVALID,
        "write data short of the SGL"
    );
    let mut other_ns = rw(0x02, 4, 0, 0);
    other_ns.sqe.nsid = 2;
    let c = h.run_io(&mut q, other_ns);
    assert_eq!((c.cqe.status, c.cqe.dnr), (Status::INVALID_NAMESPACE, true));
    assert_eq!(
        s(&mut h, &mut q, rw(0x02, 5, 0, 16)),
        Status::INVALID_FIELD,
        "beyond MDTS"
    );
    let mut fused = rw(0x05, 6, 0, 0);
    fused.sqe.flags |= 1;
    assert_eq!(
        s(&mut h, &mut q, fused),
        Status::INVALID_FIELD,
        "fused compare"
    );
    // A namespace without reservations (RESCAP 0) refuses their commands.
    assert_eq!(h.identify(0, 1).data[31], 0, "RESCAP");
    for op in [0x0du8, 0x0e, 0x11, 0x15] {
        let c = h.run_io(&mut q, cmd(op, 7, 1, 0, [0; 6]));
        assert_eq!(
            (c.cqe.status, c.cqe.dnr),
            (Status::INVALID_OPCODE, true),
            "reservation {op:#x}"
        );
    }
    assert_eq!(
        s(&mut h, &mut q, cmd(0x04, 8, 1, 0, [0; 6])),
        Status::INVALID_OPCODE,
        "Write Uncorrectable"
    );
    // Property Get is an admin queue command.
    let p = Command {
        sqe: fabrics(
            9,
            Sgl::Transport { length: 0 },
            FabricsKind::PropertyGet(PropertyGet {
                size8: true,
                property: Property::Cap,
            }),
        ),
        data: Bytes::new(),
    };
    assert_eq!(s(&mut h, &mut q, p), Status::INVALID_OPCODE);
    assert_eq!(
        status(q.submit(connect_cmd(1, 127, 0, SUBNQN, HOSTNQN, 1), h.now)),
        Status::COMMAND_SEQUENCE_ERROR
    );
    assert_eq!(q.outstanding(), 0);
}

#[test]
fn rejects_writes_to_a_read_only_namespace() {
    let mut cfg = config();
    cfg.subsystems[0].namespaces[0].read_only = true;
    let mut h = Host::connect(Target::new(cfg).unwrap(), 0);
    h.enable();
    assert_eq!(h.identify(0, 1).data[99], 1, "NSATTR write protected");
    let mut q = h.io_queue(1).unwrap();
    let c = h.run_io(&mut q, write(1, 0, vec![1; BS as usize]));
    assert_eq!(c.cqe.status, Status { sct: 0, sc: 0x20 });
    assert!(h.store[&1].iter().all(|&b| b == 0));
}

#[test]
fn compare_write_zeroes_and_deallocate_reach_the_store() {
    let mut h = Host::connect(Target::new(config()).unwrap(), 0);
    h.enable();
    let mut q = h.io_queue(1).unwrap();
    let data = vec![0x5au8; BS as usize];
    assert!(h
        .run_io(&mut q, write(1, 3, data.clone()))
        .cqe
        .status
        .is_success());
    assert!(h
        .run_io(&mut q, write(2, 9, data.clone()))
        .cqe
        .status
        .is_success());
    assert!(h
        .run_io(&mut q, write(3, 20, data.clone()))
        .cqe
        .status
        .is_success());
    let same = with_data(rw(0x05, 4, 3, 0), data.clone());
    assert!(h.run_io(&mut q, same).cqe.status.is_success());
    let mut other = data.clone();
    other[100] ^= 1;
    let differs = with_data(rw(0x05, 5, 3, 0), other);
    assert_eq!(
        h.run_io(&mut q, differs).cqe.status,
        Status::COMPARE_FAILURE
    );

    // Write Zeroes with DEAC on a namespace whose deallocated blocks read zero: a Discard.
    let wz = cmd(0x08, 6, 1, 0, [3, 0, 1 << 25, 0, 0, 0]);
    match q.submit(wz, h.now) {
        Submitted::Block(r) => {
            assert_eq!(r.len(), 1);
            assert_eq!(
                r[0].op,
                BlockOp::Discard {
                    offset: 3 * u64::from(BS),
                    len: u64::from(BS)
                }
            );
            let c = q.block_done(r[0].tag, Ok(Bytes::new())).unwrap();
            assert!(c.cqe.status.is_success());
        }
        other => panic!("{other:?}"),
    }
    let wz = cmd(0x08, 7, 1, 0, [3, 0, 0, 0, 0, 0]);
    assert!(h.run_io(&mut q, wz).cqe.status.is_success());
    assert!(h.store[&1][3 * BS as usize..4 * BS as usize]
        .iter()
        .all(|&b| b == 0));

    // Dataset Management, deallocate two ranges (and one of zero blocks): two Discards.
    let mut ranges = Vec::new();
    for (nlb, slba) in [(1u32, 9u64), (0, 100), (1, 20)] {
        ranges.extend_from_slice(&0u32.to_le_bytes());
        ranges.extend_from_slice(&nlb.to_le_bytes());
        ranges.extend_from_slice(&slba.to_le_bytes());
    }
    let dsm = with_data(cmd(0x09, 8, 1, 0, [2, 1 << 2, 0, 0, 0, 0]), ranges.clone());
    match q.submit(dsm.clone(), h.now) {
        Submitted::Block(r) => assert_eq!(r.len(), 2),
        other => panic!("{other:?}"),
    }
    // (those two are left outstanding; the same again through the store)
    assert_eq!(q.outstanding(), 2);
    assert!(h.run_io(&mut q, dsm).cqe.status.is_success());
    assert!(
        h.store[&1].iter().all(|&b| b == 0),
        "everything written was deallocated"
    );
    let mut bad = ranges;
    bad[8..16].copy_from_slice(&NS_BLOCKS.to_le_bytes());
    let dsm = with_data(cmd(0x09, 9, 1, 0, [2, 1 << 2, 0, 0, 0, 0]), bad);
    assert_eq!(h.run_io(&mut q, dsm).cqe.status, Status::LBA_OUT_OF_RANGE);
    // As Linux's host sends it: one range in a 4096-byte list (the rest zero).
    let mut page = vec![0u8; 4096];
    page[4..8].copy_from_slice(&2u32.to_le_bytes());
    page[8..16].copy_from_slice(&0u64.to_le_bytes());
    page[16 + 4..16 + 8].copy_from_slice(&1u32.to_le_bytes()); // beyond NR: not a range
    let linux = with_data(cmd(0x09, 11, 1, 0, [0, 1 << 2, 0, 0, 0, 0]), page);
    match q.submit(linux, h.now) {
        Submitted::Block(r) => {
            assert_eq!(r.len(), 1, "only NR + 1 ranges count");
            assert_eq!(
                r[0].op,
                BlockOp::Discard {
                    offset: 0,
                    len: 2 * u64::from(BS)
                }
            );
            assert!(q
                .block_done(r[0].tag, Ok(Bytes::new()))
                .unwrap()
                .cqe
                .status
                .is_success());
        }
        other => panic!("{other:?}"),
    }
    let short = with_data(cmd(0x09, 10, 1, 0, [2, 1 << 2, 0, 0, 0, 0]), vec![0; 32]);
    assert_eq!(
        h.run_io(&mut q, short).cqe.status,
        Status::DATA_SGL_LENGTH_INVALID
    );
}

#[test]
fn block_errors_map_to_nvme_statuses() {
    let mut h = Host::connect(Target::new(config()).unwrap(), 0);
    h.enable();
    let mut q = h.io_queue(1).unwrap();
    for (e, op, want) in [
        (BlockError::Media, 0x02u8, Status::UNRECOVERED_READ_ERROR),
        (BlockError::Media, 0x01, Status::WRITE_FAULT),
        (BlockError::NoSpace, 0x01, Status::CAPACITY_EXCEEDED),
        (BlockError::Internal, 0x02, Status::INTERNAL_ERROR),
    ] {
        h.fail_next = Some(e);
        let c = if op == 0x01 {
            write(1, 0, vec![1; BS as usize])
        } else {
            rw(op, 1, 0, 0)
        };
        assert_eq!(h.run_io(&mut q, c).cqe.status, want, "{e:?}");
    }
    assert_eq!(
        BlockError::from_io(&std::io::Error::from_raw_os_error(28)),
        BlockError::NoSpace
    );
    assert_eq!(
        BlockError::from_io(&std::io::Error::from_raw_os_error(5)),
        BlockError::Media
    );
    // An unknown tag is ignored.
    assert!(q.block_done(999, Ok(Bytes::new())).is_none());
}

#[test]
fn keep_alive_expiry_fails_the_controller_and_its_queues() {
    let mut h = Host::connect(Target::new(config()).unwrap(), 2000);
    h.enable();
    let mut q = h.io_queue(1).unwrap();
    let t0 = h.now;
    assert_eq!(h.t.poll_timeout(), Some(t0 + Duration::from_millis(2000)));
    h.now = t0 + Duration::from_millis(1500);
    assert!(status(h.admin(cmd(0x18, 3, 0, 0, [0; 6]))).is_success());
    assert_eq!(h.t.poll_timeout(), Some(t0 + Duration::from_millis(3500)));
    h.t.handle_timeout(t0 + Duration::from_millis(3499));
    assert!(
        h.t.poll_event().is_none(),
        "the Keep Alive pushed the deadline"
    );
    assert!(q.is_live());
    h.t.handle_timeout(t0 + Duration::from_millis(3500));
    match h.t.poll_event() {
        Some(Event::CloseController { cntlid, reason }) => {
            assert_eq!(cntlid, h.admin.cntlid());
            assert_eq!(reason, CloseReason::KeepAliveExpired);
        }
        other => panic!("{other:?}"),
    }
    assert!(!q.is_live() && !h.admin.is_live());
    assert_eq!(
        h.run_io(&mut q, rw(0x02, 4, 0, 0)).cqe.status,
        Status { sct: 0, sc: 0x08 }
    );
    assert!(h.t.controllers().is_empty());
    assert_eq!(h.t.poll_timeout(), None);
    // The host reconnects: a new controller.
    let c = connect_cmd(0, 31, 2000, SUBNQN, HOSTNQN, CNTLID_DYNAMIC);
    assert!(h.t.connect(&c, h.now).is_ok());
}

#[test]
fn reset_and_shutdown_close_the_io_queues() {
    let mut h = Host::connect(Target::new(config()).unwrap(), 0);
    h.enable();
    let mut q = h.io_queue(1).unwrap();
    let cc = 6 << 16 | 4 << 20;
    assert!(h.prop_set(Property::Cc, cc).cqe.status.is_success());
    assert!(matches!(
        h.t.poll_event(),
        Some(Event::CloseIoQueues { .. })
    ));
    assert_eq!(h.prop_get(Property::Csts, false).cqe.dw0 & 1, 0);
    assert!(!q.is_live());
    assert_eq!(
        h.run_io(&mut q, rw(0x02, 4, 0, 0)).cqe.status,
        Status { sct: 0, sc: 0x08 }
    );
    h.t.disconnect(&q);
    h.enable();
    let mut q = h.io_queue(1).unwrap();
    assert!(h.run_io(&mut q, rw(0x02, 5, 0, 0)).cqe.status.is_success());
    // Normal shutdown: SHST = complete.
    assert!(h
        .prop_set(Property::Cc, cc | 1 | 1 << 14)
        .cqe
        .status
        .is_success());
    assert_eq!(h.prop_get(Property::Csts, false).cqe.dw0 & 0b1101, 0b1000);
    assert!(!q.is_live());
    // Losing the admin queue ends the controller.
    h.t.disconnect(&h.admin);
    while let Some(e) = h.t.poll_event() {
        if let Event::CloseController { reason, .. } = e {
            assert_eq!(reason, CloseReason::AdminQueueGone);
        }
    }
    assert!(h.t.controllers().is_empty());
}

#[test]
fn namespace_change_completes_an_aer_and_fills_the_changed_list() {
    let mut h = Host::connect(Target::new(config()).unwrap(), 0);
    h.enable();
    assert!(status(h.admin(cmd(0x09, 2, 0, 0, [0x0b, 1 << 8, 0, 0, 0, 0]))).is_success());
    let aec = done(h.admin(cmd(0x0a, 2, 0, 0, [0x0b, 0, 0, 0, 0, 0])));
    assert_eq!(aec.cqe.dw0, 1 << 8);
    for cid in 10..14 {
        assert!(matches!(
            h.admin(cmd(0x0c, cid, 0, 0, [0; 6])),
            Submitted::Held
        ));
    }
    assert_eq!(
        status(h.admin(cmd(0x0c, 14, 0, 0, [0; 6]))),
        Status::ASYNC_EVENT_LIMIT_EXCEEDED
    );
    h.t.set_namespaces(SUBNQN, vec![ns(1), ns(5)]).unwrap();
    match h.t.poll_event() {
        Some(Event::AdminCompletion { completion, .. }) => {
            assert_eq!(completion.cqe.cid, 10);
            assert_eq!(completion.cqe.dw0, 0x04_00_02);
        }
        other => panic!("{other:?}"),
    }
    // Masked until the log page is read.
    h.t.set_namespaces(SUBNQN, vec![ns(5)]).unwrap();
    assert!(h.t.poll_event().is_none());
    let log = done(h.admin(cmd(0x02, 20, 0, 4096, [0x04 | 1023 << 16, 0, 0, 0, 0, 0])));
    assert_eq!(
        (le32(&log.data, 0), le32(&log.data, 4), le32(&log.data, 8)),
        (1, 5, 0)
    );
    let list = h.identify(2, 0);
    assert_eq!((le32(&list.data, 0), le32(&list.data, 4)), (5, 0));
    // An I/O queue sees the new table.
    let mut q = h.io_queue(1).unwrap();
    h.store
        .insert(5, vec![0; (NS_BLOCKS * u64::from(BS)) as usize]);
    let mut r = rw(0x02, 21, 0, 0);
    r.sqe.nsid = 5;
    assert!(h.run_io(&mut q, r).cqe.status.is_success());
    h.t.set_namespaces(SUBNQN, vec![ns(1)]).unwrap();
    let mut r = rw(0x02, 22, 0, 0);
    r.sqe.nsid = 5;
    assert_eq!(
        h.run_io(&mut q, r).cqe.status,
        Status::INVALID_NAMESPACE,
        "removed namespace"
    );
    assert!(
        matches!(h.t.poll_event(), Some(Event::AdminCompletion { .. })),
        "unmasked after the read"
    );
}

fn auth_cmd(send: bool, cid: u16, payload: &[u8]) -> Command {
    let a = Auth {
        secp: SECP_NVME_AUTH,
        spsp0: SPSP_DHCHAP,
        spsp1: SPSP_DHCHAP,
        len: payload.len().max(64) as u32,
    };
    if send {
        Command {
            sqe: fabrics(
                cid,
                Sgl::InCapsule {
                    offset: 0,
                    length: payload.len() as u32,
                },
                FabricsKind::AuthSend(Auth {
                    len: payload.len() as u32,
                    ..a
                }),
            ),
            data: Bytes::copy_from_slice(payload),
        }
    } else {
        Command {
            sqe: fabrics(
                cid,
                Sgl::Transport { length: a.len },
                FabricsKind::AuthReceive(a),
            ),
            data: Bytes::new(),
        }
    }
}

#[test]
fn rejects_everything_but_authentication_until_the_host_authenticates() {
    let mut t = dhchap_target(None);
    // A host without a configured secret is refused when the subsystem requires it.
    let other = connect_cmd(0, 31, 0, SUBNQN, "nqn.unknown-host", CNTLID_DYNAMIC);
    assert_eq!(
        refused(&mut t, &other).cqe.status,
        Status::CONNECT_INVALID_HOST
    );
    let now = Instant::now();
    let (mut admin, r) = t
        .connect(&connect_cmd(0, 31, 0, SUBNQN, HOSTNQN, CNTLID_DYNAMIC), now)
        .unwrap();
    assert_ne!(r.cqe.dw0 & 1 << 17, 0, "AUTHREQ.ATR");
    assert!(admin.auth_pending());
    let get = |t: &mut Target, admin: &mut Queue| {
        let sqe = fabrics(
            5,
            Sgl::Transport { length: 0 },
            FabricsKind::PropertyGet(PropertyGet {
                size8: true,
                property: Property::Cap,
            }),
        );
        done(t.submit(
            admin,
            Command {
                sqe,
                data: Bytes::new(),
            },
            now,
        ))
        .cqe
        .status
    };
    assert_eq!(get(&mut t, &mut admin), Status::AUTHENTICATION_REQUIRED);
    let id = cmd(0x06, 6, 0, 4096, [1, 0, 0, 0, 0, 0]);
    assert_eq!(
        status(t.submit(&mut admin, id, now)),
        Status::AUTHENTICATION_REQUIRED
    );
    let ka = cmd(0x18, 6, 0, 0, [0; 6]);
    assert_eq!(
        status(t.submit(&mut admin, ka, now)),
        Status::AUTHENTICATION_REQUIRED
    );
    // Not the DH-HMAC-CHAP security protocol.
    let mut bad = auth_cmd(true, 7, b"negotiate");
    bad.sqe.cdw[0] = 0xea << 24 | 1 << 16 | 1 << 8;
    assert_eq!(
        status(t.submit(&mut admin, bad, now)),
        Status::INVALID_FIELD
    );
    // A transfer length that is not the data's.
    let mut bad = auth_cmd(true, 8, b"negotiate");
    bad.data.truncate(4);
    assert_eq!(
        status(t.submit(&mut admin, bad, now)),
        Status::DATA_SGL_LENGTH_INVALID
    );
    assert!(admin.auth_pending());
    // The right host gets through after its transaction.
    let mut host = HostAuth::new(Arc::new(dhchap_config(0x42, None)), HOSTNQN, SUBNQN, 9);
    assert!(run_dhchap(&mut t, &mut admin, &mut host, now));
    assert_eq!(get(&mut t, &mut admin), Status::SUCCESS);
}

#[test]
fn rejects_impossible_configurations() {
    let mut cfg = config();
    cfg.subsystems[0].namespaces[0].block_size = 1000;
    assert!(Target::new(cfg).is_err());
    let mut cfg = config();
    cfg.subsystems[1].nqn = SUBNQN.into();
    assert!(Target::new(cfg).is_err(), "NQN twice");
    let mut cfg = config();
    cfg.subsystems[0].nqn = DISCOVERY_NQN.into();
    assert!(
        Target::new(cfg).is_err(),
        "the discovery NQN as a subsystem"
    );
    let mut cfg = config();
    cfg.subsystems[0].namespaces.push(ns(1));
    assert!(Target::new(cfg).is_err(), "NSID twice");
}

fn dhchap_config(host_key: u8, ctrl_key: Option<u8>) -> AuthConfig {
    let secret = |b: u8| DhchapSecret::from_key(&[b; 32], None).unwrap();
    AuthConfig {
        hashes: vec![HashId::Sha256],
        dh_groups: vec![DhGroup::Ffdhe2048],
        ..AuthConfig::new(secret(host_key), ctrl_key.map(secret))
    }
}

/// Runs a DH-HMAC-CHAP transaction as Linux's host does (Negotiate, Challenge, Reply,
/// Success1, Success2) on `q`; whether the host saw it succeed.
fn run_dhchap(t: &mut Target, q: &mut Queue, host: &mut HostAuth, now: Instant) -> bool {
    let send = |t: &mut Target, q: &mut Queue, b: &[u8]| {
        assert!(status(t.submit(q, auth_cmd(true, 30, b), now)).is_success());
    };
    let neg = host.start();
    send(t, q, &neg);
    loop {
        let mut rx = auth_cmd(false, 31, b"");
        rx.sqe = fabrics(
            31,
            Sgl::Transport {
                length: RECEIVE_ALLOC_LEN,
            },
            FabricsKind::AuthReceive(Auth {
                secp: SECP_NVME_AUTH,
                spsp0: SPSP_DHCHAP,
                spsp1: SPSP_DHCHAP,
                len: RECEIVE_ALLOC_LEN,
            }),
        );
        let msg = done(t.submit(q, rx, now));
        assert!(msg.cqe.status.is_success());
        match host.receive(&msg.data) {
            HostStep::SendThenReceive(b) => send(t, q, &b),
            HostStep::SendThenDone(b) => {
                send(t, q, &b);
                return true;
            }
            HostStep::Done => return true,
            HostStep::SendFailure(b, _) => {
                send(t, q, &b);
                return false;
            }
            HostStep::Failed(_) => return false,
        }
    }
}

fn dhchap_target(ctrl_key: Option<u8>) -> Target {
    let mut hosts = DhchapHosts::new();
    hosts.insert(HOSTNQN, dhchap_config(0x42, ctrl_key));
    let mut cfg = config();
    cfg.subsystems[0].auth_required = true;
    cfg.auth = Some(Arc::new(hosts));
    Target::new(cfg).unwrap()
}

#[test]
fn accepts_dh_hmac_chap_bidirectional_on_admin_and_io_queues() {
    let mut h = Host::connect(dhchap_target(Some(0x24)), 0);
    assert!(h.admin.auth_pending());
    assert_eq!(
        h.prop_get(Property::Cap, true).cqe.status,
        Status::AUTHENTICATION_REQUIRED
    );
    let config = Arc::new(dhchap_config(0x42, Some(0x24)));
    let mut host = HostAuth::new(Arc::clone(&config), HOSTNQN, SUBNQN, 1);
    assert!(run_dhchap(&mut h.t, &mut h.admin, &mut host, h.now));
    assert!(matches!(
        host.state(),
        AuthState::Succeeded {
            bidirectional: true,
            ..
        }
    ));
    assert!(!h.admin.auth_pending());
    h.enable();
    let c = connect_cmd(1, 127, 0, SUBNQN, HOSTNQN, h.admin.cntlid());
    let (mut q, r) = h.t.connect(&c, h.now).unwrap();
    assert_ne!(r.cqe.dw0 & 1 << 17, 0, "each queue authenticates");
    assert_eq!(
        h.run_io(&mut q, rw(0x02, 1, 0, 0)).cqe.status,
        Status::AUTHENTICATION_REQUIRED
    );
    let mut host = HostAuth::new(config, HOSTNQN, SUBNQN, 2);
    assert!(run_dhchap(&mut h.t, &mut q, &mut host, h.now));
    assert!(h.run_io(&mut q, rw(0x02, 2, 0, 0)).cqe.status.is_success());
}

#[test]
fn rejects_a_host_with_the_wrong_dh_hmac_chap_secret() {
    let mut h = Host::connect(dhchap_target(None), 0);
    let wrong = Arc::new(dhchap_config(0x43, None));
    let mut host = HostAuth::new(wrong, HOSTNQN, SUBNQN, 1);
    assert!(!run_dhchap(&mut h.t, &mut h.admin, &mut host, h.now));
    assert!(matches!(host.state(), AuthState::Failed(_)));
    assert!(h.admin.auth_pending());
    assert_eq!(
        h.prop_get(Property::Cap, true).cqe.status,
        Status::AUTHENTICATION_REQUIRED
    );
    assert_eq!(h.identify(1, 0).cqe.status, Status::AUTHENTICATION_REQUIRED);
}

#[test]
fn accepts_connect_with_sq_flow_control_disabled() {
    let mut t = Target::new(config()).unwrap();
    let mut c = connect_cmd(0, 31, 0, SUBNQN, HOSTNQN, CNTLID_DYNAMIC);
    c.sqe.cdw[1] |= 1 << 18; // CATTR bit 2
    let (q, r) = t.connect(&c, Instant::now()).unwrap();
    assert!(q.sq_flow_disabled());
    assert_eq!(r.cqe.sqhd, 0xffff);
}

#[test]
fn rejects_io_from_a_queue_that_joins_an_authenticated_controller_without_the_secret() {
    // The victim authenticates its admin queue and enables the controller.
    let mut h = Host::connect(dhchap_target(None), 0);
    let good = Arc::new(dhchap_config(0x42, None));
    let mut host = HostAuth::new(Arc::clone(&good), HOSTNQN, SUBNQN, 1);
    assert!(run_dhchap(&mut h.t, &mut h.admin, &mut host, h.now));
    h.enable();
    // An attacker who learned the CNTLID, host NQN and Host ID joins an I/O queue: Connect
    // works (every queue authenticates on its own), but nothing else does.
    let cntlid = h.admin.cntlid();
    let c = connect_cmd(2, 127, 0, SUBNQN, HOSTNQN, cntlid);
    let (mut evil, r) = h.t.connect(&c, h.now).unwrap();
    assert_ne!(r.cqe.dw0 & 1 << 17, 0, "ATR on the attacker's queue too");
    let mut steal = HostAuth::new(Arc::new(dhchap_config(0x66, None)), HOSTNQN, SUBNQN, 2);
    assert!(!run_dhchap(&mut h.t, &mut evil, &mut steal, h.now));
    for c in [
        rw(0x02, 1, 0, 0),
        write(2, 0, vec![0xee; BS as usize]),
        cmd(0x00, 3, 1, 0, [0; 6]),
    ] {
        assert_eq!(
            status(evil.submit(c, h.now)),
            Status::AUTHENTICATION_REQUIRED,
            "no block request from an unauthenticated queue"
        );
    }
    assert_eq!(evil.outstanding(), 0);
    assert!(h.store[&1].iter().all(|&b| b == 0), "nothing written");
    // The victim's own queue, authenticated, works.
    let c = connect_cmd(1, 127, 0, SUBNQN, HOSTNQN, cntlid);
    let (mut q, _) = h.t.connect(&c, h.now).unwrap();
    let mut host = HostAuth::new(good, HOSTNQN, SUBNQN, 3);
    assert!(run_dhchap(&mut h.t, &mut q, &mut host, h.now));
    assert!(h
        .run_io(&mut q, write(4, 0, vec![1; BS as usize]))
        .cqe
        .status
        .is_success());
}

#[test]
fn rejects_commands_after_a_failed_reauthentication() {
    let mut h = Host::connect(dhchap_target(None), 0);
    let mut host = HostAuth::new(Arc::new(dhchap_config(0x42, None)), HOSTNQN, SUBNQN, 1);
    assert!(run_dhchap(&mut h.t, &mut h.admin, &mut host, h.now));
    assert!(h.prop_get(Property::Cap, true).cqe.status.is_success());
    // A re-authentication with another secret (TP 8006 allows one at any time) fails ...
    let mut other = HostAuth::new(Arc::new(dhchap_config(0x43, None)), HOSTNQN, SUBNQN, 2);
    assert!(!run_dhchap(&mut h.t, &mut h.admin, &mut other, h.now));
    // ... and the queue is no longer authenticated.
    assert!(h.admin.auth_pending());
    assert_eq!(
        h.prop_get(Property::Cap, true).cqe.status,
        Status::AUTHENTICATION_REQUIRED
    );
}

fn tls(hostnqn: &str, subnqn: &str) -> Channel {
    Channel {
        tls: Some(TlsPeer {
            hostnqn: hostnqn.into(),
            subnqn: subnqn.into(),
        }),
    }
}

#[test]
fn accepts_a_tls_connect_whose_psk_identity_names_its_nqns() {
    let mut t = Target::new(TargetConfig {
        require_tls: true,
        ..config()
    })
    .unwrap();
    let now = Instant::now();
    let c = connect_cmd(0, 31, 0, SUBNQN, HOSTNQN, CNTLID_DYNAMIC);
    let (admin, r) = t.connect_on(&c, now, &tls(HOSTNQN, SUBNQN)).unwrap();
    assert!(r.cqe.status.is_success());
    assert_eq!(admin.hostnqn(), HOSTNQN);
}

#[test]
fn rejects_a_tls_connect_that_claims_another_host_or_subsystem_than_its_psk() {
    let mut t = Target::new(config()).unwrap();
    let now = Instant::now();
    // A host keyed for itself claims another host's NQN in Connect.
    let c = connect_cmd(0, 31, 0, SUBNQN, "nqn.victim", CNTLID_DYNAMIC);
    let r = t.connect_on(&c, now, &tls(HOSTNQN, SUBNQN)).unwrap_err();
    assert_eq!(
        (r.cqe.status, r.cqe.dw0),
        (Status::CONNECT_INVALID_HOST, 1 << 16 | 512)
    );
    // A key for one subsystem used to reach another.
    let other = "nqn.2026-01.io.ipsan:private";
    let c = connect_cmd(0, 31, 0, other, HOSTNQN, CNTLID_DYNAMIC);
    let r = t.connect_on(&c, now, &tls(HOSTNQN, SUBNQN)).unwrap_err();
    assert_eq!(
        (r.cqe.status, r.cqe.dw0),
        (Status::CONNECT_INVALID_HOST, 1 << 16 | 256)
    );
    // The same for an I/O queue of a controller made over TLS.
    let c = connect_cmd(0, 31, 0, SUBNQN, HOSTNQN, CNTLID_DYNAMIC);
    let (mut admin, _) = t.connect_on(&c, now, &tls(HOSTNQN, SUBNQN)).unwrap();
    let cc = 6 << 16 | 4 << 20 | 1;
    let sqe = fabrics(
        3,
        Sgl::Transport { length: 0 },
        FabricsKind::PropertySet(PropertySet {
            size8: false,
            property: Property::Cc,
            value: cc,
        }),
    );
    assert!(status(t.submit(
        &mut admin,
        Command {
            sqe,
            data: Bytes::new()
        },
        now
    ))
    .is_success());
    let io = connect_cmd(1, 127, 0, SUBNQN, HOSTNQN, admin.cntlid());
    let r = t
        .connect_on(&io, now, &tls("nqn.someone", SUBNQN))
        .unwrap_err();
    assert_eq!(r.cqe.status, Status::CONNECT_INVALID_HOST);
    assert!(t.connect_on(&io, now, &tls(HOSTNQN, SUBNQN)).is_ok());
}

#[test]
fn rejects_plain_tcp_connects_when_tls_is_required_but_to_discovery() {
    let mut t = Target::new(TargetConfig {
        require_tls: true,
        ..config()
    })
    .unwrap();
    let c = connect_cmd(0, 31, 0, SUBNQN, HOSTNQN, CNTLID_DYNAMIC);
    let r = refused(&mut t, &c);
    assert_eq!(
        (r.cqe.status, r.cqe.dw0),
        (Status::CONNECT_INVALID_HOST, 1 << 16 | 512)
    );
    let d = connect_cmd(0, 31, 0, DISCOVERY_NQN, HOSTNQN, CNTLID_DYNAMIC);
    assert!(
        t.connect(&d, Instant::now()).is_ok(),
        "discovery stays reachable"
    );
}

fn keys(a: u64, b: u64) -> Vec<u8> {
    let mut d = a.to_le_bytes().to_vec();
    d.extend_from_slice(&b.to_le_bytes());
    d
}

fn reservations_config() -> TargetConfig {
    let mut cfg = config();
    cfg.subsystems[0].namespaces[0].reservations = true;
    cfg
}

/// Reservation Register/Acquire/Release/Report (NVMe Base 2.0 §7.2-§7.5) leave the controller
/// decoded as requests for the namespace's reservation state (which the driver keeps, shared
/// with SCSI); what the state answers becomes the status; a report is cut to the host's length.
#[test]
fn accepts_reservation_commands_as_requests_for_the_namespace_state() {
    let mut h = Host::connect(Target::new(reservations_config()).unwrap(), 0);
    h.enable();
    let id = h.identify(1, 0);
    assert_eq!(
        u16::from_le_bytes([id.data[520], id.data[521]]) & 1 << 5,
        1 << 5,
        "ONCS reservations"
    );
    assert_eq!(h.identify(0, 1).data[31], 0xfe, "RESCAP: six types, IEKEY");
    assert_eq!(q_effects(&mut h, 0x11), 1, "Acquire in the effects log");
    let mut q = h.io_queue(1).unwrap();
    assert_eq!(q.hostid(), HOSTID);

    let reg = with_data(cmd(0x0d, 1, 1, 0, [0; 6]), keys(0, 0xab));
    assert!(h.run_io(&mut q, reg).cqe.status.is_success());
    assert_eq!(
        h.last_resv,
        Some(Reservation::Register {
            action: RegisterAction::Register,
            ignore_key: false,
            crkey: 0,
            nrkey: 0xab
        })
    );
    let acq = with_data(
        cmd(0x11, 2, 1, 0, [1 | 3 << 8, 0, 0, 0, 0, 0]),
        keys(0xab, 7),
    );
    assert!(h.run_io(&mut q, acq).cqe.status.is_success());
    assert_eq!(
        h.last_resv,
        Some(Reservation::Acquire {
            action: AcquireAction::Preempt,
            rtype: 3,
            crkey: 0xab,
            prkey: 7
        })
    );

    // What the state refuses: Reservation Conflict, Invalid Field.
    h.fail_next = Some(BlockError::ReservationConflict);
    let rel = with_data(
        cmd(0x15, 3, 1, 0, [1 << 8, 0, 0, 0, 0, 0]),
        0xabu64.to_le_bytes().to_vec(),
    );
    let c = h.run_io(&mut q, rel.clone());
    assert_eq!(c.cqe.status, Status::RESERVATION_CONFLICT);
    h.fail_next = Some(BlockError::InvalidField);
    assert_eq!(h.run_io(&mut q, rel).cqe.status, Status::INVALID_FIELD);
    // And the I/O the state keeps this host from.
    h.fail_next = Some(BlockError::ReservationConflict);
    let c = h.run_io(&mut q, write(4, 0, vec![1; BS as usize]));
    assert_eq!(c.cqe.status, Status::RESERVATION_CONFLICT);

    // Report, extended: the state's bytes, padded to NUMD; cut when shorter.
    let c = h.run_io(&mut q, cmd(0x0e, 5, 1, 4096, [1023, 1, 0, 0, 0, 0]));
    assert!(c.cqe.status.is_success());
    assert_eq!(c.data.len(), 4096);
    assert_eq!((c.data[4], c.data[5]), (1, 1), "RTYPE, REGCTL");
    assert_eq!(&c.data[80..96], &HOSTID);
    assert!(c.data[128..].iter().all(|&b| b == 0));
    let c = h.run_io(&mut q, cmd(0x0e, 6, 1, 8, [1, 1, 0, 0, 0, 0]));
    assert_eq!((c.cqe.status, c.data.len()), (Status::SUCCESS, 8));
    // Without the extended structure: Host Identifier Inconsistent Format.
    let c = h.run_io(&mut q, cmd(0x0e, 7, 1, 4096, [1023, 0, 0, 0, 0, 0]));
    assert_eq!(c.cqe.status, Status { sct: 0, sc: 0x18 });
    // Malformed: Register data short of 16 bytes, a type out of range, key 0.
    let c = h.run_io(&mut q, with_data(cmd(0x0d, 8, 1, 0, [0; 6]), vec![0; 8]));
    assert_eq!(c.cqe.status, Status::DATA_SGL_LENGTH_INVALID);
    let c = h.run_io(
        &mut q,
        with_data(cmd(0x11, 9, 1, 0, [9 << 8, 0, 0, 0, 0, 0]), keys(1, 0)),
    );
    assert_eq!(c.cqe.status, Status::INVALID_FIELD);
    let c = h.run_io(&mut q, with_data(cmd(0x0d, 10, 1, 0, [0; 6]), keys(0, 0)));
    assert_eq!(c.cqe.status, Status::INVALID_FIELD);
    assert_eq!(q.outstanding(), 0);
}

fn q_effects(h: &mut Host, io_op: u8) -> u32 {
    let c = done(h.admin(cmd(0x02, 30, 0, 4096, [0x05 | 1023 << 16, 0, 0, 0, 0, 0])));
    assert!(c.cqe.status.is_success());
    le32(&c.data, 1024 + usize::from(io_op) * 4)
}

/// Get Features Host Identifier (81h) returns the Connect's HOSTID and cannot be set on
/// fabrics; the Reservation Notification Mask (82h) is kept per namespace; Persist Through
/// Power Loss (83h) stays off; the Reservation Notification log page (80h) is the empty one
/// until a notification comes.
#[test]
fn accepts_host_identifier_and_reservation_features_as_linux_reads_them() {
    let mut h = Host::connect(Target::new(reservations_config()).unwrap(), 0);
    h.enable();
    let c = done(h.admin(cmd(0x0a, 1, 0, 16, [0x81, 1, 0, 0, 0, 0])));
    assert!(c.cqe.status.is_success());
    assert_eq!(&c.data[..], &HOSTID);
    let c = done(h.admin(cmd(0x0a, 2, 0, 16, [0x81, 0, 0, 0, 0, 0])));
    assert_eq!(
        c.cqe.status,
        Status::INVALID_FIELD,
        "64-bit host identifier"
    );
    let c = done(h.admin(cmd(0x09, 3, 0, 16, [0x81, 1, 0, 0, 0, 0])));
    assert_eq!(c.cqe.status, Status::COMMAND_SEQUENCE_ERROR);

    let set = |h: &mut Host, nsid: u32, fid: u32, v: u32| {
        done(h.admin(cmd(0x09, 4, nsid, 0, [fid, v, 0, 0, 0, 0])))
            .cqe
            .status
    };
    let get = |h: &mut Host, nsid: u32, fid: u32| {
        let c = done(h.admin(cmd(0x0a, 5, nsid, 0, [fid, 0, 0, 0, 0, 0])));
        (c.cqe.status, c.cqe.dw0)
    };
    assert_eq!(get(&mut h, 1, 0x82), (Status::SUCCESS, 0));
    assert_eq!(set(&mut h, 1, 0x82, 0x0a), Status::SUCCESS);
    assert_eq!(get(&mut h, 1, 0x82), (Status::SUCCESS, 0x0a));
    assert_eq!(set(&mut h, u32::MAX, 0x82, 0x04), Status::SUCCESS);
    assert_eq!(get(&mut h, 1, 0x82), (Status::SUCCESS, 0x04));
    assert_eq!(set(&mut h, 1, 0x82, 0x01), Status::INVALID_FIELD);
    assert_eq!(set(&mut h, 9, 0x82, 0x02), Status::INVALID_NAMESPACE);
    assert_eq!(get(&mut h, 9, 0x82).0, Status::INVALID_NAMESPACE);
    assert_eq!(get(&mut h, 1, 0x83), (Status::SUCCESS, 0));
    assert_eq!(set(&mut h, 1, 0x83, 0), Status::SUCCESS);
    assert_eq!(set(&mut h, 1, 0x83, 1), Status::INVALID_FIELD, "PTPL");

    let c = done(h.admin(cmd(0x02, 6, u32::MAX, 64, [0x80 | 15 << 16, 0, 0, 0, 0, 0])));
    assert!(c.cqe.status.is_success());
    assert_eq!(&c.data[..], &[0u8; 64][..]);
}

/// Reservation notifications (NVMe Base 2.0 §5.16.1.25, §8.19): a notice for a host becomes a
/// Reservation Notification log page on each of its controllers and completes a held
/// Asynchronous Event Request (type 6h, log page 80h); the page is read one notification at a
/// time; the Reservation Notification Mask (82h) masks a type; another host is not told.
#[test]
fn accepts_reservation_notices_as_log_pages_and_async_events() {
    use nvme_proto::controller::ReservationNotice;
    let mut h = Host::connect(Target::new(reservations_config()).unwrap(), 0);
    h.enable();
    let aer_dw0 = 6 | 0x80 << 16;
    let read_log = |h: &mut Host| {
        let c = done(h.admin(cmd(0x02, 6, u32::MAX, 64, [0x80 | 15 << 16, 0, 0, 0, 0, 0])));
        assert!(c.cqe.status.is_success());
        c.data
    };
    assert!(matches!(
        h.admin(cmd(0x0c, 40, 0, 0, [0; 6])),
        Submitted::Held
    ));
    // Another host's notice: nobody here.
    assert_eq!(
        h.t.reservation_notice(
            SUBNQN,
            HOSTNQN,
            &[0x22; 16],
            1,
            ReservationNotice::RegistrationPreempted
        ),
        0
    );
    assert!(h.t.poll_event().is_none());
    assert_eq!(
        h.t.reservation_notice(
            SUBNQN,
            HOSTNQN,
            &HOSTID,
            1,
            ReservationNotice::RegistrationPreempted
        ),
        1
    );
    match h.t.poll_event() {
        Some(Event::AdminCompletion { cntlid, completion }) => {
            assert_eq!(cntlid, h.admin.cntlid());
            assert_eq!(completion.cqe.cid, 40);
            assert_eq!(completion.cqe.dw0, aer_dw0, "I/O command specific, log 80h");
        }
        other => panic!("{other:?}"),
    }
    let page = read_log(&mut h);
    assert_eq!(le64(&page, 0), 1, "Log Page Count");
    assert_eq!(
        (page[8], page[9]),
        (1, 0),
        "Registration Preempted, none more"
    );
    assert_eq!(le32(&page, 12), 1, "NSID");
    assert_eq!(&read_log(&mut h)[..], &[0u8; 64][..], "read: gone");

    // Two before the host reads: one event (the second is masked until the page is read),
    // then the event again for the one still unread.
    for n in [
        ReservationNotice::ReservationReleased,
        ReservationNotice::ReservationPreempted,
    ] {
        assert_eq!(h.t.reservation_notice(SUBNQN, HOSTNQN, &HOSTID, 1, n), 1);
    }
    assert!(matches!(
        h.admin(cmd(0x0c, 41, 0, 0, [0; 6])),
        Submitted::Held
    ));
    assert!(matches!(
        h.t.poll_event(),
        Some(Event::AdminCompletion { completion, .. }) if completion.cqe.dw0 == aer_dw0
    ));
    assert!(matches!(
        h.admin(cmd(0x0c, 42, 0, 0, [0; 6])),
        Submitted::Held
    ));
    assert!(
        h.t.poll_event().is_none(),
        "one event until the page is read"
    );
    let page = read_log(&mut h);
    assert_eq!((le64(&page, 0), page[8], page[9]), (2, 2, 1));
    assert!(matches!(
        h.t.poll_event(),
        Some(Event::AdminCompletion { completion, .. })
            if completion.cqe.cid == 42 && completion.cqe.dw0 == aer_dw0
    ));
    let page = read_log(&mut h);
    assert_eq!((le64(&page, 0), page[8], page[9]), (3, 3, 0));

    // Masked (82h bit 1: Registration Preempted): no page, no event; others still come.
    let c = done(h.admin(cmd(0x09, 4, 1, 0, [0x82, 0x02, 0, 0, 0, 0])));
    assert!(c.cqe.status.is_success());
    assert!(matches!(
        h.admin(cmd(0x0c, 43, 0, 0, [0; 6])),
        Submitted::Held
    ));
    assert_eq!(
        h.t.reservation_notice(
            SUBNQN,
            HOSTNQN,
            &HOSTID,
            1,
            ReservationNotice::RegistrationPreempted
        ),
        0
    );
    assert!(h.t.poll_event().is_none());
    assert_eq!(&read_log(&mut h)[..], &[0u8; 64][..]);
    assert_eq!(
        h.t.reservation_notice(
            SUBNQN,
            HOSTNQN,
            &HOSTID,
            1,
            ReservationNotice::ReservationReleased
        ),
        1
    );
    assert!(h.t.poll_event().is_some());
    assert_eq!(le64(&read_log(&mut h), 0), 4, "the count goes on");
}

/// Subsystem B beside SUBNQN, open to every host (the host list does not hide it).
const SUB_B: &str = "nqn.2026-01.io.ipsan:b";

/// A target where HOSTNQN has secret 0x42 for SUBNQN and 0x4d for the discovery controller
/// only (none for SUB_B), and every subsystem and the discovery controller require
/// authentication.
fn keyed_target() -> Target {
    keyed_target_with(false)
}

fn keyed_target_with(open: bool) -> Target {
    let hosts = keyed_policy();
    let mut cfg = config();
    cfg.subsystems.push(SubsystemConfig {
        nqn: SUB_B.into(),
        ..subsystem(AllowedHosts::Any)
    });
    cfg.discovery.push(DiscoveryEntry {
        subnqn: SUB_B.into(),
        ..cfg.discovery[1].clone()
    });
    for s in &mut cfg.subsystems {
        s.auth_required = true;
    }
    cfg.discovery_auth_required = true;
    cfg.discovery_open = open;
    cfg.auth = Some(Arc::new(hosts));
    Target::new(cfg).unwrap()
}

/// The subsystem NQNs of a discovery log page.
fn log_nqns(page: &[u8]) -> Vec<String> {
    let n = le64(page, 8) as usize;
    (0..n)
        .filter_map(|i| page.get(1024 * (i + 1)..1024 * (i + 2)))
        .map(|e| {
            String::from_utf8_lossy(&e[256..512])
                .trim_end_matches('\0')
                .to_owned()
        })
        .collect()
}

#[test]
fn rejects_discovery_log_reads_until_the_host_authenticates() {
    let mut t = keyed_target();
    // No secret for the discovery controller: no controller at all.
    let unknown = connect_cmd(0, 31, 0, DISCOVERY_NQN, "nqn.unknown-host", CNTLID_DYNAMIC);
    let r = refused(&mut t, &unknown);
    assert_eq!(r.cqe.status, Status::CONNECT_INVALID_HOST);
    assert_eq!(r.cqe.dw0, 1 << 16 | 512, "IPO HOSTNQN");
    let mut h = Host::connect_to(t, 0, DISCOVERY_NQN);
    assert!(h.admin.is_discovery() && h.admin.auth_pending());
    let get_log =
        |h: &mut Host| done(h.admin(cmd(0x02, 5, 0, 4096, [0x70 | 1023 << 16, 0, 0, 0, 0, 0])));
    let r = get_log(&mut h);
    assert_eq!(r.cqe.status, Status::AUTHENTICATION_REQUIRED);
    assert!(r.data.is_empty(), "nothing of the log");
    assert_eq!(
        h.prop_set(Property::Cc, 1).cqe.status,
        Status::AUTHENTICATION_REQUIRED
    );
    // The host's secret for SUBNQN is not its discovery secret.
    let mut wrong = HostAuth::new(
        Arc::new(dhchap_config(0x42, None)),
        HOSTNQN,
        DISCOVERY_NQN,
        1,
    );
    assert!(!run_dhchap(&mut h.t, &mut h.admin, &mut wrong, h.now));
    assert_eq!(get_log(&mut h).cqe.status, Status::AUTHENTICATION_REQUIRED);
    // Its discovery secret: the log, without SUB_B, which it has no secret for.
    let mut right = HostAuth::new(
        Arc::new(dhchap_config(0x4d, None)),
        HOSTNQN,
        DISCOVERY_NQN,
        2,
    );
    assert!(run_dhchap(&mut h.t, &mut h.admin, &mut right, h.now));
    h.prop_set(Property::Cc, 1);
    let page = get_log(&mut h);
    assert!(page.cqe.status.is_success());
    let nqns = log_nqns(&page.data);
    assert!(nqns.iter().any(|n| n == SUBNQN), "{nqns:?}");
    assert!(!nqns.iter().any(|n| n == SUB_B), "{nqns:?}");
}

/// `[nvme] discovery_auth = false`, for hosts whose tools cannot authenticate to a discovery
/// controller (Debian 13's `nvme discover`): the discovery controller asks no host to
/// authenticate and serves its log at once, listing only the subsystems the claimed host NQN
/// has secrets for; the I/O controllers still ask for DH-HMAC-CHAP.
#[test]
fn accepts_discovery_without_authentication_when_it_is_open_and_still_guards_the_subsystems() {
    let mut h = Host::connect_to(keyed_target_with(true), 0, DISCOVERY_NQN);
    assert!(h.admin.is_discovery() && !h.admin.auth_pending());
    assert!(h.prop_set(Property::Cc, 1).cqe.status.is_success());
    let page = done(h.admin(cmd(0x02, 5, 0, 4096, [0x70 | 1023 << 16, 0, 0, 0, 0, 0])));
    assert!(page.cqe.status.is_success());
    let nqns = log_nqns(&page.data);
    assert!(nqns.iter().any(|n| n == SUBNQN), "{nqns:?}");
    assert!(!nqns.iter().any(|n| n == SUB_B), "{nqns:?}");
    // A host with no secret at all reads a log without the keyed subsystems.
    let unknown = connect_cmd(0, 31, 0, DISCOVERY_NQN, "nqn.unknown-host", CNTLID_DYNAMIC);
    let (_, r) = h.t.connect(&unknown, h.now).unwrap();
    assert!(r.cqe.status.is_success());
    assert_eq!(r.cqe.dw0 & 1 << 17, 0, "no AUTHREQ.ATR on open discovery");
    // The subsystem itself still asks for authentication.
    let sub = connect_cmd(0, 31, 0, SUBNQN, HOSTNQN, CNTLID_DYNAMIC);
    let (_, r) = h.t.connect(&sub, h.now).unwrap();
    assert_ne!(r.cqe.dw0 & 1 << 17, 0, "AUTHREQ.ATR");
    let none = connect_cmd(0, 31, 0, SUBNQN, "nqn.unknown-host", CNTLID_DYNAMIC);
    assert_eq!(
        refused(&mut h.t, &none).cqe.status,
        Status::CONNECT_INVALID_HOST
    );
}

#[test]
fn rejects_a_host_keyed_for_one_subsystem_on_another() {
    let mut t = keyed_target();
    // No secret for SUB_B: refused at Connect.
    let b = connect_cmd(0, 31, 0, SUB_B, HOSTNQN, CNTLID_DYNAMIC);
    let r = refused(&mut t, &b);
    assert_eq!(r.cqe.status, Status::CONNECT_INVALID_HOST);
    assert_eq!(r.cqe.dw0, 1 << 16 | 512, "IPO HOSTNQN");
    // A host keyed for every subsystem is asked to authenticate there.
    let g = connect_cmd(0, 31, 0, SUB_B, "nqn.every-subsystem-host", CNTLID_DYNAMIC);
    let (_, r) = t.connect(&g, Instant::now()).unwrap();
    assert_ne!(r.cqe.dw0 & 1 << 17, 0, "AUTHREQ.ATR");
    // On SUBNQN the discovery secret fails and the subsystem's own succeeds.
    let mut h = Host::connect(t, 0);
    let mut other = HostAuth::new(Arc::new(dhchap_config(0x4d, None)), HOSTNQN, SUBNQN, 1);
    assert!(!run_dhchap(&mut h.t, &mut h.admin, &mut other, h.now));
    assert!(h.admin.auth_pending());
    let mut own = HostAuth::new(Arc::new(dhchap_config(0x42, None)), HOSTNQN, SUBNQN, 2);
    assert!(run_dhchap(&mut h.t, &mut h.admin, &mut own, h.now));
    assert!(!h.admin.auth_pending());
}

#[test]
fn closes_the_controllers_whose_secrets_changed_live() {
    let mut h = Host::connect(keyed_target(), 0);
    let mut own = HostAuth::new(Arc::new(dhchap_config(0x42, None)), HOSTNQN, SUBNQN, 1);
    assert!(run_dhchap(&mut h.t, &mut h.admin, &mut own, h.now));
    let g = connect_cmd(0, 31, 0, SUBNQN, "nqn.every-subsystem-host", CNTLID_DYNAMIC);
    let (g_admin, _) = h.t.connect(&g, h.now).unwrap();
    // HOSTNQN's secret for SUBNQN changes; the other host's does not.
    let mut hosts = DhchapHosts::new();
    hosts.insert_for(HOSTNQN, SUBNQN, dhchap_config(0x43, None));
    hosts.insert_for(HOSTNQN, DISCOVERY_NQN, dhchap_config(0x4d, None));
    hosts.insert("nqn.every-subsystem-host", dhchap_config(0x66, None));
    let old = keyed_policy();
    let stale = |s: &str, host: &str| !old.same_secrets(&hosts, s, host);
    assert!(stale(SUBNQN, HOSTNQN) && !stale(DISCOVERY_NQN, HOSTNQN));
    assert!(!stale(SUBNQN, "nqn.every-subsystem-host"));
    let closed = h.t.set_auth(Some(Arc::new(hosts.clone())), true, &stale);
    assert_eq!(closed, vec![h.admin.cntlid()]);
    match h.t.poll_event() {
        Some(Event::CloseController { cntlid, reason }) => {
            assert_eq!(cntlid, h.admin.cntlid());
            assert_eq!(reason, CloseReason::SecretsChanged);
        }
        other => panic!("{other:?}"),
    }
    assert!(!h.admin.is_live() && g_admin.is_live());
    // The old secret no longer authenticates, the new one does.
    let c = connect_cmd(0, 31, 0, SUBNQN, HOSTNQN, CNTLID_DYNAMIC);
    let (mut q, _) = h.t.connect(&c, h.now).unwrap();
    let mut old_key = HostAuth::new(Arc::new(dhchap_config(0x42, None)), HOSTNQN, SUBNQN, 2);
    assert!(!run_dhchap(&mut h.t, &mut q, &mut old_key, h.now));
    let mut new_key = HostAuth::new(Arc::new(dhchap_config(0x43, None)), HOSTNQN, SUBNQN, 3);
    assert!(run_dhchap(&mut h.t, &mut q, &mut new_key, h.now));
    // Secrets taken away from every host: with authentication still required, every
    // controller goes.
    let none = DhchapHosts::new();
    let closed = h.t.set_auth(Some(Arc::new(none)), true, &|_, _| false);
    assert_eq!(closed.len(), 2, "{closed:?}");
}

fn keyed_policy() -> DhchapHosts {
    let mut hosts = DhchapHosts::new();
    hosts.insert_for(HOSTNQN, SUBNQN, dhchap_config(0x42, None));
    hosts.insert_for(HOSTNQN, DISCOVERY_NQN, dhchap_config(0x4d, None));
    hosts.insert("nqn.every-subsystem-host", dhchap_config(0x66, None));
    hosts
}

/// With TLS required and keys per subsystem (TP 8011: a PSK identity names its subsystem),
/// the discovery log a host reads over TLS lists only the subsystems it has a key for; the
/// others' handshakes would fail anyway, and their NQNs are not told.
#[test]
fn rejects_listing_subsystems_a_host_has_no_tls_key_for() {
    let key = nvme_proto::psk::ConfiguredPsk::parse(
        "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:",
    )
    .unwrap();
    let mut keys = nvme_proto::psk::PskStore::new();
    keys.insert(HOSTNQN, SUBNQN, key.clone());
    keys.insert(HOSTNQN, DISCOVERY_NQN, key);
    assert!(keys.has_key(HOSTNQN, SUBNQN) && !keys.has_key(HOSTNQN, SUB_B));
    let mut cfg = config();
    cfg.subsystems.push(SubsystemConfig {
        nqn: SUB_B.into(),
        ..subsystem(AllowedHosts::Any)
    });
    cfg.discovery.push(DiscoveryEntry {
        subnqn: SUB_B.into(),
        ..cfg.discovery[1].clone()
    });
    cfg.require_tls = true;
    cfg.tls_keys = Some(keys);
    let mut t = Target::new(cfg).unwrap();
    let now = Instant::now();
    let c = connect_cmd(0, 31, 0, DISCOVERY_NQN, HOSTNQN, CNTLID_DYNAMIC);
    let (admin, _) = t.connect_on(&c, now, &tls(HOSTNQN, DISCOVERY_NQN)).unwrap();
    let mut h = Host {
        t,
        now,
        admin,
        store: HashMap::new(),
        fail_next: None,
        last_resv: None,
    };
    h.prop_set(Property::Cc, 1);
    let page = done(h.admin(cmd(0x02, 5, 0, 4096, [0x70 | 1023 << 16, 0, 0, 0, 0, 0])));
    assert!(page.cqe.status.is_success());
    let nqns = log_nqns(&page.data);
    assert!(nqns.iter().any(|n| n == SUBNQN), "{nqns:?}");
    assert!(!nqns.iter().any(|n| n == SUB_B), "{nqns:?}");
}
