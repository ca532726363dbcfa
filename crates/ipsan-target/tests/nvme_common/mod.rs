//! A minimal NVMe/TCP host written with `nvme-wire` (the codec the target itself uses for
//! nothing but framing): ICReq, Fabrics Connect, Property Set CC.EN, Read and Write with
//! in-capsule data or R2T/H2CData, and raw PDUs for the hostile tests. Every wait is bounded.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ipsan_target::config::{self, Config, TargetConfig};
use ipsan_target::ServerHandle;
use nvme_wire::entry::{Cqe, Sgl, Sqe, Status, PSDT_SGL};
use nvme_wire::fabrics::{
    Connect, ConnectData, FabricsCommand, FabricsKind, Property, PropertySet, CNTLID_DYNAMIC,
};
use nvme_wire::pdu::{CapsuleCmd, Codec, H2cData, IcReq, Pdu};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// A byte stream to the target: TCP, or TLS over it.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

pub const IQN: &str = "iqn.2026-11.org.ipsan:nvme-test";
pub const NQN: &str = "nqn.2026-11.org.ipsan:nvme-test";
pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d65-0000-4000-8000-000000000007";
pub const BS: usize = 512;

/// A target with one RAM LUN (`size`) served over iSCSI and NVMe/TCP on loopback port 0.
pub async fn start(size: &str) -> ServerHandle {
    start_with(size, None).await
}

/// [`start`] with the I/O queues' in-capsule data size set (`None`: the default).
pub async fn start_with(size: &str, in_capsule: Option<u32>) -> ServerHandle {
    let mut c = Config {
        portals: vec!["127.0.0.1:0".parse().unwrap()],
        targets: vec![TargetConfig::new(
            IQN,
            config::luns_from_specs(&[format!("mem:{size}")]).unwrap(),
        )],
        ..Config::default()
    };
    c.nvme.listen = vec!["127.0.0.1:0".parse().unwrap()];
    if let Some(n) = in_capsule {
        c.nvme.in_capsule_data = n;
    }
    c.validate().unwrap();
    let h = ServerHandle::start(&c).await.unwrap();
    assert_eq!(h.nvme_addrs.len(), 1);
    h
}

/// One NVMe/TCP connection from the host side.
pub struct Host {
    pub s: Box<dyn Io>,
    pub codec: Codec,
    buf: BytesMut,
    next_cid: u16,
    pub maxh2cdata: u32,
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

impl Host {
    /// A TCP connection without ICReq (for the hostile tests).
    pub async fn tcp(addr: SocketAddr) -> Self {
        Self::over(Box::new(TcpStream::connect(addr).await.unwrap()))
    }

    /// A host on `s` (TLS, say) before ICReq.
    pub fn over(s: Box<dyn Io>) -> Self {
        Self {
            s,
            codec: Codec::new(1 << 24),
            buf: BytesMut::new(),
            next_cid: 1,
            maxh2cdata: 4096,
        }
    }

    /// TCP + ICReq/ICResp with the given digests.
    pub async fn connect(addr: SocketAddr, hdgst: bool, ddgst: bool) -> Self {
        let mut h = Self::tcp(addr).await;
        h.ic(hdgst, ddgst).await;
        h
    }

    /// ICReq/ICResp with the given digests.
    pub async fn ic(&mut self, hdgst: bool, ddgst: bool) {
        let h = self;
        h.send(&Pdu::IcReq(IcReq {
            pfv: 0,
            hpda: 0,
            hdgst,
            ddgst,
            maxr2t: 0,
        }))
        .await;
        let Some(Pdu::IcResp(r)) = h.recv().await else {
            panic!("no ICResp")
        };
        assert_eq!((r.hdgst, r.ddgst), (hdgst, ddgst));
        h.codec.header_digest = r.hdgst;
        h.codec.data_digest = r.ddgst;
        h.codec.tx_pda = r.cpda;
        h.maxh2cdata = r.maxh2cdata;
    }

    pub async fn send_raw(&mut self, b: &[u8]) {
        self.s.write_all(b).await.unwrap();
    }

    pub async fn send(&mut self, pdu: &Pdu) {
        let b = self.codec.to_bytes(pdu).unwrap();
        self.send_raw(&b).await;
    }

    /// The next PDU, or `None` once the target closed the connection.
    pub async fn recv(&mut self) -> Option<Pdu> {
        loop {
            // A termination request carries no digests; decode it with what it is.
            if let Some(p) = self.codec.decode_from(&mut self.buf).unwrap() {
                return Some(p);
            }
            self.buf.reserve(64 * 1024);
            let n = tokio::time::timeout(Duration::from_secs(10), self.s.read_buf(&mut self.buf))
                .await
                .expect("the target answers within 10 s")
                .unwrap_or(0);
            if n == 0 {
                return None;
            }
        }
    }

    /// Reads until the target closes the connection; every PDU on the way.
    pub async fn until_closed(&mut self) -> Vec<Pdu> {
        let mut out = Vec::new();
        while let Some(p) = self.recv().await {
            out.push(p);
        }
        out
    }

    pub fn cid(&mut self) -> u16 {
        self.next_cid = self.next_cid.wrapping_add(1);
        self.next_cid
    }

    /// Fabrics Connect for `qid` with the Connect data in the capsule (KATO 30 s on the
    /// admin queue).
    pub async fn fabrics_connect(&mut self, qid: u16, cntlid: u16, subnqn: &str) -> Cqe {
        let kato = if qid == 0 { 30_000 } else { 0 };
        self.fabrics_connect_kato(qid, cntlid, subnqn, kato).await
    }

