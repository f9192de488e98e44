//! The bytes of a `RemoteTensorHandle.descriptor`: everything a reader needs
//! to fetch one tensor from the gateway's arena with a one-sided read and to
//! tell whether what it read is still the tensor it was promised.
//!
//! A fixed, versioned, little-endian layout (the README's "RDMA lane"
//! section has the same table):
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `b"SMGT"` |
//! | 4 | layout version, `1` |
//! | 5 | backend: `3` loopback, `2` verbs (`1` was a loopback layout naming the owner by pid, no longer written or read) |
//! | 6..8 | reserved, zero |
//! | 8..16 | generation (u64) the slot's stamp must hold before and after the read |
//! | 16..24 | data: byte offset in the arena (loopback) or remote virtual address (verbs) |
//! | 24..32 | length in bytes (u64) |
//! | 32..40 | stamp: byte offset (loopback) or remote virtual address (verbs) of the slot's 8-byte generation stamp |
//! | 40..48 | key (u64): the arena's random key (loopback) or the memory region's rkey (verbs) |
//!
//! then, for loopback (76 bytes in all): 48..60 the owning gateway's
//! 12-byte instance id, 60..76 the arena's 16 random name bytes; the arena
//! file is `smg-<boot id>-<24 hex instance>-<32 hex name>` in the reader's
//! `/dev/shm` (the reader is on the same host, so its own boot id is the
//! gateway's; see `lanes::shm` for why names carry no pid). For verbs (68
//! bytes): 48..64 the port's GID, 64..66 its LID (u16), 66 the port
//! number, 67 reserved.

/// The first four bytes of every descriptor.
pub const MAGIC: [u8; 4] = *b"SMGT";
/// The layout version this code writes and reads.
pub const VERSION: u8 = 1;
/// Bytes before the backend-specific tail.
const COMMON_LEN: usize = 48;
/// A loopback descriptor's length.
pub const LOOPBACK_LEN: usize = COMMON_LEN + 4 + 8 + 16;
/// A verbs descriptor's length.
pub const VERBS_LEN: usize = COMMON_LEN + 16 + 2 + 1 + 1;

const BACKEND_LOOPBACK: u8 = 3;
const BACKEND_VERBS: u8 = 2;

/// Where the arena lives and how a reader reaches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// A `/dev/shm` file of the gateway instance `owner_instance` (see
    /// `lanes::shm::instance_id`), named by `arena_name`.
    Loopback {
        owner_instance: [u8; 12],
        arena_name: [u8; 16],
    },
    /// A registered memory region on an RDMA port.
    Verbs { gid: [u8; 16], lid: u16, port: u8 },
}

/// One published tensor, as a reader sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    pub generation: u64,
    /// Offset in the arena (loopback) or remote address (verbs) of the bytes.
    pub data: u64,
    pub len: u64,
    /// Offset (loopback) or remote address (verbs) of the slot's stamp.
    pub stamp: u64,
    pub key: u64,
    pub endpoint: Endpoint,
}

/// Why descriptor bytes cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DescriptorError {
    #[error("a descriptor of {len} bytes is too short")]
    TooShort { len: usize },
    #[error("the descriptor does not start with the smg magic")]
    BadMagic,
    #[error("descriptor layout version {0} is not supported (this reader knows {VERSION})")]
    UnsupportedVersion(u8),
    #[error("descriptor backend {0} is unknown")]
    UnknownBackend(u8),
    #[error("a {backend} descriptor must be {expected} bytes, not {len}")]
    WrongLength {
        backend: &'static str,
        expected: usize,
        len: usize,
    },
    #[error("the descriptor's reserved bytes are not zero")]
    ReservedNotZero,
}

impl Descriptor {
    /// The descriptor's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let (backend, len) = match self.endpoint {
            Endpoint::Loopback { .. } => (BACKEND_LOOPBACK, LOOPBACK_LEN),
            Endpoint::Verbs { .. } => (BACKEND_VERBS, VERBS_LEN),
        };
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&[VERSION, backend, 0, 0]);
        for word in [self.generation, self.data, self.len, self.stamp, self.key] {
            out.extend_from_slice(&word.to_le_bytes());
        }
        match self.endpoint {
            Endpoint::Loopback {
                owner_instance,
                arena_name,
            } => {
                out.extend_from_slice(&owner_instance);
                out.extend_from_slice(&arena_name);
            }
            Endpoint::Verbs { gid, lid, port } => {
                out.extend_from_slice(&gid);
                out.extend_from_slice(&lid.to_le_bytes());
                out.extend_from_slice(&[port, 0]);
            }
        }
        debug_assert_eq!(out.len(), len);
        out
    }

    /// Parses descriptor bytes, refusing anything but an exact version-1
    /// layout.
    pub fn decode(bytes: &[u8]) -> Result<Self, DescriptorError> {
        if bytes.len() < COMMON_LEN {
            return Err(DescriptorError::TooShort { len: bytes.len() });
        }
        if bytes[0..4] != MAGIC {
            return Err(DescriptorError::BadMagic);
        }
        if bytes[4] != VERSION {
            return Err(DescriptorError::UnsupportedVersion(bytes[4]));
        }
        let (name, expected) = match bytes[5] {
            BACKEND_LOOPBACK => ("loopback", LOOPBACK_LEN),
            BACKEND_VERBS => ("verbs", VERBS_LEN),
            other => return Err(DescriptorError::UnknownBackend(other)),
        };
        if bytes.len() != expected {
            return Err(DescriptorError::WrongLength {
                backend: name,
                expected,
                len: bytes.len(),
            });
        }
        if bytes[6..8] != [0, 0] {
            return Err(DescriptorError::ReservedNotZero);
        }
        let mut cursor = Cursor { bytes, at: 8 };
        let generation = cursor.u64();
        let data = cursor.u64();
        let len = cursor.u64();
        let stamp = cursor.u64();
        let key = cursor.u64();
        let endpoint = if bytes[5] == BACKEND_LOOPBACK {
            Endpoint::Loopback {
                owner_instance: cursor.array(),
                arena_name: cursor.array(),
            }
        } else {
            let gid = cursor.array();
            let lid = cursor.u16();
            let [port, reserved] = cursor.array();
            if reserved != 0 {
                return Err(DescriptorError::ReservedNotZero);
            }
            Endpoint::Verbs { gid, lid, port }
        };
        Ok(Self {
            generation,
            data,
            len,
            stamp,
            key,
            endpoint,
        })
    }
}

