//! A link: two namespaces joined only through the emulator. The library face of
//! `ipsan wan up/set/stats/exec/down`; dropping a [`Link`] tears it down.

use crate::config::{DirConfig, Engine, LinkConfig};
use crate::error::LinkError;
use crate::forwarder::{Clock, DirStats, Direction};
use crate::model::Impairment;
use crate::netns;
pub use crate::netns::{ns_names, IFNAME};
use crate::pipeline::{Nanos, Pipeline, Stage};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::net::{Ipv4Addr, UdpSocket};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

/// One end of the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// The initiator's namespace (`<name>-ini`, address `.1`).
    Ini,
    /// The target's namespace (`<name>-tgt`, address `.2`).
    Tgt,
}

impl std::str::FromStr for Side {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ini" | "initiator" => Ok(Side::Ini),
            "tgt" | "target" => Ok(Side::Tgt),
            _ => Err(format!("side must be ini or tgt, not {s:?}")),
        }
    }
}

/// Both directions' counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkStats {
    /// Initiator → target.
    pub up: DirStats,
    /// Target → initiator.
    pub down: DirStats,
    /// The kernel's own counters of the two TUN devices (`ipsan wan stats`; `None` from
    /// [`Link::stats`], which only reads the emulator's counters and spawns nothing).
    #[serde(default)]
    pub devices: Option<DevStats>,
}

/// One interface's kernel statistics (`/proc/net/dev` inside its namespace).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IfStats {
    /// Packets the kernel received on the device (for a TUN: written by the forwarder).
    pub rx_packets: u64,
    /// Received packets the kernel dropped.
    pub rx_dropped: u64,
    /// Packets the kernel sent on the device (for a TUN: queued for the forwarder to read).
    pub tx_packets: u64,
    /// Packets the kernel could not hand to the device: for a TUN, the ring in front of the
    /// forwarder was full (`txqueuelen`), drops the emulator's model never saw.
    pub tx_dropped: u64,
}

/// The TUN devices of both namespaces. The up direction (ini → tgt) enters the emulator
/// through `ini.tx` and leaves it through `tgt.rx`; down is the reverse.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevStats {
    /// `wan0` in `<name>-ini`.
    pub ini: IfStats,
    /// `wan0` in `<name>-tgt`.
    pub tgt: IfStats,
}

/// Parses the line of `iface` in `/proc/net/dev` (receive: bytes packets errs drop ...,
/// transmit: bytes packets errs drop ...).
pub fn parse_proc_net_dev(text: &str, iface: &str) -> Option<IfStats> {
    text.lines().find_map(|l| {
        let (name, rest) = l.split_once(':')?;
        if name.trim() != iface {
            return None;
        }
        let v: Vec<u64> = rest
            .split_whitespace()
            .map(|w| w.parse().ok())
            .collect::<Option<_>>()?;
        (v.len() >= 16).then(|| IfStats {
            rx_packets: v[1],
            rx_dropped: v[3],
            tx_packets: v[9],
            tx_dropped: v[11],
        })
    })
}

/// Reads `iface`'s statistics inside namespace `ns` (`/proc/thread-self/net/dev` on a thread
/// that entered it: no process spawned).
pub fn if_stats(ns: &str, iface: &str) -> Result<IfStats, LinkError> {
    let text = netns::run_in(ns, || std::fs::read_to_string("/proc/thread-self/net/dev"))?
        .map_err(|e| LinkError::io(format!("reading /proc/net/dev in {ns}"), e))?;
    parse_proc_net_dev(&text, iface)
        .ok_or_else(|| LinkError::Probe(format!("no {iface} in /proc/net/dev of {ns}")))
}

