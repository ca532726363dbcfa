//! The Diffie-Hellman groups of DH-HMAC-CHAP (TP 8006 DH group identifiers: 00h NULL, 01h
//! ffdhe2048 … 05h ffdhe8192, the RFC 7919 groups, generator 2).
//!
//! Modular exponentiation is `crypto-bigint`'s Montgomery ladder over fixed-size integers
//! (RustCrypto, maintained, `no_std`, constant time in the exponent's value): the private
//! exponent is a secret, so a variable-time bignum (`num-bigint`'s `modpow`) would leak it
//! through timing; `crypto-bigint` only leaks the exponent's bound, which is public. Private
//! exponents are as long as OpenSSL makes them for these named groups (225, 275, 325, 375 and
//! 400 bits, twice each group's estimated strength), fresh for every transaction, zeroized on
//! drop. Public values travel as big-endian integers of the prime's length; the peer's value
//! must be in 2..=p-2 (1 and p-1 would force the shared secret into {1, p-1}).

use crypto_bigint::modular::runtime_mod::{DynResidue, DynResidueParams};
use crypto_bigint::Uint;
use rand::RngCore;
use zeroize::{Zeroize, Zeroizing};

use super::ffdhe;

/// A DH group identifier (TP 8006 DH group ID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum DhGroup {
    /// 00h: no DH exchange (plain HMAC-CHAP).
    Null = 0x00,
    /// 01h.
    Ffdhe2048 = 0x01,
    /// 02h.
    Ffdhe3072 = 0x02,
    /// 03h.
    Ffdhe4096 = 0x03,
    /// 04h.
    Ffdhe6144 = 0x04,
    /// 05h.
    Ffdhe8192 = 0x05,
}

impl DhGroup {
    /// Every group, in identifier order.
    pub const ALL: [DhGroup; 6] = [
        DhGroup::Null,
        DhGroup::Ffdhe2048,
        DhGroup::Ffdhe3072,
        DhGroup::Ffdhe4096,
        DhGroup::Ffdhe6144,
        DhGroup::Ffdhe8192,
    ];

    /// The group with identifier `id`; `None` for a reserved one.
    #[must_use]
    pub fn from_id(id: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|g| g.id() == id)
    }

    /// The identifier on the wire.
    #[must_use]
    pub fn id(self) -> u8 {
        self as u8
    }

    /// The name Linux and nvme-cli use.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Null => "null",
            Self::Ffdhe2048 => "ffdhe2048",
            Self::Ffdhe3072 => "ffdhe3072",
            Self::Ffdhe4096 => "ffdhe4096",
            Self::Ffdhe6144 => "ffdhe6144",
            Self::Ffdhe8192 => "ffdhe8192",
        }
    }

    /// The length of a public value (DHVLEN) in bytes: the prime's length, 0 for NULL.
    #[must_use]
    pub fn value_len(self) -> usize {
        match self {
            Self::Null => 0,
            Self::Ffdhe2048 => 256,
            Self::Ffdhe3072 => 384,
            Self::Ffdhe4096 => 512,
            Self::Ffdhe6144 => 768,
            Self::Ffdhe8192 => 1024,
        }
    }

    /// Private exponent length in bits.
    fn exponent_bits(self) -> usize {
        match self {
            Self::Null => 0,
            Self::Ffdhe2048 => 225,
            Self::Ffdhe3072 => 275,
            Self::Ffdhe4096 => 325,
            Self::Ffdhe6144 => 375,
            Self::Ffdhe8192 => 400,
        }
    }
}

/// The peer's public value is not one this side accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BadPublicValue;

/// `base^exp mod p`, or with `check_base` `None` when `base` is outside 2..=p-2.
fn modexp<const L: usize>(
    p: &Uint<L>,
    base: &[u8],
    exp: &[u8],
    exp_bits: usize,
    check_base: bool,
) -> Result<Vec<u8>, BadPublicValue> {
    if base.len() != Uint::<L>::BYTES {
        return Err(BadPublicValue);
    }
    let b = Uint::<L>::from_be_slice(base);
    if check_base && (b <= Uint::ONE || b >= p.wrapping_sub(&Uint::ONE)) {
        return Err(BadPublicValue);
    }
    let mut padded = Zeroizing::new(vec![0u8; Uint::<L>::BYTES]);
    let at = padded.len() - exp.len();
    padded[at..].copy_from_slice(exp);
    let mut e = Uint::<L>::from_be_slice(&padded);
    let params = DynResidueParams::new(p);
    let mut r = DynResidue::new(&b, params)
        .pow_bounded_exp(&e, exp_bits)
        .retrieve();
    e.zeroize();
    let mut out = Vec::with_capacity(Uint::<L>::BYTES);
    for w in r.as_words().iter().rev() {
        out.extend_from_slice(&w.to_be_bytes());
    }
    r.zeroize();
    Ok(out)
}

