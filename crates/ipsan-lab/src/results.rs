//! One row per run: every parameter and measurement, written as `results.json` and
//! `results.csv` after each run so an interrupted plan keeps what it measured.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::plan::Point;

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Measured.
    Ok,
    /// Tried and failed; `error` says why.
    Failed,
    /// Not possible here; `error` says why.
    Skipped,
}

/// The link's calibration (the model's inputs besides ENC/DEC).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Calibration {
    /// Median TCP ping-pong round trip.
    #[serde(deserialize_with = "f64_or_nan")]
    pub rtt_ms: f64,
    /// Fastest round trip.
    #[serde(deserialize_with = "f64_or_nan")]
    pub rtt_min_ms: f64,
    /// Slowest round trip.
    #[serde(deserialize_with = "f64_or_nan")]
    pub rtt_max_ms: f64,
    /// Bulk TCP throughput under the same emulation (SOCKET).
    #[serde(deserialize_with = "f64_or_nan")]
    pub socket_mb_s: f64,
    /// Cores the lab could get at calibration ([`crate::calibrate::available_cores`]): the
    /// host is shared, so the crypto's share is measured, not assumed.
    #[serde(default = "nan", deserialize_with = "f64_or_nan")]
    pub cores_avail: f64,
    /// Sysctls read back inside the initiator namespace (congestion control, buffers).
    pub sysctls: Vec<(String, String)>,
    /// Ran on loopback (no root): no emulation.
    pub loopback: bool,
}

/// Where and with what the plan ran.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Environment {
    /// `git rev-parse HEAD` of the working tree, if any.
    pub git_rev: String,
    /// Host name.
    pub hostname: String,
    /// `uname -r`.
    pub kernel: String,
    /// CPU model.
    pub cpu: String,
    /// Online CPUs.
    pub cpus: usize,
    /// The `ipsan` binary used.
    pub exe: String,
    /// `/proc/loadavg` when the plan started: other work on the host skews results.
    #[serde(default)]
    pub loadavg: String,
}

