//! The tokio session runtime: login, then any number of commands in flight up to the CmdSN
//! window (RFC 7143 §4.2.2.1), with immediate and unsolicited data, R2T answering with several
//! R2Ts outstanding (§11.8), Data-In reassembly (§11.7), NOP-Out keepalive (§11.18) and clean
//! failure of every command in flight when the connection goes away.
//!
//! # Shape
//! ```text
//!  callers ──submit──► [Sn lock: ITT, CmdSN, window] ──Pdu──► writer task ──► socket
//!                          │ register task (before the PDU is queued)
//!                          ▼
//!  socket ──► reader task: Data-In → copy into the task's buffer, R2T → Data-Out PDUs,
//!             SCSI Response → complete the task, NOP-In → answer / complete the ping,
//!             window updates (ExpCmdSN/MaxCmdSN) → wake blocked submitters
//! ```
//! Kamisaka et al. overlap round trips with forked processes each doing one synchronous
//! command; here any number of tasks share one session, each command tagged by its ITT, and
//! the target's MaxCmdSN is the only limit.
//!
//! Connection loss: whoever notices first (reader EOF, writer error, keepalive timeout) records
//! the reason once and aborts the I/O tasks; dropping the reader's task table drops every
//! completion sender, so every waiter gets [`Error::ConnectionLost`] with that reason.

use std::collections::{HashMap, VecDeque};
use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use iscsi_wire::header::{
    DataOut, LoginRequest, LogoutReason, LogoutRequest, NopOut, ScsiCommand, TaskAttr,
    TaskMgmtRequest, TextRequest, TmfFunction, TmfResponse,
};
use iscsi_wire::{Codec, Header, Pdu, BHS_LEN, RESERVED_TAG};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::task::AbortHandle;

use crate::conn::Conn;
use crate::error::{Error, Result};
use crate::login::{
    LoginMachine, LoginNext, LoginOptions, LoginReply, Negotiated, OriginatorExtension, SessionKind,
};
use crate::observe::{self, CommandEvent, CommandObserver, Observer};
use crate::scsi::{self, Capacity, Inquiry, ScsiStatus, Sense, SenseKey};
use crate::transform::{CommandInfo, PayloadTransform};
use crate::url::IscsiUrl;

/// Session settings beyond the negotiated keys.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub login: LoginOptions,
    pub connect_timeout: Duration,
    pub login_timeout: Duration,
    /// Send a NOP-Out when this long has passed since the last ping; `None` disables.
    pub nop_interval: Option<Duration>,
    /// A NOP-Out unanswered for this long fails the connection.
    pub nop_timeout: Duration,
    /// Makes a fresh login extension (e.g. Seal's key negotiation) for each login attempt.
    pub extension: Option<ExtensionFactory>,
    /// Socket settings for the connection (congestion control, buffers, Nagle), applied before
    /// connecting so the receive window scale fits (RFC 7323 §2.2). `None`: kernel defaults
    /// with TCP_NODELAY.
    pub tcp: Option<ipsan_tcp::TcpSettings>,
    /// A SCSI command without status after this long is aborted with ABORT TASK
    /// (RFC 7143 §11.5.1) and fails with [`Error::CommandTimedOut`]; if the target does not
    /// confirm the abort within [`TMF_TIMEOUT`] the connection is dropped (its tasks cannot be
    /// trusted any more). `None` waits forever (the keepalive still catches a dead
    /// connection). Default 30 s, the Linux SCSI disk default.
    pub command_timeout: Option<Duration>,
}

/// How long a task management request may go unanswered before the connection is dropped.
pub const TMF_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether an ABORT TASK response means the task is gone and nothing more comes for it
/// (RFC 7143 §11.6.1: done, or the target no longer knew it).
fn ends_the_task(r: TmfResponse) -> bool {
    matches!(
        r,
        TmfResponse::FUNCTION_COMPLETE | TmfResponse::TASK_DOES_NOT_EXIST
    )
}

/// Builds an [`OriginatorExtension`] per login attempt (a retried login needs fresh state).
#[derive(Clone)]
pub struct ExtensionFactory(pub Arc<dyn Fn() -> Box<dyn OriginatorExtension> + Send + Sync>);

impl std::fmt::Debug for ExtensionFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExtensionFactory")
    }
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            login: LoginOptions::default(),
            connect_timeout: Duration::from_secs(10),
            login_timeout: Duration::from_secs(15),
            nop_interval: Some(Duration::from_secs(5)),
            nop_timeout: Duration::from_secs(10),
            extension: None,
            tcp: None,
            command_timeout: Some(Duration::from_secs(30)),
        }
    }
}

use iscsi_proto::seq::{sn_le, sn_lt};

#[derive(Debug)]
struct Sn {
    next_itt: u32,
    cmd_sn: u32,
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
    exp_stat_sn: u32,
}

impl Sn {
    fn itt(&mut self) -> u32 {
        let itt = self.next_itt;
        self.next_itt = self.next_itt.wrapping_add(1);
        if self.next_itt == RESERVED_TAG {
            self.next_itt = 1;
        }
        itt
    }

    /// Window update from a response (RFC 7143 §4.2.2.1: ignore a MaxCmdSN below
    /// ExpCmdSN - 1, and never move either backwards).
    fn update(&mut self, exp_cmd_sn: u32, max_cmd_sn: u32) -> bool {
        if sn_lt(max_cmd_sn, exp_cmd_sn.wrapping_sub(1)) {
            return false;
        }
        let mut changed = false;
        if sn_lt(self.exp_cmd_sn, exp_cmd_sn) {
            self.exp_cmd_sn = exp_cmd_sn;
        }
        if sn_lt(self.max_cmd_sn, max_cmd_sn) {
            self.max_cmd_sn = max_cmd_sn;
            changed = true;
        }
        changed
    }

    fn stat(&mut self, stat_sn: u32) {
        let next = stat_sn.wrapping_add(1);
        if sn_lt(self.exp_stat_sn, next) {
            self.exp_stat_sn = next;
        }
    }
}

/// The result of a SCSI command that reached the target.
#[derive(Debug)]
pub struct Completion {
    pub status: u8,
    pub sense: Option<Sense>,
    /// Data-In, truncated by the residual count for an underflow.
    pub data: BytesMut,
    /// Residual count (positive: underflow, negative: overflow).
    pub residual: i64,
}

/// Direction and buffer of a command's data.
#[derive(Debug)]
pub enum DataDir {
    None,
    /// Expect this many bytes; the buffer is reused (resized, not reallocated when large enough).
    Read(BytesMut, usize),
    Write(Bytes),
}

struct TaskReg {
    lun: u64,
    write: Bytes,
    read: Option<BytesMut>,
    read_len: usize,
    received: usize,
    done: oneshot::Sender<Result<Completion>>,
}

enum Reg {
    Task(u32, TaskReg),
    Ping(u32, oneshot::Sender<()>),
    Logout(u32, oneshot::Sender<u8>),
    /// A task management request (ITT) and what it ends on success.
    Tmf(u32, Ends, oneshot::Sender<TmfResponse>),
}

/// The tasks a task management request ends when the target completes it.
#[derive(Clone, Copy, Debug)]
enum Ends {
    /// ABORT TASK: this ITT.
    Task(u32),
    /// LOGICAL UNIT RESET: every task on this LUN (raw LUN field).
    Lun(u64),
}

struct Shared {
    sn: Mutex<Sn>,
    window: Notify,
    dead: OnceLock<String>,
    /// Set when the connection died of a forged PDU: commands in flight fail with
    /// [`Error::SealForgery`].
    forged: OnceLock<ipsan_seal::Forgery>,
    out: mpsc::UnboundedSender<Pdu>,
    reg: mpsc::UnboundedSender<Reg>,
    params: Negotiated,
    io_tasks: Mutex<Vec<AbortHandle>>,
    /// Bytes of answers to the target's NOP-In pings queued but not yet handed to the socket
    /// (see [`MAX_QUEUED_PONG_BYTES`]).
    pong_bytes: AtomicUsize,
    /// When bytes last arrived from the target, in ms since `epoch`: the keepalive's evidence
    /// of life besides its own NOP-In answer (see [`keepalive`]).
    last_rx_ms: AtomicU64,
    epoch: Instant,
    /// Who watches each command's events, when asked for ([`Session::set_observer`]).
    observer: OnceLock<Observer>,
    /// AsyncEvent 1 received, and whether our Logout for it went out.
    logout: TargetLogout,
    /// See [`SessionConfig::command_timeout`].
    command_timeout: Option<Duration>,
}

