//! `dsprep tap`: a command-line trainer stand-in. Connects as one rank, pulls steps in order and
//! writes each step's raw token bytes to `--out` (nothing else) and one JSON line per step with
//! its header (the lineage segment that made it included) and stream chain to `<out>.jsonl`. Like a resumed trainer, it can be given the
//! chain before its first step (`--expect-chain`), which the daemon's stream must continue, and
//! a time per step (`--step-ms`) stands in for a trainer's compute, and `--report-loss` a
//! trainer's loss per source: a synthetic per-token loss (per source, falling or rising with the
//! step) reported after each step through the client's helpers (protocol v7). For debugging and
//! tests.

use anyhow::Context;
use dsprep_client::chain;
use dsprep_client::{Client, ClientConfig, Parallelism};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

pub struct TapOptions {
    pub endpoint: String,
    pub rank: u32,
    pub world_size: u32,
    pub start_step: u64,
    pub steps: u64,
    pub out: PathBuf,
    pub recipe_hash: Option<String>,
    pub timeout: Duration,
    /// Model parallelism: the tap asks for its data-parallel rank's batches.
    pub parallel: Parallelism,
    /// The stream chain before `start_step` (hex), as a resumed trainer saved it.
    pub expect_chain: Option<String>,
    /// CURVE keys for a daemon that serves with CURVE.
    pub curve: Option<dsprep_client::curve::ClientKeys>,
    /// How long to wait after each step (a training step's compute).
    pub step_time: Duration,
    /// Report a synthetic loss per source after each step (`--report-loss`).
    pub report_loss: Option<SyntheticLoss>,
}

/// A synthetic per-token loss: per source index, `start + slope × step` (at least 0.01); 1.0
/// for a source not named.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SyntheticLoss {
    pub by_source: Vec<(u16, f64, f64)>,
}

impl SyntheticLoss {
    /// `SOURCE=START[:SLOPE],…`, e.g. `0=3.0,1=3.0:-0.01`.
    pub fn parse(text: &str) -> anyhow::Result<SyntheticLoss> {
        let mut by_source = Vec::new();
        for part in text.split(',').filter(|p| !p.trim().is_empty()) {
            let bad = || anyhow::anyhow!("--report-loss {part:?} is not SOURCE=START[:SLOPE]");
            let (source, rest) = part.split_once('=').ok_or_else(bad)?;
            let (start, slope) = rest.split_once(':').unwrap_or((rest, "0"));
            by_source.push((
                source.trim().parse().map_err(|_| bad())?,
                start.trim().parse().map_err(|_| bad())?,
                slope.trim().parse().map_err(|_| bad())?,
            ));
        }
        Ok(SyntheticLoss { by_source })
    }

    /// The per-token loss of a token of `source` at `step`.
    pub fn at(&self, source: u16, step: u64) -> f32 {
        let (start, slope) = (self.by_source.iter())
            .find(|(s, _, _)| *s == source)
            .map_or((1.0, 0.0), |&(_, start, slope)| (start, slope));
        (start + slope * step as f64).max(0.01) as f32
    }
}

