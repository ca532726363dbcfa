//! Reservations: RESERVE(6)/RELEASE(6) (SPC-2 §5.5.1) and persistent reservations
//! (SPC-4 §5.13, PERSISTENT RESERVE IN §6.15, OUT §6.16).
//!
//! The semantics are written once, here, as functions over a [`PrState`]; where the state
//! lives is a [`PrStore`]: [`MemPrStore`] keeps it in the target's memory (mem/file LUNs),
//! the RBD backend keeps it in a RADOS object next to the image so every target serving the
//! image sees one state (docs/rbd.md). Updates are compare-and-swap on a version: the LU
//! loads the state, applies the command and stores it back only if nobody else stored in
//! between, else it starts over. APTPL is not supported (PTPL_C = 0).

use std::fmt;
use std::io;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use ipsan_block::{Backend, SharedRecord};

use crate::cdb::{Command, PrOut};
use crate::response::{NexusId, ScsiResponse};
use crate::sense::{ScsiStatus, Sense};

/// Reservation types (SPC-4 table 185).
pub mod kind {
    /// Write Exclusive.
    pub const WE: u8 = 1;
    /// Exclusive Access.
    pub const EA: u8 = 3;
    /// Write Exclusive – Registrants Only.
    pub const WE_RO: u8 = 5;
    /// Exclusive Access – Registrants Only.
    pub const EA_RO: u8 = 6;
    /// Write Exclusive – All Registrants.
    pub const WE_AR: u8 = 7;
    /// Exclusive Access – All Registrants.
    pub const EA_AR: u8 = 8;
}

fn valid_kind(k: u8) -> bool {
    matches!(k, 1 | 3 | 5 | 6 | 7 | 8)
}
fn all_registrants(k: u8) -> bool {
    matches!(k, kind::WE_AR | kind::EA_AR)
}

/// An I_T nexus as reservations see it (SAM-5 §4.6): the initiator port and the target
/// port (its RELATIVE TARGET PORT IDENTIFIER). Two targets serving one RBD image are two
/// target ports of one device, so the same initiator port through each is two nexuses.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct ItNexus {
    /// The initiator port (`"iqn...,i,0x<isid>"`).
    pub initiator: NexusId,
    /// The relative target port identifier.
    pub port: u16,
}

/// The persistent reservation held on the LU.
#[derive(Clone, PartialEq, Eq, Debug)]
struct Reservation {
    holder: ItNexus,
    kind: u8,
}

/// Registrations, the persistent reservation and the RESERVE(6) holder.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct PrState {
    generation: u32,
    registrations: Vec<(ItNexus, u64)>,
    reservation: Option<Reservation>,
    reserve6: Option<ItNexus>,
}

/// A unit attention a reservation change owes another nexus.
pub type PendingUa = (ItNexus, u8, u8);

/// Where the reservation state lives. `version` counts stores: [`PrStore::store`] succeeds
/// only when the stored state is still at `expected`, so two writers (two targets serving one
/// shared image) never lose each other's update.
pub trait PrStore: Send + Sync + fmt::Debug {
    /// The state for access checks, run before every command: may come from a cache, but
    /// must never be older than the last [`PrStore::store`] that returned (anywhere).
    fn current(&self) -> io::Result<Arc<PrState>>;
    /// The state as stored now, and its version, for PERSISTENT RESERVE IN/OUT.
    fn load(&self) -> io::Result<(Arc<PrState>, u64)>;
    /// Replaces the state at version `expected` with `new`; `Ok(false)` when the stored
    /// version moved on (reload and retry).
    fn store(&self, new: &PrState, expected: u64) -> io::Result<bool>;
}

/// The state in the target's memory: a LUN on a store only this target serves.
#[derive(Debug, Default)]
pub struct MemPrStore {
    state: Mutex<(Arc<PrState>, u64)>,
}

impl MemPrStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, (Arc<PrState>, u64)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl PrStore for MemPrStore {
    fn current(&self) -> io::Result<Arc<PrState>> {
        Ok(self.lock().0.clone())
    }
    fn load(&self) -> io::Result<(Arc<PrState>, u64)> {
        Ok(self.lock().clone())
    }
    fn store(&self, new: &PrState, expected: u64) -> io::Result<bool> {
        let mut g = self.lock();
        if g.1 != expected {
            return Ok(false);
        }
        *g = (Arc::new(new.clone()), expected.wrapping_add(1));
        Ok(true)
    }
}