/// The target's request to log out (RFC 7143 §11.9.1 AsyncEvent 1): new commands are refused
/// from then on, and once the commands in flight have completed the reader sends a Logout
/// (close the session). The caller opens a new session: a transparent reconnect would have to
/// replay commands whose data was sealed under the old keys, so it is left to the caller,
/// who sees [`Error::LogoutRequested`] for every command it issues after the request.
#[derive(Debug, Default)]
struct TargetLogout {
    asked: AtomicBool,
    sent: AtomicBool,
}

/// A target that pings (NOP-In with a TTT, RFC 7143 §11.19) faster than it reads the answers
/// would grow the send queue without bound (a 128 MiB flood grew RSS by 132 MiB before this
/// cap, `robust_hostile_target::nop_in_flood_from_a_target_that_never_reads_stays_bounded`).
/// Past this many queued bytes the connection fails instead. A polite target has one ping
/// outstanding at a time.
const MAX_QUEUED_PONG_BYTES: usize = 1024 * 1024;

impl Shared {
    /// Bytes just arrived from the target.
    fn mark_rx(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_rx_ms.store(ms, Ordering::Relaxed);
    }

    /// How long since bytes last arrived from the target (since login if none did).
    fn since_rx(&self) -> Duration {
        let now = self.epoch.elapsed();
        now.saturating_sub(Duration::from_millis(
            self.last_rx_ms.load(Ordering::Relaxed),
        ))
    }

    /// Record why the connection died (first reason wins) and stop the I/O tasks.
    fn kill(&self, reason: String) {
        let _ = self.dead.set(reason);
        self.window.notify_waiters();
        if let Ok(tasks) = self.io_tasks.lock() {
            for t in tasks.iter() {
                t.abort();
            }
        }
    }

    fn lost(&self) -> Error {
        if let Some(f) = self.forged.get() {
            return Error::SealForgery(f.clone());
        }
        Error::ConnectionLost(
            self.dead
                .get()
                .cloned()
                .unwrap_or_else(|| "connection closed".to_owned()),
        )
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Sn>> {
        self.sn
            .lock()
            .map_err(|_| Error::Protocol("session state poisoned".into()))
    }
}

/// A logged-in iSCSI session (one connection) in full feature phase.
pub struct Session {
    shared: Arc<Shared>,
    lun: u64,
    capacity: OnceLock<Capacity>,
    transform: Option<Arc<dyn PayloadTransform>>,
    /// A duplicate of the connection's socket, for reading TCP settings and TCP_INFO.
    socket: Option<std::os::fd::OwnedFd>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("lun", &self.lun)
            .field("params", &self.shared.params)
            .field("dead", &self.shared.dead.get())
            .finish_non_exhaustive()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.shared.kill("session dropped".to_owned());
    }
}

fn random_isid() -> [u8; 6] {
    use rand::RngCore;
    let mut isid = [0u8; 6];
    rand::rngs::OsRng.fill_bytes(&mut isid);
    // RFC 7143 §11.12.5: T=01b (EN format would need an enterprise number); we use the
    // "random" qualifier format T=10b.
    isid[0] = 0x80 | (isid[0] & 0x3f);
    isid
}

async fn connect_tcp(url: &IscsiUrl, cfg: &SessionConfig) -> Result<TcpStream> {
    let addr = url.socket_addr_string();
    let connect = async {
        let Some(tcp) = &cfg.tcp else {
            return TcpStream::connect(&addr).await;
        };
        let mut last = None;
        for sa in tokio::net::lookup_host(&addr).await? {
            let sock = if sa.is_ipv4() {
                tokio::net::TcpSocket::new_v4()?
            } else {
                tokio::net::TcpSocket::new_v6()?
            };
            // Buffers and the congestion control go on before the SYN.
            tcp.apply(&sock)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            match sock.connect(sa).await {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other(format!("{addr}: no address"))))
    };
    let stream = tokio::time::timeout(cfg.connect_timeout, connect)
        .await
        .map_err(|_| Error::Timeout("TCP connect"))??;
    if cfg.tcp.as_ref().and_then(|t| t.nodelay).is_none() {
        stream.set_nodelay(true)?;
    }
    Ok(stream)
}

/// Sequence state after login.
struct LoggedIn {
    params: Negotiated,
    /// Installed before the first command (Seal: every command's data is sealed).
    transform: Option<Arc<dyn PayloadTransform>>,
    /// Seal's record protection for every PDU of the connection (docs/seal.md §4a).
    record: Option<crate::login::RecordLayer>,
    cmd_sn: u32,
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
    exp_stat_sn: u32,
}

/// Run the login exchange on `conn` (RFC 7143 §6.3).
async fn login(
    conn: &mut Conn,
    opts: LoginOptions,
    kind: SessionKind,
    ext: Option<Box<dyn OriginatorExtension>>,
) -> Result<LoggedIn> {
    let isid = opts.isid.unwrap_or_else(random_isid);
    let itt = 0u32;
    let cmd_sn = 1u32;
    let mut exp_stat_sn = 0u32;
    let (mut machine, mut step) = LoginMachine::start(opts, kind);
    if let Some(ext) = ext {
        machine.set_extension(ext, isid);
    }
    // Every Login PDU, both ways: Seal binds the whole login (docs/seal.md §3).
    let mut transcript = ipsan_seal::LoginTranscript::new();
    let mut first = true;
    loop {
        let data = iscsi_wire::text::encode(&step.keys).freeze();
        let req = LoginRequest {
            transit: step.transit,
            continue_: false,
            csg: step.csg,
            nsg: if step.transit {
                step.nsg
            } else {
                iscsi_wire::header::Stage(0)
            },
            version_max: 0,
            version_min: 0,
            isid,
            tsih: 0,
            itt,
            cid: 0,
            cmd_sn,
            exp_stat_sn: if first { 0 } else { exp_stat_sn },
        };
        first = false;
        conn.send_login(req, data, &mut transcript).await?;
        // A response may be split over several PDUs with C=1 (RFC 7143 §6.3, §11.13.3).
        let mut text = BytesMut::new();
        let resp = loop {
            let pdu = conn.recv().await?;
            transcript.add_received(ipsan_seal::Direction::TargetToInitiator, &pdu);
            let Header::LoginResponse(r) = pdu.header else {
                return Err(Error::Protocol(format!(
                    "expected a Login Response, got {:?}",
                    pdu.header.opcode()
                )));
            };
            exp_stat_sn = r.stat_sn.wrapping_add(1);
            text.extend_from_slice(&pdu.data);
            if text.len() > 64 * 1024 {
                return Err(Error::Protocol("login text over 64 KiB".into()));
            }
            if !r.continue_ || r.status_class != 0 {
                break r;
            }
            let more = LoginRequest {
                transit: false,
                continue_: false,
                csg: step.csg,
                nsg: iscsi_wire::header::Stage(0),
                version_max: 0,
                version_min: 0,
                isid,
                tsih: 0,
                itt,
                cid: 0,
                cmd_sn,
                exp_stat_sn,
            };
            conn.send_login(more, Bytes::new(), &mut transcript).await?;
        };
        if let Some(e) = machine.extension_mut() {
            e.observe_transcript(&transcript);
        }
        let keys = iscsi_wire::text::parse(&text)?;
        for (k, v) in &keys {
            // CHAP_R/CHAP_C are not secrets, but there is no reason to put them in logs.
            let shown = if k.starts_with("CHAP_R") || k.starts_with("CHAP_C") {
                "…"
            } else {
                v
            };
            tracing::debug!(
                stage = resp.csg.0,
                transit = resp.transit,
                "login key {k}={shown}"
            );
        }
        let reply = LoginReply {
            transit: resp.transit,
            csg: resp.csg,
            nsg: resp.nsg,
            status_class: resp.status_class,
            status_detail: resp.status_detail,
            tsih: resp.tsih,
            keys,
        };
        match machine.handle(reply)? {
            LoginNext::Send(s) => step = s,
            LoginNext::Done(params) => {
                // Seal's record layer is keyed from the whole transcript, this final
                // response included (docs/seal.md §4a).
                let record = machine
                    .extension_mut()
                    .and_then(|e| e.record_layer())
                    .transpose()
                    .map_err(Error::Login)?;
                return Ok(LoggedIn {
                    params: Negotiated::from_login(&params),
                    record,
                    transform: machine.extension_mut().and_then(|e| e.transform()),
                    cmd_sn: resp.exp_cmd_sn,
                    exp_cmd_sn: resp.exp_cmd_sn,
                    max_cmd_sn: resp.max_cmd_sn,
                    exp_stat_sn,
                });
            }
        }
    }
}

