//! `ipsan inquiry URL`: INQUIRY, READ CAPACITY and REPORT LUNS of one LUN, to poke a target by
//! hand.

use anyhow::Context;
use ipsan_initiator::Session;

/// Print a LUN's identity and size.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// iscsi://[user[%password]@]host[:port]/target-iqn/lun
    pub url: String,
    #[command(flatten)]
    pub conn: super::bench::ConnArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (url, cfg) = args.conn.config(&args.url)?;
        url.require_lun()?;
        let s = Session::open(&url, &cfg)
            .await
            .with_context(|| format!("cannot open {url}"))?;
        let inq = s.inquiry().await.context("INQUIRY")?;
        let cap = s.capacity().context("capacity unknown")?;
        let luns = s.report_luns().await.context("REPORT LUNS")?;
        println!("target:   {url}");
        println!("vendor:   {}", inq.vendor);
        println!("product:  {}", inq.product);
        println!("revision: {}", inq.revision);
        println!("type:     {:#04x}", inq.peripheral_type);
        println!(
            "capacity: {} blocks × {} bytes = {} bytes ({:.2} GiB)",
            cap.blocks,
            cap.block_len,
            cap.bytes(),
            cap.bytes() as f64 / (1u64 << 30) as f64
        );
        println!("luns:     {luns:?}");
        let p = s.params();
        println!(
            "session:  TSIH {} InitialR2T={} ImmediateData={} MaxBurst={} target MaxRecvDSL={}",
            p.tsih,
            p.initial_r2t,
            p.immediate_data,
            p.max_burst_length,
            p.target_max_recv_data_segment_length
        );
        s.logout().await.context("logout")?;
        Ok(())
    })
}
