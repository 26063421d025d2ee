//! Parquet page headers, checked before the parquet reader decodes anything: the reader
//! allocates what a page header claims (`uncompressed_page_size`; snappy zero-fills all of it)
//! and decodes a page whole, so a file of a few KB on disk can ask for gigabytes. Every page of
//! every column chunk a source reads is walked first (headers only), and a chunk is refused,
//! naming its row group, column, page and sizes, when a page
//! - lies beyond its column chunk (a header or its bytes), or has a negative size;
//! - claims more than [`BOMB_FLOOR_BYTES`] uncompressed *and* more than [`BOMB_RATIO`] times
//!   its compressed size: a decompression bomb (text compresses 3 to 20 times; a page holding
//!   one 1 GiB document of real text passes);
//! - has a header longer than [`MAX_PAGE_HEADER_BYTES`].
//!
//! What is left to the reader is bounded by the claim: a zstd or snappy page that inflates to
//! more than it claims fails in the decoder without writing past the claimed buffer.
//!
//! Where asked ([`Crc`]; Hub range reads: bytes that crossed a network), a page whose header
//! carries a CRC (parquet-format `PageHeader.crc`: CRC-32 of the page's bytes after its header,
//! as written by pyarrow's `write_page_checksum`) has its bytes checked against it; a mismatch
//! is a [`PageFault::Crc`], and with [`Crc::Required`] a page without one is a
//! [`PageFault::NoCrc`]: the Hub reader answers both by downloading the row group again.
//!
//! The header is Thrift's compact protocol (parquet-format `PageHeader`); only the sizes, the
//! page type and the value count are read, everything else is skipped.

use std::io;

/// Uncompressed page size below which no page is a bomb, whatever its ratio.
pub(crate) const BOMB_FLOOR_BYTES: u64 = 64 << 20;
/// Uncompressed over compressed size past which a page over [`BOMB_FLOOR_BYTES`] is a bomb.
pub(crate) const BOMB_RATIO: u64 = 100;
/// The longest page header read (statistics can make headers long; 16 MiB is far past any).
pub(crate) const MAX_PAGE_HEADER_BYTES: u64 = 16 << 20;
/// Bytes read for a header at first (a header of plain pages is tens of bytes).
const FIRST_READ_BYTES: u64 = 4 << 10;
/// Nesting of Thrift structs and lists skipped at most.
const MAX_DEPTH: u32 = 32;

/// What a page header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PageHeader {
    /// parquet-format `PageType`: 0 data, 1 index, 2 dictionary, 3 data v2.
    pub page_type: i32,
    pub uncompressed_bytes: i64,
    pub compressed_bytes: i64,
    /// The header's own length in bytes.
    pub header_bytes: u64,
    /// CRC-32 of the page's bytes after the header, when the writer stored one.
    pub crc: Option<u32>,
}

/// Why a header could not be read from the bytes given.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HeaderError {
    /// The bytes end inside the header: read more.
    Short,
    Malformed(String),
}

/// Read a page header from the front of `bytes`.
pub(crate) fn parse_header(bytes: &[u8]) -> Result<PageHeader, HeaderError> {
    let mut r = Compact { bytes, at: 0 };
    let (mut page_type, mut uncompressed, mut compressed, mut crc) = (None, None, None, None);
    let mut last_id = 0i16;
    loop {
        let byte = r.byte()?;
        if byte == 0 {
            break; // STOP
        }
        let kind = byte & 0x0f;
        let delta = i16::from(byte >> 4);
        let id = if delta == 0 {
            r.zigzag()? as i16
        } else {
            last_id.wrapping_add(delta)
        };
        last_id = id;
        match (id, kind) {
            (1..=4, 5) => {
                let value = r.zigzag()?;
                let value = i32::try_from(value)
                    .map_err(|_| HeaderError::Malformed(format!("field {id} is not an i32")))?;
                match id {
                    1 => page_type = Some(value),
                    2 => uncompressed = Some(i64::from(value)),
                    3 => compressed = Some(i64::from(value)),
                    _ => crc = Some(value as u32), // the CRC's bits, stored as an i32
                }
            }
            _ => r.skip(kind, 0)?,
        }
    }
    match (page_type, uncompressed, compressed) {
        (Some(page_type), Some(uncompressed_bytes), Some(compressed_bytes)) => Ok(PageHeader {
            page_type,
            uncompressed_bytes,
            compressed_bytes,
            header_bytes: r.at as u64,
            crc,
        }),
        _ => Err(HeaderError::Malformed(
            "a page header without its type and sizes".into(),
        )),
    }
}

