//! The delegate payload's outer layout: an optional `XH00` header, the XNNGraph
//! flatbuffer, and the constant data region.
//!
//! With a header (upstream's writer since 2023): bytes 4..8 are `XH00`, then a u16 header
//! length, u32 flatbuffer offset and size, u32 constant data offset and u64 size, all
//! little-endian. Without one, the whole payload is the flatbuffer. The flatbuffer's
//! identifier must be `XN00` (runtime schema) or `XN01` (writer schema); the two are
//! binary compatible.

use crate::error::{Result, XnnError};

/// Where the header says the parts are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The flatbuffer: offset and length in the payload.
    pub flatbuffer: (usize, usize),
    /// The constant region: offset and length in the payload (empty without header).
    pub constants: (usize, usize),
    /// Whether the payload has an `XH00` header.
    pub has_header: bool,
}

/// The header's magic, at bytes 4..8.
pub const HEADER_MAGIC: &[u8; 4] = b"XH00";
/// Smallest header upstream accepts.
const HEADER_MIN: usize = 30;
/// Flatbuffer identifiers accepted.
pub const IDENTIFIERS: [&[u8; 4]; 2] = [b"XN00", b"XN01"];

fn le<const N: usize>(bytes: &[u8], at: usize, field: &str) -> Result<[u8; N]> {
    bytes
        .get(at..at + N)
        .and_then(|b| <[u8; N]>::try_from(b).ok())
        .ok_or_else(|| XnnError::payload(format!("header field {field} lies past the payload")))
}

/// Finds the parts of a payload; every offset and size checked against its length.
pub fn layout(payload: &[u8]) -> Result<Layout> {
    let has_header = payload.len() >= HEADER_MIN && payload.get(4..8) == Some(&HEADER_MAGIC[..]);
    let layout = if has_header {
        let header_len = u16::from_le_bytes(le(payload, 8, "header_length")?) as usize;
        if header_len < HEADER_MIN {
            return Err(XnnError::payload(format!(
                "header length {header_len} is less than {HEADER_MIN}"
            )));
        }
        let fb_offset = u32::from_le_bytes(le(payload, 10, "flatbuffer_offset")?) as usize;
        let fb_size = u32::from_le_bytes(le(payload, 14, "flatbuffer_size")?) as usize;
        let cd_offset = u32::from_le_bytes(le(payload, 18, "constant_data_offset")?) as usize;
        let cd_size = u64::from_le_bytes(le(payload, 22, "constant_data_size")?);
        let len = payload.len();
        let fb_end = fb_offset
            .checked_add(fb_size)
            .filter(|&e| e <= len)
            .ok_or_else(|| {
                XnnError::payload(format!(
                    "flatbuffer {fb_offset}..+{fb_size} lies outside the {len}-byte payload"
                ))
            })?;
        if fb_size < 8 {
            return Err(XnnError::payload(format!(
                "flatbuffer_size {fb_size} is too small for a flatbuffer"
            )));
        }
        let cd_size = usize::try_from(cd_size)
            .ok()
            .filter(|&s| cd_offset.checked_add(s).is_some_and(|e| e <= len))
            .ok_or_else(|| {
                XnnError::payload(format!(
                    "constant data {cd_offset}..+{cd_size} lies outside the {len}-byte payload"
                ))
            })?;
        if cd_offset < fb_end {
            return Err(XnnError::payload(format!(
                "constant data at {cd_offset} starts inside the flatbuffer (which ends at {fb_end})"
            )));
        }
        Layout {
            flatbuffer: (fb_offset, fb_size),
            constants: (cd_offset, cd_size),
            has_header,
        }
    } else {
        Layout {
            flatbuffer: (0, payload.len()),
            constants: (0, 0),
            has_header,
        }
    };
    let (off, size) = layout.flatbuffer;
    let fb = payload.get(off..off + size).unwrap_or_default();
    let id = fb.get(4..8).unwrap_or_default();
    if !IDENTIFIERS.iter().any(|i| &i[..] == id) {
        return Err(XnnError::payload(format!(
            "flatbuffer identifier {:?} is not XN00 or XN01 (not an XNNPACK payload, or a \
             format version this build does not know)",
            String::from_utf8_lossy(id)
        )));
    }
    Ok(layout)
}