impl LinkStats {
    /// Pretty JSON, for `ipsan wan stats --json`.
    pub fn to_json_pretty(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// Extra stages for a link, appended after the impairment stage of each direction
/// (the lab's per-packet ESP emulation goes here).
#[derive(Debug, Default)]
pub struct ExtraStages {
    /// Appended to the initiator → target pipeline.
    pub up: Vec<Box<dyn Stage>>,
    /// Appended to the target → initiator pipeline.
    pub down: Vec<Box<dyn Stage>>,
}

/// Whether this process runs as root (namespaces and TUN need it).
pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Removes whatever link `name` left behind: processes inside its namespaces and the
/// namespaces themselves (TUN devices vanish with their forwarder's file descriptors).
/// Idempotent.
pub fn cleanup(name: &str) -> Result<(), LinkError> {
    let (ini, tgt) = ns_names(name);
    let a = netns::delete(&ini);
    let b = netns::delete(&tgt);
    a.and(b)
}

/// The most round trips [`Link::measure_path`] times,
const PATH_PROBES: usize = 301;
/// the fewest,
const PATH_MIN_PROBES: usize = 9;
/// and the time it spends when the delay allows fewer than the most.
const PATH_PROBE_TIME: Duration = Duration::from_millis(1000);
/// The most the path compensation takes off each direction's delay. A quiet host's path adds
/// 0.04–0.1 ms one way; a median far above that was measured while the host was busy (a
/// build's load of 20–45 on two vCPUs made it several ms), and taking it off would remove a
/// 1–10 ms link's delay outright for every later run when the load has gone (issue 29's
/// first `aiken-table1` run calibrated 0.05–0.44 ms round trips on 1–10 ms links).
const PATH_MAX_COMPENSATION: Nanos = 500_000;

/// Packets the TUN device may hold before the forwarder reads them (see `Link::up`).
const TUN_TXQUEUELEN: &str = "20000";

/// A running link. Dropping it stops the forwarders and deletes both namespaces.
#[derive(Debug)]
pub struct Link {
    cfg: LinkConfig,
    engine: Engine,
    dirs: Vec<Direction>,
    /// Held open while the link is up: a PM QoS request for zero CPU wake-up latency.
    cpu_latency: Option<File>,
    torn_down: bool,
}

/// Asks the kernel (PM QoS, `/dev/cpu_dma_latency`) to keep CPUs out of idle states with any
/// exit latency while the returned file is open. On a VM with the haltpoll cpuidle driver
/// this replaces HLT by polling in the guest's idle loop: a packet arriving at a sleeping
/// forwarder is then read tens of µs sooner, and that delay would otherwise add to every
/// one-way trip. Idle polling only runs when nothing else is runnable, so it takes no CPU
/// time from other work inside the machine.
fn request_zero_cpu_latency() -> Option<File> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/cpu_dma_latency")
        .map_err(|e| tracing::debug!("no PM QoS request (/dev/cpu_dma_latency): {e}"))
        .ok()?;
    f.write_all(&0i32.to_ne_bytes()).ok()?;
    Some(f)
}

impl Link {
    /// Brings a link up with the impairment stage only. Returns once a probe datagram has
    /// crossed in both directions.
    pub fn up(cfg: LinkConfig) -> Result<Link, LinkError> {
        Self::up_with(cfg, ExtraStages::default())
    }

    /// Brings a link up with extra pipeline stages after the impairments.
    pub fn up_with(cfg: LinkConfig, extra: ExtraStages) -> Result<Link, LinkError> {
        cfg.validate()?;
        if !is_root() {
            return Err(LinkError::NotRoot);
        }
        let engine = match cfg.engine {
            Engine::Builtin => Engine::Builtin,
            Engine::Auto if crate::netem::available().is_ok() => Engine::Netem,
            Engine::Auto => Engine::Builtin,
            Engine::Netem => {
                crate::netem::available().map_err(LinkError::NetemUnavailable)?;
                Engine::Netem
            }
        };
        let (ini, tgt) = ns_names(&cfg.name);
        if netns::exists(&ini) || netns::exists(&tgt) {
            return Err(LinkError::Exists(cfg.name.clone()));
        }
        // From here on, Drop cleans up whatever was created.
        let mut link = Link {
            cfg: cfg.clone(),
            engine,
            dirs: Vec::new(),
            cpu_latency: None,
            torn_down: false,
        };
        if cfg.realtime && engine != Engine::Netem {
            link.cpu_latency = request_zero_cpu_latency();
        }
        netns::add(&ini)?;
        netns::add(&tgt)?;
        match engine {
            Engine::Netem => crate::netem::setup(&cfg)?,
            _ => link.setup_builtin(extra)?,
        }
        link.probe()?;
        if engine != Engine::Netem && cfg.compensate_path {
            let path = link.measure_path()?;
            tracing::debug!(
                "link {}: the path adds {} µs one way",
                cfg.name,
                path / 1000
            );
            for d in &link.dirs {
                d.control.set_path_latency(path);
            }
        }
        if engine != Engine::Netem {
            link.set(cfg.up.clone(), cfg.down.clone())?;
            for d in &link.dirs {
                d.control.reset_counters();
            }
        }
        Ok(link)
    }

