//! The NVMe/TCP host (issue 30): the tokio driver of `nvme_proto::host`. An [`NvmeSession`]
//! is one controller of a subsystem: the admin queue (bring-up, then Keep Alive at KATO/2) and
//! N I/O queues, one TCP connection each, with many commands in flight per queue; each read,
//! write and flush goes to the queue with the fewest commands under way. [`discover`] reads a discovery
//! controller's log. The protocol lives in `nvme-proto`; here are sockets, tasks and timers.
//!
//! - `url.rs`: [`NvmeUrl`], `nvme+tcp://host[:port]/subsysnqn/nsid`.
//! - `queue.rs`: one queue's connection (the callers submit; a dispatcher task reads).
//! - `links.rs`: the controller's queues in use, and a copy for each thread that runs some.
//! - `runtimes.rs`: current-thread runtimes on threads of their own, for `queue_runtimes`.
//! - `identity.rs`: host identities (UUID, host NQN) and the secret files (DH-HMAC-CHAP, TLS PSK).
//! - `controller.rs`: a controller brought up (queues, TLS, DH-HMAC-CHAP) and kept alive.

mod controller;
mod identity;
mod links;
mod queue;
mod runtimes;
pub mod url;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use nvme_proto::auth::AuthState;
pub use nvme_proto::auth::{AuthConfig, DhchapSecret};
use nvme_proto::host::authn::AuthRun;
use nvme_proto::host::bringup::{
    Bringup, BringupConfig, BringupError, ControllerInfo, HostCommand, KeepAlive,
};
use nvme_proto::host::cmd::{self, DiscoveryEntry, CC_SHUTDOWN};
use nvme_proto::host::{HostError, QueueConfig};
pub use nvme_proto::psk::ConfiguredPsk;
use nvme_wire::entry::Status;
use nvme_wire::fabrics::{ConnectData, ConnectResponse, Property};
use tokio_util::sync::CancellationToken;

use crate::scsi::Capacity;
use controller::{bring_up, establish, tls_params};
pub use identity::{
    dhchap_secret_from_file, hostnqn_for, parse_uuid, random_uuid, tls_key_from_file,
};
use links::{CurrentLinks, Links};
use queue::{QueueHandle, TlsParams};
pub use runtimes::RuntimeThreads;
pub use url::NvmeUrl;

