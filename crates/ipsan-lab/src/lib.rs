//! ipsan-lab: the papers' experiments end to end (issue 6).
//!
//! # Layout
//! - [`model`]: the papers' throughput equations (2008 Eq. 1–6, 2006 Eq. 1–3) and their
//!   generalisation to depth k with link, window and crypto-worker limits. Pure.
//! - [`plan`]: the TOML plan format (a matrix over direction, delay, impairments, block,
//!   depth, cipher, pipeline, scheme, backend, iSCSI parameters, congestion control) and the
//!   built-in plans in `plans/`.
//! - [`calibrate`]: RTT ping-pong, bulk-TCP SOCKET and cipher ENC/DEC microbenchmarks, and
//!   the calibration file (`ipsan lab calibrate`; [`runner::calibrate_plan`]) whose inputs a
//!   run with `--calibration` fixes before it starts and the report predicts from alone: the
//!   keys a point's link and cipher rates are found by ([`calibrate::link_group_key`],
//!   [`calibrate::cipher_key`]) and the carriers' fitted costs as the file keeps them
//!   ([`calibrate::StoredCosts`], fitted by [`fit`]).
//! - [`esp`]: `esp-emu`, the emulator stage doing ESP's per-packet 3DES + HMAC-SHA1-96.
//! - [`ipsec`]: the `ipsec` scheme: strongSwan's charon with userspace ESP per namespace.
//! - [`guard`]: children die with the lab (PR_SET_PDEATHSIG); Ctrl-C removes its namespaces.
//! - [`runner`]: links, target/bench/tunnel processes, measurement, progress with ETA
//!   (`runner/`: carriers, links, the bench run and its result, the calibration's cost runs,
//!   child processes).
//! - [`sockbuf`]: wireguard-go's UDP buffers raised to upstream's 7 MiB from outside.
//! - [`tunnel`]: how long to wait for a tunnel (WireGuard) to carry TCP, sized to the RTT.
//! - [`results`]: one record per run, `results.json` and `results.csv`.
//! - [`aggregate`]: a point's repetitions aggregated (median, min–max, CPU per host): what
//!   the report, the figures, the fits and the calibration's cost runs read.
//! - [`report`]: `report.md` and `report.html` (pulldown-cmark), the headline and every point.
//! - [`figures`]: the papers' figures and tables beside ours, with the papers' numbers, one
//!   file per figure family under `figures/`.
//! - [`fit`]: the costs the model is priced with on this machine (calibrated cipher rates,
//!   per-byte + per-flight carrier and charon costs fitted over a plan's runs) and
//!   [`fit::model_here`], the model for a point: fitted on the plan's runs (an
//!   explanation), or priced from a calibration file alone ([`fit::Rates::from_calibration`],
//!   the out-of-sample prediction).
//! - [`plot`]: line charts (log axes, min–max bars, legend outside) and grouped bars.
//! - [`timeline`]: the per-command timeline drawn from `ipsan bench --trace` files, read with
//!   `ipsan_bench::trace`.
pub mod aggregate;
pub mod calibrate;
pub mod esp;
pub mod figures;
pub mod fit;
pub mod guard;
pub mod ipsec;
pub mod model;
pub mod plan;
pub mod plot;
pub mod report;
pub mod results;
pub mod runner;
pub mod sockbuf;
pub mod timeline;
pub mod tunnel;
