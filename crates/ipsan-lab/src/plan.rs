//! Plans: a TOML matrix of experiment points (issue 6), and the built-in plans.
//!
//! ```toml
//! name = "mine"
//! repetitions = 3          # per point; the results keep median, min and max
//! run_time = "5s"          # how long each bench run lasts, at least…
//! min_rtts = 60            # …this many calibrated round trips (64 ms each way: 7.7 s)
//! steady = false          # true: throughput over each run's second half (bench's trace)
//! fresh_link = false       # true: a new link for every repetition, repetitions round-robin
//! queue = "1000"           # the bottleneck's queue when a rate is set: packets, or "64mb"
//! tcp_buffer = "kernel"    # or a size ("16MiB"): SO_SNDBUF/SO_RCVBUF of the iSCSI
//!                          # connection at both ends instead of the kernel's autotuning
//! lun = "mem:512MiB"       # target LUN when backend = "mem" (null:… and file:… likewise)
//!
//! [[matrix]]               # each [[matrix]] table is a cartesian product; tables add up
//! direction = ["write"]    # write | read
//! delay = ["0ms", "8ms"]   # one-way delay, both directions
//! loss = [0.0]             # per-direction probability
//! reorder = [0.0]
//! corrupt = [0.0]
//! rate = [0]               # bottleneck, Mbit/s each way (0: none)
//! load = [0.0]             # offered load, a fraction of `rate` (0: as fast as it goes):
//!                          # iperf3's -b, ipsan bench's --rate; Muknahallipatna et al.'s
//!                          # (002) Fig. 9
//! block = ["64KiB", "1MiB"]
//! depth = ["1", "auto"]    # the papers' OP-n; "auto" lets the model pick
//! cipher = ["aes-256-gcm"] # aes-256-gcm | chacha20-poly1305 | 3des-cbc-hmac-sha1
//! pipeline = [true]        # seal's pipeline (seal-seq forces it off)
//! crypto_workers = [0]     # seal's crypto threads per host, target and initiator alike
//!                          # (0: one per CPU, the default); 1 is the papers' one-CPU host
//! scheme = ["plain", "seal"] # plain | seal-seq | seal | wireguard | tls | ipsec | esp-emu | iperf3
//! backend = ["mem"]        # mem | null | file | disk (ipsan-block's disk model)
//! iscsi = ["ipsan"]        # ipsan (one round trip) | paper (InitialR2T=Yes, ImmediateData=No)
//! cc = ["reno"]            # TCP congestion control inside the lab's namespaces
//! repetitions = 7          # optional: this table's points get 7, not the plan's
//!
//! [timeline]               # optional: trace a short run per scheme and draw the
//! delay = "8ms"            # per-command timeline (defaults shown)
//! block = "64KiB"
//! cipher = "3des-cbc-hmac-sha1"
//! scheme = ["seal-seq", "seal"]
//! depth = 8
//! iscsi = "paper"          # InitialR2T=Yes + ImmediateData=No, so R2Ts show
//! run_time = "1s"
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::model;

/// A plan that cannot be used, with the reason.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("plan {plan}: {why}")]
pub struct PlanError {
    /// The plan's name or file.
    pub plan: String,
    /// What is wrong.
    pub why: String,
}

/// Security schemes (issue 6 "Security schemes compared").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scheme {
    /// No encryption: the ceiling.
    Plain,
    /// Seal with its pipeline off (the papers' "without optimization").
    SealSeq,
    /// Seal with its pipeline on.
    Seal,
    /// wireguard-go between the namespaces (ChaCha20-Poly1305 per IP packet).
    Wireguard,
    /// stunnel between the namespaces (TLS 1.3).
    Tls,
    /// strongSwan's charon in each namespace: IKEv2 + PSK, userspace ESP in UDP, tunnel
    /// mode with host-to-host selectors (see [`crate::ipsec`]).
    Ipsec,
    /// The emulator doing ESP's per-packet 3DES-CBC + HMAC-SHA1-96 (see [`crate::esp`]); the
    /// fallback where strongSwan is absent.
    EspEmu,
    /// No iSCSI: one iperf3 TCP stream through the same link, Aiken et al.'s network
    /// baseline (the most any protocol on this link could move).
    Iperf3,
}

impl Scheme {
    /// Every scheme, in report order.
    pub const ALL: [Scheme; 8] = [
        Scheme::Plain,
        Scheme::SealSeq,
        Scheme::Seal,
        Scheme::Wireguard,
        Scheme::Tls,
        Scheme::Ipsec,
        Scheme::EspEmu,
        Scheme::Iperf3,
    ];

    /// The name used in plans and results.
    pub fn name(self) -> &'static str {
        match self {
            Scheme::Plain => "plain",
            Scheme::SealSeq => "seal-seq",
            Scheme::Seal => "seal",
            Scheme::Wireguard => "wireguard",
            Scheme::Tls => "tls",
            Scheme::Ipsec => "ipsec",
            Scheme::EspEmu => "esp-emu",
            Scheme::Iperf3 => "iperf3",
        }
    }

    /// Encryption below TCP (one serial stream per direction).
    pub fn lower_layer(self) -> bool {
        matches!(
            self,
            Scheme::Wireguard | Scheme::Tls | Scheme::Ipsec | Scheme::EspEmu
        )
    }

    /// Seal above SCSI.
    pub fn is_seal(self) -> bool {
        matches!(self, Scheme::Seal | Scheme::SealSeq)
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Read or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Sequential write (2008 paper).
    Write,
    /// Sequential read (2006 papers).
    Read,
}

impl Direction {
    /// `write` or `read`.
    pub fn name(self) -> &'static str {
        match self {
            Direction::Write => "write",
            Direction::Read => "read",
        }
    }
}

/// iSCSI login parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IscsiMode {
    /// ipsan's defaults: immediate/unsolicited data, one round trip per write.
    Ipsan,
    /// The papers' write cycle: InitialR2T=Yes, ImmediateData=No (two round trips).
    Paper,
}

/// A fixed depth or the model's choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Depth {
    /// Exactly this many commands in flight.
    Fixed(u32),
    /// Picked from the calibrated model ([`model::auto_depth`]).
    Auto,
}

