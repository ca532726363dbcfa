//! This crate's [`ControllerAuth`] against Linux's own DH-HMAC-CHAP host (kernel 6.12 and
//! nvme-cli 2.13 in `../shared/nvmevm`): `tests/linux/auth-interop.sh` runs this test (ignored
//! otherwise) and boots `tests/linux/nvme-auth-connect.sh`, which runs `nvme connect` with
//! `--dhchap-secret` (and `--dhchap-ctrl-secret`) once per case below.
//!
//! The target here is the least that gets Linux's host to authenticate, built from `nvme-wire`
//! only (blocking sockets, one thread per connection): ICResp, Connect answered with
//! AUTHREQ.ATR, Authentication Send/Receive handed to a [`ControllerAuth`] per connection, and
//! every other command refused (Linux's host then gives up the connection, which is expected:
//! this proves the authentication, not a controller; the real target is `ipsan-target`'s). Each
//! case's host NQN selects the controller's secrets, hash and DH group.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use nvme_proto::auth::{
    check_command, AuthConfig, AuthFailure, AuthState, ControllerAuth, DhGroup, DhchapSecret,
    FailureReason, HashId,
};
use nvme_wire::fabrics::{ConnectData, ConnectResponse, FabricsCommand, FabricsKind};
use nvme_wire::pdu::{C2hData, CapsuleResp, IcResp, R2t, PFV_1_0};
use nvme_wire::{Codec, Cqe, Pdu, Sgl, Status};

const HOST_PREFIX: &str = "nqn.2026-11.org.example:ipsan-auth-linuxhost";

