//! `dsprep plan`'s estimate of the tokens a recipe mixed in tokens has, and of where its stream
//! ends: each source's bytes × its tokens per byte, measured with the recipe's tokenizer on the
//! first documents (1 MiB of text) of up to 8 of its shards spread over its reading order
//! (`sources::sample_local_shard`); then the mix played out on those totals, phase by phase,
//! under the recipe's stopping strategy. An estimate, said as one: shards unlike those sampled
//! hold more or fewer tokens.

use crate::driver::LoadedRecipe;
use crate::driver::inputs::ShardSize;
use crate::sources::{Shard, sample_local_shard};
use anyhow::Context;
use dsprep_mixers::recipe::Stopping;
use std::fmt::Write;

/// Shards sampled per source (spread over its reading order), and document text read from the
/// start of each to measure the source's tokens per byte.
const SAMPLE_SHARDS: usize = 8;
const SAMPLE_TEXT_BYTES: usize = 1 << 20;

/// One source's estimate.
pub struct SourceEstimate {
    /// Bytes of all its shards.
    pub bytes: u64,
    /// Tokens (BOS/EOS included) per byte of the shards sampled, as far as they were read.
    pub tokens_per_byte: f64,
    /// Documents measured, shards sampled, and the share of their bytes the documents took.
    pub documents: u64,
    pub shards: usize,
    pub shard_share: f64,
}

impl SourceEstimate {
    pub fn tokens(&self) -> f64 {
        self.bytes as f64 * self.tokens_per_byte
    }
}

/// Up to `SAMPLE_SHARDS` of `count` shards, spread evenly, the first one first.
fn sampled(count: usize) -> Vec<usize> {
    let picks = count.min(SAMPLE_SHARDS);
    let mut at: Vec<usize> = (0..picks).map(|k| k * count / picks.max(1)).collect();
    at.dedup();
    at
}

/// Per source (recipe order): its estimate, or why there is none (a source that takes no
/// part, a Hub file or fetched content: plan reads nothing from the network).
pub fn estimate_sources(
    loaded: &LoadedRecipe,
    lists: &[Vec<Shard>],
    sizes: &[Vec<ShardSize>],
) -> anyhow::Result<Vec<Result<SourceEstimate, String>>> {
    let recipe = &loaded.recipe;
    let mut out = Vec::with_capacity(recipe.sources.len());
    'sources: for (i, spec) in recipe.sources.iter().enumerate() {
        if lists[i].is_empty() {
            out.push(Err("not read".into()));
            continue;
        }
        let (mut tokens, mut measured_bytes, mut total_bytes) = (0u64, 0.0f64, 0u64);
        let (mut documents, mut shards) = (0u64, 0usize);
        let mut ids = Vec::new();
        for k in sampled(lists[i].len()) {
            let Shard::Local(path) = &lists[i][k] else {
                out.push(Err(
                    "a Hub source: plan reads no data from the network".into()
                ));
                continue 'sources;
            };
            let sample = sample_local_shard(path, spec, SAMPLE_TEXT_BYTES).with_context(|| {
                format!("source {:?}: measuring its tokens per byte", spec.name)
            })?;
            let Some(sample) = sample else {
                out.push(Err("its text is fetched per blob ([source.content])".into()));
                continue 'sources;
            };
            for text in &sample.texts {
                ids.clear();
                loaded.stage.encode_doc(text, &mut ids).with_context(|| {
                    format!("source {:?}: tokenizing its first documents", spec.name)
                })?;
                tokens += ids.len() as u64;
            }
            measured_bytes += sample.fraction * sizes[i][k].bytes as f64;
            total_bytes += sizes[i][k].bytes;
            documents += sample.texts.len() as u64;
            shards += 1;
        }
        if measured_bytes <= 0.0 {
            out.push(Err("its sampled shards hold no rows".into()));
            continue;
        }
        out.push(Ok(SourceEstimate {
            bytes: sizes[i].iter().map(|s| s.bytes).sum(),
            tokens_per_byte: tokens as f64 / measured_bytes,
            documents,
            shards,
            shard_share: measured_bytes / total_bytes.max(1) as f64,
        }));
    }
    Ok(out)
}