    fn setup_builtin(&mut self, extra: ExtraStages) -> Result<(), LinkError> {
        let (ini, tgt) = ns_names(&self.cfg.name);
        let mut tuns = Vec::new();
        for ns in [&ini, &tgt] {
            let tun = netns::run_in(ns, || -> std::io::Result<File> {
                // No IPv6: router solicitations and MLD reports would cross the emulator and
                // pollute the counters of a pure-IPv4 lab.
                netns::write_net_sysctl("ipv6.conf.all.disable_ipv6", "1")?;
                netns::write_net_sysctl("ipv6.conf.default.disable_ipv6", "1")?;
                crate::sys::open_tun(IFNAME)
            })?
            .map_err(|e| LinkError::io(format!("creating TUN {IFNAME} in {ns}"), e))?;
            tuns.push(Arc::new(tun));
        }
        let mtu = self.cfg.mtu.to_string();
        for (ns, addr) in [(&ini, self.cfg.ini_addr()), (&tgt, self.cfg.tgt_addr())] {
            netns::run("ip", &["-n", ns, "link", "set", "lo", "up"])?;
            netns::run(
                "ip",
                &[
                    "-n",
                    ns,
                    "addr",
                    "add",
                    &format!("{addr}/24"),
                    "dev",
                    IFNAME,
                ],
            )?;
            netns::run(
                "ip",
                &[
                    "-n",
                    ns,
                    "link",
                    "set",
                    IFNAME,
                    "mtu",
                    &mtu,
                    // The device ring in front of the forwarder must never be where packets
                    // die: drops there are invisible to the model and its counters (a 1000-packet
                    // ring lost slow-start bursts on a busy host: 320 retransmissions with zero
                    // emulator drops at 64 ms). Only the model's own queue decides tail drop.
                    "txqueuelen",
                    TUN_TXQUEUELEN,
                    "up",
                ],
            )?;
        }
        // Room for the largest packet plus headroom for stages that encapsulate.
        let buf_cap = self.cfg.mtu as usize + 256;
        let clock = Clock::new();
        let mut stages = [extra.up, extra.down].into_iter();
        let seeds = [self.cfg.seed, self.cfg.seed ^ 0x5EED_D0D0_5EED_D0D0];
        let (ini_tun, tgt_tun) = (tuns[0].clone(), tuns[1].clone());
        for (i, (name, input, output)) in [
            ("up", ini_tun.clone(), tgt_tun.clone()),
            ("down", tgt_tun, ini_tun),
        ]
        .into_iter()
        .enumerate()
        {
            // Start with no impairment so the probe is not lost; `up_with` applies the real
            // settings once the probe has crossed.
            let mut p =
                Pipeline::new().with(Box::new(Impairment::new(DirConfig::default(), seeds[i])));
            for s in stages.next().unwrap_or_default() {
                p.push(s);
            }
            let d = Direction::start(name, input, output, p, buf_cap, clock, self.cfg.realtime)
                .map_err(|e| LinkError::io("starting a forwarder thread", e))?;
            self.dirs.push(d);
        }
        Ok(())
    }

