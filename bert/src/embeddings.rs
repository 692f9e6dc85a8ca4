//! BERT's embedding block: `LayerNorm(word[id] + position[p] + token_type[t])`, in f32 for
//! the model and in f64 for the reference.

use rayon::prelude::*;

use crate::{BertError, TokenBatch};
use runtime::add_layer_norm;

/// The embedding tables and their LayerNorm, row-major, one `hidden`-wide row per entry.
#[derive(Debug, Clone)]
pub struct Embeddings {
    /// `vocab × hidden`.
    pub word: Vec<f32>,
    /// `max_positions × hidden`.
    pub position: Vec<f32>,
    /// `type_vocab × hidden`.
    pub token_type: Vec<f32>,
    pub ln_gamma: Vec<f32>,
    pub ln_beta: Vec<f32>,
    pub hidden: usize,
    pub ln_eps: f32,
}

impl Embeddings {
    /// Rows of the word table.
    pub fn vocab(&self) -> usize {
        self.word.len() / self.hidden
    }

    /// Rows of the position table: the longest sequence taken.
    pub fn max_positions(&self) -> usize {
        self.position.len() / self.hidden
    }

    /// Rows of the token-type table.
    pub fn type_vocab(&self) -> usize {
        self.token_type.len() / self.hidden
    }

    /// Checks that `tokens` fit the tables: `batch × seq` ids and types, ids below the
    /// vocabulary, types below the type vocabulary, `seq` within the positions.
    pub fn check(&self, tokens: &TokenBatch) -> Result<(), BertError> {
        let bad = |reason: String| Err(BertError::Shape { reason });
        let n = tokens.batch.checked_mul(tokens.seq);
        let lens = (Some(tokens.ids.len()), Some(tokens.types.len()));
        if lens != (n, n) || tokens.lens.len() != tokens.batch {
            return bad(format!(
                "a batch of {} × {} tokens holds {} ids, {} token types and {} lengths",
                tokens.batch,
                tokens.seq,
                tokens.ids.len(),
                tokens.types.len(),
                tokens.lens.len()
            ));
        }
        if tokens.seq > self.max_positions() {
            return bad(format!(
                "sequences of {} tokens, the model has {} positions",
                tokens.seq,
                self.max_positions()
            ));
        }
        if let Some((i, id)) =
            (tokens.ids.iter().enumerate()).find(|(_, &id)| id as usize >= self.vocab())
        {
            return bad(format!(
                "token id {id} (sequence {}, position {}) is outside the vocabulary of {}",
                i / tokens.seq,
                i % tokens.seq,
                self.vocab()
            ));
        }
        if let Some(t) = tokens
            .types
            .iter()
            .find(|&&t| t as usize >= self.type_vocab())
        {
            return bad(format!(
                "token type {t} is outside the {} token types",
                self.type_vocab()
            ));
        }
        Ok(())
    }

    /// The encoder input of `tokens` (`batch × seq × hidden`), f32; positions count from 0
    /// in every sequence. Tokens that [`Embeddings::check`] refuses are its error.
    pub fn forward(&self, tokens: &TokenBatch, out: &mut Vec<f32>) -> Result<(), BertError> {
        self.check(tokens)?;
        let h = self.hidden;
        let n = tokens.batch * tokens.seq;
        out.resize(n * h, 0.0);
        let mut types = vec![0.0f32; n * h];
        out.par_chunks_mut(h)
            .zip(types.par_chunks_mut(h))
            .enumerate()
            .for_each(|(t, (x, ty))| {
                let (id, tt, pos) = (
                    tokens.ids[t] as usize,
                    tokens.types[t] as usize,
                    t % tokens.seq,
                );
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

    /// The embedding of sequence `i` of `tokens` in f64 (`seq × hidden`).
    pub fn reference(&self, tokens: &TokenBatch, i: usize) -> Vec<f64> {
        let h = self.hidden;
        let (ids, types) = tokens.sequence(i);
        let mut out = Vec::with_capacity(tokens.seq * h);
        for (pos, (&id, &tt)) in ids.iter().zip(types).enumerate() {
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
