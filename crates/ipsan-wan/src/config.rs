//! What a link looks like: per-direction impairments plus the link-wide settings, and the
//! parsers for the command-line spellings (`8ms`, `0.1%`, `100mbit`, `gilbert:1%,30%`).
//!
//! The units follow `tc`/Dummynet so that a setting copied from a paper or a netem recipe
//! means the same thing here: `kbit`/`mbit`/`gbit` are bits per second (powers of 1000),
//! `kbps`/`mbps`/`gbps` bytes per second.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A setting that could not be parsed or is out of range. Carries the flag and the text given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The text did not parse as the kind of value the setting takes.
    #[error("{what}: cannot parse {given:?}: {why}")]
    Parse {
        /// The setting (`delay`, `loss`, ...).
        what: &'static str,
        /// What the user wrote.
        given: String,
        /// What was expected.
        why: &'static str,
    },
    /// The value parsed but is not allowed.
    #[error("{what}: {why}")]
    Range {
        /// The setting.
        what: &'static str,
        /// Why it is not allowed.
        why: String,
    },
}

fn parse_err(what: &'static str, given: &str, why: &'static str) -> ConfigError {
    ConfigError::Parse {
        what,
        given: given.to_owned(),
        why,
    }
}

/// How jitter is drawn around the constant delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum JitterDist {
    /// Uniform in `[delay - jitter, delay + jitter]`.
    #[default]
    Uniform,
    /// Normal with mean `delay` and standard deviation `jitter`, truncated at zero.
    Normal,
}

/// Which packets the loss stage drops.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase", tag = "model")]
pub enum LossModel {
    /// No loss.
    #[default]
    None,
    /// Each packet independently with probability `p`.
    Bernoulli {
        /// Loss probability in `[0, 1]`.
        p: f64,
    },
    /// Gilbert–Elliott two-state bursts: Good → Bad with probability `p` per packet,
    /// Bad → Good with `r`; a packet is lost with `loss_bad` in Bad and `loss_good` in Good.
    /// The classic Gilbert model is `loss_bad = 1, loss_good = 0`, whose mean loss is
    /// `p / (p + r)` and mean burst length `1 / r`.
    Gilbert {
        /// Good → Bad transition probability.
        p: f64,
        /// Bad → Good transition probability.
        r: f64,
        /// Loss probability in the Bad state.
        loss_bad: f64,
        /// Loss probability in the Good state.
        loss_good: f64,
    },
}

impl LossModel {
    /// The long-run fraction of packets this model drops.
    pub fn mean_loss(&self) -> f64 {
        match *self {
            LossModel::None => 0.0,
            LossModel::Bernoulli { p } => p,
            LossModel::Gilbert {
                p,
                r,
                loss_bad,
                loss_good,
            } => {
                if p + r == 0.0 {
                    loss_good
                } else {
                    let bad = p / (p + r);
                    bad * loss_bad + (1.0 - bad) * loss_good
                }
            }
        }
    }
}

/// The bottleneck queue's limit, in packets or bytes; arrivals beyond it are tail-dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueLimit {
    /// At most this many packets waiting or in service.
    Packets(u32),
    /// At most this many bytes waiting or in service.
    Bytes(u64),
}

impl Default for QueueLimit {
    fn default() -> Self {
        QueueLimit::Packets(1000)
    }
}

/// The impairments of one direction of the link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DirConfig {
    /// Constant one-way delay.
    pub delay: Duration,
    /// Jitter amplitude (uniform half-width or normal standard deviation).
    pub jitter: Duration,
    /// Jitter distribution.
    pub jitter_dist: JitterDist,
    /// Loss.
    pub loss: LossModel,
    /// Probability that a packet is held back behind later ones.
    pub reorder: f64,
    /// How long a reordered packet is held beyond its normal release time.
    pub reorder_gap: Duration,
    /// Probability that one random bit of a packet is flipped.
    pub corrupt: f64,
    /// Probability that a packet is delivered twice.
    pub duplicate: f64,
    /// Serialisation rate in bits per second of IP packet bytes; 0 means unlimited.
    pub rate_bps: u64,
    /// Bottleneck queue limit (only meaningful with a rate).
    pub queue: QueueLimit,
    /// Scheduled link cuts (issue 8): windows during which this direction carries nothing,
    /// counted from the moment the schedule took effect (`crate::cut`).
    pub cuts: Vec<CutWindow>,
}

