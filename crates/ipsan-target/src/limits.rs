//! Login limits: CHAP failure backoff, sessions per initiator, connections per source address
//! (issue 8, security). Pure bookkeeping: time is passed in, nothing here sleeps or does I/O,
//! so the policy is unit-tested on a virtual clock (like quinn-proto).
//!
//! # Authentication failures: who is counted, who is locked out
//!
//! An authentication failure (login reject 0x0201, RFC 7143 §11.13.5) is counted under three
//! keys, each with its own expiring, size-capped table:
//!
//! | key | effect |
//! |---|---|
//! | source address (IPv4 /32, IPv6 /64) | after `address_free_failures`, the address is locked out for every name, with exponential backoff |
//! | (initiator name, source address) | after `name_free_failures`, that name is locked out *from that address*, exponential backoff |
//! | initiator name, any address | never locks anyone out; only lengthens the delay of the next failing response and is logged |
//!
//! The trade-off: a lockout per name alone (the classic account lockout) lets anyone who can
//! reach the portal keep a legitimate initiator out for ever by failing on its behalf from
//! another address — the name is not secret, it travels in clear in every login. So names are
//! locked out only per address, and an attacker spread over many addresses is slowed per
//! address: every address gets the free failures and then doubling lockouts, so guesses cost
//! time per address. Against a random CHAP secret (RFC 7143 asks implementations to support
//! random secrets of up to 128 bits) that leaves online guessing no chance; ipsan accepts any
//! non-empty secret, so a guessable one remains the operator's risk. The per-name count across
//! addresses shows such a spread in the warn log (`failures_for_name`) and delays each failing
//! response (up to `delay_max`), so a sequential guesser gains nothing from new addresses.
//!
//! A login rejected *because of* a lockout does not count as a failure and is not answered by
//! CHAP at all; it gets 0x0301 (Service Unavailable — class 3, "the initiator may retry the
//! same Login Request later", RFC 7143 §11.13.5), which is what happens when the lockout ends.
//! A lockout is never extended by the rejected attempts, so an initiator that keeps retrying
//! with the right secret gets in as soon as it expires. A successful login clears the
//! (name, address) entry; the address entry expires by itself (`forget_after` without a
//! failure), so an attacker cannot wash its address by logging in once with a weak account.
//!
//! Memory: every table holds at most `max_tracked` keys. When full, expired entries go first,
//! then the entry whose last failure is oldest (least recently failing). Entries are also
//! forgotten `forget_after` after their last failure once any lockout has passed.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Settings of the CHAP failure backoff (`[server.auth_backoff]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthBackoff {
    /// Failures of one name from one address before it is locked out there.
    pub name_free_failures: u32,
    /// Failures from one address (any name) before the address is locked out.
    pub address_free_failures: u32,
    /// First lockout; each further failure doubles it.
    pub lockout_base: Duration,
    /// Longest lockout.
    pub lockout_max: Duration,
    /// Delay of the first failing response; doubles per failure of the name (any address).
    pub delay_base: Duration,
    /// Longest delay of a failing response.
    pub delay_max: Duration,
    /// A key with no failure for this long (and no lockout running) is forgotten.
    pub forget_after: Duration,
    /// Keys tracked per table at most.
    pub max_tracked: usize,
}

impl Default for AuthBackoff {
    fn default() -> Self {
        Self {
            name_free_failures: 3,
            address_free_failures: 10,
            lockout_base: Duration::from_secs(1),
            lockout_max: Duration::from_secs(300),
            delay_base: Duration::from_millis(100),
            delay_max: Duration::from_secs(2),
            forget_after: Duration::from_secs(900),
            max_tracked: 4096,
        }
    }
}

/// All login limits (`[server]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Sessions one initiator name may hold at once (reinstatement replaces, not adds).
    pub max_sessions_per_initiator: usize,
    /// Open connections from one source address (IPv4 /32, IPv6 /64), logged in or not.
    pub max_connections_per_address: usize,
    /// A connection that has not sent a complete first Login Request within this is closed.
    pub first_pdu_timeout: Duration,
    pub auth: AuthBackoff,
    /// Test-only: lowers every Seal session's counter limit (both directions) so a test
    /// reaches the re-key mark and the hard limit in a few commands. Not in the TOML file.
    #[doc(hidden)]
    pub seal_counter_limit: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_sessions_per_initiator: 64,
            max_connections_per_address: 64,
            first_pdu_timeout: Duration::from_secs(5),
            auth: AuthBackoff::default(),
            seal_counter_limit: None,
        }
    }
}

