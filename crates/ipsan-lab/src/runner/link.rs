//! The lab's link: the WAN emulator between two namespaces with what the lab sets inside
//! them, its calibration (RTT, SOCKET, the scheme's cipher rates), and the counters it and
//! the kernels keep over one run.

use super::process::{run_quiet, side_name};
use super::*;

/// A lab link: the emulator plus what the lab set inside its namespaces.
pub(in crate::runner) struct LabLink {
    pub(in crate::runner) link: Link,
    pub(in crate::runner) esp: Option<Arc<EspCounters>>,
    pub(in crate::runner) sysctls: Vec<(String, String)>,
}

impl LabLink {
    pub(in crate::runner) fn up(
        p: &Point,
        cfg: &RunConfig,
        queue: QueueLimit,
    ) -> Result<LabLink, String> {
        let _ = ipsan_wan::link::cleanup(&cfg.link_name);
        crate::guard::register_link(&cfg.link_name);
        let dir = DirConfig {
            delay: Duration::from_secs_f64(p.delay_ms / 1e3),
            loss: if p.loss > 0.0 {
                LossModel::Bernoulli { p: p.loss }
            } else {
                LossModel::None
            },
            reorder: p.reorder,
            corrupt: p.corrupt,
            rate_bps: (p.rate_mbit * 1e6) as u64,
            queue,
            ..DirConfig::default()
        };
        let mut lc = LinkConfig::new(cfg.link_name.clone()).symmetric(dir);
        lc.subnet = cfg.subnet;
        let (extra, esp) = if p.scheme == Scheme::EspEmu {
            let (up, down, c) = esp::stages().map_err(|e| format!("esp-emu keys: {e}"))?;
            (
                ExtraStages {
                    up: vec![Box::new(up)],
                    down: vec![Box::new(down)],
                },
                Some(c),
            )
        } else {
            (ExtraStages::default(), None)
        };
        let link = Link::up_with(lc, extra).map_err(|e| e.to_string())?;
        let mut l = LabLink {
            link,
            esp,
            sysctls: Vec::new(),
        };
        // The papers' stacks were Reno-like; this kernel defaults to BBR. And the root
        // namespace caps socket buffers at 4 MiB, too small for 64 ms at these rates.
        let settings = [
            ("ipv4.tcp_congestion_control", p.cc.clone()),
            ("core.rmem_max", "67108864".to_string()),
            ("core.wmem_max", "67108864".to_string()),
            ("ipv4.tcp_rmem", "4096 131072 67108864".to_string()),
            ("ipv4.tcp_wmem", "4096 16384 67108864".to_string()),
        ];
        for side in [Side::Ini, Side::Tgt] {
            let ns = l.link.netns(side);
            let _ = run_quiet(Command::new("ip").args(["-n", &ns, "link", "set", "lo", "up"]));
            for (k, v) in &settings {
                let (k2, v2) = (k.to_string(), v.clone());
                let r = l
                    .link
                    .run_in(side, move || ipsan_wan::netns::write_net_sysctl(&k2, &v2))
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.map_err(|e| e.to_string()));
                if let Err(e) = r {
                    if k.contains("congestion") {
                        return Err(format!("setting net.{k}={v} in {ns}: {e}"));
                    }
                }
            }
        }
        for (k, _) in &settings {
            let k2 = k.to_string();
            let got = l
                .link
                .run_in(Side::Ini, move || {
                    std::fs::read_to_string(
                        PathBuf::from("/proc/sys/net").join(k2.replace('.', "/")),
                    )
                    .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
                    .unwrap_or_else(|e| format!("unreadable: {e}"))
                })
                .unwrap_or_default();
            l.sysctls.push((format!("net.{k}"), got));
        }
        Ok(l)
    }

    pub(in crate::runner) fn down(self) {
        let LabLink { link, .. } = self;
        let name = link.netns(Side::Ini);
        if let Err(e) = link.down() {
            tracing::warn!("lab link down: {e}");
        }
        if let Some(n) = name.strip_suffix("-ini") {
            crate::guard::unregister_link(n);
        }
    }

    /// The largest buffer a plain `SO_RCVBUF`/`SO_SNDBUF` gets inside the namespaces:
    /// `net.core.{r,w}mem_max` as read back when the link came up (host-wide, so the lab's
    /// writes there may not have taken).
    pub(in crate::runner) fn socket_buffer_cap(&self) -> u64 {
        ["net.core.rmem_max", "net.core.wmem_max"]
            .iter()
            .map(|k| {
                self.sysctls
                    .iter()
                    .find(|(name, _)| name == k)
                    .and_then(|(_, v)| v.parse::<u64>().ok())
                    .unwrap_or(u64::MAX)
            })
            .min()
            .unwrap_or(u64::MAX)
    }

    pub(in crate::runner) fn tgt(&self) -> Ipv4Addr {
        self.link.addr(Side::Tgt)
    }
}

