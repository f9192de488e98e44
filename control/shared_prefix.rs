//! How long a start two sequences share: the per-thread "last prompt"
//! records of the tokenizer (text), the cache-aware policy (token ids) and
//! the engine messages' id encoder all begin by asking it, on every
//! request, of inputs kilobytes long.

/// Items compared as one slice before the element-by-element tail.
const BLOCK: usize = 64;

/// How many leading items `a` and `b` share: whole blocks compared as
/// slices first (a `memcmp` for bytes and integers), then the block where
/// they differ item by item.
pub(crate) fn shared_prefix_len<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    let len = a.len().min(b.len());
    let mut at = 0;
    while at + BLOCK <= len && a[at..at + BLOCK] == b[at..at + BLOCK] {
        at += BLOCK;
    }
    at + a[at..len]
        .iter()
        .zip(&b[at..len])
        .take_while(|(x, y)| x == y)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_start_is_counted_across_blocks_and_lengths() {
        let a: Vec<u32> = (0..300).collect();
        for cut in [0, 1, 63, 64, 65, 128, 200, 299] {
            let mut b = a.clone();
            b[cut] = 9999;
            assert_eq!(shared_prefix_len(&a, &b), cut);
            assert_eq!(
                shared_prefix_len(&a[..cut], &a),
                cut,
                "one is the other's start"
            );
        }
        assert_eq!(shared_prefix_len(&a, &a), a.len());
        assert_eq!(shared_prefix_len("hello".as_bytes(), "help".as_bytes()), 3);
    }
}
