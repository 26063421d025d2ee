//! Model parallelism and the data a rank gets: only data-parallel (DP) ranks differ in data. The
//! ranks of one tensor-, context- or pipeline-parallel group share a DP rank and receive the same
//! bytes, so the daemon serves the DP world (`world_size / (tp × cp × pp)` ranks) and holds each
//! step once per DP rank, not once per rank.
//!
//! Global ranks are laid out by a rank order, fastest-varying dimension first:
//! - `tp-cp-dp-pp` (the default): Megatron-LM's `RankGenerator` default `tp-cp-ep-dp-pp` (expert
//!   parallelism is carved out of DP and does not change the DP rank), torchtitan's device mesh
//!   `[pp, dp, cp, tp]` (row-major, so `tp` varies fastest) and NeuronX Distributed (`tp`, then
//!   `dp`, then `pp`). `dp = (rank / (tp × cp)) mod dp_size`.
//! - `tp-cp-pp-dp`: the older Megatron order with pipeline stages inside a DP replica.
//!   `dp = rank / (tp × cp × pp)`.

/// The order of the parallel dimensions in the global rank, fastest first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RankOrder {
    #[default]
    TpCpDpPp,
    TpCpPpDp,
}

impl RankOrder {
    pub fn parse(text: &str) -> Result<RankOrder, String> {
        match text.trim() {
            "tp-cp-dp-pp" => Ok(RankOrder::TpCpDpPp),
            "tp-cp-pp-dp" => Ok(RankOrder::TpCpPpDp),
            other => Err(format!(
                "rank order {other:?} is not one of \"tp-cp-dp-pp\" (Megatron, torchtitan, NxD) \
                 or \"tp-cp-pp-dp\""
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            RankOrder::TpCpDpPp => "tp-cp-dp-pp",
            RankOrder::TpCpPpDp => "tp-cp-pp-dp",
        }
    }
}

/// Tensor, context and pipeline parallel sizes, and the rank order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parallelism {
    pub tensor: u32,
    pub context: u32,
    pub pipeline: u32,
    pub order: RankOrder,
}

impl Parallelism {
    /// The layout from `given` (tensor, context, pipeline sizes) and `order` where set, else
    /// `DSPREP_TP`, `DSPREP_CP`, `DSPREP_PP` and `DSPREP_RANK_ORDER` as `env` looks them up, else
    /// 1 and `tp-cp-dp-pp`: the one reader of those variables, for the clients and `dsprep serve`.
    pub fn from_env_or(
        given: [Option<u32>; 3],
        order: Option<&str>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Parallelism, String> {
        let size = |given: Option<u32>, var: &str| -> Result<u32, String> {
            match (given, env(var)) {
                (Some(v), _) => Ok(v),
                (None, Some(v)) => v
                    .trim()
                    .parse()
                    .map_err(|_| format!("{var}={v:?} is not a whole number")),
                (None, None) => Ok(1),
            }
        };
        let order = match (order, env("DSPREP_RANK_ORDER")) {
            (Some(text), _) => RankOrder::parse(text)?,
            (None, Some(text)) => {
                RankOrder::parse(&text).map_err(|e| format!("DSPREP_RANK_ORDER: {e}"))?
            }
            (None, None) => RankOrder::default(),
        };
        Ok(Parallelism {
            tensor: size(given[0], "DSPREP_TP")?,
            context: size(given[1], "DSPREP_CP")?,
            pipeline: size(given[2], "DSPREP_PP")?,
            order,
        })
    }
}

impl Default for Parallelism {
    fn default() -> Self {
        Parallelism {
            tensor: 1,
            context: 1,
            pipeline: 1,
            order: RankOrder::default(),
        }
    }
}

impl Parallelism {
    /// The data-parallel rank and size of global `rank` of `world_size`.
    pub fn data_parallel(&self, rank: u32, world_size: u32) -> Result<(u32, u32), String> {
        let model = u64::from(self.tensor) * u64::from(self.context) * u64::from(self.pipeline);
        if model == 0 || !u64::from(world_size).is_multiple_of(model) {
            return Err(format!(
                "world size {world_size} is not a multiple of tensor × context × pipeline \
                 parallel = {} × {} × {} = {model}",
                self.tensor, self.context, self.pipeline
            ));
        }
        if rank >= world_size {
            return Err(format!("rank {rank} is not below world size {world_size}"));
        }
        let dp_size = (u64::from(world_size) / model) as u32;
        let inner = self.tensor * self.context;
        let dp_rank = match self.order {
            RankOrder::TpCpDpPp => (rank / inner) % dp_size,
            RankOrder::TpCpPpDp => rank / (inner * self.pipeline),
        };
        Ok((dp_rank, dp_size))
    }

