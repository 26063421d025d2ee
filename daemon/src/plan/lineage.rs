//! `dsprep plan --lineage`: a daemon's lineage shown segment by segment: each recipe, where it
//! takes over (step, window, document), its global batch, and per source its target share and,
//! for a segment that has ended in a mix in tokens, the tokens it was to draw of each source.

use dsprep_mixers::lineage::Lineage;
use dsprep_mixers::mixer::target_shares;
use std::fmt::Write;
use std::path::Path;

/// The lineage of `path` (a state directory, or its `lineage.json`) as text.
pub fn plan_lineage(path: &Path) -> anyhow::Result<String> {
    let lineage = crate::serve::read_lineage(path)?;
    Ok(describe(&lineage))
}

fn describe(lineage: &Lineage) -> String {
    let mut out = String::new();
    let names = lineage.source_names();
    let _ = writeln!(
        out,
        "lineage of {} segments ({} sources over all of them)",
        lineage.segments.len(),
        names.len()
    );
    for (k, s) in lineage.segments.iter().enumerate() {
        let recipe = lineage.effective_recipe(k);
        let window_tokens = recipe.packing.window_tokens() as u64;
        let end = lineage.segments.get(k + 1);
        let tokens = end.map(|next| {
            (next.from_window.saturating_sub(s.from_window)).saturating_mul(window_tokens)
        });
        let _ = writeln!(
            out,
            "segment {k}: recipe {} from step {} (window {}, document {}), {} windows a step \
             (world size {} × micro batch {}){}",
            s.recipe_hash,
            s.from_step,
            s.from_window,
            s.from_documents,
            s.global_batch,
            s.world_size,
            s.micro_batch,
            match (end, tokens) {
                (Some(next), Some(tokens)) =>
                    format!(", to step {} ({tokens} tokens)", next.from_step),
                _ => ", to the end of the stream".to_string(),
            }
        );
        let weights: Vec<f64> = recipe.sources.iter().map(|s| s.weight).collect();
        let in_tokens = !recipe.mix.unit.is_documents();
        for (name, share) in names.iter().zip(target_shares(&weights)) {
            let expected = match (tokens, in_tokens) {
                (Some(tokens), true) => format!(", about {:.0} tokens", tokens as f64 * share),
                _ => String::new(),
            };
            let _ = writeln!(
                out,
                "  {name:<16} target {:>6.2}% of the {}{expected}",
                100.0 * share,
                if in_tokens { "tokens" } else { "documents" }
            );
        }
        if !recipe.mix.phases.is_empty() {
            let _ = writeln!(
                out,
                "  and {} [[mix.phase]] after it (points in tokens of the stream)",
                recipe.mix.phases.len()
            );
        }
    }
    if !lineage.abandoned.is_empty() {
        let steps: Vec<String> = (lineage.abandoned.iter())
            .map(|s| format!("step {} (recipe {})", s.from_step, s.recipe_hash))
            .collect();
        let _ = writeln!(
            out,
            "replaced branches, kept in the file, not served: {}",
            steps.join(", ")
        );
    }
    out
}
