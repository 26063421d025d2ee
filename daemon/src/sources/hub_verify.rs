//! How a Hub parquet file is checked, from the source's `verify`, and how the default learns
//! whether a file's pages carry CRCs: by reading its first page header (one small range).
//!
//! Writers set page CRCs for a whole file (pyarrow's `write_page_checksum`), and a parquet file's
//! first column chunk starts at byte 4, so the header there says it for the file. Where it
//! carries a CRC, the file is read by ranges and every page read must carry one and match it
//! ([`Crc::Required`](super::page_check::Crc::Required)): a probe fooled by a changed byte can
//! only lead to a stop, never to an unchecked page. Anything else (no CRC, a header longer than
//! the probe, a file too short, a failed request) reads the file whole, checked against its
//! sha256: the check that needs no help from the writer.

use super::page_check::{HeaderError, parse_header};
use crate::hub::{Download, ExpectedHash};

/// Bytes of the first page header read by the probe: a header is tens of bytes, more only with
/// long statistics; one longer than this reads the file whole.
pub(crate) const PROBE_BYTES: u64 = 16 << 10;

/// Where the first page header of a parquet file starts (after the `PAR1` magic).
const FIRST_PAGE_AT: u64 = 4;

/// The error of a default read of a file with neither page CRCs nor a hash from the Hub.
pub(crate) const NO_HASH: &str = "its pages carry no CRCs and the Hub's listing gives no sha256 \
     or git blob id for it, so its bytes cannot be checked: set verify = \"pages\" or \"none\" on \
     its source to read it unchecked";

/// How one Hub parquet file is checked (the source's `verify`; `full` is a spool of its own).
pub(crate) enum Check {
    /// The default: page CRCs where the file has them ([`first_page_has_crc`]), else the whole
    /// file against this hash (none: the file cannot be checked, an error).
    Auto(Option<ExpectedHash>),
    /// `verify = "pages"`: by ranges, each page that carries a CRC checked.
    Pages,
    /// `verify = "none"`: by ranges, no CRC read.
    None,
}

/// Whether the file's first page header carries a CRC: one range request of at most
/// [`PROBE_BYTES`]. False when it cannot tell.
pub(crate) async fn first_page_has_crc(download: &Download) -> bool {
    let end = (FIRST_PAGE_AT + PROBE_BYTES).min(download.file().size);
    if end <= FIRST_PAGE_AT {
        return false;
    }
    match download.range(FIRST_PAGE_AT..end).await {
        Ok(bytes) => header_has_crc(&bytes),
        Err(error) => {
            tracing::debug!("{error}: reading the file whole instead");
            false
        }
    }
}

/// Whether `bytes` start with a page header that carries a CRC.
fn header_has_crc(bytes: &[u8]) -> bool {
    match parse_header(bytes) {
        Ok(header) => header.crc.is_some(),
        Err(HeaderError::Short | HeaderError::Malformed(_)) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_header_of_a_file_with_page_crcs_has_one_and_of_one_without_not() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let with = std::fs::read(root.join("tests/hub/data/fineweb-edu-page-crc.parquet"))
            .expect("the page-CRC fixture");
        let without =
            std::fs::read(root.join("config/samples/fineweb-edu/sample/10BT/000_00000.parquet"))
                .expect("the FineWeb-Edu sample");
        let probe = |file: &[u8]| {
            let end = (FIRST_PAGE_AT + PROBE_BYTES) as usize;
            header_has_crc(&file[FIRST_PAGE_AT as usize..end.min(file.len())])
        };
        assert!(probe(&with));
        assert!(!probe(&without));
        // Cut short or not a header: cannot tell, so read whole.
        assert!(!header_has_crc(&with[4..10]));
        assert!(!header_has_crc(b"PAR1PAR1"));
    }
}
