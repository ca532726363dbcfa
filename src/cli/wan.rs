//! `ipsan wan`: the packet-level WAN emulator between two network namespaces (issue 4).
//!
//! `up` starts a small daemon (this binary's hidden `wan daemon`) that holds the link and
//! answers `set`, `stats` and `down` on `/run/ipsan-wan/<name>.sock`. The work lives in the
//! `ipsan-wan` crate; this file is flags and glue.

use anyhow::{bail, Context};
use ipsan_wan::config::{
    parse_duration, parse_loss_model, parse_prob, parse_queue, parse_rate, validate_name,
};
use ipsan_wan::control::{self, Request, Response};
use ipsan_wan::{DirConfig, DirStats, Engine, JitterDist, LinkConfig, LinkStats, LossModel};
use std::io::BufRead;
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, clap::Subcommand)]
enum Cmd {
    /// Create namespaces <name>-ini and <name>-tgt joined only through the emulator.
    Up(UpArgs),
    /// Change the impairments of a running link (flags not given keep their value).
    Set(SetArgs),
    /// Per-direction counters: packets, bytes, drops (loss / queue / cut), reordered,
    /// corrupted, and the TUN devices' own kernel drops.
    Stats(StatsArgs),
    /// Run a command inside one side's namespace: `ipsan wan exec ini -- iperf3 -c 10.231.0.2`.
    Exec(ExecArgs),
    /// Cut the link now: nothing crosses (and packets on the wire are lost) until `restore`.
    Cut(CutArgs),
    /// End a cut made with `ipsan wan cut` (a scheduled --cut follows its schedule).
    Restore(NameArg),
    /// Tear a link down (idempotent; also cleans up after a crashed daemon).
    Down(NameArg),
    /// Unprivileged TCP-level delay relay. LESS FAITHFUL: it terminates TCP on both sides,
    /// so neither host's TCP sees the delay; use the namespace emulator where you can.
    Proxy(ProxyArgs),
    /// (internal) The daemon `up` starts.
    #[command(hide = true)]
    Daemon(DaemonArgs),
}

#[derive(Debug, clap::Args)]
struct CutArgs {
    /// Link name.
    #[arg(long, default_value = "lab")]
    name: String,
    /// Which direction: both, up (ini->tgt) or down (tgt->ini).
    #[arg(long, default_value = "both", value_parser = ["both", "up", "down"])]
    dir: String,
}

#[derive(Debug, clap::Args)]
struct NameArg {
    /// Link name.
    #[arg(long, default_value = "lab")]
    name: String,
}

/// Impairment flags. A plain flag sets both directions; `-up` (ini → tgt) and `-down`
/// (tgt → ini) variants override one direction.
#[derive(Debug, Clone, Default, clap::Args)]
struct Impair {
    /// One-way delay, e.g. 8ms.
    #[arg(long)]
    delay: Option<String>,
    #[arg(long)]
    delay_up: Option<String>,
    #[arg(long)]
    delay_down: Option<String>,
    /// Delay jitter: uniform half-width or normal standard deviation, e.g. 0.5ms.
    #[arg(long)]
    jitter: Option<String>,
    #[arg(long)]
    jitter_up: Option<String>,
    #[arg(long)]
    jitter_down: Option<String>,
    /// Jitter distribution: uniform or normal. Jitter never reorders packets by itself.
    #[arg(long, value_parser = ["uniform", "normal"])]
    jitter_dist: Option<String>,
    /// Loss probability, e.g. 0.1%.
    #[arg(long)]
    loss: Option<String>,
    #[arg(long)]
    loss_up: Option<String>,
    #[arg(long)]
    loss_down: Option<String>,
    /// Loss model: bernoulli (uses --loss) or gilbert:P,R[,BAD_LOSS[,GOOD_LOSS]].
    #[arg(long)]
    loss_model: Option<String>,
    #[arg(long)]
    loss_model_up: Option<String>,
    #[arg(long)]
    loss_model_down: Option<String>,
    /// Probability that a packet is held back behind later ones, e.g. 2%.
    #[arg(long)]
    reorder: Option<String>,
    #[arg(long)]
    reorder_up: Option<String>,
    #[arg(long)]
    reorder_down: Option<String>,
    /// How long a reordered packet is held back (default 1ms).
    #[arg(long)]
    reorder_gap: Option<String>,
    /// Probability of flipping one random bit of a packet, e.g. 0.02%.
    #[arg(long)]
    corrupt: Option<String>,
    #[arg(long)]
    corrupt_up: Option<String>,
    #[arg(long)]
    corrupt_down: Option<String>,
    /// Probability of delivering a packet twice.
    #[arg(long)]
    duplicate: Option<String>,
    #[arg(long)]
    duplicate_up: Option<String>,
    #[arg(long)]
    duplicate_down: Option<String>,
    /// Bottleneck rate of IP bytes, e.g. 100mbit, 1gbit (0 = unlimited).
    #[arg(long)]
    rate: Option<String>,
    #[arg(long)]
    rate_up: Option<String>,
    #[arg(long)]
    rate_down: Option<String>,
    /// Bottleneck queue: packets (1000) or bytes (64kb); arrivals beyond it are tail-dropped.
    #[arg(long)]
    queue: Option<String>,
    #[arg(long)]
    queue_up: Option<String>,
    #[arg(long)]
    queue_down: Option<String>,
    /// Scheduled link cuts, START+LENGTH[,...] counted from when the setting takes effect,
    /// e.g. 5s+3s (cut 5 s from now for 3 s); `none` clears. Nothing crosses while cut.
    #[arg(long)]
    cut: Option<String>,
    #[arg(long)]
    cut_up: Option<String>,
    #[arg(long)]
    cut_down: Option<String>,
}