/// Connect and log in, bounded by the login timeout.
///
/// CHAP fallback: tgtd 1.0.85 picks CHAP_A=7 (SHA-256) from our offer but then cannot decode a
/// 32-byte CHAP_R and fails the login with "initiator error". When a login that offered the
/// 32-byte algorithms fails that way, we retry once offering only SHA-1 and MD5. (CHAP in the
/// clear is open to an active attacker whatever the hash; this is no real downgrade.)
async fn connect_and_login(
    url: &IscsiUrl,
    cfg: &SessionConfig,
    kind: SessionKind,
) -> Result<(Conn, LoggedIn)> {
    let attempt = |opts: LoginOptions| {
        let kind = kind.clone();
        async move {
            let stream = connect_tcp(url, cfg).await?;
            let mut conn = Conn::new(stream);
            let ext = cfg.extension.as_ref().map(|f| (f.0)());
            let li = tokio::time::timeout(cfg.login_timeout, login(&mut conn, opts, kind, ext))
                .await
                .map_err(|_| Error::Timeout("login"))??;
            Ok::<_, Error>((conn, li))
        }
    };
    let opts = cfg.login.clone();
    let wide = opts
        .chap_algorithms
        .iter()
        .any(|a| a.digest_len().is_some_and(|l| l > 20));
    match attempt(opts.clone()).await {
        Err(Error::LoginRefused {
            class: 2,
            detail: 0,
            ..
        }) if opts.chap.is_some() && wide => {
            let mut narrow = opts;
            narrow
                .chap_algorithms
                .retain(|a| a.digest_len().is_some_and(|l| l <= 20));
            if narrow.chap_algorithms.is_empty() {
                narrow.chap_algorithms = vec![
                    iscsi_proto::chap::ChapAlgorithm::SHA1,
                    iscsi_proto::chap::ChapAlgorithm::MD5,
                ];
            }
            tracing::warn!("login with SHA-256-class CHAP refused; retrying with SHA-1/MD5");
            attempt(narrow).await
        }
        r => r,
    }
}

/// A target found by SendTargets discovery (RFC 7143 Appendix C).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DiscoveredTarget {
    pub name: String,
    /// `TargetAddress` values: `host:port,portal-group-tag`.
    pub addresses: Vec<String>,
}

/// Discovery results as pretty JSON (`[{"name": ..., "addresses": [...]}]`).
pub fn targets_json(t: &[DiscoveredTarget]) -> std::result::Result<String, serde_json::Error> {
    serde_json::to_string_pretty(t)
}

/// Log into a discovery session, ask `SendTargets=All`, log out.
pub async fn discover(url: &IscsiUrl, cfg: &SessionConfig) -> Result<Vec<DiscoveredTarget>> {
    let fut = async {
        let (mut conn, li) = connect_and_login(url, cfg, SessionKind::Discovery).await?;
        conn.codec.header_digest = li.params.header_digest;
        conn.codec.data_digest = li.params.data_digest;
        conn.codec.max_recv_data_segment_length = li.params.max_recv_data_segment_length;
        let mut exp_stat_sn = li.exp_stat_sn;
        let mut cmd_sn = li.cmd_sn;
        let itt = 1u32;
        let mut ttt = RESERVED_TAG;
        let mut data = iscsi_wire::text::encode(&[("SendTargets", "All")]).freeze();
        let mut text = BytesMut::new();
        loop {
            let req = TextRequest {
                immediate: false,
                final_: true,
                continue_: false,
                lun: 0,
                itt,
                ttt,
                cmd_sn,
                exp_stat_sn,
            };
            conn.send(req, std::mem::take(&mut data)).await?;
            let pdu = conn.recv().await?;
            let Header::TextResponse(r) = pdu.header else {
                return Err(Error::Protocol(format!(
                    "expected a Text Response, got {:?}",
                    pdu.header.opcode()
                )));
            };
            exp_stat_sn = r.stat_sn.wrapping_add(1);
            text.extend_from_slice(&pdu.data);
            if text.len() > 1024 * 1024 {
                return Err(Error::Protocol("SendTargets answer over 1 MiB".into()));
            }
            if r.final_ && !r.continue_ {
                break;
            }
            // Continue: empty Text Request echoing the target's TTT (RFC 7143 §11.10.4).
            ttt = r.ttt;
            cmd_sn = cmd_sn.wrapping_add(1);
        }
        cmd_sn = cmd_sn.wrapping_add(1);
        let mut out: Vec<DiscoveredTarget> = Vec::new();
        for (k, v) in iscsi_wire::text::parse(&text)? {
            match k.as_str() {
                "TargetName" => out.push(DiscoveredTarget {
                    name: v,
                    addresses: Vec::new(),
                }),
                "TargetAddress" => {
                    if let Some(t) = out.last_mut() {
                        t.addresses.push(v);
                    }
                }
                _ => {}
            }
        }
        let req = LogoutRequest {
            immediate: true,
            reason: LogoutReason::CLOSE_SESSION,
            itt: 2,
            cid: 0,
            cmd_sn,
            exp_stat_sn,
        };
        conn.send(req, Bytes::new()).await?;
        // Best effort: the answer to a discovery logout changes nothing for the caller.
        let _ = tokio::time::timeout(Duration::from_secs(2), conn.recv()).await;
        Ok(out)
    };
    tokio::time::timeout(cfg.login_timeout, fut)
        .await
        .map_err(|_| Error::Timeout("discovery"))?
}

