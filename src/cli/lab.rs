//! `ipsan lab`: run an experiment plan end to end, or rebuild a report from saved results
//! (issue 6; crates/ipsan-lab).

use std::path::PathBuf;

use anyhow::Context;
use ipsan_lab::calibrate::LoadedCalibration;
use ipsan_lab::plan::Plan;
use ipsan_lab::runner::{self, RunConfig};

/// The papers' experiments end to end: baselines, CPU, model, plots, report.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Debug, clap::Subcommand)]
pub enum Cmd {
    /// Run a plan: a built-in one (`ipsan lab plans`) or a TOML file.
    Run {
        #[arg(long, default_value = "quick", help = plan_help())]
        plan: String,
        /// Output directory (results.csv/json, plots, report.md/html).
        #[arg(long, default_value = "results/quick")]
        out: PathBuf,
        /// No progress line.
        #[arg(long)]
        quiet: bool,
        /// Print the plan's points and exit.
        #[arg(long)]
        dry_run: bool,
        /// Override the plan's repetitions per point.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
        repetitions: Option<u32>,
        /// A calibration file from `ipsan lab calibrate` for this plan: its RTT, SOCKET,
        /// cipher rates, cores and carrier costs are the models' inputs, fixed before the
        /// first run (no per-link calibration); its SHA-1 goes into every record and the
        /// report predicts from it alone.
        #[arg(long)]
        calibration: Option<PathBuf>,
    },
    /// Measure the models' inputs for a plan, before running it: RTT and SOCKET per link,
    /// cipher ENC/DEC per CPU-second, the cores available, and the carriers' per-byte and
    /// per-flight costs over separate short runs (three block sizes per scheme and delay
    /// class; their records go to `<out without .json>-runs/`).
    Calibrate {
        #[arg(long, default_value = "quick", help = plan_help())]
        plan: String,
        /// The calibration file to write (JSON, schema `ipsan-lab-calibration/1`).
        #[arg(long, default_value = "calibration.json")]
        out: PathBuf,
        /// No progress line.
        #[arg(long)]
        quiet: bool,
    },
    /// Rebuild plots and the report from a results directory.
    Report {
        /// The directory holding results.json.
        dir: PathBuf,
    },
    /// List the built-in plans.
    Plans,
}

/// `--plan`'s help, from the plan table itself so it names every built-in plan.
fn plan_help() -> String {
    format!(
        "Built-in plan ({}) or path to a plan TOML.",
        ipsan_lab::plan::BUILTIN.join(", ")
    )
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.cmd {
        Cmd::Run {
            plan,
            out,
            quiet,
            dry_run,
            repetitions,
            calibration,
        } => {
            let mut plan = Plan::load(&plan)?;
            if let Some(n) = repetitions {
                plan.set_repetitions(n);
            }
            // Read and checked against the plan before anything runs.
            let calibration = match calibration {
                Some(path) => {
                    let c = LoadedCalibration::read(&path)?;
                    c.file.covers(&plan)?;
                    Some(std::sync::Arc::new(c))
                }
                None => None,
            };
            if dry_run {
                for (i, p) in plan.points.iter().enumerate() {
                    println!("{i:4} {} ×{}", p.label(), plan.repetitions_of(i));
                }
                println!(
                    "{} points, {} runs ({} repetitions unless a table says otherwise), {:?} each",
                    plan.points.len(),
                    plan.run_count(),
                    plan.repetitions,
                    plan.run_time
                );
                return Ok(());
            }
            // Ctrl-C / SIGTERM remove the lab's namespaces; children die with us regardless.
            ipsan_lab::guard::install_signal_cleanup();
            let exe = std::env::current_exe().context("locating the ipsan binary")?;
            let mut cfg = RunConfig::new(exe, out.clone());
            cfg.progress = !quiet;
            cfg.calibration = calibration;
            let records = runner::run_plan(&plan, &cfg)
                .with_context(|| format!("writing results under {}", out.display()));
            // A Ctrl-C whose cleanup is under way ends the process from here on (128 + signal).
            ipsan_lab::guard::close_exit_gate();
            let records = records?;
            let rep = ipsan_lab::report::build(&out, &records)?;
            print!("{}", rep.headline);
            println!("report: {}", rep.html.display());
            Ok(())
        }
        Cmd::Calibrate { plan, out, quiet } => {
            let plan = Plan::load(&plan)?;
            ipsan_lab::guard::install_signal_cleanup();
            let exe = std::env::current_exe().context("locating the ipsan binary")?;
            let runs = out.with_file_name(format!(
                "{}-runs",
                out.file_stem()
                    .map_or("calibration".into(), |s| s.to_string_lossy())
            ));
            let mut cfg = RunConfig::new(exe, runs);
            cfg.progress = !quiet;
            let file = runner::calibrate_plan(&plan, &cfg)
                .with_context(|| format!("calibrating plan {}", plan.name));
            ipsan_lab::guard::close_exit_gate();
            let loaded = file?.write(&out)?;
            let f = &loaded.file;
            if !quiet {
                eprintln!();
            }
            for l in &f.links {
                println!(
                    "link {:<40} RTT {:>8.3} ms  SOCKET {:>8.2} MB/s",
                    l.label, l.calibration.rtt_ms, l.calibration.socket_mb_s
                );
                if let Some(t) = l.ipsec_rtt {
                    println!(
                        "link {:<40} RTT {:>8.3} ms  through the IPsec tunnel (min {:.3}, max {:.3})",
                        l.label,
                        t.median_s * 1e3,
                        t.min_s * 1e3,
                        t.max_s * 1e3
                    );
                }
            }
            for c in &f.ciphers {
                println!(
                    "cipher {:<24} {:>8} B  ENC {:>8.2}  DEC {:>8.2} MB/s per CPU-second",
                    c.cipher,
                    c.size,
                    c.enc_bytes_per_cpu_s / 1e6,
                    c.dec_bytes_per_cpu_s / 1e6
                );
            }
            println!(
                "cores available {:.2}; carrier costs from {} of {} cost runs ({})",
                f.cores_avail, f.cost_runs_ok.0, f.cost_runs_ok.1, f.cost_runs
            );
            if let Err(e) = f.covers(&plan) {
                println!("incomplete: {e}");
            }
            println!("calibration: {} (sha1 {})", out.display(), loaded.sha1);
            Ok(())
        }
        Cmd::Report { dir } => {
            let records = ipsan_lab::results::read_all(&dir).map_err(anyhow::Error::msg)?;
            let rep = ipsan_lab::report::build(&dir, &records)?;
            print!("{}", rep.headline);
            println!("report: {}", rep.html.display());
            Ok(())
        }
        Cmd::Plans => {
            for name in ipsan_lab::plan::BUILTIN {
                let p = Plan::load(name)?;
                println!("{name:<12} {:>4} runs  {}", p.run_count(), p.description);
            }
            Ok(())
        }
    }
}