impl fmt::Display for Depth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Depth::Fixed(n) => write!(f, "{n}"),
            Depth::Auto => f.write_str("auto"),
        }
    }
}

/// Target backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// RAM LUN.
    Mem,
    /// Discards writes, reads zeros (Aiken et al.'s diskless target).
    Null,
    /// A sparse file in the run's scratch directory.
    File,
    /// RAM whose requests take a single disk's time (`disk:` in ipsan-block: one head,
    /// seek + half a revolution + transfer, 8.5 ms / 7200 rpm / 30 MB/s).
    Disk,
}

/// One `[[matrix]]` table as written.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MatrixSpec {
    #[serde(default = "d_direction")]
    direction: Vec<Direction>,
    #[serde(default = "d_delay")]
    delay: Vec<String>,
    #[serde(default = "d_zero")]
    loss: Vec<f64>,
    #[serde(default = "d_zero")]
    reorder: Vec<f64>,
    #[serde(default = "d_zero")]
    corrupt: Vec<f64>,
    #[serde(default = "d_zero")]
    rate: Vec<f64>,
    /// Offered load as a fraction of `rate` (iperf3's `-b`); 0: unlimited.
    #[serde(default = "d_zero")]
    load: Vec<f64>,
    #[serde(default = "d_block")]
    block: Vec<String>,
    #[serde(default = "d_depth")]
    depth: Vec<String>,
    #[serde(default = "d_cipher")]
    cipher: Vec<String>,
    #[serde(default = "d_pipeline")]
    pipeline: Vec<bool>,
    /// Seal's crypto threads on each host (`--crypto-workers` of target and bench); 0: one
    /// per CPU. Seal schemes only.
    #[serde(default = "d_crypto_workers")]
    crypto_workers: Vec<u32>,
    #[serde(default = "d_scheme")]
    scheme: Vec<Scheme>,
    #[serde(default = "d_backend")]
    backend: Vec<Backend>,
    #[serde(default = "d_iscsi")]
    iscsi: Vec<IscsiMode>,
    #[serde(default = "d_cc")]
    cc: Vec<String>,
    /// Repetitions of this table's points, instead of the plan's (a point in two tables
    /// gets the larger). For cells whose spread is the host's rather than the link's — a
    /// CPU-bound tunnel on two shared vCPUs — without lengthening the rest of the plan.
    #[serde(default)]
    repetitions: Option<u32>,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

fn is_zero_u32(x: &u32) -> bool {
    *x == 0
}

fn d_direction() -> Vec<Direction> {
    vec![Direction::Write]
}
fn d_delay() -> Vec<String> {
    vec!["0ms".into()]
}
fn d_zero() -> Vec<f64> {
    vec![0.0]
}
fn d_block() -> Vec<String> {
    vec!["64KiB".into()]
}
fn d_depth() -> Vec<String> {
    vec!["auto".into()]
}
fn d_cipher() -> Vec<String> {
    vec!["aes-256-gcm".into()]
}
fn d_pipeline() -> Vec<bool> {
    vec![true]
}
fn d_crypto_workers() -> Vec<u32> {
    vec![0]
}
fn d_scheme() -> Vec<Scheme> {
    vec![Scheme::Plain]
}
fn d_backend() -> Vec<Backend> {
    vec![Backend::Mem]
}
fn d_iscsi() -> Vec<IscsiMode> {
    vec![IscsiMode::Ipsan]
}
fn d_cc() -> Vec<String> {
    vec!["reno".into()]
}
fn d_reps() -> u32 {
    1
}
fn d_run_time() -> String {
    "3s".into()
}
fn d_lun() -> String {
    "mem:256MiB".into()
}

/// A plan as written in TOML.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PlanSpec {
    /// Name shown in the report.
    pub name: String,
    /// One paragraph on what the plan reproduces.
    #[serde(default)]
    pub description: String,
    /// Repetitions per point.
    #[serde(default = "d_reps")]
    pub repetitions: u32,
    /// Duration of each bench run.
    #[serde(default = "d_run_time")]
    pub run_time: String,
    /// LUN size spec for `mem`/`null`/`file` (`mem:256MiB`; the kind is replaced by backend).
    #[serde(default = "d_lun")]
    pub lun: String,
    /// Largest depth `auto` may pick.
    #[serde(default)]
    pub max_depth: Option<u32>,
    /// Each run lasts at least this many calibrated round trips, so long-delay runs cover
    /// slow start and enough command cycles to mean something (default 60).
    #[serde(default)]
    pub min_rtts: Option<u32>,
    /// Report each run's throughput over its second half (from bench's per-command trace),
    /// past TCP's slow start and depth auto's search, instead of over the whole run.
    #[serde(default)]
    pub steady: bool,
    /// Bring the link (namespaces, WAN emulator, calibration) up anew for every repetition,
    /// and run the repetitions round-robin over the plan's points (every point once, then
    /// every point again) instead of back to back on one link. Repetitions on one link share
    /// its state — where the scheduler put the emulator's threads, what the calibration
    /// measured — so their spread understates how much a result varies from one run of the
    /// plan to the next; and back-to-back repetitions of one point meet the same minute of
    /// the host's load. Costs a link set-up and a calibration per repetition (a few seconds).
    #[serde(default)]
    pub fresh_link: bool,
    /// The bottleneck queue of a rate-limited link, both directions: `1000` packets (the
    /// default, as tc's) or a size in bytes (`64mb`; k and m are 1024 as in tc). Arrivals
    /// beyond it are tail-dropped, so a queue shorter than what the iSCSI connection keeps in
    /// flight makes Reno lose packets every few round trips.
    #[serde(default)]
    pub queue: Option<String>,
    /// `kernel` (default: the kernel's buffer autotuning) or a size: SO_SNDBUF and SO_RCVBUF
    /// of the iSCSI connection at both ends (`--tcp-sndbuf/--tcp-rcvbuf` of target and
    /// bench). On a long link the receiver's autotuning can keep a 64 KiB window for seconds
    /// (docs/results/lab.md, "Why the demo was bimodal"); a fixed buffer above the
    /// bandwidth-delay product takes it out of the measurement.
    #[serde(default)]
    pub tcp_buffer: Option<String>,
    /// The matrices.
    pub matrix: Vec<MatrixSpec>,
    /// A short traced run per scheme for the command timeline.
    #[serde(default)]
    pub timeline: Option<TimelineSpec>,
}

