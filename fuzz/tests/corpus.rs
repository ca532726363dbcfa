//! Runs every fuzz harness as a plain test on stable Rust: each seed of `corpus/<target>/`, then
//! seeded mutations of the seeds and seeded random inputs. A property violation panics here
//! exactly as it would under libFuzzer. `IPSAN_FUZZ_ITERS` sets the random inputs per target
//! (default 2000).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

/// xorshift64*: deterministic, so a failure reproduces from the printed seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    let mut v: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    assert!(!v.is_empty(), "no seeds for {target}");
    v.sort();
    v
}

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..=rng.below(8) {
        match rng.below(5) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.next() as u8;
            }
            2 if !v.is_empty() => v.truncate(rng.below(v.len())),
            3 => {
                let i = rng.below(v.len() + 1);
                let n = rng.below(16);
                for _ in 0..n {
                    v.insert(i.min(v.len()), rng.next() as u8);
                }
            }
            _ if v.len() > 8 => {
                // Interesting values in a length-like field.
                let i = rng.below(v.len() - 4);
                let x: u32 = [0, 1, 0xff, 0xffff, 0x00ff_ffff, u32::MAX][rng.below(6)];
                v[i..i + 4].copy_from_slice(&x.to_be_bytes());
            }
            _ => {}
        }
    }
    v
}

fn run(target: &str, f: fn(&[u8])) {
    let iters: usize = std::env::var("IPSAN_FUZZ_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let seeds = seeds(target);
    for s in &seeds {
        f(s);
    }
    let mut rng = Rng(fnv(target));
    for i in 0..iters {
        let input = if i % 4 == 3 {
            let n = rng.below(600);
            (0..n).map(|_| rng.next() as u8).collect()
        } else {
            let k = rng.below(seeds.len());
            mutate(&mut rng, &seeds[k])
        };
        let r = std::panic::catch_unwind(|| f(&input));
        if r.is_err() {
            panic!("{target}: iteration {i} failed on input {:02x?}", input);
        }
    }
}

/// FNV-1a of the target name: a fixed, distinct seed per target.
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

#[test]
fn pdu_decode_holds_on_corpus_and_random_inputs() {
    run("pdu_decode", ipsan_fuzz::pdu_decode);
}

#[test]
fn nvme_pdu_holds_on_corpus_and_random_inputs() {
    run("nvme_pdu", ipsan_fuzz::nvme_pdu);
}

#[test]
fn nvme_controller_holds_on_corpus_and_random_inputs() {
    run("nvme_controller", ipsan_fuzz::nvme_controller);
}

#[test]
fn text_negotiate_holds_on_corpus_and_random_inputs() {
    run("text_negotiate", ipsan_fuzz::text_negotiate);
}

#[test]
fn engine_pdu_holds_on_corpus_and_random_inputs() {
    run("engine_pdu", ipsan_fuzz::engine_pdu);
}

#[test]
fn engine_session_holds_on_corpus_and_random_inputs() {
    run("engine_session", ipsan_fuzz::engine_session);
}

#[test]
fn login_sm_never_admits_without_auth() {
    run("login_sm", ipsan_fuzz::login_sm);
}

#[test]
fn initiator_login_holds_on_corpus_and_random_inputs() {
    run("initiator_login", ipsan_fuzz::initiator_login);
}

#[test]
fn cdb_dispatch_holds_on_corpus_and_random_inputs() {
    run("cdb_dispatch", ipsan_fuzz::cdb_dispatch);
}

#[test]
fn seal_open_refuses_forged_mutated_relocated_and_replayed_data() {
    run("seal_open", ipsan_fuzz::seal_open);
}

#[test]
fn seal_login_never_seals_without_the_secret_nor_accepts_an_edited_answer() {
    run("seal_login", ipsan_fuzz::seal_login);
}

#[test]
fn seal_record_accepts_only_the_genuine_pdu_stream() {
    run("seal_record", ipsan_fuzz::seal_record);
}

#[test]
fn wan_model_holds_on_corpus_and_random_inputs() {
    run("wan_model", ipsan_fuzz::wan_model);
}

/// The seeds are real: the open-target login seeds reach full feature phase, so the
/// harness explores past the first PDU.
#[test]
fn login_seed_reaches_full_feature() {
    let s =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/login_sm/open-direct"))
            .unwrap();
    let mut buf = bytes::BytesMut::from(&s[..]);
    let pdu = iscsi_wire::Codec::default()
        .decode(&mut buf)
        .unwrap()
        .unwrap();
    let iscsi_wire::Header::LoginRequest(req) = &pdu.header else {
        panic!()
    };
    let mut login = iscsi_proto::login::TargetLogin::new(Default::default(), None);
    struct Open;
    impl iscsi_proto::login::Directory for Open {
        fn target(
            &self,
            _: &str,
            _: &str,
        ) -> Result<iscsi_proto::login::TargetPolicy, iscsi_proto::login::LoginFailure> {
            Ok(iscsi_proto::login::TargetPolicy {
                auth: iscsi_proto::login::Auth::None,
                portal_group_tag: 1,
                alias: None,
            })
        }
        fn discovery(
            &self,
            i: &str,
        ) -> Result<iscsi_proto::login::TargetPolicy, iscsi_proto::login::LoginFailure> {
            self.target("", i)
        }
        fn assign_tsih(
            &mut self,
            _: [u8; 6],
            _: &str,
            _: u16,
        ) -> Result<u16, iscsi_proto::login::LoginFailure> {
            Ok(1)
        }
    }
    let r = login.handle(req, &pdu.data, &mut Open);
    assert!(
        matches!(r.outcome, iscsi_proto::login::Outcome::FullFeature(_)),
        "{:?}",
        r.outcome
    );
}
