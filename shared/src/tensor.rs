//! Wire-neutral tensor element types.
//!
//! The engines name dtypes by string (`"float32"`, `"bfloat16"`, ...); both
//! planes and the simulated worker size buffers from the same table.

use std::fmt;
use std::str::FromStr;

/// An element type the engines accept in `TensorData.dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    Float32,
    BFloat16,
    Float16,
    Int64,
    UInt32,
}

impl DType {
    /// The engines' spelling.
    pub const fn wire_name(self) -> &'static str {
        match self {
            DType::Float32 => "float32",
            DType::BFloat16 => "bfloat16",
            DType::Float16 => "float16",
            DType::Int64 => "int64",
            DType::UInt32 => "uint32",
        }
    }

    /// Bytes per element.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::Float32 | DType::UInt32 => 4,
            DType::BFloat16 | DType::Float16 => 2,
            DType::Int64 => 8,
        }
    }

    /// Bytes a tensor of `shape` occupies, or `None` on overflow.
    pub fn tensor_bytes(self, shape: &[u32]) -> Option<usize> {
        shape
            .iter()
            .try_fold(self.size_bytes(), |acc, &dim| acc.checked_mul(dim as usize))
    }
}

/// A dtype string the engines do not accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported tensor dtype {0:?} (expected float32, bfloat16, float16, int64 or uint32)")]
pub struct UnknownDType(pub String);

impl FromStr for DType {
    type Err = UnknownDType;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            DType::Float32,
            DType::BFloat16,
            DType::Float16,
            DType::Int64,
            DType::UInt32,
        ]
        .into_iter()
        .find(|dtype| dtype.wire_name() == s)
        .ok_or_else(|| UnknownDType(s.to_owned()))
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.wire_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_names_round_trip() {
        for (name, size) in [
            ("float32", 4),
            ("bfloat16", 2),
            ("float16", 2),
            ("int64", 8),
            ("uint32", 4),
        ] {
            let dtype: DType = name.parse().expect("known dtype");
            assert_eq!(dtype.wire_name(), name);
            assert_eq!(dtype.size_bytes(), size);
        }
        assert!("fp8".parse::<DType>().is_err());
    }

    #[test]
    fn tensor_bytes_multiplies_shape() {
        assert_eq!(
            DType::BFloat16.tensor_bytes(&[10764, 1176]),
            Some(10764 * 1176 * 2)
        );
        assert_eq!(DType::Float32.tensor_bytes(&[]), Some(4));
        assert_eq!(
            DType::Int64.tensor_bytes(&[u32::MAX, u32::MAX, u32::MAX]),
            None
        );
    }
}
