//! Shared pieces of the robustness suites (issue 8): a target started from a TOML config on
//! 127.0.0.1:0, and a raw-PDU client that can say anything, including what no initiator should.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ipsan_target::{Config, ServerHandle};
use iscsi_wire::header::*;
use iscsi_wire::{Codec, Header, Pdu};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const IQN: &str = "iqn.2026-11.org.ipsan:robust";
pub const INITIATOR: &str = "iqn.2026-11.org.example:robust";

/// A config with one target (`IQN`) and one LUN per backend spec; `extra` is appended to the
/// `[[target]]` table (allow-lists, CHAP).
pub fn config(backends: &[&str], target_extra: &str) -> Config {
    let mut toml = format!("[server]\nportals = [\"127.0.0.1:0\"]\nnop_interval_secs = 0\n\n[[target]]\niqn = \"{IQN}\"\n{target_extra}\n");
    for (i, b) in backends.iter().enumerate() {
        toml.push_str(&format!("[[target.lun]]\nid = {i}\nbackend = \"{b}\"\n"));
    }
    Config::from_toml(&toml).unwrap_or_else(|e| panic!("{e}\n{toml}"))
}

pub async fn start(cfg: &Config) -> ServerHandle {
    ServerHandle::start(cfg).await.unwrap()
}

/// Runs `f` on a fresh 2-thread runtime, failing the test after `secs`.
pub fn bounded<F: std::future::Future<Output = ()>>(secs: u64, f: F) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(secs), f)
            .await
            .expect("test finished in time")
    });
    rt.shutdown_timeout(Duration::from_secs(5));
}

/// Resident set size of this process (the in-process target included), in KiB.
pub fn rss_kib() -> u64 {
    status_kib("VmRSS:")
}

/// Virtual size of this process, in KiB: catches buffers allocated but not yet touched.
pub fn vm_kib() -> u64 {
    status_kib("VmSize:")
}

fn status_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

pub struct Raw {
    pub s: TcpStream,
    pub buf: BytesMut,
    pub codec: Codec,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

/// What a login step answered.
#[derive(Debug)]
pub struct LoginAnswer {
    pub header: LoginResponse,
    pub keys: Vec<(String, String)>,
}

impl LoginAnswer {
    pub fn key(&self, k: &str) -> Option<&str> {
        self.keys
            .iter()
            .find(|(kk, _)| kk == k)
            .map(|(_, v)| v.as_str())
    }
    pub fn ok(&self) -> bool {
        self.header.status_class == 0
    }
}

impl Raw {
    pub async fn connect(addr: SocketAddr) -> Self {
        let s = TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        Self {
            s,
            buf: BytesMut::new(),
            codec: Codec::default(),
            cmd_sn: 1,
            exp_stat_sn: 0,
        }
    }

    pub async fn send(&mut self, pdu: &Pdu) {
        let mut out = BytesMut::new();
        self.codec.encode(pdu, &mut out).unwrap();
        self.s.write_all(&out).await.unwrap();
    }

    /// Sends, ignoring a dead connection (the target may have been killed).
    pub async fn send_maybe(&mut self, pdu: &Pdu) {
        let mut out = BytesMut::new();
        self.codec.encode(pdu, &mut out).unwrap();
        let _ = self.s.write_all(&out).await;
    }

    /// Encodes `pdu` and lets `tamper` change the wire bytes before sending.
    pub async fn send_tampered(&mut self, pdu: &Pdu, tamper: impl FnOnce(&mut BytesMut)) {
        let mut out = BytesMut::new();
        self.codec.encode(pdu, &mut out).unwrap();
        tamper(&mut out);
        self.s.write_all(&out).await.unwrap();
    }

    /// The next PDU, or None once the target closed the connection (10 s bound).
    pub async fn recv(&mut self) -> Option<Pdu> {
        self.recv_within(Duration::from_secs(10))
            .await
            .expect("target answered in time")
    }

    /// `Err(())` if nothing happened within `d`; `Ok(None)` on close.
    pub async fn recv_within(&mut self, d: Duration) -> Result<Option<Pdu>, ()> {
        let fut = async {
            loop {
                match self.codec.decode(&mut self.buf) {
                    Ok(Some(p)) => return Some(p),
                    Ok(None) => {}
                    Err(e) => panic!("target sent a malformed PDU: {e}"),
                }
                if self.s.read_buf(&mut self.buf).await.unwrap_or(0) == 0 {
                    return None;
                }
            }
        };
        let p = tokio::time::timeout(d, fut).await.map_err(|_| ())?;
        if let Some(p) = &p {
            if let Some(sn) = stat_sn(&p.header) {
                self.exp_stat_sn = sn.wrapping_add(1);
            }
        }
        Ok(p)
    }

