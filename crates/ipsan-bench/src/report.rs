//! The JSON result schema of `ipsan bench` (`"schema": "ipsan-bench/1"`, documented in
//! `docs/bench.md`): what was measured, against what, on which host and revision, and the
//! header line of an `ipsan-trace/1` file for the same run.

use std::time::Duration;

use hdrhistogram::Histogram;
use ipsan_initiator::Negotiated;
use serde::Serialize;

use crate::autodepth::AutoReport;

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Latency {
    pub samples: u64,
    pub min: f64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p99_9: f64,
    pub max: f64,
}

impl Latency {
    /// Percentiles of a nanosecond histogram, in microseconds.
    pub fn from_histogram(h: &Histogram<u64>) -> Self {
        let us = |ns: u64| ns as f64 / 1000.0;
        Self {
            samples: h.len(),
            min: us(h.min()),
            mean: h.mean() / 1000.0,
            p50: us(h.value_at_quantile(0.50)),
            p90: us(h.value_at_quantile(0.90)),
            p99: us(h.value_at_quantile(0.99)),
            p99_9: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
        }
    }
}

/// CPU time of this process over a wall-clock interval (getrusage: user+sys, µs resolution).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CpuUsage {
    pub user_s: f64,
    pub sys_s: f64,
    pub wall_s: f64,
    /// (user+sys)/wall × 100: 100 means one core busy the whole time.
    pub percent_of_one_core: f64,
    /// The same divided by the number of CPUs: what iostat's %user+%system shows.
    pub percent_of_all_cores: f64,
    pub cpus: usize,
}

/// A point-in-time reading of this process's CPU time, in seconds (user, sys).
pub fn cpu_times() -> (f64, f64) {
    #[allow(unsafe_code)]
    // SAFETY: getrusage only writes into the rusage struct we pass, which is a valid, owned,
    // zero-initialised value; RUSAGE_SELF is a valid `who`.
    let (r, ok) = unsafe {
        let mut r: libc::rusage = std::mem::zeroed();
        let ok = libc::getrusage(libc::RUSAGE_SELF, &mut r) == 0;
        (r, ok)
    };
    if !ok {
        return (0.0, 0.0);
    }
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    (t(r.ru_utime), t(r.ru_stime))
}

impl CpuUsage {
    pub(crate) fn between(start: (f64, f64), end: (f64, f64), wall: Duration) -> Self {
        let user_s = end.0 - start.0;
        let sys_s = end.1 - start.1;
        let wall_s = wall.as_secs_f64().max(1e-9);
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let one = (user_s + sys_s) / wall_s * 100.0;
        Self {
            user_s,
            sys_s,
            wall_s,
            percent_of_one_core: one,
            percent_of_all_cores: one / cpus as f64,
            cpus,
        }
    }
}

/// Verification counters.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, Default)]
pub struct VerifyResult {
    pub enabled: bool,
    /// Blocks whose content was checked against the pattern.
    pub checked_blocks: u64,
}

/// The measured part of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    pub duration_s: f64,
    pub ops: u64,
    pub read_ops: u64,
    pub write_ops: u64,
    pub bytes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Decimal megabytes per second (10^6 bytes/s).
    pub throughput_mb_s: f64,
    /// Binary mebibytes per second (2^20 bytes/s).
    pub throughput_mib_s: f64,
    pub iops: f64,
    pub latency_us: Latency,
    pub read_latency_us: Option<Latency>,
    pub write_latency_us: Option<Latency>,
    pub cpu: CpuUsage,
    pub verify: VerifyResult,
}