    /// Sends a datagram each way until one arrives (up to 5 s).
    fn probe(&self) -> Result<(), LinkError> {
        let (ini, tgt) = ns_names(&self.cfg.name);
        let (ia, ta) = (self.cfg.ini_addr(), self.cfg.tgt_addr());
        let a = netns::run_in(&ini, move || UdpSocket::bind((ia, 0)))?
            .map_err(|e| LinkError::io("probe socket in ini", e))?;
        let b = netns::run_in(&tgt, move || UdpSocket::bind((ta, 0)))?
            .map_err(|e| LinkError::io("probe socket in tgt", e))?;
        for (from, to) in [(&a, &b), (&b, &a)] {
            to.set_read_timeout(Some(Duration::from_millis(100)))
                .map_err(|e| LinkError::io("probe timeout", e))?;
            let dst = to
                .local_addr()
                .map_err(|e| LinkError::io("probe address", e))?;
            let mut ok = false;
            for _ in 0..50 {
                let _ = from.send_to(b"ipsan-wan-probe", dst);
                let mut buf = [0u8; 64];
                if matches!(to.recv(&mut buf), Ok(15)) {
                    ok = true;
                    break;
                }
            }
            if !ok {
                return Err(LinkError::Probe(format!(
                    "no probe datagram reached {dst} within 5 s"
                )));
            }
        }
        Ok(())
    }