/// `[timeline]`: short traced runs drawn as the per-command timeline (the papers' packet
/// visualisations: Kamisaka et al. 2006 (004), Fig. 5–6).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TimelineSpec {
    #[serde(default = "tl_delay")]
    delay: String,
    #[serde(default = "tl_block")]
    block: String,
    #[serde(default = "tl_cipher")]
    cipher: String,
    #[serde(default = "tl_scheme")]
    scheme: Vec<Scheme>,
    #[serde(default = "tl_depth")]
    depth: u32,
    #[serde(default = "tl_iscsi")]
    iscsi: IscsiMode,
    #[serde(default = "tl_run_time")]
    run_time: String,
}

fn tl_delay() -> String {
    "8ms".into()
}
fn tl_block() -> String {
    "64KiB".into()
}
fn tl_cipher() -> String {
    "3des-cbc-hmac-sha1".into()
}
fn tl_scheme() -> Vec<Scheme> {
    vec![Scheme::SealSeq, Scheme::Seal]
}
fn tl_depth() -> u32 {
    8
}
fn tl_iscsi() -> IscsiMode {
    IscsiMode::Paper
}
fn tl_run_time() -> String {
    "1s".into()
}

/// The timeline runs, resolved.
#[derive(Debug, Clone, Serialize)]
pub struct Timeline {
    /// One point per scheme (same link).
    pub points: Vec<Point>,
    /// How long each traced run lasts.
    pub run_time: Duration,
}

/// One point of the matrix, fully resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// write or read.
    pub direction: Direction,
    /// One-way delay, milliseconds.
    pub delay_ms: f64,
    /// Loss probability per direction.
    pub loss: f64,
    /// Reorder probability.
    pub reorder: f64,
    /// Corruption probability.
    pub corrupt: f64,
    /// Bottleneck rate each way, Mbit/s (0: none).
    #[serde(default)]
    pub rate_mbit: f64,
    /// Offered load, a fraction of `rate_mbit` (iperf3 `-b`, `ipsan bench --rate`; 0:
    /// unlimited). Muknahallipatna et al. (002) Fig. 9 steps it from 10 % to 90 % of the link.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub load: f64,
    /// Bytes per command.
    pub block: u64,
    /// Commands in flight.
    pub depth: Depth,
    /// Seal cipher (or the lower-layer cipher the scheme uses, for the record).
    pub cipher: String,
    /// Seal pipeline on/off.
    pub pipeline: bool,
    /// Seal's crypto threads per host (`ipsan target` and `ipsan bench --crypto-workers`);
    /// 0: one per CPU, the binaries' default. 1 gives seal the crypto parallelism of the
    /// papers' one-CPU hosts and of the IPsec baseline's one ESP stream per direction: one
    /// command's data is then sealed and opened serially, as their processes did (2006 (001)
    /// Tables 2 and 4 with one process). Absent from a point's JSON when 0, so records from
    /// before the key compare equal.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub crypto_workers: u32,
    /// Security scheme.
    pub scheme: Scheme,
    /// Target backend.
    pub backend: Backend,
    /// iSCSI login parameters.
    pub iscsi: IscsiMode,
    /// TCP congestion control.
    pub cc: String,
}

impl Point {
    /// The crypto workers that seal and open this point's commands on a host with `cpus`
    /// CPUs, as the models count them: 1 for seal-seq (inline, no pool), the plan's
    /// `crypto_workers` when set (at most `cpus`), else one per CPU.
    pub fn seal_crypto_workers(&self, cpus: u32) -> u32 {
        if self.scheme == Scheme::SealSeq {
            1
        } else if self.crypto_workers > 0 {
            self.crypto_workers.min(cpus.max(1))
        } else {
            cpus.max(1)
        }
    }

    /// The offered load in bytes per second (`load` × `rate`), what `ipsan bench --rate` and
    /// iperf3's `-b` are given; `None` when the point offers no load.
    pub fn offered_bytes_per_s(&self) -> Option<u64> {
        (self.load > 0.0 && self.rate_mbit > 0.0)
            .then(|| (self.load * self.rate_mbit * 125_000.0).round() as u64)
    }

    /// A short human label.
    pub fn label(&self) -> String {
        format!(
            "{} {} {}ms bs={} depth={} {} {}{}",
            self.scheme,
            self.direction.name(),
            self.delay_ms,
            fmt_size(self.block),
            self.depth,
            self.cipher,
            match self.iscsi {
                IscsiMode::Ipsan => "1rtt",
                IscsiMode::Paper => "2rtt",
            },
            if self.loss + self.reorder + self.corrupt > 0.0 {
                format!(
                    " loss={} reorder={} corrupt={}",
                    self.loss, self.reorder, self.corrupt
                )
            } else {
                String::new()
            }
        ) + &if self.rate_mbit > 0.0 {
            format!(" {}Mbit/s", self.rate_mbit)
        } else {
            String::new()
        } + &if self.load > 0.0 {
            format!(" load={}%", (self.load * 100.0).round())
        } else {
            String::new()
        } + &if self.crypto_workers > 0 {
            format!(" workers={}", self.crypto_workers)
        } else {
            String::new()
        }
    }

    /// Round trips per command (RFC 7143 §11.8, R2T): 2 for a write that waits for an R2T —
    /// the papers' write (InitialR2T=Yes, ImmediateData=No) always, ipsan's when the block is
    /// larger than the negotiated FirstBurstLength (`first_burst`; ipsan's default 256 KiB
    /// when unknown) — else 1 (a read: command, then Data-In with the status).
    pub fn round_trips(&self, first_burst: Option<u64>) -> u32 {
        let waits_for_r2t = match self.direction {
            Direction::Read => false,
            Direction::Write => match self.iscsi {
                IscsiMode::Paper => true,
                IscsiMode::Ipsan => self.block > first_burst.unwrap_or(256 * 1024),
            },
        };
        if waits_for_r2t {
            2
        } else {
            1
        }
    }

    /// The link settings this point needs (points sharing them share a calibration).
    pub fn link_key(&self) -> String {
        format!(
            "{}|{}|{}|{}|{}|{}",
            self.delay_ms, self.loss, self.reorder, self.corrupt, self.cc, self.rate_mbit
        )
    }
}

