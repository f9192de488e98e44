//! Proto conversions (placeholder).
