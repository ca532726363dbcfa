//! The `ipsan` command line: one subcommand per module.

mod attach;
mod bench;
mod ctl;
mod demo;
mod discover;
mod gateway;
mod inquiry;
mod journal;
mod keygen;
mod lab;
mod model;
mod notify;
mod nvme;
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
    /// Parse the command line and exit (0 if clap accepts it) without running anything:
    /// tests/doc_commands.rs checks every `ipsan` command in the docs with it.
    #[arg(long, hide = true, global = true)]
    pub check_args: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// One LUN as a file on a FUSE mount, for a loop device: hosts without an iSCSI initiator.
    Attach(Box<attach::Args>),
    /// Measure a LUN: throughput, IOPS, latency percentiles, CPU.
    Bench(Box<bench::Args>),
    /// Inspect and change a running target through its control socket (docs/operate.md).
    Ctl(Box<ctl::Args>),
    /// Two-minute tour: plain iSCSI vs seal vs real IPsec (strongSwan), 1 MiB writes over emulated 2 and 64 ms links at 1 Gbit/s.
    Demo(Box<demo::Args>),
    /// List the targets a portal offers (SendTargets).
    Discover(Box<discover::Args>),
    /// Serve a remote iSCSI target's LUNs to any host, sealing either side (docs/gateway.md).
    Gateway(Box<gateway::Args>),
    /// Print a LUN's INQUIRY data and capacity.
    Inquiry(Box<inquiry::Args>),
    /// A 256-bit random pre-shared secret for Seal, as hex (O_EXCL, mode 0600 with --out).
    Keygen(keygen::Args),
    /// The papers' experiments end to end: plans, baselines, CPU, model, plots, report.
    Lab(Box<lab::Args>),
    /// The papers' throughput model (2008 Eq. 3-6, 2006 Eq. 2-3) generalised to depth k.
    Model(Box<model::Args>),
    /// Serve LUNs over iSCSI (RFC 7143).
    Target(Box<target::Args>),
    /// Storage-friendly TCP: load/unload/list the BPF congestion controls (the iFCP paper, Muknahallipatna et al.).
    Tcp(Box<tcp::Args>),
    /// Packet-level WAN emulator between two network namespaces.
    Wan(Box<wan::Args>),
}

pub fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Attach(args) => {
            hold_secrets();
            attach::run(*args)
        }
        Command::Bench(args) => bench::run(*args),
        Command::Ctl(args) => ctl::run(*args),
        Command::Demo(args) => demo::run(*args),
        Command::Discover(args) => discover::run(*args),
        Command::Gateway(args) => {
            hold_secrets();
            gateway::run(*args)
        }
        Command::Inquiry(args) => inquiry::run(*args),
        Command::Keygen(args) => keygen::run(args),
        Command::Lab(args) => lab::run(*args),
        Command::Model(args) => model::run(*args),
        Command::Target(args) => {
            hold_secrets();
            target::run(*args)
        }
        Command::Tcp(args) => tcp::run(*args),
        Command::Wan(args) => wan::run(*args),
    }
}

/// The long-running subcommands that hold secrets (target, gateway, attach; bench and the
/// other initiators once they have a secret, [`bench::ConnArgs::config`]) forbid core dumps
/// first: no core file with keys in it, no same-user ptrace or `/proc/PID/mem`.
pub(crate) fn hold_secrets() {
    if let Err(e) = ipsan_seal::process::forbid_core_dumps() {
        tracing::warn!("cannot forbid core dumps (PR_SET_DUMPABLE, RLIMIT_CORE): {e}");
    }
}

/// Logs go to stderr; `RUST_LOG` overrides the level chosen by `-v`. Under systemd (stderr is
/// the journal) they go to the journal as structured fields instead (journal.rs).
pub fn init_tracing(verbose: u8) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let default = match verbose {
        // fuser (`ipsan attach`) logs each mount step and a redundant second unmount at info/warn.
        0 => "info,fuser=error",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    if journal::stderr_is_journal() {
        if let Ok(layer) = journal::JournalLayer::new(journal::JOURNAL_SOCKET, "ipsan") {
            let _ = tracing_subscriber::registry()
                .with(filter)
                .with(layer)
                .try_init();
            return;
        }
    }
    // Colours only on a terminal.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}