fn pick<'a>(both: &'a Option<String>, one: &'a Option<String>) -> Option<&'a str> {
    one.as_deref().or(both.as_deref())
}

impl Impair {
    /// Applies the given flags to one direction.
    fn apply(&self, d: &mut DirConfig, up: bool) -> anyhow::Result<()> {
        let side =
            |u: &Option<String>, dn: &Option<String>| if up { u.clone() } else { dn.clone() };
        if let Some(s) = pick(&self.delay, &side(&self.delay_up, &self.delay_down)) {
            d.delay = parse_duration("delay", s)?;
        }
        if let Some(s) = pick(&self.jitter, &side(&self.jitter_up, &self.jitter_down)) {
            d.jitter = parse_duration("jitter", s)?;
        }
        if let Some(s) = &self.jitter_dist {
            d.jitter_dist = if s == "normal" {
                JitterDist::Normal
            } else {
                JitterDist::Uniform
            };
        }
        let loss = pick(&self.loss, &side(&self.loss_up, &self.loss_down))
            .map(|s| parse_prob("loss", s))
            .transpose()?;
        let model = pick(
            &self.loss_model,
            &side(&self.loss_model_up, &self.loss_model_down),
        )
        .map(parse_loss_model)
        .transpose()?;
        match (model, loss) {
            (Some(Some(g)), None) => d.loss = g,
            (Some(Some(_)), Some(_)) => {
                bail!("--loss and a gilbert --loss-model both set the loss; give one")
            }
            (_, Some(p)) => {
                d.loss = if p == 0.0 {
                    LossModel::None
                } else {
                    LossModel::Bernoulli { p }
                }
            }
            (Some(None), None) => {
                if let LossModel::Gilbert { .. } = d.loss {
                    d.loss = LossModel::None;
                }
            }
            (None, None) => {}
        }
        if let Some(s) = pick(&self.reorder, &side(&self.reorder_up, &self.reorder_down)) {
            d.reorder = parse_prob("reorder", s)?;
        }
        if let Some(s) = &self.reorder_gap {
            d.reorder_gap = parse_duration("reorder-gap", s)?;
        }
        if let Some(s) = pick(&self.corrupt, &side(&self.corrupt_up, &self.corrupt_down)) {
            d.corrupt = parse_prob("corrupt", s)?;
        }
        if let Some(s) = pick(
            &self.duplicate,
            &side(&self.duplicate_up, &self.duplicate_down),
        ) {
            d.duplicate = parse_prob("duplicate", s)?;
        }
        if let Some(s) = pick(&self.rate, &side(&self.rate_up, &self.rate_down)) {
            d.rate_bps = parse_rate("rate", s)?;
        }
        if let Some(s) = pick(&self.queue, &side(&self.queue_up, &self.queue_down)) {
            d.queue = parse_queue("queue", s)?;
        }
        if let Some(s) = pick(&self.cut, &side(&self.cut_up, &self.cut_down)) {
            d.cuts = ipsan_wan::cut::parse_cuts("cut", s)?;
        }
        d.validate()?;
        Ok(())
    }
}