impl Environment {
    /// Reads the environment from the system.
    pub fn detect(exe: &Path) -> Environment {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .unwrap_or_default()
                .trim()
                .to_string()
        };
        // The source tree this lab was built from, else the current directory's.
        let tree = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
        let git_rev = std::process::Command::new("git")
            .args(["-C", tree, "rev-parse", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let cpu = read("/proc/cpuinfo")
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default();
        Environment {
            git_rev,
            hostname: read("/proc/sys/kernel/hostname"),
            kernel: read("/proc/sys/kernel/osrelease"),
            cpu,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            exe: exe.display().to_string(),
            loadavg: read("/proc/loadavg"),
        }
    }
}

/// JSON has no NaN: serde_json writes it as `null`; read `null` back as NaN.
fn nan() -> f64 {
    f64::NAN
}

fn f64_or_nan<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// One run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    /// Plan name.
    pub plan: String,
    /// Row number.
    pub run: usize,
    /// Repetition of its point.
    pub rep: u32,
    /// ok / failed / skipped.
    pub status: Status,
    /// Why it failed or was skipped.
    pub error: String,
    /// The point.
    pub point: Point,
    /// Depth actually used (auto resolved).
    pub depth_used: u32,
    /// Bench throughput, MB/s (10^6).
    #[serde(deserialize_with = "f64_or_nan")]
    pub throughput_mb_s: f64,
    /// The whole run's throughput as bench reports it, MB/s. Equal to `throughput_mb_s`
    /// except in plans with `steady = true`, where `throughput_mb_s` is the second half's.
    #[serde(default = "nan", deserialize_with = "f64_or_nan")]
    pub throughput_total_mb_s: f64,
    /// Commands per second.
    #[serde(deserialize_with = "f64_or_nan")]
    pub iops: f64,
    /// Latency percentiles, µs.
    #[serde(deserialize_with = "f64_or_nan")]
    pub lat_p50_us: f64,
    /// p90.
    #[serde(deserialize_with = "f64_or_nan")]
    pub lat_p90_us: f64,
    /// p99.
    #[serde(deserialize_with = "f64_or_nan")]
    pub lat_p99_us: f64,
    /// Max.
    #[serde(deserialize_with = "f64_or_nan")]
    pub lat_max_us: f64,
    /// Bytes moved.
    pub bytes: u64,
    /// Initiator CPU, % of one core (from bench).
    #[serde(deserialize_with = "f64_or_nan")]
    pub cpu_initiator_pct: f64,
    /// Target CPU, % of one core (/proc).
    #[serde(deserialize_with = "f64_or_nan")]
    pub cpu_target_pct: f64,
    /// Tunnel processes' CPU (wireguard-go, stunnel), % of one core.
    #[serde(deserialize_with = "f64_or_nan")]
    pub cpu_tunnel_pct: f64,
    /// Tunnel processes in the initiator's namespace (charon, wireguard-go, stunnel), % of
    /// one core: the initiator host's share of a lower-layer scheme's crypto.
    #[serde(default = "nan", deserialize_with = "f64_or_nan")]
    pub cpu_tunnel_ini_pct: f64,
    /// Tunnel processes in the target's namespace, % of one core.
    #[serde(default = "nan", deserialize_with = "f64_or_nan")]
    pub cpu_tunnel_tgt_pct: f64,
    /// The lab process itself: the WAN emulator's forwarders (and esp-emu's crypto).
    #[serde(deserialize_with = "f64_or_nan")]
    pub cpu_emulator_pct: f64,
    /// Packets through the emulator.
    pub wan_packets: u64,
    /// Dropped by the emulator (loss, queue, other).
    pub wan_dropped: u64,
    /// Reordered.
    pub wan_reordered: u64,
    /// Corrupted.
    pub wan_corrupted: u64,
    /// Packets through esp-emu, or (ipsec) through the initiator's CHILD_SA, both directions.
    pub esp_packets: u64,
    /// Packets the kernel dropped at the TUN devices around the emulator (both namespaces,
    /// rx and tx): losses the emulator's own counters never see.
    #[serde(default)]
    pub tun_dropped: u64,
    /// The initiator's `TCP_INFO` at the end of the run, as bench reports it (cwnd, ssthresh,
    /// RTT, retransmissions, rwnd/sndbuf-limited time): what explains the run's rate.
    #[serde(default)]
    pub tcp: Option<serde_json::Value>,
    /// The kernel's TCP counters (`/proc/net/snmp` Tcp, `/proc/net/netstat` TcpExt) that
    /// changed during the run, per namespace (`ini:` / `tgt:` prefix): retransmissions,
    /// timeouts, receive-side drops.
    #[serde(default)]
    pub kernel_tcp: std::collections::BTreeMap<String, i64>,
    /// Calibration.
    pub calibration: Option<Calibration>,
    /// SHA-1 of the calibration file the run's inputs came from (`ipsan lab run
    /// --calibration`); empty when the run calibrated its own link.
    #[serde(default)]
    pub calibration_sha1: String,
    /// ENC for the model, MB/s.
    #[serde(deserialize_with = "f64_or_nan")]
    pub enc_mb_s: f64,
    /// DEC for the model, MB/s.
    #[serde(deserialize_with = "f64_or_nan")]
    pub dec_mb_s: f64,
    /// Model prediction, MB/s.
    #[serde(deserialize_with = "f64_or_nan")]
    pub model_mb_s: f64,
    /// Which model term binds.
    pub model_limit: String,
    /// (measured / predicted − 1) · 100.
    #[serde(deserialize_with = "f64_or_nan")]
    pub model_err_pct: f64,
    /// `depth = auto`: the depth of bench's first window (the model's estimate).
    #[serde(default)]
    pub depth_start: u32,
    /// `depth = auto`: every measurement window of bench's controller, `depth:MB/s` each.
    #[serde(default)]
    pub depth_trajectory: String,
    /// Negotiated InitialR2T.
    pub initial_r2t: Option<bool>,
    /// Negotiated ImmediateData.
    pub immediate_data: Option<bool>,
    /// Negotiated FirstBurstLength.
    pub first_burst: Option<u64>,
    /// Ran as root (namespaces) or on loopback.
    pub root: bool,
    /// The bench run's duration (`--time`), s: the plan's run_time stretched to its
    /// `min_rtts` round trips.
    #[serde(default = "nan", deserialize_with = "f64_or_nan")]
    pub run_time_s: f64,
    /// Wall time of the whole run, s.
    #[serde(deserialize_with = "f64_or_nan")]
    pub wall_s: f64,
    /// `/proc/loadavg` when the run started (the host is shared: other work skews results).
    #[serde(default)]
    pub loadavg: String,
    /// Seconds since the epoch at record creation.
    pub started_unix_s: u64,
    /// Environment.
    pub env: Environment,
}