/// The state in a backend's [`SharedRecord`] (an RBD image's record object), which every
/// target serving the store sees: [`PrState::encode`]'s text as the record's bytes. The
/// decoded state is kept while the record hands back the same bytes, so the access check of
/// every command decodes only after a change.
#[derive(Debug)]
pub struct RecordPrStore {
    record: Arc<dyn SharedRecord>,
    /// The record's last contents and the state decoded from them.
    decoded: Mutex<Option<Decoded>>,
}

type Decoded = (Arc<[u8]>, Arc<PrState>);

impl RecordPrStore {
    /// Reservations kept in `record`.
    pub fn new(record: Arc<dyn SharedRecord>) -> Self {
        Self {
            record,
            decoded: Mutex::new(None),
        }
    }
}

impl PrStore for RecordPrStore {
    fn current(&self) -> io::Result<Arc<PrState>> {
        let bytes = self.record.current()?;
        let mut g = self.decoded.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((b, st)) = g.as_ref() {
            if Arc::ptr_eq(b, &bytes) {
                return Ok(st.clone());
            }
        }
        let st = Arc::new(PrState::decode(&bytes)?);
        *g = Some((bytes, st.clone()));
        Ok(st)
    }
    fn load(&self) -> io::Result<(Arc<PrState>, u64)> {
        let (bytes, version) = self.record.load()?;
        Ok((Arc::new(PrState::decode(&bytes)?), version))
    }
    fn store(&self, new: &PrState, expected: u64) -> io::Result<bool> {
        self.record.store(&new.encode(), expected)
    }
}

/// Where a backend keeps reservations: in its [`SharedRecord`] when it has one (a store
/// several targets serve), else `None` (the LU keeps them in memory, [`MemPrStore`]).
pub trait BackendPr {
    /// The backend's shared reservation store, if any.
    fn pr_store(&self) -> Option<Arc<dyn PrStore>>;
}

impl<B: Backend + ?Sized> BackendPr for B {
    fn pr_store(&self) -> Option<Arc<dyn PrStore>> {
        self.shared_record()
            .map(|r| Arc::new(RecordPrStore::new(r)) as Arc<dyn PrStore>)
    }
}

/// What a command does to the medium, for the access tables (SPC-4 table 68).
enum Access {
    /// Allowed whatever the reservation.
    Always,
    Read,
    Write,
}

fn access(cmd: &Command) -> Access {
    match cmd {
        Command::Inquiry { .. }
        | Command::ReportLuns { .. }
        | Command::RequestSense { .. }
        | Command::ReportSupportedOpcodes { .. }
        | Command::PersistentReserveIn { .. }
        | Command::PersistentReserveOut(_)
        | Command::TestUnitReady
        | Command::ReadCapacity10
        | Command::ReadCapacity16 { .. }
        | Command::Release6 => Access::Always,
        Command::PreventAllow { prevent } if *prevent == 0 => Access::Always,
        Command::Read(_)
        | Command::Verify { .. }
        | Command::PreFetch { .. }
        | Command::GetLbaStatus { .. }
        | Command::ModeSense { .. }
        | Command::ReadDefectData { .. } => Access::Read,
        _ => Access::Write,
    }
}

/// Commands another nexus may still send while a RESERVE(6) is held (SPC-2 table 13).
pub fn allowed_under_reserve6(cmd: &Command) -> bool {
    matches!(
        cmd,
        Command::Inquiry { .. }
            | Command::ReportLuns { .. }
            | Command::RequestSense { .. }
            | Command::ReportSupportedOpcodes { .. }
            | Command::Release6
            | Command::PersistentReserveIn { .. }
    ) || matches!(cmd, Command::PreventAllow { prevent: 0 })
}

impl PrState {
    /// Whether a persistent reservation exists.
    pub fn active(&self) -> bool {
        self.reservation.is_some()
    }

    /// Whether nothing is registered or reserved (the common case: skip the checks).
    pub fn is_empty(&self) -> bool {
        self.registrations.is_empty() && self.reservation.is_none() && self.reserve6.is_none()
    }