/// Writes a payload as upstream's serializer lays it out: the `XH00` header padded to
/// 32 bytes, the graph (identifier `XN01`) padded to 16, then the constant region.
/// Tests and the fuzzer build payloads with it.
pub fn write(graph: &crate::schema::fb_xnnpack::XnnGraph, constants: &[u8]) -> Result<Vec<u8>> {
    let fb = pte_format::finish_flatbuffer(graph, "XN01")
        .map_err(|e| XnnError::payload(format!("writing the graph: {e}")))?;
    let fb_padded = fb.len().div_ceil(16) * 16;
    let cd_offset = 32 + fb_padded;
    let mut out = Vec::with_capacity(cd_offset + constants.len());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(HEADER_MAGIC);
    out.extend_from_slice(&(HEADER_MIN as u16).to_le_bytes());
    out.extend_from_slice(&32u32.to_le_bytes());
    out.extend_from_slice(&(fb.len() as u32).to_le_bytes());
    out.extend_from_slice(&(cd_offset as u32).to_le_bytes());
    out.extend_from_slice(&(constants.len() as u64).to_le_bytes());
    out.resize(32, 0);
    out.extend_from_slice(&fb);
    out.resize(cd_offset, 0);
    out.extend_from_slice(constants);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(fb_off: u32, fb_size: u32, cd_off: u32, cd_size: u64, total: usize) -> Vec<u8> {
        let mut b = vec![0u8; total];
        b[4..8].copy_from_slice(HEADER_MAGIC);
        b[8..10].copy_from_slice(&30u16.to_le_bytes());
        b[10..14].copy_from_slice(&fb_off.to_le_bytes());
        b[14..18].copy_from_slice(&fb_size.to_le_bytes());
        b[18..22].copy_from_slice(&cd_off.to_le_bytes());
        b[22..30].copy_from_slice(&cd_size.to_le_bytes());
        if total >= fb_off as usize + 8 {
            b[fb_off as usize + 4..fb_off as usize + 8].copy_from_slice(b"XN01");
        }
        b
    }

    #[test]
    fn a_header_gives_the_parts() {
        let b = header(32, 16, 48, 16, 64);
        let l = layout(&b).unwrap();
        assert_eq!(l.flatbuffer, (32, 16));
        assert_eq!(l.constants, (48, 16));
        assert!(l.has_header);
    }

    #[test]
    fn bad_headers_are_errors_naming_the_field() {
        let e = layout(&header(32, 64, 96, 0, 64)).unwrap_err().to_string();
        assert!(e.contains("flatbuffer 32..+64 lies outside"), "{e}");
        let e = layout(&header(32, 16, 48, u64::MAX, 64))
            .unwrap_err()
            .to_string();
        assert!(e.contains("constant data 48"), "{e}");
        let e = layout(&header(32, 16, 40, 8, 64)).unwrap_err().to_string();
        assert!(e.contains("starts inside the flatbuffer"), "{e}");
        let e = layout(&header(32, 4, 48, 0, 64)).unwrap_err().to_string();
        assert!(e.contains("too small"), "{e}");
        let mut b = header(32, 16, 48, 0, 64);
        b[8..10].copy_from_slice(&2u16.to_le_bytes());
        assert!(layout(&b)
            .unwrap_err()
            .to_string()
            .contains("header length 2"));
    }

    #[test]
    fn without_a_header_the_payload_is_the_flatbuffer() {
        let mut b = vec![0u8; 16];
        b[4..8].copy_from_slice(b"XN00");
        let l = layout(&b).unwrap();
        assert_eq!(l.flatbuffer, (0, 16));
        assert!(!l.has_header);
        b[4..8].copy_from_slice(b"ET12");
        assert!(layout(&b).unwrap_err().to_string().contains("identifier"));
        assert!(layout(&[]).is_err());
    }
}