impl Record {
    /// A fresh record for `p`, not yet run.
    pub fn new(plan: &str, run: usize, rep: u32, p: &Point, env: &Environment, root: bool) -> Self {
        Record {
            plan: plan.into(),
            run,
            rep,
            status: Status::Failed,
            error: String::new(),
            point: p.clone(),
            depth_used: 0,
            throughput_mb_s: f64::NAN,
            iops: f64::NAN,
            throughput_total_mb_s: f64::NAN,
            lat_p50_us: f64::NAN,
            lat_p90_us: f64::NAN,
            lat_p99_us: f64::NAN,
            lat_max_us: f64::NAN,
            bytes: 0,
            cpu_initiator_pct: f64::NAN,
            cpu_target_pct: f64::NAN,
            cpu_tunnel_pct: 0.0,
            cpu_tunnel_ini_pct: f64::NAN,
            cpu_tunnel_tgt_pct: f64::NAN,
            cpu_emulator_pct: f64::NAN,
            wan_packets: 0,
            wan_dropped: 0,
            wan_reordered: 0,
            wan_corrupted: 0,
            esp_packets: 0,
            tun_dropped: 0,
            tcp: None,
            kernel_tcp: std::collections::BTreeMap::new(),
            calibration: None,
            calibration_sha1: String::new(),
            enc_mb_s: f64::NAN,
            dec_mb_s: f64::NAN,
            model_mb_s: f64::NAN,
            model_limit: String::new(),
            model_err_pct: f64::NAN,
            depth_start: 0,
            depth_trajectory: String::new(),
            initial_r2t: None,
            immediate_data: None,
            first_burst: None,
            root,
            run_time_s: f64::NAN,
            wall_s: 0.0,
            started_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            loadavg: std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .trim()
                .to_string(),
            env: env.clone(),
        }
    }

    /// The initiator host's CPU, % of one core: the initiator plus the tunnel processes in its
    /// namespace (the emulator is the network, not a host). NaN when not measured.
    pub fn cpu_ini_host_pct(&self) -> f64 {
        self.cpu_initiator_pct + self.cpu_tunnel_ini_pct.max(0.0)
    }

    /// The target host's CPU, % of one core: the target plus its side's tunnel processes.
    pub fn cpu_tgt_host_pct(&self) -> f64 {
        self.cpu_target_pct + self.cpu_tunnel_tgt_pct.max(0.0)
    }
}

/// CSV header, matching [`csv_row`].
pub const CSV_HEADER: &str = "plan,run,rep,status,scheme,direction,delay_ms,loss,reorder,corrupt,rate_mbit,block,depth,depth_used,cipher,pipeline,crypto_workers,backend,iscsi,cc,throughput_mb_s,throughput_total_mb_s,iops,lat_p50_us,lat_p90_us,lat_p99_us,lat_max_us,cpu_initiator_pct,cpu_target_pct,cpu_tunnel_pct,cpu_tunnel_ini_pct,cpu_tunnel_tgt_pct,cpu_ini_host_pct,cpu_tgt_host_pct,cpu_emulator_pct,wan_packets,wan_dropped,wan_reordered,wan_corrupted,esp_packets,rtt_ms,socket_mb_s,cores_avail,enc_mb_s,dec_mb_s,model_mb_s,model_limit,model_err_pct,initial_r2t,immediate_data,first_burst,run_time_s,root,loopback,git_rev,kernel,loadavg,error";

fn q(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\"").replace('\n', " "))
    } else {
        s.to_string()
    }
}

fn num(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.3}")
    } else {
        String::new()
    }
}