/// What the NVMe host fails with. Never carries secret material.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NvmeError {
    /// Socket I/O failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The queue machine failed (a bad PDU, a termination request).
    #[error(transparent)]
    Queue(#[from] HostError),
    /// The controller bring-up failed.
    #[error(transparent)]
    Bringup(#[from] BringupError),
    /// A command completed with an error status.
    #[error("{op} failed: status SCT {:#x} SC {:#04x}{}", status.sct, status.sc, if *dnr { " (do not retry)" } else { "" })]
    Status {
        op: &'static str,
        status: Status,
        dnr: bool,
    },
    /// The queue or session is closed (why).
    #[error("closed: {0}")]
    Closed(String),
    /// Something did not happen in time.
    #[error("timed out: {0}")]
    Timeout(&'static str),
    /// The caller asked for something impossible.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The TLS handshake failed (another key, no PSK, a broken connection).
    #[error("{0}")]
    Tls(String),
}

/// How to connect.
#[derive(Debug, Clone)]
pub struct NvmeConfig {
    /// Our host NQN.
    pub hostnqn: String,
    /// Our host identifier (a UUID).
    pub hostid: [u8; 16],
    /// I/O queues to ask for (each its own TCP connection).
    pub queues: u16,
    /// Entries per I/O queue (SQSIZE + 1; capped by CAP.MQES + 1): one less are in flight.
    pub queue_depth: u16,
    /// Keep Alive Timeout (0: none).
    pub kato: Duration,
    /// Ask for header digests.
    pub header_digest: bool,
    /// Ask for data digests.
    pub data_digest: bool,
    /// Connect, ICResp and every bring-up command within this.
    pub connect_timeout: Duration,
    /// An I/O command without completion for this long fails (`None`: wait forever).
    pub command_timeout: Option<Duration>,
    /// DH-HMAC-CHAP secrets (TP 8006): every queue authenticates when the controller asks
    /// (Connect's AUTHREQ.ATR); bidirectional with a controller secret.
    pub auth: Option<Arc<AuthConfig>>,
    /// TLS 1.3 with this configured PSK on every queue (TP 8011; the identity
    /// `NVMe0R0H <hostnqn> <subnqn>` and libnvme's derivation, as `nvme check-tls-key
    /// --insert` files the key for Linux's target).
    pub tls: Option<Arc<ConfiguredPsk>>,
    /// Connect again after a connection loss, as Linux's host does (`reconnect_delay`,
    /// `ctrl_loss_tmo`); `None`: a lost connection fails the session's commands.
    pub reconnect: Option<Reconnect>,
    /// Keep SQ flow control on the I/O queues. By default (`false`) each I/O queue's Connect
    /// disables it (CATTR bit 2, NVMe over Fabrics 1.1 §3.3; Linux's `nvme connect
    /// --disable-sqflow`): the controller may then end a successful read with a C2HData
    /// carrying SUCCESS and send no response capsule for it (NVMe/TCP 1.0 §3.6.2.9), one PDU
    /// less per read. The host takes both forms either way.
    pub sq_flow_control: bool,
    /// Runtimes the I/O queues run on, queue `i` (from 0) on runtime `i mod n`: each queue's
    /// connection, task and timer on it. With current-thread runtimes, one per thread, a
    /// command goes on a queue whose task runs on the calling thread when there is one (the
    /// least busy of them), so a caller on that thread and its queue hand nothing to another
    /// thread: no futex or eventfd wake-up between a command and its completion, which a
    /// multi-thread runtime pays whenever a task it wakes finds the other worker parked.
    /// Empty (the default): the caller's runtime, and the least busy queue of all.
    pub queue_runtimes: Vec<tokio::runtime::Handle>,
}

/// Reconnecting after a connection loss (Linux's `nvme connect --reconnect-delay
/// --ctrl-loss-tmo`): a new controller (admin queue, bring-up, the I/O queues) is connected
/// every `delay` until one comes up or the controller has been lost for `ctrl_loss_tmo`.
/// Commands that are safe to send again (Read, Write, Flush, Write Zeroes, Dataset
/// Management, Compare: [`retry_safe`]) wait and are sent again on the new controller; others
/// (the reservation commands, whose effect may already have happened) fail with the loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconnect {
    /// Wait before each attempt (Linux's default: 10 s).
    pub delay: Duration,
    /// Give up once the controller has been lost this long (Linux's default: 600 s).
    pub ctrl_loss_tmo: Duration,
}

/// Whether an I/O command may be sent again after its connection was lost before its
/// completion came: it reads, or writes the same data to the same blocks again (NVM Command
/// Set 1.0: Flush 00h, Write 01h, Read 02h, Compare 05h, Write Zeroes 08h, Dataset
/// Management 09h). The reservation commands change state whose change may already have
/// happened (a Register of a new key, a preempt) and are not sent again.
#[must_use]
pub fn retry_safe(opcode: u8) -> bool {
    matches!(opcode, 0x00 | 0x01 | 0x02 | 0x05 | 0x08 | 0x09)
}

impl Default for NvmeConfig {
    fn default() -> Self {
        let hostid = random_uuid();
        Self {
            hostnqn: hostnqn_for(&hostid),
            hostid,
            queues: 1,
            queue_depth: 128,
            kato: Duration::from_secs(5),
            header_digest: false,
            data_digest: false,
            connect_timeout: Duration::from_secs(10),
            command_timeout: Some(Duration::from_secs(30)),
            auth: None,
            tls: None,
            reconnect: None,
            sq_flow_control: false,
            queue_runtimes: Vec::new(),
        }
    }
}

/// Reads the Discovery log of the discovery controller at `url` (`nvme+tcp://host[:port]`).
///
/// # Errors
/// Connecting, the bring-up or the log read failed.
pub async fn discover(
    url: &NvmeUrl,
    cfg: &NvmeConfig,
) -> Result<(ControllerInfo, Vec<DiscoveryEntry>), NvmeError> {
    let cancel = CancellationToken::new();
    let _guard = cancel.clone().drop_guard();
    let mut qc = QueueConfig::admin();
    qc.header_digest = cfg.header_digest;
    qc.data_digest = cfg.data_digest;
    let mut bc = BringupConfig::discovery(cfg.hostnqn.clone(), cfg.hostid);
    bc.auth = cfg.auth.clone();
    if let Some(n) = &url.subnqn {
        bc.subnqn = n.clone();
    }
    let tls = tls_params(cfg, &bc.subnqn);
    let admin =
        QueueHandle::connect(&url.addr(), qc, tls.as_ref(), cfg.connect_timeout, cancel).await?;
    let mut info = bring_up(&admin, bc, cfg.connect_timeout).await?;
    let entries = std::mem::take(&mut info.discovery);
    // Best effort: a clean shutdown (CC.SHN) before the connection goes.
    let _ = tokio::time::timeout(
        Duration::from_secs(2),
        admin.call(
            cmd::property_set(Property::Cc, CC_SHUTDOWN),
            Bytes::new(),
            0,
            BytesMut::new(),
        ),
    )
    .await;
    Ok((info, entries))
}

/// One controller of an NVM subsystem, its namespace and its I/O queues; after a connection
/// loss another controller of the same subsystem when [`NvmeConfig::reconnect`] says so.
#[derive(Debug)]
pub struct NvmeSession {
    url: NvmeUrl,
    info: ControllerInfo,
    nsid: u32,
    block_len: u32,
    blocks: u64,
    max_transfer: u32,
    /// The controller's queues now; replaced by a reconnect.
    links: CurrentLinks,
    next: AtomicUsize,
    command_timeout: Option<Duration>,
    tls: bool,
    /// How the session was opened, for reconnecting.
    cfg: NvmeConfig,
    /// One reconnect at a time; the others wait for it.
    reconnecting: tokio::sync::Mutex<()>,
    /// Reconnects that succeeded.
    reconnects: AtomicUsize,
    /// The controller was lost for longer than `ctrl_loss_tmo`: why.
    gone: Mutex<Option<String>>,
}

thread_local! {
    /// Where [`NvmeSession::queue`] starts looking among the calling thread's own queues.
    static HOME_TURN: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many controllers one command may see lost before it fails.
const MAX_RECONNECTS_PER_COMMAND: usize = 8;

impl NvmeSession {
    /// Connects the admin queue, brings the controller up, and connects the I/O queues.
    ///
    /// # Errors
    /// A URL without subsystem, connection, bring-up or I/O queue Connect failures.
    pub async fn open(url: &NvmeUrl, cfg: &NvmeConfig) -> Result<Self, NvmeError> {
        let e = establish(url, cfg, 0).await?;
        Ok(Self {
            url: url.clone(),
            nsid: e.nsid,
            block_len: e.block_len,
            blocks: e.blocks,
            max_transfer: e.max_transfer,
            info: e.info,
            links: CurrentLinks::new(e.links, !cfg.queue_runtimes.is_empty()),
            next: AtomicUsize::new(0),
            command_timeout: cfg.command_timeout,
            tls: cfg.tls.is_some(),
            cfg: cfg.clone(),
            reconnecting: tokio::sync::Mutex::new(()),
            reconnects: AtomicUsize::new(0),
            gone: Mutex::new(None),
        })
    }

    /// The controller's queues now.
    fn links(&self) -> Arc<Links> {
        self.links.get()
    }

    /// How many times the session connected a new controller after a connection loss.
    #[must_use]
    pub fn reconnects(&self) -> usize {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// Connects a new controller after the one of generation `seen` was lost (`why`): every
    /// [`Reconnect::delay`] until one comes up, for at most [`Reconnect::ctrl_loss_tmo`].
    /// Callers that find a reconnect under way wait for it.
    async fn reconnect(&self, seen: u64, why: &NvmeError) -> Result<(), NvmeError> {
        let gone = |g: &Mutex<Option<String>>| g.lock().ok().and_then(|g| g.clone());
        let Some(rc) = self.cfg.reconnect else {
            return Err(NvmeError::Closed(why.to_string()));
        };
        let _one = self.reconnecting.lock().await;
        if let Some(e) = gone(&self.gone) {
            return Err(NvmeError::Closed(e));
        }
        let old = self.links();
        if old.gen != seen && !old.dead() {
            return Ok(());
        }
        // Whatever is left of the lost controller goes (its admin queue too, so the target
        // ends it).
        old.cancel.cancel();
        let lost_at = Instant::now();
        tracing::warn!(
            "nvme: the connection to {} was lost ({why}); connecting again every {:?} for up to {:?}",
            self.url.addr(),
            rc.delay,
            rc.ctrl_loss_tmo
        );
        loop {
            tokio::time::sleep(rc.delay).await;
            let last = match establish(&self.url, &self.cfg, old.gen + 1).await {
                Ok(e) if e.nsid == self.nsid && e.block_len == self.block_len => {
                    self.links.set(e.links);
                    self.reconnects.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        "nvme: connected again to {} after {:?}",
                        self.url.addr(),
                        lost_at.elapsed()
                    );
                    return Ok(());
                }
                Ok(e) => {
                    e.links.cancel.cancel();
                    "the namespace is not the one the session had".to_owned()
                }
                Err(e) => e.to_string(),
            };
            if lost_at.elapsed() + rc.delay > rc.ctrl_loss_tmo {
                let msg = format!(
                    "the controller was lost for {:?} (ctrl_loss_tmo), last attempt: {last}",
                    rc.ctrl_loss_tmo
                );
                tracing::warn!("nvme: {msg}");
                if let Ok(mut g) = self.gone.lock() {
                    *g = Some(msg.clone());
                }
                return Err(NvmeError::Closed(msg));
            }
            tracing::debug!("nvme: reconnect attempt failed: {last}");
        }
    }

    /// The URL this session was opened with.
    #[must_use]
    pub fn url(&self) -> &NvmeUrl {
        &self.url
    }

    /// What the bring-up found (Identify Controller, the namespaces, ...).
    #[must_use]
    pub fn info(&self) -> &ControllerInfo {
        &self.info
    }

    /// The namespace in use.
    #[must_use]
    pub fn nsid(&self) -> u32 {
        self.nsid
    }

    /// I/O queues connected.
    #[must_use]
    pub fn queues(&self) -> usize {
        self.links().io.len()
    }

    /// Whether the queues run over TLS.
    #[must_use]
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The admin queue's DH-HMAC-CHAP outcome as text (`sha256 ffdhe2048 bidirectional`), or
    /// `None` when the controller did not ask for authentication.
    #[must_use]
    pub fn authentication(&self) -> Option<String> {
        self.info.auth.map(|a| match a {
            AuthState::Succeeded {
                hash,
                dh_group,
                bidirectional,
            } => format!(
                "DH-HMAC-CHAP {} {}{}",
                hash.name(),
                dh_group.name(),
                if bidirectional { " bidirectional" } else { "" }
            ),
            other => format!("{other:?}"),
        })
    }

    /// Header and data digests in force and MAXH2CDATA (from the first I/O queue's ICResp).
    #[must_use]
    pub fn transport(&self) -> (bool, bool, u32) {
        let l = self.links();
        let q = l.io.first().unwrap_or(&l.admin);
        (q.digests.0, q.digests.1, q.maxh2cdata)
    }

    /// The largest transfer of one command, in bytes.
    #[must_use]
    pub fn max_transfer(&self) -> u32 {
        self.max_transfer
    }

    /// The namespace's size.
    #[must_use]
    pub fn capacity(&self) -> Option<Capacity> {
        Some(Capacity {
            blocks: self.blocks,
            block_len: self.block_len,
        })
    }

    /// The I/O queue the next command goes on: the least busy one ([`queue::pick`]).
    fn queue<'a>(&self, l: &'a Links) -> &'a QueueHandle {
        let n = l.io.len();
        if n <= 1 {
            return l.io.first().unwrap_or(&l.admin);
        }
        if !self.cfg.queue_runtimes.is_empty() {
            // The queues whose task runs on this thread, if any (NvmeConfig::queue_runtimes).
            let me = std::thread::current().id();
            if l.io.iter().any(|q| q.home == me) {
                // This thread's own turn counter: callers on several threads write no shared
                // cache line per command.
                let start = HOME_TURN.with(|t| {
                    let s = t.get();
                    t.set(s.wrapping_add(1));
                    s
                });
                let i = queue::pick(n, start, |i| {
                    l.io.get(i)
                        .filter(|q| q.home == me)
                        .map_or(usize::MAX, QueueHandle::calls)
                });
                return l.io.get(i).unwrap_or(&l.admin);
            }
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let i = queue::pick(n, start, |i| {
            l.io.get(i).map_or(usize::MAX, QueueHandle::calls)
        });
        l.io.get(i).unwrap_or(&l.admin)
    }

    /// Runs an I/O command; with [`NvmeConfig::reconnect`], a lost controller is connected
    /// again first, and a command that is [`retry_safe`] and lost with its connection is sent
    /// again on the new one.
    async fn io(
        &self,
        op: &'static str,
        sqe: nvme_wire::Sqe,
        write: Bytes,
        read_len: u32,
        buf: BytesMut,
    ) -> Result<Bytes, NvmeError> {
        let mut buf = Some(buf);
        let mut reconnects = 0;
        loop {
            let links = self.links();
            if reconnects > MAX_RECONNECTS_PER_COMMAND {
                return Err(NvmeError::Closed(format!(
                    "{op}: the controller was lost {reconnects} times while it ran"
                )));
            }
            reconnects += 1;
            if self.cfg.reconnect.is_some() && links.dead() {
                let why = NvmeError::Closed("the controller's connection ended".into());
                self.reconnect(links.gen, &why).await?;
                continue;
            }
            let r = self
                .io_once(
                    &links,
                    op,
                    sqe,
                    write.clone(),
                    read_len,
                    buf.take().unwrap_or_default(),
                )
                .await;
            match r {
                Err(e)
                    if self.cfg.reconnect.is_some()
                        && retry_safe(sqe.opcode)
                        && matches!(
                            e,
                            NvmeError::Closed(_) | NvmeError::Io(_) | NvmeError::Queue(_)
                        )
                        && links.dead() =>
                {
                    self.reconnect(links.gen, &e).await?;
                }
                r => return r,
            }
        }
    }

    async fn io_once(
        &self,
        links: &Links,
        op: &'static str,
        sqe: nvme_wire::Sqe,
        write: Bytes,
        read_len: u32,
        buf: BytesMut,
    ) -> Result<Bytes, NvmeError> {
        if let Some(e) = links.keepalive_error.get() {
            return Err(NvmeError::Closed(e.clone()));
        }
        // The queue's dispatcher fails the command at its deadline (one timer per queue).
        let deadline = self
            .command_timeout
            .and_then(|t| Instant::now().checked_add(t));
        let (cqe, data) = self
            .queue(links)
            .call_until(sqe, write, read_len, buf, deadline)
            .await?;
        if !cqe.status.is_success() {
            return Err(NvmeError::Status {
                op,
                status: cqe.status,
                dnr: cqe.dnr,
            });
        }
        Ok(data)
    }

    fn check(&self, lba: u64, blocks: u32) -> Result<u32, NvmeError> {
        let len = u64::from(blocks) * u64::from(self.block_len);
        if blocks == 0 || blocks > 65536 || len > u64::from(self.max_transfer) {
            return Err(NvmeError::Invalid(format!(
                "{blocks} blocks: 1..=65536 and at most {} bytes per command",
                self.max_transfer
            )));
        }
        if lba
            .checked_add(u64::from(blocks))
            .is_none_or(|e| e > self.blocks)
        {
            return Err(NvmeError::Invalid(format!(
                "LBA {lba} + {blocks} beyond the namespace's {} blocks",
                self.blocks
            )));
        }
        Ok(len as u32)
    }

    /// Reads `blocks` blocks at `lba`. The data comes back as received when the target sent
    /// it in one C2HData PDU (ipsan's and Linux's targets do), else gathered into `buf`
    /// (cleared first; a caller reuses it).
    ///
    /// # Errors
    /// A bad range, a failed status, a lost queue, a timeout.
    pub async fn read_into(
        &self,
        lba: u64,
        blocks: u32,
        buf: BytesMut,
    ) -> Result<Bytes, NvmeError> {
        let len = self.check(lba, blocks)?;
        let data = self
            .io(
                "Read",
                cmd::rw(false, self.nsid, lba, blocks),
                Bytes::new(),
                len,
                buf,
            )
            .await?;
        if data.len() != len as usize {
            return Err(NvmeError::Invalid(format!(
                "Read returned {} of {len} bytes",
                data.len()
            )));
        }
        Ok(data)
    }

    /// Writes `data` (a whole number of blocks) at `lba`.
    ///
    /// # Errors
    /// As [`NvmeSession::read_into`].
    pub async fn write(&self, lba: u64, data: Bytes) -> Result<(), NvmeError> {
        let bl = self.block_len as usize;
        if data.is_empty() || data.len() % bl != 0 {
            return Err(NvmeError::Invalid(format!(
                "{} bytes is not a whole number of {bl}-byte blocks",
                data.len()
            )));
        }
        let blocks = u32::try_from(data.len() / bl)
            .map_err(|_| NvmeError::Invalid("write too long".into()))?;
        self.check(lba, blocks)?;
        self.io(
            "Write",
            cmd::rw(true, self.nsid, lba, blocks),
            data,
            0,
            BytesMut::new(),
        )
        .await
        .map(|_| ())
    }

    /// Flush (every I/O queue's writes are on stable media when it completes).
    ///
    /// # Errors
    /// As [`NvmeSession::read_into`].
    pub async fn flush(&self) -> Result<(), NvmeError> {
        self.io(
            "Flush",
            cmd::flush(self.nsid),
            Bytes::new(),
            0,
            BytesMut::new(),
        )
        .await
        .map(|_| ())
    }

    /// Reservation Register (NVMe Base 2.0 §7.3) on the namespace: `rrega` 0 registers
    /// `nrkey`, 1 unregisters, 2 replaces `crkey` by `nrkey`; `iekey` skips the key check.
    ///
    /// # Errors
    /// As [`NvmeSession::read_into`]; a refusal is [`NvmeError::Status`] (Reservation
    /// Conflict is SC 83h).
    pub async fn resv_register(
        &self,
        rrega: u8,
        iekey: bool,
        crkey: u64,
        nrkey: u64,
    ) -> Result<(), NvmeError> {
        let (sqe, data) = cmd::resv_register(self.nsid, rrega, iekey, crkey, nrkey);
        let data = Bytes::copy_from_slice(&data);
        self.io("Reservation Register", sqe, data, 0, BytesMut::new())
            .await
            .map(|_| ())
    }

    /// Reservation Acquire (§7.2): `racqa` 0 acquires a reservation of type `rtype` (1 Write
    /// Exclusive ... 6 Exclusive Access – All Registrants), 1 preempts the holder of `prkey`.
    ///
    /// # Errors
    /// As [`NvmeSession::resv_register`].
    pub async fn resv_acquire(
        &self,
        racqa: u8,
        rtype: u8,
        crkey: u64,
        prkey: u64,
    ) -> Result<(), NvmeError> {
        let (sqe, data) = cmd::resv_acquire(self.nsid, racqa, rtype, crkey, prkey);
        let data = Bytes::copy_from_slice(&data);
        self.io("Reservation Acquire", sqe, data, 0, BytesMut::new())
            .await
            .map(|_| ())
    }

    /// Reservation Release (§7.4): `rrela` 0 releases the reservation of type `rtype`, 1
    /// clears every registration.
    ///
    /// # Errors
    /// As [`NvmeSession::resv_register`].
    pub async fn resv_release(&self, rrela: u8, rtype: u8, crkey: u64) -> Result<(), NvmeError> {
        let (sqe, data) = cmd::resv_release(self.nsid, rrela, rtype, crkey);
        let data = Bytes::copy_from_slice(&data);
        self.io("Reservation Release", sqe, data, 0, BytesMut::new())
            .await
            .map(|_| ())
    }

    /// Reservation Report (§7.5, extended data structure), up to 4 KiB.
    ///
    /// # Errors
    /// As [`NvmeSession::resv_register`].
    pub async fn resv_report(&self) -> Result<cmd::ResvReport, NvmeError> {
        let len = 4096;
        let data = self
            .io(
                "Reservation Report",
                cmd::resv_report(self.nsid, len),
                Bytes::new(),
                len,
                BytesMut::new(),
            )
            .await?;
        Ok(cmd::ResvReport::parse(&data))
    }

    /// Shuts the controller down (CC.SHN = normal, NVMe Base 2.0 §3.6.1) and closes every
    /// queue.
    ///
    /// # Errors
    /// The shutdown request failed.
    pub async fn close(self) -> Result<(), NvmeError> {
        let links = self.links();
        let r = tokio::time::timeout(
            Duration::from_secs(5),
            links.admin.call(
                cmd::property_set(Property::Cc, CC_SHUTDOWN),
                Bytes::new(),
                0,
                BytesMut::new(),
            ),
        )
        .await;
        links.cancel.cancel();
        match r {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(NvmeError::Timeout("shutdown")),
        }
    }
}

impl Drop for NvmeSession {
    fn drop(&mut self) {
        self.links().cancel.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnqn_is_the_uuid_form_and_parses_back() {
        let id = random_uuid();
        let nqn = hostnqn_for(&id);
        let u = nqn
            .strip_prefix("nqn.2014-08.org.nvmexpress:uuid:")
            .unwrap();
        assert_eq!(parse_uuid(u).unwrap(), id);
        assert!(parse_uuid("6e766d65-766d-4000-8000-00000000000").is_err());
    }
}