/// Counters of what the limits refused (`ServerHandle::limit_stats`).
#[derive(Debug, Default)]
pub struct LimitStats {
    /// Authentication failures recorded (0x0201 answers).
    pub auth_failures: AtomicU64,
    /// Logins refused with 0x0301 because a lockout was running.
    pub lockout_rejects: AtomicU64,
    /// Logins refused with 0x0302 by `max_sessions_per_initiator`.
    pub session_limit_rejects: AtomicU64,
    /// Connections closed at accept by `max_connections_per_address`.
    pub address_limit_refusals: AtomicU64,
    /// Connections closed by `first_pdu_timeout`.
    pub first_pdu_timeouts: AtomicU64,
    /// Sealed connections dropped because a PDU failed record protection (docs/seal.md §4a).
    pub forged_pdus: AtomicU64,
    /// Logins refused (0x0201) because they would have replaced a session authenticated
    /// more strongly (registry.rs, `Registry::admit`).
    pub outranked_rejects: AtomicU64,
}

impl LimitStats {
    /// A plain copy of the counters.
    #[must_use]
    pub fn snapshot(&self) -> LimitCounts {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LimitCounts {
            auth_failures: g(&self.auth_failures),
            lockout_rejects: g(&self.lockout_rejects),
            session_limit_rejects: g(&self.session_limit_rejects),
            address_limit_refusals: g(&self.address_limit_refusals),
            first_pdu_timeouts: g(&self.first_pdu_timeouts),
            forged_pdus: g(&self.forged_pdus),
            outranked_rejects: g(&self.outranked_rejects),
        }
    }

    /// Adds one; returns the new count.
    pub(crate) fn bump(a: &AtomicU64) -> u64 {
        a.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// See [`LimitStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LimitCounts {
    pub auth_failures: u64,
    pub lockout_rejects: u64,
    pub session_limit_rejects: u64,
    pub address_limit_refusals: u64,
    pub first_pdu_timeouts: u64,
    pub forged_pdus: u64,
    pub outranked_rejects: u64,
}

/// The key a source address is counted under: the address for IPv4, the /64 for IPv6 (one
/// host usually owns a whole /64, so per-address keys there would be free to multiply).
#[must_use]
pub fn address_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    failures: u32,
    last_failure: Instant,
    locked_until: Option<Instant>,
}

impl Entry {
    fn expired(&self, now: Instant, forget_after: Duration) -> bool {
        let lock_over = self.locked_until.is_none_or(|u| u <= now);
        lock_over && now.saturating_duration_since(self.last_failure) >= forget_after
    }
}

/// A table of failure counters with a size cap.
#[derive(Debug)]
struct Table<K> {
    map: HashMap<K, Entry>,
}

impl<K: Eq + Hash + Clone> Table<K> {
    fn new() -> Self {
        Self {
            map: HashMap::new(),
        }
    }

    fn locked(&mut self, k: &K, now: Instant, forget_after: Duration) -> Option<Duration> {
        let e = self.map.get(k)?;
        if e.expired(now, forget_after) {
            self.map.remove(k);
            return None;
        }
        e.locked_until
            .and_then(|u| u.checked_duration_since(now))
            .filter(|d| !d.is_zero())
    }

    /// Counts one failure; returns the failures counted so far (the entry's count).
    fn fail(&mut self, k: &K, now: Instant, cfg: &AuthBackoff) -> &mut Entry {
        if let Some(e) = self.map.get(k) {
            if e.expired(now, cfg.forget_after) {
                self.map.remove(k);
            }
        }
        if !self.map.contains_key(k) && self.map.len() >= cfg.max_tracked {
            self.map.retain(|_, e| !e.expired(now, cfg.forget_after));
            if self.map.len() >= cfg.max_tracked {
                // Least recently failing goes.
                if let Some(oldest) = self
                    .map
                    .iter()
                    .min_by_key(|(_, e)| e.last_failure)
                    .map(|(k, _)| k.clone())
                {
                    self.map.remove(&oldest);
                }
            }
        }
        let e = self.map.entry(k.clone()).or_insert(Entry {
            failures: 0,
            last_failure: now,
            locked_until: None,
        });
        e.failures = e.failures.saturating_add(1);
        e.last_failure = now;
        e
    }

    fn len(&self) -> usize {
        self.map.len()
    }
}

/// `base · 2^(n)`, capped at `max`.
fn doubling(base: Duration, n: u32, max: Duration) -> Duration {
    base.checked_mul(1u32 << n.min(30)).unwrap_or(max).min(max)
}

