//! The reader's ceiling: how fast the reading half of the pipeline (sources → mix → shuffle) hands
//! out text when nothing downstream slows it, for one pipeline and for a laned recipe's lanes on
//! parallel reader threads. Prints one JSON line.
//!
//!   cargo run --release -p dsprep --example reader_ceiling -- RECIPE [READER_THREADS]
//!
//! With `[lanes]`, READER_THREADS threads (default: every core) drain the lanes, each thread its
//! share of them; without, one thread drains the one stream.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let recipe = args
        .next()
        .ok_or_else(|| anyhow::anyhow!("usage: reader_ceiling RECIPE [THREADS]"))?;
    let threads: usize = match args.next() {
        Some(t) => t.parse()?,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let loaded = dsprep::driver::load_recipe(std::path::Path::new(&recipe))?;
    let (bytes, docs) = (AtomicU64::new(0), AtomicU64::new(0));
    let started = Instant::now();
    let drain = |mut stream: dsprep_mixers::DocStream<
        dsprep::driver::pretokenize::Pretokenized,
    >|
     -> anyhow::Result<()> {
        while let Some(doc) = stream.next_doc()? {
            bytes.fetch_add(doc.text.len() as u64, Ordering::Relaxed);
            docs.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    };
    let readers = match loaded.recipe.lanes {
        None => {
            drain(dsprep::driver::build_stream(&loaded, 1)?)?;
            1
        }
        Some(spec) => {
            let inputs =
                dsprep::driver::lanes::deal_inputs(&loaded, dsprep::driver::hub_client(&loaded)?)?;
            let threads = threads.clamp(1, spec.count as usize);
            std::thread::scope(|scope| -> anyhow::Result<()> {
                let handles: Vec<_> = (0..threads)
                    .map(|t| {
                        let (inputs, loaded, drain) = (&inputs, &loaded, &drain);
                        scope.spawn(move || -> anyhow::Result<()> {
                            for lane in (t as u32..spec.count).step_by(threads) {
                                drain(inputs.stream(loaded, lane, 1)?)?;
                            }
                            Ok(())
                        })
                    })
                    .collect();
                for h in handles {
                    h.join()
                        .map_err(|_| anyhow::anyhow!("a reader panicked"))??;
                }
                Ok(())
            })?;
            threads
        }
    };
    let secs = started.elapsed().as_secs_f64();
    let (bytes, docs) = (bytes.into_inner(), docs.into_inner());
    println!(
        "{}",
        serde_json::json!({
            "recipe": recipe, "reader_threads": readers, "wall_s": secs,
            "text_bytes": bytes, "documents": docs,
            "text_mb_per_s": bytes as f64 / secs / 1e6, "documents_per_s": docs as f64 / secs,
        })
    );
    Ok(())
}