fn group_modexp(
    group: DhGroup,
    base: &[u8],
    exp: &[u8],
    check_base: bool,
) -> Result<Vec<u8>, BadPublicValue> {
    let bits = group.exponent_bits();
    match group {
        DhGroup::Null => Err(BadPublicValue),
        DhGroup::Ffdhe2048 => modexp(&ffdhe::FFDHE2048, base, exp, bits, check_base),
        DhGroup::Ffdhe3072 => modexp(&ffdhe::FFDHE3072, base, exp, bits, check_base),
        DhGroup::Ffdhe4096 => modexp(&ffdhe::FFDHE4096, base, exp, bits, check_base),
        DhGroup::Ffdhe6144 => modexp(&ffdhe::FFDHE6144, base, exp, bits, check_base),
        DhGroup::Ffdhe8192 => modexp(&ffdhe::FFDHE8192, base, exp, bits, check_base),
    }
}

/// One side's ephemeral DH key of one transaction.
pub(crate) struct DhKey {
    group: DhGroup,
    private: Zeroizing<Vec<u8>>,
    public: Vec<u8>,
}

impl std::fmt::Debug for DhKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DhKey")
            .field("group", &self.group)
            .field("private", &"<redacted>")
            .finish()
    }
}

impl DhKey {
    /// A fresh key pair; `None` for the NULL group.
    pub(crate) fn generate(group: DhGroup, rng: &mut impl RngCore) -> Option<Self> {
        if group == DhGroup::Null {
            return None;
        }
        let bits = group.exponent_bits();
        let mut private = Zeroizing::new(vec![0u8; bits.div_ceil(8)]);
        rng.fill_bytes(&mut private);
        // Exactly `bits` long: clear the bits above, set the top one.
        let excess = private.len() * 8 - bits;
        private[0] &= 0xff >> excess;
        private[0] |= 0x80 >> excess;
        let mut g = vec![0u8; group.value_len()];
        if let Some(last) = g.last_mut() {
            *last = 2;
        }
        let public = group_modexp(group, &g, &private, false).ok()?;
        Some(Self {
            group,
            private,
            public,
        })
    }

    /// The public value `g^x mod p`, DHVLEN bytes.
    pub(crate) fn public(&self) -> &[u8] {
        &self.public
    }

    /// The session key `peer^x mod p` (TP 8006's g^xy mod p), the prime's length, big endian.
    pub(crate) fn shared_secret(&self, peer: &[u8]) -> Result<Zeroizing<Vec<u8>>, BadPublicValue> {
        if peer.len() != self.group.value_len() {
            return Err(BadPublicValue);
        }
        group_modexp(self.group, peer, &self.private, true).map(Zeroizing::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_sides_derive_the_same_secret_in_every_group() {
        let mut rng = rand::rngs::OsRng;
        for group in DhGroup::ALL.into_iter().skip(1) {
            let a = DhKey::generate(group, &mut rng).unwrap();
            let b = DhKey::generate(group, &mut rng).unwrap();
            assert_eq!(a.public().len(), group.value_len());
            assert_ne!(a.public(), b.public());
            let ka = a.shared_secret(b.public()).unwrap();
            let kb = b.shared_secret(a.public()).unwrap();
            assert_eq!(*ka, *kb, "{group:?}");
            assert_eq!(ka.len(), group.value_len());
        }
    }

    #[test]
    fn rejects_public_values_outside_2_to_p_minus_2() {
        let mut rng = rand::rngs::OsRng;
        let key = DhKey::generate(DhGroup::Ffdhe2048, &mut rng).unwrap();
        let p = hex_to_bytes(&format!("{:x}", ffdhe::FFDHE2048));
        let mut p_minus_1 = p.clone();
        *p_minus_1.last_mut().unwrap() -= 1;
        let mut one = vec![0u8; 256];
        one[255] = 1;
        let mut two = vec![0u8; 256];
        two[255] = 2;
        for bad in [vec![0u8; 256], one, p_minus_1, p.clone(), vec![0xff; 256]] {
            assert_eq!(key.shared_secret(&bad).unwrap_err(), BadPublicValue);
        }
        assert_eq!(key.shared_secret(&p[1..]).unwrap_err(), BadPublicValue);
        assert!(key.shared_secret(&two).is_ok());
        let mut p_minus_2 = p;
        *p_minus_2.last_mut().unwrap() -= 2;
        assert!(key.shared_secret(&p_minus_2).is_ok());
    }

    fn hex_to_bytes(h: &str) -> Vec<u8> {
        (0..h.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
            .collect()
    }
}
