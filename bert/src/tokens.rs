//! A batch of token sequences: ids, segment (token type) ids and each sequence's length, as
//! a serving stack's dynamic batcher sends them (right-padded to the longest).

use std::path::Path;

use kernels::Rng;
use serde_json::Value;

use crate::BertError;

/// `batch` sequences of `seq` positions, row-major `[batch, seq]`; sequence `i` holds
/// `lens[i]` real tokens followed by padding (what an attention mask of 1s then 0s says).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBatch {
    /// Sequences.
    pub batch: usize,
    /// Positions per sequence (real tokens and padding).
    pub seq: usize,
    /// Token ids (`input_ids`).
    pub ids: Vec<u32>,
    /// Segment ids (`token_type_ids`).
    pub types: Vec<u32>,
    /// Real tokens per sequence, each in `0..=seq`.
    pub lens: Vec<i32>,
}

impl TokenBatch {
    /// Random ids in `0..vocab` other than `pad` (BERT's and DistilBERT's padding id is 0,
    /// RoBERTa's 1) from `seed`, all of segment 0; sequence `i` is `lengths[i % lengths.len()]`
    /// long (clamped to `seq`), or `seq` when `lengths` is empty. Padding positions hold `pad`.
    pub fn random(
        (vocab, pad): (usize, u32),
        seed: u64,
        (batch, seq): (usize, usize),
        lengths: &[usize],
    ) -> Self {
        let mut rng = Rng::new(seed ^ 0x70C3_E25E_ED00_0001);
        let span = vocab.saturating_sub(1).max(1) as f32;
        let lens = Self::lengths(batch, seq, lengths);
        let mut ids = vec![pad; batch * seq];
        for (row, &len) in ids.chunks_exact_mut(seq.max(1)).zip(&lens) {
            for id in &mut row[..len as usize] {
                let u = (rng.symmetric_f32() + 1.0) * 0.5; // [0, 1)
                let drawn = ((u * span) as u32).min(span as u32 - 1);
                // Past the padding id, unless it is the whole vocabulary.
                *id = drawn + u32::from(drawn >= pad && vocab > 1);
            }
        }
        TokenBatch {
            batch,
            seq,
            ids,
            types: vec![0; batch * seq],
            lens,
        }
    }

    /// The lengths of `batch` sequences padded to `seq`: `lengths` cycled over the batch,
    /// each clamped to `seq` (all `seq` when `lengths` is empty).
    pub fn lengths(batch: usize, seq: usize, lengths: &[usize]) -> Vec<i32> {
        (0..batch)
            .map(|i| {
                lengths
                    .get(i % lengths.len().max(1))
                    .map_or(seq, |&l| l.min(seq)) as i32
            })
            .collect()
    }

