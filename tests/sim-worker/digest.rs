//! The simulated engine's fingerprints of what it received.
//!
//! A sim worker's output text starts with a digest of its input, so a test can
//! prove that the right token ids and tensor bytes reached the right worker.
//! The digest is the same in every mode: a Regular worker computes it from the
//! prompt and the tensors it read; in PD the prefill worker computes it and
//! decode receives it as the "KV cache"; in EPD each encode worker sends its
//! item's fingerprint to prefill as the "embedding". Tests include this file
//! (`#[path]`) to compute the expected value independently of any worker.

/// Fingerprint of one tensor: its dtype, shape and bytes.
pub fn tensor_digest(dtype: &str, shape: &[u32], bytes: &[u8]) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"smg-sim/tensor/v1");
    hasher.update(&(dtype.len() as u64).to_le_bytes());
    hasher.update(dtype.as_bytes());
    hasher.update(&(shape.len() as u64).to_le_bytes());
    for dim in shape {
        hasher.update(&dim.to_le_bytes());
    }
    hasher.update(&(bytes.len() as u64).to_le_bytes());
    hasher.update(bytes);
    *hasher.finalize().as_bytes()
}

/// Fingerprint of one media item: its encoder input and any named
/// model-specific tensors (sorted by name), each given as a tensor digest.
pub fn item_digest(encoder_input: &[u8; 32], named: &[(String, [u8; 32])]) -> [u8; 32] {
    let mut sorted: Vec<&(String, [u8; 32])> = named.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"smg-sim/item/v1");
    hasher.update(encoder_input);
    for (name, digest) in sorted {
        hasher.update(&(name.len() as u64).to_le_bytes());
        hasher.update(name.as_bytes());
        hasher.update(digest);
    }
    *hasher.finalize().as_bytes()
}

/// Fingerprint of a whole prompt: its token ids and its media items in order.
/// This is what prefill hands to decode as the simulated KV cache.
pub fn prompt_digest(input_ids: &[u32], items: &[[u8; 32]]) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"smg-sim/prompt/v1");
    hasher.update(&(input_ids.len() as u64).to_le_bytes());
    for id in input_ids {
        hasher.update(&id.to_le_bytes());
    }
    hasher.update(&(items.len() as u64).to_le_bytes());
    for item in items {
        hasher.update(item);
    }
    *hasher.finalize().as_bytes()
}

/// The text every completion starts with: the first 8 bytes of the prompt
/// digest in hex.
pub fn output_header(prompt: &[u8; 32]) -> String {
    let mut header = String::from("digest=");
    for byte in &prompt[..8] {
        header.push_str(&format!("{byte:02x}"));
    }
    header.push('.');
    header
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_digest_sees_dtype_shape_and_bytes() {
        let base = tensor_digest("bfloat16", &[2, 3], &[0; 12]);
        assert_ne!(base, tensor_digest("float16", &[2, 3], &[0; 12]));
        assert_ne!(base, tensor_digest("bfloat16", &[3, 2], &[0; 12]));
        assert_ne!(base, tensor_digest("bfloat16", &[2, 3], &[1; 12]));
    }

    #[test]
    fn item_digest_ignores_name_order() {
        let a = ("a".to_owned(), [1; 32]);
        let b = ("b".to_owned(), [2; 32]);
        assert_eq!(
            item_digest(&[9; 32], &[a.clone(), b.clone()]),
            item_digest(&[9; 32], &[b, a])
        );
    }

    #[test]
    fn header_is_sixteen_hex_digits() {
        let header = output_header(&prompt_digest(&[1, 2, 3], &[]));
        assert_eq!(header.len(), "digest=".len() + 16 + 1);
    }
}
