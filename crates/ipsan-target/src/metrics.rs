//! Counters the running target keeps, and their Prometheus text exposition (format 0.0.4).
//!
//! Everything here is lock-free on the command path: a connection holds an
//! `Arc<SessionStats>`, and each command bumps a few atomics on it and on its LUN's
//! [`IoStats`]. Labels are bounded: target and LUN come from the configuration; a session's
//! `initiator` comes from the wire, so it is cut to [`MAX_LABEL_BYTES`] (a hash of the whole
//! name keeps cut names apart), and at most [`MAX_SESSION_SERIES`] sessions get series of
//! their own, the rest of each target's summed under `initiator="other"`; never a label per
//! command.
//!
//! Names follow Prometheus conventions: base units in the name (`_bytes`, `_seconds`),
//! `_total` on counters, one `op` label (`read`, `write`, `other`) rather than a name per
//! direction.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use ipsan_scsi::{cdb, ScsiStatus, SenseKey};

/// Upper bounds of the latency histogram buckets, seconds (a LAN SSD to a 64 ms WAN link).
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 10.0,
];

/// Sessions with series of their own (the lowest TSIHs); the others of each target are summed
/// into one set of series labelled `initiator="other",tsih="other"`. With ~75 series per
/// session, this keeps a scrape under a few MiB however many sessions log in.
pub const MAX_SESSION_SERIES: usize = 64;

/// The longest `initiator` label value, in bytes. iSCSI names may be 223 bytes (RFC 7143
/// §4.2.7.1) and the login accepts text values up to 8,192 bytes; longer ones are cut and
/// suffixed `~` and 16 hex digits of a hash of the whole name.
pub const MAX_LABEL_BYTES: usize = 64;

/// `v` cut to [`MAX_LABEL_BYTES`] (at a character boundary), with a hash of the whole of it.
#[must_use]
pub fn bounded_label(v: &str) -> std::borrow::Cow<'_, str> {
    if v.len() <= MAX_LABEL_BYTES {
        return std::borrow::Cow::Borrowed(v);
    }
    // FNV-1a 64: keeps distinct long names apart in the series; not a security boundary.
    let h = v.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let mut cut = MAX_LABEL_BYTES - 17;
    while !v.is_char_boundary(cut) {
        cut -= 1;
    }
    std::borrow::Cow::Owned(format!("{}~{h:016x}", &v[..cut]))
}

/// Names of the 16 SCSI sense keys (SPC-4 Table 48), the `sense_key` label.
pub const SENSE_KEYS: [&str; 16] = [
    "no_sense",
    "recovered_error",
    "not_ready",
    "medium_error",
    "hardware_error",
    "illegal_request",
    "unit_attention",
    "data_protect",
    "blank_check",
    "vendor_specific",
    "copy_aborted",
    "aborted_command",
    "reserved_0c",
    "volume_overflow",
    "miscompare",
    "completed",
];

/// A latency histogram with fixed buckets.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS.iter().position(|&b| s <= b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Adds the observations of `o` (summing sessions into `other`).
    fn add(&self, o: &Histogram) {
        for (a, b) in self.buckets.iter().zip(&o.buckets) {
            a.fetch_add(b.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        self.count.fetch_add(o.count(), Ordering::Relaxed);
        self.sum_ns
            .fetch_add(o.sum_ns.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The largest bucket bound below which `q` of the observations lie (an upper estimate).
    pub fn quantile_bound(&self, q: f64) -> Option<f64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let want = (q * n as f64).ceil() as u64;
        let mut acc = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            acc += b.load(Ordering::Relaxed);
            if acc >= want {
                return Some(LATENCY_BUCKETS[i]);
            }
        }
        Some(f64::INFINITY)
    }
}

/// The kind of a command, the `op` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Other,
}

impl Op {
    const ALL: [Op; 3] = [Op::Read, Op::Write, Op::Other];

    fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Other => "other",
        }
    }

    /// READ(6/10/12/16) and WRITE(6/10/12/16) plus WRITE AND VERIFY move blocks; the rest
    /// is `other`.
    #[must_use]
    pub fn of(cdb: &[u8]) -> Op {
        Op::of_family(cdb::family(cdb))
    }

    /// [`Op::of`] a command's family (a typed command's, `ipsan_scsi::CommandInfo::family`).
    #[must_use]
    pub fn of_family(family: cdb::Family) -> Op {
        if family == cdb::Family::Read {
            Op::Read
        } else if family.is_block_write() {
            Op::Write
        } else {
            Op::Other
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// I/O counters of a LUN or of a session.
#[derive(Debug, Default)]
pub struct IoStats {
    /// Logical block size of the LUN (0 for a session: each command's LUN says).
    pub block_size: u32,
    bytes: [AtomicU64; 2],
    commands: [AtomicU64; 3],
    in_flight: AtomicI64,
    latency: [Histogram; 3],
    /// CHECK CONDITION answers by sense key.
    sense: [AtomicU64; 16],
    /// Other non-GOOD statuses (RESERVATION CONFLICT, BUSY, TASK SET FULL, …).
    other_status: AtomicU64,
}

/// A plain copy of [`IoStats`] (what `ipsan ctl` shows).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct IoCounts {
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub read_commands: u64,
    pub write_commands: u64,
    pub other_commands: u64,
    pub in_flight: i64,
    pub errors: u64,
}

impl IoStats {
    fn with_block_size(block_size: u32) -> Self {
        Self {
            block_size,
            ..Self::default()
        }
    }

    fn started(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    fn done(&self, op: Op, bytes: u64, status: ScsiStatus, key: Option<SenseKey>, took: Duration) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.commands[op.index()].fetch_add(1, Ordering::Relaxed);
        self.latency[op.index()].observe(took);
        if status == ScsiStatus::GOOD || status == ScsiStatus::CONDITION_MET {
            match op {
                Op::Read => self.bytes[0].fetch_add(bytes, Ordering::Relaxed),
                Op::Write => self.bytes[1].fetch_add(bytes, Ordering::Relaxed),
                Op::Other => 0,
            };
        } else if let Some(k) = key {
            self.sense[usize::from(k.0 & 0x0f)].fetch_add(1, Ordering::Relaxed);
        } else {
            self.other_status.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Adds the counters of `o` (summing sessions into `other`).
    fn add(&self, o: &IoStats) {
        let add = |a: &AtomicU64, b: &AtomicU64| {
            a.fetch_add(b.load(Ordering::Relaxed), Ordering::Relaxed);
        };
        for (a, b) in self.bytes.iter().zip(&o.bytes) {
            add(a, b);
        }
        for (a, b) in self.commands.iter().zip(&o.commands) {
            add(a, b);
        }
        self.in_flight
            .fetch_add(o.in_flight.load(Ordering::Relaxed), Ordering::Relaxed);
        for (a, b) in self.latency.iter().zip(&o.latency) {
            a.add(b);
        }
        for (a, b) in self.sense.iter().zip(&o.sense) {
            add(a, b);
        }
        add(&self.other_status, &o.other_status);
    }

    /// A plain copy.
    pub fn counts(&self) -> IoCounts {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        IoCounts {
            read_bytes: g(&self.bytes[0]),
            write_bytes: g(&self.bytes[1]),
            read_commands: g(&self.commands[0]),
            write_commands: g(&self.commands[1]),
            other_commands: g(&self.commands[2]),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            errors: self.sense.iter().map(g).sum::<u64>() + g(&self.other_status),
        }
    }

    /// The latency histogram of `op`.
    pub fn latency(&self, op: Op) -> &Histogram {
        &self.latency[op.index()]
    }
}

/// Counters of one session (one connection: MaxConnections=1).
#[derive(Debug, Default)]
pub struct SessionStats {
    pub io: IoStats,
    pub r2ts: AtomicU64,
    pub digest_errors: AtomicU64,
    /// PDUs answered with Reject for other reasons.
    pub pdu_errors: AtomicU64,
    pub seal_open_failures: AtomicU64,
    /// Seal chunks whose tag did not verify: modified, relocated or forged data.
    pub seal_forgeries: AtomicU64,
    /// Replayed Seal chunk counters.
    pub seal_replays: AtomicU64,
    /// The LUN counters of this session's target (shared with the registry).
    luns: Option<Arc<LunTable>>,
    /// Signalled when the control plane asks this session to log out (`ipsan ctl
    /// logout-all`): the connection sends AsyncEvent 1 (RFC 7143 §11.9.1).
    pub logout: tokio::sync::Notify,
}

/// The per-LUN counters of one target, by LUN id.
pub type LunTable = RwLock<BTreeMap<u64, Arc<IoStats>>>;

/// One command being timed: from [`SessionStats::start`] to [`CommandTimer::done`].
#[derive(Debug)]
pub struct CommandTimer {
    session: Arc<SessionStats>,
    lun: Option<Arc<IoStats>>,
    t0: Instant,
}

impl CommandTimer {
    /// The command answered with `status` and, for CHECK CONDITION, sense key `key`.
    pub fn done(self, cdb: &[u8], status: ScsiStatus, key: Option<SenseKey>) {
        self.done_as(Op::of(cdb), cdb::extent(cdb).1, status, key);
    }

    /// [`CommandTimer::done`] of a command already decoded: its kind and the blocks it
    /// moves, read from the typed command rather than the CDB bytes.
    pub fn done_as(self, op: Op, blocks: u32, status: ScsiStatus, key: Option<SenseKey>) {
        let took = self.t0.elapsed();
        let bytes = match (&self.lun, op) {
            (Some(l), Op::Read | Op::Write) => u64::from(blocks) * u64::from(l.block_size),
            _ => 0,
        };
        self.session.io.done(op, bytes, status, key, took);
        if let Some(l) = &self.lun {
            l.done(op, bytes, status, key, took);
        }
    }
}

impl SessionStats {
    /// Adds the counters of `o` (summing sessions into `other`).
    pub(crate) fn add(&self, o: &SessionStats) {
        self.io.add(&o.io);
        for (a, b) in [
            (&self.r2ts, &o.r2ts),
            (&self.digest_errors, &o.digest_errors),
            (&self.pdu_errors, &o.pdu_errors),
            (&self.seal_open_failures, &o.seal_open_failures),
            (&self.seal_forgeries, &o.seal_forgeries),
            (&self.seal_replays, &o.seal_replays),
        ] {
            a.fetch_add(b.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    pub(crate) fn new(luns: Option<Arc<LunTable>>) -> Self {
        Self {
            luns,
            ..Self::default()
        }
    }

    /// A command to `lun` starts (its data is in; it goes to the device server).
    pub fn start(self: &Arc<Self>, lun: u64) -> CommandTimer {
        let lun = self
            .luns
            .as_ref()
            .and_then(|t| crate::read(t).get(&lun).cloned());
        self.io.started();
        if let Some(l) = &lun {
            l.started();
        }
        CommandTimer {
            session: self.clone(),
            lun,
            t0: Instant::now(),
        }
    }

    /// `n` R2Ts were sent.
    pub fn r2ts(&self, n: usize) {
        self.r2ts.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// A PDU was rejected; digest failures are counted apart.
    pub fn pdu_error(&self, e: &iscsi_wire::WireError) {
        match e {
            iscsi_wire::WireError::DataDigest { .. }
            | iscsi_wire::WireError::HeaderDigest { .. } => {
                self.digest_errors.fetch_add(1, Ordering::Relaxed)
            }
            _ => self.pdu_errors.fetch_add(1, Ordering::Relaxed),
        };
    }

    /// Seal refused a command's data-out.
    pub fn seal_open_failed(&self, e: &ipsan_seal::OpenError) {
        self.seal_open_failures.fetch_add(1, Ordering::Relaxed);
        match e {
            ipsan_seal::OpenError::Authentication { .. } => {
                self.seal_forgeries.fetch_add(1, Ordering::Relaxed);
            }
            ipsan_seal::OpenError::Replay { .. } => {
                self.seal_replays.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }
}

/// Login outcomes, the `result` label of `ipsan_logins_total`.
pub const LOGIN_RESULTS: [&str; 8] = [
    "success",
    "authentication_failure",
    "authorization_failure",
    "not_found",
    "out_of_resources",
    "service_unavailable",
    "too_many_connections",
    "other",
];

/// The `result` label of a login's final status (RFC 7143 §11.13.5).
#[must_use]
pub fn login_result(status: Option<u16>) -> &'static str {
    match status {
        None => "success",
        Some(0x0201) => "authentication_failure",
        Some(0x0202) => "authorization_failure",
        Some(0x0203) => "not_found",
        Some(0x0302) => "out_of_resources",
        Some(0x0301) => "service_unavailable",
        Some(0x0206) => "too_many_connections",
        Some(_) => "other",
    }
}

/// Target-wide counters that outlive sessions.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Logins by (target, result); the target is "" for discovery and names not configured
    /// (an attacker must not be able to mint label values).
    logins: RwLock<HashMap<(String, &'static str), Arc<AtomicU64>>>,
    /// Control requests answered, by outcome.
    pub control_ok: AtomicU64,
    pub control_errors: AtomicU64,
    /// Configuration changes applied (ctl edits and reloads).
    pub config_changes: AtomicU64,
    /// Configuration changes refused because the result did not validate (a file error).
    pub config_changes_invalid: AtomicU64,
    /// Configuration changes refused although valid (in use without force, not online,
    /// no file form to edit).
    pub config_changes_refused: AtomicU64,
}

impl Metrics {
    /// Counts a login of `target` (already bounded to configured names) with `result`.
    pub fn login(&self, target: &str, result: &'static str) {
        let key = (target.to_owned(), result);
        if let Some(c) = crate::read(&self.logins).get(&key) {
            c.fetch_add(1, Ordering::Relaxed);
            return;
        }
        crate::write(&self.logins)
            .entry(key)
            .or_default()
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Logins so far by (target, result).
    pub fn logins(&self) -> Vec<(String, &'static str, u64)> {
        let mut v: Vec<_> = crate::read(&self.logins)
            .iter()
            .map(|((t, r), c)| (t.clone(), *r, c.load(Ordering::Relaxed)))
            .collect();
        v.sort();
        v
    }

    /// Forgets the login counters of a removed target (keeps the label set bounded).
    pub fn forget_target(&self, target: &str) {
        crate::write(&self.logins).retain(|(t, _), _| t != target);
    }
}

/// New LUN counters for a LUN of `block_size`-byte blocks.
#[must_use]
pub fn lun_stats(block_size: u32) -> Arc<IoStats> {
    Arc::new(IoStats::with_block_size(block_size))
}

// ---------------------------------------------------------------------------------------
// Text exposition

/// Escapes a label value (backslash, double quote, newline).
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Builds the exposition one family at a time: HELP and TYPE once, then every sample.
#[derive(Debug, Default)]
pub struct Exposition {
    families: Vec<(String, String, &'static str, Vec<String>)>,
}

impl Exposition {
    fn family(&mut self, name: &str, help: &str, kind: &'static str) -> &mut Vec<String> {
        let i = match self.families.iter().position(|f| f.0 == name) {
            Some(i) => i,
            None => {
                self.families
                    .push((name.to_owned(), help.to_owned(), kind, Vec::new()));
                self.families.len() - 1
            }
        };
        &mut self.families[i].3
    }

    /// One sample of `name` with `labels`.
    pub fn sample(
        &mut self,
        name: &str,
        help: &str,
        kind: &'static str,
        labels: &[(&str, &str)],
        value: f64,
    ) {
        let line = format!("{name}{} {}", render_labels(labels), fmt_value(value));
        self.family(name, help, kind).push(line);
    }

    /// A histogram of `h` under `name` with `labels`.
    pub fn histogram(&mut self, name: &str, help: &str, labels: &[(&str, &str)], h: &Histogram) {
        let lines = self.family(name, help, "histogram");
        let mut acc = 0u64;
        for (i, b) in LATENCY_BUCKETS.iter().enumerate() {
            acc += h.buckets[i].load(Ordering::Relaxed);
            let le = fmt_value(*b);
            let mut l: Vec<(&str, &str)> = labels.to_vec();
            l.push(("le", &le));
            lines.push(format!("{name}_bucket{} {acc}", render_labels(&l)));
        }
        let count = h.count.load(Ordering::Relaxed);
        let mut l: Vec<(&str, &str)> = labels.to_vec();
        l.push(("le", "+Inf"));
        lines.push(format!("{name}_bucket{} {count}", render_labels(&l)));
        let sum = h.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        lines.push(format!(
            "{name}_sum{} {}",
            render_labels(labels),
            fmt_value(sum)
        ));
        lines.push(format!("{name}_count{} {count}", render_labels(labels)));
    }

    /// The text, families in the order first seen.
    #[must_use]
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (name, help, kind, lines) in &self.families {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for l in lines {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    /// The counters of `io` (a LUN's or a session's), prefixed `prefix`.
    pub fn io(&mut self, prefix: &str, what: &str, labels: &[(&str, &str)], io: &IoStats) {
        let c = io.counts();
        for (op, bytes) in [("read", c.read_bytes), ("write", c.write_bytes)] {
            let mut l = labels.to_vec();
            l.push(("op", op));
            self.sample(
                &format!("{prefix}_bytes_total"),
                &format!("Bytes read from or written to the {what} by successful READ/WRITE commands (logical block data)."),
                "counter",
                &l,
                bytes as f64,
            );
        }
        for op in Op::ALL {
            let mut l = labels.to_vec();
            l.push(("op", op.name()));
            self.sample(
                &format!("{prefix}_commands_total"),
                &format!("SCSI commands the {what} completed, by kind (read, write, other)."),
                "counter",
                &l,
                io.commands[op.index()].load(Ordering::Relaxed) as f64,
            );
            self.histogram(
                &format!("{prefix}_command_duration_seconds"),
                &format!("Time from a {what} command's data being complete to its status being queued (backend, Seal and queueing)."),
                &l,
                &io.latency[op.index()],
            );
        }
        self.sample(
            &format!("{prefix}_commands_in_flight"),
            &format!("Commands of the {what} at the device server now."),
            "gauge",
            labels,
            c.in_flight as f64,
        );
        for (k, name) in SENSE_KEYS.iter().enumerate() {
            let n = io.sense[k].load(Ordering::Relaxed);
            if n == 0 && k != 0x05 && k != 0x06 {
                // Always show the two keys alerts are written against; others once seen.
                continue;
            }
            let mut l = labels.to_vec();
            l.push(("sense_key", name));
            self.sample(
                &format!("{prefix}_scsi_errors_total"),
                &format!("CHECK CONDITION answers of the {what}, by sense key."),
                "counter",
                &l,
                n as f64,
            );
        }
        self.sample(
            &format!("{prefix}_scsi_other_status_total"),
            &format!("Non-GOOD answers of the {what} without sense data (RESERVATION CONFLICT, BUSY, TASK SET FULL)."),
            "counter",
            labels,
            io.other_status.load(Ordering::Relaxed) as f64,
        );
    }
}

fn render_labels(labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let inner: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", esc(v)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

fn fmt_value(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipsan_scsi::{Sense, SenseKey};

    #[test]
    fn cuts_long_label_values_keeping_distinct_names_apart() {
        let short = "iqn.2026-11.x:host";
        assert_eq!(bounded_label(short), short);
        let a = format!("iqn.2026-11.x:{}a", "é".repeat(100));
        let b = format!("iqn.2026-11.x:{}b", "é".repeat(100));
        let (la, lb) = (bounded_label(&a), bounded_label(&b));
        assert!(la.len() <= MAX_LABEL_BYTES && lb.len() <= MAX_LABEL_BYTES);
        assert_ne!(la, lb);
        assert!(la.starts_with("iqn.2026-11.x:é"));
    }

    #[test]
    fn counts_bytes_from_the_cdb_and_errors_by_sense_key() {
        let table: Arc<LunTable> = Arc::new(RwLock::new(BTreeMap::from([(0, lun_stats(512))])));
        let s = Arc::new(SessionStats::new(Some(table.clone())));
        // WRITE(10) of 8 blocks, READ(10) of 16 blocks, a failing READ.
        let w = [0x2a, 0, 0, 0, 0, 0, 0, 0, 8, 0];
        let r = [0x28, 0, 0, 0, 0, 0, 0, 0, 16, 0];
        s.start(0).done(&w, ScsiStatus::GOOD, None);
        s.start(0).done(&r, ScsiStatus::GOOD, None);
        let sense = Sense::invalid_field_in_cdb();
        assert_eq!(sense.key, SenseKey::ILLEGAL_REQUEST);
        s.start(0)
            .done(&r, ScsiStatus::CHECK_CONDITION, Some(sense.key));
        let c = crate::read(&table)[&0].counts();
        assert_eq!((c.write_bytes, c.read_bytes), (4096, 8192));
        assert_eq!((c.read_commands, c.write_commands, c.errors), (2, 1, 1));
        assert_eq!(c.in_flight, 0);
        assert_eq!(s.io.counts(), c);
        let mut e = Exposition::default();
        e.io(
            "ipsan_lun",
            "LUN",
            &[("target", "t\"x"), ("lun", "0")],
            &crate::read(&table)[&0],
        );
        let text = e.render();
        assert!(
            text.contains("ipsan_lun_bytes_total{target=\"t\\\"x\",lun=\"0\",op=\"read\"} 8192"),
            "{text}"
        );
        assert!(text.contains("ipsan_lun_scsi_errors_total{target=\"t\\\"x\",lun=\"0\",sense_key=\"illegal_request\"} 1"), "{text}");
        assert!(text.contains("ipsan_lun_command_duration_seconds_count{target=\"t\\\"x\",lun=\"0\",op=\"read\"} 2"), "{text}");
        assert_eq!(
            text.matches("# TYPE ipsan_lun_commands_total counter")
                .count(),
            1
        );
    }
}
