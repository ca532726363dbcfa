//! Live progress for `ipsan bench`: an indicatif bar with throughput on a terminal, one plain
//! line every few seconds otherwise (logs, CI, pipes).

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use crate::bench::Progress;

/// Builds the tick callback for [`crate::bench::run`]. `enabled=false` prints nothing.
pub fn reporter(enabled: bool) -> Option<Box<dyn FnMut(Progress) + Send>> {
    if !enabled {
        return None;
    }
    if std::io::stderr().is_terminal() {
        // Length 1 until the first sample sets the real one (0 would draw a full bar).
        let bar = ProgressBar::new(1);
        let style = ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.enable_steady_tick(Duration::from_millis(200));
        let mut last = (Duration::ZERO, 0u64);
        Some(Box::new(move |p: Progress| {
            let rate = rate(&mut last, p);
            match (p.total_bytes, p.total_time) {
                (Some(t), _) => {
                    bar.set_length(t >> 20);
                    bar.set_position(p.bytes >> 20);
                }
                (None, Some(t)) => {
                    bar.set_length(t.as_secs());
                    bar.set_position(p.elapsed.as_secs());
                }
                _ => {}
            }
            bar.set_message(format!("{rate:.1} MiB/s, {} ops", p.ops));
            if p.total_bytes.is_some_and(|t| p.bytes >= t)
                || p.total_time.is_some_and(|t| p.elapsed >= t)
            {
                bar.finish_and_clear();
            }
        }))
    } else {
        let mut last = (Duration::ZERO, 0u64);
        let mut last_print = Duration::ZERO;
        Some(Box::new(move |p: Progress| {
            if p.elapsed.saturating_sub(last_print) < Duration::from_secs(5) {
                return;
            }
            last_print = p.elapsed;
            let r = rate(&mut last, p);
            eprintln!(
                "bench: {:>6.1}s {:>10.1} MiB done, {r:>8.1} MiB/s now, {} ops",
                p.elapsed.as_secs_f64(),
                p.bytes as f64 / 1048576.0,
                p.ops
            );
        }))
    }
}

fn rate(last: &mut (Duration, u64), p: Progress) -> f64 {
    let dt = p.elapsed.saturating_sub(last.0).as_secs_f64();
    let db = p.bytes.saturating_sub(last.1) as f64;
    *last = (p.elapsed, p.bytes);
    if dt > 0.0 {
        db / dt / 1048576.0
    } else {
        0.0
    }
}
