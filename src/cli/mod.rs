//! The `ipsan` command line: one subcommand per module.

mod bench;
mod discover;
mod inquiry;
mod target;
mod tcp;
mod wan;

use clap::{Parser, Subcommand};

/// A secure, latency-tolerant IP-SAN.
#[derive(Debug, Parser)]
#[command(name = "ipsan", version, about, long_about = None)]
pub struct Cli {
    /// More log detail: -v for per-PDU traces, -vv for everything.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Measure a LUN: throughput, IOPS, latency percentiles, CPU (issue 3).
    Bench(Box<bench::Args>),
    /// List the targets a portal offers (SendTargets).
    Discover(Box<discover::Args>),
    /// Print a LUN's INQUIRY data and capacity.
    Inquiry(Box<inquiry::Args>),
    /// Serve LUNs over iSCSI (RFC 7143).
    Target(Box<target::Args>),
    /// Storage-friendly TCP: load/unload/list the BPF congestion controls (papers/002).
    Tcp(Box<tcp::Args>),
    /// Packet-level WAN emulator between two network namespaces (issue 4).
    Wan(Box<wan::Args>),
}

pub fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Bench(args) => bench::run(*args),
        Command::Discover(args) => discover::run(*args),
        Command::Inquiry(args) => inquiry::run(*args),
        Command::Target(args) => target::run(*args),
        Command::Tcp(args) => tcp::run(*args),
        Command::Wan(args) => wan::run(*args),
    }
}

/// Logs go to stderr; `RUST_LOG` overrides the level chosen by `-v`.
pub fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}