/// Where a stream ends, played out on token totals.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamEnd {
    pub tokens: f64,
    /// The phase it ends in.
    pub phase: usize,
    /// Under `first_exhausted`: the source that runs out.
    pub source: Option<usize>,
}

/// Play the mix out: `tokens[i]` per source, `phases[k] = (from_tokens, shares)` in order (the
/// first from 0). Each source of the phase in force gives its share of every token; under
/// `first_exhausted` the stream ends when the first runs out, under `all_exhausted` a source
/// that runs out starts again and the stream ends once every source of the phase in force has
/// run out at least once (the mixer's own rule: the marks of earlier phases count).
pub fn stream_end(tokens: &[f64], phases: &[(u64, Vec<f64>)], stopping: Stopping) -> StreamEnd {
    let n = tokens.len();
    let mut left = tokens.to_vec();
    let mut ran_out = vec![false; n];
    let mut at = 0.0f64;
    for (k, (_, shares)) in phases.iter().enumerate() {
        let until = phases.get(k + 1).map_or(f64::INFINITY, |p| p.0 as f64);
        loop {
            // The next source of this phase to run out, and after how many stream tokens.
            let next = (0..n)
                .filter(|&i| shares[i] > 0.0)
                .map(|i| (i, left[i] / shares[i]))
                .min_by(|a, b| a.1.total_cmp(&b.1));
            let Some((i, after)) = next else {
                return StreamEnd {
                    tokens: at,
                    phase: k,
                    source: None,
                };
            };
            if at + after >= until {
                for j in 0..n {
                    left[j] -= shares[j] * (until - at);
                }
                at = until;
                break;
            }
            at += after;
            for j in 0..n {
                left[j] -= shares[j] * after;
            }
            left[i] = 0.0;
            ran_out[i] = true;
            let all = (0..n).all(|j| shares[j] == 0.0 || ran_out[j]);
            match stopping {
                Stopping::FirstExhausted => {
                    return StreamEnd {
                        tokens: at,
                        phase: k,
                        source: Some(i),
                    };
                }
                Stopping::AllExhausted if all => {
                    return StreamEnd {
                        tokens: at,
                        phase: k,
                        source: None,
                    };
                }
                Stopping::AllExhausted => left[i] = tokens[i],
            }
        }
    }
    unreachable!("the last phase runs until a source of it runs out")
}

/// About `tokens`, rounded for reading: `41 M`, `752 k`.
pub fn about(tokens: f64) -> String {
    match tokens {
        t if t >= 1e9 => format!("{:.1} G", t / 1e9),
        t if t >= 1e7 => format!("{:.0} M", t / 1e6),
        t if t >= 1e6 => format!("{:.1} M", t / 1e6),
        t if t >= 1e3 => format!("{:.0} k", t / 1e3),
        t => format!("{t:.0}"),
    }
}

