//! Text segments: `key=value` pairs separated by NUL bytes, as carried by Login and Text PDUs
//! (RFC 7143 §6.1).

use bytes::{BufMut, BytesMut};

use crate::WireError;

/// The longest key name (RFC 7143 §6.1: 63 bytes).
pub const MAX_KEY_LEN: usize = 63;
/// The longest value the parser accepts. RFC 7143 §6.1 bounds most values at 255 bytes but
/// lets some (e.g. SendTargets answers, CHAP values) be up to 8192.
pub const MAX_VALUE_LEN: usize = 8192;

/// Parses a complete text segment (already reassembled across C-bit continuations).
///
/// Trailing NUL padding and empty entries are tolerated; anything that is not `key=value`
/// with a well-formed key is an error, so the caller can fail the login or reject the request.
pub fn parse(data: &[u8]) -> Result<Vec<(String, String)>, WireError> {
    let mut pairs = Vec::new();
    for item in data.split(|&b| b == 0) {
        if item.is_empty() {
            continue;
        }
        let eq = item
            .iter()
            .position(|&b| b == b'=')
            .ok_or(WireError::Text("missing '='"))?;
        let (key, value) = (&item[..eq], &item[eq + 1..]);
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return Err(WireError::Text("key length out of range"));
        }
        if !key
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || b".-+@_:".contains(&c))
        {
            return Err(WireError::Text("key has characters outside standard-label"));
        }
        if value.len() > MAX_VALUE_LEN {
            return Err(WireError::Text("value too long"));
        }
        let value = std::str::from_utf8(value).map_err(|_| WireError::Text("value not UTF-8"))?;
        // Safe: the key was checked to be ASCII above.
        let key = String::from_utf8_lossy(key).into_owned();
        pairs.push((key, value.to_owned()));
    }
    Ok(pairs)
}

/// Appends `key=value\0` to `out`.
pub fn push(out: &mut BytesMut, key: &str, value: &str) {
    out.reserve(key.len() + value.len() + 2);
    out.put_slice(key.as_bytes());
    out.put_u8(b'=');
    out.put_slice(value.as_bytes());
    out.put_u8(0);
}

/// Encodes all pairs into one segment.
#[must_use]
pub fn encode<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> BytesMut {
    let mut out = BytesMut::new();
    for (k, v) in pairs {
        push(&mut out, k.as_ref(), v.as_ref());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pairs_and_tolerates_padding() {
        let pairs = parse(b"InitiatorName=iqn.x\0SessionType=Normal\0\0\0").unwrap();
        assert_eq!(
            pairs,
            vec![
                ("InitiatorName".into(), "iqn.x".into()),
                ("SessionType".into(), "Normal".into())
            ]
        );
    }

    #[test]
    fn values_may_contain_equals_and_be_empty() {
        let pairs = parse(b"CHAP_C=0xab==\0X-foo=\0").unwrap();
        assert_eq!(pairs[0].1, "0xab==");
        assert_eq!(pairs[1].1, "");
    }

    #[test]
    fn rejects_missing_equals() {
        assert!(parse(b"Nonsense\0").is_err());
    }

    #[test]
    fn rejects_bad_key_characters_and_lengths() {
        assert!(parse(b"Bad Key=1\0").is_err());
        assert!(parse(b"=1\0").is_err());
        let long = format!("{}=1\0", "k".repeat(64));
        assert!(parse(long.as_bytes()).is_err());
    }

    #[test]
    fn rejects_non_utf8_values() {
        assert!(parse(b"Key=\xff\xfe\0").is_err());
    }

    #[test]
    fn encode_round_trips() {
        let pairs = vec![
            ("A".to_string(), "1".to_string()),
            ("B".into(), "x,y".into()),
        ];
        let enc = encode(&pairs);
        assert_eq!(&enc[..], b"A=1\0B=x,y\0");
        assert_eq!(parse(&enc).unwrap(), pairs);
    }
}