    /// Whether the target closed the connection within `d` (reading and discarding PDUs).
    pub async fn closed_within(&mut self, d: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + d;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.recv_within(left).await {
                Ok(None) => return true,
                Ok(Some(_)) => continue,
                Err(()) => return false,
            }
        }
    }

    /// One login step with the given keys.
    pub async fn login_step(
        &mut self,
        isid: [u8; 6],
        csg: Stage,
        nsg: Stage,
        transit: bool,
        keys: &[(&str, &str)],
    ) -> Option<LoginAnswer> {
        self.login_on(isid, 0, 0, (csg, nsg, transit), keys).await
    }

    /// A login straight to full feature phase (no authentication) that names a session by its
    /// TSIH — a connection joining it on connection `cid` (RFC 7143 §5.3.4), or a new session
    /// with TSIH 0 — as `initiator`, with `extra` keys; the answer as it came, refusals too.
    pub async fn login_join(
        &mut self,
        initiator: &str,
        isid: [u8; 6],
        tsih: u16,
        cid: u16,
        extra: &[(&str, &str)],
    ) -> LoginAnswer {
        let mut keys = vec![
            ("InitiatorName", initiator),
            ("TargetName", IQN),
            ("SessionType", "Normal"),
        ];
        keys.extend_from_slice(extra);
        let stages = (
            Stage::LOGIN_OPERATIONAL_NEGOTIATION,
            Stage::FULL_FEATURE_PHASE,
            true,
        );
        self.login_on(isid, tsih, cid, stages, &keys)
            .await
            .expect("login response")
    }

    /// One Login Request on connection `cid` of session (`isid`, `tsih`), stages `(csg, nsg,
    /// transit)`; the Login Response and its keys.
    async fn login_on(
        &mut self,
        isid: [u8; 6],
        tsih: u16,
        cid: u16,
        (csg, nsg, transit): (Stage, Stage, bool),
        keys: &[(&str, &str)],
    ) -> Option<LoginAnswer> {
        let text = iscsi_wire::text::encode(keys);
        let req = LoginRequest {
            transit,
            continue_: false,
            csg,
            nsg,
            version_max: 0,
            version_min: 0,
            isid,
            tsih,
            itt: 1,
            cid,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        };
        self.send(&Pdu::new(req, text.freeze())).await;
        let p = self.recv().await?;
        let Header::LoginResponse(r) = p.header else {
            panic!("expected a Login Response, got {:?}", p.header)
        };
        let keys = iscsi_wire::text::parse(&p.data).unwrap();
        Some(LoginAnswer { header: r, keys })
    }

    /// Logs in straight to full feature phase (no authentication) with extra operational keys;
    /// switches this client's codec to the negotiated digests.
    pub async fn login_with(&mut self, isid: [u8; 6], extra: &[(&str, &str)]) -> LoginAnswer {
        let mut keys = vec![
            ("InitiatorName", INITIATOR),
            ("TargetName", IQN),
            ("SessionType", "Normal"),
            ("MaxRecvDataSegmentLength", "65536"),
        ];
        keys.extend_from_slice(extra);
        let a = self
            .login_step(
                isid,
                Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                Stage::FULL_FEATURE_PHASE,
                true,
                &keys,
            )
            .await
            .expect("login response");
        assert!(a.ok(), "login refused: {a:?}");
        self.codec.header_digest = a.key("HeaderDigest") == Some("CRC32C");
        self.codec.data_digest = a.key("DataDigest") == Some("CRC32C");
        self.codec.max_recv_data_segment_length = 65536;
        a
    }

    pub async fn login(&mut self, isid: [u8; 6]) -> LoginAnswer {
        self.login_with(isid, &[]).await
    }

    pub fn command(&mut self, itt: u32, cdb: [u8; 16], write: bool, edtl: u32) -> ScsiCommand {
        let c = ScsiCommand {
            immediate: false,
            final_: true,
            read: !write && edtl > 0,
            write,
            attr: TaskAttr::SIMPLE,
            lun: 0,
            itt,
            expected_data_transfer_length: edtl,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            cdb,
        };
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        c
    }

    pub async fn test_unit_ready(&mut self, itt: u32) -> Option<Pdu> {
        let cmd = self.command(itt, [0; 16], false, 0);
        self.send(&Pdu::new(cmd, Bytes::new())).await;
        self.recv().await
    }

    /// WRITE(16) of `data` at `lba` as immediate data, FUA if asked; the SCSI Response.
    pub async fn write16(&mut self, itt: u32, lba: u64, data: Bytes, fua: bool) -> Option<Pdu> {
        let cmd = self.command(
            itt,
            write16_cdb(lba, (data.len() / 512) as u32, fua),
            true,
            data.len() as u32,
        );
        self.send(&Pdu::new(cmd, data)).await;
        self.recv().await
    }