impl Session {
    /// Connect, log in to the URL's target and LUN, and read its capacity (retrying the
    /// UNIT ATTENTION many targets report on a fresh nexus).
    pub async fn open(url: &IscsiUrl, cfg: &SessionConfig) -> Result<Self> {
        let s = Self::connect(url, cfg).await?;
        let mut last = None;
        for _ in 0..4 {
            match s.read_capacity().await {
                Ok(_) => return Ok(s),
                Err(e) if e.sense().is_some_and(|s| s.key == SenseKey::UNIT_ATTENTION) => {
                    last = Some(e)
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or(Error::Timeout("read capacity")))
    }

    /// Connect and log in, without touching the LUN.
    pub async fn connect(url: &IscsiUrl, cfg: &SessionConfig) -> Result<Self> {
        let target = url.require_target()?.to_owned();
        let lun = u64::from_be_bytes(scsi::encode_lun(u64::from(url.lun.unwrap_or(0))));
        let (conn, li) = connect_and_login(
            url,
            cfg,
            SessionKind::Normal {
                target_name: target,
            },
        )
        .await?;
        let params = li.params.clone();
        let codec = Codec {
            header_digest: params.header_digest,
            data_digest: params.data_digest,
            max_recv_data_segment_length: params.max_recv_data_segment_length,
        };
        let Conn { stream, rbuf, .. } = conn;
        let socket = {
            use std::os::fd::AsFd;
            stream.as_fd().try_clone_to_owned().ok()
        };
        let (rd, wr) = stream.into_split();
        let (out_tx, out_rx) = mpsc::unbounded_channel();
        let (reg_tx, reg_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            sn: Mutex::new(Sn {
                next_itt: 1,
                cmd_sn: li.cmd_sn,
                exp_cmd_sn: li.exp_cmd_sn,
                max_cmd_sn: li.max_cmd_sn,
                exp_stat_sn: li.exp_stat_sn,
            }),
            window: Notify::new(),
            dead: OnceLock::new(),
            forged: OnceLock::new(),
            out: out_tx,
            reg: reg_tx,
            params,
            io_tasks: Mutex::new(Vec::new()),
            pong_bytes: AtomicUsize::new(0),
            last_rx_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            observer: OnceLock::new(),
            logout: TargetLogout::default(),
            command_timeout: cfg.command_timeout,
        });
        let (sealer, opener) = li.record.map_or((None, None), |(s, o)| (Some(s), Some(o)));
        let w = tokio::spawn(writer(wr, codec.clone(), out_rx, shared.clone(), sealer));
        let r = tokio::spawn(reader(rd, rbuf, codec, reg_rx, shared.clone(), opener));
        let mut handles = vec![w.abort_handle(), r.abort_handle()];
        if let Some(interval) = cfg.nop_interval {
            let k = tokio::spawn(keepalive(shared.clone(), interval, cfg.nop_timeout));
            handles.push(k.abort_handle());
        }
        if let Ok(mut t) = shared.io_tasks.lock() {
            *t = handles;
        }
        Ok(Self {
            shared,
            lun,
            capacity: OnceLock::new(),
            transform: li.transform,
            socket,
        })
    }

    /// The parameters negotiated at login.
    pub fn params(&self) -> &Negotiated {
        &self.shared.params
    }

    /// Install a payload transform (Seal): from now on the data of every command goes through
    /// it (see [`crate::transform`]).
    pub fn set_transform(&mut self, t: Arc<dyn PayloadTransform>) {
        self.transform = Some(t);
    }

    /// Report every command's events from now on to `o` (see [`crate::observe`]; the
    /// benchmark's trace is one). A session has at most one observer; returns false if one was
    /// set already.
    pub fn set_observer(&self, o: Arc<dyn CommandObserver>) -> bool {
        self.shared.observer.set(o).is_ok()
    }

    /// The observer set with [`Session::set_observer`].
    pub fn observer(&self) -> Option<&Arc<dyn CommandObserver>> {
        self.shared.observer.get()
    }

    /// The connection's TCP settings as the kernel reports them.
    pub fn tcp_in_force(&self) -> Option<ipsan_tcp::InForce> {
        self.socket
            .as_ref()
            .and_then(|s| ipsan_tcp::settings::read_back(s).ok())
    }

    /// A TCP_INFO snapshot of the connection (cwnd, ssthresh, RTT, retransmits, ...).
    pub fn tcp_info(&self) -> Option<ipsan_tcp::TcpInfoSnapshot> {
        self.socket
            .as_ref()
            .and_then(|s| ipsan_tcp::info::tcp_info(s).ok())
    }

    /// The capacity from the last READ CAPACITY.
    pub fn capacity(&self) -> Option<Capacity> {
        self.capacity.get().copied()
    }

    /// Whether the target asked this session to log out (AsyncEvent 1): new commands fail
    /// with [`Error::LogoutRequested`]; open a new session.
    pub fn logout_requested(&self) -> bool {
        self.shared.logout.asked.load(Ordering::Acquire)
    }

    fn refuse_after_logout_request(&self) -> Result<()> {
        if self.logout_requested() {
            return Err(Error::LogoutRequested);
        }
        Ok(())
    }

    /// Why the connection died, if it did.
    pub fn failure(&self) -> Option<&str> {
        self.shared.dead.get().map(String::as_str)
    }

    /// Send one SCSI command and wait for its completion. Blocks (asynchronously) while the
    /// CmdSN window is closed. A non-GOOD status becomes [`Error::Scsi`]. With a payload
    /// transform installed, data-out is transformed before sending and Data-In after
    /// reassembly; a read's `len` is the plaintext length.
    pub async fn command(&self, cdb: [u8; 16], dir: DataDir) -> Result<Completion> {
        let tr = self.shared.observer.get();
        self.refuse_after_logout_request()?;
        let Some(t) = self.transform.clone() else {
            let Some(tr) = tr else {
                return self.command_raw(cdb, dir, None).await;
            };
            let itt = self.shared.lock()?.itt();
            let g = observe::Pending::issued(Some(tr), itt);
            return g.finish(self.command_raw(cdb, dir, Some(itt)).await);
        };
        // The ITT is fixed before the transform runs because the transform binds to it.
        let itt = self.shared.lock()?.itt();
        let g = observe::Pending::issued(tr, itt);
        // The same extent rule the target binds with (ipsan_seal::cdb), for every CDB form.
        let (lba, blocks) = ipsan_seal::cdb::extent(&cdb);
        let info = CommandInfo {
            lun: self.lun,
            lba,
            blocks,
            opcode: cdb[0],
            itt,
        };
        match dir {
            DataDir::None => g.finish(self.command_raw(cdb, DataDir::None, Some(itt)).await),
            DataDir::Write(plain) => {
                observe::note(tr, itt, CommandEvent::SealStart, 0, plain.len() as u64);
                let wire = t.outbound(info, plain).await?;
                observe::note(tr, itt, CommandEvent::SealEnd, 0, wire.len() as u64);
                g.finish(self.command_raw(cdb, DataDir::Write(wire), Some(itt)).await)
            }
            DataDir::Read(buf, len) => {
                let wire_len = t.wire_len(len).ok_or_else(|| {
                    Error::InvalidRequest(format!("{len} bytes cannot be carried by the transform"))
                })?;
                let mut c = self
                    .command_raw(cdb, DataDir::Read(buf, wire_len), Some(itt))
                    .await?;
                observe::note(tr, itt, CommandEvent::OpenStart, 0, c.data.len() as u64);
                c.data = t.inbound(info, c.data).await?;
                observe::note(tr, itt, CommandEvent::OpenEnd, 0, c.data.len() as u64);
                g.finish(Ok(c))
            }
        }
    }

    async fn command_raw(
        &self,
        cdb: [u8; 16],
        dir: DataDir,
        fixed_itt: Option<u32>,
    ) -> Result<Completion> {
        self.refuse_after_logout_request()?;
        let (tx, rx) = oneshot::channel();
        let (write, read, read_len) = match dir {
            DataDir::None => (Bytes::new(), None, 0),
            DataDir::Write(b) => (b, None, 0),
            DataDir::Read(mut buf, len) => {
                // A reused buffer keeps its old bytes: Data-In must arrive in order and cover
                // every byte (checked in the reader), so nothing stale can leak through, and a
                // 1 MiB read does not pay for a 1 MiB memset.
                buf.resize(len, 0);
                (Bytes::new(), Some(buf), len)
            }
        };
        if write.len() > u32::MAX as usize || read_len > u32::MAX as usize {
            return Err(Error::InvalidRequest("transfer over 4 GiB".into()));
        }
        let (sent_itt, sent_cmd_sn);
        let mut reg = Some(TaskReg {
            lun: self.lun,
            write: write.clone(),
            read,
            read_len,
            received: 0,
            done: tx,
        });
        loop {
            let notified = self.shared.window.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut sn = self.shared.lock()?;
                if self.shared.dead.get().is_some() {
                    return Err(self.shared.lost());
                }
                if sn_le(sn.cmd_sn, sn.max_cmd_sn) {
                    let itt = match fixed_itt {
                        Some(i) => i,
                        None => sn.itt(),
                    };
                    let cmd_sn = sn.cmd_sn;
                    (sent_itt, sent_cmd_sn) = (itt, cmd_sn);
                    sn.cmd_sn = sn.cmd_sn.wrapping_add(1);
                    let exp_stat_sn = sn.exp_stat_sn;
                    if let Some(r) = reg.take() {
                        self.shared
                            .reg
                            .send(Reg::Task(itt, r))
                            .map_err(|_| self.shared.lost())?;
                    }
                    self.queue_command(itt, cmd_sn, exp_stat_sn, cdb, &write, read_len)?;
                    break;
                }
            }
            notified.await;
        }
        self.wait(rx, sent_itt, sent_cmd_sn).await
    }

    /// Waits for a command's completion; past the command timeout, aborts it.
    async fn wait(
        &self,
        mut rx: oneshot::Receiver<Result<Completion>>,
        itt: u32,
        cmd_sn: u32,
    ) -> Result<Completion> {
        let lost = |_| Err(self.shared.lost());
        let Some(limit) = self.shared.command_timeout else {
            return rx.await.unwrap_or_else(lost);
        };
        match tokio::time::timeout(limit, &mut rx).await {
            Ok(r) => r.unwrap_or_else(lost),
            Err(_) => self.abort_task(itt, cmd_sn, limit, rx).await,
        }
    }

    /// Fails the connection because task management left it in a state that cannot be
    /// trusted; every command in flight fails with the same reason.
    fn drop_connection(&self, why: String) -> Error {
        self.shared.kill(why.clone());
        Error::ConnectionLost(why)
    }