    /// The one-way latency the emulated path adds by itself, in ns: half of what the median
    /// round trip of UDP datagrams echoed between the namespaces exceeds the round trip set,
    /// measured with the link's own delays (nothing else: no loss, rate or jitter) for up to
    /// [`PATH_PROBES`] probes or [`PATH_PROBE_TIME`]. With a real delay the forwarder sleeps
    /// until a deadline and the receivers sleep in between, and how long they sleep decides
    /// how slowly they wake on a busy VM (0.04 ms one way after 1 ms here, 0.1 ms after
    /// 8 ms; a tight ping-pong at zero delay finds them awake and measures less). This is
    /// what a host sees on top of the set delay: two TUN hops, the forwarder's wake-up on
    /// arrival, the receiver's. The caller sets the link's real impairments afterwards.
    /// Extra stages (the lab's `esp-emu`) stay in the pipeline meanwhile; what they add to a
    /// 4-byte probe (a few µs of crypto) is compensated with the rest.
    fn measure_path(&self) -> Result<Nanos, LinkError> {
        let (up, down) = (self.cfg.up.delay, self.cfg.down.delay);
        for (d, delay) in self.dirs.iter().zip([up, down]) {
            d.control.reconfigure(DirConfig {
                delay,
                ..Default::default()
            });
        }
        let set = (up + down).as_nanos() as Nanos;
        let probes = (PATH_PROBE_TIME.as_nanos() as Nanos / set.max(1))
            .clamp(PATH_MIN_PROBES as Nanos, PATH_PROBES as Nanos) as usize;
        let (ia, ta) = (self.cfg.ini_addr(), self.cfg.tgt_addr());
        let a = self
            .run_in(Side::Ini, move || UdpSocket::bind((ia, 0)))?
            .map_err(|e| LinkError::io("path probe socket in ini", e))?;
        let b = self
            .run_in(Side::Tgt, move || UdpSocket::bind((ta, 0)))?
            .map_err(|e| LinkError::io("path probe socket in tgt", e))?;
        let timeout = Some(Duration::from_millis(200) + up + down);
        for s in [&a, &b] {
            s.set_read_timeout(timeout)
                .map_err(|e| LinkError::io("path probe timeout", e))?;
        }
        let dst = b
            .local_addr()
            .map_err(|e| LinkError::io("path probe address", e))?;
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let echo_done = done.clone();
        let echo = std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            // Ends when the prober says so, not at its first read timeout: on a busy host the
            // first probe can take longer than one timeout to cross the forwarders, and an
            // echo that had already left lost every probe ("only 0 of 62 path probes").
            loop {
                match b.recv_from(&mut buf) {
                    Ok((n, from)) => {
                        let _ = b.send_to(&buf[..n], from);
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) && !echo_done.load(std::sync::atomic::Ordering::Relaxed) => {}
                    Err(_) => break,
                }
            }
        });
        let mut rtts = Vec::with_capacity(probes);
        let mut buf = [0u8; 64];
        // Let the forwarders take the probe delay before the first probe.
        std::thread::sleep(Duration::from_millis(20));
        for i in 0..probes as u32 {
            let t = std::time::Instant::now();
            if a.send_to(&i.to_be_bytes(), dst).is_err() {
                continue;
            }
            // A late answer to an earlier probe is skipped.
            while let Ok(n) = a.recv(&mut buf) {
                if n == 4 && buf[..4] == i.to_be_bytes() {
                    rtts.push(t.elapsed().as_nanos() as Nanos);
                    break;
                }
            }
        }
        drop(a);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = echo.join();
        if rtts.len() < probes / 2 {
            return Err(LinkError::Probe(format!(
                "only {} of {probes} path probes came back",
                rtts.len()
            )));
        }
        let (path, capped) = path_compensation(&mut rtts, set);
        if capped {
            tracing::warn!(
                "link {}: the path probe's median round trip exceeds the set one by {} µs (a busy \
                 host?); compensating only {} µs one way",
                self.cfg.name,
                (rtts[rtts.len() / 2].saturating_sub(set)) / 1000,
                path / 1000
            );
        }
        Ok(path)
    }

    /// Changes both directions' impairments on the running link.
    pub fn set(&mut self, up: DirConfig, down: DirConfig) -> Result<(), LinkError> {
        up.validate()?;
        down.validate()?;
        if !(up.cuts.is_empty() && down.cuts.is_empty()) {
            self.builtin_only("cut")?;
        }
        if self.engine == Engine::Netem {
            crate::netem::change(&self.cfg.name, &up, &down, self.cfg.seed)?;
        } else {
            for (d, c) in self.dirs.iter().zip([up.clone(), down.clone()]) {
                d.control.reconfigure(c);
            }
        }
        self.cfg.up = up;
        self.cfg.down = down;
        Ok(())
    }

    /// The settings in force.
    pub fn config(&self) -> &LinkConfig {
        &self.cfg
    }

    /// The engine carrying the link.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// Both directions' counters.
    pub fn stats(&self) -> LinkStats {
        if self.engine == Engine::Netem {
            let (up, down) = crate::netem::stats(&self.cfg.name);
            return LinkStats {
                up,
                down,
                devices: None,
            };
        }
        let snap = |i: usize| {
            self.dirs
                .get(i)
                .map(|d| d.control.counters.snapshot())
                .unwrap_or_default()
        };
        LinkStats {
            up: snap(0),
            down: snap(1),
            devices: None,
        }
    }

    /// The TUN devices' own counters (kernel drops in front of and behind the emulator).
    pub fn device_stats(&self) -> Result<DevStats, LinkError> {
        let (ini, tgt) = ns_names(&self.cfg.name);
        Ok(DevStats {
            ini: if_stats(&ini, IFNAME)?,
            tgt: if_stats(&tgt, IFNAME)?,
        })
    }

    /// Cuts the link (both directions unless told otherwise) until [`Link::restore`]: every
    /// packet arriving meanwhile, and every packet on the wire, is lost (see [`crate::cut`]).
    pub fn cut(&self, up: bool, down: bool) -> Result<(), LinkError> {
        self.builtin_only("cut")?;
        for (d, on) in self.dirs.iter().zip([up, down]) {
            if on {
                d.control.set_cut(true);
            }
        }
        Ok(())
    }

    /// Ends a manual cut in both directions (a scheduled cut follows its schedule).
    pub fn restore(&self) -> Result<(), LinkError> {
        self.builtin_only("restore")?;
        for d in &self.dirs {
            d.control.set_cut(false);
        }
        Ok(())
    }

    fn builtin_only(&self, what: &'static str) -> Result<(), LinkError> {
        if self.engine == Engine::Netem {
            return Err(LinkError::Config(crate::ConfigError::Range {
                what,
                why: "link cuts need the built-in engine (--engine builtin)".into(),
            }));
        }
        Ok(())
    }

    /// Zeroes the counters.
    pub fn reset_stats(&self) {
        for d in &self.dirs {
            d.control.reset_counters();
        }
    }

    /// The namespace of `side`.
    pub fn netns(&self, side: Side) -> String {
        let (ini, tgt) = ns_names(&self.cfg.name);
        match side {
            Side::Ini => ini,
            Side::Tgt => tgt,
        }
    }

    /// The address of `side`.
    pub fn addr(&self, side: Side) -> Ipv4Addr {
        match side {
            Side::Ini => self.cfg.ini_addr(),
            Side::Tgt => self.cfg.tgt_addr(),
        }
    }

    /// A command that runs `program` inside `side`'s namespace (`ip netns exec`); add
    /// arguments and spawn it as usual.
    pub fn command(&self, side: Side, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.netns(side), program]);
        c
    }

    /// Runs `argv` inside `side`'s namespace and waits for it.
    pub fn exec_in(&self, side: Side, argv: &[&str]) -> Result<std::process::Output, LinkError> {
        let Some((prog, rest)) = argv.split_first() else {
            return Err(LinkError::Probe("exec_in: empty command".into()));
        };
        self.command(side, prog)
            .args(rest)
            .output()
            .map_err(|e| LinkError::io(format!("running {prog} in {}", self.netns(side)), e))
    }

    /// Runs `f` on a thread inside `side`'s namespace (sockets made there stay there).
    pub fn run_in<T, F>(&self, side: Side, f: F) -> Result<T, LinkError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        netns::run_in(&self.netns(side), f)
    }

    /// Tears the link down now, reporting errors (Drop does the same silently).
    pub fn down(mut self) -> Result<(), LinkError> {
        self.teardown()
    }

    /// Tears the link down in place; later calls do nothing.
    pub fn shutdown(&mut self) -> Result<(), LinkError> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), LinkError> {
        if self.torn_down {
            return Ok(());
        }
        self.torn_down = true;
        for d in &mut self.dirs {
            d.stop();
        }
        self.dirs.clear();
        self.cpu_latency = None;
        cleanup(&self.cfg.name)
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            tracing::warn!("tearing down link {}: {e}", self.cfg.name);
        }
    }
}

