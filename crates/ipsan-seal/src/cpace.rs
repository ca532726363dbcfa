//! CPace, a balanced PAKE (draft-irtf-cfrg-cpace-15, cipher suite CPACE-RISTR255-SHA512, the
//! initiator-responder setting), under Seal's key schedule (docs/seal.md §3).
//!
//! ```text
//! gen_str = lv_cat(DSI, PRS, zero_bytes(len_zpad), CI, sid)      draft §5.1 generator_string
//! g       = element_derivation(SHA-512(gen_str))                 RFC 9496 §4.3.4
//! Ya = ya·g  (initiator)        Yb = yb·g  (target)               draft §6.2
//! K       = ya·Yb = yb·Ya; abort if a share does not decode or K is the identity
//! ISK     = SHA-512(lv_cat(DSI || "_ISK", sid, K) || lv_cat(Ya, ADa) || lv_cat(Yb, ADb))
//! ```
//! `DSI = "CPaceRistretto255"`, `len_zpad = max(0, 128 - 1 - len(prepend_len(PRS)) -
//! len(prepend_len(DSI)))`, `lv_cat` prepends each string's LEB128 length. The password (PRS)
//! enters only through the generator: a party that does not know it cannot relate a share to
//! any candidate password without solving a Diffie-Hellman problem, so a recorded run tests no
//! guess, and an active run tests exactly the one password the attacker used for its share.
//! Checked against the draft's test vectors (`tests` below).

use curve25519_dalek::ristretto::{CompressedRistretto, RistrettoPoint};
use curve25519_dalek::scalar::Scalar;
use curve25519_dalek::traits::IsIdentity;
use sha2::{Digest, Sha512};
use zeroize::{Zeroize, Zeroizing};

/// G_Ristretto255.DSI (draft §7.2).
const DSI: &[u8] = b"CPaceRistretto255";
/// SHA-512's input block size, H.s_in_bytes.
const S_IN_BYTES: usize = 128;
/// Length of an encoded ristretto255 element (a share).
pub const SHARE_LEN: usize = 32;
/// Length of the intermediate session key (SHA-512).
pub const ISK_LEN: usize = 64;

/// The intermediate session key, ISK.
pub type Isk = Zeroizing<[u8; ISK_LEN]>;

/// A share did not decode to a group element, or the shared point is the identity (draft
/// §6.2: "MUST abort").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidShare;

/// LEB128 length prefix (draft A.1 `prepend_len`).
fn prepend_len(out: &mut Vec<u8>, data: &[u8]) {
    let mut n = data.len();
    loop {
        // Seven bits per byte, least significant first; bit 7 while more follow.
        let low = u8::try_from(n & 0x7f).unwrap_or(0);
        n >>= 7;
        if n == 0 {
            out.push(low);
            break;
        }
        out.push(low | 0x80);
    }
    out.extend_from_slice(data);
}

/// `lv_cat(a0, a1, ...)` (draft A.2).
pub fn lv_cat(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(parts.iter().map(|p| p.len() + 3).sum());
    for p in parts {
        prepend_len(&mut out, p);
    }
    out
}

/// `len(prepend_len(data))`.
fn prepended_len(data: &[u8]) -> usize {
    let mut n = data.len();
    let mut bytes = 1;
    while n >= 0x80 {
        n >>= 7;
        bytes += 1;
    }
    bytes + data.len()
}

/// `generator_string(DSI, PRS, CI, sid, s_in_bytes)` (draft A.3).
fn generator_string(prs: &[u8], ci: &[u8], sid: &[u8]) -> Zeroizing<Vec<u8>> {
    let len_zpad = S_IN_BYTES.saturating_sub(1 + prepended_len(prs) + prepended_len(DSI));
    let zpad = vec![0u8; len_zpad];
    Zeroizing::new(lv_cat(&[DSI, prs, &zpad, ci, sid]))
}

/// `G.calculate_generator(H, PRS, CI, sid)` (draft §7.2): the password-derived generator.
fn generator(prs: &[u8], ci: &[u8], sid: &[u8]) -> RistrettoPoint {
    let gen_str = generator_string(prs, ci, sid);
    let mut h = Zeroizing::new([0u8; 64]);
    h.copy_from_slice(&Sha512::digest(gen_str.as_slice()));
    RistrettoPoint::from_uniform_bytes(&h)
}

/// `G.sample_scalar()` (draft §7.2): 32 random bytes, bits above 252 cleared, little endian.
fn scalar_from_random(mut bytes: [u8; 32]) -> Scalar {
    bytes[31] &= 0x0f;
    let s = Scalar::from_bytes_mod_order(bytes);
    bytes.zeroize();
    s
}

