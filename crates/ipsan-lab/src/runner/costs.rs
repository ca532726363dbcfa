//! The calibration's separate cost runs ([`cost_plan`]) and `ipsan lab calibrate` itself
//! ([`calibrate_plan`]): every model input measured before a plan runs.

use super::*;

/// The block sizes of the calibration's cost runs: three, so that [`crate::fit::fit_cost`]
/// can tell a carrier's cost per byte from its cost per flight.
pub const COST_BLOCKS: [u64; 3] = [64 << 10, 256 << 10, 1 << 20];

/// The separate short runs a calibration fits the carriers' costs over
/// ([`crate::calibrate::StoredCosts`]): for each scheme, direction, cipher, iSCSI mode and backend of
/// `plan` (plain too wherever seal is: seal's stacks are priced as plain iSCSI's) and each
/// delay class (none / some), one run per [`COST_BLOCKS`] size on the plan's unimpaired link of
/// the shortest delay in that class, one command in flight (seal: four, pipelined). One
/// repetition each, the plan's run time. Some may have the settings of a plan point (IPsec at
/// one command), but they are other runs, made before the plan's: nothing the plan will
/// measure enters the costs.
pub fn cost_plan(plan: &Plan) -> Plan {
    let clean = |p: &&Point| p.loss + p.reorder + p.corrupt == 0.0 && p.scheme != Scheme::EspEmu;
    let link_of = |delayed: bool| {
        plan.points
            .iter()
            .filter(clean)
            .filter(|p| (p.delay_ms > 0.0) == delayed)
            .min_by(|a, b| a.delay_ms.total_cmp(&b.delay_ms))
    };
    let mut points: Vec<Point> = Vec::new();
    for p in &plan.points {
        if p.scheme == Scheme::Iperf3 {
            continue;
        }
        let Some(link) = link_of(p.delay_ms > 0.0) else {
            continue;
        };
        let mut schemes = vec![p.scheme];
        if p.scheme.is_seal() {
            schemes.push(Scheme::Plain);
        }
        for scheme in schemes {
            for block in COST_BLOCKS {
                let q = Point {
                    delay_ms: link.delay_ms,
                    rate_mbit: link.rate_mbit,
                    loss: 0.0,
                    reorder: 0.0,
                    corrupt: 0.0,
                    cc: link.cc.clone(),
                    block,
                    depth: Depth::Fixed(if scheme == Scheme::Seal { 4 } else { 1 }),
                    cipher: if scheme == Scheme::Plain {
                        "aes-256-gcm".into()
                    } else {
                        p.cipher.clone()
                    },
                    pipeline: scheme != Scheme::SealSeq,
                    // A carrier's cost per byte does not depend on seal's threads.
                    crypto_workers: 0,
                    scheme,
                    ..p.clone()
                };
                if !points.contains(&q) {
                    points.push(q);
                }
            }
        }
    }
    // One link per delay class (esp-emu's its own): the points without a delay first.
    points.sort_by_key(|p| (p.delay_ms > 0.0, link_group_key(p)));
    Plan {
        name: format!("{}-costs", plan.name),
        description: format!(
            "The carriers' cost runs of a calibration for plan {} (ipsan lab calibrate)",
            plan.name
        ),
        repetitions: 1,
        point_repetitions: vec![1; points.len()],
        points,
        steady: false,
        fresh_link: false,
        timeline: None,
        ..plan.clone()
    }
}

