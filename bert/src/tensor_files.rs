//! The weight files of a checkpoint directory: `model.safetensors`, or the shards that
//! `model.safetensors.index.json` lists (what `save_pretrained` writes for a model larger than
//! its shard size); tensors are found by name across them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensorError, SafeTensors};
use serde_json::Value;

use crate::checkpoint::{read_file, JSON_LIMIT};
use crate::BertError;

/// The single file's name.
const SINGLE: &str = "model.safetensors";
/// The index of a sharded checkpoint.
const INDEX: &str = "model.safetensors.index.json";

/// The bytes of a checkpoint's weight files, read.
pub(crate) struct TensorFiles {
    /// The file errors about the weights name: the single file, or the index.
    pub origin: PathBuf,
    files: Vec<(PathBuf, Vec<u8>)>,
    /// A sharded checkpoint's `weight_map`: each tensor's file, an index into `files`.
    map: Option<BTreeMap<String, usize>>,
}

/// Tensors by name across a checkpoint's weight files.
pub(crate) struct Tensors<'a> {
    files: Vec<SafeTensors<'a>>,
    /// The files' paths, in the same order.
    paths: Vec<&'a Path>,
    /// [`TensorFiles`]' map: a tensor is read from the shard the index names, as transformers
    /// reads it — never from a stale copy in another shard.
    map: Option<&'a BTreeMap<String, usize>>,
}

impl TensorFiles {
    /// Reads `dir`'s `model.safetensors`, or else every shard its
    /// `model.safetensors.index.json` lists; a directory with only PyTorch's pickled weights
    /// gets an error saying how to save them as safetensors.
    pub fn read(dir: &Path) -> Result<TensorFiles, BertError> {
        let single = dir.join(SINGLE);
        let index = dir.join(INDEX);
        if single.exists() || !index.exists() {
            let bad = |reason: String| BertError::Checkpoint {
                path: single.clone(),
                reason,
            };
            let bytes = read_file(&single, u64::MAX).map_err(|e| match pickled(dir) {
                Some(bin) => bad(format!(
                    "missing: {bin} here holds the weights as a PyTorch pickle, which is not \
                     read; save them as safetensors with transformers \
                     (`AutoModel.from_pretrained(DIR).save_pretrained(DIR)`)"
                )),
                None => bad(e),
            })?;
            return Ok(TensorFiles {
                origin: single.clone(),
                files: vec![(single, bytes)],
                map: None,
            });
        }
        let bad = |reason: String| BertError::Checkpoint {
            path: index.clone(),
            reason,
        };
        let text = read_file(&index, JSON_LIMIT).map_err(bad)?;
        let v: Value = serde_json::from_slice(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let (shards, map) = weight_map(&v).map_err(bad)?;
        let files = shards
            .into_iter()
            .map(|name| {
                let path = dir.join(&name);
                let bytes = read_file(&path, u64::MAX).map_err(|e| BertError::Checkpoint {
                    path: path.clone(),
                    reason: format!("a shard {INDEX} lists: {e}"),
                })?;
                Ok((path, bytes))
            })
            .collect::<Result<_, BertError>>()?;
        Ok(TensorFiles {
            origin: index,
            files,
            map: Some(map),
        })
    }

    /// The files parsed (each one's header; the data stays where it was read).
    pub fn parse(&self) -> Result<Tensors<'_>, BertError> {
        let files = self
            .files
            .iter()
            .map(|(path, bytes)| {
                SafeTensors::deserialize(bytes).map_err(|e| BertError::Checkpoint {
                    path: path.clone(),
                    reason: match (&e, misfit_tensor(bytes)) {
                        (SafeTensorError::TensorInvalidInfo, Some(why)) => why,
                        _ => format!("not a safetensors file: {e}"),
                    },
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Tensors {
            files,
            paths: self.files.iter().map(|(p, _)| p.as_path()).collect(),
            map: self.map.as_ref(),
        })
    }
}

/// Which tensor of a safetensors file has a byte range its dtype and shape do not fill (the
/// `safetensors` crate's `TensorInvalidInfo` names none), read from the header directly.
fn misfit_tensor(bytes: &[u8]) -> Option<String> {
    let len = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    let header = bytes.get(8..8usize.checked_add(usize::try_from(len).ok()?)?)?;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(header).ok()?;
    header.iter().find_map(|(name, t)| {
        let dtype: Dtype = serde_json::from_value(t.get("dtype")?.clone()).ok()?;
        let shape: Vec<u64> = serde_json::from_value(t.get("shape")?.clone()).ok()?;
        let [start, end]: [u64; 2] = serde_json::from_value(t.get("data_offsets")?.clone()).ok()?;
        let bits = shape
            .iter()
            .try_fold(dtype.bitsize() as u64, |n, &d| n.checked_mul(d))?;
        let bytes = end.checked_sub(start)?;
        (bits != bytes * 8).then(|| {
            format!(
                "tensor '{name}' holds {bytes} bytes, but its shape {shape:?} of {dtype:?} needs {}",
                bits.div_ceil(8)
            )
        })
    })
}

impl Tensors<'_> {
    /// Tensor `name`: from the shard the index names for it, or from the single file.
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        let file = match self.map {
            Some(map) => &self.files[*map.get(name)?],
            None => &self.files[0],
        };
        file.tensor(name).ok()
    }

    /// Why tensor `name` is not there: missing, or (sharded) missing from the shard the index
    /// names for it.
    pub fn missing(&self, name: &str) -> String {
        match self.map.and_then(|map| map.get(name)) {
            Some(&i) => {
                let shard = self.paths[i]
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy();
                format!("tensor '{name}' is missing from {shard}, the shard {INDEX} names for it")
            }
            None => format!("tensor '{name}' is missing"),
        }
    }

    /// Every tensor's name (a sharded checkpoint's: those its index maps), sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = match self.map {
            Some(map) => map.keys().map(String::as_str).collect(),
            None => self.files[0].names(),
        };
        names.sort_unstable();
        names
    }
}