/// One party's side of a CPace run: its secret scalar and public share. `Debug` hides the
/// scalar; it is zeroized on drop.
pub struct Party {
    y: Scalar,
    share: [u8; SHARE_LEN],
}

impl std::fmt::Debug for Party {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Party(<redacted>)")
    }
}

impl Drop for Party {
    fn drop(&mut self) {
        self.y.zeroize();
    }
}

impl Party {
    /// Computes the generator from `prs`, `ci`, `sid` and the share `Y = y·g` for the scalar
    /// drawn from `random` (32 fresh random bytes).
    pub fn new(prs: &[u8], ci: &[u8], sid: &[u8], random: [u8; 32]) -> Party {
        let g = generator(prs, ci, sid);
        let y = scalar_from_random(random);
        let share = (y * g).compress().to_bytes();
        Party { y, share }
    }

    /// This party's public share (Ya or Yb).
    pub fn share(&self) -> &[u8; SHARE_LEN] {
        &self.share
    }

    /// `K = G.scalar_mult_vfy(y, other)`, refusing a share that does not decode and an
    /// identity result.
    fn shared_point(&self, other: &[u8]) -> Result<Zeroizing<[u8; 32]>, InvalidShare> {
        let other = CompressedRistretto::from_slice(other).map_err(|_| InvalidShare)?;
        let p = other.decompress().ok_or(InvalidShare)?;
        let k = self.y * p;
        if k.is_identity() {
            return Err(InvalidShare);
        }
        Ok(Zeroizing::new(k.compress().to_bytes()))
    }

    /// The ISK of the initiator-responder setting, with empty ADa/ADb (Seal binds the rest of
    /// the login in its own key schedule). `ya_share`/`yb_share` are the initiator's and the
    /// target's shares; `other` is the peer's share.
    fn isk(&self, sid: &[u8], other: &[u8], initiator: bool) -> Result<Isk, InvalidShare> {
        let k = self.shared_point(other)?;
        let (ya, yb): (&[u8], &[u8]) = if initiator {
            (&self.share, other)
        } else {
            (other, &self.share)
        };
        Ok(isk(sid, &k[..], ya, b"", yb, b""))
    }

    /// The initiator's ISK from the target's share.
    pub fn initiator_isk(&self, sid: &[u8], yb: &[u8]) -> Result<Isk, InvalidShare> {
        self.isk(sid, yb, true)
    }

    /// The target's ISK from the initiator's share.
    pub fn responder_isk(&self, sid: &[u8], ya: &[u8]) -> Result<Isk, InvalidShare> {
        self.isk(sid, ya, false)
    }
}

/// `ISK = H.hash(lv_cat(DSI || "_ISK", sid, K) || transcript_ir(Ya, ADa, Yb, ADb))`.
fn isk(sid: &[u8], k: &[u8], ya: &[u8], ada: &[u8], yb: &[u8], adb: &[u8]) -> Isk {
    let mut dsi_isk = DSI.to_vec();
    dsi_isk.extend_from_slice(b"_ISK");
    let mut h = Sha512::new();
    h.update(Zeroizing::new(lv_cat(&[&dsi_isk, sid, k])).as_slice());
    h.update(lv_cat(&[ya, ada]));
    h.update(lv_cat(&[yb, adb]));
    let mut out = Zeroizing::new([0u8; ISK_LEN]);
    out.copy_from_slice(&h.finalize());
    out
}

#[cfg(test)]
mod tests {
    //! The draft's test vectors for CPACE-RISTR255-SHA512 (draft-irtf-cfrg-cpace-15, B.3) and
    //! string utilities (A.1, A.2).
    use super::*;

    fn h(s: &str) -> Vec<u8> {
        hex::decode(s.split_whitespace().collect::<String>()).unwrap()
    }

    const SID: &str = "7e4b4791d6a8ef019b936c79fb7f2c57";
    const CI: &str = "0b415f696e69746961746f720b425f726573706f6e646572";
    const YA_SCALAR: &str = "da3d23700a9e5699258aef94dc060dfda5ebb61f02a5ea77fad53f4ff0976d08";
    const YB_SCALAR: &str = "d2316b454718c35362d83d69df6320f38578ed5984651435e2949762d900b80d";

    fn party(scalar: &str) -> Party {
        let g = generator(b"Password", &h(CI), &h(SID));
        let y = Scalar::from_bytes_mod_order(h(scalar).try_into().unwrap());
        let share = (y * g).compress().to_bytes();
        Party { y, share }
    }