/// Returns the number of steps written (fewer than asked when the data ends).
pub fn tap(options: &TapOptions) -> anyhow::Result<u64> {
    let config = ClientConfig {
        endpoint: options.endpoint.clone(),
        rank: options.rank,
        world_size: options.world_size,
        recipe_hash: options.recipe_hash.clone(),
        timeout: options.timeout,
        attempts: 3,
        parallel: options.parallel,
        session: None,
        curve: options.curve.clone(),
    };
    let mut client = Client::with_config(config)?;
    if let Some(text) = &options.expect_chain {
        let value = chain::from_hex(text)
            .with_context(|| format!("--expect-chain {text:?} is not 64 hex digits"))?;
        client.expect_chain(options.start_step, value);
    }
    let create = |path: &PathBuf| {
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))
    };
    let mut tokens = std::io::BufWriter::new(create(&options.out)?);
    let headers_path = PathBuf::from(format!("{}.jsonl", options.out.display()));
    let mut headers = std::io::BufWriter::new(create(&headers_path)?);
    let mut written = 0;
    for step in options.start_step..options.start_step + options.steps {
        let Some(batch) = client
            .batch_at(step)
            .with_context(|| format!("rank {} step {step}", options.rank))?
        else {
            let line = serde_json::json!({"step": step, "rank": options.rank, "end_of_data": true});
            writeln!(headers, "{line}")?;
            break;
        };
        tokens.write_all(batch.tokens().as_bytes())?;
        let h = &batch.header;
        let doc_starts: Vec<&[u32]> = (0..batch.rows()).map(|i| batch.doc_starts(i)).collect();
        let doc_sources: Option<Vec<&[u16]>> =
            (0..batch.rows()).map(|i| batch.doc_sources(i)).collect();
        let lead_sources: Option<Vec<u16>> =
            (0..batch.rows()).map(|i| batch.lead_source(i)).collect();
        let real_tokens: Vec<u32> = (0..batch.rows()).map(|i| batch.real_tokens(i)).collect();
        let chain = h.chain.map(|c| {
            serde_json::json!({
                "step_start": chain::to_hex(&c.step_start), "rows_start": chain::to_hex(&c.rows_start),
                "rows_end": chain::to_hex(&c.rows_end), "step_end": chain::to_hex(&c.step_end),
            })
        });
        let line = serde_json::json!({
            "step": h.step, "rank": h.rank, "world_size": h.world_size, "micro_batch": h.micro_batch,
            "window_tokens": h.window_tokens, "dtype_bytes": h.dtype_bytes, "recipe_hash": hex::encode(h.recipe_hash),
            "first_window": h.first_window, "doc_starts": doc_starts, "chain": chain,
            "doc_sources": doc_sources, "lead_sources": lead_sources, "real_tokens": real_tokens,
            "segment": batch.segment(), "segment_recipe_hash": batch.segment_recipe_hash().map(hex::encode),
        });
        writeln!(headers, "{line}")?;
        if let Some(synthetic) = &options.report_loss {
            report(&mut client, &batch, synthetic)?;
        }
        // Flushed per step: a tap killed mid-run leaves every completed step on disk.
        tokens.flush()?;
        headers.flush()?;
        written += 1;
        std::thread::sleep(options.step_time);
    }
    tokens.flush()?;
    headers.flush()?;
    Ok(written)
}

/// Report `batch`'s synthetic loss per source, as a trainer reports its real one.
fn report(
    client: &mut Client,
    batch: &dsprep_client::ServedBatch,
    synthetic: &SyntheticLoss,
) -> anyhow::Result<()> {
    let mut loss = Vec::new();
    for i in 0..batch.rows() {
        let sources = batch
            .input_sources(i)
            .context("--report-loss needs the document sources (protocol v3 or later)")?;
        loss.extend(sources.iter().map(|&s| synthetic.at(s, batch.step())));
    }
    let entries =
        (batch.per_source_loss(&loss)).context("the loss has one value per input token")?;
    client.report(batch.step(), &entries)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_synthetic_loss_reads_its_spec_and_names_a_bad_part() {
        let loss = SyntheticLoss::parse("0=3.0, 2=2.0:-0.5").unwrap();
        assert_eq!(loss.at(0, 100), 3.0);
        assert_eq!(loss.at(2, 2), 1.0);
        assert_eq!(loss.at(2, 100), 0.01, "at least 0.01");
        assert_eq!(loss.at(1, 7), 1.0, "a source not named");
        assert_eq!(
            SyntheticLoss::parse("0=3,x=1").unwrap_err().to_string(),
            "--report-loss \"x=1\" is not SOURCE=START[:SLOPE]"
        );
        assert_eq!(
            SyntheticLoss::parse("0:3").unwrap_err().to_string(),
            "--report-loss \"0:3\" is not SOURCE=START[:SLOPE]"
        );
    }
}
