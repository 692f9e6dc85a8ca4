//! BERT's embedding block: `LayerNorm(word[id] + position[p] + token_type[t])`, in f32 for
//! the model and in f64 for the reference — with the position ids of BERT and DistilBERT
//! (`0, 1, 2, …`) or of RoBERTa (counted after the padding id). ELECTRA's narrower tables are
//! projected to the hidden size after this block ([`crate::BertModel`]).

use rayon::prelude::*;

use crate::{BertError, TokenBatch};
use runtime::add_layer_norm;

/// How a token's row of the position table is found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Positions {
    /// Row `p` for the token at position `p` of its sequence (BERT, DistilBERT).
    FromZero,
    /// RoBERTa's rule (`create_position_ids_from_input_ids`): a token whose id is not
    /// `pad_id` takes row `pad_id + n`, `n` counting the sequence's non-padding tokens up to
    /// and including it; a `pad_id` token takes row `pad_id`.
    AfterPadding {
        /// The padding token's id (`pad_token_id`).
        pad_id: u32,
    },
}

impl Positions {
    /// The rows of the position table before the first sequence position's.
    pub(crate) fn offset(self) -> usize {
        match self {
            Positions::FromZero => 0,
            Positions::AfterPadding { pad_id } => pad_id as usize + 1,
        }
    }

    /// The position-table row of each token of sequence `ids`, appended to `out`.
    fn rows(self, ids: &[u32], out: &mut Vec<usize>) {
        match self {
            Positions::FromZero => out.extend(0..ids.len()),
            Positions::AfterPadding { pad_id } => {
                let mut n = 0;
                out.extend(ids.iter().map(|&id| {
                    if id == pad_id {
                        pad_id as usize
                    } else {
                        n += 1;
                        pad_id as usize + n
                    }
                }));
            }
        }
    }
}

/// The embedding tables and their LayerNorm, row-major, one `width`-wide row per entry.
#[derive(Debug, Clone)]
pub struct Embeddings {
    /// `vocab × width`.
    pub word: Vec<f32>,
    /// `rows × width`: [`Embeddings::max_seq`] rows after [`Positions`]' offset.
    pub position: Vec<f32>,
    /// How a token's position picks its row of `position`.
    pub positions: Positions,
    /// `type_vocab × width` (one row of zeros for a model without token types).
    pub token_type: Vec<f32>,
    /// The LayerNorm's scale γ, `width` values.
    pub ln_gamma: Vec<f32>,
    /// The LayerNorm's shift β, `width` values.
    pub ln_beta: Vec<f32>,
    /// The tables' width: the model's hidden size, or ELECTRA's `embedding_size`.
    pub width: usize,
    /// The LayerNorm's epsilon (`layer_norm_eps`).
    pub ln_eps: f32,
}

impl Embeddings {
    /// Rows of the word table.
    pub fn vocab(&self) -> usize {
        self.word.len() / self.width
    }

    /// The longest sequence taken: the position table's rows past [`Positions`]' offset.
    pub fn max_seq(&self) -> usize {
        (self.position.len() / self.width).saturating_sub(self.positions.offset())
    }

    /// The padding token's id: RoBERTa's `pad_token_id`, 0 for BERT and DistilBERT.
    pub fn pad_id(&self) -> u32 {
        match self.positions {
            Positions::FromZero => 0,
            Positions::AfterPadding { pad_id } => pad_id,
        }
    }

    /// Rows of the token-type table.
    pub fn type_vocab(&self) -> usize {
        self.token_type.len() / self.width
    }

    /// Checks that `tokens` fit the tables: `batch × seq` ids and types, ids below the
    /// vocabulary, types below the type vocabulary, `seq` within the positions.
    pub fn check(&self, tokens: &TokenBatch) -> Result<(), BertError> {
        tokens.check_fits(self.vocab(), self.type_vocab(), self.max_seq())
    }

    /// The embeddings of `tokens` (`batch × seq × width`), f32, each sequence's positions
    /// by [`Positions`]. Tokens that [`Embeddings::check`] refuses are its error.
    pub fn forward(&self, tokens: &TokenBatch, out: &mut Vec<f32>) -> Result<(), BertError> {
        self.check(tokens)?;
        let h = self.width;
        let n = tokens.batch * tokens.seq;
        out.resize(n * h, 0.0);
        let mut types = vec![0.0f32; n * h];
        let mut rows = Vec::with_capacity(n);
        for seq_ids in tokens.ids.chunks_exact(tokens.seq) {
            self.positions.rows(seq_ids, &mut rows);
        }
        out.par_chunks_mut(h)
            .zip(types.par_chunks_mut(h))
            .enumerate()
            .for_each(|(t, (x, ty))| {
                let (id, tt, pos) = (tokens.ids[t] as usize, tokens.types[t] as usize, rows[t]);
                let (w, p) = (&self.word[id * h..][..h], &self.position[pos * h..][..h]);
                x.iter_mut()
                    .zip(w.iter().zip(p))
                    .for_each(|(x, (w, p))| *x = w + p);
                ty.copy_from_slice(&self.token_type[tt * h..][..h]);
            });
        add_layer_norm(
            out,
            Some(&types),
            &self.ln_gamma,
            &self.ln_beta,
            self.ln_eps,
        )?;
        Ok(())
    }

    /// The embedding of sequence `i` of `tokens` in f64 (`seq × width`).
    pub fn reference(&self, tokens: &TokenBatch, i: usize) -> Vec<f64> {
        let h = self.width;
        let (ids, types) = tokens.sequence(i);
        let mut rows = Vec::with_capacity(tokens.seq);
        self.positions.rows(ids, &mut rows);
        let mut out = Vec::with_capacity(tokens.seq * h);
        for (pos, (&id, &tt)) in rows.into_iter().zip(ids.iter().zip(types)) {
            let row: Vec<f64> = (0..h)
                .map(|c| {
                    self.word[id as usize * h + c] as f64
                        + self.position[pos * h + c] as f64
                        + self.token_type[tt as usize * h + c] as f64
                })
                .collect();
            let mean = row.iter().sum::<f64>() / h as f64;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / h as f64;
            let inv = 1.0 / (var + self.ln_eps as f64).sqrt();
            for (c, v) in row.iter().enumerate() {
                out.push((v - mean) * inv * self.ln_gamma[c] as f64 + self.ln_beta[c] as f64);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roberta_positions_count_after_the_padding_id() {
        let rows = |p: Positions, ids: &[u32]| {
            let mut out = Vec::new();
            p.rows(ids, &mut out);
            out
        };
        assert_eq!(rows(Positions::FromZero, &[7, 1, 9]), [0, 1, 2]);
        let roberta = Positions::AfterPadding { pad_id: 1 };
        // Right padding: 2, 3, 4 for the tokens, the padding's own row for the rest.
        assert_eq!(rows(roberta, &[0, 8, 2, 1, 1]), [2, 3, 4, 1, 1]);
        // A padding id among the tokens is skipped by the count, as transformers' cumsum does.
        assert_eq!(rows(roberta, &[5, 1, 6]), [2, 1, 3]);
        assert_eq!((roberta.offset(), Positions::FromZero.offset()), (2, 0));
    }
}
