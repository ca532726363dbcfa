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

/// mimalloc returns freed memory to the kernel 10 ms after a free (100 ms for arena memory,
/// `mi_option_purge_delay` × `mi_option_arena_purge_mult`). An RBD LUN allocates one read
/// buffer of the transfer's size per READ and frees it once the Data-In has left, so at 16 in
/// flight the same few MiB were given back and faulted in (and zeroed by the kernel:
/// `clear_page_erms`) again and again: 2.6–7 % of the target's CPU on 4 MiB reads in perf
/// (docs/results/rbd/bench-cpu/). One second keeps a busy target's working set mapped and still
/// gives memory back once a burst is over (10 s later for arena memory).
fn keep_freed_memory_briefly() {
    /// `mi_option_purge_delay` in mimalloc.h's `mi_option_e`: 15 in both v2 and v3.
    const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;
    #[allow(unsafe_code)]
    extern "C" {
        /// mimalloc's `void mi_option_set(mi_option_t option, long value)`, linked in by the
        /// `mimalloc` crate (libmimalloc-sys builds all of mimalloc into this binary).
        fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
    }
    // SAFETY: sets one integer option; mimalloc allows that at any time from any thread (the
    // option is read again at every purge decision), and the signature matches mimalloc.h.
    #[allow(unsafe_code)]
    unsafe {
        mi_option_set(MI_OPTION_PURGE_DELAY, 1000)
    };
}

fn main() -> std::process::ExitCode {
    keep_freed_memory_briefly();
    let args = cli::Cli::parse();
    if args.check_args {
        return std::process::ExitCode::SUCCESS;
    }
    cli::init_tracing(args.verbose);
    match cli::run(args.command) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ipsan: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