    /// Reads `{"input_ids": [[..], ..], "token_type_ids": .., "attention_mask": ..}` (the
    /// last two optional: segment 0, no padding), every row of the same length. The mask
    /// must be right padding (1s, then 0s).
    pub fn from_json(path: &Path) -> Result<Self, BertError> {
        let bad = |reason: String| BertError::Checkpoint {
            path: path.to_path_buf(),
            reason,
        };
        let text =
            crate::checkpoint::read_file(path, crate::checkpoint::JSON_LIMIT).map_err(bad)?;
        let v: Value = serde_json::from_slice(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let ids = matrix(&v, "input_ids")
            .map_err(bad)?
            .ok_or_else(|| BertError::Checkpoint {
                path: path.to_path_buf(),
                reason: "field 'input_ids' is missing".into(),
            })?;
        // A field that would change the output if read (`position_ids`, ...) is refused, not
        // silently left out.
        if let Some(other) = v
            .as_object()
            .and_then(|o| o.keys().find(|k| !FIELDS.contains(&k.as_str())))
        {
            return Err(bad(format!(
                "field '{other}' is not read (only {} are)",
                FIELDS.join(", ")
            )));
        }
        let (batch, seq) = (ids.len(), ids.first().map_or(0, Vec::len));
        if batch == 0 || seq == 0 {
            return Err(bad("'input_ids' is empty".into()));
        }
        if let Some(i) = ids.iter().position(|r| r.len() != seq) {
            return Err(bad(format!(
                "'input_ids' rows differ in length: row {i} has {} values, row 0 has {seq} \
                 (pad the sequences to one length and give their 'attention_mask')",
                ids[i].len()
            )));
        }
        let shaped = |name: &str, m: Option<Vec<Vec<u32>>>, fill: u32| match m {
            None => Ok(vec![fill; batch * seq]),
            Some(m) if m.len() == batch && m.iter().all(|r| r.len() == seq) => Ok(m.concat()),
            Some(_) => Err(bad(format!(
                "'{name}' is not {batch} rows of {seq} values like 'input_ids'"
            ))),
        };
        let types = shaped(
            "token_type_ids",
            matrix(&v, "token_type_ids").map_err(bad)?,
            0,
        )?;
        let mask = shaped(
            "attention_mask",
            matrix(&v, "attention_mask").map_err(bad)?,
            1,
        )?;
        let ids = shaped("input_ids", Some(ids), 0)?;
        let lens = mask
            .chunks_exact(seq)
            .enumerate()
            .map(|(i, row)| {
                let len = row.iter().take_while(|&&m| m == 1).count();
                if row[len..].iter().any(|&m| m != 0) {
                    return Err(bad(format!(
                        "attention_mask row {i} is not 1s then 0s (only right padding is served)"
                    )));
                }
                Ok(len as i32)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TokenBatch {
            batch,
            seq,
            ids,
            types,
            lens,
        })
    }

    /// Checks that the batch fits a model of `vocab` token ids, `type_vocab` token types and
    /// `max_seq` positions: `batch` and `seq` at least 1, `batch × seq` ids and types, each
    /// below its table, a length in `0..=seq` per sequence, `seq` within the positions.
    pub fn check_fits(
        &self,
        vocab: usize,
        type_vocab: usize,
        max_seq: usize,
    ) -> Result<(), BertError> {
        let bad = |reason: String| Err(BertError::Shape { reason });
        if self.batch == 0 || self.seq == 0 {
            return bad(format!(
                "a batch of {} × {} tokens: both must be at least 1",
                self.batch, self.seq
            ));
        }
        let n = self.batch.checked_mul(self.seq);
        let lens = (Some(self.ids.len()), Some(self.types.len()));
        if lens != (n, n) || self.lens.len() != self.batch {
            return bad(format!(
                "a batch of {} × {} tokens holds {} ids, {} token types and {} lengths",
                self.batch,
                self.seq,
                self.ids.len(),
                self.types.len(),
                self.lens.len()
            ));
        }
        if let Some((i, l)) =
            (self.lens.iter().enumerate()).find(|(_, &l)| l < 0 || l as usize > self.seq)
        {
            return bad(format!(
                "sequence {i} has length {l}, not one of 0..={} (its padded length)",
                self.seq
            ));
        }
        if self.seq > max_seq {
            return bad(format!(
                "sequences of {} tokens, the model has {} positions",
                self.seq, max_seq
            ));
        }
        if let Some((i, id)) = (self.ids.iter().enumerate()).find(|(_, &id)| id as usize >= vocab) {
            return bad(format!(
                "token id {id} (sequence {}, position {}) is outside the vocabulary of {}",
                i / self.seq,
                i % self.seq,
                vocab
            ));
        }
        if let Some(t) = self.types.iter().find(|&&t| t as usize >= type_vocab) {
            return bad(match type_vocab {
                1 => format!(
                    "token type {t}: this model has no token types (token_type_ids must be 0s)"
                ),
                n => format!("token type {t} is outside the {n} token types"),
            });
        }
        Ok(())
    }

    /// The tokens of sequence `i`: `(ids, types)`, `seq` each.
    pub fn sequence(&self, i: usize) -> (&[u32], &[u32]) {
        let r = i * self.seq..(i + 1) * self.seq;
        (&self.ids[r.clone()], &self.types[r])
    }

    /// Whether any sequence is shorter than `seq`.
    pub fn padded(&self) -> bool {
        self.lens.iter().any(|&l| l as usize != self.seq)
    }
}

/// The fields of an `inputs.json`.
const FIELDS: [&str; 3] = ["input_ids", "token_type_ids", "attention_mask"];

/// Field `name` of `v` as rows of whole numbers (`None` when absent).
fn matrix(v: &Value, name: &str) -> Result<Option<Vec<Vec<u32>>>, String> {
    let Some(field) = v.get(name) else {
        return Ok(None);
    };
    let bad = || format!("'{name}' is not a list of lists of whole numbers");
    let rows = field.as_array().ok_or_else(bad)?;
    rows.iter()
        .enumerate()
        .map(|(i, r)| {
            (r.as_array().ok_or_else(bad)?.iter().enumerate())
                .map(|(j, x)| match (x.as_i64(), x.as_u64()) {
                    (_, Some(n)) if n <= u64::from(u32::MAX) => Ok(n as u32),
                    (Some(_), _) | (_, Some(_)) => Err(format!(
                        "'{name}' holds {x} (row {i}, position {j}), outside 0..={}",
                        u32::MAX
                    )),
                    _ => Err(bad()),
                })
                .collect()
        })
        .collect::<Result<Vec<Vec<u32>>, String>>()
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<TokenBatch, String> {
        let dir = std::env::temp_dir().join(format!("bert-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(format!(
            "{:x}.json",
            text.len() * 31 + text.as_bytes()[2] as usize
        ));
        std::fs::write(&p, text).unwrap();
        let r = TokenBatch::from_json(&p).map_err(|e| e.to_string());
        std::fs::remove_file(&p).unwrap();
        r
    }

    #[test]
    fn reads_a_padded_batch_and_names_what_is_wrong() {
        let t = parse(
            r#"{"input_ids": [[5, 6, 7], [8, 0, 0]], "attention_mask": [[1, 1, 1], [1, 0, 0]]}"#,
        )
        .unwrap();
        assert_eq!((t.batch, t.seq, t.lens.clone()), (2, 3, vec![3, 1]));
        assert_eq!(t.types, vec![0; 6]);
        assert!(t.padded());
        assert_eq!(t.sequence(1).0, &[8, 0, 0]);
        for (text, needle) in [
            (r#"{"ids": [[1]]}"#, "'input_ids' is missing"),
            (
                r#"{"input_ids": [[1, 2], [3]]}"#,
                "row 1 has 1 values, row 0 has 2",
            ),
            (
                r#"{"input_ids": [[1, -2]]}"#,
                "holds -2 (row 0, position 1)",
            ),
            (r#"{"input_ids": [[1, 2.5]]}"#, "whole numbers"),
            (r#"{"input_ids": [[1099511627776]]}"#, "holds 1099511627776"),
            (
                r#"{"input_ids": [[1, 2]], "attention_mask": [[0, 1]]}"#,
                "row 0 is not 1s then 0s",
            ),
            (r#"{"input_ids": []}"#, "is empty"),
            (
                r#"{"input_ids": [[1, 2]], "position_ids": [[9, 9]]}"#,
                "field 'position_ids' is not read (only input_ids, token_type_ids, attention_mask are)",
            ),
            ("[1, 2", "not JSON"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn random_batches_have_the_lengths_asked_for() {
        let t = TokenBatch::random((100, 0), 3, (5, 8), &[8, 3, 1]);
        assert_eq!(t.lens, vec![8, 3, 1, 8, 3]);
        assert!(t.ids.iter().all(|&i| i < 100));
        assert!(t.sequence(1).0[..3].iter().all(|&i| i >= 1));
        assert_eq!(&t.sequence(1).0[3..], &[0; 5]);
        assert_eq!(
            TokenBatch::random((100, 0), 3, (2, 4), &[]).lens,
            vec![4, 4]
        );
        assert_eq!(TokenBatch::random((100, 0), 3, (1, 4), &[9]).lens, vec![4]);
        // RoBERTa's padding id 1: never a token, every padding position.
        let t = TokenBatch::random((5, 1), 3, (4, 64), &[64, 10]);
        let (full, short) = (t.sequence(0).0, t.sequence(1).0);
        assert!(full.iter().all(|&i| i < 5 && i != 1), "{full:?}");
        assert!(full.contains(&0) && full.contains(&4), "{full:?}");
        assert!(short[10..].iter().all(|&i| i == 1));
        // A vocabulary of the padding id alone.
        assert_eq!(TokenBatch::random((1, 0), 3, (1, 3), &[]).ids, vec![0; 3]);
    }
}
