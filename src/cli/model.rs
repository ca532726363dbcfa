//! `ipsan model`: the papers' throughput model (2008 Eq. 3, 4, 6; 2006 Eq. 2, 3) and its
//! generalisation to depth k (crates/ipsan-lab/src/model.rs).

use ipsan_lab::model::{self, Inputs, Summary};

/// Predict iSCSI throughput with encryption from RTT, block size, socket and cipher speeds.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Round-trip time (not one-way delay), e.g. 16ms.
    #[arg(long, value_parser = model::parse_duration)]
    pub rtt: std::time::Duration,
    /// Bytes per command, e.g. 64KiB.
    #[arg(long, value_parser = model::parse_size)]
    pub block: u64,
    /// Lower-layer throughput (bulk TCP under the same conditions), e.g. 110MB/s.
    #[arg(long, value_parser = model::parse_rate)]
    pub socket: f64,
    /// Encryption throughput of one worker, e.g. 10.8MB/s.
    #[arg(long, value_parser = model::parse_rate)]
    pub enc: f64,
    /// Decryption throughput of one worker (default: same as --enc).
    #[arg(long, value_parser = model::parse_rate)]
    pub dec: Option<f64>,
    /// Commands in flight for the generalised model (the papers' OP-n).
    #[arg(long, default_value_t = 1)]
    pub depth: u32,
    /// Crypto workers for the generalised model.
    #[arg(long, default_value_t = 2)]
    pub workers: u32,
    /// TCP window for the generalised model, e.g. 4MiB (default: unlimited).
    #[arg(long, value_parser = model::parse_size)]
    pub window: Option<u64>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let i = Inputs {
        rtt_s: a.rtt.as_secs_f64(),
        block: a.block as f64,
        socket: a.socket,
        enc: a.enc,
        dec: a.dec.unwrap_or(a.enc),
    };
    let s = Summary::compute(&i, a.depth, a.workers, a.window.map(|w| w as f64))?;
    if a.json {
        println!("{}", s.to_json());
        return Ok(());
    }
    let mb = |x: f64| x / 1e6;
    println!(
        "inputs: RTT {:.3} ms, block {} B, SOCKET {:.2} MB/s, ENC {:.2} MB/s, DEC {:.2} MB/s",
        i.rtt_s * 1e3,
        a.block,
        mb(i.socket),
        mb(i.enc),
        mb(i.dec)
    );
    for (name, v) in [
        (
            "write, no pre-processing (2008 Eq. 3)",
            s.eq3_write_sequential,
        ),
        (
            "write, pre-processing OP-2 (2008 Eq. 4)",
            s.eq4_write_preprocessed,
        ),
        ("read, one process (2006 Eq. 2)", s.eq2_read_sequential),
        ("read, two processes (2006 Eq. 3)", s.eq3_read_preprocessed),
    ] {
        println!("  {name:<44} {:>10.3} MB/s", mb(v));
    }
    println!(
        "  {:<44} {:>10.2}",
        "useful workers n (2008 Eq. 6)", s.eq6_workers
    );
    for (name, p) in [
        (
            format!("write depth {} 2·RTT (generalised)", a.depth),
            s.general_write_2rtt,
        ),
        (
            format!("write depth {} 1·RTT (generalised)", a.depth),
            s.general_write_1rtt,
        ),
        (
            "lower-layer crypto, depth 1, 2·RTT".to_string(),
            s.lower_layer_depth1_2rtt,
        ),
    ] {
        println!(
            "  {name:<44} {:>10.3} MB/s  (limit: {}, useful depth {:.1})",
            mb(p.throughput),
            p.limit,
            p.useful_depth
        );
    }
    Ok(())
}
