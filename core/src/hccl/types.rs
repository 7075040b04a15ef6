//! Element types, reduction operations and the unique id of HCCL.
//!
//! Owns: [`HcclType`] (sealed: f32, bf16, f16, i32, u32 — the types Habana documents as
//! supported), [`ReduceOp`] (Sum, Min, Max only: `hcclProd` and `hcclAvg` are not supported by
//! Habana, so they cannot be named), [`UniqueId`] and its text form (the crate's one hex codec
//! for ids: `Display` / `FromStr`, errors [`UniqueIdParseError`]).

use habana_sys::{HCCL_UNIQUE_ID_MAX_BYTES, hcclDataType_t, hcclRedOp_t, hcclUniqueId};

use super::error::{HcclError, Result};
use crate::synapse::DeviceRepr;

mod sealed {
    pub trait Sealed {}
}

/// Element types HCCL reduces (Habana's C API docs: f32, bf16, f16, i32, u32). Sealed: a
/// collective over any other type does not compile.
pub trait HcclType: sealed::Sealed + DeviceRepr {
    /// The `hcclDataType_t` tag.
    const HCCL: hcclDataType_t;
}

macro_rules! hccl_type {
    ($t:ty, $tag:ident) => {
        impl sealed::Sealed for $t {}
        impl HcclType for $t {
            const HCCL: hcclDataType_t = hcclDataType_t::$tag;
        }
    };
}
hccl_type!(f32, FLOAT32);
hccl_type!(half::bf16, BFLOAT16);
hccl_type!(half::f16, FLOAT16);
hccl_type!(i32, INT32);
hccl_type!(u32, UINT32);

/// A reduction. Maps to `hcclSum = 0`, `hcclMin = 2`, `hcclMax = 3` (note: Min and Max are the
/// reverse of NCCL's numbering; `hccl_types.h` 1.21).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise minimum.
    Min,
    /// Element-wise maximum.
    Max,
}

impl ReduceOp {
    /// The raw `hcclRedOp_t`.
    pub fn raw(self) -> hcclRedOp_t {
        match self {
            ReduceOp::Sum => hcclRedOp_t::SUM,
            ReduceOp::Min => hcclRedOp_t::MIN,
            ReduceOp::Max => hcclRedOp_t::MAX,
        }
    }
}

/// A communicator's unique id: created by rank 0 (`hcclGetUniqueId`), sent to every other rank
/// out of band (e.g. [`super::rendezvous`]), passed by value to `hcclCommInitRank`.
///
/// Text form (how it travels on command lines and in environment variables): `Display` writes
/// the meaningful bytes ([`UniqueId::to_bytes`]) as lower-case hex, two digits per byte, so the
/// length is the digit count / 2 and the all-zero [`UniqueId::zeroed`] is the empty string;
/// `FromStr` reads that form back (either case) and rejects anything else with a
/// [`UniqueIdParseError`]. `Debug` prints only the length.
#[derive(Clone, Copy)]
pub struct UniqueId(pub(crate) hcclUniqueId);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId({} bytes)", self.0.length)
    }
}

impl UniqueId {
    /// An all-zero id: what every rank passes when `HCCL_COMM_ID=IP:PORT` tells the library
    /// where rank 0's coordinator is (the vendor's no-out-of-band mode).
    pub fn zeroed() -> Self {
        Self(hcclUniqueId::default())
    }

    /// The meaningful bytes (`internal[..length]`), for sending to the other ranks.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.0.internal[..self.0.length.min(HCCL_UNIQUE_ID_MAX_BYTES)].to_vec()
    }

    /// Rebuilds an id from [`UniqueId::to_bytes`].
    ///
    /// # Errors
    /// [`HcclError::InvalidArgument`] when `bytes` is longer than 1024.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        if bytes.len() > HCCL_UNIQUE_ID_MAX_BYTES {
            return Err(HcclError::InvalidArgument { what: "unique id length", value: bytes.len().to_string() });
        }
        let mut id = hcclUniqueId::default();
        id.internal[..bytes.len()].copy_from_slice(bytes);
        id.length = bytes.len();
        Ok(Self(id))
    }
}

impl std::fmt::Display for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex::encode(self.to_bytes()))
    }
}

impl std::str::FromStr for UniqueId {
    type Err = UniqueIdParseError;

