//! The connections of one session (RFC 7143 §4.2, MaxConnections > 1; issue 28).
//!
//! [`Core`] is what they share: the engine's session (`iscsi_proto::engine::target::session`:
//! one CmdSN window, commands in CmdSN order across connections, StatSN and task allegiance per
//! connection), the session's registration and end, its counters, and a gateway's remote
//! sessions. Each connection keeps its own socket, reader, writer, Seal keys (its own login's
//! negotiation, so no two connections share a key or a counter) and running commands
//! (`conn.rs`'s `Session`). [`Eng`] is the engine as one connection sees it: the same calls as
//! a connection's engine, for its own CID, and when an input reached another connection (a
//! held command that may run now, a task management function, a Logout naming it) that
//! connection's reader and writer are woken.
//!
//! A login with a session's TSIH joins it only once it proved everything it will (CHAP,
//! Seal's confirmation) and then only when the registry says the TSIH is that initiator's,
//! ISID's and target's session (`Registry::joining`) and [`Core::room`] says it is not
//! full or ending (`conn/login.rs`'s `join_check`: before that, a full session and none look
//! alike); it is admitted as a reinstating login would be, so it proves at
//! least what the session proved. The session ends when its last connection does.
//!
//! On a long path the session's connections share one send buffer (`Core::link`, `unlink`;
//! `ipsan_tcp::share_send_buffer`): the whole buffer for one, its share (at least the
//! autotuning ceiling) for each of several, sized again as they join and leave.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use bytes::BytesMut;
use ipsan_scsi::CommandInfo;
use iscsi_proto::engine::target as engine;
use iscsi_proto::engine::target::session::{AddError, ConnId, Session as EngineSession};
use iscsi_proto::engine::{CloseReason, ConnectionError, Side};
use iscsi_proto::login::{LoginFailure, LoginStatus};
use iscsi_wire::header::{DataOut, ScsiCommand, TmfResponse};
use iscsi_wire::{Pdu, WireError};
use tokio_util::sync::CancellationToken;

use super::luns::Luns;
use super::Session;
use crate::lock;

/// What the connections of one session share.
pub(crate) struct Core {
    pub(super) engine: Mutex<EngineSession<CommandInfo>>,
    /// The connections, to wake each other.
    links: Mutex<HashMap<ConnId, Weak<Session>>>,
    /// What the path's send buffer was last split across ([`Core::link`]).
    send_share: ipsan_tcp::SendShare,
    /// Set, under the engine lock, by the connection that closes last: nobody joins after.
    over: AtomicBool,
    /// Cancelled to end the session (reinstatement, shutdown, `ipsan ctl session drop`).
    pub(super) cancel: CancellationToken,
    /// Cancelled once none of the session's commands runs any more (after its end).
    pub(super) drained: CancellationToken,
    pub(super) stats: Arc<crate::metrics::SessionStats>,
    pub(super) remote: Option<Arc<crate::remote::RemoteNexus>>,
    /// The leading login's values.
    pub(super) params: iscsi_proto::params::SessionParams,
    pub(super) isid: [u8; 6],
    pub(super) tsih: u16,
    /// The leading connection's Seal cipher and chunk size (`None`: plaintext). Every
    /// connection of a session has the same: a command held on one connection may be sized
    /// while another's PDU is handled, and sealed sizes depend on them.
    pub(super) seal_shape: Option<(ipsan_seal::Cipher, u32)>,
    /// Commands forwarded to a remote LUN and not completed, by ITT (unique in the session,
    /// RFC 7143 §11.2.1.8): cancelling one forwards the host's ABORT TASK to the remote
    /// session. The session's, not a connection's: a task reassigned to another connection
    /// (ErrorRecoveryLevel 2), or dropped when Time2Retain ran out after its connection was
    /// gone, is aborted from whichever connection hears of it. Locked after `engine`, never
    /// before.
    pub(super) forwarded: Mutex<HashMap<u32, CancellationToken>>,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("tsih", &self.tsih)
            .finish_non_exhaustive()
    }
}

