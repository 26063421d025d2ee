//! `dsprep serve`'s flags, and their check into the [`ServeOptions`] the daemon runs with: the
//! defaults that come from the machine or the environment (every core; the node rank and count
//! from Slurm's or torchrun's variables, named in `--help`) are read here, once.

use super::{CurveFiles, NodePlace, ServeOptions};
use crate::pack::args::{default_threads, engine_choice};
use anyhow::Context;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    #[arg(long)]
    pub recipe: PathBuf,
    #[arg(long)]
    pub world_size: u32,
    /// Windows per rank per step; a global step is world size × micro batch windows.
    #[arg(long)]
    pub micro_batch: u32,
    /// ipc://PATH (default) or tcp://HOST:PORT; a non-loopback host needs CURVE
    /// (--curve-secret-key and --curve-allow) or --insecure-tcp.
    #[arg(long, default_value = "ipc://dsprep.sock")]
    pub endpoint: String,
    /// Allow a non-loopback tcp:// endpoint without CURVE: it is not authenticated, so any
    /// host that can reach it reads the token stream and can move what the daemon holds.
    #[arg(long)]
    pub insecure_tcp: bool,
    /// Serve with CURVE: the daemon's secret key file (NAME.key_secret from `dsprep keygen`);
    /// its clients are given NAME.key.
    #[arg(long, requires = "curve_allow")]
    pub curve_secret_key: Option<PathBuf>,
    /// With CURVE: a directory of the public key files (NAME.key) of the clients let in; any
    /// other client is refused.
    #[arg(long, requires = "curve_secret_key")]
    pub curve_allow: Option<PathBuf>,
    /// A trainer rank belongs to the process that first asks for it; another process asking
    /// for it is refused until the owner has been silent this many seconds (no request, and
    /// from protocol v6 no keepalive: its process died), or at once given to a process started
    /// later. At least 1 (the clients send a keepalive every 250 ms).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub owner_timeout: u64,
    /// Steps the pipeline may run ahead of the slowest rank (bounds memory).
    #[arg(long, default_value_t = 8)]
    pub prefetch: u64,
    /// Tokenizer threads (default: every core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Prometheus endpoint, loopback (port 0 picks one); "off" disables it. Beyond loopback
    /// it needs --metrics-token-file or --insecure-metrics.
    #[arg(long, default_value = "127.0.0.1:9187")]
    pub metrics: String,
    /// A file holding a bearer token /metrics requires (Prometheus' `authorization:
    /// credentials_file`); without it a request gets 401.
    #[arg(long)]
    pub metrics_token_file: Option<PathBuf>,
    /// Allow --metrics beyond loopback without a token: any host that reaches it reads the
    /// daemon's counters.
    #[arg(long)]
    pub insecure_metrics: bool,
    /// Tokenizer engine; every engine gives the same ids. "auto": the fastest measured for the
    /// file's family (HF tokenizers 1.x for byte-level BPE; dsprep's own for SentencePiece-style
    /// BPE and for files 1.x does not encode exactly; else HF 0.23), the log's engine line says
    /// which and why. "own": dsprep's own engine where it reproduces the file (else HF 0.23);
    /// "hf": HF tokenizers 0.23; "hf1": HF tokenizers 1.x (a release candidate; HF 0.23 when
    /// 1.x does not read the file). What "auto" chose, and dsprep's engine's tables, are kept per
    /// tokenizer file in DSPREP_ENGINE_CACHE (a directory, or "off"; default
    /// $XDG_CACHE_HOME/dsprep/engines, else ~/.cache/dsprep/engines).
    #[arg(long, default_value = "auto", value_parser = ["auto", "own", "hf", "hf1"])]
    pub tokenizer_engine: String,
    /// Directory for checkpoints (exact resume); none: no checkpoints.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Write a checkpoint at or just below every multiple of N steps the slowest rank reaches,
    /// and on SIGINT/SIGTERM.
    #[arg(long, default_value_t = 500)]
    pub checkpoint_every: u64,
    /// Checkpoints kept in --state-dir. Keep enough to reach back to the trainers' own
    /// checkpoint interval: the daemon runs up to --prefetch steps ahead of them.
    #[arg(long, default_value_t = 4)]
    pub keep_checkpoints: usize,
    /// "latest": continue from --state-dir. The daemon starts at the step the trainers ask
    /// for first, from the newest checkpoint at or below it.
    #[arg(long, value_parser = ["latest"], requires = "state_dir")]
    pub resume: Option<String>,
    /// With --resume latest: continue the stream under --recipe (or another world size × micro
    /// batch) from the step the trainers resume at; the steps below it stay what was served.
    /// The change is written to the state directory's lineage.json.
    #[arg(long, requires = "resume")]
    pub change_course: bool,
    /// With --change-course, on a node daemon other than node 0: how long to wait for node 0
    /// to make the change (it writes lineage.json at its ranks' first request) before exiting
    /// with an error.
    #[arg(long, default_value_t = 600, requires = "change_course")]
    pub change_course_timeout: u64,
    /// This daemon's node (0-based), for a recipe with `[lanes]` served by one daemon per node.
    /// Default: SLURM_NODEID, else NODE_RANK or GROUP_RANK (torchrun), else 0.
    #[arg(long, requires = "nodes")]
    pub node_rank: Option<u32>,
    /// How many node daemons serve the job. Default: SLURM_NNODES, else NNODES, else 1.
    #[arg(long, requires = "node_rank")]
    pub nodes: Option<u32>,
    /// A frozen plan of this recipe (`dsprep plan --out`): list nothing, read the files it
    /// names (give every node daemon of a job the same plan).
    #[arg(long)]
    pub plan: Option<PathBuf>,
    /// The job's tensor-parallel size, as its clients use it (default: DSPREP_TP, else 1).
    /// --world-size stays the data-parallel world; node daemons use the layout to check that
    /// each node's ranks are the data-parallel ranks it serves.
    #[arg(long)]
    pub tensor_parallel: Option<u32>,
    /// The job's context-parallel size (default: DSPREP_CP, else 1).
    #[arg(long)]
    pub context_parallel: Option<u32>,
    /// The job's pipeline-parallel size (default: DSPREP_PP, else 1).
    #[arg(long)]
    pub pipeline_parallel: Option<u32>,
    /// The job's rank order, "tp-cp-dp-pp" or "tp-cp-pp-dp" (default: DSPREP_RANK_ORDER, else
    /// tp-cp-dp-pp).
    #[arg(long)]
    pub rank_order: Option<String>,
}