/// A cursor over Thrift compact-protocol bytes.
struct Compact<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Compact<'_> {
    fn byte(&mut self) -> Result<u8, HeaderError> {
        let b = *self.bytes.get(self.at).ok_or(HeaderError::Short)?;
        self.at += 1;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, HeaderError> {
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.byte()?;
            if shift == 63 && b > 1 {
                break;
            }
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(HeaderError::Malformed(
            "a varint longer than 64 bits".into(),
        ))
    }

    fn zigzag(&mut self) -> Result<i64, HeaderError> {
        let v = self.varint()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    fn skip_bytes(&mut self, n: u64) -> Result<(), HeaderError> {
        let end = u64::try_from(self.at)
            .ok()
            .and_then(|at| at.checked_add(n))
            .ok_or_else(|| HeaderError::Malformed(format!("a field of {n} bytes")))?;
        if end > MAX_PAGE_HEADER_BYTES {
            return Err(HeaderError::Malformed(format!(
                "a field of {n} bytes makes the header longer than {MAX_PAGE_HEADER_BYTES}"
            )));
        }
        if end > self.bytes.len() as u64 {
            return Err(HeaderError::Short);
        }
        self.at = end as usize;
        Ok(())
    }

    /// Skip a value of compact type `kind`.
    fn skip(&mut self, kind: u8, depth: u32) -> Result<(), HeaderError> {
        if depth > MAX_DEPTH {
            return Err(HeaderError::Malformed("nested deeper than 32".into()));
        }
        match kind {
            1 | 2 => Ok(()),                    // bool: in the type
            3 => self.skip_bytes(1),            // byte
            4..=6 => self.varint().map(|_| ()), // i16, i32, i64
            7 => self.skip_bytes(8),            // double
            8 => {
                let n = self.varint()?;
                self.skip_bytes(n)
            }
            9 | 10 => {
                let head = self.byte()?;
                let n = match head >> 4 {
                    15 => self.varint()?,
                    n => u64::from(n),
                };
                let element = head & 0x0f;
                for _ in 0..n {
                    match element {
                        1 | 2 => self.skip_bytes(1)?, // bools in a list take a byte each
                        _ => self.skip(element, depth + 1)?,
                    }
                }
                Ok(())
            }
            11 => {
                let n = self.varint()?;
                if n == 0 {
                    return Ok(());
                }
                let kinds = self.byte()?;
                for _ in 0..n {
                    self.skip(kinds >> 4, depth + 1)?;
                    self.skip(kinds & 0x0f, depth + 1)?;
                }
                Ok(())
            }
            12 => loop {
                let byte = self.byte()?;
                if byte == 0 {
                    return Ok(());
                }
                if byte >> 4 == 0 {
                    self.zigzag()?; // a long-form field id
                }
                self.skip(byte & 0x0f, depth + 1)?;
            },
            other => Err(HeaderError::Malformed(format!(
                "unknown field type {other}"
            ))),
        }
    }
}

/// Bytes of a parquet file, read at an offset: a local file, or prefetched Hub ranges.
pub(crate) trait ReadAt {
    /// Up to `len` bytes from `offset` (fewer only at the end of what is there).
    fn read_at(&mut self, offset: u64, len: usize) -> io::Result<Vec<u8>>;

    /// CRC-32 of the `len` bytes at `offset`; `None` when fewer are there.
    fn crc32_at(&mut self, offset: u64, len: usize) -> io::Result<Option<u32>> {
        let bytes = self.read_at(offset, len)?;
        Ok((bytes.len() == len).then(|| crc32fast::hash(&bytes)))
    }
}

impl ReadAt for std::fs::File {
    fn read_at(&mut self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        crate::files::read_at_most(self, offset, len)
    }
}

/// Which page CRCs [`check_chunk`] checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Crc {
    /// None (a local file; `verify = "none"`).
    Off,
    /// Each page that carries one (`verify = "pages"`).
    WherePresent,
    /// Every page's: one without a CRC is a fault (the default, for a file whose first page
    /// carries one).
    Required,
}