    /// Sends an immediate Task Management Function Request (RFC 7143 §11.5) for this session's
    /// LUN; the receiver yields the target's response.
    fn send_tmf(
        &self,
        function: TmfFunction,
        ends: Ends,
        ref_cmd_sn: u32,
    ) -> Result<oneshot::Receiver<TmfResponse>> {
        let (tx, rx) = oneshot::channel();
        let mut sn = self.shared.lock()?;
        let itt = sn.itt();
        let req = TaskMgmtRequest {
            immediate: true,
            function,
            lun: self.lun,
            itt,
            referenced_task_tag: match ends {
                Ends::Task(t) => t,
                Ends::Lun(_) => RESERVED_TAG,
            },
            cmd_sn: sn.cmd_sn,
            exp_stat_sn: sn.exp_stat_sn,
            ref_cmd_sn,
            exp_data_sn: 0,
        };
        drop(sn);
        // Registered before it is sent, so the reader knows it when the response arrives.
        self.shared
            .reg
            .send(Reg::Tmf(itt, ends, tx))
            .map_err(|_| self.shared.lost())?;
        self.shared
            .out
            .send(Pdu::new(req, Bytes::new()))
            .map_err(|_| self.shared.lost())?;
        Ok(rx)
    }

    /// LOGICAL UNIT RESET of this session's LUN (RFC 7143 §11.5.1, SAM-5 §7.7): the target
    /// aborts every task on the LUN (from every initiator) and reports a unit attention to the
    /// other sessions' next command. This session's commands on the LUN that are still in
    /// flight fail with [`Error::TaskAborted`]: the target sends no status for them. Fails with
    /// [`Error::TaskManagement`] if the target does not complete the reset, and drops the
    /// connection if it does not answer within [`TMF_TIMEOUT`].
    pub async fn lun_reset(&self) -> Result<()> {
        self.refuse_after_logout_request()?;
        // RefCmdSN is reserved (0) for every function but ABORT TASK (§11.5.4).
        let rx = self.send_tmf(TmfFunction::LOGICAL_UNIT_RESET, Ends::Lun(self.lun), 0)?;
        match tokio::time::timeout(TMF_TIMEOUT, rx).await {
            Ok(Ok(TmfResponse::FUNCTION_COMPLETE)) => Ok(()),
            Ok(Ok(other)) => Err(Error::TaskManagement(other.0)),
            Ok(Err(_)) => Err(self.shared.lost()),
            Err(_) => Err(self.drop_connection(format!(
                "LOGICAL UNIT RESET unanswered for {TMF_TIMEOUT:?}; dropping the connection"
            ))),
        }
    }

    /// ABORT TASK for a command that timed out (RFC 7143 §11.5.1). Until the response arrives
    /// the task stays registered, so its Data-In, R2Ts or status are still handled in order;
    /// the response removes it (the target sends nothing for it afterwards). A command that
    /// completes in the meantime returns its own result.
    async fn abort_task(
        &self,
        itt: u32,
        cmd_sn: u32,
        limit: Duration,
        mut rx: oneshot::Receiver<Result<Completion>>,
    ) -> Result<Completion> {
        tracing::warn!(itt, ?limit, "command timed out; sending ABORT TASK");
        let mut tmf_rx = self.send_tmf(TmfFunction::ABORT_TASK, Ends::Task(itt), cmd_sn)?;
        let answered = tokio::time::timeout(TMF_TIMEOUT, async {
            let first = tokio::select! {
                biased;
                r = &mut rx => Ok(r),
                t = &mut tmf_rx => Err(t),
            };
            match first {
                // The command's own status: it finished before the abort took effect.
                Ok(Ok(completed)) => Ok(completed),
                // The reader forgot the task on the abort's response (dropping its sender)
                // and hands that response over right after.
                Ok(Err(_)) => Err((&mut tmf_rx).await),
                Err(t) => Err(t),
            }
        })
        .await;
        let response = match answered {
            Ok(Ok(completed)) => return completed,
            Ok(Err(Ok(response))) => response,
            Ok(Err(Err(_))) => return Err(self.shared.lost()),
            Err(_) => {
                return Err(self.drop_connection(format!(
                    "ABORT TASK for ITT {itt:#x} unanswered for {TMF_TIMEOUT:?}; dropping the connection"
                )))
            }
        };
        if ends_the_task(response) {
            return Err(Error::CommandTimedOut(limit));
        }
        // Refused (RFC 7143 §11.6.1): escalate as SCSI error handling does (SAM-5 §7); a LUN
        // reset ends every task on the LUN, this one included. Only if that fails too is the
        // connection dropped.
        let why = format!(
            "target refused to abort a timed-out command (task management response {})",
            response.0
        );
        tracing::warn!(itt, "{why}; escalating to LOGICAL UNIT RESET");
        match self.lun_reset().await {
            Ok(()) => Err(Error::CommandTimedOut(limit)),
            Err(Error::ConnectionLost(r)) => Err(Error::ConnectionLost(r)),
            Err(e) => {
                Err(self.drop_connection(format!("{why}; LOGICAL UNIT RESET failed too ({e})")))
            }
        }
    }

    /// Queue the command PDU plus its immediate and unsolicited data (RFC 7143 §4.2.5?).
    fn queue_command(
        &self,
        itt: u32,
        cmd_sn: u32,
        exp_stat_sn: u32,
        cdb: [u8; 16],
        write: &Bytes,
        read_len: usize,
    ) -> Result<()> {
        let p = &self.shared.params;
        let seg = p.target_max_recv_data_segment_length as usize;
        let first_burst = p.first_burst_length as usize;
        let total = write.len();
        // Immediate data rides in the command PDU (ImmediateData=Yes, §13.11).
        let imm = if p.immediate_data {
            total.min(first_burst).min(seg)
        } else {
            0
        };
        // Unsolicited Data-Out up to FirstBurstLength when InitialR2T=No (§13.10, §13.14).
        let unsolicited_end = if p.initial_r2t {
            imm
        } else {
            total.min(first_burst)
        };
        let cmd = ScsiCommand {
            immediate: false,
            final_: unsolicited_end == imm,
            read: read_len > 0,
            write: total > 0,
            attr: TaskAttr::SIMPLE,
            lun: self.lun,
            itt,
            expected_data_transfer_length: (total.max(read_len)) as u32,
            cmd_sn,
            exp_stat_sn,
            cdb,
        };
        let send = |pdu: Pdu| self.shared.out.send(pdu).map_err(|_| self.shared.lost());
        send(Pdu::new(cmd, write.slice(..imm)))?;
        let tr = self.shared.observer.get();
        observe::note(tr, itt, CommandEvent::CmdSent, 0, imm as u64);
        let mut off = imm;
        let mut data_sn = 0u32;
        while off < unsolicited_end {
            let end = (off + seg).min(unsolicited_end);
            let h = DataOut {
                final_: end == unsolicited_end,
                lun: self.lun,
                itt,
                ttt: RESERVED_TAG,
                exp_stat_sn,
                data_sn,
                buffer_offset: off as u32,
            };
            send(Pdu::new(h, write.slice(off..end)))?;
            data_sn += 1;
            off = end;
        }
        if unsolicited_end > imm {
            let len = (unsolicited_end - imm) as u64;
            observe::note(tr, itt, CommandEvent::DataOut, imm as u64, len);
        }
        Ok(())
    }

    fn block_len(&self) -> Result<u32> {
        self.capacity
            .get()
            .map(|c| c.block_len)
            .ok_or_else(|| Error::InvalidRequest("capacity unknown: call read_capacity".into()))
    }

    /// READ(16) of `blocks` blocks at `lba`, into a fresh buffer.
    pub async fn read(&self, lba: u64, blocks: u32) -> Result<BytesMut> {
        self.read_into(lba, blocks, BytesMut::new()).await
    }

    /// READ(16) reusing `buf` (resized to the transfer length).
    pub async fn read_into(&self, lba: u64, blocks: u32, buf: BytesMut) -> Result<BytesMut> {
        if blocks == 0 {
            return Err(Error::InvalidRequest("read of zero blocks".into()));
        }
        let len = blocks as usize * self.block_len()? as usize;
        let c = self
            .command(scsi::read16(lba, blocks), DataDir::Read(buf, len))
            .await?;
        if c.data.len() != len {
            return Err(Error::Protocol(format!(
                "READ returned {} of {len} bytes",
                c.data.len()
            )));
        }
        Ok(c.data)
    }

    async fn write_inner(&self, lba: u64, data: Bytes, fua: bool) -> Result<()> {
        let bl = self.block_len()? as usize;
        if data.is_empty() || data.len() % bl != 0 {
            return Err(Error::InvalidRequest(format!(
                "write of {} bytes is not a positive multiple of the {bl}-byte block",
                data.len()
            )));
        }
        let blocks = u32::try_from(data.len() / bl)
            .map_err(|_| Error::InvalidRequest("write too large".into()))?;
        self.command(scsi::write16(lba, blocks, fua), DataDir::Write(data))
            .await?;
        Ok(())
    }