/// One scheduled cut: `len` of outage starting `start` after the schedule took effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CutWindow {
    /// Offset of the cut from the moment the schedule took effect.
    pub start: Duration,
    /// How long the link stays cut.
    pub len: Duration,
}

/// Most windows a cut schedule may hold.
pub const MAX_CUTS: usize = 64;

/// Checks a cut schedule: at most [`MAX_CUTS`] windows, each longer than zero and within a
/// day, in order and not overlapping.
pub fn validate_cuts(what: &'static str, cuts: &[CutWindow]) -> Result<(), ConfigError> {
    if cuts.len() > MAX_CUTS {
        return Err(ConfigError::Range {
            what,
            why: format!("{} cut windows; at most {MAX_CUTS}", cuts.len()),
        });
    }
    let day = Duration::from_secs(86_400);
    let mut prev_end = None;
    for w in cuts {
        if w.len.is_zero() {
            return Err(ConfigError::Range {
                what,
                why: "a cut must last longer than zero".into(),
            });
        }
        if w.start > day || w.len > day {
            return Err(ConfigError::Range {
                what,
                why: "cut offsets and lengths must be within a day".into(),
            });
        }
        if prev_end.is_some_and(|e| w.start < e) {
            return Err(ConfigError::Range {
                what,
                why: format!(
                    "cut at {:?} starts before the previous one ends; give windows in order, \
                     not overlapping",
                    w.start
                ),
            });
        }
        prev_end = Some(w.start + w.len);
    }
    Ok(())
}

impl Default for DirConfig {
    fn default() -> Self {
        Self {
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            jitter_dist: JitterDist::Uniform,
            loss: LossModel::None,
            reorder: 0.0,
            reorder_gap: Duration::from_millis(1),
            corrupt: 0.0,
            duplicate: 0.0,
            rate_bps: 0,
            queue: QueueLimit::default(),
            cuts: Vec::new(),
        }
    }
}

impl DirConfig {
    /// Checks every probability is in `[0, 1]` and durations are sane.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let probs: [(&'static str, f64); 3] = [
            ("reorder", self.reorder),
            ("corrupt", self.corrupt),
            ("duplicate", self.duplicate),
        ];
        for (what, p) in probs {
            check_prob(what, p)?;
        }
        match self.loss {
            LossModel::None => {}
            LossModel::Bernoulli { p } => check_prob("loss", p)?,
            LossModel::Gilbert {
                p,
                r,
                loss_bad,
                loss_good,
            } => {
                check_prob("loss-model gilbert P", p)?;
                check_prob("loss-model gilbert R", r)?;
                check_prob("loss-model gilbert bad-state loss", loss_bad)?;
                check_prob("loss-model gilbert good-state loss", loss_good)?;
            }
        }
        let max = Duration::from_secs(10);
        for (what, d) in [
            ("delay", self.delay),
            ("jitter", self.jitter),
            ("reorder-gap", self.reorder_gap),
        ] {
            if d > max {
                return Err(ConfigError::Range {
                    what,
                    why: format!("{d:?} is more than the 10 s the emulator supports"),
                });
            }
        }
        validate_cuts("cut", &self.cuts)?;
        match self.queue {
            QueueLimit::Packets(0) | QueueLimit::Bytes(0) => Err(ConfigError::Range {
                what: "queue",
                why: "a queue limit of zero would drop every packet".into(),
            }),
            _ => Ok(()),
        }
    }
}

fn check_prob(what: &'static str, p: f64) -> Result<(), ConfigError> {
    if (0.0..=1.0).contains(&p) {
        Ok(())
    } else {
        Err(ConfigError::Range {
            what,
            why: format!("probability {p} is outside [0, 1]"),
        })
    }
}