/// `ipsan lab calibrate`: measures every input the models need for `plan` before it runs —
/// each link's RTT, SOCKET and available cores (brought up as the plan's run would), each
/// cipher's ENC/DEC per CPU-second, and the carriers' and IPsec's charons' costs over the
/// separate runs of [`cost_plan`], whose records go to `cfg.out`. Links that need root are
/// left out without it (a run with the file then refuses the plan, naming them).
pub fn calibrate_plan(
    plan: &Plan,
    cfg: &RunConfig,
) -> std::io::Result<crate::calibrate::CalibrationFile> {
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    };
    let started_unix_s = now();
    let measured_by = Environment::detect(&cfg.exe);
    let root = ipsan_wan::link::is_root();
    if root {
        for ns in crate::guard::sweep_stale() {
            tracing::info!("removed {ns}, left behind by a lab that was killed");
        }
    }
    let mut links: Vec<crate::calibrate::LinkCalibration> = Vec::new();
    let mut cores: Vec<f64> = Vec::new();
    for p in &plan.points {
        let key = link_group_key(p);
        if links.iter().any(|l| l.link == key) {
            continue;
        }
        let label = format!(
            "{} ms one way{}{}{}",
            p.delay_ms,
            if p.rate_mbit > 0.0 {
                format!(", {} Mbit/s", p.rate_mbit)
            } else {
                String::new()
            },
            if p.loss + p.reorder + p.corrupt > 0.0 {
                format!(
                    ", loss {} reorder {} corrupt {}",
                    p.loss, p.reorder, p.corrupt
                )
            } else {
                String::new()
            },
            if p.scheme == Scheme::EspEmu {
                ", esp-emu stage"
            } else {
                ""
            }
        );
        if cfg.progress {
            eprint!("\r\x1b[2Klab calibrate: link {label}");
        }
        let needs_ns = p.delay_ms > 0.0
            || p.loss + p.reorder + p.corrupt > 0.0
            || p.rate_mbit > 0.0
            || matches!(p.scheme, Scheme::EspEmu | Scheme::Iperf3)
            || p.scheme.lower_layer();
        let link = if root {
            Some(LabLink::up(p, cfg, plan.queue).map_err(std::io::Error::other)?)
        } else if needs_ns {
            tracing::warn!("calibrate: the link {label} needs root; left out");
            continue;
        } else {
            None
        };
        let c = calibrate_link(link.as_ref(), p);
        // IPsec's round trip through its tunnel, where the plan has IPsec on this link.
        let ipsec_point = plan
            .points
            .iter()
            .find(|q| q.scheme == Scheme::Ipsec && link_group_key(q) == key);
        let tunnel = match (&link, &c, ipsec_point) {
            (Some(l), Ok(cal), Some(q)) => {
                if cfg.progress {
                    eprint!("\r\x1b[2Klab calibrate: link {label}, through the IPsec tunnel");
                }
                ipsec_rtt(l, q, plan, cfg, cal.rtt_ms / 1e3)
            }
            _ => Ok(None),
        };
        if let Some(l) = link {
            l.down();
        }
        crate::guard::stop_point();
        let c = c.map_err(|e| std::io::Error::other(format!("calibrating {label}: {e}")))?;
        let tunnel = tunnel.map_err(|e| {
            std::io::Error::other(format!("calibrating {label}: the IPsec tunnel's RTT: {e}"))
        })?;
        if c.cores_avail.is_finite() {
            cores.push(c.cores_avail);
        }
        links.push(crate::calibrate::LinkCalibration {
            link: key,
            label,
            calibration: c,
            ipsec_rtt: tunnel,
        });
    }
    let mut cache: BTreeMap<(String, u64), (f64, f64)> = BTreeMap::new();
    let mut ciphers = Vec::new();
    for p in &plan.points {
        let Some((cipher, size)) = cipher_key(p) else {
            continue;
        };
        if cache.contains_key(&(cipher.clone(), size)) {
            continue;
        }
        if cfg.progress {
            eprint!("\r\x1b[2Klab calibrate: {cipher} at {size} bytes");
        }
        let (enc, dec) = enc_dec(&mut cache, p);
        if enc.is_finite() && dec.is_finite() && enc > 0.0 && dec > 0.0 {
            ciphers.push(crate::calibrate::CipherRate {
                cipher,
                size,
                enc_bytes_per_cpu_s: enc,
                dec_bytes_per_cpu_s: dec,
            });
        }
    }
    let costs_plan = cost_plan(plan);
    let records = if costs_plan.points.is_empty() {
        Vec::new()
    } else {
        let costs_cfg = RunConfig {
            calibration: None,
            ..cfg.clone()
        };
        run_plan(&costs_plan, &costs_cfg)?
    };
    let ok = records.iter().filter(|r| r.status == Status::Ok).count();
    let costs = crate::calibrate::StoredCosts::from_runs(&crate::aggregate::aggregate(&records));
    let cores_avail = if cores.is_empty() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        calibrate::available_cores(cpus, Duration::from_millis(500))
    } else {
        crate::aggregate::median(&mut cores)
    };
    Ok(crate::calibrate::CalibrationFile {
        schema: crate::calibrate::CALIBRATION_SCHEMA.into(),
        plan: plan.name.clone(),
        loadavg_end: std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
            .to_string(),
        started_unix_s,
        finished_unix_s: now(),
        // Without schedstat (no reading): the online CPUs, as if idle.
        cores_avail: if cores_avail.is_finite() && cores_avail > 0.0 {
            cores_avail
        } else {
            measured_by.cpus.max(1) as f64
        },
        links,
        ciphers,
        costs,
        cost_runs: cfg.out.display().to_string(),
        measured_by,
        cost_runs_ok: (ok, records.len()),
    })
}

