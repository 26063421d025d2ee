//! The example trainer's model core: a small decoder-only transformer in candle (CPU, f32).
//!
//! Token and learned position embeddings (positions come from the batch, so they restart at every
//! document start), pre-norm blocks of multi-head attention and a GELU MLP, and an output layer
//! tied to the token embedding. Attention takes an additive mask: causal, and block-diagonal over
//! documents when built from `cu_seqlens`. Weights are drawn from a seeded SplitMix64 stream, not
//! candle's RNG, so a run is the same on every machine.

use candle_core::{D, DType, Device, Result, Tensor, Var};

#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub vocab: usize,
    pub d_model: usize,
    pub layers: usize,
    pub heads: usize,
    /// Positions embedded: the recipe's `seq_len`.
    pub max_positions: usize,
}

struct Block {
    norm1: Var,
    qkv: Var,
    proj: Var,
    norm2: Var,
    fc1: Var,
    fc2: Var,
}

pub struct Gpt {
    config: Config,
    tokens: Var,
    positions: Var,
    blocks: Vec<Block>,
    norm_f: Var,
}

/// SplitMix64, turned into normal draws (Box-Muller) for weight init.
struct Init(u64);

impl Init {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn normal(&mut self, shape: (usize, usize), std: f64) -> Result<Var> {
        let values: Vec<f32> = (0..shape.0 * shape.1)
            .map(|_| {
                let (u, v) = (self.uniform(), self.uniform());
                ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos() * std) as f32
            })
            .collect();
        Var::from_tensor(&Tensor::from_vec(values, shape, &Device::Cpu)?)
    }
}

fn ones(n: usize) -> Result<Var> {
    Var::ones(n, DType::F32, &Device::Cpu)
}

/// `x [n, d_in] · wᵀ` for `w [d_out, d_in]`.
fn linear(x: &Tensor, w: &Var) -> Result<Tensor> {
    x.matmul(&w.as_tensor().t()?)
}

fn rms_norm(x: &Tensor, weight: &Var) -> Result<Tensor> {
    let mean_square = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_div(&(mean_square + 1e-5)?.sqrt()?)?
        .broadcast_mul(weight.as_tensor())
}

impl Gpt {
    pub fn new(config: Config, seed: u64) -> Result<Gpt> {
        let mut init = Init(seed);
        let d = config.d_model;
        let residual_std = 0.02 / (2.0 * config.layers as f64).sqrt();
        let tokens = init.normal((config.vocab, d), 0.02)?;
        let positions = init.normal((config.max_positions, d), 0.02)?;
        let blocks = (0..config.layers)
            .map(|_| {
                Ok(Block {
                    norm1: ones(d)?,
                    qkv: init.normal((3 * d, d), 0.02)?,
                    proj: init.normal((d, d), residual_std)?,
                    norm2: ones(d)?,
                    fc1: init.normal((4 * d, d), 0.02)?,
                    fc2: init.normal((d, 4 * d), residual_std)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Gpt {
            config,
            tokens,
            positions,
            blocks,
            norm_f: ones(d)?,
        })
    }

    pub fn vars(&self) -> Vec<Var> {
        let mut vars = vec![
            self.tokens.clone(),
            self.positions.clone(),
            self.norm_f.clone(),
        ];
        for b in &self.blocks {
            vars.extend([&b.norm1, &b.qkv, &b.proj, &b.norm2, &b.fc1, &b.fc2].map(|v| v.clone()));
        }
        vars
    }

    pub fn num_params(&self) -> usize {
        self.vars().iter().map(|v| v.elem_count()).sum()
    }

    /// Logits `[batch × seq, vocab]` for token ids and position ids `[batch, seq]` (u32) and an
    /// additive attention mask `[batch, 1, seq, seq]` (0 where attention is allowed).
    pub fn forward(&self, ids: &Tensor, positions: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let (batch, seq) = ids.dims2()?;
        let x = self
            .tokens
            .as_tensor()
            .index_select(&ids.flatten_all()?, 0)?;
        let mut x = (x + self
            .positions
            .as_tensor()
            .index_select(&positions.flatten_all()?, 0)?)?;
        for block in &self.blocks {
            x = (&x + self.attention(block, &rms_norm(&x, &block.norm1)?, batch, seq, mask)?)?;
            let hidden = linear(&rms_norm(&x, &block.norm2)?, &block.fc1)?.gelu()?;
            x = (&x + linear(&hidden, &block.fc2)?)?;
        }
        rms_norm(&x, &self.norm_f)?.matmul(&self.tokens.as_tensor().t()?)
    }

    fn attention(
        &self,
        block: &Block,
        x: &Tensor,
        batch: usize,
        seq: usize,
        mask: &Tensor,
    ) -> Result<Tensor> {
        let (d, heads) = (self.config.d_model, self.config.heads);
        let head_dim = d / heads;
        let qkv = linear(x, &block.qkv)?
            .reshape((batch, seq, 3, heads, head_dim))?
            .permute((2, 0, 3, 1, 4))?;
        let (q, k, v) = (
            qkv.get(0)?.contiguous()?,
            qkv.get(1)?.contiguous()?,
            qkv.get(2)?.contiguous()?,
        );
        let scores = (q.matmul(&k.t()?)? / (head_dim as f64).sqrt())?.broadcast_add(mask)?;
        let weights = candle_nn::ops::softmax(&scores, D::Minus1)?;
        let out = weights
            .matmul(&v)?
            .transpose(1, 2)?
            .reshape((batch * seq, d))?;
        linear(&out, &block.proj)
    }
}

/// The additive mask of one row: token `i` attends to `j ≤ i` in the same document. `cu` holds
/// the row's document boundaries `[0, s1, …, seq]`; `[0, seq]` gives a plain causal mask.
pub fn row_mask(cu: &[u32], seq: usize, out: &mut Vec<f32>) {
    let mut doc_start = vec![0usize; seq];
    for w in cu.windows(2) {
        for slot in &mut doc_start[w[0] as usize..(w[1] as usize).min(seq)] {
            *slot = w[0] as usize;
        }
    }
    for (i, &start) in doc_start.iter().enumerate() {
        out.extend((0..seq).map(|j| if j >= start && j <= i { 0.0 } else { -1e9 }));
    }
}
