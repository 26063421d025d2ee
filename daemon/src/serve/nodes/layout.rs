//! Whether node daemons can serve a job's model-parallel layout. Each node daemon serves the
//! data-parallel (DP) ranks laid out on its node (`NodeRanks`: DP world / nodes of them, node by
//! node), so every rank on a node must belong to one of those DP ranks. With tensor, context or
//! pipeline parallel groups across nodes (NeuronX Distributed's Llama 70B: TP 32 in a node, PP 8
//! across 16 nodes, DP 2) a DP replica spans nodes: every node of a replica needs the same bytes,
//! and daemons that each read their own node's share cannot give them without reading the input
//! once per node. Such a layout is refused at start, naming it and printing the launch that
//! serves it: one daemon for the job, over TCP with CURVE.

use super::NodePlace;
use dsprep_client::Parallelism;
use std::collections::BTreeSet;

/// Check that the ranks on node `place.rank` are exactly the DP ranks its daemon serves, for a
/// job of `dp_world` DP ranks × the model-parallel sizes of `parallel`.
pub fn check(place: &NodePlace, dp_world: u32, parallel: &Parallelism) -> Result<(), String> {
    let model =
        u64::from(parallel.tensor) * u64::from(parallel.context) * u64::from(parallel.pipeline);
    if model <= 1 || place.count <= 1 {
        return Ok(()); // every rank is a DP rank, laid out node by node as served
    }
    let nodes = u64::from(place.count);
    let total = u64::from(dp_world) * model;
    let layout = format!(
        "tensor parallel {} × context parallel {} × pipeline parallel {} (rank order {}) with \
         data-parallel world {dp_world}: {total} ranks on {nodes} nodes",
        parallel.tensor,
        parallel.context,
        parallel.pipeline,
        parallel.order.name()
    );
    if !total.is_multiple_of(nodes) || total > u64::from(u32::MAX) {
        return Err(format!(
            "the job's layout ({layout}) does not put the same number of ranks on every node"
        ));
    }
    let per_node = total / nodes;
    let node = u64::from(place.rank);
    let mut held = BTreeSet::new();
    for rank in node * per_node..(node + 1) * per_node {
        let (dp, _) = parallel.data_parallel(rank as u32, total as u32)?;
        held.insert(dp);
    }
    let served: BTreeSet<u32> = match u64::from(dp_world).is_multiple_of(nodes) {
        true => {
            let each = dp_world / place.count;
            (place.rank * each..(place.rank + 1) * each).collect()
        }
        false => BTreeSet::new(),
    };
    if held == served {
        return Ok(());
    }
    Err(format!(
        "the job's layout ({layout}) puts ranks of data-parallel rank(s) {held:?} on node {node}, \
         and node daemons serve {}: a data-parallel replica spans nodes, so daemons that each \
         serve their own node's data-parallel ranks cannot serve it without reading the input \
         once per node. Serve the job from one daemon on one node instead (e.g. `srun --nodes 1 \
         --ntasks 1`): `dsprep serve --recipe RECIPE --world-size {dp_world} --micro-batch MB \
         --nodes 1 --node-rank 0 --endpoint tcp://$(hostname):5555 --curve-secret-key \
         server.key_secret --curve-allow CLIENT_KEYS_DIR`, and give every rank that endpoint, \
         DSPREP_TP={} DSPREP_CP={} DSPREP_PP={} DSPREP_RANK_ORDER={} and its CURVE keys \
         (docs/model-parallel.md); it reads the input once for the whole job",
        match served.is_empty() {
            true => format!("none on it ({dp_world} data-parallel ranks over {nodes} nodes)"),
            false => format!("{served:?} from it"),
        },
        parallel.tensor,
        parallel.context,
        parallel.pipeline,
        parallel.order.name()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::nodes::NodeOrigin;
    use dsprep_client::RankOrder;

    fn place(rank: u32, count: u32) -> NodePlace {
        NodePlace {
            rank,
            count,
            origin: NodeOrigin::Flags,
        }
    }

    fn layout(tensor: u32, pipeline: u32, order: RankOrder) -> Parallelism {
        Parallelism {
            tensor,
            context: 1,
            pipeline,
            order,
        }
    }

    #[test]
    fn a_replica_across_nodes_is_refused_with_the_launch_that_serves_it() {
        // NeuronX Distributed's Llama 70B: TP 32 in a node, PP 8 across 16 nodes, DP 2.
        let nxd = layout(32, 8, RankOrder::TpCpDpPp);
        let e = check(&place(3, 16), 2, &nxd).unwrap_err();
        assert!(
            e.starts_with(
                "the job's layout (tensor parallel 32 × context parallel 1 × pipeline parallel 8 \
                 (rank order tp-cp-dp-pp) with data-parallel world 2: 512 ranks on 16 nodes) puts \
                 ranks of data-parallel rank(s) {1} on node 3, and node daemons serve none on it \
                 (2 data-parallel ranks over 16 nodes)"
            ),
            "{e}"
        );
        assert!(
            e.contains("--world-size 2 --micro-batch MB --nodes 1 --node-rank 0")
                && e.contains("DSPREP_TP=32 DSPREP_CP=1 DSPREP_PP=8 DSPREP_RANK_ORDER=tp-cp-dp-pp"),
            "{e}"
        );
        // Scaled down: TP 2 × PP 2 on 4 nodes, DP 2 or 4.
        let small = layout(2, 2, RankOrder::TpCpDpPp);
        assert!(check(&place(0, 4), 2, &small).is_err());
        let e = check(&place(2, 4), 4, &small).unwrap_err();
        assert!(
            e.contains(
                "puts ranks of data-parallel rank(s) {0, 1} on node 2, and node daemons \
                        serve {2} from it"
            ),
            "{e}"
        );
    }

    #[test]
    fn layouts_whose_nodes_hold_their_own_replicas_pass() {
        // Pipeline stages inside a replica: node n holds replica n whole.
        let inside = layout(2, 2, RankOrder::TpCpPpDp);
        for node in 0..4 {
            assert_eq!(check(&place(node, 4), 4, &inside), Ok(()));
        }
        // Tensor parallel inside a node, 8 ranks per node: node n holds DP rank n.
        let tp8 = layout(8, 1, RankOrder::TpCpDpPp);
        for node in 0..8 {
            assert_eq!(check(&place(node, 8), 8, &tp8), Ok(()));
        }
        // No model parallelism, or one node: nothing to check here.
        assert_eq!(check(&place(1, 2), 3, &Parallelism::default()), Ok(()));
        assert_eq!(
            check(&place(0, 1), 1, &layout(32, 8, RankOrder::TpCpDpPp)),
            Ok(())
        );
    }
}