fn ob<T: ToString>(v: Option<T>) -> String {
    v.map(|x| x.to_string()).unwrap_or_default()
}

/// One CSV row.
pub fn csv_row(r: &Record) -> String {
    let p = &r.point;
    let c = r.calibration.clone().unwrap_or_default();
    [
        q(&r.plan),
        r.run.to_string(),
        r.rep.to_string(),
        format!("{:?}", r.status).to_lowercase(),
        p.scheme.to_string(),
        p.direction.name().into(),
        p.delay_ms.to_string(),
        p.loss.to_string(),
        p.reorder.to_string(),
        p.corrupt.to_string(),
        p.rate_mbit.to_string(),
        p.block.to_string(),
        p.depth.to_string(),
        r.depth_used.to_string(),
        p.cipher.clone(),
        p.pipeline.to_string(),
        p.crypto_workers.to_string(),
        format!("{:?}", p.backend).to_lowercase(),
        format!("{:?}", p.iscsi).to_lowercase(),
        p.cc.clone(),
        num(r.throughput_mb_s),
        num(r.throughput_total_mb_s),
        num(r.iops),
        num(r.lat_p50_us),
        num(r.lat_p90_us),
        num(r.lat_p99_us),
        num(r.lat_max_us),
        num(r.cpu_initiator_pct),
        num(r.cpu_target_pct),
        num(r.cpu_tunnel_pct),
        num(r.cpu_tunnel_ini_pct),
        num(r.cpu_tunnel_tgt_pct),
        num(r.cpu_ini_host_pct()),
        num(r.cpu_tgt_host_pct()),
        num(r.cpu_emulator_pct),
        r.wan_packets.to_string(),
        r.wan_dropped.to_string(),
        r.wan_reordered.to_string(),
        r.wan_corrupted.to_string(),
        r.esp_packets.to_string(),
        num(c.rtt_ms),
        num(c.socket_mb_s),
        num(c.cores_avail),
        num(r.enc_mb_s),
        num(r.dec_mb_s),
        num(r.model_mb_s),
        r.model_limit.clone(),
        num(r.model_err_pct),
        ob(r.initial_r2t),
        ob(r.immediate_data),
        ob(r.first_burst),
        num(r.run_time_s),
        r.root.to_string(),
        c.loopback.to_string(),
        r.env.git_rev.clone(),
        q(&r.env.kernel),
        q(&r.loadavg),
        q(&r.error),
    ]
    .join(",")
}

/// Writes `results.json` and `results.csv` into `dir`.
pub fn write_all(dir: &Path, records: &[Record]) -> std::io::Result<()> {
    let json = serde_json::to_string_pretty(records).map_err(std::io::Error::other)?;
    std::fs::write(dir.join("results.json"), json + "\n")?;
    let mut csv = String::from(CSV_HEADER);
    csv.push('\n');
    for r in records {
        csv.push_str(&csv_row(r));
        csv.push('\n');
    }
    std::fs::write(dir.join("results.csv"), csv)
}

/// Reads `results.json` back (for `ipsan lab report`).
pub fn read_all(dir: &Path) -> Result<Vec<Record>, String> {
    let p = dir.join("results.json");
    let t = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    serde_json::from_str(&t).map_err(|e| format!("{}: {e}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Plan;

    #[test]
    fn csv_rows_match_the_header_and_json_round_trips() {
        let plan = Plan::load("smoke").unwrap();
        let env = Environment::detect(Path::new("ipsan"));
        let mut r = Record::new("smoke", 0, 0, &plan.points[0], &env, false);
        r.error = "a, \"quoted\"\nerror".into();
        let row = csv_row(&r);
        // Count fields outside quotes.
        let mut fields = 1;
        let mut inq = false;
        for ch in row.chars() {
            match ch {
                '"' => inq = !inq,
                ',' if !inq => fields += 1,
                _ => {}
            }
        }
        assert_eq!(fields, CSV_HEADER.split(',').count());
        let dir = tempfile::tempdir().unwrap();
        write_all(dir.path(), &[r.clone()]).unwrap();
        let back = read_all(dir.path()).unwrap();
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].error, r.error);
        assert!(read_all(Path::new("/nonexistent")).is_err());
    }
}