/// `80000000` → `80,000,000`.
pub fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (k, c) in digits.chars().enumerate() {
        if k > 0 && (digits.len() - k).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The estimate as plan prints it: per source, the total, where the stream ends and, per phase,
/// whether it is reached (a warning when not).
pub fn estimate_text(
    loaded: &LoadedRecipe,
    estimates: &[Result<SourceEstimate, String>],
) -> String {
    let recipe = &loaded.recipe;
    let mut out = String::from(
        "estimate (each source's bytes × its tokens per byte, measured with the recipe's \
         tokenizer on the first documents of up to 8 of its shards):\n",
    );
    for (i, (spec, estimate)) in recipe.sources.iter().zip(estimates).enumerate() {
        let _ = match estimate {
            Ok(e) => writeln!(
                out,
                "  source {:?}: {} bytes × {:.3} tokens/byte ({} documents, {:.0} % of the {} \
                 shard(s) sampled) ≈ {} tokens",
                spec.name,
                e.bytes,
                e.tokens_per_byte,
                e.documents,
                100.0 * e.shard_share,
                e.shards,
                about(e.tokens())
            ),
            Err(why) if recipe.takes_part(i) => {
                writeln!(out, "  source {:?}: no estimate ({why})", spec.name)
            }
            Err(_) => Ok(()),
        };
    }
    let takes_part: Vec<usize> = (0..recipe.sources.len())
        .filter(|&i| recipe.takes_part(i))
        .collect();
    if let Some(&missing) = takes_part.iter().find(|&&i| estimates[i].is_err()) {
        let _ = writeln!(
            out,
            "where the stream ends is not estimated: source {:?} has no estimate",
            recipe.sources[missing].name
        );
        return out;
    }
    let tokens: Vec<f64> = (estimates.iter())
        .map(|e| e.as_ref().map_or(0.0, SourceEstimate::tokens))
        .collect();
    let starts = std::iter::once(0).chain(recipe.mix.phases.iter().map(|p| p.at_tokens));
    let phases: Vec<(u64, Vec<f64>)> = starts.zip(recipe.phase_targets()).collect();
    let end = stream_end(&tokens, &phases, recipe.mix.stopping);
    let held = about(tokens.iter().sum());
    let ends = match (recipe.mix.stopping, end.source) {
        (Stopping::FirstExhausted, Some(i)) => format!(
            "under first_exhausted the stream ends near {} tokens, when source {:?} runs out",
            about(end.tokens),
            recipe.sources[i].name
        ),
        _ => format!(
            "under all_exhausted the stream ends near {} tokens, once every source of phase {} \
             has run out at least once",
            about(end.tokens),
            end.phase
        ),
    };
    let _ = writeln!(
        out,
        "the sources hold about {held} tokens by the estimate; {ends}"
    );
    for (k, phase) in recipe.mix.phases.iter().enumerate() {
        let (k, at) = (k + 1, phase.at_tokens);
        if (at as f64) < end.tokens {
            let _ = writeln!(
                out,
                "  phase {k} at {} tokens: reached by the estimate",
                grouped(at)
            );
        } else {
            let _ = writeln!(
                out,
                "warning: phase {k} at {} tokens: the sources hold about {held} tokens by the \
                 estimate; {ends}, so phase {k} never begins: lower its at_tokens, or give the \
                 sources more data{}",
                grouped(at),
                match recipe.mix.stopping {
                    Stopping::FirstExhausted => ", or mix with stopping = \"all_exhausted\"",
                    Stopping::AllExhausted => "",
                }
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_exhausted_ends_when_the_first_source_of_the_phase_in_force_runs_out() {
        // 100 and 1000 tokens at 10 % / 90 %: source 0 runs out at 1000 stream tokens.
        let phases = vec![(0, vec![0.1, 0.9])];
        let end = stream_end(&[100.0, 1000.0], &phases, Stopping::FirstExhausted);
        assert_eq!((end.tokens, end.source), (1000.0, Some(0)));
        // A phase from 500 on takes source 0 out: source 1 (550 left) runs out at 1050.
        let phases = vec![(0, vec![0.1, 0.9]), (500, vec![0.0, 1.0])];
        let end = stream_end(&[100.0, 1000.0], &phases, Stopping::FirstExhausted);
        assert_eq!((end.tokens, end.phase, end.source), (1050.0, 1, Some(1)));
    }

    #[test]
    fn all_exhausted_reads_again_until_every_source_of_the_phase_ran_out() {
        // Source 0 runs out at 1000 and starts again; source 1 at 1111.1 ends the stream.
        let phases = vec![(0, vec![0.1, 0.9])];
        let end = stream_end(&[100.0, 1000.0], &phases, Stopping::AllExhausted);
        assert!((end.tokens - 1000.0 / 0.9).abs() < 1e-9, "{end:?}");
        assert_eq!(end.source, None);
    }

    #[test]
    fn numbers_read_as_said() {
        assert_eq!(grouped(80_000_000), "80,000,000");
        assert_eq!(grouped(999), "999");
        assert_eq!(about(41.2e6), "41 M");
        assert_eq!(about(2.08e6), "2.1 M");
        assert_eq!(about(752_571.0), "753 k");
    }
}