    /// READ(16) of `blocks` at `lba`; the gathered Data-In and the final status.
    pub async fn read16(&mut self, itt: u32, lba: u64, blocks: u32) -> (Vec<u8>, u8) {
        let cmd = self.command(itt, read16_cdb(lba, blocks), false, blocks * 512);
        self.send(&Pdu::new(cmd, Bytes::new())).await;
        let mut data = vec![0u8; blocks as usize * 512];
        loop {
            let p = self.recv().await.expect("read answered");
            match p.header {
                Header::DataIn(d) => {
                    let o = d.buffer_offset as usize;
                    data[o..o + p.data.len()].copy_from_slice(&p.data);
                    if d.status_present {
                        return (data, d.status);
                    }
                }
                Header::ScsiResponse(r) => return (data, r.status),
                h => panic!("unexpected {h:?}"),
            }
        }
    }
}

pub fn write16_cdb(lba: u64, blocks: u32, fua: bool) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x8a;
    if fua {
        c[1] = 0x08;
    }
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

pub fn read16_cdb(lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x88;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn stat_sn(h: &Header) -> Option<u32> {
    match h {
        Header::ScsiResponse(r) => Some(r.stat_sn),
        Header::LoginResponse(r) => Some(r.stat_sn),
        Header::NopIn(n) if n.itt != iscsi_wire::RESERVED_TAG => Some(n.stat_sn),
        Header::TextResponse(r) => Some(r.stat_sn),
        Header::Reject(r) => Some(r.stat_sn),
        Header::DataIn(d) if d.status_present => Some(d.stat_sn),
        _ => None,
    }
}

/// `(status, sense key, asc, ascq)` of a SCSI Response PDU.
pub fn scsi_status(p: &Pdu) -> Option<(u8, u8, u8, u8)> {
    let Header::ScsiResponse(r) = &p.header else {
        return None;
    };
    if p.data.len() >= 2 + 14 {
        let s = &p.data[2..];
        Some((r.status, s[2] & 0x0f, s[12], s[13]))
    } else {
        Some((r.status, 0, 0, 0))
    }
}

pub fn is_good(p: &Option<Pdu>, itt: u32) -> bool {
    matches!(p, Some(Pdu { header: Header::ScsiResponse(r), .. }) if r.itt == itt && r.status == 0 && r.response == 0)
}

pub fn reject_reason(p: &Option<Pdu>) -> Option<RejectReason> {
    match p {
        Some(Pdu {
            header: Header::Reject(r),
            ..
        }) => Some(r.reason),
        _ => None,
    }
}

/// Every tracing event and span of this test binary at `max` or more severe, as text: one line
/// each, `LEVEL: target=... field=value ...`. The first call installs the process-wide subscriber
/// (its level applies); later calls return the same log.
pub fn captured_log(max: tracing::Level) -> std::sync::Arc<std::sync::Mutex<String>> {
    use std::sync::{Arc, Mutex, OnceLock};
    static LOG: OnceLock<Arc<Mutex<String>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = Arc::new(Mutex::new(String::new()));
        tracing::subscriber::set_global_default(capture::Capture {
            log: log.clone(),
            next: std::sync::atomic::AtomicU64::new(1),
            max,
        })
        .unwrap();
        log
    })
    .clone()
}

mod capture {
    use std::fmt::Write as _;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use tracing::field::{Field, Visit};
    use tracing::level_filters::LevelFilter;
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Level, Metadata, Subscriber};

    pub struct Capture {
        pub log: Arc<Mutex<String>>,
        pub next: AtomicU64,
        pub max: Level,
    }

    struct Fields<'a>(&'a mut String);

    impl Visit for Fields<'_> {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            let _ = write!(self.0, " {}={:?}", field.name(), value);
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            let _ = write!(self.0, " {}={}", field.name(), value);
        }
    }

    impl Subscriber for Capture {
        fn enabled(&self, m: &Metadata<'_>) -> bool {
            *m.level() <= self.max
        }
        fn max_level_hint(&self) -> Option<LevelFilter> {
            Some(LevelFilter::from_level(self.max))
        }
        fn new_span(&self, span: &Attributes<'_>) -> Id {
            let mut s = self.log.lock().unwrap();
            let _ = write!(s, "span {}", span.metadata().name());
            span.record(&mut Fields(&mut s));
            s.push('\n');
            Id::from_u64(self.next.fetch_add(1, Ordering::Relaxed))
        }
        fn record(&self, _: &Id, values: &Record<'_>) {
            let mut s = self.log.lock().unwrap();
            values.record(&mut Fields(&mut s));
            s.push('\n');
        }
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let mut s = self.log.lock().unwrap();
            let m = event.metadata();
            let _ = write!(s, "{}: target={}", m.level(), m.target());
            event.record(&mut Fields(&mut s));
            s.push('\n');
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }
}
