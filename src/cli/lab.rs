//! `ipsan lab`: run an experiment plan end to end, or rebuild a report from saved results
//! (issue 6; crates/ipsan-lab).

use std::path::PathBuf;

use anyhow::Context;
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
        } => {
            let mut plan = Plan::load(&plan)?;
            if let Some(n) = repetitions {
                plan.set_repetitions(n);
            }
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
