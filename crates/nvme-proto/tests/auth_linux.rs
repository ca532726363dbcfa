//! This crate's [`HostAuth`] against Linux's own DH-HMAC-CHAP controller (nvmet, kernel 6.12
//! under QEMU): `tests/linux/auth-interop.sh` boots `tests/linux/nvmet-auth-serve.sh` in
//! `../shared/nvmevm` with one host entry per case below and runs this test, ignored
//! otherwise (it needs the VM):
//!
//! ```text
//! crates/nvme-proto/tests/linux/auth-interop.sh
//! ```
//!
//! Per case, a blocking TCP client built from `nvme-wire` only: ICReq, Connect on the admin
//! queue (Linux must answer AUTHREQ.ATR), an Identify Controller that must be refused with
//! "Authentication Required" (Linux answers Fabrics commands such as Property Get before
//! authentication, admin commands not), the DH-HMAC-CHAP transaction through Authentication
//! Send/Receive, then a Property Get of CAP and an Identify that must succeed. The negative
//! cases use a wrong host secret (Linux must send Failure1) or a wrong controller secret (this
//! host must refuse Linux's R2 and send Failure2).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use nvme_proto::auth::{
    AuthConfig, AuthFailure, AuthState, DhGroup, DhchapSecret, FailureReason, HashId, HostAuth,
    HostStep, RECEIVE_ALLOC_LEN,
};
use nvme_wire::entry::PSDT_SGL;
use nvme_wire::fabrics::{
    Auth, Connect, ConnectData, ConnectResponse, FabricsCommand, FabricsKind, Property,
    PropertyGet, PropertySet, CNTLID_DYNAMIC, SECP_NVME_AUTH, SPSP_DHCHAP,
};
use nvme_wire::pdu::{C2hData, CapsuleCmd, IcReq, PFV_1_0};
use nvme_wire::{Codec, Cqe, Pdu, Sgl, Sqe, Status};

/// Host NQNs of the guest script's host entries: this prefix and the case number.
const HOST_PREFIX: &str = "nqn.2026-11.org.example:ipsan-auth-host";

/// What a case expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Authenticated {
        bidirectional: bool,
    },
    /// Linux refuses the host (Failure1 "authentication failed").
    RefusedByLinux,
    /// This host refuses Linux's R2 (wrong controller secret) and sends Failure2.
    ControllerRefused,
}

