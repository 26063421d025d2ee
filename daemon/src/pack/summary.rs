//! The end-of-pack summary: documents and tokens per source, their realized shares against the
//! target (in the recipe's `[mix] unit`), windows.

use super::PackReport;
use crate::inspect::ledger_rows;
use dsprep_client::Manifest;
use dsprep_mixers::ledger::ShareLine;

/// The summary's first line: what the recipe's weights are shares of. A mix in documents (the
/// default, as HF `interleave_datasets`) gives sources of long documents far more than their
/// weight in tokens (the quickstart's the-stack-v2: 10 % weight, 59 % of the tokens), which is
/// not what most recipes mean, so it is said first, loudly.
pub fn mix_unit_line(in_tokens: bool) -> &'static str {
    if in_tokens {
        "mix: in TOKENS ([mix] unit = \"tokens\"): each weight is its source's share of the \
         stream's tokens"
    } else {
        "mix: by DOCUMENTS ([mix] unit = \"documents\", the default): each weight is its source's \
         share of the documents, NOT of the tokens; set [mix] unit = \"tokens\" for shares of tokens"
    }
}

pub fn print_summary(report: &PackReport) {
    let m = &report.manifest;
    println!("{}", mix_unit_line(m.recipe["mix"]["unit"] == "tokens"));
    let tokens_written = m.num_windows * u64::from(m.window_tokens);
    let secs = report.wall.as_secs_f64().max(1e-9);
    let all_tokens: u64 = m.sources.iter().map(|s| s.tokens).sum();
    println!(
        "packed {} windows of {} tokens ({} tokens, {}) into {} in {:.2} s — {:.0} tokens/s with {} tokenizer thread(s)",
        m.num_windows,
        m.window_tokens,
        tokens_written,
        format!("{:?}", m.dtype).to_lowercase(),
        report.out.display(),
        secs,
        all_tokens as f64 / secs,
        report.threads,
    );
    println!("tokenizer engine: {}", report.engine);
    if let Some(first) = report.time_to_first_window {
        println!("first window after {:.2} s", first.as_secs_f64());
    }
    // The target is a share of documents or of tokens, as the recipe's `[mix] unit` says.
    let in_tokens = m.recipe["mix"]["unit"] == "tokens";
    println!(
        "{:<16} {:>10} {:>10} {:>8} {:>8} {:>12} {:>8} {:>8} {:>8} {:>8}",
        "source",
        "documents",
        "rows read",
        "filtered",
        "empty",
        "tokens",
        "docs %",
        "tokens %",
        if in_tokens { "target t" } else { "target d" },
        "off by"
    );
    for s in &m.sources {
        let realized = match in_tokens {
            true => s.realized_token_fraction,
            false => s.realized_fraction,
        };
        println!(
            "{:<16} {:>10} {:>10} {:>8} {:>8} {:>12} {:>7.2}% {:>7.2}% {:>7.2}% {:>+7.2}%",
            s.name,
            s.documents,
            s.rows_read,
            s.rows_filtered,
            s.rows_empty,
            s.tokens,
            100.0 * s.realized_fraction,
            100.0 * s.realized_token_fraction,
            100.0 * s.target_fraction,
            100.0 * (realized - s.target_fraction)
        );
    }
    let phased = m.phases.len() > 1;
    println!(
        "target: {}{} (recipe [mix] unit); off by: realized minus target, in points",
        if in_tokens {
            "share of tokens"
        } else {
            "share of documents"
        },
        if phased { " in phase 0" } else { "" }
    );
    if phased {
        print_phases(m);
    }
    if let Some(lineage) = &m.lineage {
        print_lineage(lineage);
    }
    for s in m.sources.iter().filter(|s| s.rows_oversize > 0) {
        println!(
            "source {:?}: {} rows over max_document_bytes skipped (oversize = \"skip\")",
            s.name, s.rows_oversize
        );
    }
    for s in m.sources.iter().filter(|s| s.rows_split > 0) {
        println!(
            "source {:?}: {} rows over max_document_bytes split into {} pieces (oversize = \
             \"split\"; each piece one document)",
            s.name, s.rows_split, s.split_pieces
        );
    }
    if let Some(p) = &m.packing {
        let window_tokens = m.num_windows * u64::from(m.window_tokens);
        println!(
            "packing: best_fit, pool of {} documents: padding {} tokens ({:.2}% of the windows' \
             tokens, pad id {}); {} documents longer than a window cut into {} pieces, no other \
             document cut; pool peak {} documents, {} tokens",
            p.pool_documents,
            p.padding_tokens,
            100.0 * p.padding_tokens as f64 / window_tokens.max(1) as f64,
            p.pad_id,
            p.documents_cut,
            p.cut_pieces,
            p.pool_peak_documents,
            p.pool_peak_tokens
        );
    }
    if m.recipe.get("lanes").is_some() {
        println!(
            "dropped tail: {} tokens (each lane's last partial window, and what the longer lanes \
             hold past the end of the stream)",
            m.dropped_tail_tokens
        );
    } else {
        println!(
            "dropped tail: {} tokens (less than one window)",
            m.dropped_tail_tokens
        );
    }
    println!(
        "recipe {}  tokenizer sha256 {}",
        m.recipe_hash, m.tokenizer.sha256
    );
}

