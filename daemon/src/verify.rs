//! `dsprep verify DIR`: checks a packed directory end to end — every file's size and sha256
//! against the manifest, the document index's structure, that every token id is below the
//! vocabulary size, the stream chain the manifest records (format 2), and its phase ledger
//! (format 4: recounted from the windows, each document in the phase of its mixing position,
//! `doc_positions.u64` where the pack has it), and padding (format 5: every window starts a document,
//! holds its documents before its padding, and pads with the manifest's pad id; the padding
//! adds up to the manifest's), each window by its own segment's packing in a lineage whose
//! packing changed (format 7: a `concat` segment's windows are real tokens to their end, a
//! `best_fit` one's padded with its pad id). Reports the first problem with the file it is in.

use crate::files::sha256_file;
use crate::window_packing::WindowPacking;
use anyhow::{Context, bail, ensure};
use dsprep_client::PackedDataset;
use dsprep_client::chain;
use dsprep_client::format::{self, OutputFile};
use dsprep_mixers::ledger::PhaseLedger;
use std::path::Path;

pub struct VerifyReport {
    pub num_windows: u64,
    pub num_files: usize,
    pub num_tokens: u64,
}

pub fn verify(dir: &Path) -> anyhow::Result<VerifyReport> {
    let dataset = PackedDataset::open(dir)
        .with_context(|| format!("{} is not a valid packed directory", dir.display()))?;
    let m = dataset.manifest();
    let mut files: Vec<&OutputFile> = m.shards.iter().collect();
    files.push(&m.doc_starts);
    files.push(&m.doc_starts_offsets);
    files.extend(m.doc_sources.iter().chain(&m.lead_sources));
    files.extend(&m.real_tokens);
    files.extend(&m.doc_positions);
    ensure!(
        m.real_tokens.is_some() == m.packing.is_some(),
        "{}: real_tokens and packing go together (format 5)",
        dir.join(format::MANIFEST_FILE).display()
    );
    for entry in &files {
        let path = dir.join(&entry.file);
        let (size, sha256) =
            sha256_file(&path).with_context(|| format!("cannot read {}", path.display()))?;
        ensure!(
            size == entry.size_bytes,
            "{}: is {size} bytes, the manifest says {}",
            path.display(),
            entry.size_bytes
        );
        ensure!(
            sha256 == entry.sha256,
            "{}: sha256 is {sha256}, the manifest says {} (the file changed after packing)",
            path.display(),
            entry.sha256
        );
    }
    let tokenizer = dir.join(&m.tokenizer.file);
    let (_, sha256) =
        sha256_file(&tokenizer).with_context(|| format!("cannot read {}", tokenizer.display()))?;
    ensure!(
        sha256 == m.tokenizer.sha256,
        "{}: sha256 is {sha256}, the manifest says {}",
        tokenizer.display(),
        m.tokenizer.sha256
    );

    if m.format_version >= 2 {
        ensure!(
            m.chain.last().map(|c| c.windows) == Some(m.num_windows)
                && m.chain.windows(2).all(|p| p[0].windows < p[1].windows),
            "{}: the stream chain's marks must increase and end at window {}",
            dir.join(format::MANIFEST_FILE).display(),
            m.num_windows
        );
    }
    // Format 4: the phase ledger, recounted from the windows as the pack counted it.
    let mut ledger = match m.phases.is_empty() {
        true => None,
        false => {
            let points = crate::inspect::phase_points(m)?;
            let counts = PhaseLedger::new(&points, m.sources.len());
            Some((points, counts))
        }
    };
    let padding = WindowPacking::of(m)?;
    let mut marks = m.chain.iter().peekable();
    let mut at = chain::START;
    let mut total_starts = 0u64;
    let mut real_tokens = 0u64;
    for index in 0..dataset.num_windows() {
        let window = dataset.window(index)?;
        at = chain::link(&at, &chain::window_digest(window.tokens.as_bytes()));
        if let Some(mark) = marks.next_if(|mark| mark.windows == index + 1) {
            ensure!(
                mark.chain == chain::to_hex(&at),
                "window {index}: the stream chain after it is {}, the manifest says {} (the \
                 windows are not the ones packed)",
                chain::to_hex(&at),
                mark.chain
            );
        }
        ensure!(
            window.tokens.len() == m.window_tokens as usize,
            "window {index}: has {} tokens, expected {}",
            window.tokens.len(),
            m.window_tokens
        );
        if let Some(bad) = (0..window.tokens.len())
            .map(|i| window.tokens.get(i).unwrap_or(0))
            .find(|&t| t >= m.tokenizer.vocab_size)
        {
            bail!(
                "window {index}: token id {bad} is not below the vocabulary size {}",
                m.tokenizer.vocab_size
            );
        }
        let starts = window.doc_starts;
        ensure!(
            starts.windows(2).all(|p| p[0] < p[1]),
            "window {index}: document starts {starts:?} are not strictly increasing"
        );
        ensure!(
            starts.iter().all(|&s| s < m.window_tokens),
            "window {index}: a document start lies outside the window: {starts:?}"
        );
        total_starts += starts.len() as u64;
        real_tokens += u64::from(window.real_tokens);
        let real = window.real_tokens;
        match padding.pad_at(index) {
            Some(pad_id) => {
                ensure!(
                    starts.first() == Some(&0) && starts.iter().all(|&s| s < real),
                    "window {index}: with padding every window starts a document at 0 and every \
                     start lies before its {real} real tokens: {starts:?}"
                );
                ensure!(
                    (real as usize..window.tokens.len())
                        .all(|i| window.tokens.get(i) == Some(pad_id)),
                    "window {index}: a token after its {real} real tokens is not the pad id \
                     {pad_id}"
                );
            }
            None => ensure!(
                real == m.window_tokens,
                "window {index}: a concat window holds {real} real tokens, not all {}",
                m.window_tokens
            ),
        }
        if let (Some((points, counts)), Some(sources), Some(lead)) =
            (&mut ledger, window.doc_sources, window.lead_source)
        {
            let len = u64::from(window.real_tokens);
            let positions = window.doc_positions.unwrap_or_default();
            counts.add_window_at(points, index, len, starts, sources, lead, positions);
        }
    }
    if let Some((_, counts)) = &ledger {
        check_phases(dir, m, counts)?;
    }
    ensure!(
        total_starts == m.num_doc_starts,
        "the index holds {total_starts} document starts, the manifest says {}",
        m.num_doc_starts
    );
    let expected_tokens: u64 = m.sources.iter().map(|s| s.tokens).sum();
    ensure!(
        real_tokens + m.dropped_tail_tokens == expected_tokens,
        "windows hold {real_tokens} tokens (padding aside) and {} were dropped, but the sources \
         produced {expected_tokens}",
        m.dropped_tail_tokens
    );
    if let Some(packing) = &m.packing {
        let padding = m.num_windows * u64::from(m.window_tokens) - real_tokens;
        ensure!(
            padding == packing.padding_tokens,
            "the windows hold {padding} tokens of padding, the manifest says {}",
            packing.padding_tokens
        );
    }
    Ok(VerifyReport {
        num_windows: m.num_windows,
        num_files: files.len() + 1,
        num_tokens: real_tokens,
    })
}

