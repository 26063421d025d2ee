//! A data-parallel replica across nodes, as NeuronX Distributed's Llama 70B lays one out (TP 32
//! in a node, PP 8 across 16 nodes, DP 2), scaled down: TP 2 × PP 2 × DP 2, 8 ranks on 4
//! simulated nodes. Node daemons started the usual way (one per node, the layout from flags or
//! the clients' `DSPREP_TP`/`DSPREP_PP`, the node from Slurm's variables) refuse it at start,
//! naming the layout and printing the launch that serves it; that launch (one daemon, CURVE over
//! TCP, every rank with the layout set) gives every rank its data-parallel rank's slice of
//! `dsprep pack`, the TP and PP peers of a replica the same bytes.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use dsprep_client::curve::ClientKeys;
use dsprep_client::{Client, ClientConfig, PackedDataset, Parallelism};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use support::daemon::{Daemon, expected_rank_bytes};
use support::dsprep_ok;
use support::nodes::multinode;

fn serve_fails(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dsprep"));
    cmd.arg("serve").args(args);
    for key in [
        "SLURM_NODEID",
        "SLURM_NNODES",
        "DSPREP_TP",
        "DSPREP_CP",
        "DSPREP_PP",
    ] {
        cmd.env_remove(key);
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn keygen(dir: &Path, name: &str) -> PathBuf {
    let base = dir.join(name);
    dsprep_ok(&["keygen", "--out", base.to_str().unwrap()]);
    base
}

fn with_ext(base: &Path, ext: &str) -> PathBuf {
    PathBuf::from(format!("{}.{ext}", base.display()))
}

#[test]
fn a_replica_across_nodes_is_refused_with_a_launch_and_that_launch_serves_every_rank() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = multinode();
    let recipe_s = recipe.to_str().unwrap();
    let endpoint = format!("ipc://{}", tmp.path().join("n1.sock").display());
    let base = [
        "--recipe",
        recipe_s,
        "--world-size",
        "2",
        "--micro-batch",
        "1",
        "--endpoint",
        &endpoint,
        "--metrics",
        "off",
    ];
    let layout = "the job's layout (tensor parallel 2 × context parallel 1 × pipeline parallel 2 \
                  (rank order tp-cp-dp-pp) with data-parallel world 2: 8 ranks on 4 nodes) puts \
                  ranks of data-parallel rank(s) {1} on node 1, and node daemons serve none on it";
    let launch = "--world-size 2 --micro-batch MB --nodes 1 --node-rank 0";
    // From flags.
    let mut args = base.to_vec();
    args.extend(["--nodes", "4", "--node-rank", "1"]);
    args.extend(["--tensor-parallel", "2", "--pipeline-parallel", "2"]);
    let e = serve_fails(&args, &[]);
    assert!(e.contains(layout) && e.contains(launch), "{e}");
    // From Slurm and the clients' variables, as `srun --ntasks-per-node=1 dsprep serve` runs it.
    let env = [
        ("SLURM_NODEID", "1"),
        ("SLURM_NNODES", "4"),
        ("DSPREP_TP", "2"),
        ("DSPREP_PP", "2"),
    ];
    let e = serve_fails(&base, &env);
    assert!(e.contains(layout) && e.contains(launch), "{e}");
    // Without the layout, the daemon cannot know and says what to give it.
    let e = serve_fails(&base, &env[..2]);
    assert!(
        e.contains("world size 2 cannot be split over 4 nodes")
            && e.contains("give the daemon the layout"),
        "{e}"
    );

    // The launch it prints: one daemon, CURVE over TCP, every rank with the layout.
    let server = keygen(tmp.path(), "server");
    let trainer = keygen(tmp.path(), "trainer");
    let allow = tmp.path().join("allow");
    std::fs::create_dir(&allow).unwrap();
    std::fs::copy(with_ext(&trainer, "key"), allow.join("trainer.key")).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let tcp = format!("tcp://{port}");
    let daemon = Daemon::start_with(
        &recipe,
        &tcp,
        &[
            "--world-size",
            "2",
            "--micro-batch",
            "1",
            "--nodes",
            "1",
            "--node-rank",
            "0",
            "--metrics",
            "off",
            "--curve-secret-key",
            with_ext(&server, "key_secret").to_str().unwrap(),
            "--curve-allow",
            allow.to_str().unwrap(),
        ],
    )
    .unwrap();
    let whole_dir = tmp.path().join("whole");
    dsprep_ok(&[
        "pack",
        "--recipe",
        recipe_s,
        "--out",
        whole_dir.to_str().unwrap(),
        "--quiet",
    ]);
    let whole = PackedDataset::open(&whole_dir).unwrap();
    let steps = 8u64;
    let barrier = std::sync::Barrier::new(8);
    let received: Vec<Vec<u8>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8u32)
            .map(|rank| {
                let (tcp, barrier) = (&tcp, &barrier);
                let (server, trainer) =
                    (with_ext(&server, "key"), with_ext(&trainer, "key_secret"));
                scope.spawn(move || {
                    let config = ClientConfig {
                        endpoint: tcp.clone(),
                        rank,
                        world_size: 8,
                        recipe_hash: None,
                        timeout: Duration::from_secs(10),
                        attempts: 3,
                        parallel: Parallelism {
                            tensor: 2,
                            pipeline: 2,
                            ..Default::default()
                        },
                        session: None,
                        curve: Some(ClientKeys::from_files(&server, &trainer).unwrap()),
                    };
                    let mut client = Client::with_config(config).unwrap();
                    // tp-cp-dp-pp: rank = tp + 2 × (dp + 2 × pp).
                    assert_eq!(client.data_parallel(), ((rank / 2) % 2, 2));
                    let mut bytes = Vec::new();
                    for _ in 0..steps {
                        let batch = client.next_batch().unwrap().expect("a step");
                        bytes.extend_from_slice(batch.tokens().as_bytes());
                        barrier.wait();
                    }
                    bytes
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, bytes) in received.iter().enumerate() {
        let dp = ((rank / 2) % 2) as u64;
        let mut want = expected_rank_bytes(&whole, 2, 1, dp);
        want.truncate(bytes.len());
        assert_eq!(bytes.len() as u64, steps * 513 * 2, "rank {rank}");
        assert!(
            *bytes == want,
            "rank {rank} is not DP rank {dp}'s slice of the pack"
        );
    }
    let mut daemon = daemon;
    daemon.terminate();
}