/// A lineage's ledger: per segment, where its recipe took over, and per source its target and
/// realized shares (in that recipe's unit), documents and tokens; what each change dropped.
fn print_lineage(lineage: &[dsprep_client::format::LineageSegment]) {
    for (k, s) in lineage.iter().enumerate() {
        println!(
            "segment {k}: recipe {} from step {} (window {}, document {}), {} windows a step",
            s.recipe_hash, s.from_step, s.from_window, s.from_documents, s.global_batch
        );
        for source in s
            .sources
            .iter()
            .filter(|x| x.documents > 0 || x.target_fraction > 0.0)
        {
            println!(
                "  {:<16} target {:>6.2}%  realized {:>6.2}%  {:>10} documents {:>12} tokens",
                source.name,
                100.0 * source.target_fraction,
                100.0 * source.realized_fraction,
                source.documents,
                source.tokens
            );
        }
        for d in &s.dropped {
            println!(
                "  {:<16} {} documents drawn but not emitted, dropped at the change",
                d.source, d.documents
            );
        }
    }
}

/// The manifest's ledger of every phase (counted over the windows), and a warning for each
/// phase the stream never reached.
fn print_phases(m: &Manifest) {
    let names: Vec<String> = m.sources.iter().map(|s| s.name.clone()).collect();
    let stopping = m.recipe["mix"]["stopping"]
        .as_str()
        .unwrap_or("its stopping strategy");
    let windows_tokens = m.num_windows * u64::from(m.window_tokens);
    for phase in &m.phases {
        let Some(began) = phase.began_at_tokens else {
            println!(
                "warning: the stream ended at {windows_tokens} tokens, before phase {}'s point \
                 ({} tokens): that phase never began (under {stopping} the sources ran out first)",
                phase.phase, phase.at_tokens
            );
            continue;
        };
        let lanes = match phase.all_lanes_began_at_tokens {
            Some(last) if phase.phase > 0 => format!(", the last lane's from {last}"),
            _ => String::new(),
        };
        println!(
            "phase {} (at {} tokens; its first document at {began}{lanes}): {} tokens and {} \
             document starts in windows",
            phase.phase, phase.at_tokens, phase.tokens, phase.documents
        );
        let lines: Vec<ShareLine> = (phase.sources.iter())
            .map(|s| ShareLine {
                target: s.target_fraction,
                token_share: s.realized_token_fraction,
                document_share: s.realized_fraction,
                deviation: s.deviation,
            })
            .collect();
        print!("{}", ledger_rows(&names, &lines));
    }
}

/// What a part packed, and what to run next.
pub fn print_part(report: &super::PartReport) {
    println!(
        "part {} of {}: packed lanes {:?}{} ({} input bytes) into {} in {:.2} s; run `dsprep \
         pack --finish` with the same --recipe and --out once every part is done",
        report.parts.part,
        report.parts.parts,
        report.packed,
        if report.kept.is_empty() {
            String::new()
        } else {
            format!(" (kept {:?}, complete from an earlier run)", report.kept)
        },
        report.input_bytes,
        report.lanes_dir.display(),
        report.wall.as_secs_f64()
    );
}