/// Everything `--json` writes (schema `ipsan-bench/1`, see docs/bench.md).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub schema: &'static str,
    pub tool: &'static str,
    pub version: &'static str,
    pub git_rev: String,
    pub started_unix_s: u64,
    pub host: Host,
    pub target: TargetInfo,
    pub workload: WorkloadInfo,
    /// The iSCSI login's parameters (absent for NVMe/TCP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub negotiated: Option<Negotiated>,
    /// The NVMe/TCP controller and transport (absent for iSCSI).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvme: Option<NvmeReport>,
    pub result: Measured,
    /// The connection's TCP settings in force and TCP_INFO at the end of the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp: Option<TcpReport>,
    /// `--depth auto`: the start, the depth chosen and every measurement window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub depth_auto: Option<AutoReport>,
    /// Session recovery (`--recovery-timeout`, RFC 7143 §6.3.5): connection losses,
    /// reconnects, recoveries, commands reissued or failed, recovery times. Absent when
    /// recovery is off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovery: Option<ipsan_initiator::RecoveryStats>,
}

/// An NVMe/TCP run's controller and transport (issue 30).
#[derive(Debug, Clone, Serialize)]
pub struct NvmeReport {
    pub subnqn: String,
    pub nsid: u32,
    pub cntlid: u16,
    pub model: String,
    pub serial: String,
    pub firmware: String,
    /// VS of the controller, `major.minor.tertiary`.
    pub version: String,
    /// I/O queues (TCP connections) used.
    pub io_queues: usize,
    pub header_digest: bool,
    pub data_digest: bool,
    /// MAXH2CDATA from ICResp.
    pub maxh2cdata: u32,
    /// The largest transfer of one command (MDTS).
    pub max_transfer: u32,
    /// Keep Alive Timeout asked for, in milliseconds.
    pub kato_ms: u64,
    /// TLS 1.3 with a configured PSK on every queue.
    pub tls: bool,
    /// The DH-HMAC-CHAP outcome (`DH-HMAC-CHAP sha256 ffdhe2048 bidirectional`), absent when
    /// the controller asked for none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authentication: Option<String>,
}

/// TCP as the kernel ran it for this measurement (the iFCP paper, Muknahallipatna et al.: the WAN leg's window and
/// congestion control set the ceiling, so every result says what they were).
#[derive(Debug, Clone, Serialize)]
pub struct TcpReport {
    /// What was asked for (`--tcp-*` flags); absent fields: kernel defaults.
    pub requested: Option<ipsan_tcp::TcpSettings>,
    pub in_force: Option<ipsan_tcp::InForce>,
    pub info_end: Option<ipsan_tcp::TcpInfoSnapshot>,
}

impl Report {
    /// Pretty JSON in the `ipsan-bench/1` schema.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string_pretty(self)
    }
}

/// The header line of an `ipsan-trace/1` file for this run (docs/bench.md).
pub fn trace_header(
    r: &Report,
    seal: Option<&str>,
    pipeline: bool,
) -> serde_json::Map<String, serde_json::Value> {
    let mut h = serde_json::Map::new();
    h.insert("tool".into(), r.tool.into());
    h.insert("git_rev".into(), r.git_rev.clone().into());
    h.insert("started_unix_s".into(), r.started_unix_s.into());
    h.insert("target".into(), r.target.url.clone().into());
    h.insert(
        "rw".into(),
        serde_json::to_value(r.workload.rw).unwrap_or_default(),
    );
    h.insert("block_size".into(), r.workload.block_size.into());
    h.insert("depth".into(), r.workload.depth.into());
    h.insert("depth_auto".into(), r.depth_auto.is_some().into());
    h.insert(
        "seal".into(),
        seal.map_or(serde_json::Value::Null, Into::into),
    );
    h.insert("pipeline".into(), pipeline.into());
    h.insert(
        "initial_r2t".into(),
        r.negotiated.as_ref().map(|n| n.initial_r2t).into(),
    );
    h.insert(
        "immediate_data".into(),
        r.negotiated.as_ref().map(|n| n.immediate_data).into(),
    );
    h.insert("throughput_mb_s".into(), r.result.throughput_mb_s.into());
    h
}