    #[test]
    fn prepend_len_and_lv_cat_match_the_draft() {
        assert_eq!(lv_cat(&[b""]), h("00"));
        assert_eq!(lv_cat(&[b"1234"]), h("0431323334"));
        let r127: Vec<u8> = (0..127).collect();
        assert_eq!(lv_cat(&[&r127])[0], 0x7f);
        let r128: Vec<u8> = (0..128).collect();
        assert_eq!(&lv_cat(&[&r128])[..3], &h("800100")[..]);
        assert_eq!(prepended_len(&r128), 130);
        assert_eq!(
            lv_cat(&[b"1234", b"5", b"", b"678"]),
            h("043132333401350003363738")
        );
    }

    #[test]
    fn generator_matches_the_draft() {
        let s = generator_string(b"Password", &h(CI), &h(SID));
        assert_eq!(s.len(), 170);
        assert_eq!(
            Sha512::digest(s.as_slice()).to_vec(),
            h("da6d3ddc8802fca9058755ffd3ebde08a9c2c74945901a258482a288
               b6663af06bf645c93cd1c51512307199c80e84908916d983b34af772
               05f90851a657ee27")
        );
        let g = generator(b"Password", &h(CI), &h(SID));
        assert_eq!(
            g.compress().to_bytes().to_vec(),
            h("222b6b195fe84b1652badb6f6a3ae3d24341e7306967f0b8115b40d5698c7e56")
        );
    }

    #[test]
    fn shares_and_isk_match_the_draft() {
        let a = party(YA_SCALAR);
        let b = party(YB_SCALAR);
        assert_eq!(
            a.share().to_vec(),
            h("d6bac480f2c386c394efc7c47adb9925dcd2630b64f240c50f8d0eec482b9157")
        );
        assert_eq!(
            b.share().to_vec(),
            h("3ea7e0b19560d7c0b0f5734f63b955286dfa8232b5ebe63324e2d9e7433f7258")
        );
        let k = a.shared_point(b.share()).unwrap();
        assert_eq!(
            k.to_vec(),
            h("80b69a8a76457ab6a4d7f887a4bf6b55a2f80ac19c333f917a05fc9887c8b40f")
        );
        // The draft's vector uses ADa = "ADa", ADb = "ADb".
        let got = isk(&h(SID), &k[..], a.share(), b"ADa", b.share(), b"ADb");
        assert_eq!(
            got.to_vec(),
            h("b69effbf61b51d56401c0f65601abe428de8206feaaf0e32198896dc
               ae7b35cd2b38950a39dfd5d4a79164614c2984f7daa460b588c1e80c
               3fa2068af7900447")
        );
        // Both roles agree (Seal's empty AD).
        assert_eq!(
            *a.initiator_isk(&h(SID), b.share()).unwrap(),
            *b.responder_isk(&h(SID), a.share()).unwrap()
        );
    }

    #[test]
    fn rejects_invalid_and_identity_shares() {
        let s = Party {
            y: Scalar::from_bytes_mod_order(
                h("7cd0e075fa7955ba52c02759a6c90dbbfc10e6d40aea8d283e407d88cf538a05")
                    .try_into()
                    .unwrap(),
            ),
            share: [0; 32],
        };
        // The draft's valid case.
        assert_eq!(
            s.shared_point(&h(
                "2c3c6b8c4f3800e7aef6864025b4ed79bd599117e427c41bd47d93d654b4a51c"
            ))
            .unwrap()
            .to_vec(),
            h("7c13645fe790a468f62c39beb7388e541d8405d1ade69d1778c5fe3e7f6b600e")
        );
        // Y_i1 (not an encoding) and Y_i2 (the identity) must abort.
        assert_eq!(
            s.shared_point(&h(
                "2b3c6b8c4f3800e7aef6864025b4ed79bd599117e427c41bd47d93d654b4a51c"
            )),
            Err(InvalidShare)
        );
        assert_eq!(s.shared_point(&[0u8; 32]), Err(InvalidShare));
        assert_eq!(s.shared_point(&[1u8; 31]), Err(InvalidShare));
    }

    #[test]
    fn rejects_a_different_password() {
        let sid = [7u8; 32];
        let a = Party::new(b"correct horse battery", b"ci", &sid, [1; 32]);
        let b = Party::new(b"correct horse battery", b"ci", &sid, [2; 32]);
        let c = Party::new(b"wrong horse battery!!", b"ci", &sid, [2; 32]);
        let ab = a.initiator_isk(&sid, b.share()).unwrap();
        assert_eq!(*ab, *b.responder_isk(&sid, a.share()).unwrap());
        assert_ne!(*ab, *c.responder_isk(&sid, a.share()).unwrap());
    }
}