    /// WRITE(16) of `data` (a whole number of blocks) at `lba`.
    pub async fn write(&self, lba: u64, data: Bytes) -> Result<()> {
        self.write_inner(lba, data, false).await
    }

    /// WRITE(16) with FUA: the target must make it durable before answering.
    pub async fn write_fua(&self, lba: u64, data: Bytes) -> Result<()> {
        self.write_inner(lba, data, true).await
    }

    /// SYNCHRONIZE CACHE(10) over the whole LUN.
    pub async fn sync_cache(&self) -> Result<()> {
        self.command(scsi::sync_cache10(), DataDir::None).await?;
        Ok(())
    }

    /// Standard INQUIRY.
    pub async fn inquiry(&self) -> Result<Inquiry> {
        let c = self
            .command(scsi::inquiry(96), DataDir::Read(BytesMut::new(), 96))
            .await?;
        Inquiry::parse(&c.data).ok_or_else(|| Error::Protocol("short INQUIRY data".into()))
    }

    /// READ CAPACITY(16), falling back to (10); remembers the block length for read/write.
    pub async fn read_capacity(&self) -> Result<Capacity> {
        let cap = match self
            .command(scsi::read_capacity16(), DataDir::Read(BytesMut::new(), 32))
            .await
        {
            Ok(c) => Capacity::parse16(&c.data),
            Err(Error::Scsi { sense: Some(s), .. }) if s.key == SenseKey::ILLEGAL_REQUEST => {
                let c = self
                    .command(scsi::read_capacity10(), DataDir::Read(BytesMut::new(), 8))
                    .await?;
                Capacity::parse10(&c.data)
            }
            Err(e) => return Err(e),
        }
        .ok_or_else(|| Error::Protocol("short READ CAPACITY data".into()))?;
        if cap.block_len == 0 || cap.block_len % 512 != 0 {
            return Err(Error::Protocol(format!(
                "unsupported block length {}",
                cap.block_len
            )));
        }
        let _ = self.capacity.set(cap);
        Ok(cap)
    }

    /// REPORT LUNS.
    pub async fn report_luns(&self) -> Result<Vec<u64>> {
        let c = self
            .command(
                scsi::report_luns(4096),
                DataDir::Read(BytesMut::new(), 4096),
            )
            .await?;
        Ok(scsi::parse_report_luns(&c.data))
    }

    /// Log out (RFC 7143 §11.14) and close. Commands still in flight fail.
    pub async fn logout(self) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        {
            let mut sn = self.shared.lock()?;
            if self.shared.dead.get().is_some() {
                return Err(self.shared.lost());
            }
            let itt = sn.itt();
            let req = LogoutRequest {
                immediate: true,
                reason: LogoutReason::CLOSE_SESSION,
                itt,
                cid: 0,
                cmd_sn: sn.cmd_sn,
                exp_stat_sn: sn.exp_stat_sn,
            };
            self.shared
                .reg
                .send(Reg::Logout(itt, tx))
                .map_err(|_| self.shared.lost())?;
            self.shared
                .out
                .send(Pdu::new(req, Bytes::new()))
                .map_err(|_| self.shared.lost())?;
        }
        let r = tokio::time::timeout(Duration::from_secs(5), rx).await;
        match r {
            Ok(Ok(0)) => Ok(()),
            Ok(Ok(code)) => Err(Error::Protocol(format!("logout response {code}"))),
            Ok(Err(_)) => Err(self.shared.lost()),
            Err(_) => Err(Error::Timeout("logout")),
        }
    }
}

async fn keepalive(shared: Arc<Shared>, interval: Duration, timeout: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        let (tx, rx) = oneshot::channel();
        {
            let Ok(mut sn) = shared.sn.lock() else { return };
            let itt = sn.itt();
            let ping = NopOut {
                immediate: true,
                lun: 0,
                itt,
                ttt: RESERVED_TAG,
                cmd_sn: sn.cmd_sn,
                exp_stat_sn: sn.exp_stat_sn,
            };
            if shared.reg.send(Reg::Ping(itt, tx)).is_err()
                || shared.out.send(Pdu::new(ping, Bytes::new())).is_err()
            {
                return;
            }
        }
        // The link is dead when neither the answer nor anything else has come from the
        // target for `timeout`. On a slow, lossy link the ping waits in the send queue behind
        // MiBs of Data-Out (and its answer behind Data-In), while R2Ts, Data-In and status
        // keep arriving: that session is alive, and declaring it dead because the ping is
        // late failed every run at 2.7 % loss in the lab's pathologies plan.
        let mut rx = rx;
        let mut wait = timeout;
        loop {
            match tokio::time::timeout(wait, &mut rx).await {
                Ok(Ok(())) => break,
                Ok(Err(_)) => return,
                Err(_) => {
                    let quiet = shared.since_rx();
                    if quiet < timeout {
                        wait = timeout - quiet;
                        continue;
                    }
                    shared.kill(format!(
                        "no NOP-In answer to keepalive within {:.1}s (and nothing else from the target)",
                        timeout.as_secs_f64()
                    ));
                    return;
                }
            }
        }
    }
}

async fn writer(
    wr: OwnedWriteHalf,
    codec: Codec,
    rx: mpsc::UnboundedReceiver<Pdu>,
    shared: Arc<Shared>,
    sealer: Option<ipsan_seal::RecordSealer>,
) {
    if let Err(e) = writer_inner(wr, codec, rx, &shared, sealer).await {
        shared.kill(format!("send failed: {e}"));
    }
}

async fn writer_inner(
    mut wr: OwnedWriteHalf,
    codec: Codec,
    mut rx: mpsc::UnboundedReceiver<Pdu>,
    shared: &Shared,
    mut sealer: Option<ipsan_seal::RecordSealer>,
) -> Result<()> {
    let mut head = BytesMut::with_capacity(64 * 1024);
    let mut segs: VecDeque<Bytes> = VecDeque::new();
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        let mut batched = 0usize;
        // Batch what is already queued so many small PDUs go out in one syscall.
        while let Some(mut pdu) = next.take() {
            // ---- SEAL RECORD HOOK (framed write): one tag per PDU, in wire order ----
            if let Some(s) = &mut sealer {
                s.protect(&mut pdu)
                    .map_err(|e| Error::Transform(e.to_string()))?;
            }
            let trailer = codec.encode_head(&pdu, &mut head)?;
            if let Header::NopOut(n) = &pdu.header {
                if n.itt == RESERVED_TAG {
                    shared
                        .pong_bytes
                        .fetch_sub(BHS_LEN + pdu.data.len(), Ordering::Relaxed);
                }
            }
            if !pdu.data.is_empty() {
                segs.push_back(head.split().freeze());
                batched += pdu.data.len();
                segs.push_back(pdu.data);
                head.extend_from_slice(trailer.as_bytes());
            }
            if batched < 4 * 1024 * 1024 && segs.len() < 512 {
                next = rx.try_recv().ok();
            }
        }
        if !head.is_empty() {
            segs.push_back(head.split().freeze());
        }
        while !segs.is_empty() {
            let slices: Vec<IoSlice<'_>> = segs.iter().take(64).map(|b| IoSlice::new(b)).collect();
            let mut n = wr.write_vectored(&slices).await?;
            drop(slices);
            if n == 0 {
                return Err(Error::ConnectionLost("socket closed while sending".into()));
            }
            while n > 0 {
                let Some(front) = segs.front_mut() else { break };
                if n >= front.len() {
                    n -= front.len();
                    segs.pop_front();
                } else {
                    front.advance(n);
                    n = 0;
                }
            }
        }
        if head.capacity() < 4096 {
            head.reserve(64 * 1024);
        }
    }
    let _ = wr.shutdown().await;
    Ok(())
}

struct ReaderState {
    tasks: HashMap<u32, TaskReg>,
    pings: HashMap<u32, oneshot::Sender<()>>,
    logouts: HashMap<u32, oneshot::Sender<u8>>,
    tmfs: HashMap<u32, (Ends, oneshot::Sender<TmfResponse>)>,
    reg_rx: mpsc::UnboundedReceiver<Reg>,
}

impl ReaderState {
    fn drain(&mut self) {
        while let Ok(r) = self.reg_rx.try_recv() {
            match r {
                Reg::Task(itt, t) => {
                    self.tasks.insert(itt, t);
                }
                Reg::Ping(itt, t) => {
                    self.pings.insert(itt, t);
                }
                Reg::Logout(itt, t) => {
                    self.logouts.insert(itt, t);
                }
                Reg::Tmf(itt, ends, t) => {
                    self.tmfs.insert(itt, (ends, t));
                }
            }
        }
    }

