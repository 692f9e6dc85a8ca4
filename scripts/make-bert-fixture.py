#!/usr/bin/env python3
"""Makes the parity fixtures of `autokernel infer --model DIR` (tests/infer_cli.rs,
bert/tests/checkpoint.rs): a tiny BERT-family model saved by transformers' save_pretrained, a
padded batch of inputs, and what transformers computes for it.

    pip install torch transformers   # only to regenerate the fixtures
    scripts/make-bert-fixture.py [--arch bert|roberta|distilbert|electra|albert] [OUT_DIR]

OUT_DIR defaults to tests/fixtures/tiny-ARCH. Writes:
  config.json, model.safetensors  save_pretrained of a BertModel / RobertaModel / DistilBertModel /
                                  ElectraModel (its embeddings 32 wide, projected to 64) /
                                  AlbertModel (embeddings 32 wide projected to 64; 3 layers
                                  over 2 groups of 2 shared layers: 6 layer steps, the
                                  groups split unevenly as transformers does; tanh GELU,
                                  "gelu_new", ALBERT's own): otherwise
                                  2 layers, hidden 64, 4 heads, FFN 128, vocab 100, 16 usable
                                  positions (RoBERTa's table has 18 rows: its positions start
                                  after the padding id 1), activation "gelu" (exact); weights
                                  stored as float16 (each fixture stays ~140 KB), and every weight
                                  is rounded to float16 *before* the reference runs, so the f32
                                  computation below is exactly that of the stored weights
  inputs.json                     input_ids (padding holds the model's pad_token_id) and
                                  attention_mask of 4 right-padded sequences of lengths 11, 6, 1
                                  and 9 (padded to 11); BERT's, ELECTRA's and ALBERT's also
                                  token_type_ids
                                  (two segments)
  expected.safetensors            last_hidden_state [4, 11, 64], f32: transformers' forward in
                                  float32, eager attention, for every position (padded ones too)
"""
import argparse
import json
import os

import torch
from safetensors.torch import save_file
from transformers import (AlbertConfig, AlbertModel, BertConfig, BertModel, DistilBertConfig, DistilBertModel, ElectraConfig,
                          ElectraModel, RobertaConfig, RobertaModel)

SIZES = dict(vocab_size=100, num_hidden_layers=2, num_attention_heads=4, hidden_size=64,
             intermediate_size=128)


def make(arch):
    """The model, with eager attention, and whether it takes token types."""
    if arch == "bert":
        config = BertConfig(**SIZES, hidden_act="gelu", max_position_embeddings=16, type_vocab_size=2,
                            layer_norm_eps=1e-12, attn_implementation="eager")
        return BertModel(config, add_pooling_layer=False).eval(), True
    if arch == "roberta":
        config = RobertaConfig(**SIZES, hidden_act="gelu", max_position_embeddings=18, type_vocab_size=1,
                               layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                               attn_implementation="eager")
        return RobertaModel(config, add_pooling_layer=False).eval(), False
    if arch == "electra":
        config = ElectraConfig(**SIZES, embedding_size=32, hidden_act="gelu", max_position_embeddings=16,
                               type_vocab_size=2, layer_norm_eps=1e-12, attn_implementation="eager")
        return ElectraModel(config).eval(), True
    if arch == "albert":
        sizes = dict(SIZES, num_hidden_layers=3)
        config = AlbertConfig(**sizes, embedding_size=32, num_hidden_groups=2, inner_group_num=2,
                              hidden_act="gelu_new", max_position_embeddings=16, type_vocab_size=2,
                              layer_norm_eps=1e-12, pad_token_id=0, attn_implementation="eager")
        return AlbertModel(config, add_pooling_layer=False).eval(), True
    config = DistilBertConfig(vocab_size=100, n_layers=2, n_heads=4, dim=64, hidden_dim=128,
                              activation="gelu", max_position_embeddings=16, attn_implementation="eager")
    return DistilBertModel(config).eval(), False


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", choices=["bert", "roberta", "distilbert", "electra", "albert"], default="bert")
    p.add_argument("out", nargs="?")
    args = p.parse_args()
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                                   f"tiny-{args.arch}")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(19)

    model, takes_types = make(args.arch)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name or "layer_norm.weight" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name:
                p.copy_(0.1 * torch.randn_like(p))
            else:
                # Wider than BERT's 0.02, so attention is far from uniform and every path matters.
                p.copy_(0.15 * torch.randn_like(p))
            p.copy_(p.half().float())

    lengths = [11, 6, 1, 9]
    seq = max(lengths)
    pad = model.config.pad_token_id
    ids = torch.full((len(lengths), seq), pad, dtype=torch.long)
    types = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        # BERT's, ELECTRA's and ALBERT's ids from 1 (0 pads); RoBERTa's and DistilBERT's from 3
        # (past <s>, <pad>, </s>).
        first = 1 if args.arch in ("bert", "electra", "albert") else 3
        ids[i, :n] = torch.randint(first, model.config.vocab_size, (n,))
        types[i, n // 2:n] = 1  # a second segment
        mask[i, :n] = 1

    inputs = {"input_ids": ids, "attention_mask": mask}
    if takes_types:
        inputs["token_type_ids"] = types
    with torch.no_grad():
        hidden = model(**inputs).last_hidden_state

    model.half().save_pretrained(out)
    order = ["input_ids", "token_type_ids", "attention_mask"]
    with open(os.path.join(out, "inputs.json"), "w") as f:
        json.dump({k: inputs[k].tolist() for k in order if k in inputs}, f)
        f.write("\n")
    save_file({"last_hidden_state": hidden.float().contiguous()}, os.path.join(out, "expected.safetensors"))
    print(f"wrote {out}: {args.arch}, batch {len(lengths)}, lengths {lengths}, "
          f"|last_hidden_state| max {hidden.abs().max().item():.3f}")


if __name__ == "__main__":
    main()
