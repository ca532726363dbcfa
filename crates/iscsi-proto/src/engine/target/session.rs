//! The target's session of several connections (RFC 7143 §4.2, MaxConnections > 1; issue 28).
//!
//! ```text
//!  login with TSIH 0 ─► Session::new (the leading connection, the window, MaxConnections)
//!  login with TSIH   ─► Session::add_connection (same CID: connection reinstatement, §6.3.4)
//!  handle_pdu(conn) ─► CmdSN ahead of ExpCmdSN? hold it, and what follows it on that connection
//!                   ─► otherwise the connection's engine ([`Connection`]); then every held PDU
//!                      whose turn came runs, on its own connection
//!  poll_transmit(conn) ─► that connection's PDUs: its own StatSN, the session's ExpCmdSN and
//!                         MaxCmdSN (§4.2.2.2)
//! ```
//!
//! What is the session's and what is a connection's:
//! - **One CmdSN window** (§4.2.2.1): non-immediate commands from any connection run in CmdSN
//!   order. A command whose CmdSN is inside the window but ahead of ExpCmdSN waits (with every
//!   PDU after it on the same connection, whose order TCP gave) until the commands before it
//!   arrived on the other connections. The window's slots count the tasks of all connections,
//!   and every PDU of every connection carries the window as it is when the PDU leaves.
//! - **StatSN per connection** (§4.2.2.2), and **connection allegiance** (§4.2.3, §7.1.2): a
//!   task's R2Ts, Data-Out, Data-In and status stay on the connection its command came on,
//!   because the task lives in that connection's [`Connection`].
//! - **ITTs unique in the session** (§11.2.1.8): a command reusing the ITT of another
//!   connection's active task is rejected.
//! - Task management that reaches a LU or the target (ABORT TASK SET, CLEAR TASK SET,
//!   LOGICAL UNIT RESET, TARGET WARM/COLD RESET; §11.5.1) aborts the matching tasks of every
//!   connection. ABORT TASK is answered by the connection it arrives on, which must be the
//!   task's own (its allegiance); ipsan's initiator sends it there.
//! - A Logout closing one connection (reason 1, §11.14) ends that connection and leaves the
//!   session; one for another CID (connection cleanup) closes that one. A Logout closing the
//!   session closes every connection once it is answered.
//!
//! PDUs received on a connection that then closes (lost, reinstated, logged out) before their
//! turn came never run: at ErrorRecoveryLevel 0 their CmdSNs count as received (the initiator
//! learns of them with the connection's failure), so the window moves on. Commands that never
//! arrived at all (sent on a connection that died) leave a gap only ErrorRecoveryLevel 2
//! repairs; at level 0 the initiator recovers the session.
//!
//! At ErrorRecoveryLevel 2 a failed connection's tasks stay in the session for TASK REASSIGN
//! ([`orphans`]), and the commands it held are retried by the initiator with their CmdSNs.
//!
//! Each connection's engine keeps the [`CmdWindow`] field it has alone; while the session hands
//! it an input, the session's window is swapped into it, so the engine's own admission and
//! stamping run on the one window, unchanged. A session of one connection
//! (MaxConnections=1) behaves exactly as its [`Connection`] alone.

use std::collections::{HashSet, VecDeque};
use std::time::Instant;

use bytes::BytesMut;
use iscsi_wire::header::{DataOut, ScsiCommand, TmfFunction, TmfResponse};
use iscsi_wire::{Header, Pdu, WireError, RESERVED_TAG};

use super::{Config, Connection, Event, LunDirectory, Response};
use crate::engine::{CloseReason, PeerTagMap, Side, Violation};
use crate::login::{LoginFailure, LoginStatus};
use crate::params::SessionParams;
use crate::seq::{sn_le, sn_lt, Admit, CmdWindow};

mod orphans;

/// A connection of a [`Session`]: stable while it lives, never reused (a CID is the
/// initiator's name for it and may come back with a reinstated connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(u32);

/// Why a connection cannot join the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AddError {
    /// The session has MaxConnections connections (the login answers Too many connections,
    /// 0x0206, RFC 7143 §11.13.5).
    #[error("the session has its {max} connections (MaxConnections)")]
    TooManyConnections { max: u32 },
    /// The session is logging out.
    #[error("the session is logging out")]
    Ending,
}