/// The manifest's phase ledger against the one recounted from the windows.
fn check_phases(dir: &Path, m: &format::Manifest, counts: &PhaseLedger) -> anyhow::Result<()> {
    let manifest = dir.join(format::MANIFEST_FILE);
    ensure!(
        m.phases.len() == counts.phases.len(),
        "{}: the ledger has {} phases, the recipe {}",
        manifest.display(),
        m.phases.len(),
        counts.phases.len()
    );
    for (phase, (stats, counted)) in m.phases.iter().zip(&counts.phases).enumerate() {
        for (i, s) in stats.sources.iter().enumerate() {
            let (tokens, documents) = (counted.tokens[i], counted.documents[i]);
            ensure!(
                (s.tokens, s.documents) == (tokens, documents),
                "{}: phase {phase}, source {:?}: the windows hold {tokens} tokens and {documents} \
                 document starts, the manifest says {} and {}",
                manifest.display(),
                s.name,
                s.tokens,
                s.documents
            );
        }
    }
    Ok(())
}

/// Check that the packed directory `dir` packs the lineage at `lineage` (a daemon's state
/// directory, or its `lineage.json`): its manifest lists the same segments, each recipe taking
/// over at the same step, window and document with the same global batch. Reports the first
/// segment that differs.
pub fn verify_lineage(dir: &Path, lineage: &Path) -> anyhow::Result<()> {
    let dataset = PackedDataset::open(dir)
        .with_context(|| format!("{} is not a valid packed directory", dir.display()))?;
    let want = crate::serve::read_lineage(lineage)?;
    let Some(got) = &dataset.manifest().lineage else {
        bail!(
            "{} packs one recipe, not a lineage (pack it with dsprep pack --lineage {})",
            dir.display(),
            lineage.display()
        );
    };
    let place = |(hash, step, window, documents, batch): (&str, u64, u64, u64, u64)| {
        format!(
            "recipe {hash} from step {step} (window {window}, document {documents}), {batch} \
             windows a step"
        )
    };
    let packed: Vec<String> = (got.iter())
        .map(|s| {
            (
                &*s.recipe_hash,
                s.from_step,
                s.from_window,
                s.from_documents,
                s.global_batch,
            )
        })
        .map(place)
        .collect();
    let served: Vec<String> = (want.segments.iter())
        .map(|s| {
            (
                &*s.recipe_hash,
                s.from_step,
                s.from_window,
                s.from_documents,
                s.global_batch,
            )
        })
        .map(place)
        .collect();
    for k in 0..packed.len().max(served.len()) {
        let (packed, served) = (packed.get(k), served.get(k));
        if packed != served {
            bail!(
                "{} does not pack the lineage {}: segment {k} is {} in the pack, {} in the lineage",
                dir.display(),
                lineage.display(),
                packed.map_or("absent", String::as_str),
                served.map_or("absent", String::as_str)
            );
        }
    }
    // Format 7: each segment packed by its recipe's strategy, from where its recipe takes over.
    for (k, (got, want)) in got.iter().zip(&want.segments).enumerate() {
        let Some(packing) = &got.packing else {
            continue;
        };
        let strategy = want.recipe.packing.strategy.name();
        ensure!(
            packing.strategy == strategy && packing.first_window >= got.from_window,
            "{} does not pack the lineage {}: segment {k} packs with {} from window {} in the \
             pack, with {strategy} from window {} on in the lineage",
            dir.display(),
            lineage.display(),
            packing.strategy,
            packing.first_window,
            got.from_window
        );
    }
    // Where the segments take over, the windows must be there.
    let last = want.segments.last().map_or(0, |s| s.from_window);
    ensure!(
        dataset.num_windows() >= last,
        "{} holds {} windows, the lineage's last segment takes over at window {last}",
        dir.display(),
        dataset.num_windows()
    );
    Ok(())
}
