//! The ExecuTorch headers that sit between the flatbuffer root offset and identifier
//! (bytes 0..8) and the flatbuffer body: `eh00` in `.pte` files, `FH01` in `.ptd` files.

use crate::error::{FormatError, Result};

/// Offset of an inserted header: right after the root offset and file identifier.
pub const HEADER_OFFSET: usize = 8;

/// The `N` bytes at `at`; zeros past the end (callers check the length first, and a
/// zero field is then rejected as malformed rather than read out of bounds).
fn bytes_at<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    let mut out = [0; N];
    if let Some(src) = at.checked_add(N).and_then(|end| bytes.get(at..end)) {
        out.copy_from_slice(src);
    }
    out
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes_at(bytes, at))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes_at(bytes, at))
}

/// Rounds `value` up to a multiple of `alignment` (a power of two or any positive number).
pub fn align_up(value: u64, alignment: u64) -> Option<u64> {
    debug_assert!(alignment > 0);
    value.div_ceil(alignment).checked_mul(alignment)
}

/// The optional `.pte` extended header (`eh00`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ProgramHeader {
    /// Header length in bytes as stored (32 today; 24 in files older than ET 1.0).
    pub length: u32,
    /// Size of the flatbuffer region from byte 0, headers included.
    pub program_size: u64,
    /// Absolute file offset of the first segment; 0 when there are none.
    pub segment_base_offset: u64,
    /// Bytes from `segment_base_offset` to the end of the last segment (absent before ET 1.0).
    pub segment_data_size: Option<u64>,
}

impl ProgramHeader {
    /// Magic bytes at offset 8.
    pub const MAGIC: &'static [u8; 4] = b"eh00";
    /// Length of the header this crate writes.
    pub const LENGTH: u32 = 32;
    /// Shortest header length accepted (the pre-1.0 form without `segment_data_size`).
    pub const MIN_LENGTH: u32 = 24;

    /// Reads the header if the file has one. `Ok(None)` means the bytes at offset 8 are not
    /// `eh00`: the file is a bare flatbuffer.
    pub fn parse(file: &[u8]) -> Result<Option<Self>> {
        let Some(magic) = file.get(HEADER_OFFSET..HEADER_OFFSET + 4) else {
            return Ok(None);
        };
        if magic != Self::MAGIC {
            return Ok(None);
        }
        let min_end = HEADER_OFFSET + Self::MIN_LENGTH as usize;
        if file.len() < min_end {
            return Err(FormatError::TooShort {
                what: "the eh00 header",
                needed: min_end as u64,
                len: file.len() as u64,
            });
        }
        let length = u32_at(file, 12);
        if length < Self::MIN_LENGTH {
            return Err(FormatError::BadHeader {
                header: "eh00",
                field: "length",
                value: length.into(),
                reason: "shorter than the 24-byte minimum",
            });
        }
        let segment_data_size = if length >= Self::LENGTH {
            let end = HEADER_OFFSET + Self::LENGTH as usize;
            if file.len() < end {
                return Err(FormatError::TooShort {
                    what: "the eh00 header",
                    needed: end as u64,
                    len: file.len() as u64,
                });
            }
            Some(u64_at(file, 32))
        } else {
            None
        };
        Ok(Some(ProgramHeader {
            length,
            program_size: u64_at(file, 16),
            segment_base_offset: u64_at(file, 24),
            segment_data_size,
        }))
    }

    /// The 32 bytes this header is written as.
    pub fn to_bytes(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out[0..4].copy_from_slice(Self::MAGIC);
        out[4..8].copy_from_slice(&Self::LENGTH.to_le_bytes());
        out[8..16].copy_from_slice(&self.program_size.to_le_bytes());
        out[16..24].copy_from_slice(&self.segment_base_offset.to_le_bytes());
        out[24..32].copy_from_slice(&self.segment_data_size.unwrap_or(0).to_le_bytes());
        out
    }
}

/// The `.ptd` header (`FH01`), always present.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DataHeader {
    /// Header length as stored (40).
    pub length: u32,
    /// Upstream writes the padded header length here (48), so that
    /// `flatbuffer_offset + flatbuffer_size` is the end of the flatbuffer region.
    pub flatbuffer_offset: u64,
    /// Size of the flatbuffer before the header was inserted.
    pub flatbuffer_size: u64,
    /// Absolute file offset of the first data segment.
    pub segment_base_offset: u64,
    /// Total bytes of segment data after `segment_base_offset`.
    pub segment_data_size: u64,
}

impl DataHeader {
    /// Magic bytes at offset 8.
    pub const MAGIC: &'static [u8; 4] = b"FH01";
    /// Length of the header as written and required.
    pub const LENGTH: u32 = 40;

    /// Reads the header; a `.ptd` file without one is malformed.
    pub fn parse(file: &[u8]) -> Result<Self> {
        let end = HEADER_OFFSET + Self::LENGTH as usize;
        if file.len() < end {
            return Err(FormatError::TooShort {
                what: "the FH01 header",
                needed: end as u64,
                len: file.len() as u64,
            });
        }
        if bytes_at::<4>(file, HEADER_OFFSET) != *Self::MAGIC {
            return Err(FormatError::BadHeader {
                header: "FH01",
                field: "magic",
                value: u32_at(file, HEADER_OFFSET).into(),
                reason: "expected \"FH01\" at offset 8",
            });
        }
        let length = u32_at(file, 12);
        if length < Self::LENGTH {
            return Err(FormatError::BadHeader {
                header: "FH01",
                field: "length",
                value: length.into(),
                reason: "shorter than 40 bytes",
            });
        }
        Ok(DataHeader {
            length,
            flatbuffer_offset: u64_at(file, 16),
            flatbuffer_size: u64_at(file, 24),
            segment_base_offset: u64_at(file, 32),
            segment_data_size: u64_at(file, 40),
        })
    }