/// The cipher (OpenSSL's name) and TLS 1.3 suite the `tls` scheme runs for a point's
/// `cipher`: ChaCha20-Poly1305 for `chacha20-poly1305`, AES-256-GCM for any other.
pub(crate) fn tls_cipher(seal_cipher: &str) -> (&'static str, &'static str) {
    if seal_cipher == "chacha20-poly1305" {
        ("chacha20-poly1305", "TLS_CHACHA20_POLY1305_SHA256")
    } else {
        ("aes-256-gcm", "TLS_AES_256_GCM_SHA384")
    }
}

/// Adds `p` with `reps` repetitions to the plan's points, once: a point already there (from
/// another table; `seen` maps its JSON to its index) keeps the larger count.
fn add_point(
    points: &mut Vec<(Point, u32)>,
    seen: &mut BTreeMap<String, usize>,
    p: Point,
    reps: u32,
) {
    let key = serde_json::to_string(&p).unwrap_or_default();
    match seen.get(&key) {
        Some(&i) => points[i].1 = points[i].1.max(reps),
        None => {
            seen.insert(key, points.len());
            points.push((p, reps));
        }
    }
}

/// `65536` → `64KiB`.
pub fn fmt_size(b: u64) -> String {
    if b >= 1 << 20 && b % (1 << 20) == 0 {
        format!("{}MiB", b >> 20)
    } else if b >= 1024 && b % 1024 == 0 {
        format!("{}KiB", b >> 10)
    } else {
        format!("{b}B")
    }
}

/// A parsed, validated plan.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// Name.
    pub name: String,
    /// Description.
    pub description: String,
    /// Repetitions per point, unless its table says otherwise ([`Plan::repetitions_of`]).
    pub repetitions: u32,
    /// Repetitions of each point, in the order of `points`.
    pub point_repetitions: Vec<u32>,
    /// Each bench run's duration.
    pub run_time: Duration,
    /// LUN size in bytes.
    pub lun_bytes: u64,
    /// Largest depth `auto` may pick.
    pub max_depth: u32,
    /// Each run lasts at least this many calibrated round trips ([`Plan::run_time_for`]).
    pub min_rtts: u32,
    /// Throughput over each run's second half (see [`PlanSpec::steady`]).
    pub steady: bool,
    /// A new link per repetition, repetitions round-robin (see [`PlanSpec::fresh_link`]).
    pub fresh_link: bool,
    /// The bottleneck queue of rate-limited links (see [`PlanSpec::queue`]).
    pub queue: ipsan_wan::config::QueueLimit,
    /// Socket buffers of the iSCSI connection in bytes, `None` for the kernel's autotuning
    /// (see [`PlanSpec::tcp_buffer`]).
    pub tcp_buffer: Option<u64>,
    /// Every point, in run order (grouped by link so calibrations are reused).
    pub points: Vec<Point>,
    /// Traced runs for the command timeline, if the plan asks for them.
    pub timeline: Option<Timeline>,
}

/// The built-in plans' names.
pub const BUILTIN: [&str; 11] = [
    "quick",
    "smoke",
    "paper-write",
    "paper-fig16",
    "paper-regime",
    "paper-read",
    "aiken",
    "pathologies",
    "aiken-table1",
    "offered-load",
    "demo",
];

/// The TOML of a built-in plan.
pub fn builtin_toml(name: &str) -> Option<&'static str> {
    Some(match name {
        "quick" => include_str!("../plans/quick.toml"),
        "smoke" => include_str!("../plans/smoke.toml"),
        "paper-write" => include_str!("../plans/paper-write.toml"),
        "paper-read" => include_str!("../plans/paper-read.toml"),
        "pathologies" => include_str!("../plans/pathologies.toml"),
        "paper-fig16" => include_str!("../plans/paper-fig16.toml"),
        "paper-regime" => include_str!("../plans/paper-regime.toml"),
        "aiken" => include_str!("../plans/aiken.toml"),
        "aiken-table1" => include_str!("../plans/aiken-table1.toml"),
        "offered-load" => include_str!("../plans/offered-load.toml"),
        "demo" => include_str!("../plans/demo.toml"),
        _ => return None,
    })
}

impl Plan {
    /// A built-in plan by name, or a TOML file by path.
    pub fn load(name_or_path: &str) -> Result<Plan, PlanError> {
        if let Some(t) = builtin_toml(name_or_path) {
            return Plan::parse(name_or_path, t);
        }
        let text = std::fs::read_to_string(name_or_path).map_err(|e| PlanError {
            plan: name_or_path.into(),
            why: format!(
                "not a built-in plan ({}) and cannot read it as a file: {e}",
                BUILTIN.join(", ")
            ),
        })?;
        Plan::parse(name_or_path, &text)
    }

