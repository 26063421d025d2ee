//! The loss report (protocol v7): a rank's summed loss and counted tokens per source for one
//! step, the second frame of a [`RequestKind::Report`](super::RequestKind::Report) request.
//! PROTOCOL.md "Loss reports".

use super::DecodeError;

/// One source's part of a step's loss on one rank.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SourceLoss {
    /// The source's index in the stream (as the batch's document sources name it).
    pub source: u16,
    /// The sum of the per-token loss over the source's counted tokens.
    pub loss_sum: f64,
    /// The tokens whose labels counted (not masked).
    pub tokens: u64,
}

/// Bytes per entry: `u32` source, `u32` reserved (zero), `f64` loss sum, `u64` tokens.
pub const REPORT_ENTRY_LEN: usize = 24;
/// The most entries a report holds (a frame stays within the daemon's 4096-byte limit).
pub const MAX_REPORT_ENTRIES: usize = 4096 / REPORT_ENTRY_LEN;

/// The report frame: each entry in order.
pub fn encode_report(entries: &[SourceLoss]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * REPORT_ENTRY_LEN);
    for e in entries {
        out.extend_from_slice(&u32::from(e.source).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&e.loss_sum.to_le_bytes());
        out.extend_from_slice(&e.tokens.to_le_bytes());
    }
    out
}

/// A report frame's entries: whole entries only, at most [`MAX_REPORT_ENTRIES`], each source
/// once and below 65535. The values themselves (finite, not negative) are the daemon's to judge.
pub fn decode_report(bytes: &[u8]) -> Result<Vec<SourceLoss>, DecodeError> {
    let bad = |why: String| Err(DecodeError::Frames(format!("loss report: {why}")));
    if !bytes.len().is_multiple_of(REPORT_ENTRY_LEN) {
        return bad(format!(
            "{} bytes is not a whole number of {REPORT_ENTRY_LEN}-byte entries",
            bytes.len()
        ));
    }
    if bytes.len() / REPORT_ENTRY_LEN > MAX_REPORT_ENTRIES {
        return bad(format!("more than {MAX_REPORT_ENTRIES} entries"));
    }
    let mut entries: Vec<SourceLoss> = Vec::with_capacity(bytes.len() / REPORT_ENTRY_LEN);
    for (k, entry) in bytes.chunks_exact(REPORT_ENTRY_LEN).enumerate() {
        let word = |at: usize| -> [u8; 8] { entry[at..at + 8].try_into().unwrap_or([0; 8]) };
        let source = u32::from_le_bytes(entry[0..4].try_into().unwrap_or([0; 4]));
        let reserved = u32::from_le_bytes(entry[4..8].try_into().unwrap_or([0; 4]));
        let Ok(source) = u16::try_from(source) else {
            return bad(format!("entry {k} names source {source}, above 65534"));
        };
        if source == u16::MAX || reserved != 0 {
            return bad(format!(
                "entry {k}: source {source} is not a source, or its reserved bytes are not zero"
            ));
        }
        if entries.iter().any(|e| e.source == source) {
            return bad(format!("source {source} comes twice"));
        }
        entries.push(SourceLoss {
            source,
            loss_sum: f64::from_le_bytes(word(8)),
            tokens: u64::from_le_bytes(word(16)),
        });
    }
    Ok(entries)
}

/// Per source, the summed loss and the counted tokens, added a run of one source's tokens at a
/// time (a row's documents are runs): what a report says.
#[derive(Clone, Debug, Default)]
pub struct SourceSums {
    sums: Vec<(f64, u64)>,
}

impl SourceSums {
    /// Add `loss`, the per-token loss of consecutive counted tokens of `source`.
    pub fn add(&mut self, source: u16, loss: &[f32]) {
        if loss.is_empty() {
            return;
        }
        let i = usize::from(source);
        if i >= self.sums.len() {
            self.sums.resize(i + 1, (0.0, 0));
        }
        let sum: f64 = loss.iter().map(|&l| f64::from(l)).sum();
        self.sums[i].0 += sum;
        self.sums[i].1 += loss.len() as u64;
    }

    /// The entries of a report: sources in increasing order, those without tokens left out.
    pub fn entries(&self) -> Vec<SourceLoss> {
        (self.sums.iter().enumerate())
            .filter(|(_, (_, tokens))| *tokens > 0)
            .map(|(source, &(loss_sum, tokens))| SourceLoss {
                source: source as u16,
                loss_sum,
                tokens,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_round_trips_and_bad_frames_are_named() {
        let entries = vec![
            SourceLoss {
                source: 0,
                loss_sum: 12.5,
                tokens: 7,
            },
            SourceLoss {
                source: 3,
                loss_sum: 0.25,
                tokens: 1,
            },
        ];
        let frame = encode_report(&entries);
        assert_eq!(frame.len(), 48);
        assert_eq!(decode_report(&frame).unwrap(), entries);
        assert_eq!(
            decode_report(&frame[..47]).unwrap_err().to_string(),
            "loss report: 47 bytes is not a whole number of 24-byte entries"
        );
        let twice = encode_report(&[entries[0], entries[0]]);
        assert_eq!(
            decode_report(&twice).unwrap_err().to_string(),
            "loss report: source 0 comes twice"
        );
        let mut far = frame.clone();
        far[0..4].copy_from_slice(&70_000u32.to_le_bytes());
        assert_eq!(
            decode_report(&far).unwrap_err().to_string(),
            "loss report: entry 0 names source 70000, above 65534"
        );
        assert_eq!(
            decode_report(&vec![0; 24 * 171]).unwrap_err().to_string(),
            "loss report: more than 170 entries"
        );
    }

    #[test]
    fn runs_add_up_per_source_in_source_order() {
        let mut sums = SourceSums::default();
        sums.add(2, &[1.0, 8.0]);
        sums.add(0, &[2.0]);
        sums.add(2, &[16.0]);
        sums.add(1, &[]);
        assert_eq!(
            sums.entries(),
            vec![
                SourceLoss {
                    source: 0,
                    loss_sum: 2.0,
                    tokens: 1
                },
                SourceLoss {
                    source: 2,
                    loss_sum: 25.0,
                    tokens: 3
                },
            ]
        );
    }
}