impl AddError {
    /// The refusal a login that cannot join answers with (RFC 7143 §11.13.5): 0x0206 "too
    /// many connections" at MaxConnections, 0x020a "session does not exist" for a session
    /// that is ending. A driver adds the connection before it sends the login's final
    /// response, so a connection that cannot join is refused, not answered and then closed.
    #[must_use]
    pub fn login_failure(&self) -> LoginFailure {
        let status = match self {
            Self::TooManyConnections { .. } => LoginStatus::TOO_MANY_CONNECTIONS,
            Self::Ending => LoginStatus::SESSION_DOES_NOT_EXIST,
        };
        LoginFailure::new(status, self.to_string())
    }
}

/// A connection that joined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Added {
    pub id: ConnId,
    /// The connection with the same CID it replaces (connection reinstatement, RFC 7143
    /// §6.3.4): closed now; the driver drains and removes it.
    pub reinstated: Option<ConnId>,
}

/// PDUs one connection may have held behind a CmdSN gap, at most (bytes of data, count).
const MAX_HELD_BYTES: usize = 64 << 20;
const MAX_HELD_PDUS: usize = 1 << 16;

#[derive(Debug)]
struct Member<D> {
    id: ConnId,
    conn: Connection<D>,
    /// PDUs received and waiting for their CmdSN's turn, in arrival order.
    held: VecDeque<Pdu>,
    held_bytes: usize,
    /// Its tasks went to the orphans (ErrorRecoveryLevel 2).
    orphaned: bool,
}

/// A target session: its connections and its one CmdSN window. `D` as in [`Connection`].
#[derive(Debug)]
pub struct Session<D = ()> {
    /// The leading login's values: session-wide keys for every connection.
    params: SessionParams,
    window: CmdWindow,
    max_connections: u32,
    members: Vec<Member<D>>,
    next_id: u32,
    /// CmdSNs received on connections that closed before their turn: count as received.
    vacated: HashSet<u32>,
    /// The connection answering a Logout that closes the session.
    ending: Option<ConnId>,
    /// Connections an input reached since [`Session::take_touched`].
    touched: Vec<ConnId>,
    /// Which connection each event not yet polled came from, in the order they happened
    /// (commands of several connections run in CmdSN order: so do their events).
    order: VecDeque<ConnId>,
    /// Tasks of failed connections waiting for TASK REASSIGN, by ITT (ErrorRecoveryLevel 2).
    /// Keyed by the initiator's ITTs ([`crate::engine::PeerTags`]), at most
    /// [`orphans::MAX_ORPHANS`].
    orphans: PeerTagMap<orphans::Orphan<D>>,
    /// Running tasks reassigned to another connection: the connection the driver knows each
    /// by, and where it is now.
    /// (Keyed as `orphans`; each entry is a task of some connection's bounded table.)
    moved: PeerTagMap<(ConnId, ConnId)>,
    /// Events of the session itself (an expired orphan's abort), for the connection the driver
    /// knows the task by.
    own_events: VecDeque<(ConnId, Event<D>)>,
    /// The latest time an input brought.
    clock: Instant,
}

/// The CmdSN of a PDU the window orders (a non-immediate request), `None` for the others.
fn ordered(h: &Header) -> Option<u32> {
    match h {
        Header::ScsiCommand(c) if !c.immediate => Some(c.cmd_sn),
        Header::TaskMgmtRequest(t) if !t.immediate => Some(t.cmd_sn),
        // A NOP-Out answering our ping carries no CmdSN to admit (§11.18.3).
        Header::NopOut(n) if !n.immediate && n.itt != RESERVED_TAG => Some(n.cmd_sn),
        Header::TextRequest(t) if !t.immediate => Some(t.cmd_sn),
        Header::LogoutRequest(l) if !l.immediate => Some(l.cmd_sn),
        _ => None,
    }
}