/// Pages walked, and how many of them had their bytes checked against a CRC.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PagesChecked {
    pub pages: u64,
    pub with_crc: u64,
}

impl PagesChecked {
    pub(crate) fn add(&mut self, other: PagesChecked) {
        self.pages += other.pages;
        self.with_crc += other.with_crc;
    }
}

/// Why a column chunk was refused; the message names the page.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PageFault {
    /// Out of bounds, a bomb, a malformed header: the file is wrong as written.
    Refused(String),
    /// The page's bytes do not match its header's CRC: changed on the way, worth reading again.
    Crc(String),
    /// A page without a CRC where every page must carry one ([`Crc::Required`]).
    NoCrc(String),
}

impl std::fmt::Display for PageFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PageFault::Refused(why) | PageFault::Crc(why) | PageFault::NoCrc(why) => {
                f.write_str(why)
            }
        }
    }
}

/// Walk every page header of the column chunk at `start..start + len` and refuse it if a page
/// is out of its bounds or a bomb (see the module doc), and check page CRCs as `crc` says.
/// `Err` is the reason, naming the page.
pub(crate) fn check_chunk(
    bytes: &mut dyn ReadAt,
    start: u64,
    len: u64,
    crc: Crc,
) -> Result<PagesChecked, PageFault> {
    let end = start.saturating_add(len);
    let (mut at, mut page) = (start, 0u64);
    let mut checked = PagesChecked::default();
    while at < end {
        let header = read_header(bytes, at, end)
            .map_err(|e| PageFault::Refused(format!("page {page}: {e}")))?;
        let (c, u) = (header.compressed_bytes, header.uncompressed_bytes);
        let body = at + header.header_bytes;
        if c < 0 || u < 0 {
            return Err(PageFault::Refused(format!(
                "page {page} at byte {at} has a negative size (compressed {c}, uncompressed {u})"
            )));
        }
        let (c, u) = (c as u64, u as u64);
        if body + c > end {
            return Err(PageFault::Refused(format!(
                "page {page} at byte {at} claims {c} compressed bytes, past its column chunk's \
                 end (byte {end})"
            )));
        }
        if u > BOMB_FLOOR_BYTES && u > c.saturating_mul(BOMB_RATIO) {
            return Err(PageFault::Refused(format!(
                "page {page} at byte {at} claims {u} bytes uncompressed from {c} compressed \
                 (over {BOMB_RATIO} times, and over {} MiB): a decompression bomb or a corrupt \
                 file",
                BOMB_FLOOR_BYTES >> 20
            )));
        }
        match (crc, header.crc) {
            (Crc::Off, _) | (Crc::WherePresent, None) => {}
            (Crc::Required, None) => {
                return Err(PageFault::NoCrc(format!(
                    "page {page} at byte {at} carries no CRC"
                )));
            }
            (_, Some(expected)) => {
                let got = bytes.crc32_at(body, c as usize).map_err(|e| {
                    PageFault::Refused(format!("page {page}: cannot read its bytes at {body}: {e}"))
                })?;
                if got != Some(expected) {
                    return Err(PageFault::Crc(format!(
                        "page {page} at byte {at}: its bytes give CRC {} where its header says \
                     {expected:08x}",
                        got.map_or("(bytes missing)".to_string(), |g| format!("{g:08x}"))
                    )));
                }
                checked.with_crc += 1;
            }
        }
        checked.pages += 1;
        at = body + c;
        page += 1;
    }
    Ok(checked)
}