impl Core {
    pub(super) fn new(
        engine: EngineSession<CommandInfo>,
        reg: &crate::registry::Registration,
        remote: Option<Arc<crate::remote::RemoteNexus>>,
        params: iscsi_proto::params::SessionParams,
        isid: [u8; 6],
        tsih: u16,
        seal_shape: Option<(ipsan_seal::Cipher, u32)>,
    ) -> Self {
        Self {
            engine: Mutex::new(engine),
            links: Mutex::new(HashMap::new()),
            // The leading connection's socket has the whole buffer (sized at accept).
            send_share: ipsan_tcp::SendShare::default(),
            over: AtomicBool::new(false),
            cancel: reg.cancel.clone(),
            drained: reg.drained.clone(),
            stats: reg.stats.clone(),
            remote,
            params,
            isid,
            tsih,
            seal_shape,
            forwarded: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a connection with `cid` may join now; the login's refusal otherwise: 0x020a
    /// (RFC 7143 §11.13.5) when the session is ending, the engine's rule otherwise
    /// (`Session::admits`: 0x0206 beyond MaxConnections, an open CID reinstates).
    pub(crate) fn room(&self, cid: u16) -> Result<(), LoginFailure> {
        let e = lock(&self.engine);
        if self.over.load(Ordering::Acquire) {
            return Err(LoginFailure::new(
                LoginStatus::SESSION_DOES_NOT_EXIST,
                "the session is ending",
            ));
        }
        e.admits(cid)
    }

    /// Adds a connection whose login named this session: refused (`Ending`) once the session
    /// ended, so a login answered while the last connection left (or, at ErrorRecoveryLevel
    /// 2, while Time2Retain ran out) does not join a session nobody serves any more.
    pub(super) fn add_connection(
        &self,
        cfg: engine::Config,
        now: Instant,
        luns: &Luns<'_>,
    ) -> Result<iscsi_proto::engine::target::session::Added, AddError> {
        let mut e = lock(&self.engine);
        if self.over.load(Ordering::Acquire) {
            return Err(AddError::Ending);
        }
        e.add_connection(cfg, now, luns)
    }

    /// Open connections (for `ipsan ctl sessions` and the metrics).
    pub(crate) fn connections(&self) -> usize {
        lock(&self.engine).open_connections()
    }

    /// Connection `id` is the session's (logged in), and the path's send buffer is split
    /// across the session's connections again.
    pub(super) fn link(&self, id: ConnId, s: &Arc<Session>) {
        let mut links = lock(&self.links);
        links.insert(id, Arc::downgrade(s));
        self.share_send_buffers(&links, true);
    }

    /// Connection `id` left (its PDUs flushed): the others share the buffer it had.
    pub(super) fn unlink(&self, id: ConnId) {
        let mut links = lock(&self.links);
        links.remove(&id);
        self.share_send_buffers(&links, false);
    }

    /// Long paths: splits the path's send buffer across the session's connections sized for
    /// it (a read's Data-In is the target's to send; [`ipsan_tcp::SendShare::split`] says when
    /// and how: with the whole buffer each kept MBs of Data-In unsent behind a window no larger
    /// than its share, issue 28, docs/results/mcs-sweep-9).
    fn share_send_buffers(&self, links: &HashMap<ConnId, Weak<Session>>, added: bool) {
        let live: Vec<Arc<Session>> = links.values().filter_map(Weak::upgrade).collect();
        let fds: Vec<&std::os::fd::OwnedFd> =
            live.iter().filter_map(|s| s.send_share.as_ref()).collect();
        if let Some(n) = self.send_share.split(&fds, added) {
            tracing::debug!(
                tsih = self.tsih,
                connections = n,
                "send buffer split across the session's connections"
            );
        }
    }

    /// Wakes the reader and writer of the connections in `ids` other than `except`.
    fn wake(&self, ids: &[ConnId], except: ConnId) {
        if ids.iter().all(|i| *i == except) {
            return;
        }
        let links = lock(&self.links);
        for id in ids.iter().filter(|i| **i != except) {
            if let Some(s) = links.get(id).and_then(Weak::upgrade) {
                s.wake_writer.notify_one();
                s.wake_reader.notify_one();
            }
        }
    }

    /// Wakes every connection but `except` (the session is being cancelled, say).
    pub(super) fn wake_others(&self, except: ConnId) {
        let ids: Vec<ConnId> = lock(&self.links).keys().copied().collect();
        self.wake(&ids, except);
    }

    /// True for the one connection that finds none of the session's connections open any
    /// more: it ends the session (after that, nobody joins).
    pub(super) fn last_out(&self) -> bool {
        let e = lock(&self.engine);
        e.open_connections() == 0 && !self.over.swap(true, Ordering::AcqRel)
    }

    /// At ErrorRecoveryLevel 2, after a connection was removed: whether the session ends now
    /// (`Some(true)`: this caller ends it; nobody joins after), goes on with another
    /// connection (`Some(false)`), or waits with no connection for one to take its failed
    /// connections' tasks (`None`: tasks wait for TASK REASSIGN, RFC 7143 §7.2). `force`:
    /// end it even with tasks waiting (shutdown, reinstatement, `ipsan ctl session drop`).
    pub(super) fn ends_after_last(&self, force: bool) -> Option<bool> {
        let e = lock(&self.engine);
        if e.open_connections() > 0 {
            return Some(false);
        }
        if e.orphans() > 0 && !force {
            return None;
        }
        Some(!self.over.swap(true, Ordering::AcqRel))
    }
}

/// A connection removed from the engine reads as closed by the target.
const GONE: ConnectionError = ConnectionError {
    by: Side::Target,
    reason: CloseReason::Local,
};

/// The engine, locked, as connection `s` sees it.
pub(super) struct Eng<'a> {
    g: MutexGuard<'a, EngineSession<CommandInfo>>,
    s: &'a Session,
}

impl Drop for Eng<'_> {
    fn drop(&mut self) {
        let touched = self.g.take_touched();
        // Every lock of the engine ends here (several per PDU): the call only when an input
        // reached another connection.
        if !touched.is_empty() {
            self.s.core.wake(&touched, self.s.id);
        }
    }
}