    /// The RESERVE(6) holder.
    pub fn reserve6_holder(&self) -> Option<&ItNexus> {
        self.reserve6.as_ref()
    }

    /// RESERVE(6) (SPC-2 §7.21): conflicts with a persistent reservation or another
    /// holder.
    pub fn reserve6(&mut self, n: &ItNexus) -> bool {
        if self.active() || self.reserve6.as_ref().is_some_and(|h| h != n) {
            return false;
        }
        self.reserve6 = Some(n.clone());
        true
    }

    /// RELEASE(6), the holder's I_T nexus lost, or a reset: ends `n`'s RESERVE(6)
    /// (any holder's when `n` is `None`).
    pub fn release6(&mut self, n: Option<&ItNexus>) {
        if n.is_none() || self.reserve6.as_ref() == n {
            self.reserve6 = None;
        }
    }

    fn key_of(&self, n: &ItNexus) -> Option<u64> {
        self.registrations
            .iter()
            .find(|(m, _)| m == n)
            .map(|&(_, k)| k)
    }

    fn is_holder(&self, n: &ItNexus) -> bool {
        match &self.reservation {
            Some(r) if all_registrants(r.kind) => self.key_of(n).is_some(),
            Some(r) => &r.holder == n,
            None => false,
        }
    }

    /// Access check for `cmd` from `n` under the current reservations: RESERVE(6)
    /// (SPC-2 table 13) and persistent (SPC-4 §5.13.1).
    pub fn allows(&self, n: &ItNexus, cmd: &Command) -> bool {
        if self.reserve6.as_ref().is_some_and(|h| h != n) && !allowed_under_reserve6(cmd) {
            return false;
        }
        self.persistent_allows(n, access(cmd))
    }

    /// Access check for a front end that is not SCSI (an NVMe namespace, docs/nvme.md):
    /// whether `n` may read (`write` false) or write the medium. A RESERVE(6) of another
    /// nexus conflicts with both; a persistent reservation as SPC-4 table 68 says, which
    /// is the table of the NVMe reservation types too (NVMe Base 2.0 §8.19.1).
    pub fn allows_io(&self, n: &ItNexus, write: bool) -> bool {
        if self.reserve6.as_ref().is_some_and(|h| h != n) {
            return false;
        }
        self.persistent_allows(n, if write { Access::Write } else { Access::Read })
    }

    /// The state's PRGENERATION (SPC-4 §6.15.2; NVMe's GEN).
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// The reservation key `n` registered, if any.
    pub fn registration(&self, n: &ItNexus) -> Option<u64> {
        self.key_of(n)
    }

    /// Every registration, in the order they were made.
    pub fn registrations(&self) -> impl Iterator<Item = (&ItNexus, u64)> {
        self.registrations.iter().map(|(n, k)| (n, *k))
    }

    /// Whether `n` holds the persistent reservation (any registrant does under an
    /// all-registrants type).
    pub fn holds(&self, n: &ItNexus) -> bool {
        self.is_holder(n)
    }

    /// The type of the persistent reservation ([`kind`]), if one is held.
    pub fn reservation_kind(&self) -> Option<u8> {
        self.reservation.as_ref().map(|r| r.kind)
    }

    fn persistent_allows(&self, n: &ItNexus, access: Access) -> bool {
        let Some(r) = &self.reservation else {
            return true;
        };
        if self.is_holder(n) {
            return true;
        }
        let registered = self.key_of(n).is_some();
        match (access, r.kind) {
            (Access::Always, _) => true,
            (Access::Read, kind::WE | kind::WE_RO | kind::WE_AR) => true,
            (_, kind::WE_RO | kind::EA_RO | kind::WE_AR | kind::EA_AR) => registered,
            _ => false,
        }
    }