impl<D> Session<D> {
    /// The session of a leading login (TSIH 0): its first connection, the window from `cfg`
    /// (`initial_cmd_sn`, `cmd_window`), and MaxConnections as negotiated
    /// (`cfg.params.max_connections`, RFC 7143 §13.2).
    #[must_use]
    pub fn new(cfg: Config, now: Instant) -> (Self, ConnId) {
        let id = ConnId(0);
        let s = Self {
            params: cfg.params.clone(),
            window: CmdWindow::new(cfg.initial_cmd_sn, cfg.cmd_window),
            max_connections: cfg.params.max_connections.max(1),
            members: vec![Member {
                id,
                conn: Connection::carrying(cfg, now),
                held: VecDeque::new(),
                held_bytes: 0,
                orphaned: false,
            }],
            next_id: 1,
            vacated: HashSet::new(),
            ending: None,
            touched: Vec::new(),
            order: VecDeque::new(),
            orphans: PeerTagMap::default(),
            moved: PeerTagMap::default(),
            own_events: VecDeque::new(),
            clock: now,
        };
        (s, id)
    }

    /// A login with the session's ISID and TSIH completed (RFC 7143 §5.3.4): the connection
    /// joins. Session-wide values are the leading login's; the connection's own (digests,
    /// MaxRecvDataSegmentLength, vendor keys such as Seal's) come from `cfg.params`. A
    /// connection with the CID of a live one reinstates it (§6.3.4): the old one is closed.
    /// The caller checked who logs in (same initiator, ISID and target; authenticated).
    pub fn add_connection(
        &mut self,
        mut cfg: Config,
        now: Instant,
        dir: &dyn LunDirectory<D>,
    ) -> Result<Added, AddError> {
        if self.ending.is_some() {
            return Err(AddError::Ending);
        }
        self.clock = self.clock.max(now);
        let same = self
            .members
            .iter()
            .position(|m| m.conn.closed.is_none() && m.conn.cid == cfg.cid);
        let alive = self
            .members
            .iter()
            .filter(|m| m.conn.closed.is_none())
            .count();
        let others = alive - usize::from(same.is_some());
        if others >= self.max_connections as usize {
            return Err(AddError::TooManyConnections {
                max: self.max_connections,
            });
        }
        let mut params = self.params.clone();
        params.header_digest = cfg.params.header_digest;
        params.data_digest = cfg.params.data_digest;
        params.initiator_max_recv_data_segment_length =
            cfg.params.initiator_max_recv_data_segment_length;
        params.target_max_recv_data_segment_length = cfg.params.target_max_recv_data_segment_length;
        params.extensions = std::mem::take(&mut cfg.params.extensions);
        cfg.params = params;
        let reinstated = same.map(|i| {
            self.with(i, Connection::close_locally);
            self.members[i].id
        });
        let id = ConnId(self.next_id);
        self.next_id = self.next_id.wrapping_add(1);
        self.members.push(Member {
            id,
            conn: Connection::carrying(cfg, now),
            held: VecDeque::new(),
            held_bytes: 0,
            orphaned: false,
        });
        self.update_siblings();
        self.drain(now, dir);
        Ok(Added { id, reinstated })
    }

    /// Forgets a connection the driver is done with (closed, its PDUs flushed). Tasks it still
    /// had give their window slots back; their answers can go nowhere.
    pub fn remove(&mut self, id: ConnId, now: Instant, dir: &dyn LunDirectory<D>) {
        let Some(i) = self.index(id) else {
            return;
        };
        self.clock = self.clock.max(now);
        self.with(i, Connection::close_locally);
        self.collect_orphans();
        self.vacate(i);
        let m = self.members.remove(i);
        self.order.retain(|x| *x != id);
        for _ in 0..m.conn.counted_tasks() {
            self.window.complete();
        }
        self.update_siblings();
        self.drain(now, dir);
    }

    // ---- getters ----

    /// The session-wide values (the leading login's).
    #[must_use]
    pub fn params(&self) -> &SessionParams {
        &self.params
    }

    /// The session's command window.
    #[must_use]
    pub fn window(&self) -> &CmdWindow {
        &self.window
    }

    /// MaxConnections in force.
    #[must_use]
    pub fn max_connections(&self) -> u32 {
        self.max_connections
    }

