//! `ipsan`: one command-line tool for the target, the initiator, the WAN lab and the TCP tooling.
//!
//! Each subcommand's flags and glue live in `src/cli/<name>.rs`; the work itself lives in the
//! workspace crates.

mod cli;

use clap::Parser;

/// mimalloc instead of glibc malloc: the hot path allocates and frees data buffers of up to
/// MaxBurstLength per command, which glibc hands back to the kernel and faults in again.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let args = cli::Cli::parse();
    cli::init_tracing(args.verbose);
    match cli::run(args.command) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ipsan: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