    fn task(&mut self, itt: u32) -> Option<&mut TaskReg> {
        if !self.tasks.contains_key(&itt) {
            self.drain();
        }
        self.tasks.get_mut(&itt)
    }
}

async fn reader(
    rd: OwnedReadHalf,
    buf: BytesMut,
    codec: Codec,
    reg_rx: mpsc::UnboundedReceiver<Reg>,
    shared: Arc<Shared>,
    opener: Option<ipsan_seal::RecordOpener>,
) {
    let mut st = ReaderState {
        tasks: HashMap::new(),
        pings: HashMap::new(),
        logouts: HashMap::new(),
        tmfs: HashMap::new(),
        reg_rx,
    };
    let e = reader_inner(rd, buf, codec, &mut st, &shared, opener).await;
    if let Err(Error::SealForgery(f)) = &e {
        tracing::warn!(
            "{f}; nothing of it acted, dropping the connection and failing every command in flight"
        );
        let _ = shared.forged.set(f.clone());
    }
    let reason = match e {
        Ok(()) => "connection closed by target".to_owned(),
        Err(Error::ConnectionLost(r)) => r,
        Err(Error::Io(e)) => format!("connection broken: {e}"),
        Err(e) => e.to_string(),
    };
    let _ = shared.dead.set(reason);
    shared.kill(String::new());
    // Dropping `st` drops every completion sender: all waiters see the connection loss.
}

async fn reader_inner(
    mut rd: OwnedReadHalf,
    mut buf: BytesMut,
    codec: Codec,
    st: &mut ReaderState,
    shared: &Shared,
    mut opener: Option<ipsan_seal::RecordOpener>,
) -> Result<()> {
    loop {
        while let Some(mut pdu) = codec.decode(&mut buf)? {
            // ---- SEAL RECORD HOOK (framed read): nothing unverified reaches handle_pdu ----
            if let Some(o) = &mut opener {
                o.verify(&mut pdu).map_err(Error::SealForgery)?;
            }
            handle_pdu(pdu, st, shared)?;
            honor_logout_request(st, shared)?;
        }
        if buf.capacity() - buf.len() < 64 * 1024 {
            buf.reserve(256 * 1024);
        }
        let n = rd.read_buf(&mut buf).await?;
        if n == 0 {
            return Err(Error::ConnectionLost(
                "connection closed by target".to_owned(),
            ));
        }
        shared.mark_rx();
    }
}

/// Sends the Logout the target asked for (AsyncEvent 1) once no command is in flight.
fn honor_logout_request(st: &mut ReaderState, shared: &Shared) -> Result<()> {
    if !shared.logout.asked.load(Ordering::Acquire) || shared.logout.sent.load(Ordering::Acquire) {
        return Ok(());
    }
    st.drain();
    if !st.tasks.is_empty() {
        return Ok(());
    }
    let mut sn = shared.lock()?;
    let req = LogoutRequest {
        immediate: true,
        reason: LogoutReason::CLOSE_SESSION,
        itt: sn.itt(),
        cid: 0,
        cmd_sn: sn.cmd_sn,
        exp_stat_sn: sn.exp_stat_sn,
    };
    drop(sn);
    shared.logout.sent.store(true, Ordering::Release);
    tracing::info!("logging out at the target's request (AsyncEvent 1)");
    shared
        .out
        .send(Pdu::new(req, Bytes::new()))
        .map_err(|_| shared.lost())
}

fn complete(st: &mut ReaderState, itt: u32, r: Result<Completion>) {
    if let Some(t) = st.tasks.remove(&itt) {
        let _ = t.done.send(r);
    }
}

/// GOOD status but fewer Data-In bytes than the transfer length minus the residual: the
/// buffer would hold zeros the target never sent, so this is a protocol error, not data.
fn short_read(received: usize, expected: usize) -> Error {
    Error::Protocol(format!(
        "target reported GOOD after sending {received} of {expected} bytes of Data-In"
    ))
}

fn status_result(
    status: u8,
    sense: Option<Sense>,
    data: BytesMut,
    residual: i64,
) -> Result<Completion> {
    if status == ScsiStatus::GOOD.0 || status == ScsiStatus::CONDITION_MET.0 {
        Ok(Completion {
            status,
            sense,
            data,
            residual,
        })
    } else {
        Err(Error::Scsi { status, sense })
    }
}