/// The layout from the flags, else the clients' environment variables (read as they read them).
fn parallelism(args: &ServeArgs) -> anyhow::Result<dsprep_client::Parallelism> {
    let parallel = dsprep_client::Parallelism::from_env_or(
        [
            args.tensor_parallel,
            args.context_parallel,
            args.pipeline_parallel,
        ],
        args.rank_order.as_deref(),
        |name| std::env::var(name).ok(),
    )
    .map_err(anyhow::Error::msg)?;
    for (value, name, var) in [
        (parallel.tensor, "tensor-parallel", "DSPREP_TP"),
        (parallel.context, "context-parallel", "DSPREP_CP"),
        (parallel.pipeline, "pipeline-parallel", "DSPREP_PP"),
    ] {
        anyhow::ensure!(
            value >= 1,
            "{name} must be at least 1 (from --{name} or {var})"
        );
    }
    Ok(parallel)
}

impl TryFrom<ServeArgs> for ServeOptions {
    type Error = anyhow::Error;

    fn try_from(args: ServeArgs) -> anyhow::Result<ServeOptions> {
        let node = NodePlace::resolve(args.node_rank, args.nodes, |name| std::env::var(name).ok())?;
        let parallel = parallelism(&args)?;
        let metrics = match args.metrics.as_str() {
            "off" => None,
            addr => Some(
                addr.parse()
                    .with_context(|| format!("--metrics {addr:?} is not HOST:PORT or \"off\""))?,
            ),
        };
        let threads = default_threads(args.threads)?;
        anyhow::ensure!(
            args.world_size >= 1 && args.micro_batch >= 1,
            "--world-size and --micro-batch must be at least 1"
        );
        anyhow::ensure!(
            args.checkpoint_every >= 1,
            "--checkpoint-every must be at least 1"
        );
        Ok(ServeOptions {
            recipe: args.recipe,
            world_size: args.world_size,
            micro_batch: args.micro_batch,
            endpoint: args.endpoint,
            insecure_tcp: args.insecure_tcp,
            curve: match (args.curve_secret_key, args.curve_allow) {
                (Some(secret_key), Some(allow_dir)) => Some(CurveFiles {
                    secret_key,
                    allow_dir,
                }),
                _ => None,
            },
            owner_timeout: std::time::Duration::from_secs(args.owner_timeout),
            prefetch: args.prefetch,
            threads,
            metrics,
            metrics_token: args.metrics_token_file,
            insecure_metrics: args.insecure_metrics,
            engine: engine_choice(&args.tokenizer_engine),
            state_dir: args.state_dir,
            checkpoint_every: args.checkpoint_every,
            keep_checkpoints: args.keep_checkpoints,
            resume: args.resume.is_some(),
            change_course: args.change_course,
            change_course_timeout: std::time::Duration::from_secs(args.change_course_timeout),
            node,
            parallel,
            plan: args.plan,
        })
    }
}