    /// Parses and validates plan TOML.
    pub fn parse(origin: &str, text: &str) -> Result<Plan, PlanError> {
        let err = |why: String| PlanError {
            plan: origin.into(),
            why,
        };
        let spec: PlanSpec = toml::from_str(text).map_err(|e| err(e.to_string()))?;
        if spec.repetitions == 0 || spec.repetitions > 100 {
            return Err(err("repetitions must be 1..=100".into()));
        }
        let run_time = model::parse_duration(&spec.run_time).map_err(&err)?;
        if run_time < Duration::from_millis(200) || run_time > Duration::from_secs(3600) {
            return Err(err("run_time must be between 200ms and 1h".into()));
        }
        let lun_size = spec
            .lun
            .split_once(':')
            .map_or(spec.lun.as_str(), |(_, s)| s);
        let lun_bytes = model::parse_size(lun_size).map_err(&err)?;
        let max_depth = spec.max_depth.unwrap_or(128);
        if !(1..=4096).contains(&max_depth) {
            return Err(err("max_depth must be 1..=4096".into()));
        }
        let min_rtts = spec.min_rtts.unwrap_or(60);
        if min_rtts > 10_000 {
            return Err(err("min_rtts must be 0..=10000".into()));
        }
        let tcp_buffer = match spec.tcp_buffer.as_deref().map(str::trim) {
            None | Some("kernel") => None,
            Some(b) => {
                let n = model::parse_size(b).map_err(&err)?;
                if !(64 << 10..1 << 30).contains(&n) {
                    return Err(err(
                        "tcp_buffer must be kernel or 64KiB up to 1GiB (exclusive)".into(),
                    ));
                }
                Some(n)
            }
        };
        let queue = match spec.queue.as_deref().map(str::trim) {
            None => ipsan_wan::config::QueueLimit::default(),
            Some(q) => {
                ipsan_wan::config::parse_queue("queue", q).map_err(|e| err(e.to_string()))?
            }
        };
        if spec.matrix.is_empty() {
            return Err(err("no [[matrix]] table".into()));
        }
        let mut points: Vec<(Point, u32)> = Vec::new();
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        for (mi, m) in spec.matrix.iter().enumerate() {
            let ctx = |why: String| err(format!("matrix #{}: {why}", mi + 1));
            let reps = m.repetitions.unwrap_or(spec.repetitions);
            if reps == 0 || reps > 100 {
                return Err(ctx("repetitions must be 1..=100".into()));
            }
            let delays = m
                .delay
                .iter()
                .map(|d| model::parse_duration(d).map(|d| d.as_secs_f64() * 1e3))
                .collect::<Result<Vec<_>, _>>()
                .map_err(ctx)?;
            let blocks = m
                .block
                .iter()
                .map(|b| model::parse_size(b))
                .collect::<Result<Vec<_>, _>>()
                .map_err(ctx)?;
            for b in &blocks {
                if *b % 512 != 0 || *b > 16 << 20 {
                    return Err(ctx(format!(
                        "block {b} must be a multiple of 512 and at most 16 MiB"
                    )));
                }
            }
            let depths = m
                .depth
                .iter()
                .map(|d| parse_depth(d))
                .collect::<Result<Vec<_>, _>>()
                .map_err(ctx)?;
            for r in &m.rate {
                if !(0.0..=100_000.0).contains(r) {
                    return Err(ctx(format!("rate {r} Mbit/s is outside 0..=100000")));
                }
            }
            for l in &m.load {
                if !(0.0..=1.0).contains(l) {
                    return Err(ctx(format!(
                        "load {l} is outside [0, 1] (a fraction of rate)"
                    )));
                }
                if *l > 0.0 && m.rate.iter().any(|r| *r <= 0.0) {
                    return Err(ctx("load needs a rate (it is a fraction of it)".into()));
                }
            }
            for p in m.loss.iter().chain(&m.reorder).chain(&m.corrupt) {
                if !(0.0..=1.0).contains(p) {
                    return Err(ctx(format!("probability {p} is outside [0, 1]")));
                }
            }
            for c in &m.cipher {
                if ipsan_seal::Cipher::from_name(c).is_none() {
                    return Err(ctx(format!(
                        "unknown cipher {c:?} (aes-256-gcm, chacha20-poly1305, 3des-cbc-hmac-sha1, none)"
                    )));
                }
            }
            for cc in &m.cc {
                if cc.is_empty()
                    || cc.len() > 15
                    || !cc.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                {
                    return Err(ctx(format!("congestion control {cc:?} is not a name")));
                }
            }
            for &w in &m.crypto_workers {
                if w > 256 {
                    return Err(ctx(format!(
                        "crypto_workers {w} must be 0 (one per CPU) up to 256"
                    )));
                }
                if w > 0 && m.scheme.iter().any(|s| !s.is_seal()) {
                    return Err(ctx(format!(
                        "crypto_workers {w} applies to seal and seal-seq only (the other \
                         schemes' crypto is not ipsan's); give them a table of their own"
                    )));
                }
            }
            for &direction in &m.direction {
                for &delay_ms in &delays {
                    for &rate_mbit in &m.rate {
                        for &loss in &m.loss {
                            for &reorder in &m.reorder {
                                for &corrupt in &m.corrupt {
                                    for cc in &m.cc {
                                        for &scheme in &m.scheme {
                                            for &block in &blocks {
                                                for &depth in &depths {
                                                    for cipher in &m.cipher {
                                                        for (&pipeline, &crypto_workers) in
                                                            m.pipeline.iter().flat_map(|p| {
                                                                m.crypto_workers
                                                                    .iter()
                                                                    .map(move |w| (p, w))
                                                            })
                                                        {
                                                            for &backend in &m.backend {
                                                                for (&iscsi, &load) in
                                                                    m.iscsi.iter().flat_map(|i| {
                                                                        m.load
                                                                            .iter()
                                                                            .map(move |l| (i, l))
                                                                    })
                                                                {
                                                                    let p = Point {
                                                                        direction,
                                                                        delay_ms,
                                                                        loss,
                                                                        reorder,
                                                                        corrupt,
                                                                        rate_mbit,
                                                                        load,
                                                                        block,
                                                                        depth,
                                                                        cipher: cipher.clone(),
                                                                        pipeline: pipeline
                                                                            && scheme
                                                                                != Scheme::SealSeq,
                                                                        crypto_workers,
                                                                        scheme,
                                                                        backend,
                                                                        iscsi,
                                                                        cc: cc.clone(),
                                                                    };
                                                                    add_point(
                                                                        &mut points,
                                                                        &mut seen,
                                                                        p,
                                                                        reps,
                                                                    );
                                                                }
                                                            }
                                                        }
                                                    }
                                                }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        // Group by link (stable), so each link comes up and is calibrated once.
        let mut order: Vec<String> = Vec::new();
        for (p, _) in &points {
            let k = p.link_key();
            if !order.contains(&k) {
                order.push(k);
            }
        }
        points.sort_by_key(|(p, _)| order.iter().position(|k| *k == p.link_key()));
        let (points, point_repetitions): (Vec<Point>, Vec<u32>) = points.into_iter().unzip();
        if points.len() > 5000 {
            return Err(err(format!("{} points is more than 5000", points.len())));
        }
        let timeline = match &spec.timeline {
            None => None,
            Some(t) => Some(resolve_timeline(t).map_err(|why| err(format!("[timeline]: {why}")))?),
        };
        Ok(Plan {
            timeline,
            name: spec.name,
            description: spec.description,
            repetitions: spec.repetitions,
            point_repetitions,
            run_time,
            lun_bytes,
            max_depth,
            min_rtts,
            steady: spec.steady,
            fresh_link: spec.fresh_link,
            queue,
            tcp_buffer,
            points,
        })
    }

    /// How long one run lasts on a link with round-trip time `rtt`: `run_time`, stretched to
    /// `min_rtts` round trips (capped at 10 × `run_time`). At 64 ms one way the papers'
    /// two-round-trip write completes one command per 256 ms, and Reno needs about six RTTs to
    /// open a megabyte window: 3 s would be a dozen commands, mostly slow start.
    pub fn run_time_for(&self, rtt: Duration) -> Duration {
        let want = rtt.saturating_mul(self.min_rtts);
        want.clamp(self.run_time, self.run_time.saturating_mul(10))
    }

    /// Runs the plan would make, counting repetitions.
    pub fn run_count(&self) -> usize {
        self.point_repetitions.iter().map(|&r| r as usize).sum()
    }

    /// Repetitions of `points[i]`: its table's, or the plan's.
    pub fn repetitions_of(&self, i: usize) -> u32 {
        self.point_repetitions
            .get(i)
            .copied()
            .unwrap_or(self.repetitions)
    }

    /// Every point gets `n` repetitions (`ipsan lab run --repetitions`), whatever its table said.
    pub fn set_repetitions(&mut self, n: u32) {
        self.repetitions = n;
        self.point_repetitions = vec![n; self.points.len()];
    }

    /// Whether every point has the plan's repetitions (no table overrides them).
    pub fn uniform_repetitions(&self) -> bool {
        self.point_repetitions
            .iter()
            .all(|&r| r == self.repetitions)
    }
}

fn resolve_timeline(t: &TimelineSpec) -> Result<Timeline, String> {
    let delay_ms = model::parse_duration(&t.delay)?.as_secs_f64() * 1e3;
    let block = model::parse_size(&t.block)?;
    if block % 512 != 0 || block > 16 << 20 {
        return Err(format!(
            "block {block} must be a multiple of 512 and at most 16 MiB"
        ));
    }
    if ipsan_seal::Cipher::from_name(&t.cipher).is_none() {
        return Err(format!("unknown cipher {:?}", t.cipher));
    }
    if !(1..=256).contains(&t.depth) {
        return Err("depth must be 1..=256".into());
    }
    let run_time = model::parse_duration(&t.run_time)?;
    if run_time < Duration::from_millis(200) || run_time > Duration::from_secs(60) {
        return Err("run_time must be between 200ms and 60s".into());
    }
    if t.scheme.is_empty() || t.scheme.iter().any(|s| !s.is_seal() && *s != Scheme::Plain) {
        return Err("scheme must list plain, seal-seq or seal (the bench traces them)".into());
    }
    let points = t
        .scheme
        .iter()
        .map(|&scheme| Point {
            direction: Direction::Write,
            delay_ms,
            loss: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
            rate_mbit: 0.0,
            load: 0.0,
            block,
            depth: Depth::Fixed(if scheme == Scheme::SealSeq {
                1
            } else {
                t.depth
            }),
            cipher: t.cipher.clone(),
            pipeline: scheme != Scheme::SealSeq,
            crypto_workers: 0,
            scheme,
            backend: Backend::Mem,
            iscsi: t.iscsi,
            cc: "reno".into(),
        })
        .collect();
    Ok(Timeline { points, run_time })
}

fn parse_depth(s: &str) -> Result<Depth, String> {
    if s.eq_ignore_ascii_case("auto") {
        return Ok(Depth::Auto);
    }
    match s.parse::<u32>() {
        Ok(n) if (1..=4096).contains(&n) => Ok(Depth::Fixed(n)),
        _ => Err(format!("depth {s:?} must be 1..=4096 or auto")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_plans_parse() {
        for name in BUILTIN.iter().chain(&["demo"]) {
            let p = Plan::load(name).unwrap();
            assert!(!p.points.is_empty(), "{name}");
        }
    }

    /// The demo's 1 Gbit/s link has a queue deeper than what it keeps in flight; other plans
    /// keep tc's 1000 packets; a queue of zero or a fraction is refused.
    #[test]
    fn accepts_a_queue_and_defaults_to_1000_packets() {
        use ipsan_wan::config::QueueLimit;
        let demo = Plan::load("demo").unwrap();
        assert_eq!(demo.queue, QueueLimit::Bytes(64 << 20));
        assert!(demo.points.iter().all(|p| p.rate_mbit == 1000.0));
        assert_eq!(
            Plan::load("quick").unwrap().queue,
            QueueLimit::Packets(1000)
        );
        for bad in ["0", "1.5", "12 parsecs"] {
            let toml =
                format!("name = \"q\"\nqueue = \"{bad}\"\n[[matrix]]\nscheme = [\"plain\"]\n");
            let e = Plan::parse("q", &toml).unwrap_err().why;
            assert!(e.contains("queue"), "{bad}: {e}");
        }
    }

    /// The demo fixes its socket buffers (the 64 ms cells were bimodal under the kernel's
    /// receive autotuning); plans without the key keep the kernel's.
    #[test]
    fn accepts_tcp_buffer_and_defaults_to_kernel() {
        assert_eq!(Plan::load("demo").unwrap().tcp_buffer, Some(32 << 20));
        assert_eq!(Plan::load("quick").unwrap().tcp_buffer, None);
        let body = "[[matrix]]\nscheme = [\"plain\"]\n";
        let with =
            |v: &str| Plan::parse("t", &format!("name = \"t\"\ntcp_buffer = \"{v}\"\n{body}"));
        assert_eq!(with("kernel").unwrap().tcp_buffer, None);
        assert_eq!(with("8MiB").unwrap().tcp_buffer, Some(8 << 20));
    }

    #[test]
    fn rejects_tcp_buffer_out_of_range() {
        let body = "[[matrix]]\nscheme = [\"plain\"]\n";
        for v in ["1KiB", "2GiB", "lots"] {
            let r = Plan::parse("t", &format!("name = \"t\"\ntcp_buffer = \"{v}\"\n{body}"));
            assert!(r.is_err(), "{v}");
        }
    }

    /// The quick plan is what issue 6 lists: writes at 0/8/64 ms, 64 KiB and 1 MiB, five
    /// schemes with AES-256-GCM, plus 3DES at 64 ms for seal-seq, seal and esp-emu.
    #[test]
    fn quick_plan_covers_the_issue_matrix() {
        let p = Plan::load("quick").unwrap();
        for delay in [0.0, 8.0, 64.0] {
            for block in [65536, 1 << 20] {
                for s in [
                    Scheme::Plain,
                    Scheme::SealSeq,
                    Scheme::Seal,
                    Scheme::Wireguard,
                    Scheme::Tls,
                ] {
                    assert!(
                        p.points.iter().any(|x| x.delay_ms == delay
                            && x.block == block
                            && x.scheme == s
                            && x.cipher == "aes-256-gcm"),
                        "{s} {delay} {block}"
                    );
                }
            }
        }
        for s in [Scheme::SealSeq, Scheme::Seal, Scheme::Ipsec] {
            assert!(p
                .points
                .iter()
                .any(|x| x.delay_ms == 64.0 && x.scheme == s && x.cipher == "3des-cbc-hmac-sha1"));
        }
        assert!(p
            .points
            .iter()
            .all(|x| x.scheme != Scheme::SealSeq || !x.pipeline));
    }

    #[test]
    fn rejects_bad_plans() {
        let bad = [
            "name='x'\n",
            "name='x'\n[[matrix]]\nscheme=['nope']\n",
            "name='x'\n[[matrix]]\ndelay=['8']\n",
            "name='x'\n[[matrix]]\nblock=['1000']\n",
            "name='x'\n[[matrix]]\nloss=[2.0]\n",
            "name='x'\n[[matrix]]\ncipher=['rot13']\n",
            "name='x'\n[[matrix]]\ndepth=['0']\n",
            "name='x'\n[[matrix]]\ncc=['a b']\n",
            "name='x'\nrepetitions=0\n[[matrix]]\n",
            "name='x'\nbogus=1\n[[matrix]]\n",
        ];
        for t in bad {
            assert!(Plan::parse("t", t).is_err(), "{t}");
        }
        assert!(Plan::load("/nonexistent/plan.toml").is_err());
    }

    #[test]
    fn quick_plan_traces_seal_seq_and_seal_for_the_timeline() {
        let p = Plan::load("quick").unwrap();
        let tl = p.timeline.unwrap();
        let schemes: Vec<Scheme> = tl.points.iter().map(|x| x.scheme).collect();
        assert_eq!(schemes, vec![Scheme::SealSeq, Scheme::Seal]);
        assert!(tl.points.iter().all(|x| x.delay_ms == 8.0
            && x.block == 65536
            && x.cipher == "3des-cbc-hmac-sha1"
            && x.iscsi == IscsiMode::Paper));
        assert_eq!(tl.points[0].depth, Depth::Fixed(1));
        assert!(!tl.points[0].pipeline && tl.points[1].pipeline);
        assert!(Plan::load("smoke").unwrap().timeline.is_none());
        let base = "name='x'\n[[matrix]]\n[timeline]\n";
        assert!(Plan::parse("t", base).is_ok(), "defaults suffice");
        for bad in [
            "scheme=['wireguard']",
            "depth=0",
            "block='1000'",
            "cipher='rot13'",
            "run_time='5m'",
            "bogus=1",
        ] {
            assert!(
                Plan::parse("t", &format!("{base}{bad}\n")).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn groups_points_by_link_and_dedups() {
        let t = "name='x'\n[[matrix]]\ndelay=['0ms','8ms']\nscheme=['plain','seal']\n[[matrix]]\ndelay=['0ms']\nscheme=['plain']\n";
        let p = Plan::parse("t", t).unwrap();
        assert_eq!(p.points.len(), 4);
        assert_eq!(p.points[0].delay_ms, p.points[1].delay_ms);
        assert_eq!(p.points[2].delay_ms, p.points[3].delay_ms);
    }

    /// A table's `repetitions` overrides the plan's for its points only; a point in two
    /// tables gets the larger; `--repetitions` (set_repetitions) overrides them all.
    #[test]
    fn a_table_may_repeat_its_points_more() {
        let t = "name='x'
repetitions=3
[[matrix]]
delay=['0ms','8ms']
scheme=['plain']
                 [[matrix]]
delay=['8ms']
scheme=['plain','seal']
repetitions=7
";
        let mut p = Plan::parse("t", t).unwrap();
        let reps = |p: &Plan, delay: f64, s: Scheme| {
            let i = p
                .points
                .iter()
                .position(|q| q.delay_ms == delay && q.scheme == s)
                .unwrap();
            p.repetitions_of(i)
        };
        assert_eq!(p.points.len(), 3);
        assert_eq!(reps(&p, 0.0, Scheme::Plain), 3);
        assert_eq!(reps(&p, 8.0, Scheme::Plain), 7);
        assert_eq!(reps(&p, 8.0, Scheme::Seal), 7);
        assert_eq!(p.run_count(), 17);
        assert!(!p.uniform_repetitions());
        p.set_repetitions(2);
        assert_eq!((p.run_count(), p.repetitions_of(1)), (6, 2));
        assert!(p.uniform_repetitions());
        for bad in ["0", "101"] {
            let t = format!("name='x'\n[[matrix]]\nrepetitions={bad}\n");
            let e = Plan::parse("t", &t).unwrap_err();
            assert!(e.why.contains("matrix #1: repetitions"), "{e}");
        }
    }

    /// 002 Fig. 9: iperf3 offered 10-90 % of a 100 Mbit/s link at Table 1's round trips
    /// (0, 80-200 ms), rates scaled by 1/10 (their 8 MB window at 1 Gbit/s: 800,000 bytes).
    #[test]
    fn offered_load_plan_steps_the_load_at_the_papers_round_trips() {
        let p = Plan::load("offered-load").unwrap();
        assert_eq!(p.tcp_buffer, Some(800_000));
        assert!(p.points.iter().all(|x| x.rate_mbit == 100.0));
        for scheme in [Scheme::Iperf3, Scheme::Plain] {
            for rtt in [0.0, 80.0, 100.0, 120.0, 160.0, 200.0] {
                for load in [0.1, 0.3, 0.5, 0.7, 0.9] {
                    assert!(
                        p.points.iter().any(|x| x.scheme == scheme
                            && x.delay_ms * 2.0 == rtt
                            && (x.load - load).abs() < 1e-9),
                        "{scheme} {rtt} {load}"
                    );
                }
            }
        }
        assert!(
            p.points[0].label().contains("load=10%"),
            "{}",
            p.points[0].label()
        );
        // A point without a load serialises as before (old results.json keep their keys).
        let q = Plan::load("aiken").unwrap();
        assert!(!serde_json::to_string(&q.points[0])
            .unwrap()
            .contains("load"));
    }

    #[test]
    fn rejects_a_load_without_a_rate_or_outside_the_link() {
        for (bad, why) in [
            ("load=[0.5]\nscheme=['iperf3']\n", "needs a rate"),
            ("load=[0.5]\nscheme=['plain']\n", "needs a rate"),
            (
                "load=[1.5]\nrate=[100]\nscheme=['iperf3']\n",
                "outside [0, 1]",
            ),
        ] {
            let e = Plan::parse("t", &format!("name='x'\n[[matrix]]\n{bad}")).unwrap_err();
            assert!(e.why.contains(why), "{bad}: {e}");
        }
    }

    /// 002 Fig. 9 for iSCSI: an offered load on an iSCSI scheme reaches `ipsan bench --rate`
    /// in bytes per second (30 % of 100 Mbit/s: 3.75 MB/s).
    #[test]
    fn accepts_an_offered_load_for_iscsi_in_bytes_per_second() {
        let p = Plan::parse(
            "t",
            "name='x'\n[[matrix]]\nload=[0.3]\nrate=[100]\nscheme=['plain']\n",
        )
        .unwrap();
        assert!(p
            .points
            .iter()
            .all(|x| x.offered_bytes_per_s() == Some(3_750_000)));
        let q = Plan::parse("t", "name='x'\n[[matrix]]\nrate=[100]\nscheme=['plain']\n").unwrap();
        assert!(q.points.iter().all(|x| x.offered_bytes_per_s().is_none()));
    }

    /// Aiken's Table 1 at their delays: all three pathologies at once at 0-20 ms, iperf3 at
    /// the six netperf sizes, plain and seal iSCSI beside it; the aiken plan has a disk LUN.
    #[test]
    fn aiken_table1_puts_the_pathologies_at_every_delay() {
        let p = Plan::load("aiken-table1").unwrap();
        assert_eq!(p.tcp_buffer, Some(500_000));
        assert!(p.points.iter().all(|x| x.loss == 0.027
            && x.reorder == 0.02
            && x.corrupt == 0.0002
            && x.rate_mbit == 100.0));
        for d in [0.0, 1.0, 2.0, 5.0, 10.0, 20.0] {
            for b in [512, 1024, 2048, 4096, 8192, 16384] {
                assert!(p
                    .points
                    .iter()
                    .any(|x| x.delay_ms == d && x.block == b && x.scheme == Scheme::Iperf3));
            }
            for s in [Scheme::Plain, Scheme::Seal] {
                assert!(p.points.iter().any(|x| x.delay_ms == d && x.scheme == s));
            }
        }
        let a = Plan::load("aiken").unwrap();
        assert!(a.points.iter().any(|x| x.backend == Backend::Disk));
    }

    /// `crypto_workers` makes a seal point of its own (its label says so), reaches the
    /// models as that many workers (at most the CPUs; seal-seq always one), and leaves the
    /// JSON of every point without it as it was, so old records still aggregate.
    #[test]
    fn accepts_crypto_workers_for_seal_as_points_of_their_own() {
        let p = Plan::parse(
            "t",
            "name='x'\n[[matrix]]\ndirection=['read']\nscheme=['seal','seal-seq']\ncrypto_workers=[0,1]\n",
        )
        .unwrap();
        assert_eq!(p.points.len(), 4);
        let one: Vec<&Point> = p.points.iter().filter(|x| x.crypto_workers == 1).collect();
        assert_eq!(one.len(), 2);
        assert!(one.iter().all(|x| x.label().ends_with(" workers=1")));
        for x in &p.points {
            let want = match (x.scheme, x.crypto_workers) {
                (Scheme::SealSeq, _) | (_, 1) => 1,
                _ => 2,
            };
            assert_eq!(x.seal_crypto_workers(2), want, "{}", x.label());
        }
        let four = Point {
            crypto_workers: 4,
            ..one[0].clone()
        };
        assert_eq!(four.seal_crypto_workers(2), 2, "never more than the CPUs");
        let default = p.points.iter().find(|x| x.crypto_workers == 0).unwrap();
        let json = serde_json::to_string(default).unwrap();
        assert!(!json.contains("crypto_workers"), "{json}");
        let back: Point = serde_json::from_str(&json).unwrap();
        assert_eq!(&back, default);
        assert!(serde_json::to_string(one[0])
            .unwrap()
            .contains("\"crypto_workers\":1"));
    }

    #[test]
    fn rejects_crypto_workers_for_schemes_whose_crypto_is_not_seals() {
        for (bad, why) in [
            (
                "scheme=['ipsec']\ncrypto_workers=[1]\n",
                "seal and seal-seq only",
            ),
            (
                "scheme=['seal','plain']\ncrypto_workers=[1]\n",
                "seal and seal-seq only",
            ),
            ("scheme=['seal']\ncrypto_workers=[257]\n", "up to 256"),
        ] {
            let e = Plan::parse("t", &format!("name='x'\n[[matrix]]\n{bad}")).unwrap_err();
            assert!(e.why.contains(why), "{bad}: {e}");
        }
        // 0 is the default and fits every scheme.
        assert!(Plan::parse(
            "t",
            "name='x'\n[[matrix]]\nscheme=['ipsec','plain']\ncrypto_workers=[0]\n"
        )
        .is_ok());
    }

    /// The demo repeats its CPU-bound cells (IPsec at 2 ms) seven times, the rest three.
    #[test]
    fn demo_repeats_the_cpu_bound_ipsec_cells_more() {
        let p = Plan::load("demo").unwrap();
        for (i, q) in p.points.iter().enumerate() {
            let want = if q.scheme == Scheme::Ipsec && q.delay_ms == 2.0 {
                7
            } else {
                3
            };
            assert_eq!(p.repetitions_of(i), want, "{}", q.label());
        }
        assert_eq!(p.run_count(), 32);
    }
}