/// The round trip through the IPsec tunnel of `p`'s link
/// ([`crate::calibrate::LinkCalibration::ipsec_rtt`]): both charons brought up as a run's
/// carrier brings them up, then [`calibrate::rtt`]'s 1-byte ping-pong to the target's
/// address, which their route carries inside ESP — as long as a command's small flights
/// (command, R2T, status) take to cross the two charons and TUN devices, beside the plain
/// RTT's 0.03 ms at 0 ms. A listener on the iSCSI port stands in for the target while the
/// carrier checks that TCP gets through; the charons stop with `procs`. One more try when the
/// tunnel does not come up (a loaded host); `None` where IPsec cannot run here at all
/// (strongSwan missing: the plan's IPsec runs are skipped too).
fn ipsec_rtt(
    link: &LabLink,
    p: &Point,
    plan: &Plan,
    cfg: &RunConfig,
    plain_rtt_s: f64,
) -> Result<Option<calibrate::Rtt>, String> {
    let scratch = cfg.out.join("scratch-ipsec-rtt");
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    let calib = Calibration::default();
    let ctx = RunCtx {
        cfg,
        plan,
        link: Some(link),
        calib: &calib,
        enc: (f64::NAN, f64::NAN),
        scratch: &scratch,
        bench_has_seal: false,
        bench_has_auto: false,
        trace: None,
    };
    // As many round trips as fit in about two seconds: 10 to 50.
    let rounds = (2.0 / plain_rtt_s.max(1e-3)).clamp(10.0, 50.0) as usize;
    let carrier = carrier::of(Scheme::Ipsec);
    let mut last = String::new();
    let mut out = Ok(None);
    for _ in 0..2 {
        let tgt = link.tgt();
        let stand_in = link
            .link
            .run_in(Side::Tgt, move || TcpListener::bind((tgt, PORT)))
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| format!("listening on the iSCSI port: {e}")))?;
        let mut procs = Procs(Vec::new(), Vec::new());
        let up = carrier
            .check(&ctx)
            .and_then(|()| carrier.connect(&ctx, p, &mut procs, SocketAddr::from((tgt, PORT))));
        drop(stand_in);
        match up {
            Err(RunError::Skip(why)) => {
                tracing::warn!("calibrate: no IPsec tunnel ({why}); its RTT left out");
                break;
            }
            Err(RunError::Fail(why)) => last = why,
            Ok(_) => {
                out = calibrate::rtt(link, rounds)
                    .map(Some)
                    .map_err(|e| format!("ping-pong through the tunnel: {e}"));
                last.clear();
                break;
            }
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    if last.is_empty() {
        out
    } else {
        Err(last)
    }
}