    /// Whether global `rank` reports its data-parallel rank's loss per source (protocol v7): one
    /// rank per model-parallel group, the last pipeline stage's (it holds the loss) with tensor
    /// and context rank 0.
    pub fn reports_loss(&self, rank: u32, world_size: u32) -> Result<bool, String> {
        let (_, dp_size) = self.data_parallel(rank, world_size)?;
        let inner = self.tensor * self.context;
        let stage = match self.order {
            RankOrder::TpCpDpPp => rank / (inner * dp_size),
            RankOrder::TpCpPpDp => (rank / inner) % self.pipeline,
        };
        Ok(rank.is_multiple_of(inner) && stage + 1 == self.pipeline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rank_per_model_parallel_group_reports_the_last_stage_with_tensor_rank_0() {
        let p = Parallelism {
            tensor: 2,
            context: 1,
            pipeline: 2,
            order: RankOrder::TpCpDpPp,
        };
        // World 8: dp 2; ranks 0..4 are stage 0, 4..8 stage 1; tp varies fastest.
        let reporters: Vec<u32> = (0..8).filter(|&r| p.reports_loss(r, 8).unwrap()).collect();
        assert_eq!(reporters, vec![4, 6]);
        let dp: Vec<u32> = reporters
            .iter()
            .map(|&r| p.data_parallel(r, 8).unwrap().0)
            .collect();
        assert_eq!(dp, vec![0, 1]);
        let older = Parallelism {
            order: RankOrder::TpCpPpDp,
            ..p
        };
        let reporters: Vec<u32> = (0..8)
            .filter(|&r| older.reports_loss(r, 8).unwrap())
            .collect();
        assert_eq!(reporters, vec![2, 6]);
        assert!(Parallelism::default().reports_loss(3, 4).unwrap());
    }

    #[test]
    fn sizes_come_from_what_is_given_else_the_environment_else_one() {
        let env = |name: &str| match name {
            "DSPREP_TP" => Some(" 4 ".to_string()),
            "DSPREP_PP" => Some("2".to_string()),
            "DSPREP_RANK_ORDER" => Some("tp-cp-pp-dp".to_string()),
            _ => None,
        };
        let got = Parallelism::from_env_or([None, None, Some(8)], None, env).unwrap();
        assert_eq!((got.tensor, got.context, got.pipeline), (4, 1, 8));
        assert_eq!(got.order, RankOrder::TpCpPpDp);
        let bad = |name: &str| (name == "DSPREP_CP").then(|| "x".to_string());
        assert_eq!(
            Parallelism::from_env_or([None; 3], None, bad).unwrap_err(),
            "DSPREP_CP=\"x\" is not a whole number"
        );
        let order = |name: &str| (name == "DSPREP_RANK_ORDER").then(|| "dp".to_string());
        assert!(
            Parallelism::from_env_or([None; 3], None, order)
                .unwrap_err()
                .starts_with("DSPREP_RANK_ORDER: rank order \"dp\" is not one of")
        );
    }

    fn sizes(tensor: u32, context: u32, pipeline: u32, order: RankOrder) -> Parallelism {
        Parallelism {
            tensor,
            context,
            pipeline,
            order,
        }
    }

    #[test]
    fn megatron_and_torchtitan_layouts() {
        // world 16, TP 2, PP 2 → DP 4; Megatron tp-cp-ep-dp-pp: rank = tp + 2·(dp + 4·pp).
        let p = sizes(2, 1, 2, RankOrder::TpCpDpPp);
        let dp: Vec<u32> = (0..16).map(|r| p.data_parallel(r, 16).unwrap().0).collect();
        assert_eq!(dp, [0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 1, 1, 2, 2, 3, 3]);
        // torchtitan mesh [pp, dp, cp, tp] = [2, 2, 2, 2]: rank = ((pp·2 + dp)·2 + cp)·2 + tp.
        let p = sizes(2, 2, 2, RankOrder::TpCpDpPp);
        for (pp, dp, cp, tp) in [(1, 1, 0, 1), (0, 1, 1, 0), (1, 0, 1, 1)] {
            let rank = ((pp * 2 + dp) * 2 + cp) * 2 + tp;
            assert_eq!(p.data_parallel(rank, 16).unwrap(), (dp, 2), "rank {rank}");
        }
        // tp-cp-pp-dp: rank = tp + 2·(pp + 2·dp).
        let p = sizes(2, 1, 2, RankOrder::TpCpPpDp);
        let dp: Vec<u32> = (0..8).map(|r| p.data_parallel(r, 8).unwrap().0).collect();
        assert_eq!(dp, [0, 0, 0, 0, 1, 1, 1, 1]);
    }

    #[test]
    fn sizes_that_do_not_divide_the_world_are_refused() {
        let e = sizes(2, 1, 3, RankOrder::TpCpDpPp)
            .data_parallel(0, 8)
            .unwrap_err();
        assert_eq!(
            e,
            "world size 8 is not a multiple of tensor × context × pipeline parallel = 2 × 1 × 3 = 6"
        );
        assert!(RankOrder::parse("dp-tp").unwrap_err().contains("\"dp-tp\""));
    }
}