/// What one recorded failure means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailureVerdict {
    /// Failures of this name from this address.
    pub failures_name_here: u32,
    /// Failures from this address, any name.
    pub failures_address: u32,
    /// Failures of this name from any address.
    pub failures_name: u32,
    /// The lockout this failure started, if any (the longer of name-here and address).
    pub lockout: Option<Duration>,
    /// How long to hold back the failing response.
    pub delay: Duration,
}

/// Why a login is refused before authentication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lockout {
    /// The source address is locked out, for every name.
    Address(Duration),
    /// This name is locked out from this address.
    NameHere(Duration),
}

impl Lockout {
    /// Time left.
    #[must_use]
    pub fn remaining(self) -> Duration {
        match self {
            Self::Address(d) | Self::NameHere(d) => d,
        }
    }
}

/// The CHAP failure bookkeeping (module docs). One per target process.
#[derive(Debug)]
pub struct AuthLimiter {
    cfg: AuthBackoff,
    by_address: Table<IpAddr>,
    by_name_here: Table<(String, IpAddr)>,
    by_name: Table<String>,
}

impl AuthLimiter {
    #[must_use]
    pub fn new(cfg: AuthBackoff) -> Self {
        Self {
            cfg,
            by_address: Table::new(),
            by_name_here: Table::new(),
            by_name: Table::new(),
        }
    }

    /// Whether a login from `addr` naming `name` must be refused now, without running CHAP.
    pub fn check(&mut self, name: &str, addr: IpAddr, now: Instant) -> Option<Lockout> {
        let addr = address_key(addr);
        let forget = self.cfg.forget_after;
        if let Some(d) = self.by_address.locked(&addr, now, forget) {
            return Some(Lockout::Address(d));
        }
        self.by_name_here
            .locked(&(name.to_owned(), addr), now, forget)
            .map(Lockout::NameHere)
    }

    /// Records an authentication failure of `name` from `addr`.
    pub fn failure(&mut self, name: &str, addr: IpAddr, now: Instant) -> FailureVerdict {
        let addr = address_key(addr);
        let cfg = self.cfg.clone();
        let lock = |e: &mut Entry, free: u32| -> Option<Duration> {
            let over = e.failures.checked_sub(free).filter(|n| *n > 0)?;
            let d = doubling(cfg.lockout_base, over - 1, cfg.lockout_max);
            e.locked_until = Some(now + d);
            Some(d)
        };
        let e = self.by_address.fail(&addr, now, &cfg);
        let failures_address = e.failures;
        let lock_address = lock(e, cfg.address_free_failures);
        let e = self.by_name_here.fail(&(name.to_owned(), addr), now, &cfg);
        let failures_name_here = e.failures;
        let lock_name = lock(e, cfg.name_free_failures);
        let failures_name = self.by_name.fail(&name.to_owned(), now, &cfg).failures;
        let delay = if cfg.delay_base.is_zero() {
            Duration::ZERO
        } else {
            doubling(cfg.delay_base, failures_name - 1, cfg.delay_max)
        };
        FailureVerdict {
            failures_name_here,
            failures_address,
            failures_name,
            lockout: lock_address.max(lock_name),
            delay,
        }
    }

    /// A successful login of `name` from `addr`: that pair starts afresh.
    pub fn success(&mut self, name: &str, addr: IpAddr) {
        let addr = address_key(addr);
        self.by_name_here.map.remove(&(name.to_owned(), addr));
    }

    /// Keys tracked (address, name-here, name): bounded by `max_tracked` each.
    #[must_use]
    pub fn tracked(&self) -> (usize, usize, usize) {
        (
            self.by_address.len(),
            self.by_name_here.len(),
            self.by_name.len(),
        )
    }
}

/// Open connections per source address, for `max_connections_per_address`. Entries exist
/// only while connections are open, so the map is bounded by `max_connections`.
#[derive(Debug, Default)]
pub struct AddressConnections {
    open: HashMap<IpAddr, usize>,
}

impl AddressConnections {
    /// Takes a slot for `ip` if fewer than `max` are open.
    pub fn try_open(&mut self, ip: IpAddr, max: usize) -> bool {
        let n = self.open.entry(address_key(ip)).or_insert(0);
        if *n >= max {
            return false;
        }
        *n += 1;
        true
    }

