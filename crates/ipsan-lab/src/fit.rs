//! The cost fitting under the model's predictions for this machine: the plan's calibrated
//! cipher and SOCKET rates (stored beside the records in `cipher-rates.json`), the carriers'
//! and IPsec's charons' CPU fitted as per-byte + per-flight costs over the plan's runs
//! ([`fit_cost`]), and [`model_here`], the model's throughput for one aggregated point.
//! Read by the figures (2008 Fig. 15, Fig. 16) and the report.

use std::collections::BTreeMap;
use std::path::Path;

use crate::aggregate::{median, Agg};
use crate::calibrate::{Cost, StoredCarrier, StoredCosts, StoredIpsecFit, StoredIpsecRate};
use crate::model::{self, CryptoPlace, Inputs, Pipeline};
use crate::plan::{Direction, Scheme};

/// Per-CPU-second rates of the plan's calibrations: for each (cipher, block) the best
/// ENC and DEC any link's calibration measured (the least contended one: on the shared host
/// a calibration's wall-clock rate is its share of a core times the cipher's speed), and the
/// best SOCKET.
#[derive(Debug, Default, Clone)]
pub struct Rates {
    pub(crate) enc: BTreeMap<(String, u64), (f64, f64)>,
    socket: f64,
    pub(crate) ipsec: BTreeMap<(Direction, String), (f64, f64)>,
    /// Per (scheme, delayed?): the emulator's and the iSCSI processes' measured CPU per
    /// byte ([`carrier_costs`]).
    carrier: BTreeMap<(String, bool), (f64, f64)>,
    /// Per (scheme, delayed?): the emulator's and the iSCSI processes' CPU as per-byte +
    /// per-flight costs fitted over the plan's block sizes ([`carrier_fits`]); `None` where
    /// the plan cannot separate them or the fit is not physical (the median above stands).
    carrier_fit: BTreeMap<(String, bool), (Option<Cost>, Option<Cost>)>,
    /// Per (direction, cipher, delayed?): IPsec's sending and receiving charons' per-byte +
    /// per-flight costs ([`ipsec_fits`]).
    ipsec_fit: BTreeMap<(Direction, String, bool), (Cost, Cost)>,
    /// Ignore the fits: every cost per byte, as the model was before the per-flight term
    /// (for the before/after comparison).
    per_byte_only: bool,
    /// What the fits' second term counts ([`Rates::per_command`]).
    unit: Unit,
    /// The cores of the points priced with these rates are the cores the host *has* (a
    /// calibration file's), not the CPU a run got: [`model_here`] then prices packet crypto's
    /// transfer on them ([`model::predict_on_cores`]). With the CPU a run got (in sample) the
    /// bound is the run's mean over its whole cycle, idle round trips included, and stays a cap.
    cores_available: bool,
    /// Per link ([`crate::calibrate::link_group_key`]): the calibrated round trip through the
    /// IPsec tunnel, seconds ([`crate::calibrate::LinkCalibration::ipsec_rtt`]), IPsec's
    /// round trip in [`model_here`] in place of the plain one. Only from a calibration file.
    ipsec_rtt_s: BTreeMap<String, f64>,
}

/// What a carrier's cost beyond its bytes is paid per.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Each flight of a command's exchange ([`model::Carrier`]): the model.
    #[default]
    Flight,
    /// Each command, whatever its exchange: the model until 2026-11-26, kept for the
    /// before/after comparison.
    Command,
}

impl Unit {
    /// How many of this unit a command of `r` makes.
    fn per_command(self, r: &crate::results::Record) -> f64 {
        match self {
            Unit::Flight => flights(r),
            Unit::Command => 1.0,
        }
    }
}

