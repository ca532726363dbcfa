//! A Linux guest under QEMU (`../shared/nvmevm`, `../shared/linuxvm`) booted once more when its
//! own kernel failed while booting.
//!
//! Under QEMU's TCG the Debian guest kernels have been seen to oops while booting, before any
//! storage or network of the test: an `int3` in `crng_make_state` under `modprobe` at 9 s
//! (2026-11-27, `tests/nvme_linux_target.rs` in `scripts/test`; the rerun passed). That is the
//! emulator, not the test. So a boot that failed with an `Oops:` or a `Kernel panic` on its
//! console before the guest said it was ready (the line its init or serving script prints once
//! its own set-up is done, before the test's part) is logged and booted once more, once; any
//! other failure, and an Oops after the guest was ready, is the test's.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Whether `console` shows the guest kernel failing before the line `ready` (anywhere in it
/// when `ready` never came).
pub fn failed_booting(console: &str, ready: &str) -> bool {
    let booting = console.split(ready).next().unwrap_or(console);
    booting.contains("Oops:") || booting.contains("Kernel panic")
}

/// Runs `boot`, one guest boot (`Err` with a message that holds its console), and when it
/// failed [`failed_booting`] before `ready`, says so on stderr and runs it once more. Returns
/// the last boot's outcome.
pub fn boot_once_more_after_oops<T>(
    ready: &str,
    mut boot: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    match boot() {
        Err(c) if failed_booting(&c, ready) => {
            eprintln!(
                "the guest kernel failed while booting (before {ready:?}), booting once more:\n{c}"
            );
            boot()
        }
        done => done,
    }
}

/// Stops a `run.sh` of the VM harnesses: SIGTERM (on which it stops QEMU and cleans up), up to
/// 20 s for it to exit, then SIGKILL.
pub fn stop(run_sh: &mut Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &run_sh.id().to_string()])
        .status();
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end {
        if let Ok(Some(_)) = run_sh.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = run_sh.kill();
    let _ = run_sh.wait();
}

/// Runs one `../shared/linuxvm` boot (`run_sh`, its arguments set, console to `log`) to its
/// end, 330 s at most, prints its `RESULT` lines, and passes when it exited 0 with `RESULT ok`;
/// `Err` holds the console (for [`boot_once_more_after_oops`]), named by `what`.
pub fn linuxvm_result(
    mut run_sh: Command,
    log: &std::path::Path,
    what: &str,
) -> Result<(), String> {
    let mut child = super::Proc(
        run_sh
            .stdout(std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?)
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .map_err(|e| format!("linuxvm run.sh: {e}"))?,
    );
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.0.try_wait().map_err(|e| e.to_string())? {
            break s;
        }
        if started.elapsed() >= Duration::from_secs(330) {
            stop(&mut child.0);
            return Err(format!(
                "linuxvm did not finish within 330 s:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let out = std::fs::read_to_string(log).unwrap_or_default();
    for l in out.lines().filter(|l| l.contains("RESULT")) {
        println!("{l}");
    }
    if status.success() && out.contains("RESULT ok") {
        Ok(())
    } else {
        Err(format!("linuxvm {what}: {status}\n{out}"))
    }
}