    /// The 40 bytes this header is written as.
    pub fn to_bytes(&self) -> [u8; 40] {
        let mut out = [0u8; 40];
        out[0..4].copy_from_slice(Self::MAGIC);
        out[4..8].copy_from_slice(&Self::LENGTH.to_le_bytes());
        out[8..16].copy_from_slice(&self.flatbuffer_offset.to_le_bytes());
        out[16..24].copy_from_slice(&self.flatbuffer_size.to_le_bytes());
        out[24..32].copy_from_slice(&self.segment_base_offset.to_le_bytes());
        out[32..40].copy_from_slice(&self.segment_data_size.to_le_bytes());
        out
    }
}

/// Checks the identifier at bytes 4..8: exactly `expected`, or a clear error that tells an
/// other version of the same format (same two letters, two other digits) from another file.
pub(crate) fn check_identifier(
    file: &[u8],
    expected: &'static str,
    format: &'static str,
) -> Result<()> {
    if file.len() < HEADER_OFFSET {
        return Err(FormatError::TooShort {
            what: "the flatbuffer root offset and identifier",
            needed: HEADER_OFFSET as u64,
            len: file.len() as u64,
        });
    }
    let found: [u8; 4] = bytes_at(file, 4);
    if found == expected.as_bytes() {
        return Ok(());
    }
    let shown = String::from_utf8_lossy(&found).into_owned();
    let (family, version) = found.split_at(2);
    if expected.as_bytes().starts_with(family) && version.iter().all(u8::is_ascii_digit) {
        return Err(FormatError::UnsupportedVersion {
            format,
            found: shown,
            supported: expected,
        });
    }
    let hint = match &found {
        b"ET12" => " (this is a .pte program)",
        b"FT01" => " (this is a .ptd data file)",
        b"BP08" => " (this is a .bpte bundled program)",
        _ => "",
    };
    Err(FormatError::WrongIdentifier {
        expected: format,
        found: shown,
        hint,
    })
}

/// Inserts `header` (already padded) at byte 8 of a finished flatbuffer and moves the root
/// offset past it, exactly as upstream's serializer does.
pub(crate) fn insert_header(flatbuffer: &[u8], padded_header: &[u8]) -> Result<Vec<u8>> {
    let root = u32_at(flatbuffer, 0);
    let moved = u32::try_from(padded_header.len())
        .ok()
        .and_then(|n| root.checked_add(n))
        .ok_or_else(|| FormatError::overflow("root offset"))?;
    let mut out = Vec::with_capacity(flatbuffer.len() + padded_header.len());
    out.extend_from_slice(&moved.to_le_bytes());
    let (prefix, body) = flatbuffer.split_at(HEADER_OFFSET.min(flatbuffer.len()));
    out.extend_from_slice(prefix.get(4..).unwrap_or_default());
    out.extend_from_slice(padded_header);
    out.extend_from_slice(body);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_header_round_trips() {
        let h = ProgramHeader {
            length: 32,
            program_size: 0xae0,
            segment_base_offset: 0xb00,
            segment_data_size: Some(0x44),
        };
        let mut file = vec![0x3c, 0, 0, 0, b'E', b'T', b'1', b'2'];
        file.extend_from_slice(&h.to_bytes());
        assert_eq!(ProgramHeader::parse(&file).unwrap(), Some(h));
        file[8] = b'x';
        assert_eq!(ProgramHeader::parse(&file).unwrap(), None);
    }

    #[test]
    fn old_24_byte_header_has_no_segment_data_size() {
        let mut file = vec![0u8; 40];
        file[8..12].copy_from_slice(b"eh00");
        file[12..16].copy_from_slice(&24u32.to_le_bytes());
        file[16..24].copy_from_slice(&100u64.to_le_bytes());
        let h = ProgramHeader::parse(&file).unwrap().unwrap();
        assert_eq!(h.segment_data_size, None);
        assert_eq!(h.program_size, 100);
        file[12..16].copy_from_slice(&8u32.to_le_bytes());
        assert!(ProgramHeader::parse(&file).is_err());
    }

    #[test]
    fn identifiers_are_told_apart() {
        let mut file = *b"\0\0\0\0ET12";
        assert!(check_identifier(&file, "ET12", ".pte").is_ok());
        file[6..8].copy_from_slice(b"13");
        assert!(matches!(
            check_identifier(&file, "ET12", ".pte"),
            Err(FormatError::UnsupportedVersion { .. })
        ));
        file[4..8].copy_from_slice(b"FT01");
        assert!(matches!(
            check_identifier(&file, "ET12", ".pte"),
            Err(FormatError::WrongIdentifier { .. })
        ));
        assert!(check_identifier(&file[..5], "ET12", ".pte").is_err());
    }
}
