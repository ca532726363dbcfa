//! A command's sizing in a session whose data travels sealed (Seal, docs/seal.md §4): EDTL
//! and every offset count sealed bytes, and sealed data cannot be cut, so the target collects
//! a write's whole sealed EDTL, opens it, and applies the overflow rules
//! ([`crate::engine::residual`]) to the plaintext against what the CDB transfers, as in a
//! plain session. An EDTL that is the
//! sealed length of no transfer is refused (INVALID FIELD IN COMMAND INFORMATION UNIT,
//! [`REFUSED_SENSE`]). The lengths themselves are the transform's ([`SealedLengths`],
//! implemented by `ipsan_seal::SealSession`); the rule is here, below every driver.

use super::{Response, Sizing};
use crate::engine::residual::REFUSED_SENSE;

/// Which sealed lengths a session's data transform can produce, as [`Sizing::sealed`] asks.
pub trait SealedLengths {
    /// Whether a write's sealed transfer can be `wire` bytes long (a sealed length of some
    /// plaintext; with compression any length from the shortest transfer up, docs/seal.md §4b).
    fn accepts_write_len(&self, wire: usize) -> bool;
    /// Whether `wire` bytes (a read's EDTL) is the sealed length of some plaintext (with
    /// compression: its longest form).
    fn accepts_read_len(&self, wire: usize) -> bool;
}

impl<D> Sizing<D> {
    /// This sizing (the device server's, in plaintext bytes) for a command with EDTL `edtl` in
    /// a sealed session: a write collects its whole sealed EDTL (`need`) and keeps the
    /// plaintext it transfers as [`Sizing::transfer`]; an EDTL `lengths` cannot produce gets
    /// the early answer CHECK CONDITION, ILLEGAL REQUEST / INVALID FIELD IN COMMAND
    /// INFORMATION UNIT (the write's data is still collected first). A command already
    /// answered ([`Sizing::early`]) or with no EDTL is left as it is.
    #[must_use]
    pub fn sealed(self, edtl: u32, lengths: &(impl SealedLengths + ?Sized)) -> Self {
        if self.early.is_some() || edtl == 0 {
            return self;
        }
        let plain = self.transfer.unwrap_or(self.need);
        let wire = edtl as usize;
        let valid = if plain > 0 {
            lengths.accepts_write_len(wire)
        } else {
            lengths.accepts_read_len(wire)
        };
        let early = (!valid).then(|| {
            let (key, asc, ascq) = REFUSED_SENSE;
            Response::check(key, asc, ascq)
        });
        Self {
            need: if plain > 0 { u64::from(edtl) } else { 0 },
            early,
            transfer: Some(plain),
            decoded: self.decoded,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chunks of 4096 plaintext bytes, each followed by a 16-byte tag (a transform without
    /// compression: exactly one sealed length per plaintext length).
    struct Chunks;

    impl Chunks {
        fn sealed(plain: usize) -> usize {
            plain + plain.div_ceil(4096) * 16
        }
        fn plain(wire: usize) -> Option<usize> {
            let chunks = wire.div_ceil(4096 + 16);
            let plain = wire.checked_sub(chunks * 16)?;
            (Self::sealed(plain) == wire).then_some(plain)
        }
    }

    impl SealedLengths for Chunks {
        fn accepts_write_len(&self, wire: usize) -> bool {
            Self::plain(wire).is_some()
        }
        fn accepts_read_len(&self, wire: usize) -> bool {
            Self::plain(wire).is_some()
        }
    }

    fn plain(need: u64) -> Sizing<&'static str> {
        Sizing {
            need,
            early: None,
            transfer: None,
            decoded: Some("typed command"),
        }
    }

    fn refused() -> Response {
        let (key, asc, ascq) = REFUSED_SENSE;
        Response::check(key, asc, ascq)
    }

    #[test]
    fn accepts_a_sealed_write_and_collects_its_whole_sealed_edtl() {
        let edtl = u32::try_from(Chunks::sealed(8192)).unwrap();
        let s = plain(8192).sealed(edtl, &Chunks);
        assert_eq!(s.need, u64::from(edtl), "the sealed bytes are collected");
        assert_eq!(s.transfer, Some(8192), "the plaintext the CDB transfers");
        assert!(s.early.is_none());
        assert_eq!(
            s.decoded,
            Some("typed command"),
            "the typed command travels on"
        );
    }

    #[test]
    fn accepts_an_overflowing_sealed_write_for_the_plaintext_rules() {
        // EDTL seals 4096 bytes, the CDB transfers 8192: collected whole, the overflow is
        // decided in plaintext after opening (residual::fit_write), not refused here.
        let edtl = u32::try_from(Chunks::sealed(4096)).unwrap();
        let s = plain(8192).sealed(edtl, &Chunks);
        assert_eq!((s.need, s.transfer), (u64::from(edtl), Some(8192)));
        assert!(s.early.is_none());
    }

    #[test]
    fn rejects_a_write_edtl_that_is_no_sealed_length() {
        // One whole sealed chunk (4112) and one byte: no plaintext seals to 4113 bytes.
        assert_eq!(Chunks::plain(4113), None);
        let s = plain(4096).sealed(4113, &Chunks);
        assert_eq!(s.early, Some(refused()));
        assert_eq!(s.need, 4113, "its data is collected before the answer");
        assert_eq!(s.transfer, Some(4096));
        assert_eq!(s.decoded, Some("typed command"));
    }

    #[test]
    fn rejects_a_read_edtl_that_is_no_sealed_length_and_collects_nothing() {
        let s = plain(0).sealed(4113, &Chunks);
        assert_eq!(s.early, Some(refused()));
        assert_eq!((s.need, s.transfer), (0, Some(0)));
        let edtl = u32::try_from(Chunks::sealed(65536)).unwrap();
        let s = plain(0).sealed(edtl, &Chunks);
        assert!(s.early.is_none());
        assert_eq!((s.need, s.transfer), (0, Some(0)));
    }

    #[test]
    fn accepts_commands_without_edtl_or_already_answered_unchanged() {
        let s = plain(0).sealed(0, &Chunks);
        assert_eq!((s.need, s.transfer), (0, None));
        assert!(s.early.is_none());
        let answered = Sizing {
            early: Some(Response::check(0x05, 0x20, 0x00)),
            ..plain(0)
        };
        let s = answered.sealed(4113, &Chunks);
        assert_eq!(s.early, Some(Response::check(0x05, 0x20, 0x00)));
        assert_eq!((s.need, s.transfer), (0, None));
    }
}