/// The header of the page at `at`, reading more of the file while it is cut short.
fn read_header(bytes: &mut dyn ReadAt, at: u64, end: u64) -> Result<PageHeader, String> {
    let mut want = FIRST_READ_BYTES;
    loop {
        let len = want.min(end - at);
        let buf = bytes
            .read_at(at, len as usize)
            .map_err(|e| format!("cannot read its header at byte {at}: {e}"))?;
        match parse_header(&buf) {
            Ok(header) => return Ok(header),
            Err(HeaderError::Malformed(why)) => {
                return Err(format!("a malformed header at byte {at}: {why}"));
            }
            Err(HeaderError::Short) if len == end - at || (buf.len() as u64) < len => {
                return Err(format!(
                    "its header at byte {at} runs past its column chunk's end (byte {end})"
                ));
            }
            Err(HeaderError::Short) if want >= MAX_PAGE_HEADER_BYTES => {
                return Err(format!(
                    "its header at byte {at} is longer than {MAX_PAGE_HEADER_BYTES} bytes"
                ));
            }
            Err(HeaderError::Short) => want *= 4,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut n: u64, out: &mut Vec<u8>) {
        loop {
            let b = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    fn zigzag(v: i64, out: &mut Vec<u8>) {
        varint(((v << 1) ^ (v >> 63)) as u64, out);
    }

    /// A compact-protocol page header: type, sizes, then a data page header with statistics
    /// (a struct holding a binary of `stats` bytes).
    fn header(page_type: i32, uncompressed: i32, compressed: i32, stats: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for v in [page_type, uncompressed, compressed] {
            out.push(0x15); // the next field id, an i32
            zigzag(i64::from(v), &mut out);
        }
        out.push(0x2c); // field 5 (delta 2): struct DataPageHeader
        out.push(0x15); // its num_values
        zigzag(3, &mut out);
        out.push(0x4c); // field 5 (delta 4): struct Statistics
        out.push(0x18); // its field 1: binary
        varint(stats as u64, &mut out);
        out.extend(std::iter::repeat_n(b'x', stats));
        out.extend([0, 0, 0]); // end of Statistics, DataPageHeader, PageHeader
        out
    }

    #[test]
    fn reads_the_sizes_and_the_length_of_a_header() {
        let bytes = header(0, 5000, 1200, 10);
        let h = parse_header(&bytes).unwrap();
        assert_eq!(
            (h.page_type, h.uncompressed_bytes, h.compressed_bytes),
            (0, 5000, 1200)
        );
        assert_eq!(h.header_bytes, bytes.len() as u64);
        for cut in 0..bytes.len() {
            assert_eq!(
                parse_header(&bytes[..cut]),
                Err(HeaderError::Short),
                "{cut}"
            );
        }
    }

    struct Mem(Vec<u8>);
    impl ReadAt for Mem {
        fn read_at(&mut self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
            let from = (offset as usize).min(self.0.len());
            Ok(self.0[from..(from + len).min(self.0.len())].to_vec())
        }
    }

    /// A chunk of pages, each `(uncompressed, compressed, stats)`, with `compressed` bytes of
    /// body each.
    fn chunk(pages: &[(i32, i32, usize)]) -> Vec<u8> {
        let mut out = Vec::new();
        for &(u, c, s) in pages {
            out.extend(header(0, u, c, s));
            out.extend(std::iter::repeat_n(0u8, c.max(0) as usize));
        }
        out
    }

    #[test]
    fn a_chunk_of_honest_pages_passes_and_a_bomb_is_named() {
        let honest = chunk(&[(3000, 1000, 5), (64 << 20, 1, 0), (1 << 30, 20 << 20, 0)]);
        let len = honest.len() as u64;
        assert_eq!(
            check_chunk(&mut Mem(honest), 0, len, Crc::WherePresent),
            Ok(PagesChecked {
                pages: 3,
                with_crc: 0
            })
        );

        let bomb = chunk(&[(3000, 1000, 5), (i32::MAX, 100, 0)]);
        let at = header(0, 3000, 1000, 5).len() + 1000;
        let len = bomb.len() as u64;
        assert_eq!(
            check_chunk(&mut Mem(bomb), 0, len, Crc::WherePresent)
                .unwrap_err()
                .to_string(),
            format!(
                "page 1 at byte {at} claims 2147483647 bytes uncompressed from 100 compressed \
                 (over 100 times, and over 64 MiB): a decompression bomb or a corrupt file"
            )
        );
    }

    #[test]
    fn pages_past_their_chunk_and_negative_sizes_are_named() {
        let short = chunk(&[(3000, 1000, 5)]);
        let len = short.len() as u64 - 1;
        let err = check_chunk(&mut Mem(short), 0, len, Crc::WherePresent)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("page 0 at byte 0 claims 1000 compressed bytes, past"),
            "{err}"
        );
        let negative = chunk(&[(-5, 10, 0)]);
        let len = negative.len() as u64;
        assert_eq!(
            check_chunk(&mut Mem(negative), 0, len, Crc::WherePresent)
                .unwrap_err()
                .to_string(),
            "page 0 at byte 0 has a negative size (compressed 10, uncompressed -5)"
        );
    }

    #[test]
    fn a_long_header_is_read_in_full_and_one_past_the_chunk_is_refused() {
        let long = chunk(&[(3000, 1000, 100_000)]);
        let len = long.len() as u64;
        assert!(check_chunk(&mut Mem(long.clone()), 0, len, Crc::WherePresent).is_ok());
        let err = check_chunk(&mut Mem(long), 0, 50_000, Crc::WherePresent)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "page 0: its header at byte 0 runs past its column chunk's end (byte 50000)"
        );
    }

    #[test]
    fn hostile_headers_are_malformed_not_panics() {
        let deep: Vec<u8> = std::iter::repeat_n(0x1c, 100).collect(); // structs in structs
        assert_eq!(
            parse_header(&deep),
            Err(HeaderError::Malformed("nested deeper than 32".into()))
        );
        let huge_binary = [0x18, 0xff, 0xff, 0xff, 0xff, 0x0f];
        assert!(matches!(
            parse_header(&huge_binary),
            Err(HeaderError::Malformed(m)) if m.contains("longer than 16777216")
        ));
        assert!(matches!(
            parse_header(&[0x1d]),
            Err(HeaderError::Malformed(m)) if m == "unknown field type 13"
        ));
    }

    /// A page whose header carries the CRC of `body`, then `body`.
    fn page_with_crc(body: &[u8], crc: u32) -> Vec<u8> {
        let mut out = Vec::new();
        for v in [0, body.len() as i32, body.len() as i32, crc as i32] {
            out.push(0x15); // the next field id, an i32
            zigzag(i64::from(v), &mut out);
        }
        out.push(0x1c); // field 5 (delta 1): struct DataPageHeader
        out.push(0x15);
        zigzag(3, &mut out);
        out.extend([0, 0]); // end of DataPageHeader, PageHeader
        out.extend_from_slice(body);
        out
    }

    #[test]
    fn a_page_crc_is_checked_where_asked_and_a_flipped_byte_is_named() {
        let body = b"three rows of text".to_vec();
        let mut bytes = page_with_crc(&body, crc32fast::hash(&body));
        bytes.extend(chunk(&[(10, 10, 0)])); // a second page, without a CRC
        let len = bytes.len() as u64;
        assert_eq!(
            check_chunk(&mut Mem(bytes.clone()), 0, len, Crc::WherePresent),
            Ok(PagesChecked {
                pages: 2,
                with_crc: 1
            })
        );
        let at = page_with_crc(&body, crc32fast::hash(&body)).len() - body.len() + 4;
        bytes[at] ^= 0x01;
        let err = check_chunk(&mut Mem(bytes.clone()), 0, len, Crc::WherePresent).unwrap_err();
        let flipped = {
            let mut b = body.clone();
            b[4] ^= 0x01;
            crc32fast::hash(&b)
        };
        assert_eq!(
            err,
            PageFault::Crc(format!(
                "page 0 at byte 0: its bytes give CRC {flipped:08x} where its header says {:08x}",
                crc32fast::hash(&body)
            ))
        );
        // Required: a page without a CRC is named (the second one here).
        let second = page_with_crc(&body, crc32fast::hash(&body)).len();
        let mut honest = page_with_crc(&body, crc32fast::hash(&body));
        honest.extend(chunk(&[(10, 10, 0)]));
        assert_eq!(
            check_chunk(&mut Mem(honest), 0, len, Crc::Required),
            Err(PageFault::NoCrc(format!(
                "page 1 at byte {second} carries no CRC"
            )))
        );
        let only_crc = page_with_crc(&body, crc32fast::hash(&body));
        let only_len = only_crc.len() as u64;
        assert_eq!(
            check_chunk(&mut Mem(only_crc), 0, only_len, Crc::Required),
            Ok(PagesChecked {
                pages: 1,
                with_crc: 1
            })
        );
        // Not asked (a local file): the CRC is not read.
        assert_eq!(
            check_chunk(&mut Mem(bytes), 0, len, Crc::Off),
            Ok(PagesChecked {
                pages: 2,
                with_crc: 0
            })
        );
    }
}