    /// PERSISTENT RESERVE IN parameter data for a service action.
    pub fn read(&self, sa: u8) -> Result<Vec<u8>, Sense> {
        let mut v = self.generation.to_be_bytes().to_vec();
        match sa {
            0x00 => {
                v.extend_from_slice(&((self.registrations.len() * 8) as u32).to_be_bytes());
                for (_, k) in &self.registrations {
                    v.extend_from_slice(&k.to_be_bytes());
                }
            }
            0x01 => match &self.reservation {
                None => v.extend_from_slice(&0u32.to_be_bytes()),
                Some(r) => {
                    v.extend_from_slice(&16u32.to_be_bytes());
                    let key = if all_registrants(r.kind) {
                        0
                    } else {
                        self.key_of(&r.holder).unwrap_or(0)
                    };
                    v.extend_from_slice(&key.to_be_bytes());
                    v.extend_from_slice(&[0, 0, 0, 0, 0, r.kind & 0x0F, 0, 0]);
                }
            },
            0x02 => {
                // REPORT CAPABILITIES: CRH 1 (RESERVE(6) conflicts with PR), TMV 1, all
                // six types; ALL_TG_PT, SPEC_I_PT and PTPL not supported.
                return Ok(vec![0x00, 0x08, 0x10, 0x80, 0xEA, 0x01, 0x00, 0x00]);
            }
            0x03 => {
                let mut body = Vec::new();
                for (n, k) in &self.registrations {
                    body.extend_from_slice(&k.to_be_bytes());
                    body.extend_from_slice(&[0; 4]);
                    let holder = self.is_holder(n);
                    body.push(u8::from(holder));
                    body.push(match (&self.reservation, holder) {
                        (Some(r), true) => r.kind & 0x0F,
                        _ => 0,
                    });
                    body.extend_from_slice(&[0; 4]);
                    body.extend_from_slice(&n.port.to_be_bytes()); // RELATIVE TARGET PORT
                    let tid = transport_id(&n.initiator);
                    body.extend_from_slice(&(tid.len() as u32).to_be_bytes());
                    body.extend_from_slice(&tid);
                }
                v.extend_from_slice(&(body.len() as u32).to_be_bytes());
                v.extend(body);
            }
            _ => return Err(Sense::invalid_field_in_cdb_at(1, Some(4))),
        }
        Ok(v)
    }

    /// The state as text for a shared store, one line per item (`ipsan-pr 1` header,
    /// `gen`, `reg PORT KEY INITIATOR`, `res PORT KIND INITIATOR`, `r6 PORT INITIATOR`);
    /// iSCSI names hold no whitespace (RFC 3722), so the initiator is the rest of the line.
    pub fn encode(&self) -> Vec<u8> {
        let mut s = format!("ipsan-pr 1\ngen {}\n", self.generation);
        for (n, k) in &self.registrations {
            s.push_str(&format!("reg {} {k:016x} {}\n", n.port, n.initiator.0));
        }
        if let Some(r) = &self.reservation {
            s.push_str(&format!(
                "res {} {} {}\n",
                r.holder.port, r.kind, r.holder.initiator.0
            ));
        }
        if let Some(n) = &self.reserve6 {
            s.push_str(&format!("r6 {} {}\n", n.port, n.initiator.0));
        }
        s.into_bytes()
    }

    /// Parses [`PrState::encode`]'s text; empty input is the empty state.
    pub fn decode(b: &[u8]) -> io::Result<Self> {
        let bad = |why: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("reservation state: {why}"),
            )
        };
        let mut st = PrState::default();
        if b.is_empty() {
            return Ok(st);
        }
        let text = std::str::from_utf8(b).map_err(|_| bad("not UTF-8"))?;
        let mut lines = text.lines();
        if lines.next() != Some("ipsan-pr 1") {
            return Err(bad("unknown format"));
        }
        let nexus = |port: &str, who: &str| -> io::Result<ItNexus> {
            Ok(ItNexus {
                initiator: NexusId(who.to_owned()),
                port: port.parse().map_err(|_| bad("port"))?,
            })
        };
        for line in lines {
            let mut f = line.splitn(4, ' ');
            match (f.next(), f.next(), f.next(), f.next()) {
                (Some("gen"), Some(g), None, None) => {
                    st.generation = g.parse().map_err(|_| bad("generation"))?;
                }
                (Some("reg"), Some(port), Some(key), Some(who)) => {
                    let key = u64::from_str_radix(key, 16).map_err(|_| bad("key"))?;
                    st.registrations.push((nexus(port, who)?, key));
                }
                (Some("res"), Some(port), Some(k), Some(who)) => {
                    st.reservation = Some(Reservation {
                        holder: nexus(port, who)?,
                        kind: k.parse().map_err(|_| bad("type"))?,
                    });
                }
                (Some("r6"), Some(port), Some(who), None) => {
                    st.reserve6 = Some(nexus(port, who)?);
                }
                _ => return Err(bad("malformed line")),
            }
        }
        Ok(st)
    }
}