    /// Fabrics Connect with the given Keep Alive Timeout (ms).
    pub async fn fabrics_connect_kato(
        &mut self,
        qid: u16,
        cntlid: u16,
        subnqn: &str,
        kato: u32,
    ) -> Cqe {
        self.fabrics_connect_as(qid, cntlid, subnqn, HOSTNQN, kato)
            .await
    }

    /// Fabrics Connect naming `hostnqn`.
    pub async fn fabrics_connect_as(
        &mut self,
        qid: u16,
        cntlid: u16,
        subnqn: &str,
        hostnqn: &str,
        kato: u32,
    ) -> Cqe {
        let cid = self.cid();
        let sqe = FabricsCommand {
            cid,
            flags: PSDT_SGL,
            sgl: Sgl::InCapsule {
                offset: 0,
                length: 1024,
            },
            kind: FabricsKind::Connect(Connect {
                recfmt: 0,
                qid,
                sqsize: 31,
                cattr: 0,
                kato,
            }),
        }
        .to_sqe();
        let data = ConnectData {
            hostid: [7; 16],
            cntlid,
            subnqn: subnqn.into(),
            hostnqn: hostnqn.into(),
        }
        .encode()
        .unwrap();
        self.command(sqe, Bytes::copy_from_slice(&data)).await.0
    }

    /// Property Set CC: enabled, 64/16-byte I/O queue entries.
    pub async fn enable(&mut self) -> Cqe {
        let cid = self.cid();
        let sqe = FabricsCommand {
            cid,
            flags: PSDT_SGL,
            sgl: Sgl::Transport { length: 0 },
            kind: FabricsKind::PropertySet(PropertySet {
                size8: false,
                property: Property::Cc,
                value: 1 | 6 << 16 | 4 << 20,
            }),
        }
        .to_sqe();
        self.command(sqe, Bytes::new()).await.0
    }

    /// Sends `sqe` with `data` (in the capsule when it fits 8 KiB, else after the R2T) and
    /// collects the C2H data and the completion.
    pub async fn command(&mut self, mut sqe: Sqe, data: Bytes) -> (Cqe, Vec<u8>) {
        let cid = sqe.cid;
        if data.len() <= 8192 && !data.is_empty() {
            sqe.sgl = Sgl::InCapsule {
                offset: 0,
                length: data.len() as u32,
            };
            self.send(&Pdu::CapsuleCmd(CapsuleCmd { sqe, data })).await;
        } else if !data.is_empty() {
            sqe.sgl = Sgl::Transport {
                length: data.len() as u32,
            };
            self.send(&Pdu::CapsuleCmd(CapsuleCmd {
                sqe,
                data: Bytes::new(),
            }))
            .await;
            let Some(Pdu::R2t(r)) = self.recv().await else {
                panic!("no R2T")
            };
            assert_eq!((r.cccid, r.r2to, r.r2tl as usize), (cid, 0, data.len()));
            let chunk = self.maxh2cdata as usize;
            let mut off = 0;
            while off < data.len() {
                let end = (off + chunk).min(data.len());
                self.send(&Pdu::H2cData(H2cData {
                    cccid: cid,
                    ttag: r.ttag,
                    datao: off as u32,
                    last: end == data.len(),
                    data: data.slice(off..end),
                }))
                .await;
                off = end;
            }
        } else {
            self.send(&Pdu::CapsuleCmd(CapsuleCmd {
                sqe,
                data: Bytes::new(),
            }))
            .await;
        }
        let mut got = Vec::new();
        loop {
            match self.recv().await {
                Some(Pdu::C2hData(d)) => {
                    assert_eq!(d.cccid, cid);
                    assert_eq!(d.datao as usize, got.len(), "C2HData in order");
                    got.extend_from_slice(&d.data);
                    if d.success {
                        return (Cqe::new(cid, Status::SUCCESS), got);
                    }
                }
                Some(Pdu::CapsuleResp(r)) => {
                    assert_eq!(r.cqe.cid, cid);
                    return (r.cqe, got);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    pub async fn write(&mut self, nsid: u32, slba: u64, data: &[u8]) -> Cqe {
        let cid = self.cid();
        let mut sqe = Sqe::new(0x01, cid, Sgl::Transport { length: 0 });
        sqe.nsid = nsid;
        sqe.cdw[0] = slba as u32;
        sqe.cdw[1] = (slba >> 32) as u32;
        sqe.cdw[2] = (data.len() / BS - 1) as u32;
        self.command(sqe, Bytes::copy_from_slice(data)).await.0
    }

    pub async fn read(&mut self, nsid: u32, slba: u64, len: usize) -> (Cqe, Vec<u8>) {
        let cid = self.cid();
        let mut sqe = Sqe::new(0x02, cid, Sgl::Transport { length: len as u32 });
        sqe.nsid = nsid;
        sqe.cdw[0] = slba as u32;
        sqe.cdw[1] = (slba >> 32) as u32;
        sqe.cdw[2] = (len / BS - 1) as u32;
        self.command(sqe, Bytes::new()).await
    }
}

/// An admin queue (connected, CC.EN set) and one I/O queue of the same controller.
pub async fn controller(addr: SocketAddr, digests: bool) -> (Host, Host) {
    let mut admin = Host::connect(addr, digests, digests).await;
    let c = admin.fabrics_connect(0, CNTLID_DYNAMIC, NQN).await;
    assert_eq!(c.status, Status::SUCCESS, "admin Connect: {c:?}");
    let cntlid = (c.dw0 & 0xffff) as u16;
    let e = admin.enable().await;
    assert_eq!(e.status, Status::SUCCESS, "CC.EN: {e:?}");
    let mut io = Host::connect(addr, digests, digests).await;
    let c = io.fabrics_connect(1, cntlid, NQN).await;
    assert_eq!(c.status, Status::SUCCESS, "I/O Connect: {c:?}");
    (admin, io)
}
