//! A plan's runs aggregated per point: the median, min and max throughput of its ok
//! repetitions, each host's CPU, the cores the lab got, and every ok repetition for the
//! spread. What the report, the figures, the cost fits ([`crate::fit`]) and the
//! calibration's cost runs read; below all of them.

use std::collections::BTreeMap;

use crate::results::{Record, Status};

/// One point's repetitions, aggregated.
#[derive(Debug, Clone)]
pub struct Agg {
    /// A record standing for the point (the first ok one).
    pub rec: Record,
    /// Median throughput over ok repetitions, MB/s.
    pub median: f64,
    /// Min.
    pub min: f64,
    /// Max.
    pub max: f64,
    /// Ok repetitions.
    pub n: usize,
    /// Median CPU of the initiator host (initiator + its tunnel processes), % of one core.
    pub cpu_ini_host: f64,
    /// Median CPU of the target host (target + its tunnel processes), % of one core.
    pub cpu_tgt_host: f64,
    /// Median CPU every lab process got during the run (initiator, target, tunnels and the
    /// emulator), in cores: what the shared host actually gave the experiment.
    pub cores_got: f64,
    /// Each ok repetition, in repetition order: the spread a figure's bars show.
    pub reps: Vec<Rep>,
}

/// One ok repetition of a point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rep {
    /// The repetition's index in the plan.
    pub rep: u32,
    /// Throughput, MB/s.
    pub mb_s: f64,
    /// CPU of the initiator host, % of one core.
    pub cpu_ini_host: f64,
    /// CPU of the target host, % of one core.
    pub cpu_tgt_host: f64,
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Aggregates ok runs per point.
pub fn aggregate(records: &[Record]) -> Vec<Agg> {
    let mut by: BTreeMap<String, Vec<&Record>> = BTreeMap::new();
    let mut order = Vec::new();
    for r in records.iter().filter(|r| r.status == Status::Ok) {
        let k = serde_json::to_string(&r.point).unwrap_or_default();
        if !by.contains_key(&k) {
            order.push(k.clone());
        }
        by.entry(k).or_default().push(r);
    }
    order
        .iter()
        .filter_map(|k| {
            let rs = by.get(k)?;
            let mut t: Vec<f64> = rs.iter().map(|r| r.throughput_mb_s).collect();
            let min = t.iter().copied().fold(f64::INFINITY, f64::min);
            let max = t.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mut ci: Vec<f64> = rs.iter().map(|r| r.cpu_ini_host_pct()).collect();
            let mut ct: Vec<f64> = rs.iter().map(|r| r.cpu_tgt_host_pct()).collect();
            let mut got: Vec<f64> = rs
                .iter()
                .map(|r| {
                    (r.cpu_initiator_pct
                        + r.cpu_target_pct
                        + r.cpu_tunnel_pct.max(0.0)
                        + r.cpu_emulator_pct)
                        / 100.0
                })
                .collect();
            let mut reps: Vec<Rep> = rs
                .iter()
                .map(|r| Rep {
                    rep: r.rep,
                    mb_s: r.throughput_mb_s,
                    cpu_ini_host: r.cpu_ini_host_pct(),
                    cpu_tgt_host: r.cpu_tgt_host_pct(),
                })
                .collect();
            reps.sort_by_key(|r| r.rep);
            Some(Agg {
                reps,
                cores_got: median(&mut got),
                rec: (*rs.first()?).clone(),
                median: median(&mut t),
                min,
                max,
                n: rs.len(),
                cpu_ini_host: median(&mut ci),
                cpu_tgt_host: median(&mut ct),
            })
        })
        .collect()
}