fn yes() -> bool {
    true
}

/// Which packet engine carries the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// netem when the kernel has it, the built-in engine otherwise.
    #[default]
    Auto,
    /// The built-in TUN forwarder.
    Builtin,
    /// `tc netem` on a veth pair.
    Netem,
}

/// A whole link: two namespaces, one emulated path with an impairment set per direction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkConfig {
    /// Namespaces are `<name>-ini` and `<name>-tgt`.
    pub name: String,
    /// Third octet of the /24 inside 10.231.0.0/16: ini is `.1`, tgt is `.2`.
    pub subnet: u8,
    /// MTU of both interfaces.
    pub mtu: u32,
    /// Seed of every random choice; the up and down directions derive their own streams.
    pub seed: u64,
    /// Packet engine.
    pub engine: Engine,
    /// Low-latency mode of the built-in engine: forwarder threads in the `SCHED_FIFO`
    /// real-time class (they sleep between deadlines, spin at most 250 µs before one, and
    /// leave the RT class when busy, so the kernel's RT throttling never stalls them), and a
    /// PM QoS request for zero CPU wake-up latency while the link is up. Both keep the host's
    /// scheduling and idle wake-ups out of the emulated delay.
    #[serde(default = "yes")]
    pub realtime: bool,
    /// Make the set delay the one-way delay the hosts see, end to end, by subtracting what
    /// the emulated path itself adds (TUN hops, the forwarder's and the receiver's wake-ups;
    /// 0.05–0.2 ms per direction on a busy VM), measured when the link comes up. Off, the
    /// hosts see the set delay plus that. Built-in engine only.
    #[serde(default = "yes")]
    pub compensate_path: bool,
    /// Initiator → target.
    pub up: DirConfig,
    /// Target → initiator.
    pub down: DirConfig,
}

impl LinkConfig {
    /// A link with no impairment, default addresses and MTU 1500.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            subnet: 0,
            mtu: 1500,
            seed: 1,
            engine: Engine::Auto,
            realtime: true,
            compensate_path: true,
            up: DirConfig::default(),
            down: DirConfig::default(),
        }
    }

    /// Sets both directions to the same impairments.
    pub fn symmetric(mut self, dir: DirConfig) -> Self {
        self.up = dir.clone();
        self.down = dir;
        self
    }

    /// The initiator side's address.
    pub fn ini_addr(&self) -> std::net::Ipv4Addr {
        std::net::Ipv4Addr::new(10, 231, self.subnet, 1)
    }

    /// The target side's address.
    pub fn tgt_addr(&self) -> std::net::Ipv4Addr {
        std::net::Ipv4Addr::new(10, 231, self.subnet, 2)
    }

    /// The configuration as one line of JSON (the daemon's command line carries it).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses [`LinkConfig::to_json`]'s output and validates it.
    pub fn from_json(s: &str) -> Result<Self, ConfigError> {
        let c: LinkConfig = serde_json::from_str(s).map_err(|e| ConfigError::Range {
            what: "config-json",
            why: e.to_string(),
        })?;
        c.validate()?;
        Ok(c)
    }

    /// Checks the name, MTU and both directions.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate_name(&self.name)?;
        if !(576..=65000).contains(&self.mtu) {
            return Err(ConfigError::Range {
                what: "mtu",
                why: format!("{} is outside 576..=65000", self.mtu),
            });
        }
        self.up.validate()?;
        self.down.validate()
    }
}