/// Reads fixed-size little-endian fields from bytes whose length was
/// checked against the layout first.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&self.bytes[self.at..self.at + N]);
        self.at += N;
        out
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loopback() -> Descriptor {
        Descriptor {
            generation: 0x0102_0304_0506_0708,
            data: 0x1000,
            len: 0x2_0000_0001,
            stamp: 0x48,
            key: 0xdead_beef_cafe_f00d,
            endpoint: Endpoint::Loopback {
                owner_instance: *b"instance-12b",
                arena_name: *b"0123456789abcdef",
            },
        }
    }

    #[test]
    fn loopback_layout_field_by_field() {
        let bytes = loopback().encode();
        assert_eq!(bytes.len(), 76);
        assert_eq!(&bytes[0..4], b"SMGT");
        assert_eq!(bytes[4], 1, "version");
        assert_eq!(bytes[5], 3, "loopback backend");
        assert_eq!(&bytes[6..8], &[0, 0]);
        assert_eq!(&bytes[8..16], &[8, 7, 6, 5, 4, 3, 2, 1], "generation LE");
        assert_eq!(&bytes[16..24], &0x1000u64.to_le_bytes());
        assert_eq!(&bytes[24..32], &[1, 0, 0, 0, 2, 0, 0, 0], "len LE");
        assert_eq!(&bytes[32..40], &0x48u64.to_le_bytes());
        assert_eq!(&bytes[40..48], &0xdead_beef_cafe_f00du64.to_le_bytes());
        assert_eq!(&bytes[48..60], b"instance-12b", "owner instance");
        assert_eq!(&bytes[60..76], b"0123456789abcdef");
        assert_eq!(Descriptor::decode(&bytes), Ok(loopback()));
    }

    #[test]
    fn verbs_layout_field_by_field() {
        let descriptor = Descriptor {
            endpoint: Endpoint::Verbs {
                gid: [0xfe; 16],
                lid: 0x1234,
                port: 1,
            },
            ..loopback()
        };
        let bytes = descriptor.encode();
        assert_eq!(bytes.len(), 68);
        assert_eq!(bytes[5], 2, "verbs backend");
        assert_eq!(&bytes[48..64], &[0xfe; 16]);
        assert_eq!(&bytes[64..66], &[0x34, 0x12], "lid LE");
        assert_eq!(bytes[66], 1, "port");
        assert_eq!(bytes[67], 0);
        assert_eq!(Descriptor::decode(&bytes), Ok(descriptor));
    }

    #[test]
    fn anything_but_an_exact_v1_layout_is_refused() {
        let good = loopback().encode();
        assert_eq!(
            Descriptor::decode(&good[..40]),
            Err(DescriptorError::TooShort { len: 40 })
        );
        let mut bytes = good.clone();
        bytes[0] = b'X';
        assert_eq!(Descriptor::decode(&bytes), Err(DescriptorError::BadMagic));
        let mut bytes = good.clone();
        bytes[4] = 2;
        assert_eq!(
            Descriptor::decode(&bytes),
            Err(DescriptorError::UnsupportedVersion(2))
        );
        let mut bytes = good.clone();
        bytes[5] = 9;
        assert_eq!(
            Descriptor::decode(&bytes),
            Err(DescriptorError::UnknownBackend(9))
        );
        let mut bytes = good.clone();
        bytes.push(0);
        assert!(matches!(
            Descriptor::decode(&bytes),
            Err(DescriptorError::WrongLength { expected: 76, .. })
        ));
        let mut bytes = good;
        bytes[7] = 1;
        assert_eq!(
            Descriptor::decode(&bytes),
            Err(DescriptorError::ReservedNotZero)
        );
    }
}