impl<'a> Eng<'a> {
    pub(super) fn new(s: &'a Session) -> Self {
        Self {
            g: lock(&s.core.engine),
            s,
        }
    }

    fn conn(&self) -> Option<&engine::Connection<CommandInfo>> {
        self.g.connection(self.s.id)
    }

    pub(super) fn poll_transmit(&mut self) -> Option<Pdu> {
        self.g.poll_transmit(self.s.id)
    }

    /// This connection's ping reached the initiator (`engine::session::Session::flushed`).
    pub(super) fn flushed(&mut self, now: Instant) -> bool {
        self.g.flushed(self.s.id, now)
    }

    /// This connection's ping is on its way (`engine::session::Session::ping_leaving`).
    pub(super) fn ping_leaving(&self) -> bool {
        self.g.ping_leaving(self.s.id)
    }

    pub(super) fn poll_event(&mut self) -> Option<engine::Event<CommandInfo>> {
        self.g.poll_event_of(self.s.id)
    }

    pub(super) fn closed(&self) -> Option<ConnectionError> {
        self.conn().map_or(Some(GONE), engine::Connection::closed)
    }

    pub(super) fn queued_bytes(&self) -> usize {
        self.conn().map_or(0, engine::Connection::queued_bytes)
    }

    pub(super) fn has_transmit(&self) -> bool {
        self.conn().is_some_and(engine::Connection::has_transmit)
    }

    pub(super) fn is_running(&self, itt: u32) -> bool {
        self.conn().is_some_and(|c| c.is_running(itt))
    }

    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        self.g.poll_timeout()
    }

    pub(super) fn handle_pdu(&mut self, now: Instant, luns: &Luns<'_>, pdu: Pdu) {
        self.g.handle_pdu(self.s.id, now, luns, pdu);
    }

    pub(super) fn lend_write_buffer(&mut self, h: &DataOut, len: usize) -> Option<BytesMut> {
        self.g.lend_write_buffer(self.s.id, h, len)
    }

    pub(super) fn lend_command_buffer(
        &mut self,
        cmd: &ScsiCommand,
        len: usize,
    ) -> Option<BytesMut> {
        self.g.lend_command_buffer(self.s.id, cmd, len)
    }

    pub(super) fn awaits_data_out(&self) -> bool {
        self.g.awaits_data_out(self.s.id)
    }

    pub(super) fn handle_placed_data_out(
        &mut self,
        now: Instant,
        luns: &Luns<'_>,
        pdu: Pdu,
        data: BytesMut,
    ) {
        self.g
            .handle_placed_data_out(self.s.id, now, luns, pdu, data);
    }

    pub(super) fn handle_wire_error(&mut self, now: Instant, e: &WireError) {
        self.g.handle_wire_error(self.s.id, now, e);
    }

    pub(super) fn handle_timeout(&mut self, now: Instant) {
        let target = self.s.target();
        let luns = self.s.luns(target.as_deref());
        self.g.handle_timeout(now, &luns);
    }

    pub(super) fn close_locally(&mut self) {
        let target = self.s.target();
        let luns = self.s.luns(target.as_deref());
        self.g.close_connection(self.s.id, Instant::now(), &luns);
    }

    pub(super) fn peer_closed(&mut self) {
        let target = self.s.target();
        let luns = self.s.luns(target.as_deref());
        self.g.peer_closed(self.s.id, Instant::now(), &luns);
    }

    pub(super) fn request_logout(&mut self, within_secs: u16) {
        self.g.request_logout(self.s.id, within_secs);
    }

    pub(super) fn reset_done(&mut self, tmf_itt: u32, response: TmfResponse) -> bool {
        self.g.reset_done(self.s.id, tmf_itt, response)
    }

    pub(super) fn complete_with_residual(
        &mut self,
        itt: u32,
        resp: engine::Response,
        residual: Option<i64>,
    ) -> bool {
        self.g
            .complete_with_residual(self.s.id, itt, resp, residual)
    }

    /// Forgets this connection (closed, its PDUs flushed): its tasks' window slots go back.
    pub(super) fn remove(&mut self) {
        let target = self.s.target();
        let luns = self.s.luns(target.as_deref());
        self.g.remove(self.s.id, Instant::now(), &luns);
    }
}

/// What the registry keeps of a session (`crate::registry::SessionCore`): it joins logins to
/// it and counts its connections without depending on this driver.
impl crate::registry::SessionCore for Core {
    fn connections(&self) -> usize {
        Core::connections(self)
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
    }
}