    /// The connections, open or closed and not removed yet: id and CID.
    pub fn connections(&self) -> impl Iterator<Item = (ConnId, u16)> + '_ {
        self.members.iter().map(|m| (m.id, m.conn.cid))
    }

    /// Connections not closed.
    #[must_use]
    pub fn open_connections(&self) -> usize {
        self.members
            .iter()
            .filter(|m| m.conn.closed.is_none())
            .count()
    }

    /// Whether an open connection has this CID: a login with it reinstates that connection
    /// (RFC 7143 §6.3.4) rather than adding one.
    #[must_use]
    pub fn has_open_cid(&self, cid: u16) -> bool {
        self.members
            .iter()
            .any(|m| m.conn.closed.is_none() && m.conn.cid == cid)
    }

    /// Whether a login on connection `cid` may join the session now: the CID of an open
    /// connection reinstates it (RFC 7143 §6.3.4), which a full session allows; another
    /// connection beyond MaxConnections is refused with 0x0206 "too many connections"
    /// (§11.13.5).
    pub fn admits(&self, cid: u16) -> Result<(), LoginFailure> {
        let max = self.max_connections;
        if self.open_connections() >= max as usize && !self.has_open_cid(cid) {
            return Err(LoginFailure::new(
                LoginStatus::TOO_MANY_CONNECTIONS,
                format!("the session has its {max} connections (MaxConnections)"),
            ));
        }
        Ok(())
    }

    /// One connection's engine, to read (its [`Connection::window`] is not the session's:
    /// see [`Session::window`]).
    #[must_use]
    pub fn connection(&self, id: ConnId) -> Option<&Connection<D>> {
        self.index(id).map(|i| &self.members[i].conn)
    }

    /// PDUs held on a connection behind a CmdSN gap.
    #[must_use]
    pub fn held(&self, id: ConnId) -> usize {
        self.index(id).map_or(0, |i| self.members[i].held.len())
    }

    // ---- outputs ----

    /// The next PDU to send on connection `id`, stamped with its StatSN and the session's
    /// ExpCmdSN and MaxCmdSN.
    pub fn poll_transmit(&mut self, id: ConnId) -> Option<Pdu> {
        let i = self.index(id)?;
        self.with(i, Connection::poll_transmit)
    }

    /// The next thing for the driver to do, and the connection it concerns, in the order
    /// things happened across the connections (Execute events in CmdSN order).
    pub fn poll_event(&mut self) -> Option<(ConnId, Event<D>)> {
        if let Some(e) = self.own_events.pop_front() {
            return Some(e);
        }
        while let Some(id) = self.order.pop_front() {
            if let Some(ev) = self.index(id).and_then(|i| self.pop_event(i)) {
                return Some((id, ev));
            }
        }
        // Events of a session that had one connection when they happened.
        (0..self.members.len()).find_map(|i| self.pop_event(i).map(|e| (self.members[i].id, e)))
    }

    /// The next thing for the driver to do on connection `id` (a driver with a task per
    /// connection), in the order it happened on that connection.
    pub fn poll_event_of(&mut self, id: ConnId) -> Option<Event<D>> {
        // The session's own events (an expired orphan's abort) go to the connection the
        // driver knows the task by, or to any connection once that one is closed (its driver
        // reads no more events: it waits for its commands, the one to abort among them) or
        // gone.
        let own = self.own_events.iter().position(|(c, _)| {
            *c == id
                || self
                    .index(*c)
                    .is_none_or(|i| self.members[i].conn.closed.is_some())
        });
        if let Some(k) = own {
            return self.own_events.remove(k).map(|(_, e)| e);
        }
        let i = self.index(id)?;
        let ev = self.pop_event(i)?;
        if let Some(k) = self.order.iter().position(|x| *x == id) {
            self.order.remove(k);
        }
        Some(ev)
    }

    /// The connections that inputs reached since the last call (a command that arrived on one
    /// connection lets held ones run on others; task management and logouts reach others): a
    /// driver wakes their readers and writers. Empty while the session has one connection.
    pub fn take_touched(&mut self) -> Vec<ConnId> {
        std::mem::take(&mut self.touched)
    }

    /// When [`Session::handle_timeout`] wants to run next.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.members
            .iter()
            .filter_map(|m| m.conn.poll_timeout())
            .chain(self.orphan_deadline())
            .min()
    }

    // ---- inputs ----

    /// One PDU from connection `id`.
    pub fn handle_pdu(&mut self, id: ConnId, now: Instant, dir: &dyn LunDirectory<D>, pdu: Pdu) {
        let Some(i) = self.index(id) else {
            return;
        };
        self.clock = self.clock.max(now);
        if self.members[i].conn.closed.is_some() {
            return;
        }
        if self.bypasses_held(&pdu.header) {
            self.deliver(i, now, dir, pdu);
        } else if !self.members[i].held.is_empty() || self.waits(&pdu.header) {
            self.hold(i, now, pdu);
        } else {
            self.deliver(i, now, dir, pdu);
        }
        self.drain(now, dir);
    }

    /// Connection `id`'s [`Connection::lend_write_buffer`]: `None` while PDUs wait on it for
    /// commands before them (a Data-Out behind them waits too, with its data).
    pub fn lend_write_buffer(&mut self, id: ConnId, h: &DataOut, len: usize) -> Option<BytesMut> {
        let i = self.index(id)?;
        let m = &mut self.members[i];
        if !m.held.is_empty() {
            return None;
        }
        m.conn.lend_write_buffer(h, len)
    }

    /// Connection `id`'s [`Connection::lend_command_buffer`]: `None` while PDUs wait on it,
    /// or when this command would wait for its CmdSN's turn (held with its data).
    pub fn lend_command_buffer(
        &mut self,
        id: ConnId,
        cmd: &ScsiCommand,
        len: usize,
    ) -> Option<BytesMut> {
        let i = self.index(id)?;
        if !self.members[i].held.is_empty() || self.waits(&Header::ScsiCommand(cmd.clone())) {
            return None;
        }
        self.members[i].conn.lend_command_buffer(cmd, len)
    }

    /// Connection `id`'s [`Connection::awaits_data_out`].
    #[must_use]
    pub fn awaits_data_out(&self, id: ConnId) -> bool {
        self.index(id)
            .is_some_and(|i| self.members[i].conn.awaits_data_out())
    }

    /// A Data-Out on connection `id` whose data was received into the buffer
    /// [`Session::lend_write_buffer`] lent ([`Connection::handle_placed_data_out`]).
    pub fn handle_placed_data_out(
        &mut self,
        id: ConnId,
        now: Instant,
        dir: &dyn LunDirectory<D>,
        pdu: Pdu,
        data: BytesMut,
    ) {
        let Some(i) = self.index(id) else {
            return;
        };
        if !self.members[i].held.is_empty() {
            // Not lent for while PDUs wait: as any PDU.
            let pdu = Pdu::new(pdu.header, data.freeze());
            self.handle_pdu(id, now, dir, pdu);
            return;
        }
        self.clock = self.clock.max(now);
        if self.members[i].conn.closed.is_some() {
            return;
        }
        self.with(i, |c| c.handle_placed_data_out(now, pdu, data));
        self.drain(now, dir);
    }

    /// Time passed, for every connection.
    pub fn handle_timeout(&mut self, now: Instant, dir: &dyn LunDirectory<D>) {
        self.clock = self.clock.max(now);
        for i in 0..self.members.len() {
            self.with(i, |c| c.handle_timeout(now));
        }
        self.drain(now, dir);
        self.expire_orphans(now, dir);
    }

    /// A PDU of connection `id` that could not be decoded ([`Connection::handle_wire_error`]).
    pub fn handle_wire_error(&mut self, id: ConnId, now: Instant, e: &WireError) {
        if let Some(i) = self.index(id) {
            self.with(i, |c| c.handle_wire_error(now, e));
        }
    }

    /// The initiator closed connection `id`, or its socket failed.
    pub fn peer_closed(&mut self, id: ConnId, now: Instant, dir: &dyn LunDirectory<D>) {
        self.clock = self.clock.max(now);
        if let Some(i) = self.index(id) {
            self.with(i, Connection::peer_closed);
            self.drain(now, dir);
        }
    }

    /// The driver ends connection `id` (shutdown, Seal limits).
    pub fn close_connection(&mut self, id: ConnId, now: Instant, dir: &dyn LunDirectory<D>) {
        if let Some(i) = self.index(id) {
            self.with(i, Connection::close_locally);
            self.drain(now, dir);
        }
    }

    /// Connection `id`'s ping was handed out and not yet reported delivered
    /// ([`Connection::ping_leaving`]).
    #[must_use]
    pub fn ping_leaving(&self, id: ConnId) -> bool {
        self.index(id)
            .is_some_and(|i| self.members[i].conn.ping_leaving())
    }

    /// Connection `id`'s ping reached the initiator ([`Connection::flushed`]); true when its
    /// keepalive's deadline moved earlier.
    pub fn flushed(&mut self, id: ConnId, now: Instant) -> bool {
        self.index(id)
            .is_some_and(|i| self.members[i].conn.flushed(now))
    }

    /// Asks the initiator to log out, on connection `id` ([`Connection::request_logout`]).
    pub fn request_logout(&mut self, id: ConnId, within_secs: u16) {
        if let Some(i) = self.index(id) {
            self.with(i, |c| c.request_logout(within_secs));
        }
    }

    /// The answer to an [`Event::Execute`] of connection `id` ([`Connection::complete`]).
    pub fn complete(&mut self, id: ConnId, itt: u32, resp: Response) -> bool {
        self.complete_with_residual(id, itt, resp, None)
    }

    /// [`Connection::complete_with_residual`] on connection `id`.
    pub fn complete_with_residual(
        &mut self,
        id: ConnId,
        itt: u32,
        resp: Response,
        residual: Option<i64>,
    ) -> bool {
        self.collect_orphans();
        // Nothing moved or orphaned (as ever below ErrorRecoveryLevel 2): the task can only
        // be this connection's, which ignores a tag it does not run. Asked first otherwise.
        let elsewhere = !self.orphans.is_empty() || !self.moved.is_empty();
        let here = self
            .index(id)
            .filter(|&i| !elsewhere || self.members[i].conn.is_running(itt));
        if here.is_none() {
            if let Some(done) = self.complete_elsewhere(id, itt, resp.clone(), residual) {
                return done;
            }
        }
        let Some(i) = here.or_else(|| self.index(id)) else {
            return false;
        };
        self.with(i, |c| c.complete_with_residual(itt, resp, residual))
    }

    /// [`Connection::reset_done`] on connection `id`.
    pub fn reset_done(&mut self, id: ConnId, tmf_itt: u32, response: TmfResponse) -> bool {
        let Some(i) = self.index(id) else {
            return false;
        };
        self.with(i, |c| c.reset_done(tmf_itt, response))
    }

    // ---- internals ----

    fn pop_event(&mut self, i: usize) -> Option<Event<D>> {
        let ev = self.members[i].conn.poll_event()?;
        if matches!(ev, Event::Closed(_)) && self.ending == Some(self.members[i].id) {
            // The session's Logout was answered: every other connection ends too.
            for j in 0..self.members.len() {
                if j != i {
                    self.with(j, |c| c.close(Side::Initiator, CloseReason::Logout));
                }
            }
        }
        Some(ev)
    }

    fn index(&self, id: ConnId) -> Option<usize> {
        self.members.iter().position(|m| m.id == id)
    }

    /// Runs `f` on connection `i` with the session's window in it.
    fn with<R>(&mut self, i: usize, f: impl FnOnce(&mut Connection<D>) -> R) -> R {
        let Self {
            window,
            members,
            touched,
            order,
            ..
        } = self;
        let several = members.len() > 1;
        let m = &mut members[i];
        if several && !touched.contains(&m.id) {
            touched.push(m.id);
        }
        let before = m.conn.events.len();
        std::mem::swap(window, &mut m.conn.window);
        let r = f(&mut m.conn);
        std::mem::swap(window, &mut m.conn.window);
        if several {
            for _ in before..m.conn.events.len() {
                order.push_back(m.id);
            }
        }
        r
    }

    /// At ErrorRecoveryLevel 2, a held command whose turn it is behind a later one on the same
    /// connection: a command the initiator retried (§6.2.1) after sending later ones there.
    fn retried_at(&self, i: usize) -> Option<usize> {
        if self.params.error_recovery_level < 2 {
            return None;
        }
        let exp = self.window.exp_cmd_sn();
        self.members[i]
            .held
            .iter()
            .position(|p| ordered(&p.header) == Some(exp))
    }

    fn update_siblings(&mut self) {
        let recoverable = self.recoverable_cids();
        let cids: Vec<(ConnId, u16)> = self
            .members
            .iter()
            .filter(|m| m.conn.closed.is_none())
            .map(|m| (m.id, m.conn.cid))
            .collect();
        for m in &mut self.members {
            m.conn.siblings = cids
                .iter()
                .filter(|(id, _)| *id != m.id)
                .map(|(_, cid)| *cid)
                .collect();
            m.conn.recoverable.clone_from(&recoverable);
        }
    }

    /// Whether a PDU must wait for the commands before it: ordered, in the window, ahead of
    /// ExpCmdSN. Outside the window it goes on, to be ignored (§4.2.2.1).
    fn waits(&self, h: &Header) -> bool {
        if self.max_connections <= 1 {
            return false;
        }
        ordered(h).is_some_and(|sn| {
            sn_lt(self.window.exp_cmd_sn(), sn) && sn_le(sn, self.window.max_cmd_sn())
        })
    }

    fn hold(&mut self, i: usize, now: Instant, pdu: Pdu) {
        let total: usize = self.members.iter().map(|m| m.held_bytes).sum();
        let m = &mut self.members[i];
        // The peer is alive: what it sent counts for the keepalive (and a ping's answer).
        m.conn.heard(now);
        if m.held.len() >= MAX_HELD_PDUS || total + pdu.data.len() > MAX_HELD_BYTES {
            let held = m.held_bytes;
            let waiting_for = self.window.exp_cmd_sn();
            self.with(i, |c| {
                c.close(
                    Side::Initiator,
                    CloseReason::Violation(Violation::CmdSnGap { waiting_for, held }),
                );
            });
            return;
        }
        m.held_bytes += pdu.data.len();
        m.held.push_back(pdu);
    }

    /// Hands a PDU whose turn it is to its connection's engine, and what the session adds:
    /// session-wide ITTs, task management across connections, logouts of other connections.
    fn deliver(&mut self, i: usize, now: Instant, dir: &dyn LunDirectory<D>, pdu: Pdu) {
        let admitted = match ordered(&pdu.header) {
            Some(sn) => sn == self.window.exp_cmd_sn(),
            None => true,
        };
        if let Header::ScsiCommand(cmd) = &pdu.header {
            let elsewhere = self
                .members
                .iter()
                .enumerate()
                .any(|(j, m)| j != i && m.conn.closed.is_none() && m.conn.has_task(cmd.itt))
                || self.itt_reused(i, cmd.itt);
            if elsewhere {
                let (cmd, raw) = (cmd.clone(), *pdu.raw_bhs());
                self.with(i, |c| c.reject_command(&cmd, &raw));
                return;
            }
        }
        let tmf = match &pdu.header {
            Header::TaskMgmtRequest(t) if admitted => Some((t.function, t.lun)),
            _ => None,
        };
        if let Header::TaskMgmtRequest(t) = &pdu.header {
            if self.params.error_recovery_level >= 2 {
                if t.function == TmfFunction::TASK_REASSIGN && self.reassign(i, t) {
                    return;
                }
                if t.function == TmfFunction::ABORT_TASK
                    && self.abort_orphan(dir, t.referenced_task_tag)
                {
                    self.with(i, |c| c.answer_tmf(t, TmfResponse::FUNCTION_COMPLETE));
                    return;
                }
            }
        }
        self.with(i, |c| c.handle_pdu(now, dir, pdu));
        if let Some((function, lun)) = tmf {
            self.tmf_elsewhere(i, dir, function, lun);
        }
        match self.members[i].conn.logout_of.take() {
            Some(Some(cid)) => {
                let other = self
                    .members
                    .iter()
                    .enumerate()
                    .position(|(j, m)| j != i && m.conn.closed.is_none() && m.conn.cid == cid);
                if let Some(j) = other {
                    self.with(j, |c| c.close(Side::Initiator, CloseReason::Logout));
                    self.update_siblings();
                }
            }
            Some(None) => self.ending = Some(self.members[i].id),
            None => {}
        }
        if let Some(cid) = self.members[i].conn.recovery_of.take() {
            let other = self
                .members
                .iter()
                .enumerate()
                .position(|(j, m)| j != i && m.conn.closed.is_none() && m.conn.cid == cid);
            if let Some(j) = other {
                self.members[j].conn.for_recovery = true;
                self.with(j, |c| c.close(Side::Initiator, CloseReason::Logout));
                self.update_siblings();
            }
        }
    }

    /// A task management function that reaches a LU or the whole target (§11.5.1), admitted on
    /// connection `i`: the tasks of the other connections it covers are aborted too (their
    /// answers suppressed; pass-through ones forwarded as [`Event::Abort`] on their connection).
    fn tmf_elsewhere(&mut self, i: usize, dir: &dyn LunDirectory<D>, f: TmfFunction, lun: u64) {
        let all = matches!(
            f,
            TmfFunction::TARGET_WARM_RESET | TmfFunction::TARGET_COLD_RESET
        );
        let lu = matches!(
            f,
            TmfFunction::ABORT_TASK_SET
                | TmfFunction::CLEAR_TASK_SET
                | TmfFunction::LOGICAL_UNIT_RESET
        );
        if !(all || (lu && dir.exists(lun))) {
            return;
        }
        self.tmf_orphans(dir, all, lun);
        for j in 0..self.members.len() {
            if j == i {
                continue;
            }
            self.with(j, |c| {
                let w = c.abort_where(|_, t| all || t.lun == lun);
                c.forward_aborts(dir, &w);
                if f == TmfFunction::TARGET_COLD_RESET {
                    c.close(Side::Initiator, CloseReason::ColdReset);
                }
            });
        }
    }

    /// A closed connection's held PDUs never run: their CmdSNs count as received, except on a
    /// failed connection at ErrorRecoveryLevel 2, whose commands the initiator retries.
    fn vacate(&mut self, i: usize) {
        let retried = self.params.error_recovery_level >= 2 && self.members[i].conn.failed();
        let m = &mut self.members[i];
        for pdu in m.held.drain(..) {
            if let Some(sn) = ordered(&pdu.header).filter(|_| !retried) {
                self.vacated.insert(sn);
            }
        }
        m.held_bytes = 0;
    }

    /// Runs every held PDU whose turn came, until none did.
    fn drain(&mut self, now: Instant, dir: &dyn LunDirectory<D>) {
        self.collect_orphans();
        if self.vacated.is_empty() && self.members.iter().all(|m| m.held.is_empty()) {
            // Nothing held, nothing vacated (every input of a session of one connection):
            // the loop below would find nothing to run.
            return;
        }
        loop {
            let mut progress = false;
            for i in 0..self.members.len() {
                if self.members[i].conn.closed.is_some() && !self.members[i].held.is_empty() {
                    self.vacate(i);
                }
            }
            while !self.vacated.is_empty() && self.vacated.remove(&self.window.exp_cmd_sn()) {
                let sn = self.window.exp_cmd_sn();
                if self.window.admit(sn, false) == Admit::Execute {
                    self.window.complete();
                }
                progress = true;
            }
            for i in 0..self.members.len() {
                loop {
                    let ready = match self.members[i].held.front() {
                        Some(p) => !self.waits(&p.header),
                        None => false,
                    };
                    let at = if ready { Some(0) } else { self.retried_at(i) };
                    let Some(pdu) = at.and_then(|k| self.members[i].held.remove(k)) else {
                        break;
                    };
                    let m = &mut self.members[i];
                    m.held_bytes = m.held_bytes.saturating_sub(pdu.data.len());
                    if m.conn.closed.is_some() {
                        // Closed by what ran before it: never runs, counts as received (unless
                        // the initiator retries it, ErrorRecoveryLevel 2).
                        let retried = self.params.error_recovery_level >= 2 && m.conn.failed();
                        if let Some(sn) = ordered(&pdu.header).filter(|_| !retried) {
                            self.vacated.insert(sn);
                        }
                        continue;
                    }
                    self.deliver(i, now, dir, pdu);
                    progress = true;
                }
            }
            if !progress {
                break;
            }
        }
        // CmdSNs the window passed can never come up again.
        let exp = self.window.exp_cmd_sn();
        self.vacated.retain(|sn| !sn_lt(*sn, exp));
    }
}
