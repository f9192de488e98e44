//! Scratch space a data-plane core reuses from image to image: the decoded
//! source pixels, the resampler's window of rows and the band of resized
//! rows that patchifying reads.
//!
//! Why it exists: a 1080p JPEG decodes into a 6 MB buffer and a 4K one into
//! 25 MB. Allocating that per image means fresh pages from the kernel every
//! time (a page fault and a zeroed page per 4 KiB); a core that keeps its
//! buffers pays that once. Keeping them forever would let one huge image pin
//! its memory on every core, so a buffer is kept only while it is
//! reasonable: never one larger than [`ScratchPolicy::max_retained_bytes`],
//! and one that stayed more than twice as large as anything the last
//! [`ScratchPolicy::shrink_window`] images needed is freed (the next large
//! image allocates again).
//!
//! A kept buffer keeps its length, not just its capacity: its contents are
//! stale, but the kernels write every byte they read within one image (the
//! decoder fills the whole image, the resampler fills a row before reading
//! it), so a reused buffer is never zeroed again. Only growth is zeroed.

/// How much scratch memory a core keeps between images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScratchPolicy {
    /// A buffer larger than this is freed after its image (default 32 MiB:
    /// a 4K RGB image's 25 MB is kept, a 48-megapixel photo's is not).
    pub max_retained_bytes: usize,
    /// Images over which a buffer's use is watched before it may shrink.
    pub shrink_window: u32,
}

impl Default for ScratchPolicy {
    fn default() -> Self {
        Self {
            max_retained_bytes: 32 << 20,
            shrink_window: 32,
        }
    }
}

/// One reusable buffer and how much of it recent images used.
#[derive(Debug, Default)]
pub(crate) struct PooledBuffer {
    buffer: Vec<u8>,
    /// The most any image in the current window used.
    peak: usize,
    /// Images in the current window.
    images: u32,
}

impl PooledBuffer {
    /// The kept buffer (empty if none), to be sized with [`sized`].
    pub(crate) fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buffer)
    }

    /// Takes back a buffer after an image used `buffer.len()` bytes of it,
    /// keeping it or freeing it as `policy` says.
    pub(crate) fn give_back(&mut self, buffer: Vec<u8>, policy: &ScratchPolicy) {
        self.peak = self.peak.max(buffer.len());
        self.images += 1;
        let mut keep = buffer.capacity() <= policy.max_retained_bytes;
        if self.images >= policy.shrink_window.max(1) {
            keep &= buffer.capacity() <= self.peak.saturating_mul(2);
            self.peak = 0;
            self.images = 0;
        }
        self.buffer = if keep { buffer } else { Vec::new() };
    }

    fn retained(&self) -> usize {
        self.buffer.capacity()
    }
}

/// `buffer` resized to exactly `len` bytes with unspecified contents (stale
/// bytes from earlier images, zeros where it grew). A buffer too small is
/// replaced rather than grown, so its stale bytes are not copied.
pub(crate) fn sized(mut buffer: Vec<u8>, len: usize) -> Vec<u8> {
    if buffer.capacity() < len {
        return vec![0u8; len];
    }
    if buffer.len() < len {
        buffer.resize(len, 0);
    } else {
        buffer.truncate(len);
    }
    buffer
}

/// The buffers one core reuses across images (see the module docs).
#[derive(Debug, Default)]
pub struct ScratchSpace {
    policy: ScratchPolicy,
    pub(crate) decoded: PooledBuffer,
    pub(crate) resize: PooledBuffer,
    pub(crate) band: PooledBuffer,
}

impl ScratchSpace {
    pub fn new(policy: ScratchPolicy) -> Self {
        Self {
            policy,
            ..Self::default()
        }
    }

    pub fn policy(&self) -> &ScratchPolicy {
        &self.policy
    }

    /// Bytes held between images now.
    pub fn retained_bytes(&self) -> usize {
        self.decoded.retained() + self.resize.retained() + self.band.retained()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizing_reuses_capacity_and_zeroes_only_growth() {
        let mut buffer = sized(Vec::new(), 8);
        buffer.copy_from_slice(&[9; 8]);
        let pointer = buffer.as_ptr();
        let shorter = sized(buffer, 4);
        assert_eq!(shorter, [9; 4]);
        let longer = sized(shorter, 6);
        assert_eq!(longer.as_ptr(), pointer, "no reallocation within capacity");
        assert_eq!(longer, [9, 9, 9, 9, 0, 0]);
        let grown = sized(longer, 100);
        assert_eq!(grown.len(), 100);
        assert!(grown.iter().all(|&b| b == 0), "a replaced buffer is fresh");
    }

    #[test]
    fn a_buffer_over_the_cap_is_not_kept() {
        let policy = ScratchPolicy {
            max_retained_bytes: 1000,
            shrink_window: 4,
        };
        let mut pool = PooledBuffer::default();
        pool.give_back(vec![0; 1000], &policy);
        assert_eq!(pool.retained(), 1000);
        let reused = sized(pool.take(), 500);
        assert_eq!(reused.capacity(), 1000);
        pool.give_back(reused, &policy);
        pool.give_back(vec![0; 1001], &policy);
        assert_eq!(pool.retained(), 0, "one large image pins nothing");
    }

    #[test]
    fn a_buffer_much_larger_than_recent_use_shrinks_after_the_window() {
        let policy = ScratchPolicy {
            max_retained_bytes: 1 << 20,
            shrink_window: 4,
        };
        let mut pool = PooledBuffer::default();
        // One large image, then small ones: kept until the window closes.
        pool.give_back(vec![0; 10_000], &policy);
        for _ in 0..2 {
            let buffer = sized(pool.take(), 100);
            pool.give_back(buffer, &policy);
            assert_eq!(pool.retained(), 10_000);
        }
        // The window's peak (10 000) still justifies it at the boundary...
        let buffer = sized(pool.take(), 100);
        pool.give_back(buffer, &policy);
        assert_eq!(pool.retained(), 10_000);
        // ...but a whole window of small images frees it.
        for _ in 0..4 {
            let buffer = sized(pool.take(), 100);
            pool.give_back(buffer, &policy);
        }
        assert_eq!(pool.retained(), 0);
        // Steady large images keep their buffer through many windows.
        for _ in 0..20 {
            let buffer = sized(pool.take(), 10_000);
            pool.give_back(buffer, &policy);
            assert_eq!(pool.retained(), 10_000);
        }
    }
}
