//! Example trainer: each rank pulls its batches from `dsprep serve` through
//! `dsprep_client::Client` and trains a small decoder-only transformer (candle, CPU) on them,
//! with position ids that restart at every document start and a block-diagonal causal attention
//! mask built from `cu_seqlens`. Every step logs the loss, tokens/s and the data wait: the share
//! of the step spent waiting for the batch (`Client::batch_at`, which `next_batch` calls).
//!
//! Honest about scope: every rank trains its own replica on its own shard. Gradients are NOT
//! averaged across ranks; that all-reduce is the model core's job (NCCL/gloo in a real trainer),
//! not the data plane's. What this shows is the data path a data-parallel job uses.
//!
//! ```text
//! dsprep serve --recipe config/quickstart.toml --world-size 2 --micro-batch 4 &
//! cargo run --release -p dsprep-client --example train -- --launch 2 --steps 100
//! ```
//! `--launch N` starts N ranks with RANK/WORLD_SIZE/LOCAL_RANK set, as torchrun does; without it
//! the process is the rank given by RANK/WORLD_SIZE (or rank 0 of 1).

mod launch;
mod model;

use candle_core::{Device, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use dsprep_client::{Client, ClientConfig, ServedBatch};
use std::process::ExitCode;
use std::time::{Duration, Instant};

type Error = Box<dyn std::error::Error>;

const USAGE: &str = "usage: train [--launch N] [--endpoint ipc://dsprep.sock] [--steps 50] [--d-model 32] [--layers 1] \
                     [--heads 2] [--lr 0.01] [--seed 0] [--vocab 50257] [--warmup 5] [--mask documents|causal] [--start-step 0] [--timeout-s 30]";

#[derive(Debug)]
struct Args {
    launch: Option<u32>,
    endpoint: String,
    steps: u64,
    /// The first step asked for (a restarted rank continues where it was).
    start_step: u64,
    d_model: usize,
    layers: usize,
    heads: usize,
    lr: f64,
    seed: u64,
    vocab: usize,
    /// Steps left out of the data-wait summary (the daemon fills its prefetch window first).
    warmup: u64,
    /// Attend within documents (block-diagonal, from cu_seqlens) or across the whole row.
    document_mask: bool,
    timeout: Duration,
    /// Everything but `--launch`, passed on to the ranks.
    rank_args: Vec<String>,
}

fn number<T: std::str::FromStr>(flag: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("{flag} {value:?} is not a valid value\n{USAGE}"))
}

fn parse(raw: Vec<String>) -> Result<Args, String> {
    let mut a = Args {
        launch: None,
        endpoint: "ipc://dsprep.sock".into(),
        steps: 50,
        start_step: 0,
        d_model: 32,
        layers: 1,
        heads: 2,
        lr: 0.01,
        seed: 0,
        vocab: 50257,
        warmup: 5,
        document_mask: true,
        timeout: Duration::from_secs(30),
        rank_args: Vec::new(),
    };
    let mut it = raw.into_iter();
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--launch" => a.launch = Some(number(&flag, &value)?).filter(|&n| n > 0),
            "--endpoint" => a.endpoint = value.clone(),
            "--steps" => a.steps = number(&flag, &value)?,
            "--start-step" => a.start_step = number(&flag, &value)?,
            "--d-model" => a.d_model = number(&flag, &value)?,
            "--layers" => a.layers = number(&flag, &value)?,
            "--heads" => a.heads = number(&flag, &value)?,
            "--lr" => a.lr = number(&flag, &value)?,
            "--seed" => a.seed = number(&flag, &value)?,
            "--vocab" => a.vocab = number(&flag, &value)?,
            "--warmup" => a.warmup = number(&flag, &value)?,
            "--timeout-s" => a.timeout = Duration::from_secs(number(&flag, &value)?),
            "--mask" if value == "documents" || value == "causal" => {
                a.document_mask = value == "documents"
            }
            _ => return Err(format!("unknown option {flag} {value}\n{USAGE}")),
        }
        if flag != "--launch" {
            a.rank_args.extend([flag, value]);
        }
    }
    if a.heads == 0 || !a.d_model.is_multiple_of(a.heads) {
        return Err(format!(
            "--d-model {} is not a multiple of --heads {}",
            a.d_model, a.heads
        ));
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1).collect()) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let result = match args.launch {
        Some(n) => launch::launch(n, &args.rank_args)
            .map_err(Error::from)
            .map(|s| s.success()),
        None => train(&args).map(|()| true),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            let rank = std::env::var("RANK")
                .map(|r| format!("rank {r}"))
                .unwrap_or_else(|_| "launch".into());
            eprintln!("train ({rank}): {e}");
            ExitCode::FAILURE
        }
    }
}