impl Sockets for LabLink {
    fn listen(&self) -> std::io::Result<TcpListener> {
        let a = SocketAddr::from((self.tgt(), 0));
        self.link
            .run_in(Side::Tgt, move || TcpListener::bind(a))
            .map_err(std::io::Error::other)?
    }
    fn connect(&self, addr: SocketAddr) -> std::io::Result<TcpStream> {
        self.link
            .run_in(Side::Ini, move || {
                TcpStream::connect_timeout(&addr, Duration::from_secs(10))
            })
            .map_err(std::io::Error::other)?
    }
}

pub(in crate::runner) fn calibrate_link(
    link: Option<&LabLink>,
    p: &Point,
) -> Result<Calibration, String> {
    let s: &dyn Sockets = match link {
        Some(l) => l,
        None => &Loopback,
    };
    let rtt = calibrate::rtt(s, 10).map_err(|e| format!("RTT ping-pong: {e}"))?;
    // Long enough for slow start to finish at the link's RTT, short enough for CI.
    let secs = (rtt.median_s * 30.0).clamp(1.0, 4.0);
    let secs = if p.loss > 0.0 || p.corrupt > 0.0 || p.reorder > 0.0 {
        secs.max(2.0)
    } else {
        secs
    };
    // Two transfers, the better one kept: on a shared host one transfer now and then stalls
    // (seen: 4.5 MB/s where the next gave 150 MB/s), and SOCKET is what the link can carry.
    let mut socket = 0.0f64;
    for _ in 0..2 {
        let s = calibrate::socket_throughput(s, Duration::from_secs_f64(secs))
            .map_err(|e| format!("bulk TCP: {e}"))?;
        socket = socket.max(s);
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cores_avail = calibrate::available_cores(cpus, Duration::from_millis(500));
    Ok(Calibration {
        cores_avail,
        rtt_ms: rtt.median_s * 1e3,
        rtt_min_ms: rtt.min_s * 1e3,
        rtt_max_ms: rtt.max_s * 1e3,
        socket_mb_s: socket / 1e6,
        sysctls: link.map(|l| l.sysctls.clone()).unwrap_or_default(),
        loopback: link.is_none(),
    })
}

/// ENC/DEC for the scheme ([`cipher_key`]), measured per CPU-second once per key.
pub(in crate::runner) fn enc_dec(
    cache: &mut BTreeMap<(String, u64), (f64, f64)>,
    p: &Point,
) -> (f64, f64) {
    let Some((cipher, size)) = cipher_key(p) else {
        return (f64::INFINITY, f64::INFINITY);
    };
    *cache.entry((cipher.clone(), size)).or_insert_with(|| {
        if cipher == "esp-emu" {
            let r = esp::bench(size as usize, Duration::from_millis(300));
            return (r, r);
        }
        let c = Cipher::from_name(&cipher).unwrap_or(Cipher::Aes256Gcm);
        // Seal frames in 512-byte blocks; round the packet size up to that.
        let sz = (size as usize).div_ceil(512) * 512;
        calibrate::cipher_throughput(c, sz, Duration::from_millis(300))
            .unwrap_or((f64::NAN, f64::NAN))
    })
}

/// What the link and the kernels counted during one run: read before it starts
/// ([`LinkCounters::start`], which also zeroes the emulator's statistics) and turned into the
/// record's WAN, TUN, ESP and kernel TCP fields after it ([`LinkCounters::finish`]). Every
/// scheme, iperf3 included, is accounted the same way.
pub(in crate::runner) struct LinkCounters {
    pub(in crate::runner) kernel: Option<BTreeMap<String, i64>>,
    pub(in crate::runner) tun: Option<u64>,
    pub(in crate::runner) esp: Option<u64>,
}

impl LinkCounters {
    pub(in crate::runner) fn start(ctx: &RunCtx<'_>) -> Self {
        if let Some(l) = ctx.link {
            l.link.reset_stats();
        }
        Self {
            kernel: ctx.link.map(kernel_tcp_counters),
            tun: ctx.link.map(tun_drops),
            esp: ctx
                .link
                .and_then(|l| l.esp.as_ref())
                .map(|c| c.packets.load(std::sync::atomic::Ordering::Relaxed)),
        }
    }

    pub(in crate::runner) fn finish(self, ctx: &RunCtx<'_>, rec: &mut Record) {
        let Some(l) = ctx.link else { return };
        if let Some(before) = &self.kernel {
            rec.kernel_tcp = counter_delta(before, &kernel_tcp_counters(l));
        }
        if let Some(before) = self.tun {
            rec.tun_dropped = tun_drops(l).saturating_sub(before);
        }
        let s = l.link.stats();
        rec.wan_dropped = s.up.dropped_loss
            + s.down.dropped_loss
            + s.up.dropped_queue
            + s.down.dropped_queue
            + s.up.dropped_other
            + s.down.dropped_other;
        rec.wan_reordered = s.up.reordered + s.down.reordered;
        rec.wan_corrupted = s.up.corrupted + s.down.corrupted;
        rec.wan_packets = s.up.packets_in + s.down.packets_in;
        if let (Some(c), Some(b0)) = (&l.esp, self.esp) {
            rec.esp_packets = c
                .packets
                .load(std::sync::atomic::Ordering::Relaxed)
                .saturating_sub(b0);
        }
    }
}

/// The kernel's TCP counters in both namespaces (`Tcp:` of /proc/net/snmp, `TcpExt:` of
/// /proc/net/netstat), keyed `ini:Name` / `tgt:Name`. Read on a thread inside each namespace.
pub(in crate::runner) fn kernel_tcp_counters(link: &LabLink) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for side in [Side::Ini, Side::Tgt] {
        let texts = link
            .link
            .run_in(side, || {
                ["snmp", "netstat"]
                    .map(|f| std::fs::read_to_string(format!("/proc/thread-self/net/{f}")))
            })
            .unwrap_or_else(|_| [Ok(String::new()), Ok(String::new())]);
        for text in texts.into_iter().flatten() {
            for (k, v) in parse_proc_counters(&text, &["Tcp", "TcpExt"]) {
                out.insert(format!("{}:{k}", side_name(side)), v);
            }
        }
    }
    out
}