impl StoredCosts {
    /// The costs [`rates_from_records`] fits over `aggs` (the calibration's cost runs), in
    /// the file's form; entries with a non-finite number are left out.
    pub fn from_runs(aggs: &[Agg]) -> StoredCosts {
        let r = rates_from_records(aggs);
        let ok = |c: &Cost| c.s_per_byte.is_finite() && c.s_per_flight.is_finite();
        let carriers = r
            .carrier
            .iter()
            .filter(|(_, (e, s))| e.is_finite() && s.is_finite())
            .map(|((scheme, delayed), (e, s))| {
                let (ef, sf) = r
                    .carrier_fit
                    .get(&(scheme.clone(), *delayed))
                    .copied()
                    .unwrap_or((None, None));
                StoredCarrier {
                    scheme: scheme.clone(),
                    delayed: *delayed,
                    emulator_s_per_byte: *e,
                    stacks_s_per_byte: *s,
                    emulator_fit: ef.filter(ok),
                    stacks_fit: sf.filter(ok),
                }
            })
            .collect();
        let ipsec_rates = r
            .ipsec
            .iter()
            .filter(|(_, (e, d))| e.is_finite() && d.is_finite() && *e > 0.0 && *d > 0.0)
            .map(|((direction, cipher), (e, d))| StoredIpsecRate {
                direction: *direction,
                cipher: cipher.clone(),
                enc_bytes_per_cpu_s: *e,
                dec_bytes_per_cpu_s: *d,
            })
            .collect();
        let ipsec_fits = r
            .ipsec_fit
            .iter()
            .filter(|(_, (s, v))| ok(s) && ok(v))
            .map(
                |((direction, cipher, delayed), (send, recv))| StoredIpsecFit {
                    direction: *direction,
                    cipher: cipher.clone(),
                    delayed: *delayed,
                    send: *send,
                    recv: *recv,
                },
            )
            .collect();
        StoredCosts {
            carriers,
            ipsec_rates,
            ipsec_fits,
        }
    }
}

impl Rates {
    /// The rates and costs of a calibration file and nothing else: seal's ENC/DEC from its
    /// cipher rates, the best SOCKET of its links, the carriers' and charons' costs from its
    /// cost runs. No record of any plan is read (the out-of-sample prediction).
    pub fn from_calibration(cal: &crate::calibrate::CalibrationFile) -> Rates {
        let mut r = Rates {
            cores_available: true,
            ..Rates::default()
        };
        for c in &cal.ciphers {
            r.enc.insert(
                (c.cipher.clone(), c.size),
                (c.enc_bytes_per_cpu_s, c.dec_bytes_per_cpu_s),
            );
        }
        r.socket = cal
            .links
            .iter()
            .map(|l| l.calibration.socket_mb_s * 1e6)
            .filter(|s| s.is_finite())
            .fold(0.0, f64::max);
        for c in &cal.costs.carriers {
            let k = (c.scheme.clone(), c.delayed);
            r.carrier
                .insert(k.clone(), (c.emulator_s_per_byte, c.stacks_s_per_byte));
            r.carrier_fit.insert(k, (c.emulator_fit, c.stacks_fit));
        }
        for c in &cal.costs.ipsec_rates {
            r.ipsec.insert(
                (c.direction, c.cipher.clone()),
                (c.enc_bytes_per_cpu_s, c.dec_bytes_per_cpu_s),
            );
        }
        for c in &cal.costs.ipsec_fits {
            r.ipsec_fit
                .insert((c.direction, c.cipher.clone(), c.delayed), (c.send, c.recv));
        }
        for l in &cal.links {
            if let Some(t) = l
                .ipsec_rtt
                .filter(|t| t.median_s.is_finite() && t.median_s > 0.0)
            {
                r.ipsec_rtt_s.insert(l.link.clone(), t.median_s);
            }
        }
        r
    }

    /// These rates without the calibrated IPsec tunnel round trips: IPsec's flights cross at
    /// the plain RTT, as the model was before (for the before/after comparison).
    pub fn without_ipsec_rtt(mut self) -> Rates {
        self.ipsec_rtt_s.clear();
        self
    }
}