/// iSCSI TransportID (SPC-4 §7.6.4.6): initiator port format when the nexus carries
/// `",i,0x<isid>"`, else the device name format.
fn transport_id(n: &NexusId) -> Vec<u8> {
    let port = n.0.contains(",i,0x");
    let mut name = n.0.as_bytes().to_vec();
    name.push(0);
    while name.len() % 4 != 0 {
        name.push(0);
    }
    let mut t = vec![if port { 0x45 } else { 0x05 }, 0];
    t.extend_from_slice(&(name.len() as u16).to_be_bytes());
    t.extend(name);
    t
}

fn conflict() -> Result<ScsiResponse, Sense> {
    Ok(ScsiResponse::status(ScsiStatus::RESERVATION_CONFLICT))
}

fn good() -> Result<ScsiResponse, Sense> {
    Ok(ScsiResponse::good(Bytes::new()))
}

fn ua(uas: &mut Vec<PendingUa>, who: &[ItNexus], asc: u8, ascq: u8) {
    for n in who {
        uas.push((n.clone(), asc, ascq));
    }
}

/// A PERSISTENT RESERVE OUT service action (SPC-4 §6.16.2: REGISTER 0, RESERVE 1, RELEASE 2,
/// CLEAR 3, PREEMPT 4, REGISTER AND IGNORE EXISTING KEY 6) with reservation type `kind`,
/// RESERVATION KEY `key` and SERVICE ACTION RESERVATION KEY `sa_key`, from a front end that
/// is not SCSI: NVMe's Reservation Register/Acquire/Release map onto these (docs/nvme.md),
/// so both protocols run the same rules on one state. As [`out`] otherwise.
///
/// # Errors
/// The CHECK CONDITION's sense the SCSI command would get (an invalid type, PREEMPT of key 0
/// without an all-registrants reservation, a RELEASE of another type).
pub fn out_action(
    pr: &mut PrState,
    uas: &mut Vec<PendingUa>,
    n: &ItNexus,
    sa: u8,
    kind: u8,
    key: u64,
    sa_key: u64,
) -> Result<ScsiResponse, Sense> {
    let mut data = [0u8; 24];
    data[..8].copy_from_slice(&key.to_be_bytes());
    data[8..16].copy_from_slice(&sa_key.to_be_bytes());
    let p = PrOut {
        sa,
        scope: 0,
        kind,
        param_len: 24,
    };
    out(pr, uas, n, p, &data)
}

