//! `ipsan demo`: about two minutes of the `demo` plan (RAM LUN, emulated 2 ms and
//! 64 ms links at 1 Gbit/s): plain iSCSI, seal and real IPsec (strongSwan), three repetitions each
//! (seven for the CPU-bound IPsec cells at 2 ms),
//! throughput over each run's second half (past slow start), printed as medians with
//! min–max and the seal ÷ IPsec ratio per delay, then the path of the HTML report.
//! Without root it falls back to loopback and says what it skipped.

use std::path::PathBuf;

use anyhow::Context;
use ipsan_lab::plan::Plan;
use ipsan_lab::runner::{self, RunConfig};

/// A short tour: plain vs seal vs real IPsec over emulated WAN links.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Output directory.
    #[arg(long, default_value = "results/demo")]
    pub out: PathBuf,
}

/// The loopback fallback: what a non-root user can still run.
const LOOPBACK_PLAN: &str = r#"
name = "demo-loopback"
description = "ipsan demo without root: loopback only, no WAN emulation, no tunnels."
repetitions = 1
run_time = "2s"
lun = "mem:128MiB"

[[matrix]]
delay = ["0ms"]
block = ["1MiB"]
scheme = ["plain", "seal"]
depth = ["auto"]
cipher = ["aes-256-gcm"]
"#;

pub fn run(args: Args) -> anyhow::Result<()> {
    // Ctrl-C / SIGTERM remove the demo's namespaces; children die with us regardless.
    ipsan_lab::guard::install_signal_cleanup();
    let root = ipsan_wan::link::is_root();
    let plan = if root {
        Plan::load("demo")?
    } else {
        eprintln!(
            "ipsan demo: not root, so no network namespaces: running on loopback only and \
             skipping the emulated 2 ms and 64 ms links and IPsec (run as root for the full \
             demo)"
        );
        Plan::parse("demo-loopback", LOOPBACK_PLAN)?
    };
    let exe = std::env::current_exe().context("locating the ipsan binary")?;
    let cfg = RunConfig::new(exe, args.out.clone());
    let most = plan.point_repetitions.iter().copied().max().unwrap_or(0);
    let reps = if plan.uniform_repetitions() {
        format!("{} repetitions each", plan.repetitions)
    } else {
        format!(
            "{} repetitions each ({most} where the host's CPU is the limit)",
            plan.repetitions
        )
    };
    eprintln!(
        "ipsan demo: {} runs of {:?} or more (longer on slow links), {reps} → {}",
        plan.run_count(),
        plan.run_time,
        args.out.display()
    );
    let records = runner::run_plan(&plan, &cfg);
    // A Ctrl-C whose cleanup is under way ends the process from here on (128 + signal).
    ipsan_lab::guard::close_exit_gate();
    let records = records?;
    let rep = ipsan_lab::report::build(&args.out, &records)?;
    print!("{}", rep.headline);
    println!("report: {}", rep.html.display());
    Ok(())
}