#[cfg(test)]
thread_local! {
    /// How often this thread read a plan's runs to fit costs (tests: the out-of-sample
    /// prediction must never).
    pub(crate) static IN_RUN_FITS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Counts one reading of runs' CPU accounting for a fit (tests only).
fn reads_runs() {
    #[cfg(test)]
    IN_RUN_FITS.with(|c| c.set(c.get() + 1));
}

/// (payload bytes per flight, CPU-seconds per byte) of a plan's runs, for [`fit_cost`].
type Runs = Vec<(f64, f64)>;

/// A command's flights ([`model::Carrier`]): two per round trip it waits for
/// ([`crate::plan::Point::round_trips`]) — a read or a write whose data all goes unsolicited makes one
/// (command; Data-In with the status, or the response), a write that waits for an R2T two
/// (RFC 7143 §11.7.3, §11.8).
fn flights(r: &crate::results::Record) -> f64 {
    2.0 * f64::from(r.point.round_trips(r.first_burst))
}

/// Least squares of `CPU-seconds = a·bytes + c·flights` over a plan's runs, in its per-byte
/// form `CPU ÷ bytes = a + c / (bytes per flight)` (`runs`: BLOCK ÷ flights, CPU-seconds per
/// byte) so that every run weighs the same whatever its throughput, as the model's relative
/// error does. `None` when the runs cannot separate the two (fewer than 3 runs or 2 sizes)
/// or the fit is not physical (a per-byte cost of zero or less, a negative per-flight
/// cost): then the caller keeps the per-byte median.
pub fn fit_cost(runs: &[(f64, f64)]) -> Option<Cost> {
    let pts: Vec<(f64, f64)> = runs
        .iter()
        .filter(|(b, y)| *b > 0.0 && y.is_finite())
        .map(|(b, y)| (1.0 / b, *y))
        .collect();
    let n = pts.len() as f64;
    if pts.len() < 3 {
        return None;
    }
    let mx = pts.iter().map(|p| p.0).sum::<f64>() / n;
    let my = pts.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    // One block size (to rounding): nothing tells bytes from commands.
    if sxx <= (mx * 1e-9).powi(2) * n {
        return None;
    }
    let b = sxy / sxx;
    let a = my - b * mx;
    (a > 0.0 && b >= 0.0).then_some(Cost {
        s_per_byte: a,
        s_per_flight: b,
    })
}

/// The per-CPU-second cipher rates a report measured for a results directory, kept there
/// (`cipher-rates.json`) so that regenerating the report gives the same numbers: measured
/// again on each `lab report`, the rates followed the host's load (3DES 13 MB/s per
/// CPU-second one day, 9.4 the next) and so did every model error.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct StoredRate {
    cipher: String,
    block: u64,
    enc_bytes_per_cpu_s: f64,
    dec_bytes_per_cpu_s: f64,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct StoredRates {
    /// What measured them: revision, host, load average at the time.
    measured_by: crate::results::Environment,
    rates: Vec<StoredRate>,
}

const STORED_RATES: &str = "cipher-rates.json";

/// [`Rates`] from the plan's records (and the directory's stored cipher rates).
pub fn rates(dir: &Path, aggs: &[Agg]) -> Rates {
    let mut r = rates_from_records(aggs);
    // Runs before the per-CPU-second calibration recorded wall-clock rates (their share of a
    // contended core); measure each cipher and block per CPU-second again, once, and keep
    // the result beside the records ([`STORED_RATES`]) so the report is reproducible.
    // (Only from an optimised build: a debug build's ciphers are many times slower.)
    let stored_path = dir.join(STORED_RATES);
    let stored: Option<StoredRates> = std::fs::read(&stored_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    let stored = match stored {
        Some(s) => Some(s),
        None if !cfg!(debug_assertions) && !r.enc.is_empty() => {
            let mut rates = Vec::new();
            for (c, b) in r.enc.keys() {
                let Some(cipher) = ipsan_seal::Cipher::from_name(c) else {
                    continue;
                };
                if let Ok((enc, dec)) = crate::calibrate::cipher_throughput(
                    cipher,
                    *b as usize,
                    std::time::Duration::from_millis(200),
                ) {
                    rates.push(StoredRate {
                        cipher: c.clone(),
                        block: *b,
                        enc_bytes_per_cpu_s: enc,
                        dec_bytes_per_cpu_s: dec,
                    });
                }
            }
            let s = StoredRates {
                measured_by: crate::results::Environment::detect(
                    &std::env::current_exe().unwrap_or_default(),
                ),
                rates,
            };
            if let Ok(j) = serde_json::to_vec_pretty(&s) {
                let _ = std::fs::write(&stored_path, j);
            }
            Some(s)
        }
        None => None,
    };
    for sr in stored.iter().flat_map(|s| s.rates.iter()) {
        if let Some(e) = r.enc.get_mut(&(sr.cipher.clone(), sr.block)) {
            e.0 = e.0.max(sr.enc_bytes_per_cpu_s);
            e.1 = e.1.max(sr.dec_bytes_per_cpu_s);
        }
    }
    r
}

/// [`Rates`] from the records alone (nothing read or measured): what a plan's runs measured,
/// so that one plan's rates can predict another's points (out of sample).
pub fn rates_from_records(aggs: &[Agg]) -> Rates {
    reads_runs();
    let mut r = Rates {
        ipsec: ipsec_rates(aggs),
        carrier: carrier_costs(aggs),
        carrier_fit: carrier_fits(aggs, Unit::Flight),
        ipsec_fit: ipsec_fits(aggs, Unit::Flight),
        ..Rates::default()
    };
    for a in aggs {
        let p = &a.rec.point;
        if let Some(c) = &a.rec.calibration {
            if c.socket_mb_s.is_finite() {
                r.socket = r.socket.max(c.socket_mb_s * 1e6);
            }
        }
        if p.scheme.is_seal() && a.rec.enc_mb_s.is_finite() {
            let e = r
                .enc
                .entry((p.cipher.clone(), p.block))
                .or_insert((0.0, 0.0));
            e.0 = e.0.max(a.rec.enc_mb_s * 1e6);
            e.1 = e.1.max(a.rec.dec_mb_s * 1e6);
        }
    }
    r
}

impl Rates {
    /// These rates with another plan's measured costs of the schemes that do their crypto
    /// outside the iSCSI processes (IPsec's charon rates) and of carrying bytes (the
    /// emulator and stacks): the out-of-sample check, seal's cipher rates left as they are.
    pub fn with_costs_from(mut self, other: &Rates) -> Rates {
        self.ipsec = other.ipsec.clone();
        self.carrier = other.carrier.clone();
        self.carrier_fit = other.carrier_fit.clone();
        self.ipsec_fit = other.ipsec_fit.clone();
        self.unit = other.unit;
        self
    }

    /// The fits refitted from `aggs` (the records these rates came from) with the second
    /// term per command instead of per flight: the model before 2026-11-26.
    pub fn per_command(mut self, aggs: &[Agg]) -> Rates {
        self.carrier_fit = carrier_fits(aggs, Unit::Command);
        self.ipsec_fit = ipsec_fits(aggs, Unit::Command);
        self.unit = Unit::Command;
        self
    }

    /// Without the measured carrier costs: the model as it was before them (the emulator and
    /// both stacks at the best SOCKET, IPsec's charons at their median rates), for the
    /// before/after comparison.
    pub fn without_carrier(mut self) -> Rates {
        self.carrier.clear();
        self.carrier_fit.clear();
        self.ipsec_fit.clear();
        self
    }

    /// Every cost per byte (the medians), no per-flight term: the model before it.
    pub fn without_per_flight(mut self) -> Rates {
        self.per_byte_only = true;
        self
    }
}

/// The CPU the lab spends carrying bytes as per-byte + per-flight costs, per (scheme,
/// delay > 0): [`fit_cost`] of the emulator's and of the initiator's + target's CPU over the
/// plan's points. Each flight of a command (command, R2T, Data-Out, status) starts as a
/// separate small send, paying the emulator's wake-up and a trip through both stacks, so the
/// per-byte median of [`carrier_costs`] over-charges big blocks and under-charges small ones.
pub fn carrier_fits(
    aggs: &[Agg],
    unit: Unit,
) -> BTreeMap<(String, bool), (Option<Cost>, Option<Cost>)> {
    carrier_samples(aggs, unit)
        .into_iter()
        .map(|(k, (e, s))| (k, (fit_cost(&e), fit_cost(&s))))
        .collect()
}

/// Whether a point's link loses, reorders or corrupts nothing: only such runs measure what
/// carrying a byte costs. Under loss the flow is bound by its retransmissions, not by the
/// CPU, and the processes' CPU (timers, retransmissions, the emulator's wake-ups) is spent
/// per second rather than per byte: the 2.7 % loss runs of the pathologies plan moved
/// 0.45 MB/s at several times the clean runs' CPU per byte, and as a per-byte cost that
/// capped the clean points' prediction far below what they measured.
pub(crate) fn unimpaired(a: &Agg) -> bool {
    let p = &a.rec.point;
    p.loss + p.reorder + p.corrupt == 0.0
}

/// Per (scheme, delay > 0), the plan's runs as (bytes per flight, CPU-seconds per byte moved) of the
/// emulator and of the initiator + target: what [`carrier_costs`] takes the medians of and
/// [`carrier_fits`] fits. Only runs on an [`unimpaired`] link count.
fn carrier_samples(aggs: &[Agg], unit: Unit) -> BTreeMap<(String, bool), (Runs, Runs)> {
    reads_runs();
    let mut v: BTreeMap<(String, bool), (Runs, Runs)> = BTreeMap::new();
    for a in aggs.iter().filter(|a| unimpaired(a)) {
        let r = &a.rec;
        let bytes_per_s = r.throughput_mb_s * 1e6;
        if !(bytes_per_s > 0.0 && r.cpu_emulator_pct.is_finite() && r.cpu_emulator_pct > 0.0) {
            continue;
        }
        let block = r.point.block as f64 / unit.per_command(r);
        let e = v
            .entry((r.point.scheme.to_string(), r.point.delay_ms > 0.0))
            .or_default();
        e.0.push((block, r.cpu_emulator_pct / 100.0 / bytes_per_s));
        e.1.push((
            block,
            (r.cpu_initiator_pct + r.cpu_target_pct) / 100.0 / bytes_per_s,
        ));
    }
    v
}

/// IPsec's charons as per-byte + per-flight costs, per (direction, cipher, delay > 0):
/// [`fit_cost`] of the sending and of the receiving host's charon CPU over the plan's IPsec
/// points. `1 / s_per_byte` is the charon's rate per CPU-second on bulk data (ENC, DEC); the
/// per-flight part is ESP's cost for each flight's first, small packets. Only where both fits are
/// physical, and only from runs on an [`unimpaired`] link.
pub fn ipsec_fits(aggs: &[Agg], unit: Unit) -> BTreeMap<(Direction, String, bool), (Cost, Cost)> {
    reads_runs();
    let mut v: BTreeMap<(Direction, String, bool), (Runs, Runs)> = BTreeMap::new();
    for a in aggs
        .iter()
        .filter(|a| a.rec.point.scheme == Scheme::Ipsec && unimpaired(a))
    {
        let r = &a.rec;
        let bytes_per_s = r.throughput_mb_s * 1e6;
        let (send, recv) = match r.point.direction {
            Direction::Write => (r.cpu_tunnel_ini_pct, r.cpu_tunnel_tgt_pct),
            Direction::Read => (r.cpu_tunnel_tgt_pct, r.cpu_tunnel_ini_pct),
        };
        if send > 1.0 && recv > 1.0 && bytes_per_s > 0.0 {
            let block = r.point.block as f64 / unit.per_command(r);
            let e = v
                .entry((
                    r.point.direction,
                    r.point.cipher.clone(),
                    r.point.delay_ms > 0.0,
                ))
                .or_default();
            e.0.push((block, send / 100.0 / bytes_per_s));
            e.1.push((block, recv / 100.0 / bytes_per_s));
        }
    }
    v.into_iter()
        .filter_map(|(k, (s, r))| Some((k, (fit_cost(&s)?, fit_cost(&r)?))))
        .collect()
}

/// The CPU the lab spends carrying bytes, per (scheme, delay > 0): the median over the
/// plan's points of the emulator's CPU ÷ bytes moved, and of the initiator's + target's
/// CPU ÷ bytes moved. With a delay the emulator wakes before every release, and ESP's
/// packets come one at a time out of charon, so IPsec's emulator cost per byte is several
/// times TCP's ([`model::Carrier`]); at 0 ms there is no delay line.
pub fn carrier_costs(aggs: &[Agg]) -> BTreeMap<(String, bool), (f64, f64)> {
    let per_byte = |runs: Runs| runs.into_iter().map(|(_, y)| y).collect::<Vec<f64>>();
    carrier_samples(aggs, Unit::Flight)
        .into_iter()
        .map(|(k, (e, s))| (k, (median(&mut per_byte(e)), median(&mut per_byte(s)))))
        .collect()
}

/// The model on this machine. The papers' model ([`model::predict`]) at the calibrated RTT
/// and SOCKET with per-CPU-second crypto rates ([`Rates`]), capped by what the CPU the run
/// actually got can carry ([`model::cpu_bound`]): `cores_got / (1/ENC + 1/DEC + carrier)` —
/// every byte is sealed, opened and moved on the same shared cores, moving it costing what
/// the plan's runs of the scheme measured ([`carrier_costs`]; without them, one core at the
/// best SOCKET). IPsec's ENC/DEC are the rates its charons reached per CPU-second
/// (from their CPU accounting, a per-cipher constant over the plan's IPsec runs). Priced from
/// a calibration file (the cores the host has), packet crypto's transfer runs at that bound
/// too ([`model::predict_on_cores`]): one command's ESP, emulator and stacks share the cores
/// while its bytes move, and leave them idle through its round trips.
pub fn model_here(a: &Agg, rates: &Rates) -> Option<(f64, String)> {
    let r = &a.rec;
    let p = &r.point;
    let cal = r.calibration.as_ref()?;
    let delayed = p.delay_ms > 0.0;
    // IPsec's charons' per-flight cost, when fitted.
    let mut tunnel_per_flight = 0.0;
    let (enc, dec, crypto) = match p.scheme {
        Scheme::Iperf3 => return None,
        Scheme::Plain => (f64::INFINITY, f64::INFINITY, CryptoPlace::None),
        Scheme::Seal | Scheme::SealSeq => {
            let (e, d) = rates.enc.get(&(p.cipher.clone(), p.block))?;
            (*e, *d, CryptoPlace::Command)
        }
        Scheme::Ipsec => {
            // The same ESP work either way: sealing on the sender, opening on the receiver;
            // another direction's rates stand in when this one has no IPsec runs.
            let fit = if rates.per_byte_only {
                None
            } else {
                rates
                    .ipsec_fit
                    .get(&(p.direction, p.cipher.clone(), delayed))
                    .or_else(|| {
                        rates
                            .ipsec_fit
                            .iter()
                            .find(|((_, c, d), _)| *c == p.cipher && *d == delayed)
                            .map(|(_, v)| v)
                    })
            };
            if let Some((s, r)) = fit {
                tunnel_per_flight = s.s_per_flight + r.s_per_flight;
                (1.0 / s.s_per_byte, 1.0 / r.s_per_byte, CryptoPlace::Packet)
            } else {
                let (e, d) = rates
                    .ipsec
                    .get(&(p.direction, p.cipher.clone()))
                    .or_else(|| {
                        rates
                            .ipsec
                            .iter()
                            .find(|((_, c), _)| *c == p.cipher)
                            .map(|(_, v)| v)
                    })?;
                (*e, *d, CryptoPlace::Packet)
            }
        }
        _ => (r.enc_mb_s * 1e6, r.dec_mb_s * 1e6, CryptoPlace::Packet),
    };
    // IPsec's flights each cross two userspace charons and TUN devices: its round trip is
    // the one calibrated through the tunnel, where the calibration measured it.
    let rtt_s = match p.scheme {
        Scheme::Ipsec => rates
            .ipsec_rtt_s
            .get(&crate::calibrate::link_group_key(p))
            .copied(),
        _ => None,
    }
    .unwrap_or(cal.rtt_ms / 1e3);
    let i = Inputs {
        rtt_s,
        block: p.block as f64,
        socket: cal.socket_mb_s * 1e6,
        enc,
        dec,
    };
    let cpus = r.env.cpus.max(1) as u32;
    let pl = Pipeline {
        depth: r.depth_used.max(1),
        round_trips: p.round_trips(r.first_burst),
        crypto_workers: p.seal_crypto_workers(cpus),
        window: None,
        crypto,
    };
    let mut pred = model::predict(&i, &pl).ok()?;
    let socket = if rates.socket > 0.0 {
        rates.socket
    } else {
        i.socket
    };
    // What carrying a byte costs: measured for this scheme and delay class when the rates
    // have it; seal's processes also hold its crypto (already in 1/ENC + 1/DEC), so their
    // stacks are plain iSCSI's (below). Per-byte + per-flight where the plan's block sizes
    // separate them ([`carrier_fits`]), else the per-byte median. Without measurements: the
    // emulator and both stacks at the best SOCKET, as before.
    let key = (p.scheme.to_string(), delayed);
    let carrier = match rates.carrier.get(&key) {
        Some(&(emu, stacks)) => {
            let (emu_fit, stacks_fit) = match rates.carrier_fit.get(&key) {
                Some(f) if !rates.per_byte_only => *f,
                _ => (None, None),
            };
            let flat = |s_per_byte| Cost {
                s_per_byte,
                s_per_flight: 0.0,
            };
            let emu = emu_fit.unwrap_or(flat(emu));
            let stacks = if crypto == CryptoPlace::Command {
                // Seal's processes hold its crypto, so their CPU per byte is not a stack
                // cost. Plain iSCSI's, measured in the same plan at the same delay class, is
                // the same stacks without the crypto; without plain runs, one core at the
                // best SOCKET — which on a rate-limited link is the link's rate, not a CPU
                // cost (the demo's 1 Gbit/s: 8 ns/B where plain measured 2–3).
                let plain = (Scheme::Plain.to_string(), delayed);
                match rates.carrier.get(&plain) {
                    Some(&(_, s)) => {
                        let fit = rates.carrier_fit.get(&plain).and_then(|f| f.1);
                        match fit {
                            Some(f) if !rates.per_byte_only => f,
                            _ => flat(s),
                        }
                    }
                    None => flat(1.0 / socket),
                }
            } else {
                stacks_fit.unwrap_or(flat(stacks))
            };
            model::Carrier {
                emulator_s_per_byte: emu.s_per_byte,
                stacks_s_per_byte: stacks.s_per_byte,
                s_per_flight: emu.s_per_flight + stacks.s_per_flight + tunnel_per_flight,
                flights: rates.unit.per_command(r),
            }
        }
        None => model::Carrier {
            emulator_s_per_byte: 0.0,
            stacks_s_per_byte: 1.0 / socket,
            s_per_flight: tunnel_per_flight,
            flights: rates.unit.per_command(r),
        },
    };
    if a.cores_got.is_finite() && a.cores_got > 0.0 {
        let cpu = model::cpu_bound(&i, crypto, &carrier, a.cores_got).ok()?;
        if crypto == CryptoPlace::Packet && rates.cores_available {
            // Per-packet crypto on the cores the host has: the bound is also the rate at
            // which one command's bytes move (the cores idle through its round trips).
            pred = model::predict_on_cores(&i, &pl, cpu).ok()?;
        } else if cpu < pred.throughput {
            pred.throughput = cpu;
            pred.limit = model::Limit::Cpu;
        }
    }
    Some((pred.throughput / 1e6, pred.limit.to_string()))
}

/// IPsec's per-packet crypto rates from its CPU accounting: per (direction, cipher), the
/// median over the plan's IPsec runs of throughput ÷ the sending (receiving) host's charon
/// CPU fraction (runs on an [`unimpaired`] link only).
pub fn ipsec_rates(aggs: &[Agg]) -> BTreeMap<(Direction, String), (f64, f64)> {
    reads_runs();
    let mut v: BTreeMap<(Direction, String), (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for a in aggs
        .iter()
        .filter(|a| a.rec.point.scheme == Scheme::Ipsec && unimpaired(a))
    {
        let r = &a.rec;
        let (send, recv) = match r.point.direction {
            Direction::Write => (r.cpu_tunnel_ini_pct, r.cpu_tunnel_tgt_pct),
            Direction::Read => (r.cpu_tunnel_tgt_pct, r.cpu_tunnel_ini_pct),
        };
        if send > 1.0 && recv > 1.0 && a.median > 0.0 {
            let e = v
                .entry((r.point.direction, r.point.cipher.clone()))
                .or_default();
            e.0.push(a.median * 1e6 / (send / 100.0));
            e.1.push(a.median * 1e6 / (recv / 100.0));
        }
    }
    v.into_iter()
        .map(|(k, (mut e, mut d))| (k, (median(&mut e), median(&mut d))))
        .collect()
}

#[cfg(test)]
pub(crate) mod tests;
