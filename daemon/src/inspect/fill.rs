//! How full a packed directory's windows are and which documents they cut: the window-fill
//! histogram (`inspect --plot` draws it for a padded pack) and the count of documents that would
//! fit in one window but span two or more (`concat` cuts them wherever a window ends; `best_fit`
//! cuts none). Read from the document index and the real-token counts only, never the tokens.

use crate::window_packing::WindowPacking;
use dsprep_client::PackedDataset;
use std::fmt::Write;

/// Buckets of the fill histogram: bucket `k` counts windows whose real tokens are a share in
/// `(k / FILL_BUCKETS, (k + 1) / FILL_BUCKETS]` of the window (a full window is in the last).
pub const FILL_BUCKETS: usize = 20;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WindowFill {
    /// Whether the directory has padding (format 5, or 7 with a padded segment).
    pub padded: bool,
    pub windows: u64,
    pub padding_tokens: u64,
    pub histogram: [u64; FILL_BUCKETS],
    /// Documents whose start and end both lie in the windows, of at most a window's tokens.
    pub fitting_documents: u64,
    /// Of those, the ones whose tokens lie in more than one window.
    pub fitting_documents_cut: u64,
}

pub fn window_fill(dataset: &PackedDataset) -> anyhow::Result<WindowFill> {
    let m = dataset.manifest();
    let window_tokens = u64::from(m.window_tokens);
    let mut fill = WindowFill {
        padded: m.real_tokens.is_some(),
        windows: dataset.num_windows(),
        ..WindowFill::default()
    };
    // Which windows are padded: all, none, or (format 7) those of padded segments.
    let packing = WindowPacking::of(m)?;
    // The open document: the window and offset where it starts.
    let mut open: Option<(u64, u64)> = None;
    for w in 0..dataset.num_windows() {
        let window = dataset.window(w)?;
        let real = u64::from(window.real_tokens);
        fill.padding_tokens += window_tokens - real;
        let bucket = (real * FILL_BUCKETS as u64).div_ceil(window_tokens.max(1));
        fill.histogram[(bucket as usize).clamp(1, FILL_BUCKETS) - 1] += 1;
        for &start in window.doc_starts {
            let Some((from_w, from)) = open.replace((w, u64::from(start))) else {
                continue;
            };
            if packing.pad_at(from_w).is_some() {
                // A padded window's documents never continue into another window.
                fill.fitting_documents += 1;
                continue;
            }
            // The previous document ends just before this start (in the stream's tokens).
            let begin = from_w * window_tokens + from;
            let end = w * window_tokens + u64::from(start);
            if end - begin <= window_tokens {
                fill.fitting_documents += 1;
                fill.fitting_documents_cut += u64::from((end - 1) / window_tokens != from_w);
            }
        }
    }
    Ok(fill)
}

impl WindowFill {
    /// The lines `inspect --mix` prints about the windows.
    pub fn lines(&self) -> String {
        let mut out = String::new();
        let cut_share = match self.fitting_documents {
            0 => 0.0,
            n => 100.0 * self.fitting_documents_cut as f64 / n as f64,
        };
        let _ = writeln!(
            out,
            "documents that fit in a window: {}, cut across windows: {} ({cut_share:.1}%)",
            self.fitting_documents, self.fitting_documents_cut
        );
        if self.padded {
            let total = self.windows.max(1) as f64;
            let full = self.histogram[FILL_BUCKETS - 1] as f64 / total;
            let _ = writeln!(
                out,
                "padding: {} tokens; windows filled over 95%: {:.1}%",
                self.padding_tokens,
                100.0 * full
            );
        }
        out
    }
}