/// One step's inputs as tensors: ids, labels, positions `[rows, seq]` (u32) and the mask.
fn tensors(batch: &ServedBatch, vocab: usize, document_mask: bool) -> Result<[Tensor; 4], Error> {
    let (rows, seq) = (batch.rows(), batch.header.window_tokens as usize - 1);
    let (mut ids, mut labels, mut positions, mut mask) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..rows {
        ids.extend(batch.inputs(i).to_vec());
        labels.extend(batch.labels(i).to_vec());
        positions.extend(batch.position_ids(i));
        let cu = if document_mask {
            batch.cu_seqlens(i)
        } else {
            vec![0, seq as u32]
        };
        model::row_mask(&cu, seq, &mut mask);
    }
    if let Some(&id) = ids.iter().chain(&labels).find(|&&id| id as usize >= vocab) {
        return Err(format!("token id {id} is not below --vocab {vocab}").into());
    }
    let cpu = &Device::Cpu;
    Ok([
        Tensor::from_vec(ids, (rows, seq), cpu)?,
        Tensor::from_vec(labels, rows * seq, cpu)?,
        Tensor::from_vec(positions, (rows, seq), cpu)?,
        Tensor::from_vec(mask, (rows, 1, seq, seq), cpu)?,
    ])
}

fn train(args: &Args) -> Result<(), Error> {
    let config = ClientConfig {
        timeout: args.timeout,
        attempts: 2,
        parallel: Default::default(),
        session: None,
        ..ClientConfig::from_env(&args.endpoint)?
    };
    let (rank, world) = (config.rank, config.world_size);
    let tag = format!("[rank {rank}/{world}]");
    let mut client = Client::with_config(config)?;
    println!(
        "{tag} each rank trains its own replica on its shard: gradients are not averaged across ranks (that is the model core's job)"
    );

    let (mut model, mut optimizer) = (None, None);
    let (mut losses, mut step_s, mut wait_s) = (Vec::new(), Vec::new(), Vec::new());
    for step in args.start_step..args.start_step + args.steps {
        let started = Instant::now();
        let Some(batch) = client.batch_at(step)? else {
            println!("{tag} end of data at step {step}");
            break;
        };
        let waited = started.elapsed();
        let seq = batch.header.window_tokens as usize - 1;
        if model.is_none() {
            let cfg = model::Config {
                vocab: args.vocab,
                d_model: args.d_model,
                layers: args.layers,
                heads: args.heads,
                max_positions: seq,
            };
            let gpt = model::Gpt::new(cfg, args.seed)?;
            println!(
                "{tag} model: {} parameters, {cfg:?}; micro batch {} × seq {seq}",
                gpt.num_params(),
                batch.rows()
            );
            let params = ParamsAdamW {
                lr: args.lr,
                weight_decay: 0.0,
                ..ParamsAdamW::default()
            };
            optimizer = Some(AdamW::new(gpt.vars(), params)?);
            model = Some(gpt);
        }
        let (Some(gpt), Some(opt)) = (&model, &mut optimizer) else {
            unreachable!("set above")
        };
        let [ids, labels, positions, mask] = tensors(&batch, args.vocab, args.document_mask)?;
        let loss = candle_nn::loss::cross_entropy(&gpt.forward(&ids, &positions, &mask)?, &labels)?;
        opt.backward_step(&loss)?;
        let loss = loss.to_scalar::<f32>()?;
        let took = started.elapsed();
        let tokens_per_s = (batch.rows() * seq) as f64 / took.as_secs_f64();
        let wait_share = waited.as_secs_f64() / took.as_secs_f64();
        println!(
            "{tag} step={step} loss={loss:.4} tokens/s={tokens_per_s:.0} data_wait={:.2}ms ({:.1}%)",
            waited.as_secs_f64() * 1e3,
            100.0 * wait_share
        );
        losses.push(f64::from(loss));
        step_s.push(took.as_secs_f64());
        wait_s.push(waited.as_secs_f64());
    }
    summary(&tag, args.warmup as usize, &losses, &step_s, &wait_s);
    Ok(())
}

fn summary(tag: &str, warmup: usize, losses: &[f64], step_s: &[f64], wait_s: &[f64]) {
    let mean = |v: &[f64]| {
        if v.is_empty() {
            f64::NAN
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let k = losses.len().min(5);
    let warm = warmup.min(step_s.len());
    let wait_share = wait_s[warm..].iter().sum::<f64>() / step_s[warm..].iter().sum::<f64>();
    println!(
        "{tag} done: {} steps; loss mean of first {k} {:.4}, of last {k} {:.4}; data wait {:.2}% of step time after {warm} warm-up steps ({:.2}% overall)",
        losses.len(),
        mean(&losses[..k]),
        mean(&losses[losses.len() - k..]),
        100.0 * wait_share,
        100.0 * wait_s.iter().sum::<f64>() / step_s.iter().sum::<f64>()
    );
}