fn handle_pdu(pdu: Pdu, st: &mut ReaderState, shared: &Shared) -> Result<()> {
    // Window and StatSN bookkeeping first, so submitters wake as early as possible.
    let (win, stat) = match &pdu.header {
        Header::ScsiResponse(h) => (Some((h.exp_cmd_sn, h.max_cmd_sn)), Some(h.stat_sn)),
        Header::DataIn(h) => (
            Some((h.exp_cmd_sn, h.max_cmd_sn)),
            h.status_present.then_some(h.stat_sn),
        ),
        Header::R2t(h) => (Some((h.exp_cmd_sn, h.max_cmd_sn)), None),
        Header::NopIn(h) => (
            Some((h.exp_cmd_sn, h.max_cmd_sn)),
            (h.itt != RESERVED_TAG).then_some(h.stat_sn),
        ),
        Header::AsyncMessage(h) => (Some((h.exp_cmd_sn, h.max_cmd_sn)), Some(h.stat_sn)),
        Header::Reject(h) => (Some((h.exp_cmd_sn, h.max_cmd_sn)), Some(h.stat_sn)),
        Header::LogoutResponse(h) => (Some((h.exp_cmd_sn, h.max_cmd_sn)), Some(h.stat_sn)),
        Header::TextResponse(h) => (Some((h.exp_cmd_sn, h.max_cmd_sn)), Some(h.stat_sn)),
        Header::TaskMgmtResponse(h) => (Some((h.exp_cmd_sn, h.max_cmd_sn)), Some(h.stat_sn)),
        _ => (None, None),
    };
    if win.is_some() || stat.is_some() {
        let mut sn = shared.lock()?;
        if let Some(s) = stat {
            sn.stat(s);
        }
        if let Some((e, m)) = win {
            if sn.update(e, m) {
                shared.window.notify_waiters();
            }
        }
    }
    match pdu.header {
        Header::DataIn(h) => {
            let Some(t) = st.task(h.itt) else {
                return Err(Error::Protocol(format!(
                    "Data-In for unknown ITT {:#x}",
                    h.itt
                )));
            };
            let off = h.buffer_offset as usize;
            let end = off + pdu.data.len();
            let Some(buf) = t.read.as_mut() else {
                return Err(Error::Protocol(
                    "Data-In for a command without read data".into(),
                ));
            };
            // DataPDUInOrder=Yes and DataSequenceInOrder=Yes (we insist on both at login):
            // Data-In offsets are contiguous (RFC 7143 §13.18, §13.19).
            if off != t.received {
                return Err(Error::Protocol(format!(
                    "Data-In at offset {off}, expected {} (out of order or overlapping)",
                    t.received
                )));
            }
            if end > t.read_len {
                return Err(Error::Protocol(format!(
                    "Data-In at {off}+{} past the {} bytes expected",
                    pdu.data.len(),
                    t.read_len
                )));
            }
            buf[off..end].copy_from_slice(&pdu.data);
            t.received += pdu.data.len();
            if let Some(tr) = shared.observer.get() {
                if off == 0 {
                    tr.on_event(h.itt, CommandEvent::DataInFirst, 0, pdu.data.len() as u64);
                }
                if end == t.read_len || h.status_present {
                    tr.on_event(
                        h.itt,
                        CommandEvent::DataInLast,
                        off as u64,
                        pdu.data.len() as u64,
                    );
                }
                if h.status_present {
                    tr.on_event(h.itt, CommandEvent::Status, 0, 0);
                }
            }
            if h.status_present {
                let mut data = t.read.take().unwrap_or_default();
                let residual = if h.underflow {
                    i64::from(h.residual_count)
                } else if h.overflow {
                    -i64::from(h.residual_count)
                } else {
                    0
                };
                if residual > 0 {
                    data.truncate(t.read_len.saturating_sub(residual as usize));
                }
                let r = if t.received < data.len() && h.status == ScsiStatus::GOOD.0 {
                    Err(short_read(t.received, data.len()))
                } else {
                    status_result(h.status, None, data, residual)
                };
                complete(st, h.itt, r);
            }
        }
        Header::ScsiResponse(h) => {
            if st.task(h.itt).is_none() {
                return Err(Error::Protocol(format!(
                    "SCSI Response for unknown ITT {:#x}",
                    h.itt
                )));
            }
            observe::note(shared.observer.get(), h.itt, CommandEvent::Status, 0, 0);
            if h.response != 0 {
                complete(st, h.itt, Err(Error::IscsiResponse(h.response)));
                return Ok(());
            }
            // Sense data: 2-byte SenseLength, then the sense bytes (RFC 7143 §11.4.7.2).
            let sense = if pdu.data.len() >= 2 {
                let sl = usize::from(u16::from_be_bytes([pdu.data[0], pdu.data[1]]));
                pdu.data
                    .get(2..2 + sl)
                    .or_else(|| pdu.data.get(2..))
                    .and_then(Sense::parse)
            } else {
                None
            };
            let residual = if h.underflow {
                i64::from(h.residual_count)
            } else if h.overflow {
                -i64::from(h.residual_count)
            } else {
                0
            };
            let (data, received) = match st.tasks.get_mut(&h.itt) {
                Some(t) => {
                    let mut d = t.read.take().unwrap_or_default();
                    if residual > 0 {
                        d.truncate(t.read_len.saturating_sub(residual as usize));
                    }
                    (d, t.received)
                }
                None => (BytesMut::new(), 0),
            };
            let r = if received < data.len() && h.status == ScsiStatus::GOOD.0 {
                Err(short_read(received, data.len()))
            } else {
                status_result(h.status, sense, data, residual)
            };
            complete(st, h.itt, r);
        }
        Header::R2t(h) => {
            let p = &shared.params;
            let Some(t) = st.task(h.itt) else {
                return Err(Error::Protocol(format!("R2T for unknown ITT {:#x}", h.itt)));
            };
            let off = h.buffer_offset as usize;
            let len = h.desired_data_transfer_length as usize;
            if len == 0 || off + len > t.write.len() || len > p.max_burst_length as usize {
                return Err(Error::Protocol(format!(
                    "R2T for {off}+{len} outside the {}-byte write or over MaxBurstLength",
                    t.write.len()
                )));
            }
            let tr = shared.observer.get();
            observe::note(tr, h.itt, CommandEvent::R2t, off as u64, len as u64);
            let seg = p.target_max_recv_data_segment_length as usize;
            let exp_stat_sn = shared.lock()?.exp_stat_sn;
            let mut pos = off;
            let mut data_sn = 0u32;
            while pos < off + len {
                let end = (pos + seg).min(off + len);
                let d = DataOut {
                    final_: end == off + len,
                    lun: t.lun,
                    itt: h.itt,
                    ttt: h.ttt,
                    exp_stat_sn,
                    data_sn,
                    buffer_offset: pos as u32,
                };
                shared
                    .out
                    .send(Pdu::new(d, t.write.slice(pos..end)))
                    .map_err(|_| shared.lost())?;
                data_sn += 1;
                pos = end;
            }
            observe::note(tr, h.itt, CommandEvent::DataOut, off as u64, len as u64);
        }
        Header::NopIn(h) => {
            if h.itt != RESERVED_TAG {
                if !st.pings.contains_key(&h.itt) {
                    st.drain();
                }
                if let Some(p) = st.pings.remove(&h.itt) {
                    let _ = p.send(());
                }
            }
            if h.ttt != RESERVED_TAG {
                let cost = BHS_LEN + pdu.data.len();
                let queued = shared.pong_bytes.fetch_add(cost, Ordering::Relaxed) + cost;
                if queued > MAX_QUEUED_PONG_BYTES {
                    return Err(Error::Protocol(format!(
                        "target sent NOP-In pings faster than it reads the answers \
                         ({queued} bytes of NOP-Out queued)"
                    )));
                }
                // The target pings us: answer with its TTT and data (RFC 7143 §11.18). The
                // data is copied so a queued answer does not pin the receive buffer.
                let sn = shared.lock()?;
                let pong = NopOut {
                    immediate: true,
                    lun: h.lun,
                    itt: RESERVED_TAG,
                    ttt: h.ttt,
                    cmd_sn: sn.cmd_sn,
                    exp_stat_sn: sn.exp_stat_sn,
                };
                shared
                    .out
                    .send(Pdu::new(pong, Bytes::copy_from_slice(&pdu.data)))
                    .map_err(|_| shared.lost())?;
            }
        }
        Header::Reject(h) => {
            // The data segment holds the rejected header; its ITT names the task.
            let itt = pdu
                .data
                .get(16..20)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
            tracing::warn!(reason = h.reason.0, ?itt, "target rejected a PDU");
            if let Some(itt) = itt {
                if st.task(itt).is_some() {
                    complete(st, itt, Err(Error::Rejected(h.reason.0)));
                }
            }
        }
        Header::TaskMgmtResponse(h) => {
            st.drain();
            match st.tmfs.remove(&h.itt) {
                Some((ends, tx)) => {
                    match ends {
                        Ends::Task(task) => {
                            if ends_the_task(h.response) {
                                // Nothing more comes for it (§11.6.1): forget it. Its waiter
                                // gets the abort's outcome through `tx`.
                                st.tasks.remove(&task);
                            }
                        }
                        Ends::Lun(lun) if h.response == TmfResponse::FUNCTION_COMPLETE => {
                            // The reset aborted them; the target sends no status for them.
                            let aborted: Vec<u32> = st
                                .tasks
                                .iter()
                                .filter(|(_, t)| t.lun == lun)
                                .map(|(itt, _)| *itt)
                                .collect();
                            for itt in aborted {
                                complete(
                                    st,
                                    itt,
                                    Err(Error::TaskAborted("LOGICAL UNIT RESET".into())),
                                );
                            }
                        }
                        Ends::Lun(_) => {}
                    }
                    let _ = tx.send(h.response);
                }
                None => tracing::warn!(itt = h.itt, "task management response for no request"),
            }
        }
        Header::LogoutResponse(h) => {
            st.drain();
            if let Some(tx) = st.logouts.remove(&h.itt) {
                let _ = tx.send(h.response);
            }
            if shared.logout.sent.load(Ordering::Acquire) {
                return Err(Error::ConnectionLost(
                    "logged out at the target's request (AsyncEvent 1)".into(),
                ));
            }
            return Err(Error::ConnectionLost("logged out".into()));
        }
        Header::AsyncMessage(h) => match h.async_event {
            1 => {
                tracing::info!(
                    within_secs = h.parameter3,
                    "target requests logout (AsyncEvent 1); refusing new commands"
                );
                shared.logout.asked.store(true, Ordering::Release);
            }
            2 | 3 => {
                return Err(Error::ConnectionLost(format!(
                    "target announced it drops the connection (async event {})",
                    h.async_event
                )))
            }
            e => tracing::warn!(event = e, "asynchronous message from target"),
        },
        other => {
            return Err(Error::Protocol(format!(
                "unexpected {:?} PDU in full feature phase",
                other.opcode()
            )))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_arithmetic_wraps() {
        assert!(sn_lt(u32::MAX, 0));
        assert!(sn_lt(5, 6));
        assert!(!sn_lt(6, 5));
        assert!(sn_le(7, 7));
    }

    #[test]
    fn window_ignores_stale_and_invalid_updates() {
        let mut sn = Sn {
            next_itt: 1,
            cmd_sn: 10,
            exp_cmd_sn: 10,
            max_cmd_sn: 20,
            exp_stat_sn: 0,
        };
        assert!(!sn.update(10, 15), "MaxCmdSN never moves back");
        assert_eq!(sn.max_cmd_sn, 20);
        assert!(sn.update(12, 40));
        assert_eq!(sn.max_cmd_sn, 40);
        // MaxCmdSN < ExpCmdSN - 1: ignored (RFC 7143 §4.2.2.1).
        assert!(!sn.update(50, 45));
        assert_eq!((sn.exp_cmd_sn, sn.max_cmd_sn), (12, 40));
    }

    #[test]
    fn itt_skips_reserved_tag() {
        let mut sn = Sn {
            next_itt: RESERVED_TAG - 1,
            cmd_sn: 0,
            exp_cmd_sn: 0,
            max_cmd_sn: 0,
            exp_stat_sn: 0,
        };
        assert_eq!(sn.itt(), RESERVED_TAG - 1);
        assert_eq!(sn.itt(), 1);
    }
}