#[derive(Debug, clap::Args)]
struct UpArgs {
    #[command(flatten)]
    impair: Impair,
    /// MTU of both interfaces.
    #[arg(long, default_value_t = 1500)]
    mtu: u32,
    /// Seed of every random choice (same seed, same arrivals: same verdicts).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Link name: namespaces are <name>-ini and <name>-tgt.
    #[arg(long, default_value = "lab")]
    name: String,
    /// A /24 inside 10.231.0.0/16; ini gets .1, tgt .2.
    #[arg(long, default_value = "10.231.0.0/24")]
    subnet: String,
    /// auto (netem if the kernel has it, else builtin), builtin, or netem.
    #[arg(long, default_value = "auto", value_parser = ["auto", "builtin", "netem"])]
    engine: String,
    /// Do not put the forwarder threads in the SCHED_FIFO real-time class.
    #[arg(long)]
    no_realtime: bool,
    /// Do not take the path's own latency (TUN hops and wake-ups, measured at link-up) off
    /// the delay: hosts then see the set delay plus 0.1–0.3 ms of round trip.
    #[arg(long)]
    no_path_compensation: bool,
    /// Hold the link in this process (Ctrl-C leaves cleanup to `ipsan wan down`).
    #[arg(long)]
    foreground: bool,
}

#[derive(Debug, clap::Args)]
struct SetArgs {
    #[command(flatten)]
    impair: Impair,
    /// Link name.
    #[arg(long, default_value = "lab")]
    name: String,
}