/// PERSISTENT RESERVE OUT from `n` on `pr`; the unit attentions it owes other nexuses go to
/// `uas`. `pr` may be changed even when the command fails: the caller stores it only on
/// GOOD.
pub(crate) fn out(
    pr: &mut PrState,
    uas: &mut Vec<PendingUa>,
    n: &ItNexus,
    p: PrOut,
    data: &[u8],
) -> Result<ScsiResponse, Sense> {
    if pr.reserve6.as_ref().is_some_and(|h| h != n) {
        return conflict();
    }
    if !matches!(p.sa, 0..=4 | 6) {
        return Err(Sense::invalid_field_in_cdb_at(1, Some(4)));
    }
    if p.param_len != 24 {
        return Err(Sense::parameter_list_length_error());
    }
    let key = u64::from_be_bytes([
        data[0], data[1], data[2], data[3], data[4], data[5], data[6], data[7],
    ]);
    let sa_key = u64::from_be_bytes([
        data[8], data[9], data[10], data[11], data[12], data[13], data[14], data[15],
    ]);
    let flags = data[20];
    if flags & 0x0D != 0 {
        // SPEC_I_PT, ALL_TG_PT (bit 2) and APTPL are not supported (REPORT CAPABILITIES).
        return Err(Sense::invalid_field_in_parameter_list_at(20, None));
    }
    if matches!(p.sa, 1 | 2 | 4) && (p.scope != 0 || !valid_kind(p.kind)) {
        return Err(Sense::invalid_field_in_cdb_at(2, None));
    }
    let mine = pr.key_of(n);
    match p.sa {
        // REGISTER / REGISTER AND IGNORE EXISTING KEY
        0x00 | 0x06 => {
            if p.sa == 0x00 && mine.unwrap_or(0) != key {
                return conflict();
            }
            match (mine, sa_key) {
                (None, 0) => {}
                (None, k) => pr.registrations.push((n.clone(), k)),
                (Some(_), 0) => {
                    pr.registrations.retain(|(m, _)| m != n);
                    let release = match &pr.reservation {
                        Some(r) if all_registrants(r.kind) => pr.registrations.is_empty(),
                        Some(r) => &r.holder == n,
                        None => false,
                    };
                    if release {
                        let k = pr.reservation.take().map(|r| r.kind).unwrap_or(0);
                        if matches!(k, kind::WE_RO | kind::EA_RO) {
                            let others: Vec<ItNexus> =
                                pr.registrations.iter().map(|(m, _)| m.clone()).collect();
                            ua(uas, &others, 0x2A, 0x04);
                        }
                    }
                }
                (Some(_), k) => {
                    for r in pr.registrations.iter_mut().filter(|(m, _)| m == n) {
                        r.1 = k;
                    }
                }
            }
            pr.generation = pr.generation.wrapping_add(1);
            good()
        }
        // RESERVE
        0x01 => {
            if mine != Some(key) {
                return conflict();
            }
            match &pr.reservation {
                Some(r) if pr.is_holder(n) && r.kind == p.kind => good(),
                Some(_) => conflict(),
                None => {
                    pr.reservation = Some(Reservation {
                        holder: n.clone(),
                        kind: p.kind,
                    });
                    good()
                }
            }
        }
        // RELEASE
        0x02 => {
            if mine != Some(key) {
                return conflict();
            }
            let Some(r) = pr.reservation.clone() else {
                return good();
            };
            if !pr.is_holder(n) {
                return good();
            }
            if r.kind != p.kind {
                // INVALID RELEASE OF PERSISTENT RESERVATION (SPC-4 §5.13.11.2.2).
                return Err(Sense::new(
                    crate::sense::SenseKey::ILLEGAL_REQUEST,
                    0x26,
                    0x04,
                ));
            }
            pr.reservation = None;
            if r.kind != kind::WE && r.kind != kind::EA {
                let others: Vec<ItNexus> = pr
                    .registrations
                    .iter()
                    .filter(|(m, _)| m != n)
                    .map(|(m, _)| m.clone())
                    .collect();
                ua(uas, &others, 0x2A, 0x04);
            }
            good()
        }
        // CLEAR
        0x03 => {
            if mine != Some(key) {
                return conflict();
            }
            let others: Vec<ItNexus> = pr
                .registrations
                .iter()
                .filter(|(m, _)| m != n)
                .map(|(m, _)| m.clone())
                .collect();
            pr.registrations.clear();
            pr.reservation = None;
            pr.generation = pr.generation.wrapping_add(1);
            ua(uas, &others, 0x2A, 0x03);
            good()
        }
        // PREEMPT
        _ => {
            if mine != Some(key) {
                return conflict();
            }
            let ar = pr
                .reservation
                .as_ref()
                .is_some_and(|r| all_registrants(r.kind));
            if sa_key == 0 && !ar {
                return Err(Sense::invalid_field_in_parameter_list_at(8, None));
            }
            let holder_key = pr
                .reservation
                .as_ref()
                .filter(|r| !all_registrants(r.kind))
                .and_then(|r| pr.key_of(&r.holder));
            let takes_reservation =
                pr.reservation.is_some() && (ar && sa_key == 0 || holder_key == Some(sa_key));
            let victims: Vec<ItNexus> = pr
                .registrations
                .iter()
                .filter(|(m, k)| m != n && (*k == sa_key || (ar && sa_key == 0)))
                .map(|(m, _)| m.clone())
                .collect();
            if victims.is_empty() && !takes_reservation {
                return conflict();
            }
            pr.registrations.retain(|(m, _)| !victims.contains(m));
            if takes_reservation {
                pr.reservation = Some(Reservation {
                    holder: n.clone(),
                    kind: p.kind,
                });
            }
            pr.generation = pr.generation.wrapping_add(1);
            ua(uas, &victims, 0x2A, 0x05);
            good()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn it(name: &str, port: u16) -> ItNexus {
        ItNexus {
            initiator: NexusId(format!("{name},i,0x000000000001")),
            port,
        }
    }

    #[test]
    fn allows_io_of_another_front_end_as_the_reservation_type_says() {
        let (scsi, nvme) = (it("iqn.a", 1), it("nqn.b", 0));
        let mut st = PrState::default();
        let mut uas = Vec::new();
        let ok = |r: Result<ScsiResponse, Sense>| r.unwrap().status == ScsiStatus::GOOD;
        assert!(ok(out_action(&mut st, &mut uas, &nvme, 6, 0, 0, 7)));
        assert!(ok(out_action(&mut st, &mut uas, &nvme, 1, kind::WE, 7, 0)));
        assert_eq!(st.registration(&nvme), Some(7));
        assert_eq!(st.reservation_kind(), Some(kind::WE));
        assert!(st.holds(&nvme) && !st.holds(&scsi));
        assert!(st.allows_io(&nvme, true));
        assert!(
            !st.allows_io(&scsi, true),
            "Write Exclusive: others may not write"
        );
        assert!(st.allows_io(&scsi, false), "but may read");
        // The SCSI side's own check sees the same holder.
        assert!(!st.allows(
            &scsi,
            &Command::SynchronizeCache {
                lba: 0,
                blocks: 0,
                immed: false
            }
        ));
        // A wrong key is a conflict, not a change.
        let r = out_action(&mut st, &mut uas, &scsi, 1, kind::EA, 9, 0).unwrap();
        assert_eq!(r.status, ScsiStatus::RESERVATION_CONFLICT);
        // RESERVE(6) of another nexus keeps reads out too.
        let mut r6 = PrState::default();
        assert!(r6.reserve6(&scsi));
        assert!(!r6.allows_io(&nvme, false));
        assert!(r6.allows_io(&scsi, true));
    }

    #[test]
    fn encodes_and_decodes_the_state_a_shared_store_keeps() {
        let st = PrState {
            generation: 7,
            registrations: vec![(it("iqn.a", 1), 0xA), (it("iqn.b", 2), u64::MAX)],
            reservation: Some(Reservation {
                holder: it("iqn.b", 2),
                kind: kind::EA_RO,
            }),
            reserve6: Some(it("iqn.c", 1)),
        };
        assert_eq!(PrState::decode(&st.encode()).unwrap(), st);
        assert_eq!(PrState::decode(b"").unwrap(), PrState::default());
    }

    #[test]
    fn rejects_malformed_stored_state() {
        for bad in [
            &b"other 1\n"[..],
            b"ipsan-pr 1\nreg x 1 iqn\n",
            b"ipsan-pr 1\nzap\n",
        ] {
            assert!(
                PrState::decode(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn rejects_a_store_at_a_stale_version() {
        let m = MemPrStore::default();
        let (s0, v0) = m.load().unwrap();
        let mut s1 = (*s0).clone();
        assert!(s1.reserve6(&it("iqn.a", 1)));
        assert!(m.store(&s1, v0).unwrap());
        assert!(
            !m.store(&PrState::default(), v0).unwrap(),
            "stale version accepted"
        );
        assert_eq!(*m.current().unwrap(), s1);
    }

    #[test]
    fn record_store_sees_another_ports_change_and_rejects_a_stale_one() {
        let rec: Arc<dyn SharedRecord> = Arc::new(ipsan_block::MemRecord::default());
        let (gw1, gw2) = (RecordPrStore::new(rec.clone()), RecordPrStore::new(rec));
        let before = gw2.current().unwrap();
        assert_eq!(*before, PrState::default());
        assert!(
            Arc::ptr_eq(&before, &gw2.current().unwrap()),
            "decoded again"
        );
        let (s0, v0) = gw1.load().unwrap();
        let mut s1 = (*s0).clone();
        assert!(s1.reserve6(&it("iqn.a", 1)));
        assert!(gw1.store(&s1, v0).unwrap());
        assert_eq!(
            *gw2.current().unwrap(),
            s1,
            "gw2 kept a stale decoded state"
        );
        assert!(!gw2.store(&PrState::default(), v0).unwrap());
        assert_eq!(gw2.load().unwrap(), (Arc::new(s1), v0 + 1));
    }
}