/// Link names become namespace and file names: a short run of `[A-Za-z0-9_.-]`.
pub fn validate_name(name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 40
        && !name.starts_with(['-', '.'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(parse_err(
            "name",
            name,
            "expected 1-40 characters of [A-Za-z0-9_.-], not starting with '-' or '.'",
        ))
    }
}

/// Splits `12.5ms` into `(12.5, "ms")`.
fn split_number(s: &str) -> Option<(f64, &str)> {
    let s = s.trim();
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(end);
    let v: f64 = num.parse().ok()?;
    v.is_finite().then_some((v, unit.trim()))
}

/// `8ms`, `0.5ms`, `250us`, `1s`, `100ns`, `0` ([`ipsan_units::parse_duration`]), at most an
/// hour.
pub fn parse_duration(what: &'static str, s: &str) -> Result<Duration, ConfigError> {
    let d = ipsan_units::parse_duration(s).map_err(|e| {
        let why = match e {
            ipsan_units::ParseError::MissingUnit(_)
            | ipsan_units::ParseError::UnknownUnit { .. } => "unit must be s, ms, us or ns",
            _ => "expected e.g. 8ms",
        };
        parse_err(what, s, why)
    })?;
    if d > Duration::from_secs(3600) {
        return Err(parse_err(what, s, "more than an hour"));
    }
    Ok(d)
}

/// `0.1%` or a fraction `0.001`.
pub fn parse_prob(what: &'static str, s: &str) -> Result<f64, ConfigError> {
    let (v, unit) =
        split_number(s).ok_or_else(|| parse_err(what, s, "expected a percentage like 0.1%"))?;
    let p = match unit {
        "%" => v / 100.0,
        "" => v,
        _ => return Err(parse_err(what, s, "expected a percentage like 0.1%")),
    };
    check_prob(what, p)?;
    Ok(p)
}

/// `100mbit`, `1gbit`, `64kbit`, `12.5mbps` (bytes per second), `0`/`none` for unlimited.
pub fn parse_rate(what: &'static str, s: &str) -> Result<u64, ConfigError> {
    if matches!(s.trim(), "none" | "unlimited") {
        return Ok(0);
    }
    let (v, unit) = split_number(s).ok_or_else(|| parse_err(what, s, "expected e.g. 100mbit"))?;
    let bits = match unit.to_ascii_lowercase().as_str() {
        "bit" => 1.0,
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        "bps" => 8.0,
        "kbps" => 8e3,
        "mbps" => 8e6,
        "gbps" => 8e9,
        "" if v == 0.0 => 0.0,
        _ => {
            return Err(parse_err(
                what,
                s,
                "unit must be bit, kbit, mbit, gbit or *bps",
            ))
        }
    };
    let r = v * bits;
    if r > 1e12 {
        return Err(parse_err(what, s, "more than 1 Tbit/s"));
    }
    Ok(r.round() as u64)
}

/// `1000` or `1000p` (packets), `64kb`/`1mb`/`150000b` (bytes; k = 1024 as in tc).
pub fn parse_queue(what: &'static str, s: &str) -> Result<QueueLimit, ConfigError> {
    let (v, unit) = split_number(s).ok_or_else(|| parse_err(what, s, "expected e.g. 1000"))?;
    if v.fract() != 0.0 {
        return Err(parse_err(what, s, "expected a whole number"));
    }
    let q = match unit.to_ascii_lowercase().as_str() {
        "" | "p" => QueueLimit::Packets(
            u32::try_from(v as u64).map_err(|_| parse_err(what, s, "too many packets"))?,
        ),
        "b" => QueueLimit::Bytes(v as u64),
        "kb" => QueueLimit::Bytes(v as u64 * 1024),
        "mb" => QueueLimit::Bytes(v as u64 * 1024 * 1024),
        _ => return Err(parse_err(what, s, "unit must be p, b, kb or mb")),
    };
    if matches!(q, QueueLimit::Packets(0) | QueueLimit::Bytes(0)) {
        return Err(parse_err(what, s, "must be at least 1"));
    }
    Ok(q)
}

/// `bernoulli` (use `--loss` as the probability) or `gilbert:P,R[,BAD[,GOOD]]`.
/// Returns `None` for `bernoulli` so the caller combines it with `--loss`.
pub fn parse_loss_model(s: &str) -> Result<Option<LossModel>, ConfigError> {
    let s = s.trim();
    if s == "bernoulli" {
        return Ok(None);
    }
    let Some(args) = s.strip_prefix("gilbert:") else {
        return Err(parse_err(
            "loss-model",
            s,
            "expected bernoulli or gilbert:P,R[,BAD_LOSS[,GOOD_LOSS]]",
        ));
    };
    let parts: Vec<&str> = args.split(',').collect();
    if !(2..=4).contains(&parts.len()) {
        return Err(parse_err(
            "loss-model",
            s,
            "gilbert takes 2 to 4 comma-separated probabilities",
        ));
    }
    let get = |i: usize, default: f64| -> Result<f64, ConfigError> {
        parts
            .get(i)
            .map_or(Ok(default), |p| parse_prob("loss-model", p))
    };
    Ok(Some(LossModel::Gilbert {
        p: get(0, 0.0)?,
        r: get(1, 1.0)?,
        loss_bad: get(2, 1.0)?,
        loss_good: get(3, 0.0)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_tc_style_spellings() {
        assert_eq!(
            parse_duration("d", "8ms").unwrap(),
            Duration::from_millis(8)
        );
        assert_eq!(
            parse_duration("d", "0.5ms").unwrap(),
            Duration::from_micros(500)
        );
        assert_eq!(parse_duration("d", "0").unwrap(), Duration::ZERO);
        assert_eq!(parse_prob("p", "0.1%").unwrap(), 0.001);
        assert_eq!(parse_prob("p", "0.25").unwrap(), 0.25);
        assert_eq!(parse_rate("r", "100mbit").unwrap(), 100_000_000);
        assert_eq!(parse_rate("r", "1gbit").unwrap(), 1_000_000_000);
        assert_eq!(parse_rate("r", "1mbps").unwrap(), 8_000_000);
        assert_eq!(parse_queue("q", "1000").unwrap(), QueueLimit::Packets(1000));
        assert_eq!(parse_queue("q", "64kb").unwrap(), QueueLimit::Bytes(65536));
        assert_eq!(
            parse_loss_model("gilbert:1%,30%").unwrap(),
            Some(LossModel::Gilbert {
                p: 0.01,
                r: 0.3,
                loss_bad: 1.0,
                loss_good: 0.0
            })
        );
        assert_eq!(parse_loss_model("bernoulli").unwrap(), None);
    }

    #[test]
    fn rejects_bad_spellings_with_the_setting_named() {
        for (f, s) in [
            (parse_duration("delay", "8").map(|_| ()), "delay"),
            (parse_duration("delay", "8 parsecs").map(|_| ()), "delay"),
            (parse_duration("delay", "-1ms").map(|_| ()), "delay"),
            (parse_prob("loss", "101%").map(|_| ()), "loss"),
            (parse_prob("loss", "NaN").map(|_| ()), "loss"),
            (parse_rate("rate", "fast").map(|_| ()), "rate"),
            (parse_queue("queue", "0").map(|_| ()), "queue"),
            (parse_queue("queue", "1.5").map(|_| ()), "queue"),
            (parse_loss_model("gilbert:1%").map(|_| ()), "loss-model"),
            (parse_loss_model("bursty").map(|_| ()), "loss-model"),
        ] {
            let e = f.unwrap_err();
            assert!(e.to_string().starts_with(s), "{e}");
        }
    }

    #[test]
    fn rejects_unsafe_link_names() {
        for bad in ["", "-x", "../etc", "a b", "a/b", &"x".repeat(41)] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        assert!(validate_name("lab-1_x.y").is_ok());
    }

    #[test]
    fn gilbert_mean_loss_is_p_over_p_plus_r() {
        let m = LossModel::Gilbert {
            p: 0.01,
            r: 0.29,
            loss_bad: 1.0,
            loss_good: 0.0,
        };
        assert!((m.mean_loss() - 0.01 / 0.3).abs() < 1e-12);
    }

    #[test]
    fn config_round_trips_through_json() {
        let mut c = LinkConfig::new("lab");
        c.up.delay = Duration::from_millis(8);
        c.up.loss = LossModel::Bernoulli { p: 0.01 };
        c.down.queue = QueueLimit::Bytes(1 << 20);
        let j = serde_json::to_string(&c).unwrap();
        let back: LinkConfig = serde_json::from_str(&j).unwrap();
        assert_eq!(c, back);
    }
}
