//! Non-finite floats in JSON: the crate's one serde adapter for them.
//!
//! JSON has no NaN or infinity. Fields that use NaN as "no value" (a diverged loss, a
//! micro-batch that was not computed) are written with this module: NaN, +inf and -inf
//! serialize as `null`, and `null` deserializes as NaN (so +-inf read back as NaN: a report
//! cannot tell them apart, and none of ours needs to). Finite values are written as numbers and
//! read back as the same value (serde_json prints the shortest representation that round-trips;
//! its default parser, which this crate uses, may land a few ulp off for extreme exponents; exact
//! with serde_json's `float_roundtrip` feature).
//!
//! Use with `#[serde(with = "crate::serde_nan")]` on an `f64` field and
//! `#[serde(with = "crate::serde_nan::vec")]` on a `Vec<f64>` field.
//!
//! Owns: the NaN <-> null mapping. Must not touch: which fields use it.
#![forbid(unsafe_code)]

use serde::{Deserialize, Deserializer, Serializer};

/// Writes `x` as a number, or `null` when it is NaN or infinite.
///
/// # Errors
/// Whatever the serializer returns.
pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    if x.is_finite() { s.serialize_f64(*x) } else { s.serialize_none() }
}

/// Reads a number, or `null` as NaN.
///
/// # Errors
/// The deserializer's error when the value is neither a number nor `null`.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// The same mapping for every element of a `Vec<f64>`: non-finite elements are written as
/// `null`, `null` elements are read as NaN.
pub mod vec {
    use serde::ser::SerializeSeq;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `v` as a JSON array, non-finite elements as `null`.
    ///
    /// # Errors
    /// Whatever the serializer returns.
    pub fn serialize<S: Serializer>(v: &[f64], s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(v.len()))?;
        for x in v {
            seq.serialize_element(&x.is_finite().then_some(*x))?;
        }
        seq.end()
    }

    /// Reads an array of numbers and `null`s, `null` as NaN.
    ///
    /// # Errors
    /// The deserializer's error when the value is not an array of numbers and `null`s.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
        Ok(Vec::<Option<f64>>::deserialize(d)?.into_iter().map(|x| x.unwrap_or(f64::NAN)).collect())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, Debug)]
    struct One {
        #[serde(with = "crate::serde_nan")]
        x: f64,
    }

    #[derive(Serialize, Deserialize, Debug)]
    struct Many {
        #[serde(with = "crate::serde_nan::vec")]
        v: Vec<f64>,
    }

    /// Equal to within a few ulp (serde_json's default float parser is not exact for extreme
    /// exponents), same sign.
    fn same(a: f64, b: f64) -> bool {
        a.is_sign_negative() == b.is_sign_negative()
            && (a - b).abs() <= a.abs().max(f64::MIN_POSITIVE) * 4.0 * f64::EPSILON
    }

    #[test]
    fn scalar_writes_null_for_non_finite_and_reads_null_as_nan() {
        for x in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert_eq!(serde_json::to_string(&One { x }).unwrap(), r#"{"x":null}"#);
        }
        assert_eq!(serde_json::to_string(&One { x: -2.5 }).unwrap(), r#"{"x":-2.5}"#);
        assert!(serde_json::from_str::<One>(r#"{"x":null}"#).unwrap().x.is_nan());
        assert_eq!(serde_json::from_str::<One>(r#"{"x":3}"#).unwrap().x, 3.0);
        assert!(serde_json::from_str::<One>(r#"{"x":"NaN"}"#).is_err());
    }

    #[test]
    fn vec_round_trips_with_nan() {
        let m = Many { v: vec![1.5, f64::NAN, 0.0, f64::INFINITY, -1e300] };
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(json, r#"{"v":[1.5,null,0.0,null,-1e+300]}"#);
        let back: Many = serde_json::from_str(&json).unwrap();
        assert_eq!(back.v.len(), 5);
        assert_eq!(back.v[0], 1.5);
        assert!(back.v[1].is_nan() && back.v[3].is_nan());
        assert_eq!(back.v[4], -1e300);
        assert!(serde_json::from_str::<Many>(r#"{"v":[1,"x"]}"#).is_err());
    }

    proptest! {
        #[test]
        fn any_f64_round_trips_finite_exactly_and_non_finite_as_nan(x in any::<f64>()) {
            let back: One = serde_json::from_str(&serde_json::to_string(&One { x }).unwrap()).unwrap();
            prop_assert!(if x.is_finite() { same(back.x, x) } else { back.x.is_nan() }, "{x} -> {}", back.x);
        }

        #[test]
        fn any_vec_round_trips(v in proptest::collection::vec(any::<f64>(), 0..16)) {
            let back: Many = serde_json::from_str(&serde_json::to_string(&Many { v: v.clone() }).unwrap()).unwrap();
            prop_assert_eq!(back.v.len(), v.len());
            for (a, b) in v.iter().zip(&back.v) {
                prop_assert!(if a.is_finite() { same(*a, *b) } else { b.is_nan() }, "{a} -> {b}");
            }
        }
    }
}