/// The one-way path latency to compensate, from the probes' round trips (sorted here) and the
/// round trip set: half of what the median exceeds the set round trip, at most
/// [`PATH_MAX_COMPENSATION`]; `true` when the cap applied.
fn path_compensation(rtts: &mut [Nanos], set: Nanos) -> (Nanos, bool) {
    if rtts.is_empty() {
        return (0, false);
    }
    rtts.sort_unstable();
    let path = rtts[rtts.len() / 2].saturating_sub(set) / 2;
    (
        path.min(PATH_MAX_COMPENSATION),
        path > PATH_MAX_COMPENSATION,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_can_move_between_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Link>();
        assert_send_sync::<LinkStats>();
    }

    #[test]
    fn parses_tun_drops_from_proc_net_dev() {
        let text = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0
  wan0: 1234567    8901    0    7    0     0          0         0  7654321    5678    0   42    0     0       0          0
";
        let s = parse_proc_net_dev(text, "wan0").unwrap();
        assert_eq!(
            s,
            IfStats {
                rx_packets: 8901,
                rx_dropped: 7,
                tx_packets: 5678,
                tx_dropped: 42
            }
        );
        assert_eq!(parse_proc_net_dev(text, "eth0"), None);
        assert_eq!(parse_proc_net_dev("wan0: 1 2 3", "wan0"), None);
    }

    #[test]
    fn sides_parse_from_their_cli_names() {
        assert_eq!("ini".parse::<Side>(), Ok(Side::Ini));
        assert_eq!("target".parse::<Side>(), Ok(Side::Tgt));
        assert!("both".parse::<Side>().is_err());
    }
}

#[cfg(test)]
mod compensation_tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    #[test]
    fn compensates_half_the_median_excess_of_a_quiet_path() {
        // 2 ms set, probes 2.08–2.2 ms: 0.05 ms one way.
        let mut rtts = vec![2_200_000, 2_080_000, 2_100_000, 2_120_000, 2_090_000];
        assert_eq!(path_compensation(&mut rtts, 2 * MS), (50_000, false));
    }

    #[test]
    fn never_takes_a_busy_hosts_milliseconds_off_the_delay() {
        // A 1 ms link probed under load: 12 ms medians would take the whole delay away.
        let mut rtts = vec![12 * MS, 14 * MS, 11 * MS];
        assert_eq!(
            path_compensation(&mut rtts, 2 * MS),
            (PATH_MAX_COMPENSATION, true)
        );
        assert_eq!(path_compensation(&mut [], 2 * MS), (0, false));
    }
}