/// The shard files an index's `weight_map` names, each once (plain file names of the
/// directory: a path elsewhere is refused), and each tensor's file as an index into them.
fn weight_map(index: &Value) -> Result<(Vec<String>, BTreeMap<String, usize>), String> {
    let map = index
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or("no 'weight_map' object of tensor names to shard files")?;
    let mut shards = BTreeSet::new();
    for (tensor, file) in map {
        let name = file
            .as_str()
            .ok_or_else(|| format!("'weight_map' maps '{tensor}' to {file}, not a file name"))?;
        let plain = Path::new(name).file_name().is_some_and(|f| f == name);
        if !plain {
            return Err(format!(
                "'weight_map' maps '{tensor}' to '{name}', not a file of this directory"
            ));
        }
        shards.insert(name.to_string());
    }
    if shards.is_empty() {
        return Err("'weight_map' names no shard".into());
    }
    let shards: Vec<String> = shards.into_iter().collect();
    let tensors = map
        .iter()
        .map(|(tensor, file)| {
            let at = shards
                .iter()
                .position(|s| Some(s.as_str()) == file.as_str());
            (tensor.clone(), at.expect("every file was collected"))
        })
        .collect();
    Ok((shards, tensors))
}

/// The name of a PyTorch pickle of the weights in `dir`, if there is one.
fn pickled(dir: &Path) -> Option<&'static str> {
    ["pytorch_model.bin", "pytorch_model.bin.index.json"]
        .into_iter()
        .find(|f| dir.join(f).exists())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_names_plain_files_of_the_directory() {
        let names = |v: Value| weight_map(&v);
        let (shards, map) = names(serde_json::json!({"weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
            "c": "model-00001-of-00002.safetensors",
        }}))
        .unwrap();
        assert_eq!(shards.len(), 2);
        assert_eq!((map["a"], map["b"], map["c"]), (0, 1, 0));
        for (v, needle) in [
            (serde_json::json!({}), "no 'weight_map'"),
            (serde_json::json!({"weight_map": {}}), "names no shard"),
            (
                serde_json::json!({"weight_map": {"a": 3}}),
                "not a file name",
            ),
            (
                serde_json::json!({"weight_map": {"a": "../x.safetensors"}}),
                "not a file of this directory",
            ),
            (
                serde_json::json!({"weight_map": {"a": "/etc/passwd"}}),
                "not a file of this directory",
            ),
            (serde_json::json!({"weight_map": {"a": ".."}}), "not a file"),
        ] {
            let e = names(v).unwrap_err();
            assert!(e.contains(needle), "{e}");
        }
    }
}
