//! `ipsan inquiry URL`: INQUIRY, READ CAPACITY and REPORT LUNS of one LUN, to poke a target by
//! hand; for an `nvme+tcp://` URL, the controller's Identify data, its active namespaces and
//! the namespace's size.

use anyhow::Context;
use ipsan_initiator::Session;

/// Print a LUN's identity and size.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// iscsi://[user[%password]@]host[:port]/target-iqn/lun or
    /// nvme+tcp://host[:port]/subsysnqn[/nsid]
    pub url: String,
    #[command(flatten)]
    pub conn: super::bench::ConnArgs,
    #[command(flatten)]
    pub nvme: super::nvme::NvmeArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if ipsan_initiator::nvme::NvmeUrl::is_nvme(&args.url) {
        return rt.block_on(nvme(args));
    }
    args.nvme.refuse_for_iscsi()?;
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

/// The NVMe/TCP summary: Identify Controller, the active namespaces, the namespace.
async fn nvme(args: Args) -> anyhow::Result<()> {
    let (url, cfg) = args.nvme.config(&args.url, &args.conn)?;
    url.require_subsystem()?;
    let s = ipsan_initiator::nvme::NvmeSession::open(&url, &cfg)
        .await
        .with_context(|| format!("cannot open {url}"))?;
    let i = s.info();
    let id = &i.identify;
    let (hd, dd, maxh2c) = s.transport();
    println!("target:     {url}");
    println!("subsystem:  {}", id.subnqn);
    println!("model:      {}", id.model);
    println!("serial:     {}", id.serial);
    println!("firmware:   {}", id.firmware);
    println!("version:    NVMe {}", id.version_string());
    println!("controller: CNTLID {} VID {:#06x}", i.cntlid, id.vid);
    println!("namespaces: {:?}", i.namespaces);
    if let Some((nsid, ns)) = &i.namespace {
        let bytes = ns.nsze.saturating_mul(u64::from(ns.block_len));
        println!(
            "namespace:  {nsid}: {} blocks × {} bytes = {bytes} bytes ({:.2} GiB)",
            ns.nsze,
            ns.block_len,
            bytes as f64 / (1u64 << 30) as f64
        );
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        println!("nguid:      {}", hex(&ns.nguid));
        println!("eui64:      {}", hex(&ns.eui64));
    }
    println!(
        "transport:  {} I/O queue(s), digests(h/d)={}/{}, MAXH2CDATA={}, in-capsule {} bytes, MDTS max transfer {} bytes, KATO {} ms",
        s.queues(),
        hd,
        dd,
        maxh2c,
        id.in_capsule_bytes(),
        s.max_transfer(),
        cfg.kato.as_millis()
    );
    println!(
        "security:   TLS {}, {}",
        if s.tls() {
            "1.3 (configured PSK)"
        } else {
            "off"
        },
        s.authentication()
            .unwrap_or_else(|| "no in-band authentication".to_owned())
    );
    s.close().await.context("shutdown (CC.SHN)")?;
    Ok(())
}