    /// Gives a slot back.
    pub fn close(&mut self, ip: IpAddr) {
        let k = address_key(ip);
        if let Some(n) = self.open.get_mut(&k) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.open.remove(&k);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> AuthBackoff {
        AuthBackoff {
            name_free_failures: 2,
            address_free_failures: 5,
            lockout_base: Duration::from_secs(1),
            lockout_max: Duration::from_secs(8),
            delay_base: Duration::from_millis(100),
            delay_max: Duration::from_millis(400),
            forget_after: Duration::from_secs(60),
            max_tracked: 8,
        }
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[test]
    fn locks_a_name_out_from_one_address_with_doubling_backoff() {
        let mut l = AuthLimiter::new(cfg());
        let t = Instant::now();
        assert_eq!(l.failure("n", A, t).lockout, None);
        assert_eq!(l.failure("n", A, t).lockout, None);
        assert_eq!(l.check("n", A, t), None, "free failures do not lock");
        let v = l.failure("n", A, t);
        assert_eq!(v.lockout, Some(Duration::from_secs(1)));
        assert_eq!(
            l.check("n", A, t),
            Some(Lockout::NameHere(Duration::from_secs(1)))
        );
        // Expires; the next failure doubles.
        let t1 = t + Duration::from_secs(1);
        assert_eq!(l.check("n", A, t1), None);
        assert_eq!(l.failure("n", A, t1).lockout, Some(Duration::from_secs(2)));
        let t2 = t1 + Duration::from_secs(2);
        assert_eq!(l.failure("n", A, t2).lockout, Some(Duration::from_secs(4)));
        let t3 = t2 + Duration::from_secs(4);
        assert_eq!(l.failure("n", A, t3).lockout, Some(Duration::from_secs(8)));
        let t4 = t3 + Duration::from_secs(8);
        // Capped at lockout_max.
        let v = l.failure("n", A, t4);
        assert_eq!(v.lockout, Some(Duration::from_secs(8)));
        assert_eq!(v.failures_name_here, 7);
    }

    #[test]
    fn failing_from_another_address_never_locks_the_legitimate_one_out() {
        let mut l = AuthLimiter::new(cfg());
        let t = Instant::now();
        for i in 0..100 {
            l.failure("victim", A, t + Duration::from_millis(i));
        }
        assert!(
            l.check("victim", A, t).is_some(),
            "attacker's address locked"
        );
        assert_eq!(l.check("victim", B, t), None, "victim's address is not");
        // The delay of failing responses grows with the name's failures, capped; it is
        // never applied to a successful login.
        assert_eq!(l.failure("victim", B, t).delay, Duration::from_millis(400));
    }

    #[test]
    fn locks_an_address_out_for_every_name_after_its_free_failures() {
        let mut l = AuthLimiter::new(cfg());
        let t = Instant::now();
        for i in 0..5 {
            let v = l.failure(&format!("name{i}"), A, t);
            assert_eq!(v.lockout, None, "failure {i}");
        }
        let v = l.failure("name5", A, t);
        assert_eq!(v.failures_address, 6);
        assert_eq!(v.lockout, Some(Duration::from_secs(1)));
        assert_eq!(
            l.check("never-failed", A, t),
            Some(Lockout::Address(Duration::from_secs(1)))
        );
        assert_eq!(l.check("never-failed", B, t), None);
    }

    #[test]
    fn success_clears_the_pair_and_entries_expire() {
        let mut l = AuthLimiter::new(cfg());
        let t = Instant::now();
        l.failure("n", A, t);
        l.failure("n", A, t);
        l.success("n", A);
        // Two more free failures after the success.
        assert_eq!(l.failure("n", A, t).lockout, None);
        assert_eq!(l.failure("n", A, t).lockout, None);
        // Forgotten after forget_after.
        let later = t + Duration::from_secs(61);
        assert_eq!(l.failure("n", A, later).failures_name_here, 1);
        assert_eq!(l.failure("m", A, later).failures_address, 2);
    }

    #[test]
    fn memory_stays_bounded_under_a_spray_of_names_and_addresses() {
        let mut l = AuthLimiter::new(cfg());
        let t = Instant::now();
        for i in 0..10_000u32 {
            let ip = IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            l.failure(
                &format!("n{i}"),
                ip,
                t + Duration::from_millis(u64::from(i)),
            );
        }
        let (a, nh, n) = l.tracked();
        assert!(a <= 8 && nh <= 8 && n <= 8, "{a} {nh} {n}");
    }

    #[test]
    fn ipv6_is_counted_per_64() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(address_key(a), address_key(b));
        assert_ne!(address_key(a), address_key(c));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(address_key(mapped), A);
    }

    #[test]
    fn address_connections_cap_and_release() {
        let mut c = AddressConnections::default();
        assert!(c.try_open(A, 2));
        assert!(c.try_open(A, 2));
        assert!(!c.try_open(A, 2));
        assert!(c.try_open(B, 2));
        c.close(A);
        assert!(c.try_open(A, 2));
        c.close(A);
        c.close(A);
        c.close(B);
        assert!(c.open.is_empty());
    }
}