/// The `NAME: field field …` / `NAME: value value …` line pairs of /proc/net/snmp and
/// /proc/net/netstat, for the given table names.
pub(in crate::runner) fn parse_proc_counters(text: &str, tables: &[&str]) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    for pair in lines.chunks(2) {
        let [head, vals] = pair else { continue };
        let (Some((t1, names)), Some((t2, values))) = (head.split_once(':'), vals.split_once(':'))
        else {
            continue;
        };
        if t1 != t2 || !tables.contains(&t1) {
            continue;
        }
        for (n, v) in names.split_whitespace().zip(values.split_whitespace()) {
            if let Ok(v) = v.parse::<i64>() {
                out.push((n.to_string(), v));
            }
        }
    }
    out
}

/// The counters that changed between two readings (gauges such as CurrEstab included).
pub(in crate::runner) fn counter_delta(
    before: &BTreeMap<String, i64>,
    after: &BTreeMap<String, i64>,
) -> BTreeMap<String, i64> {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0);
            (d != 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// Packets the kernel dropped at both TUN devices (rx and tx), 0 when unreadable.
pub(in crate::runner) fn tun_drops(link: &LabLink) -> u64 {
    link.link.device_stats().map_or(0, |d| {
        d.ini.rx_dropped + d.ini.tx_dropped + d.tgt.rx_dropped + d.tgt.tx_dropped
    })
}