    /// Parses the `Display` form: an even number of hex digits (either case), at most
    /// 2 x 1024 (`HCCL_UNIQUE_ID_MAX_BYTES`). No whitespace is skipped. Errors, in this order:
    /// the first non-hex character, an odd digit count, too many bytes.
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        // Characters first, so a bad character is named even in an odd-length string.
        if let Some((position, ch)) = s.char_indices().find(|(_, c)| !c.is_ascii_hexdigit()) {
            return Err(UniqueIdParseError::NotHex { position, ch });
        }
        let bytes = hex::decode(s).map_err(|_| UniqueIdParseError::OddLength { digits: s.len() })?;
        Self::from_bytes(&bytes).map_err(|_| UniqueIdParseError::TooLong { bytes: bytes.len() })
    }
}

/// Why a string is not a [`UniqueId`] (its `FromStr`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UniqueIdParseError {
    /// A character that is not a hex digit.
    #[error("unique id: {ch:?} at byte {position} is not a hex digit")]
    NotHex {
        /// Byte offset of the character in the string (0-based).
        position: usize,
        /// The character.
        ch: char,
    },
    /// An odd number of hex digits (a byte needs two).
    #[error("unique id: odd number of hex digits ({digits})")]
    OddLength {
        /// Length of the string in bytes.
        digits: usize,
    },
    /// More bytes than `hcclUniqueId` holds.
    #[error("unique id: {bytes} bytes, at most {HCCL_UNIQUE_ID_MAX_BYTES}")]
    TooLong {
        /// Number of bytes the string encodes.
        bytes: usize,
    },
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn display_is_lower_case_hex_of_the_used_bytes() {
        let id = UniqueId::from_bytes(&[0x00, 0xAB, 0x10, 0xff]).unwrap();
        assert_eq!(id.to_string(), "00ab10ff");
        assert_eq!(UniqueId::zeroed().to_string(), "");
        let back: UniqueId = "00AB10fF".parse().unwrap();
        assert_eq!(back.to_bytes(), [0x00, 0xab, 0x10, 0xff]);
        assert_eq!("".parse::<UniqueId>().unwrap().to_bytes(), Vec::<u8>::new());
    }

    #[test]
    fn bad_text_is_a_typed_error() {
        let err = |s: &str| s.parse::<UniqueId>().unwrap_err();
        assert_eq!(err("abcg"), UniqueIdParseError::NotHex { position: 3, ch: 'g' });
        assert_eq!(err("ab c"), UniqueIdParseError::NotHex { position: 2, ch: ' ' });
        assert_eq!(err("abé0"), UniqueIdParseError::NotHex { position: 2, ch: 'é' });
        assert_eq!(err("abc"), UniqueIdParseError::OddLength { digits: 3 });
        assert_eq!(err(&"00".repeat(1025)), UniqueIdParseError::TooLong { bytes: 1025 });
        assert_eq!("00".repeat(1024).parse::<UniqueId>().unwrap().to_bytes().len(), 1024);
        assert_eq!(err("a").to_string(), "unique id: odd number of hex digits (1)");
        assert_eq!(err("abg"), UniqueIdParseError::NotHex { position: 2, ch: 'g' });
        assert_eq!(err("0x").to_string(), "unique id: 'x' at byte 1 is not a hex digit");
    }

    proptest! {
        #[test]
        fn any_id_round_trips(bytes in proptest::collection::vec(any::<u8>(), 0..=HCCL_UNIQUE_ID_MAX_BYTES)) {
            let id = UniqueId::from_bytes(&bytes).unwrap();
            let text = id.to_string();
            prop_assert_eq!(text.len(), 2 * bytes.len());
            prop_assert!(text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
            prop_assert_eq!(text.parse::<UniqueId>().unwrap().to_bytes(), bytes);
        }

        #[test]
        fn any_string_parses_or_fails_without_panicking(s in any::<String>()) {
            match s.parse::<UniqueId>() {
                Ok(id) => prop_assert_eq!(id.to_string(), s.to_ascii_lowercase()),
                Err(UniqueIdParseError::NotHex { position, ch }) => {
                    prop_assert_eq!(s[position..].chars().next(), Some(ch));
                    prop_assert!(!ch.is_ascii_hexdigit());
                }
                Err(UniqueIdParseError::OddLength { digits }) => prop_assert!(digits % 2 == 1),
                Err(UniqueIdParseError::TooLong { bytes }) => prop_assert!(bytes > HCCL_UNIQUE_ID_MAX_BYTES),
            }
        }

        #[test]
        fn a_bad_digit_anywhere_is_named(bytes in proptest::collection::vec(any::<u8>(), 1..64), at in any::<prop::sample::Index>(), bad in "[g-zG-Z !:_-]") {
            let mut text = hex::encode(&bytes);
            let position = at.index(text.len());
            text.replace_range(position..=position, &bad);
            prop_assert_eq!(
                text.parse::<UniqueId>().unwrap_err(),
                UniqueIdParseError::NotHex { position, ch: bad.chars().next().unwrap() }
            );
        }
    }
}