/// Where it ran.
#[derive(Debug, Clone, Serialize)]
pub struct Host {
    pub hostname: String,
    pub kernel: String,
    pub cpus: usize,
    /// /proc/loadavg (1, 5, 15 minutes) when the report was made: how busy the machine was.
    pub load_average: [f64; 3],
}

impl Host {
    pub fn detect() -> Self {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .map(|s| s.trim().to_owned())
                .unwrap_or_default()
        };
        Self {
            hostname: read("/proc/sys/kernel/hostname"),
            kernel: read("/proc/sys/kernel/osrelease"),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            load_average: {
                let l = read("/proc/loadavg");
                let mut it = l.split_whitespace().map(|x| x.parse().unwrap_or(0.0));
                [
                    it.next().unwrap_or(0.0),
                    it.next().unwrap_or(0.0),
                    it.next().unwrap_or(0.0),
                ]
            },
        }
    }
}

/// What was measured against.
#[derive(Debug, Clone, Serialize)]
pub struct TargetInfo {
    /// The URL with any password redacted.
    pub url: String,
    pub vendor: String,
    pub product: String,
    pub revision: String,
    pub capacity_bytes: u64,
    pub block_len: u32,
}

/// The access pattern (fio's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RwMode {
    Read,
    Write,
    RandRead,
    RandWrite,
    /// Sequential, mixed reads and writes (`--mix` percent reads).
    Rw,
    /// Random, mixed reads and writes.
    RandRw,
}

impl RwMode {
    pub fn is_random(self) -> bool {
        matches!(self, Self::RandRead | Self::RandWrite | Self::RandRw)
    }
    pub fn writes(self) -> bool {
        !matches!(self, Self::Read | Self::RandRead)
    }
    pub fn reads(self) -> bool {
        !matches!(self, Self::Write | Self::RandWrite)
    }
}

impl std::str::FromStr for RwMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "read" => Self::Read,
            "write" => Self::Write,
            "randread" => Self::RandRead,
            "randwrite" => Self::RandWrite,
            "rw" | "readwrite" => Self::Rw,
            "randrw" => Self::RandRw,
            _ => {
                return Err(format!(
                    "--rw must be read|write|randread|randwrite|rw|randrw, not {s:?}"
                ))
            }
        })
    }
}

/// What a read does with its data (`ipsan bench --sink`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Sink {
    /// Every read's data is delivered whole to its worker, in the worker's own buffer (what
    /// a user of the LUN gets; the default).
    #[default]
    Keep,
    /// The initiator checks and counts each Data-In and drops it as it arrives, received
    /// into one scratch buffer of the connection (the work libiscsi's `iscsi-perf` does,
    /// issue 27). iSCSI only; a sealed session opens (checks) the data before dropping it.
    Discard,
}

impl std::str::FromStr for Sink {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "keep" => Ok(Self::Keep),
            "discard" => Ok(Self::Discard),
            _ => Err(format!("--sink must be keep|discard, not {s:?}")),
        }
    }
}

impl Sink {
    /// For serde: the default is left out of the JSON (results before `--sink` kept too).
    pub fn is_keep(&self) -> bool {
        *self == Self::Keep
    }
}

/// The workload as run.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadInfo {
    pub rw: RwMode,
    pub mix_read_percent: u8,
    pub block_size: u64,
    pub depth: usize,
    pub offset: u64,
    pub size_bytes: Option<u64>,
    pub time_s: Option<f64>,
    pub verify: bool,
    pub seed: u64,
    /// `--rate`: the offered load in bytes per second; absent when unlimited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_bytes_per_s: Option<u64>,
    /// `--sink`: `discard` when reads dropped their data; absent for `keep`.
    #[serde(skip_serializing_if = "Sink::is_keep")]
    pub sink: Sink,
}

/// The git revision this binary was built from (captured by build.rs), or "unknown".
pub fn git_rev() -> &'static str {
    option_env!("IPSAN_GIT_REV").unwrap_or("unknown")
}