/// (case, hash, group the guest configures, which keys the client uses, expectation). Must match
/// `tests/linux/nvmet-auth-serve.sh`.
fn cases() -> Vec<(u32, HashId, DhGroup, Keys, Expect)> {
    use DhGroup::*;
    use Expect::*;
    use HashId::*;
    vec![
        (
            1,
            Sha256,
            Null,
            Keys::Host,
            Authenticated {
                bidirectional: false,
            },
        ),
        (
            2,
            Sha256,
            Ffdhe2048,
            Keys::Both,
            Authenticated {
                bidirectional: true,
            },
        ),
        (
            3,
            Sha384,
            Ffdhe3072,
            Keys::Both,
            Authenticated {
                bidirectional: true,
            },
        ),
        (
            4,
            Sha512,
            Ffdhe4096,
            Keys::Host,
            Authenticated {
                bidirectional: false,
            },
        ),
        (
            5,
            Sha384,
            Ffdhe6144,
            Keys::Host,
            Authenticated {
                bidirectional: false,
            },
        ),
        (
            6,
            Sha512,
            Ffdhe8192,
            Keys::Both,
            Authenticated {
                bidirectional: true,
            },
        ),
        (7, Sha256, Ffdhe2048, Keys::WrongCtrl, ControllerRefused),
        (8, Sha256, Null, Keys::WrongHost, RefusedByLinux),
        (
            9,
            Sha256,
            Ffdhe2048,
            Keys::Untransformed,
            Authenticated {
                bidirectional: false,
            },
        ),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keys {
    Host,
    Both,
    WrongCtrl,
    WrongHost,
    Untransformed,
}

fn env(name: &str) -> String {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{name} is not set (see tests/linux/auth-interop.sh)"))
}

struct Conn {
    stream: TcpStream,
    codec: Codec,
    buf: BytesMut,
    cid: u16,
}

impl Conn {
    fn open(addr: &str) -> Self {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        stream
            .set_write_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let mut c = Self {
            stream,
            codec: Codec::new(1 << 20),
            buf: BytesMut::new(),
            cid: 0,
        };
        c.send(&Pdu::IcReq(IcReq {
            pfv: PFV_1_0,
            hpda: 0,
            hdgst: false,
            ddgst: false,
            maxr2t: 0,
        }));
        match c.recv() {
            Pdu::IcResp(r) => assert!(!r.hdgst && !r.ddgst, "{r:?}"),
            other => panic!("expected ICResp, got {other:?}"),
        }
        c
    }

    fn send(&mut self, pdu: &Pdu) {
        let b = self.codec.to_bytes(pdu).unwrap();
        self.stream.write_all(&b).unwrap();
    }

    fn recv(&mut self) -> Pdu {
        loop {
            if let Some(p) = self.codec.decode_from(&mut self.buf).unwrap() {
                return p;
            }
            let mut chunk = [0u8; 16384];
            let n = self.stream.read(&mut chunk).unwrap();
            assert!(n > 0, "the controller closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Sends a Fabrics command (with `data` in the capsule when not empty) and returns its
    /// completion and the C2H data it brought.
    fn fabrics(&mut self, kind: FabricsKind, data: &[u8], receive: u32) -> (Cqe, Bytes) {
        self.submit_fabrics(kind, data, receive);
        self.complete()
    }

    /// Sends a Fabrics command without waiting for its completion.
    fn submit_fabrics(&mut self, kind: FabricsKind, data: &[u8], receive: u32) {
        self.cid = self.cid.wrapping_add(1);
        let sgl = if receive > 0 {
            Sgl::Transport { length: receive }
        } else {
            Sgl::InCapsule {
                offset: 0,
                length: data.len() as u32,
            }
        };
        let cmd = FabricsCommand {
            cid: self.cid,
            flags: PSDT_SGL,
            sgl,
            kind,
        };
        self.send(&Pdu::CapsuleCmd(CapsuleCmd {
            sqe: cmd.to_sqe(),
            data: Bytes::copy_from_slice(data),
        }));
    }

    /// Identify Controller (CNS 01h, 4096 bytes): an admin command Linux runs only on an
    /// authenticated queue.
    fn identify_controller(&mut self) -> (Cqe, Bytes) {
        self.cid = self.cid.wrapping_add(1);
        let mut sqe = Sqe::new(0x06, self.cid, Sgl::Transport { length: 4096 });
        sqe.cdw[0] = 1;
        self.send(&Pdu::CapsuleCmd(CapsuleCmd {
            sqe,
            data: Bytes::new(),
        }));
        self.complete()
    }

    /// The completion of the last command and the C2H data it brought.
    fn complete(&mut self) -> (Cqe, Bytes) {
        let mut got = BytesMut::new();
        loop {
            match self.recv() {
                Pdu::C2hData(C2hData {
                    cccid,
                    datao,
                    success,
                    data,
                    ..
                }) => {
                    assert_eq!(cccid, self.cid);
                    assert_eq!(datao as usize, got.len());
                    got.extend_from_slice(&data);
                    if success {
                        return (Cqe::new(self.cid, Status::SUCCESS), got.freeze());
                    }
                }
                Pdu::CapsuleResp(r) => {
                    assert_eq!(r.cqe.cid, self.cid);
                    return (r.cqe, got.freeze());
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    fn auth(&mut self, send: Option<&[u8]>) -> Bytes {
        let (kind, data, receive) = match send {
            Some(d) => (FabricsKind::AuthSend(auth(d.len() as u32)), d, 0),
            None => (
                FabricsKind::AuthReceive(auth(RECEIVE_ALLOC_LEN)),
                &[][..],
                RECEIVE_ALLOC_LEN,
            ),
        };
        let (cqe, data) = self.fabrics(kind, data, receive);
        assert_eq!(cqe.status, Status::SUCCESS, "Authentication Send/Receive");
        data
    }

    /// Sets CC.EN (IOSQES 6, IOCQES 4) and waits for CSTS.RDY; false when Property Set is
    /// refused with Authentication Required.
    fn enable(&mut self) -> bool {
        let set = FabricsKind::PropertySet(PropertySet {
            size8: false,
            property: Property::Cc,
            value: 0x0046_0001,
        });
        let (cqe, _) = self.fabrics(set, &[], 0);
        if cqe.status == Status::AUTHENTICATION_REQUIRED {
            return false;
        }
        assert_eq!(cqe.status, Status::SUCCESS, "Property Set CC");
        for _ in 0..100 {
            let get = FabricsKind::PropertyGet(PropertyGet {
                size8: false,
                property: Property::Csts,
            });
            let (cqe, _) = self.fabrics(get, &[], 0);
            assert_eq!(cqe.status, Status::SUCCESS, "Property Get CSTS");
            if cqe.dw0 & 1 == 1 {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("CSTS.RDY did not become 1");
    }

    fn property_get_cap(&mut self) -> Cqe {
        let get = FabricsKind::PropertyGet(PropertyGet {
            size8: true,
            property: Property::Cap,
        });
        self.fabrics(get, &[], 0).0
    }
}

fn auth(len: u32) -> Auth {
    Auth {
        secp: SECP_NVME_AUTH,
        spsp0: SPSP_DHCHAP,
        spsp1: SPSP_DHCHAP,
        len,
    }
}

/// One case: returns the host's final state and whether CAP could be read afterwards.
fn run_case(
    addr: &str,
    subnqn: &str,
    hostnqn: &str,
    config: AuthConfig,
) -> (AuthState, Option<Cqe>) {
    let mut c = Conn::open(addr);
    let data = ConnectData {
        hostid: *b"ipsan-auth-test\0",
        cntlid: CNTLID_DYNAMIC,
        subnqn: subnqn.to_owned(),
        hostnqn: hostnqn.to_owned(),
    }
    .encode()
    .unwrap();
    let connect = FabricsKind::Connect(Connect {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato: 30_000,
    });
    let (cqe, _) = c.fabrics(connect, &data, 0);
    assert_eq!(cqe.status, Status::SUCCESS, "Connect");
    let resp = ConnectResponse::from_dw0(cqe.dw0);
    assert!(resp.atr, "Linux did not ask for authentication: {resp:?}");

    // Linux checks authentication for admin commands, not for Fabrics ones (Property Get/Set
    // are answered before authenticating), and checks CC.EN first: enable the controller,
    // then Identify is what shows the queue is not authenticated yet.
    let enabled_before = c.enable();
    if enabled_before {
        let (before, _) = c.identify_controller();
        assert_eq!(
            before.status,
            Status::AUTHENTICATION_REQUIRED,
            "Identify before authenticating"
        );
    }

    let mut host = HostAuth::new(Arc::new(config), hostnqn, subnqn, 1);
    let negotiate = host.start();
    c.auth(Some(&negotiate));
    let mut received = c.auth(None);
    loop {
        match host.receive(&received) {
            HostStep::SendThenReceive(b) => {
                c.auth(Some(&b));
                received = c.auth(None);
            }
            HostStep::SendThenDone(b) => {
                c.auth(Some(&b));
                break;
            }
            HostStep::SendFailure(b, _) => {
                // Linux ends the controller on a Failure2: do not wait for the completion.
                c.submit_fabrics(FabricsKind::AuthSend(auth(b.len() as u32)), &b, 0);
                return (host.state(), None);
            }
            HostStep::Done => break,
            HostStep::Failed(_) => return (host.state(), None),
        }
    }
    let cap = c.property_get_cap();
    if !enabled_before {
        assert!(c.enable(), "Property Set CC.EN after authenticating");
    }
    let (identify, data) = c.identify_controller();
    assert_eq!(
        identify.status,
        Status::SUCCESS,
        "Identify after authenticating"
    );
    assert_eq!(data.len(), 4096);
    (host.state(), Some(cap))
}

#[test]
#[ignore = "needs Linux's target in the nvmevm VM: tests/linux/auth-interop.sh"]
fn linux_target_accepts_this_host_and_this_host_checks_linux() {
    let addr = std::env::var("NVME_AUTH_LINUX_ADDR").unwrap_or_else(|_| "127.0.0.1:44420".into());
    let subnqn = env("NVME_AUTH_LINUX_SUBNQN");
    let host_key = DhchapSecret::parse(&env("NVME_AUTH_HOST_KEY")).unwrap();
    let host_key0 = DhchapSecret::parse(&env("NVME_AUTH_HOST_KEY0")).unwrap();
    let ctrl_key = DhchapSecret::parse(&env("NVME_AUTH_CTRL_KEY")).unwrap();
    let wrong = DhchapSecret::from_key(&[0x5a; 32], Some(HashId::Sha256)).unwrap();
    let mut failures = vec![];
    for (n, hash, group, keys, expect) in cases() {
        let hostnqn = format!("{HOST_PREFIX}{n}");
        let (host, ctrl) = match keys {
            Keys::Host => (host_key.clone(), None),
            Keys::Both => (host_key.clone(), Some(ctrl_key.clone())),
            Keys::WrongCtrl => (host_key.clone(), Some(wrong.clone())),
            Keys::WrongHost => (wrong.clone(), None),
            Keys::Untransformed => (host_key0.clone(), None),
        };
        let config = AuthConfig::new(host, ctrl);
        let started = std::time::Instant::now();
        let (state, cap) = run_case(&addr, &subnqn, &hostnqn, config);
        let ok = match expect {
            Expect::Authenticated { bidirectional } => {
                state
                    == AuthState::Succeeded {
                        hash,
                        dh_group: group,
                        bidirectional,
                    }
                    && cap.is_some_and(|c| c.status == Status::SUCCESS && c.dw0 != 0)
            }
            Expect::RefusedByLinux => {
                state
                    == AuthState::Failed(AuthFailure {
                        reason: FailureReason::Failed,
                        local: false,
                    })
            }
            Expect::ControllerRefused => {
                state
                    == AuthState::Failed(AuthFailure {
                        reason: FailureReason::Failed,
                        local: true,
                    })
            }
        };
        println!(
            "case {n}: {} {} {keys:?}: {state:?}, CAP {:?} ({} ms) -> {}",
            hash.name(),
            group.name(),
            cap.map(|c| (
                c.status,
                format!("{:#x}", u64::from(c.dw0) | u64::from(c.dw1) << 32)
            )),
            started.elapsed().as_millis(),
            if ok { "ok" } else { "FAIL" }
        );
        if !ok {
            failures.push(n);
        }
    }
    assert!(failures.is_empty(), "cases that failed: {failures:?}");
}