#[derive(Debug, clap::Args)]
struct StatsArgs {
    /// Link name.
    #[arg(long, default_value = "lab")]
    name: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct ExecArgs {
    /// ini or tgt.
    side: ipsan_wan::Side,
    /// Link name.
    #[arg(long, default_value = "lab")]
    name: String,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

#[derive(Debug, clap::Args)]
struct ProxyArgs {
    /// Address to listen on.
    #[arg(long)]
    listen: std::net::SocketAddr,
    /// Address to relay to.
    #[arg(long)]
    to: std::net::SocketAddr,
    /// Delay added to each direction's bytes.
    #[arg(long, default_value = "0ms")]
    delay: String,
}

#[derive(Debug, clap::Args)]
struct DaemonArgs {
    /// The link configuration as JSON.
    #[arg(long)]
    config_json: String,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.cmd {
        Cmd::Up(a) => up(a),
        Cmd::Set(a) => set(a),
        Cmd::Stats(a) => stats(a),
        Cmd::Exec(a) => exec(a),
        Cmd::Cut(a) => cut(a),
        Cmd::Restore(a) => restore(a),
        Cmd::Down(a) => down(a),
        Cmd::Proxy(a) => proxy(a),
        Cmd::Daemon(a) => daemon(a),
    }
}

fn parse_subnet(s: &str) -> anyhow::Result<u8> {
    let ip = s.strip_suffix("/24").unwrap_or(s);
    let addr: std::net::Ipv4Addr = ip
        .parse()
        .with_context(|| format!("--subnet {s:?}: expected 10.231.X.0/24"))?;
    let o = addr.octets();
    if o[0] != 10 || o[1] != 231 || o[3] != 0 {
        bail!("--subnet {s:?}: must be a /24 inside 10.231.0.0/16, like 10.231.5.0/24");
    }
    Ok(o[2])
}

fn up(a: UpArgs) -> anyhow::Result<()> {
    validate_name(&a.name)?;
    if !ipsan_wan::link::is_root() {
        bail!(
            "{}; without root, `ipsan wan proxy` offers a TCP-level delay relay (less faithful)",
            ipsan_wan::LinkError::NotRoot
        );
    }
    let mut cfg = LinkConfig::new(&a.name);
    cfg.subnet = parse_subnet(&a.subnet)?;
    cfg.mtu = a.mtu;
    cfg.seed = a.seed;
    cfg.realtime = !a.no_realtime;
    cfg.compensate_path = !a.no_path_compensation;
    cfg.engine = match a.engine.as_str() {
        "builtin" => Engine::Builtin,
        "netem" => Engine::Netem,
        _ => Engine::Auto,
    };
    a.impair.apply(&mut cfg.up, true)?;
    a.impair.apply(&mut cfg.down, false)?;
    cfg.validate()?;
    if a.foreground {
        return control::serve(cfg, |link| {
            println!("{}", summary(link.config(), link.engine()));
        })
        .map_err(Into::into);
    }
    if control::request(&a.name, &Request::Config).is_ok() {
        bail!(
            "link {:?} is already up; use `ipsan wan set` to change it or `ipsan wan down --name {}`",
            a.name,
            a.name
        );
    }
    std::fs::create_dir_all(control::state_dir())
        .with_context(|| format!("creating {}", control::state_dir().display()))?;
    let log = std::fs::File::create(control::log_path(&a.name))
        .with_context(|| format!("creating {}", control::log_path(&a.name).display()))?;
    let exe = std::env::current_exe().context("finding the ipsan binary")?;
    let json = cfg.to_json();
    let mut child = {
        use std::os::unix::process::CommandExt;
        std::process::Command::new(exe)
            .args(["wan", "daemon", "--config-json", &json])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(log)
            .process_group(0)
            .spawn()
            .context("starting the wan daemon")?
    };
    let out = child.stdout.take().context("daemon stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
    let line = line.trim();
    if let Some(rest) = line.strip_prefix("ready ") {
        let engine = if rest == "netem" {
            Engine::Netem
        } else {
            Engine::Builtin
        };
        println!("{}", summary(&cfg, engine));
        return Ok(());
    }
    if line.is_empty() {
        // No answer: stop the daemon we started and remove what it may have created.
        let _ = child.kill();
        let _ = child.wait();
        let _ = control::down(&a.name);
    } else {
        // It answered with an error and has already undone its own work; a link that was
        // there before (the "already exists" case) must be left alone.
        let _ = child.wait();
    }
    let log = std::fs::read_to_string(control::log_path(&a.name)).unwrap_or_default();
    let reason = line.strip_prefix("error: ").unwrap_or(line);
    bail!(
        "the link did not come up: {}{}",
        if reason.is_empty() {
            "no answer from the daemon"
        } else {
            reason
        },
        if log.trim().is_empty() {
            String::new()
        } else {
            format!("\ndaemon log:\n{}", log.trim())
        }
    )
}

fn summary(cfg: &LinkConfig, engine: Engine) -> String {
    let d = |d: &DirConfig| {
        let mut s = format!("delay {:?}", d.delay);
        if !d.jitter.is_zero() {
            s += &format!(" jitter {:?} {:?}", d.jitter, d.jitter_dist);
        }
        match d.loss {
            LossModel::None => {}
            LossModel::Bernoulli { p } => s += &format!(" loss {}%", p * 100.0),
            LossModel::Gilbert { p, r, .. } => {
                s += &format!(" loss gilbert p={}% r={}%", p * 100.0, r * 100.0)
            }
        }
        for (name, p) in [
            ("reorder", d.reorder),
            ("corrupt", d.corrupt),
            ("duplicate", d.duplicate),
        ] {
            if p > 0.0 {
                s += &format!(" {name} {}%", p * 100.0);
            }
        }
        if d.rate_bps > 0 {
            s += &format!(" rate {} bit/s queue {:?}", d.rate_bps, d.queue);
        }
        for w in &d.cuts {
            s += &format!(" cut {:?}+{:?}", w.start, w.len);
        }
        s
    };
    let (ini, tgt) = ipsan_wan::link::ns_names(&cfg.name);
    format!(
        "link {} up ({engine:?} engine, mtu {}, seed {}): {ini} {} <-> {tgt} {}\n  up (ini->tgt): {}\n  down (tgt->ini): {}",
        cfg.name,
        cfg.mtu,
        cfg.seed,
        cfg.ini_addr(),
        cfg.tgt_addr(),
        d(&cfg.up),
        d(&cfg.down)
    )
    .to_lowercase()
}

fn daemon(a: DaemonArgs) -> anyhow::Result<()> {
    let cfg = LinkConfig::from_json(&a.config_json).context("daemon: bad --config-json")?;
    let r = control::serve(cfg, |link| {
        let engine = if link.engine() == Engine::Netem {
            "netem"
        } else {
            "builtin"
        };
        println!("ready {engine}");
    });
    if let Err(e) = &r {
        println!("error: {e}");
    }
    r.map_err(Into::into)
}

fn set(a: SetArgs) -> anyhow::Result<()> {
    let cfg = match control::request(&a.name, &Request::Config)? {
        Response::Config(c) => c,
        other => bail!("unexpected answer {other:?}"),
    };
    let (mut up, mut down) = (cfg.up.clone(), cfg.down.clone());
    a.impair.apply(&mut up, true)?;
    a.impair.apply(&mut down, false)?;
    control::request(
        &a.name,
        &Request::Set {
            up: Box::new(up),
            down: Box::new(down),
        },
    )?;
    if let Response::Config(c) = control::request(&a.name, &Request::Config)? {
        let engine = match c.engine {
            Engine::Netem => Engine::Netem,
            _ => Engine::Builtin,
        };
        println!("{}", summary(&c, engine).replacen(" up (", " set (", 1));
    }
    Ok(())
}

fn stats(a: StatsArgs) -> anyhow::Result<()> {
    let st: LinkStats = match control::request(&a.name, &Request::Stats)? {
        Response::Stats(s) => s,
        other => bail!("unexpected answer {other:?}"),
    };
    if a.json {
        println!("{}", st.to_json_pretty());
        return Ok(());
    }
    println!(
        "{:<16} {:>12} {:>14} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>6} {:>10}",
        "direction",
        "packets",
        "bytes",
        "drop-loss",
        "drop-queue",
        "drop-other",
        "drop-cut",
        "reordered",
        "corrupted",
        "duplicated",
        "queue",
        "late-p99"
    );
    for (name, d) in [("up (ini->tgt)", st.up), ("down (tgt->ini)", st.down)] {
        print_dir(name, &d);
    }
    if st.up.cut || st.down.cut {
        println!(
            "link is CUT now: up {}, down {}",
            if st.up.cut { "cut" } else { "open" },
            if st.down.cut { "cut" } else { "open" }
        );
    }
    if let Some(dev) = st.devices {
        // A direction enters the emulator as the sending TUN's tx and leaves it as the
        // receiving TUN's rx: tx drops are packets the kernel could not queue for the
        // forwarder (ring full), rx drops packets the kernel refused after the forwarder.
        println!(
            "TUN devices (kernel):  {:<16} {:>12} {:>12}",
            "", "ring-drops", "rx-drops"
        );
        for (name, from, to) in [
            ("up (ini->tgt)", dev.ini, dev.tgt),
            ("down (tgt->ini)", dev.tgt, dev.ini),
        ] {
            println!(
                "                       {:<16} {:>12} {:>12}",
                name, from.tx_dropped, to.rx_dropped
            );
        }
    }
    Ok(())
}

fn print_dir(name: &str, d: &DirStats) {
    let late = match d.late_quantile_us(0.99) {
        Some(us) => format!("<={us}us"),
        None if d.packets_out == 0 => "-".into(),
        None => ">5ms".into(),
    };
    println!(
        "{:<16} {:>12} {:>14} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>6} {:>10}",
        name,
        d.packets_in,
        d.bytes_in,
        d.dropped_loss,
        d.dropped_queue,
        d.dropped_other,
        d.dropped_cut,
        d.reordered,
        d.corrupted,
        d.duplicated,
        d.queue_depth,
        late
    );
}

fn cut(a: CutArgs) -> anyhow::Result<()> {
    let (up, down) = match a.dir.as_str() {
        "up" => (true, false),
        "down" => (false, true),
        _ => (true, true),
    };
    control::request(&a.name, &Request::Cut { up, down })?;
    println!("link {} cut ({})", a.name, a.dir);
    Ok(())
}

fn restore(a: NameArg) -> anyhow::Result<()> {
    control::request(&a.name, &Request::Restore)?;
    println!("link {} restored", a.name);
    Ok(())
}

fn exec(a: ExecArgs) -> anyhow::Result<()> {
    validate_name(&a.name)?;
    let (ini, tgt) = ipsan_wan::link::ns_names(&a.name);
    let ns = match a.side {
        ipsan_wan::Side::Ini => ini,
        ipsan_wan::Side::Tgt => tgt,
    };
    if !ipsan_wan::netns::exists(&ns) {
        bail!("no namespace {ns}: is link {:?} up?", a.name);
    }
    let status = std::process::Command::new("ip")
        .args(["netns", "exec", &ns])
        .args(&a.command)
        .status()
        .with_context(|| format!("running ip netns exec {ns}"))?;
    match status.code() {
        Some(0) => Ok(()),
        Some(c) => std::process::exit(c),
        None => bail!("{} was killed by a signal", a.command.join(" ")),
    }
}

fn down(a: NameArg) -> anyhow::Result<()> {
    if control::down(&a.name)? {
        println!("link {} down", a.name);
    } else {
        println!("link {} was not up; nothing to do", a.name);
    }
    Ok(())
}

fn proxy(a: ProxyArgs) -> anyhow::Result<()> {
    let delay = parse_duration("delay", &a.delay)?;
    let p = ipsan_wan::proxy::Proxy::start(a.listen, a.to, delay)
        .with_context(|| format!("listening on {}", a.listen))?;
    eprintln!(
        "relaying {} -> {} with {delay:?} each way (TCP-level relay: less faithful than \
         `ipsan wan up`, neither host's TCP sees the delay)",
        p.local_addr(),
        a.to
    );
    p.wait();
    Ok(())
}