/// (case, hash and group the controller allows, which secrets the controller holds,
/// expected controller state). Must match `tests/linux/nvme-auth-connect.sh`, which gives
/// `--dhchap-ctrl-secret` in cases 2, 3, 5, 6 and 8.
fn cases(host: &DhchapSecret, host0: &DhchapSecret, ctrl: &DhchapSecret) -> Vec<Case> {
    use DhGroup::*;
    use HashId::*;
    let wrong = DhchapSecret::from_key(&[0x5a; 32], Some(HashId::Sha256)).unwrap();
    let ok = |bidirectional| Expect::Succeeded { bidirectional };
    vec![
        Case::new(1, Sha256, Null, host, None, ok(false)),
        Case::new(2, Sha256, Ffdhe2048, host, Some(ctrl), ok(true)),
        Case::new(3, Sha384, Ffdhe3072, host, Some(ctrl), ok(true)),
        Case::new(4, Sha512, Ffdhe4096, host, None, ok(false)),
        Case::new(5, Sha384, Ffdhe6144, host, Some(ctrl), ok(true)),
        Case::new(6, Sha512, Ffdhe8192, host, Some(ctrl), ok(true)),
        // The controller holds another host secret: it refuses Linux's host.
        Case::new(7, Sha256, Ffdhe2048, &wrong, None, Expect::Refused),
        // The controller holds another controller secret: Linux's host refuses it.
        Case::new(
            8,
            Sha256,
            Ffdhe2048,
            host,
            Some(&wrong),
            Expect::RefusedByHost,
        ),
        Case::new(9, Sha256, Ffdhe2048, host0, None, ok(false)),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Succeeded { bidirectional: bool },
    Refused,
    RefusedByHost,
}

struct Case {
    n: u32,
    hash: HashId,
    group: DhGroup,
    config: Arc<AuthConfig>,
    expect: Expect,
}

impl Case {
    fn new(
        n: u32,
        hash: HashId,
        group: DhGroup,
        host: &DhchapSecret,
        ctrl: Option<&DhchapSecret>,
        expect: Expect,
    ) -> Self {
        let mut config = AuthConfig::new(host.clone(), ctrl.cloned());
        config.hashes = vec![hash];
        config.dh_groups = vec![group];
        Self {
            n,
            hash,
            group,
            config: Arc::new(config),
            expect,
        }
    }
}

fn env(name: &str) -> String {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{name} is not set (see tests/linux/auth-interop.sh)"))
}

struct Conn {
    stream: TcpStream,
    codec: Codec,
    buf: BytesMut,
}

impl Conn {
    fn send(&mut self, pdu: &Pdu) -> std::io::Result<()> {
        let b = self.codec.to_bytes(pdu).unwrap();
        self.stream.write_all(&b)
    }

    fn recv(&mut self) -> Option<Pdu> {
        loop {
            if let Some(p) = self.codec.decode_from(&mut self.buf).unwrap() {
                return Some(p);
            }
            let mut chunk = [0u8; 16384];
            match self.stream.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    fn respond(&mut self, cid: u16, status: Status, dw0: u32) -> std::io::Result<()> {
        let mut cqe = Cqe::new(cid, status);
        cqe.dw0 = dw0;
        self.send(&Pdu::CapsuleResp(CapsuleResp { cqe }))
    }

    /// The host-to-controller data of a command: in the capsule, or solicited with one R2T.
    fn data(&mut self, cid: u16, sgl: Sgl, in_capsule: Bytes) -> Option<Bytes> {
        match sgl {
            Sgl::InCapsule { .. } => Some(in_capsule),
            Sgl::Transport { length } if length > 0 => {
                self.send(&Pdu::R2t(R2t {
                    cccid: cid,
                    ttag: 1,
                    r2to: 0,
                    r2tl: length,
                }))
                .ok()?;
                let mut got = BytesMut::new();
                while got.len() < length as usize {
                    match self.recv()? {
                        Pdu::H2cData(d) => got.extend_from_slice(&d.data),
                        _ => return None,
                    }
                }
                Some(got.freeze())
            }
            Sgl::Transport { .. } => Some(Bytes::new()),
            Sgl::Other(_) => None,
        }
    }
}

/// Serves one connection; returns the host NQN and the authentication's final state.
fn serve(
    stream: TcpStream,
    configs: &HashMap<String, Arc<AuthConfig>>,
    subnqn: &str,
) -> Option<(String, AuthState)> {
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .ok()?;
    let mut c = Conn {
        stream,
        codec: Codec::new(1 << 20),
        buf: BytesMut::new(),
    };
    let Pdu::IcReq(_) = c.recv()? else {
        return None;
    };
    c.send(&Pdu::IcResp(IcResp {
        pfv: PFV_1_0,
        cpda: 0,
        hdgst: false,
        ddgst: false,
        maxh2cdata: 131_072,
    }))
    .ok()?;
    let mut auth: Option<(String, ControllerAuth)> = None;
    loop {
        let Some(Pdu::CapsuleCmd(cmd)) = c.recv() else {
            break;
        };
        let cid = cmd.sqe.cid;
        let Ok(f) = FabricsCommand::decode(&cmd.sqe) else {
            // Admin commands: the point of this target is only the authentication.
            c.respond(cid, Status::INTERNAL_ERROR, 0).ok()?;
            continue;
        };
        match f.kind {
            FabricsKind::Connect(_) => {
                let data = c.data(cid, f.sgl, cmd.data)?;
                let Ok(d) = ConnectData::decode(&data) else {
                    c.respond(cid, Status::CONNECT_INVALID_PARAMETERS, 0).ok()?;
                    continue;
                };
                let Some(config) = configs.get(&d.hostnqn) else {
                    c.respond(cid, Status::CONNECT_INVALID_HOST, 0).ok()?;
                    continue;
                };
                assert_eq!(d.subnqn, subnqn);
                auth = Some((
                    d.hostnqn.clone(),
                    ControllerAuth::new(config.clone(), &d.hostnqn, &d.subnqn),
                ));
                let dw0 = ConnectResponse {
                    cntlid: 1,
                    atr: true,
                    ascr: false,
                }
                .dw0();
                c.respond(cid, Status::SUCCESS, dw0).ok()?;
            }
            FabricsKind::AuthSend(a) => {
                let data = c.data(cid, f.sgl, cmd.data)?;
                let (_, ctrl) = auth.as_mut()?;
                let status = match check_command(&a).and_then(|()| ctrl.auth_send(&data)) {
                    Ok(()) => Status::SUCCESS,
                    Err(e) => e.status(),
                };
                c.respond(cid, status, 0).ok()?;
            }
            FabricsKind::AuthReceive(a) => {
                let (_, ctrl) = auth.as_mut()?;
                match check_command(&a).and_then(|()| ctrl.auth_receive(a.len)) {
                    Ok(msg) => {
                        c.send(&Pdu::C2hData(C2hData {
                            cccid: cid,
                            datao: 0,
                            last: true,
                            success: false,
                            data: msg,
                        }))
                        .ok()?;
                        c.respond(cid, Status::SUCCESS, 0).ok()?;
                    }
                    Err(e) => c.respond(cid, e.status(), 0).ok()?,
                }
            }
            _ => c.respond(cid, Status::INTERNAL_ERROR, 0).ok()?,
        }
    }
    auth.map(|(h, a)| (h, a.state()))
}

#[test]
#[ignore = "needs Linux's host in the nvmevm VM: tests/linux/auth-interop.sh"]
fn linux_host_authenticates_to_this_controller_and_checks_it() {
    let host = DhchapSecret::parse(&env("NVME_AUTH_HOST_KEY")).unwrap();
    let host0 = DhchapSecret::parse(&env("NVME_AUTH_HOST_KEY0")).unwrap();
    let ctrl = DhchapSecret::parse(&env("NVME_AUTH_CTRL_KEY")).unwrap();
    let subnqn = env("NVME_AUTH_LINUX_SUBNQN");
    let listen = std::env::var("NVME_AUTH_LISTEN").unwrap_or_else(|_| "127.0.0.1:44421".into());
    let wait = Duration::from_secs(
        std::env::var("NVME_AUTH_WAIT_SECONDS").map_or(300, |s| s.parse().unwrap()),
    );
    let cases = cases(&host, &host0, &ctrl);
    let configs: Arc<HashMap<String, Arc<AuthConfig>>> = Arc::new(
        cases
            .iter()
            .map(|c| (format!("{HOST_PREFIX}{}", c.n), c.config.clone()))
            .collect(),
    );
    let listener = TcpListener::bind(&listen).unwrap();
    listener.set_nonblocking(true).unwrap();
    println!("listening on {listen}");
    let (tx, rx) = mpsc::channel();
    let deadline = Instant::now() + wait;
    let mut results: HashMap<String, AuthState> = HashMap::new();
    // Linux's host retries nothing here (nvme connect fails after the first refused admin
    // command): one connection per case.
    while results.len() < cases.len() && Instant::now() < deadline {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).unwrap();
                let (tx, configs, subnqn) = (tx.clone(), configs.clone(), subnqn.clone());
                std::thread::spawn(move || {
                    if let Some(r) = serve(stream, &configs, &subnqn) {
                        tx.send(r).unwrap();
                    }
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("accept: {e}"),
        }
        while let Ok((h, s)) = rx.try_recv() {
            results.insert(h, s);
        }
    }
    let mut failures = vec![];
    for c in &cases {
        let got = results.get(&format!("{HOST_PREFIX}{}", c.n)).copied();
        let ok = match (c.expect, got) {
            (Expect::Succeeded { bidirectional }, Some(s)) => {
                s == AuthState::Succeeded {
                    hash: c.hash,
                    dh_group: c.group,
                    bidirectional,
                }
            }
            (Expect::Refused, Some(s)) => {
                s == AuthState::Failed(AuthFailure {
                    reason: FailureReason::Failed,
                    local: true,
                })
            }
            (Expect::RefusedByHost, Some(s)) => {
                matches!(s, AuthState::Failed(AuthFailure { local: false, .. }))
            }
            (_, None) => false,
        };
        println!(
            "case {}: {} {} expect {:?}: {got:?} -> {}",
            c.n,
            c.hash.name(),
            c.group.name(),
            c.expect,
            if ok { "ok" } else { "FAIL" }
        );
        if !ok {
            failures.push(c.n);
        }
    }
    assert!(failures.is_empty(), "cases that failed: {failures:?}");
}
